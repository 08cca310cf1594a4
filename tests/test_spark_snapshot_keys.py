"""The Spark source and an incremental snapshot's READ entries, with the server's own
chunk entries (``canal_server.snapshot``), store and ``EmbeddedServer`` in this process:
a restart whose checkpoint ends inside a chunk, and the keys of READ entries across a
database switch."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from serving_fixtures import IDENTITY, EntryFactory, position_of
from spark_fixtures import EmbeddedConnector, arrow_rows, reading

from canal_client.packed import PackedBatch, PackedEntry
from canal_client.spark import CanalOptions, CanalStreamReader, Ledger
from canal_client.spark.rows import Offset, Row, entry_rows
from canal_protocol import Batch
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


# -- a database switch: READ entries are ordered by the GTID state they follow ------------

A, B = "10.0.0.1:3306", "10.0.0.2:3306"  # the old primary and the promoted standby


def packed(entries: list[Entry]) -> tuple[PackedEntry, ...]:
    return PackedBatch.of(Batch(1, entries)).entries


def history(journal: str, transactions: int, offset: int) -> tuple[EntryFactory, list[Entry]]:
    """A database's binlog with ``transactions`` transactions of server 1 (GTIDs 0-1-1 ...)
    from ``offset`` on: the history both databases share."""
    f = EntryFactory(journal)
    f.offset = offset
    return f, [e for _ in range(transactions) for e in f.tx()]


def test_after_a_switch_the_transactions_after_a_read_entry_are_kept() -> None:
    """The committed offset is a READ entry of database A (a Spark checkpoint inside a
    chunk when A died); the promoted standby B, with lower binlog offsets, delivers the
    last transaction again and then new ones: the new ones are kept, the old one not."""
    _, old = history("mariadb-bin.000003", 5, 4000)
    chunk = chunk_after(old[-1], 2 * ROWS_PER_ENTRY)
    held = Ledger()
    held.add(1, packed([*old, *chunk]), source=A)
    floor = held.items[len(old) + 1].key  # the chunk's first READ entry
    standby, again = history("mariadb-bin.000001", 5, 4)
    standby.server_id = 2  # B's own transactions: 0-2-6 ...
    new = standby.tx() + standby.tx() + standby.tx()
    ledger = Ledger(floor=floor)
    assert ledger.add(7, packed([*again[-3:], *new]), source=B) == len(new)
    assert [it.key.pos for it in ledger.items] == [e.header.offset for e in new]


def test_after_a_switch_a_chunk_read_again_at_the_same_gtid_state_is_kept() -> None:
    """Nothing was written since A put its chunks: B, resuming at the mark after the
    first one, reads the second again at the same GTID state, numbered from 1 at its own
    position. The ledger holds the first and part of the second from A: B's chunk is kept
    whole (READ rows twice rather than lost), also after a restart at the held key."""
    _, old = history("mariadb-bin.000003", 5, 4000)
    first = chunk_after(old[-1], ROWS_PER_ENTRY)
    second = _chunk_entries(
        SHAPE, [(i, f"s{i}") for i in range(300, 900)], position_of(old[-1]), len(first),
        old[-1].gtid_state,
    )  # fmt: skip
    ledger = Ledger()
    ledger.add(1, packed([*old, *first, *second[:3]]), source=A)
    _, again = history("mariadb-bin.000001", 5, 4)
    reread = chunk_after(again[-1], 600, first_id=300)
    later = EntryFactory("mariadb-bin.000001")
    later.offset, later.gtid_seq, later.server_id = again[-1].header.end_offset, 5, 2
    new = later.tx()
    top, kept = ledger.top, [*reread, *new[1:]]  # (that BEGIN starts at the chunk's offset:
    # it sorts before the chunk, as delivered; it gives no rows)
    assert ledger.add(2, packed([*again[-3:], *reread, *new]), source=B) == len(kept)
    keys = [it.key for it in ledger.items]
    assert keys == sorted(keys)
    assert [it.key for it in ledger.between(top, ledger.top)] == keys[-len(kept) :]
    restarted = Ledger(floor=top)
    assert restarted.add(3, packed([*again[-3:], *reread, *new]), source=B) == len(kept)


# -- a new leader re-puts the chunks of a micro-batch planned before it ----------------------


def test_a_micro_batch_planned_over_a_chunk_is_replayed_after_a_new_term(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Micro-batch 1 was planned over a chunk and the transaction after it, never run;
    the leader changed. The new term reads the binlog again from the cursor and puts the
    chunk again after the next write, at another position (docs/snapshot.md, failover):
    the old chunk's keys never come back. The replay takes the planned transaction's
    entries (every one, checked) and the chunk comes in the next micro-batch: every row,
    the chunk's once."""
    f = EntryFactory()
    tx1 = f.tx()
    chunk = chunk_after(tx1[-1], 100)  # BEGIN, READ, END
    tx2, tx3 = f.tx(), f.tx()
    first = EventStore("d")
    first.put([*tx1, *chunk, *tx2, *tx3], IDENTITY)
    meta = MemoryMetaManager("d")  # the fenced meta the terms share
    opts = CanalOptions(**{**OPTS.__dict__, "batch_size": 3})
    old = EmbeddedServer("d", first, meta)
    reader = CanalStreamReader(
        opts, lambda _: EmbeddedConnector(old), reading(IDENTITY.source_address)
    )
    start = reader.initialOffset()
    end0, rows = run_batch(reader, start, ReadMaxRows(len(tx1)))
    end1 = reader.latestOffset(end0, ReadMaxRows(len(chunk) + len(tx2) - 1))
    # (tx2's BEGIN starts at the chunk's offset: it sorts before the chunk, as delivered)
    assert Offset.from_dict(end1).last.pos == tx2[-1].header.offset
    reader.stop()  # the driver died before running micro-batch 1
    again = EventStore("d")  # the new term: from the cursor (after tx1), the chunk later
    again.put([*tx2, *tx3, *chunk_after(tx3[-1], 100)], IDENTITY)
    new = EmbeddedServer("d", again, meta)
    reader = CanalStreamReader(
        opts, lambda _: EmbeddedConnector(new, epoch=2), reading(IDENTITY.source_address, 2)
    )
    try:
        with caplog.at_level(logging.WARNING, "canal_client.spark"):
            parts = reader.partitions(end0, end1)
        assert "snapshot entries or BEGINs planned 3, there now 1 " in caplog.text
        rows += arrow_rows(b for p in parts for b in reader.read(p))
        end2, more = run_batch(reader, end1)
        assert reader.latestOffset(end2, ReadAllAvailable()) == end2
    finally:
        reader.stop()
    assert [*rows, *more] == expected([*tx1, *tx2, *tx3, *chunk_after(tx3[-1], 100)])
