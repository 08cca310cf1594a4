"""End to end on the sandbox primary: BinlogReader → EventSink (filter) → EventStore →
EmbeddedServer, with clients that ack, roll back and keep batches outstanding; then a
reader restart from the memory position, then a "new leader" (fresh store, restored
meta) resuming from the minimum client cursor.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from reader_fixtures import db  # noqa: F401  (fixture)

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.batch import Batch
from canal_protocol.entry import Entry, EntryType
from canal_protocol.positions import EntryPosition, LogPosition
from canal_server.embedded import EmbeddedServer
from canal_server.filter import EventFilter
from canal_server.meta import MemoryMetaManager, MetaSnapshot
from canal_server.parse.logposition import (
    FailbackLogPositionManager,
    MemoryLogPositionManager,
    MetaLogPositionManager,
)
from canal_server.parse.reader import BinlogReader, ReaderConfig
from canal_server.sink import EventSink
from canal_server.store import EventStore

DB = "t_serving_e2e"
DEST = "e2e"
SLAVE_ID = 7301
WAIT_S = 60.0
Sig = tuple[Any, ...]


def sig(e: Entry) -> Sig:
    """What a test can predict about an entry: type; event type, table and row ids."""
    if e.type is not EntryType.ROWDATA:
        return (e.type.value,)
    ids = tuple(next(c.value for c in (r.after or r.before) if c.name == "id") for r in e.rows)
    return (e.header.event_type.value, e.header.table, ids)


BEGIN, END = ("TRANSACTIONBEGIN",), ("TRANSACTIONEND",)


@dataclass
class Workload:
    """Runs transactions and records the entries clients c (all) and k (items) expect."""

    primary: Any
    all: list[Sig] = field(default_factory=list)
    items: list[Sig] = field(default_factory=list)

    def tx(self, *statements: str, rows: list[Sig]) -> None:
        self.primary.execute("BEGIN", *statements, "COMMIT")
        kept = [r for r in rows if r[1] != "skip"]
        if kept:
            self.all.extend([BEGIN, *kept, END])
        only_items = [r for r in kept if r[1] == "items"]
        if only_items:
            self.items.extend([BEGIN, *only_items, END])

    def ddl(self, sql: str, table: str) -> None:
        self.primary.execute(sql)
        if table != "skip":
            self.all.append(("ALTER", table, ()))
        if table == "items":
            self.items.append(("ALTER", table, ()))

    def run(self, ids: range, with_ddl: bool = False) -> None:
        for i in ids:
            self.tx(
                f"INSERT INTO {DB}.items (id, v) VALUES ({i}, 'a')",
                f"INSERT INTO {DB}.other (id, v) VALUES ({i}, 'o')",
                rows=[("INSERT", "items", (i,)), ("INSERT", "other", (i,))],
            )
            if i % 3 == 1:
                self.tx(
                    f"UPDATE {DB}.items SET v = 'b' WHERE id = {i}",
                    rows=[("UPDATE", "items", (i,))],
                )
            if i % 3 == 2 and i - 1 in ids:
                self.tx(
                    f"DELETE FROM {DB}.items WHERE id = {i - 1}",
                    rows=[("DELETE", "items", (i - 1,))],
                )
            if i % 4 == 0:
                self.tx(f"INSERT INTO {DB}.skip (id) VALUES ({i})", rows=[("INSERT", "skip", (i,))])
            if with_ddl and i == ids[len(ids) // 2]:
                self.ddl(f"ALTER TABLE {DB}.items ADD COLUMN w{i} INT NULL", "items")
                self.ddl(f"ALTER TABLE {DB}.skip ADD COLUMN w{i} INT NULL", "skip")


class Pipeline:
    """A reader thread feeding the sink; restartable."""

    def __init__(self, primary: Any, sink: EventSink) -> None:
        self.primary = primary
        self.sink = sink
        self.errors: list[BaseException] = []
        self.reader: BinlogReader | None = None
        self.thread: threading.Thread | None = None

    def start(self, start: EntryPosition) -> None:
        config = ReaderConfig(master=self.primary.dsn(), slave_id=SLAVE_ID, destination=DEST)
        reader = BinlogReader(config, lambda es: self.sink.sink(es, reader.identity))
        self.reader = reader

        def run() -> None:
            try:
                reader.run(start)
            except BaseException as exc:
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, name="e2e-reader", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.reader is not None and self.thread is not None:
            self.reader.stop()
            self.thread.join(WAIT_S)
            assert not self.thread.is_alive(), "reader did not stop"
        assert not self.errors, self.errors

    def wait_sunk(self) -> None:
        """Until the sink has recorded the primary's current end of binlog."""
        journal, offset = self.primary.master_status()
        target = EntryPosition(journal=journal, offset=offset).sort_key

        def sunk() -> bool:
            assert not self.errors, self.errors
            latest = self.sink.positions.get_latest(DEST)
            return latest is not None and latest.position.sort_key >= target

        wait_until(sunk, "reader caught up with the primary", WAIT_S)


def consume(server: EmbeddedServer, client: str, want: int) -> list[Entry]:
    """Get with varying sizes; roll back every 5th batch, keep every 5th outstanding
    for one more get (then ack cumulatively, unless it was the last), ack the rest."""
    acked: list[Entry] = []
    outstanding: list[Batch] = []
    sizes = [1, 3, 5, 2, 7]
    n = 0
    while len(acked) < want:
        b = server.get_without_ack(client, sizes[n % len(sizes)], timeout_s=WAIT_S)
        assert not b.is_empty, f"{client}: only {len(acked)} of {want} entries arrived"
        assert server.get_batch(client, b.id) == b
        n += 1
        outstanding.append(b)
        if n % 5 == 2:
            server.rollback(client, outstanding[0].id)
            outstanding.clear()
        elif n % 5 != 3 or len(acked) + sum(len(o.entries) for o in outstanding) >= want:
            server.ack(client, outstanding[-1].id)
            for o in outstanding:
                acked.extend(o.entries)
            outstanding.clear()
    assert server.get_without_ack(client, 100, timeout_s=0.2).is_empty
    return acked


def consume_both(server: EmbeddedServer, work: Workload) -> None:
    """Both clients consume at once (one slow client would stall the shared store)."""
    results: dict[str, list[Sig]] = {}
    errors: list[BaseException] = []

    def run(client: str, want: int) -> None:
        try:
            results[client] = [sig(e) for e in consume(server, client, want)]
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=("c", len(work.all))),
        threading.Thread(target=run, args=("k", len(work.items))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 3)
    assert not errors, errors
    assert results["c"] == work.all
    assert results["k"] == work.items


@pytest.fixture
def primary(db: Sandbox) -> Iterator[Any]:  # noqa: F811
    p = db.primary
    p.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.items (id INT PRIMARY KEY, v VARCHAR(32))",
        f"CREATE TABLE {DB}.other (id INT PRIMARY KEY, v VARCHAR(32))",
        f"CREATE TABLE {DB}.skip (id INT PRIMARY KEY)",
    )
    yield p
    p.execute(f"DROP DATABASE IF EXISTS {DB}")


def _instance_filter() -> EventFilter:
    # The empty-transaction gate is disabled so the expected entries are exact.
    return EventFilter(
        f"{DB}\\..*", f"{DB}\\.skip", empty_tx_interval_s=1e9, empty_tx_threshold=10**9
    )


def test_reader_to_clients_with_ack_rollback_and_restarts(primary: Any) -> None:
    journal, offset = primary.master_status()
    store = EventStore(DEST, buffer_size=64)
    meta = MemoryMetaManager(DEST)
    memory = MemoryLogPositionManager()
    sink = EventSink(DEST, _instance_filter(), store, memory)
    server = EmbeddedServer(DEST, store, meta)
    server.subscribe("c")
    server.subscribe("k", f"{DB}\\.items")
    pipe = Pipeline(primary, sink)
    pipe.start(EntryPosition(journal=journal, offset=offset))
    try:
        # phase 1: a workload larger than the store (backpressure), DDL in the middle
        work = Workload(primary)
        work.run(range(1, 25), with_ddl=True)
        consume_both(server, work)
        pipe.wait_sunk()
        latest = memory.get_latest(DEST)
        cursor = server.cursor("c")
        assert latest is not None and cursor is not None
        # the last transaction (on the excluded table) was dropped but still counts
        assert latest.position.sort_key > cursor.position.sort_key
        assert (latest.position.journal, latest.position.offset) == primary.master_status()

        # phase 2: the reader restarts from the memory position, same store
        pipe.stop()
        pipe.start(latest.position)
        work = Workload(primary)
        work.run(range(100, 110))
        consume_both(server, work)

        # k keeps one batch outstanding; c acks everything
        work = Workload(primary)
        work.run(range(200, 204))
        pipe.wait_sunk()
        pending = server.get_without_ack("k", 1000)
        assert [sig(e) for e in pending.entries] == work.items
        assert [sig(e) for e in consume(server, "c", len(work.all))] == work.all
    finally:
        pipe.stop()
    store.stop()

    # phase 3: a new leader: fresh store, meta restored, reader from the min cursor
    wire = json.loads(json.dumps(meta.snapshot().to_dict()))
    meta2 = MemoryMetaManager(DEST)
    meta2.restore(MetaSnapshot.from_dict(wire))
    positions = FailbackLogPositionManager(
        MemoryLogPositionManager(), MetaLogPositionManager(lambda d: meta2)
    )
    start = positions.get_latest(DEST)
    assert isinstance(start, LogPosition) and start == meta2.cursor("k")
    store2 = EventStore(DEST, buffer_size=64)
    server2 = EmbeddedServer(DEST, store2, meta2)
    pipe2 = Pipeline(primary, EventSink(DEST, _instance_filter(), store2, positions))
    pipe2.start(start.position)
    try:
        again = server2.get_batch("k", pending.id, timeout_s=WAIT_S)
        assert [e.to_wire() for e in again.entries] == [e.to_wire() for e in pending.entries]
        server2.ack("k", pending.id)
        work = Workload(primary)
        work.run(range(300, 306))
        consume_both(server2, work)
    finally:
        pipe2.stop()
        store2.stop()
