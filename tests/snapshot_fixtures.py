"""An in-process leader pipeline with incremental snapshots, writers, and an applying
consumer, on the sandbox primary (tests/test_snapshot*.py).

``SnapshotPipeline(primary, dest, slave_id)``: BinlogReader → EventSink → EventStore →
EmbeddedServer, with ``Snapshots`` wired to the sink like a node's term. ``Applier``
applies a client's batches in order (READ/INSERT upsert, UPDATE upsert of the after
image (the before key deleted when the key changed), DELETE delete) into a dict.
``Writers`` hammer a table's keys with updates, deletes and inserts in threads.
``WatchedCondition`` is a sink's condition that tells when the snapshot runner waits on it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from canal_cluster.retry import wait_until
from canal_protocol.entry import Entry, EntryType, EventType, Value
from canal_protocol.positions import EntryPosition, LogPosition
from canal_server.config import SnapshotSection
from canal_server.embedded import EmbeddedServer
from canal_server.filter import EventFilter
from canal_server.meta import MemoryMetaManager
from canal_server.parse.logposition import MemoryLogPositionManager, MetaLogPositionManager
from canal_server.parse.reader import BinlogReader, ReaderConfig
from canal_server.parse.snapshot import ChunkReader
from canal_server.parse.transaction import gtid_state_at
from canal_server.sink import EventSink
from canal_server.snapshot import Snapshots, SnapshotTerm
from canal_server.store import EventStore

__all__ = ["WAIT_S", "Applier", "SnapshotPipeline", "WatchedCondition", "Writers", "table_rows"]

WAIT_S = 120.0
Row = dict[str, Value]


class SnapshotPipeline:
    """A leader's term in one process (see the module doc)."""

    def __init__(
        self,
        primary: Any,
        dest: str,
        slave_id: int,
        *,
        chunk_rows: int = 100,
        buffer_size: int = 100_000,
        buffer_bytes: int = 256 * 1024 * 1024,
        meta: MemoryMetaManager | None = None,
        regex: str = "",
        section: SnapshotSection | None = None,
        transaction_size: int = 1024,
    ) -> None:
        self.primary = primary
        self.dest = dest
        self.store = EventStore(dest, buffer_size, buffer_bytes)
        self.meta = meta if meta is not None else MemoryMetaManager(dest)
        self.positions = MemoryLogPositionManager()
        self.sink = EventSink(dest, EventFilter(regex), self.store, self.positions)
        config = ReaderConfig(
            master=primary.dsn(), slave_id=slave_id, destination=dest,
            transaction_size=transaction_size,
        )  # fmt: skip
        self.reader = BinlogReader(config, lambda es: self.sink.sink(es, self.reader.identity))
        self.server = EmbeddedServer(dest, self.store, self.meta)
        section = section or SnapshotSection(chunk_rows=chunk_rows)
        self.snapshots = Snapshots(dest, section, self.meta, EventFilter(regex))
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def start(self, start: LogPosition | None = None, initial: bool = False) -> SnapshotPipeline:
        if start is None:
            journal, offset = self.primary.master_status()
            start = LogPosition(self.reader.identity, EntryPosition(journal, offset))
        gtid = gtid_state_at(self.primary.dsn(), start.journal, start.offset)
        self.sink.reached(start, gtid)

        def run() -> None:
            try:
                self.reader.run(start.position)
            except BaseException as exc:
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, name=f"reader {self.dest}", daemon=True)
        self.thread.start()
        meta = self.meta
        term = SnapshotTerm(
            epoch=1, sink=self.sink, source=lambda: self.reader.source,
            identity=lambda: self.reader.identity, vouched=lambda: True, stop=self.stop_event,
            min_cursor=lambda: MetaLogPositionManager(lambda d: meta).get_latest(self.dest),
        )  # fmt: skip
        self.snapshots.start_term(term, initial=initial)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.store.stop()
        self.reader.stop()
        self.snapshots.stop_term()
        if self.thread is not None:
            self.thread.join(30)
        assert not self.errors, self.errors

    def wait_done(self, snapshot_id: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def done() -> bool:
            assert not self.errors, self.errors
            found[:] = [self.snapshots.get(snapshot_id)]
            return found[0]["state"] in ("done", "failed", "cancelled")

        wait_until(done, f"snapshot {snapshot_id} ends", WAIT_S)
        return found[0]

    def wait_sunk(self) -> None:
        """Until the reader has put the primary's current end of binlog."""
        journal, offset = self.primary.master_status()
        target = EntryPosition(journal=journal, offset=offset).sort_key

        def sunk() -> bool:
            assert not self.errors, self.errors
            last = self.sink.last
            return last is not None and last.position.sort_key >= target

        wait_until(sunk, "reader caught up with the primary", WAIT_S)


class WatchedCondition(threading.Condition):
    """A sink's ``cond`` whose ``runner_waits`` is set whenever the snapshot runner (a
    thread named ``snapshot ...``) waits on it: it declined to put its chunk for now."""

    def __init__(self) -> None:
        super().__init__()
        self.runner_waits = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if threading.current_thread().name.startswith("snapshot "):
            self.runner_waits.set()
        return super().wait(timeout)


class Applier:
    """Applies one client's stream in order into ``tables[full_name][key] = row``; from
    an EmbeddedServer (``Applier(server, client, keys)``) or a connector
    (``Applier.over(connector, keys)``)."""

    def __init__(
        self, server: EmbeddedServer | None, client: str, keys: Mapping[str, Sequence[str]]
    ) -> None:
        self.server = server
        self.connector: Any = None
        self.client = client
        self.keys = keys
        self.tables: dict[str, dict[tuple[Value, ...], Row]] = {t: {} for t in keys}
        self.reads = 0
        self.entries: list[Entry] = []
        if server is not None:
            server.subscribe(client)

    @classmethod
    def over(cls, connector: Any, keys: Mapping[str, Sequence[str]]) -> Applier:
        applier = cls(None, "", keys)
        applier.connector = connector
        connector.subscribe()
        return applier

    def drain(self, timeout_s: float = 0.5) -> int:
        """Get, apply and ack until a get returns nothing; the entries applied."""
        n = 0
        while True:
            got = self.step(1000, timeout_s)
            if not got:
                return n
            n += got

    def step(self, size: int, timeout_s: float = 0.5) -> int:
        """One batch of up to ``size`` entries: get, apply, ack; the entries applied."""
        if self.connector is not None:
            batch = self.connector.get_without_ack(size, timeout_s)
        else:
            assert self.server is not None
            batch = self.server.get_without_ack(self.client, size, timeout_s)
        if batch.is_empty:
            return 0
        for e in batch.entries:
            self.apply(e)
        if self.connector is not None:
            self.connector.ack(batch.id)
        else:
            assert self.server is not None
            self.server.ack(self.client, batch.id)
        return len(batch.entries)

    def apply(self, e: Entry) -> None:
        self.entries.append(e)
        if e.type is not EntryType.ROWDATA or e.is_ddl or e.full_name not in self.tables:
            return
        table, key = self.tables[e.full_name], self.keys[e.full_name]
        for change in e.rows:
            if e.header.event_type is EventType.DELETE:
                table.pop(_key(change.before_values(), key), None)
                continue
            after = change.after_values()
            if change.before:
                table.pop(_key(change.before_values(), key), None)
            table[_key(after, key)] = after
            if e.header.event_type is EventType.READ:
                self.reads += 1


def _key(row: Row, key: Sequence[str]) -> tuple[Value, ...]:
    return tuple(row[k] for k in key)


def table_rows(primary: Any, schema: str, table: str) -> dict[tuple[Value, ...], Row]:
    """The table as it is now, in the snapshot's value forms, by key."""
    with ChunkReader(primary.dsn()) as reader:
        shape = reader.shape(schema, table)
        chunk = reader.read(shape, None, 10_000_000)
    names = shape.columns.names
    return {
        k: dict(zip(names, r, strict=True)) for k, r in zip(chunk.keys, chunk.rows, strict=True)
    }


class Writers:
    """Threads that update, delete and insert rows of ``schema.table`` (``id`` INT key,
    ``v`` INT, ``s`` VARCHAR) at random keys in ``[1, keys]``, until ``stop``; ``rate``:
    about that many changes per second in all (0: as fast as they can)."""

    def __init__(
        self, primary: Any, full_name: str, keys: int, threads: int = 2, rate: float = 0.0
    ) -> None:
        self.primary = primary
        self.pause_s = threads / rate if rate else 0.0
        self.full_name = full_name
        self.keys = keys
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.done = 0
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> int:
        self.stop_event.set()
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors
        return self.done

    def _run(self, seed: int) -> None:
        rnd = random.Random(seed)
        t = self.full_name
        try:
            with self.primary.admin() as conn, conn.cursor() as cur:
                while not self.stop_event.is_set():
                    k = rnd.randint(1, self.keys)
                    op = rnd.random()
                    if op < 0.6:
                        cur.execute(f"UPDATE {t} SET v = v + 1, s = CONCAT('u', v) WHERE id = {k}")
                    elif op < 0.8:
                        cur.execute(f"DELETE FROM {t} WHERE id = {k}")
                    else:
                        cur.execute(
                            f"INSERT INTO {t} (id, v, s) VALUES ({k}, 0, 'new') "
                            "ON DUPLICATE KEY UPDATE v = v + 100"
                        )
                    self.done += 1
                    if self.pause_s:
                        self.stop_event.wait(self.pause_s)
        except BaseException as exc:
            self.errors.append(exc)
