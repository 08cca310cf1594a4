"""The snapshot runner's logic, with a stand-in for the database (``FakeTables``) and the
real sink, store and meta: a chunk never lands inside a transaction the reader puts in
pieces; a new term at the same binlog position numbers its entries after what clients
hold there; a mark is never placed before an earlier one; a done snapshot whose chunks a
client has not acked runs again in the next term (and is kept past KEEP_FINISHED); a
lapse of leadership confirmation pauses the runner instead of ending it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import pytest
from serving_fixtures import IDENTITY, EntryFactory
from snapshot_fixtures import WatchedCondition

import canal_server.snapshot as snapshot_module
from canal_cluster.retry import wait_until
from canal_protocol.entry import Entry, EntryType, EventType, TableColumns, Value
from canal_protocol.positions import EntryPosition, LogPosition
from canal_server.config import SnapshotSection
from canal_server.filter import EventFilter
from canal_server.meta import MemoryMetaManager
from canal_server.parse.logposition import MemoryLogPositionManager, MetaLogPositionManager
from canal_server.parse.snapshot import Chunk, TableShape
from canal_server.sink import EventSink
from canal_server.snapshot import Mark, SnapshotRun, Snapshots, SnapshotTerm
from canal_server.store import EventStore, is_after

DEST = "runner"
JOURNAL = "mariadb-bin.000001"
R = 1000  # the binlog position every chunk is read at, and where the reader is
WAIT_S = 30.0
Key = tuple[Value, ...]


class FakeTables:
    """ChunkReader's stand-in: tables ``db.<name>`` of INT keys 1..n (one column ``id``);
    every chunk is read at binlog position (JOURNAL, R)."""

    def __init__(self, rows: Mapping[str, int]) -> None:
        self.rows = dict(rows)
        self.source_address = IDENTITY.source_address

    def __call__(self, dsn: Mapping[str, Any]) -> FakeTables:  # the constructor
        return self

    def __enter__(self) -> FakeTables:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass

    def tables(self) -> list[tuple[str, str, str]]:
        return [(s, t, "InnoDB") for s, _, t in (n.partition(".") for n in self.rows)]

    def select_denied(self, schema: str, table: str) -> str | None:
        return None

    def shape(self, schema: str, table: str) -> TableShape:
        columns = TableColumns(("id",), ("int",), (True,))
        return TableShape(schema, table, columns, ("id",), (0,), ("int",), ("`id`",), ())

    def read(self, shape: TableShape, after: Key | None, limit: int) -> Chunk:
        first = 1 if after is None else cast(int, after[0]) + 1
        last = min(self.rows[shape.full_name], first + limit - 1)
        keys: tuple[Key, ...] = tuple((k,) for k in range(first, last + 1))
        return Chunk(JOURNAL, R, keys, keys, keys[-1] if keys else None)

    def gtid_state_at(self, journal: str, offset: int) -> str:
        return ""


def at(offset: int, snapshot: int = 0) -> LogPosition:
    return LogPosition(IDENTITY, EntryPosition(JOURNAL, offset, 1, "0-1-1", snapshot=snapshot))


class Term:
    """One leadership term of destination ``DEST``: sink, store, the snapshots' runner."""

    def __init__(
        self,
        meta: MemoryMetaManager,
        *,
        chunk_rows: int = 10,
        buffer_size: int = 10_000,
        vouched: Callable[[], bool] = lambda: True,
    ) -> None:
        self.meta = meta
        self.store = EventStore(DEST, buffer_size)
        self.sink = EventSink(DEST, EventFilter(""), self.store, MemoryLogPositionManager())
        self.sink.cond = WatchedCondition()
        self.snapshots = Snapshots(DEST, SnapshotSection(chunk_rows=chunk_rows), meta,
                                   EventFilter(""))  # fmt: skip
        self.stop = threading.Event()
        self.vouched = vouched

    def start(self, reader_at: LogPosition) -> Term:
        self.sink.reached(reader_at, "0-1-1")
        meta = self.meta
        term = SnapshotTerm(
            epoch=1, sink=self.sink, source=lambda: {}, identity=lambda: IDENTITY,
            vouched=self.vouched, stop=self.stop,
            min_cursor=lambda: MetaLogPositionManager(lambda d: meta).get_latest(DEST),
        )  # fmt: skip
        self.snapshots.start_term(term)
        return self

    def close(self) -> None:
        self.stop.set()
        self.store.stop()
        self.snapshots.stop_term()

    def run(self, snapshot_id: str) -> SnapshotRun:
        return SnapshotRun.from_json(self.meta.extras()["snapshots/" + snapshot_id])

    def wait_done(self, snapshot_id: str) -> None:
        wait_until(lambda: self.run(snapshot_id).state == "done" or not runner_alive(),
                   f"snapshot {snapshot_id} ends (or its runner stops)", WAIT_S)  # fmt: skip
        assert self.run(snapshot_id).state == "done", self.snapshots.get(snapshot_id)

    def entries(self, after: LogPosition | None = None) -> list[Entry]:
        return [e.entry for e in self.store.get(after, 100_000)]


def runner_alive() -> bool:
    return any(t.name == f"snapshot {DEST}" and t.is_alive() for t in threading.enumerate())


def read_keys(entries: Sequence[Entry]) -> list[int]:
    out: list[int] = []
    for e in entries:
        if e.type is EntryType.ROWDATA and e.header.event_type is EventType.READ:
            out.extend(cast(int, r.after_values()["id"]) for r in e.rows)
    return out


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTables]:
    fake = FakeTables({"db.t": 100, "db.u": 30})
    monkeypatch.setattr(snapshot_module, "ChunkReader", fake)
    yield fake
    wait_until(lambda: not runner_alive(), "the snapshot runner stopped", WAIT_S)


def test_a_chunk_waits_for_the_end_of_a_transaction_the_reader_puts_in_pieces(
    tables: FakeTables,
) -> None:
    """The reader is at R (a chunk read at R may go) and has put the first piece of a
    large transaction: the chunk goes after that transaction's END, not inside it."""
    term = Term(MemoryMetaManager(DEST), chunk_rows=1000).start(at(R))
    cond = term.sink.cond
    assert isinstance(cond, WatchedCondition)
    f = EntryFactory()
    f.offset = R
    tx = f.tx(rows=3)
    try:
        term.sink.sink(tx[:2], IDENTITY)  # BEGIN and a row: the transaction goes on
        term.snapshots.create(["db\\.t"])
        wait_until(lambda: cond.runner_waits.is_set() or bool(read_keys(term.entries())),
                   "the runner waits or puts its chunk", WAIT_S)  # fmt: skip
        term.sink.sink(tx[2:], IDENTITY)  # the rest and END
        term.wait_done("s1")
        entries = term.entries()
    finally:
        term.close()
    kinds = [(e.type, e.header.event_type) for e in entries]
    end = kinds.index((EntryType.TRANSACTIONEND, EventType.XACOMMIT))
    assert (EntryType.TRANSACTIONBEGIN, EventType.READ) in kinds[end:], kinds
    positions = [e.position().sort_key for e in entries]
    assert positions == sorted(positions), positions
    assert read_keys(entries) == list(range(1, 101))


def _first_term(meta: MemoryMetaManager) -> None:
    """Chunks of 10 rows (3 entries each) put at R until the store (12 entries, nobody
    acks) is full: marks at (R, 3), (R, 6), (R, 9), (R, 12); then the term ends."""
    term = Term(meta, buffer_size=12).start(at(R))
    try:
        term.snapshots.create(["db\\.t"])
        wait_until(lambda: term.run("s1").chunks == 4, "4 chunks put", WAIT_S)
    finally:
        term.close()
    marks = [m.position.position.sort_key for m in term.run("s1").marks]
    assert marks == [at(R, n).position.sort_key for n in (3, 6, 9, 12)]


def test_a_new_term_at_the_same_position_numbers_after_the_clients_cursors(
    tables: FakeTables,
) -> None:
    """A client acked through (R, 7) (inside the third chunk): the next term resumes after
    the second chunk (mark (R, 6)) and its entries at R must come after (R, 7), or the
    client skips them."""
    meta = MemoryMetaManager(DEST)
    meta.subscribe("c", "")
    _first_term(meta)
    cursor = at(R, 7)
    meta.update_cursor("c", cursor)
    term = Term(meta).start(cursor)  # the reader resumes at the min cursor (with its ordinal)
    try:
        term.wait_done("s1")
        entries = term.entries()
    finally:
        term.close()
    delivered = [e for e in entries if is_after(LogPosition(IDENTITY, e.position()), cursor)]
    assert read_keys(delivered) == list(range(21, 101))  # the client gets every row after (20,)
    positions = [e.position().sort_key for e in entries]
    assert positions == sorted(positions) and positions[0] > cursor.position.sort_key


def _snapshot_done(meta: MemoryMetaManager) -> Term:
    """A term from R that runs snapshot s1 of db.t to done; closed."""
    term = Term(meta).start(at(R))
    try:
        term.snapshots.create(["db\\.t"])
        term.wait_done("s1")
    finally:
        term.close()
    return term


def test_the_mark_of_an_empty_chunk_is_not_before_the_chunk_it_follows(
    tables: FakeTables,
) -> None:
    """db.t's last read (100 rows in chunks of 10: the 11th read is empty) ends the table
    without entries: its mark goes at the last entry put, not back at the reader's R."""
    term = _snapshot_done(MemoryMetaManager(DEST))
    marks = [m.position.position.sort_key for m in term.run("s1").marks]
    assert len(marks) == 11 and marks == sorted(marks), marks
    assert marks[-1] == at(R, 30).position.sort_key


def test_resume_never_takes_a_mark_after_an_earlier_one_past_the_cursor() -> None:
    """Marks out of order (as an older version placed an empty chunk's): a mark counts only
    when every earlier mark is at or before the cursor too."""
    run = SnapshotRun("s1", ["db.t", "db.u"], 10)
    run.marks = [
        Mark(at(R, 42), 0, (100,), True, 100, 10),
        Mark(at(R), 1, None, True, 0, 0),
    ]
    run.resume(at(R, 10))  # the client has not acked all of table 0's last chunk
    assert run.current == 0 and not run.progress[0].done and run.marks == []
    run.marks = [Mark(at(R, 42), 0, (100,), True, 100, 10), Mark(at(R), 1, None, True, 0, 0)]
    run.add_mark(Mark(at(R, 45), 1, None, True, 0, 0), at(R, 10))
    assert [m.position for m in run.marks] == [at(R, 42), at(R), at(R, 45)]


def _done_unacked(meta: MemoryMetaManager) -> None:
    """A term puts all of db.t (10 chunks of 10 rows at R, marks (R, 3) ... (R, 30) and
    the empty last read's, (R, 30) too) and the run is done; client c acks nothing."""
    meta.subscribe("c", "")
    meta.update_cursor("c", at(R))
    term = _snapshot_done(meta)
    assert term.run("s1").marks[-1].position == at(R, 30)


def test_a_done_snapshot_whose_chunks_a_client_has_not_acked_runs_again(
    tables: FakeTables,
) -> None:
    """c acked through (R, 7) when the term that finished s1 ended: the next term's reader
    resumes there, so s1 is running again from its mark (R, 6) (20 rows) and puts every
    row after (20,) again, after c's cursor."""
    meta = MemoryMetaManager(DEST)
    _done_unacked(meta)
    cursor = at(R, 7)
    meta.update_cursor("c", cursor)
    lapse = Lapse()  # the runner puts nothing until confirmed: the state is the resumed one
    term = Term(meta, vouched=lapse).start(cursor)
    try:
        resumed = term.run("s1")
        assert (resumed.state, resumed.rows, resumed.finished_ms) == ("running", 20, 0)
        assert term.snapshots.get("s1")["tables_done"] == 0
        lapse.confirmed.set()
        term.wait_done("s1")
        entries = term.entries()
    finally:
        term.close()
    delivered = [e for e in entries if is_after(LogPosition(IDENTITY, e.position()), cursor)]
    assert read_keys(delivered) == list(range(21, 101))
    assert term.run("s1").rows == 100


def test_a_done_snapshot_every_client_acked_stays_done(tables: FakeTables) -> None:
    meta = MemoryMetaManager(DEST)
    _done_unacked(meta)
    meta.update_cursor("c", at(R, 30))  # c acked the last chunk
    term = Term(meta).start(at(R, 30))
    try:
        assert term.run("s1").state == "done"  # start_term decided: nothing to put again
        assert term.snapshots.get("s1")["rows"] == 100
    finally:
        term.close()


def test_keep_finished_keeps_a_done_snapshot_a_client_has_not_acked(
    tables: FakeTables,
) -> None:
    """More than KEEP_FINISHED snapshots end while c acks nothing: none of them is dropped
    from the meta (a next leader must put their chunks again)."""
    meta = MemoryMetaManager(DEST)
    meta.subscribe("c", "")
    meta.update_cursor("c", at(R))
    term = Term(meta).start(at(R))
    ids = []
    try:
        for _ in range(snapshot_module.KEEP_FINISHED + 2):
            ids.append(term.snapshots.create(["db\\.u"])["id"])
            term.wait_done(ids[-1])
    finally:
        term.close()
    assert [r["id"] for r in term.snapshots.runs()] == ids
    assert sorted(k for k in meta.extras() if k.startswith("snapshots/")) == sorted(
        f"snapshots/{i}" for i in ids
    )


class Lapse:
    """``vouched``: False (the fencing deadline passed before a keepalive came back) until
    ``confirmed`` is set; counts the calls."""

    def __init__(self) -> None:
        self.confirmed = threading.Event()
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.confirmed.is_set()


def test_a_lapse_of_confirmation_pauses_the_runner_until_confirmed_again(
    tables: FakeTables,
) -> None:
    lapse = Lapse()
    term = Term(MemoryMetaManager(DEST), vouched=lapse).start(at(R))
    try:
        term.snapshots.create(["db\\.(t|u)"])
        wait_until(lambda: lapse.asked >= 3 or not runner_alive(),
                   "the runner asks again (or stops)", WAIT_S)  # fmt: skip
        assert term.entries() == []  # nothing is put while unconfirmed
        lapse.confirmed.set()  # the same epoch, confirmed again
        term.wait_done("s1")
        keys = read_keys(term.entries())
    finally:
        term.close()
    assert keys == [*range(1, 101), *range(1, 31)]


def test_the_term_ending_during_a_lapse_stops_the_runner(tables: FakeTables) -> None:
    lapse = Lapse()
    term = Term(MemoryMetaManager(DEST), vouched=lapse).start(at(R))
    try:
        term.snapshots.create(["db\\.t"])
        wait_until(lambda: lapse.asked >= 1, "the runner asks for confirmation", WAIT_S)
        assert term.entries() == []
    finally:
        term.close()  # joins the runner: it must end while paused
    assert not runner_alive()
    assert term.run("s1").state == "running"  # the next term resumes it
