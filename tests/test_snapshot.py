"""Incremental snapshots end to end on the sandbox primary: a consumer applying the stream
in order ends with exactly the source table, under writers hammering the snapshotted keys;
composite keys of several types; tables without a key refused; ALTER and CREATE during a
snapshot; bad input; cancel; a resume from the marks (a new term) after a lost term, also
at the very binlog position the last term put its chunks at, and of a snapshot that was
done but whose last chunks the client had not acked; a transaction read in pieces while
a chunk is ready."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from reader_fixtures import db  # noqa: F401  (fixture)
from snapshot_fixtures import (
    WAIT_S,
    Applier,
    SnapshotPipeline,
    WatchedCondition,
    Writers,
    table_rows,
)

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import Entry, EntryType, EventType
from canal_protocol.errors import (
    InvalidArgument,
    SnapshotConflict,
    UnknownSnapshot,
    UnknownTable,
)
from canal_protocol.positions import LogIdentity, LogPosition
from canal_server.config import SnapshotSection
from canal_server.meta import MemoryMetaManager
from canal_server.parse.snapshot import ChunkReader, NoSnapshotKey

DB = "t_snap"
KEYS = 3000


@pytest.fixture
def primary(db: Sandbox) -> Iterator[Any]:  # noqa: F811
    p = db.primary
    p.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(40))",
        f"INSERT INTO {DB}.t SELECT seq, seq, CONCAT('r', seq) FROM {DB}.seq_1_to_{KEYS}",
    )
    yield p
    p.execute(f"DROP DATABASE IF EXISTS {DB}")


def test_snapshot_under_writers_equals_the_source(primary: Any) -> None:
    pipe = SnapshotPipeline(primary, "snap1", 7401, chunk_rows=500).start()
    try:
        consumer = Applier(pipe.server, "c", {f"{DB}.t": ("id",)})
        writers = Writers(primary, f"{DB}.t", KEYS + 200, threads=3).start()
        run = pipe.snapshots.create([f"{DB}\\.t"])
        assert run["state"] in ("pending", "running") and run["tables_total"] == 1
        while pipe.snapshots.get(run["id"])["state"] != "done":
            consumer.step(1000, 0.2)
        wait_until(lambda: writers.done > 500, "writers made 500 changes", WAIT_S)
        changes = writers.stop()
        pipe.wait_sunk()
        consumer.drain()
        final = pipe.snapshots.get(run["id"])
    finally:
        pipe.stop()
    want = table_rows(primary, DB, "t")
    got = consumer.tables[f"{DB}.t"]
    assert got == want, _diff(got, want)
    assert final["tables_done"] == 1 and final["chunks"] >= KEYS // 500
    assert 0 < consumer.reads <= final["rows"] <= KEYS + 200
    # READ entries come wrapped like transactions, in order with the changes
    kinds = {e.header.event_type for e in consumer.entries if e.type is EntryType.ROWDATA}
    assert EventType.READ in kinds and EventType.UPDATE in kinds, kinds
    positions = [e.position().sort_key for e in consumer.entries]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    print(f"{changes} concurrent changes, {consumer.reads} rows read, {final['chunks']} chunks")


def _state(pipe: SnapshotPipeline, run: dict[str, Any]) -> str:
    return str(pipe.snapshots.get(run["id"])["state"])


def _diff(got: dict[Any, Any], want: dict[Any, Any]) -> str:
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    wrong = [(k, got[k], want[k]) for k in sorted(set(got) & set(want)) if got[k] != want[k]][:5]
    return f"missing {missing}, extra {extra}, different {wrong}"


class _AsUser:
    """The primary, seen through another database user (``dsn()``)."""

    def __init__(self, server: Any, user: str, password: str) -> None:
        self.server, self.user, self.password = server, user, password

    def dsn(self) -> dict[str, Any]:
        return {**self.server.dsn(), "user": self.user, "password": self.password}

    def master_status(self) -> tuple[str, int]:
        return tuple(self.server.master_status())


def test_table_without_select_privilege_is_refused_at_start(primary: Any) -> None:
    """A user that sees a table (it may write it) but cannot SELECT from it: refused when
    the snapshot is asked for, naming the table and the grant; not a run that retries
    its first chunk forever. A table it cannot see at all: the not-found error says
    why it may be missing."""
    user, password = "t_snap_nosel", "nosel-secret"
    primary.execute(
        f"CREATE TABLE {DB}.secret (id INT PRIMARY KEY)",
        f"DROP USER IF EXISTS '{user}'@'127.0.0.1'",
        f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
        f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'",
        f"GRANT SELECT ON {DB}.t TO '{user}'@'127.0.0.1'",
        f"GRANT INSERT ON {DB}.secret TO '{user}'@'127.0.0.1'",
    )
    pipe = SnapshotPipeline(_AsUser(primary, user, password), "snap_nosel", 7407).start()
    try:
        with pytest.raises(InvalidArgument) as denied:
            pipe.snapshots.create([f"{DB}\\.secret"])
        assert denied.value.field == "tables[0]"
        assert f"{DB}.secret" in str(denied.value) and "GRANT SELECT" in str(denied.value)
        with pytest.raises(UnknownTable) as unseen:
            pipe.snapshots.create([f"{DB}\\.(t|nokey_hidden)", f"{DB}\\.invisible"])
        assert unseen.value.field == "tables[1]" and "SELECT" in str(unseen.value)
        assert pipe.snapshots.runs() == []
    finally:
        pipe.stop()
        primary.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")


def test_bad_input_names_the_field(primary: Any) -> None:
    primary.execute(
        f"CREATE TABLE {DB}.nokey (a INT, b INT)",
        f"CREATE TABLE {DB}.hidden (id INT PRIMARY KEY)",
        f"CREATE TABLE {DB}.myisam (id INT PRIMARY KEY) ENGINE=MyISAM",
    )
    regex = f"{DB}\\.(t|nokey|myisam)"
    pipe = SnapshotPipeline(primary, "snap2", 7402, regex=regex).start()
    try:
        s = pipe.snapshots
        with pytest.raises(InvalidArgument) as bad:
            s.create([])
        assert bad.value.field == "tables"
        with pytest.raises(InvalidArgument) as bad:
            s.create([f"{DB}\\.t", "(unclosed"])
        assert bad.value.field == "tables[1]"
        with pytest.raises(UnknownTable) as unknown:
            s.create([f"{DB}\\.nothing"])
        assert unknown.value.field == "tables[0]"
        with pytest.raises(NoSnapshotKey) as nokey:
            s.create([f"{DB}\\.nokey"])
        assert f"{DB}.nokey" in str(nokey.value)
        with pytest.raises(InvalidArgument) as outside:
            s.create([f"{DB}\\.t", f"{DB}\\.hidden"])
        assert outside.value.field == "tables[1]" and "outside" in str(outside.value)
        with pytest.raises(InvalidArgument) as engine:
            s.create([f"{DB}\\.myisam"])
        assert "MyISAM" in str(engine.value)
        with pytest.raises(UnknownSnapshot):
            s.cancel("s99")
        # no client consumes: the first snapshot stays running, a second one conflicts
        first = s.create([f"{DB}\\.t"])
        with pytest.raises(SnapshotConflict) as conflict:
            s.create([f"{DB}\\.T"])  # the same table, another spelling
        assert conflict.value.field == "tables"
        cancelled = s.cancel(first["id"])
        assert cancelled["state"] == "cancelled"
        with pytest.raises(SnapshotConflict):
            s.cancel(first["id"])
        second = s.create([f"{DB}\\.t"])
        assert second["id"] != first["id"]
    finally:
        pipe.stop()


def test_composite_key_of_several_types_alter_and_create_during_the_snapshot(
    primary: Any,
) -> None:
    primary.execute(
        f"CREATE TABLE {DB}.c (a VARCHAR(20) NOT NULL, b DATETIME(3) NOT NULL,"
        " c VARBINARY(8) NOT NULL, d DECIMAL(10,2) NOT NULL, v INT, PRIMARY KEY (a, b, c, d))",
        f"INSERT INTO {DB}.c SELECT CONCAT('k', seq % 7), TIMESTAMP'2024-01-01 00:00:00'"
        f" + INTERVAL (seq % 5) SECOND, UNHEX(HEX(seq % 3)), seq / 4, seq FROM {DB}.seq_1_to_400",
        f"CREATE TABLE {DB}.u (id INT NULL, code CHAR(8) NOT NULL, v INT, UNIQUE KEY (code))",
        f"CREATE TABLE {DB}.e (k ENUM('zz','b','a') NOT NULL, s SET('q','p') NOT NULL,"
        " n INT NOT NULL, PRIMARY KEY (k, s, n))",
        f"INSERT INTO {DB}.e SELECT ELT(1 + seq % 3, 'zz', 'b', 'a'), ELT(1 + seq % 4, '',"
        f" 'q', 'p', 'q,p'), seq FROM {DB}.seq_1_to_120",
        f"INSERT INTO {DB}.u SELECT seq, CONCAT('c', seq), seq FROM {DB}.seq_1_to_300",
    )
    pipe = SnapshotPipeline(primary, "snap3", 7403, chunk_rows=37).start()
    try:
        keys = {f"{DB}.c": ("a", "b", "c", "d"), f"{DB}.u": ("code",), f"{DB}.t": ("id",),
                f"{DB}.n": ("id",), f"{DB}.e": ("k", "s", "n")}  # fmt: skip
        consumer = Applier(pipe.server, "c", keys)
        run = pipe.snapshots.create([f"{DB}\\.(c|u|t|e)"])
        names = [t["table"] for t in run["tables"]]
        assert names == [f"{DB}.c", f"{DB}.e", f"{DB}.t", f"{DB}.u"]
        consumer.drain(0.2)
        primary.execute(
            f"ALTER TABLE {DB}.t ADD COLUMN w INT NULL DEFAULT 7",
            f"UPDATE {DB}.c SET v = -v WHERE a = 'k3'",
            f"CREATE TABLE {DB}.n (id INT PRIMARY KEY, v INT)",
            f"INSERT INTO {DB}.n SELECT seq, seq FROM {DB}.seq_1_to_50",
            f"UPDATE {DB}.u SET v = v + 1000 WHERE id % 2 = 0",
        )
        while pipe.snapshots.get(run["id"])["state"] != "done":
            consumer.step(1000, 0.2)
        pipe.wait_sunk()
        consumer.drain()
    finally:
        pipe.stop()
    for table in ("c", "u", "n", "e"):
        assert consumer.tables[f"{DB}.{table}"] == table_rows(primary, DB, table), table
    # rows the ALTER reached before the snapshot read them carry the new column
    t_rows = consumer.tables[f"{DB}.t"]
    source = table_rows(primary, DB, "t")
    assert t_rows.keys() == source.keys()
    assert all(t_rows[k] == source[k] or "w" not in t_rows[k] for k in source)


def _next_term(
    primary: Any,
    destination: str,
    slave_id: int,
    meta: MemoryMetaManager,
    cursor: LogPosition | None,
    consumer: Applier,
    write_between: bool,
) -> SnapshotPipeline:
    """The destination's next term (the same meta and slave_id, as every node of it has),
    its reader resuming from the min cursor (the consumer's), started and handed to the
    consumer; ``write_between``: an UPDATE is committed between the terms."""
    if write_between:
        primary.execute(f"UPDATE {DB}.t SET v = v + 1 WHERE id % 10 = 0")
    pipe2 = SnapshotPipeline(primary, destination, slave_id, chunk_rows=50, meta=meta)
    pipe2.server.subscribe("c")
    assert cursor is not None
    pipe2.start(cursor)
    consumer.server = pipe2.server
    return pipe2


@pytest.mark.parametrize("write_between", [True, False], ids=["write", "no-write"])
def test_a_new_term_resumes_from_the_marks_at_the_min_cursor(
    primary: Any, write_between: bool
) -> None:
    """no-write: nothing is committed between the terms, so the next term puts its chunks
    at the binlog position the first one put them at, where the client's cursor is: its
    entries must be numbered after the cursor's ordinal, or the client skips them."""
    meta = MemoryMetaManager("snap4")
    pipe = SnapshotPipeline(primary, "snap4", 7404, chunk_rows=50, meta=meta, buffer_size=30)
    pipe.start()
    consumer = Applier(pipe.server, "c", {f"{DB}.t": ("id",)})
    try:
        run = pipe.snapshots.create([f"{DB}\\.t"])
        wait_until(lambda: consumer.step(7, 0.2) >= 0 and consumer.reads >= 1000, "1000 rows",
                   WAIT_S)  # fmt: skip
        cursor = meta.cursor("c")
    finally:
        pipe.stop()  # the term ends mid-snapshot; the consumer acked part of it
    state = pipe.snapshots.get(run["id"])
    assert state["state"] == "running" and state["rows"] < KEYS
    pipe2 = _next_term(primary, "snap4", 7404, meta, cursor, consumer, write_between)
    try:
        resumed = pipe2.snapshots.get(run["id"])
        assert 0 < resumed["rows"] <= consumer.reads
        wait_until(lambda: consumer.step(1000, 0.2) >= 0 and _state(pipe2, run) == "done",
                   "the snapshot ends in the next term", WAIT_S)  # fmt: skip
        pipe2.wait_sunk()
        consumer.drain()
    finally:
        pipe2.stop()
    got, want = consumer.tables[f"{DB}.t"], table_rows(primary, DB, "t")
    assert got == want, _diff(got, want)


@pytest.mark.parametrize("write_between", [True, False], ids=["write", "no-write"])
def test_a_new_term_puts_again_the_chunks_of_a_done_snapshot_clients_have_not_acked(
    primary: Any, write_between: bool
) -> None:
    """The snapshot ends (done, in the meta) while the client has acked only its first
    chunks; then the term ends. The next term's reader resumes at the client's cursor,
    before the last chunks: they must be put again, or the client never gets those rows."""
    meta = MemoryMetaManager("snap8")
    pipe = SnapshotPipeline(primary, "snap8", 7410, chunk_rows=50, meta=meta).start()
    consumer = Applier(pipe.server, "c", {f"{DB}.t": ("id",)})
    try:
        run = pipe.snapshots.create([f"{DB}\\.t"])
        wait_until(lambda: consumer.step(7, 0.2) >= 0 and consumer.reads >= 1000, "1000 rows",
                   WAIT_S)  # fmt: skip
        done = pipe.wait_done(run["id"])  # the consumer acks nothing more
        cursor = meta.cursor("c")
    finally:
        pipe.stop()
    assert done["state"] == "done" and done["rows"] == KEYS and consumer.reads < KEYS
    pipe2 = _next_term(primary, "snap8", 7410, meta, cursor, consumer, write_between)
    try:
        wait_until(lambda: consumer.step(1000, 0.2) >= 0 and _state(pipe2, run) == "done",
                   "the snapshot ends again in the next term", WAIT_S)  # fmt: skip
        pipe2.wait_sunk()
        consumer.drain()
    finally:
        pipe2.stop()
    got, want = consumer.tables[f"{DB}.t"], table_rows(primary, DB, "t")
    assert got == want, _diff(got, want)


def test_a_chunk_is_not_put_inside_a_transaction_read_in_pieces(
    primary: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader puts a transaction in pieces (transaction_size 2) and has put the first
    one when a chunk whose position it passed is ready: the chunk goes after the
    transaction's END, not between its pieces (nested BEGINs, positions going back)."""
    primary.execute(f"CREATE TABLE {DB}.big (id INT PRIMARY KEY)")
    pipe = SnapshotPipeline(primary, "snap7", 7409, chunk_rows=KEYS * 2, transaction_size=2)
    cond = pipe.sink.cond = WatchedCondition()
    first_piece = threading.Event()
    real_sink, real_read = pipe.sink.sink, ChunkReader.read

    def chunk_put() -> bool:
        return any(e.entry.header.event_type is EventType.READ for e in pipe.store.get(None, 10**6))

    def sink(entries: Sequence[Entry], identity: LogIdentity) -> None:
        real_sink(entries, identity)
        if entries[0].type is EntryType.TRANSACTIONBEGIN and not first_piece.is_set():
            assert entries[-1].type is not EntryType.TRANSACTIONEND
            cond.runner_waits.clear()
            first_piece.set()  # hold the rest until the runner waits or has put its chunk
            wait_until(lambda: cond.runner_waits.is_set() or chunk_put(),
                       "the snapshot runner waits or puts its chunk", WAIT_S)  # fmt: skip

    def read_then_write(self: ChunkReader, shape: Any, after: Any, limit: int) -> Any:
        chunk = real_read(self, shape, after, limit)
        if not first_piece.is_set():  # the first chunk: a large transaction after its P
            primary.execute(f"INSERT INTO {DB}.big SELECT seq FROM {DB}.seq_1_to_5000")
            wait_until(first_piece.is_set, "the reader put the transaction's first piece",
                       WAIT_S)  # fmt: skip
        return chunk

    monkeypatch.setattr(pipe.sink, "sink", sink)
    monkeypatch.setattr(ChunkReader, "read", read_then_write)
    pipe.start()
    try:
        consumer = Applier(pipe.server, "c", {f"{DB}.t": ("id",), f"{DB}.big": ("id",)})
        run = pipe.snapshots.create([f"{DB}\\.t"])
        pipe.wait_done(run["id"])
        pipe.wait_sunk()
        consumer.drain()
    finally:
        pipe.stop()
    positions = [e.position().sort_key for e in consumer.entries]
    assert positions == sorted(positions)
    depth = 0
    for e in consumer.entries:
        depth += {EntryType.TRANSACTIONBEGIN: 1, EntryType.TRANSACTIONEND: -1}.get(e.type, 0)
        assert depth in (0, 1), "a BEGIN inside a transaction"
    assert consumer.tables[f"{DB}.t"] == table_rows(primary, DB, "t")
    assert len(consumer.tables[f"{DB}.big"]) == 5000


def test_changes_between_a_chunk_and_its_emission_win(
    primary: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows changed after the chunk's position P but put by the reader before the chunk
    is emitted are dropped from it: the change (a full row image) is the newer state."""
    pipe = SnapshotPipeline(primary, "snap5", 7406, chunk_rows=KEYS * 2).start()
    real_read = ChunkReader.read
    calls: list[int] = []

    def read_then_write(self: ChunkReader, shape: Any, after: Any, limit: int) -> Any:
        chunk = real_read(self, shape, after, limit)
        if not calls:  # the first chunk: change some of its keys, let the reader pass them
            calls.append(len(chunk))
            primary.execute(
                f"UPDATE {DB}.t SET v = -1, s = 'changed' WHERE id IN (5, 500, 2999)",
                f"DELETE FROM {DB}.t WHERE id IN (6, 600)",
                f"INSERT INTO {DB}.t VALUES ({KEYS + 1}, 1, 'new')",
            )
            pipe.wait_sunk()
        return chunk

    monkeypatch.setattr(ChunkReader, "read", read_then_write)
    try:
        consumer = Applier(pipe.server, "c", {f"{DB}.t": ("id",)})
        run = pipe.snapshots.create([f"{DB}\\.t"])
        pipe.wait_done(run["id"])
        pipe.wait_sunk()
        consumer.drain()
    finally:
        pipe.stop()
    assert calls == [KEYS]
    got = consumer.tables[f"{DB}.t"]
    assert got == table_rows(primary, DB, "t"), _diff(got, table_rows(primary, DB, "t"))
    assert got[(5,)]["s"] == "changed" and (6,) not in got and (KEYS + 1,) in got
    assert consumer.reads == KEYS - 5  # 5, 500, 2999, 6 and 600 came from the binlog only


def test_mode_initial_snapshots_a_new_destination_once(primary: Any) -> None:
    section = SnapshotSection(tables=[f"{DB}\\.t"], mode="initial", chunk_rows=1000)
    meta = MemoryMetaManager("snap6")
    pipe = SnapshotPipeline(primary, "snap6", 7407, meta=meta, section=section)
    consumer = Applier(pipe.server, "c", {f"{DB}.t": ("id",)})
    pipe.start(initial=True)
    try:
        wait_until(lambda: bool(pipe.snapshots.runs()), "the initial snapshot", WAIT_S)
        done = pipe.wait_done("initial")
        pipe.wait_sunk()
        consumer.drain()
    finally:
        pipe.stop()
    assert done["state"] == "done" and done["rows"] == KEYS
    assert consumer.tables[f"{DB}.t"] == table_rows(primary, DB, "t")
    # a later term of the same destination (it has history now) does not snapshot again
    pipe2 = SnapshotPipeline(primary, "snap6", 7408, meta=meta, section=section)
    pipe2.start(initial=False)
    try:
        assert [r["id"] for r in pipe2.snapshots.runs()] == ["initial"]
    finally:
        pipe2.stop()
