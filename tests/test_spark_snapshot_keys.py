"""The Spark source and an incremental snapshot's READ entries, with the server's own
chunk entries (``canal_server.snapshot``), store and ``EmbeddedServer`` in this process:
a restart whose checkpoint ends inside a chunk, and the keys of READ entries across a
database switch."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from serving_fixtures import IDENTITY, EntryFactory, position_of
from spark_fixtures import EmbeddedConnector, arrow_rows, reading

from canal_client.spark import CanalOptions, CanalStreamReader
from canal_client.spark_rows import Offset, Row, entry_rows
from canal_protocol.entry import Entry, TableColumns
from canal_server.embedded import EmbeddedServer
from canal_server.meta import MemoryMetaManager
from canal_server.parse.snapshot import TableShape
from canal_server.snapshot import ROWS_PER_ENTRY, _chunk_entries
from canal_server.store import EventStore

COLUMNS = TableColumns(("id", "v"), ("int", "varchar(255)"), (True, False))
SHAPE = TableShape("db", "t", COLUMNS, ("id",), (0,), ("int",), ("`id`", "`v`"), ())
OPTS = CanalOptions(destination="d", client_id="spark", servers=("embedded://",), batch_size=7,
                    prefetch=False)  # fmt: skip


def chunk_after(entry: Entry, rows: int, first_id: int = 1) -> list[Entry]:
    """The entries of a snapshot chunk of db.t put right after ``entry`` (a transaction's
    end), as the snapshot runner makes them."""
    values = [(i, f"s{i}") for i in range(first_id, first_id + rows)]
    return _chunk_entries(SHAPE, values, position_of(entry), 0, entry.gtid_state)


def expected(entries: list[Entry]) -> list[Row]:
    return [row for e in entries for row in entry_rows(e.to_wire())]


def run_batch(
    reader: CanalStreamReader, start: dict[str, Any], limit: Any = None
) -> tuple[dict[str, Any], list[Row]]:
    """Plan and run one micro-batch as Spark does: its end offset and rows."""
    end = reader.latestOffset(start, limit or ReadAllAvailable())
    parts = reader.partitions(start, end)
    return end, arrow_rows(b for p in parts for b in reader.read(p))


@pytest.mark.parametrize("reads", [3, 4])
@pytest.mark.parametrize("transactions", [1, 2, 3])
def test_a_restart_from_a_checkpoint_inside_a_chunk_reads_the_rest_of_it(
    reads: int, transactions: int
) -> None:
    """A checkpoint ends inside a chunk put at ``R``; the next transaction's BEGIN also
    starts at ``R`` and is stored after the chunk. The next run moves the cursor through
    the checkpoint (``POST C/cursor``) and still gets the rest of the chunk, once (the
    layouts: where the store's lookup lands among the entries stored)."""
    f = EntryFactory()
    first = f.tx()
    chunk = chunk_after(first[-1], reads * ROWS_PER_ENTRY)  # BEGIN, the READ entries, END
    later = [e for _ in range(transactions) for e in f.tx()]
    store = EventStore("d")
    store.put([*first, *chunk, *later], IDENTITY)
    server = EmbeddedServer("d", store, MemoryMetaManager("d"))

    def new_reader() -> CanalStreamReader:
        return CanalStreamReader(
            OPTS, lambda _: EmbeddedConnector(server), reading(IDENTITY.source_address)
        )

    reader = new_reader()
    checkpoint, rows = run_batch(reader, reader.initialOffset(), ReadMaxRows(len(first) + 2))
    assert Offset.from_dict(checkpoint).last.snap == 2  # the first READ entry of the chunk
    reader.stop()  # the driver ends: the sink committed, the source acked nothing
    reader = new_reader()
    try:
        end, more = run_batch(reader, checkpoint)
        assert reader.latestOffset(end, ReadAllAvailable()) == end
    finally:
        reader.stop()
    assert [*rows, *more] == expected([*first, *chunk, *later])
