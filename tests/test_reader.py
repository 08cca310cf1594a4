"""BinlogReader: entry sequences, resume by file/offset and GTID, reconnect, splitting,
heartbeat switch to the standby."""

from __future__ import annotations

import gc
import itertools
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pymysqlreplication.column import Column as LibColumn
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import MariadbGtidEvent, XidEvent
from pymysqlreplication.row_event import WriteRowsEvent
from reader_fixtures import collect_leaked_sockets

from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_protocol.entry import Entry, EntryType, EventType
from canal_protocol.positions import EntryPosition
from canal_server.parse.reader import BinlogReader, DetectingConfig, ReaderConfig, RunResult
from canal_server.parse.transaction import NO_SKIP, Skip, TransactionAssembler, classify_ddl

FAST_RETRY = RetryPolicy(initial_s=0.05, multiplier=2.0, max_delay_s=0.5)


@dataclass
class Running:
    """A reader running in a thread, collecting what it sinks."""

    reader: BinlogReader
    thread: threading.Thread
    pieces: list[list[Entry]] = field(default_factory=list)
    result: list[Any] = field(default_factory=list)

    @property
    def entries(self) -> list[Entry]:
        return [e for p in list(self.pieces) for e in p]

    def wait_for(self, pred: Callable[[list[Entry]], bool], what: str) -> list[Entry]:
        wait_until(lambda: pred(self.entries), what, 60)
        return self.entries

    def stop(self) -> None:
        self.reader.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "reader did not stop"


def start_reader(config: ReaderConfig, start: EntryPosition, **kw: Any) -> Running:
    pieces: list[list[Entry]] = []
    reader = BinlogReader(config, lambda es: pieces.append(list(es)), **kw)
    return run_again(Running(reader, threading.Thread(target=lambda: None), pieces), start)


def run_again(running: Running, start: EntryPosition) -> Running:
    """(Re)run the same reader from ``start`` in a new thread."""
    reader = running.reader
    running.result.clear()

    def run() -> None:
        try:
            running.result.append(reader.run(start))
        except BaseException as exc:
            running.result.append(exc)

    running.thread = threading.Thread(target=run, daemon=True)
    running.thread.start()
    return running


def here(box: Sandbox) -> EntryPosition:
    journal, offset = box.primary.master_status()
    return EntryPosition(journal=journal, offset=offset)


def config(box: Sandbox, slave_id: int, **kw: Any) -> ReaderConfig:
    return ReaderConfig(master=box.primary.dsn(), slave_id=slave_id, retry=FAST_RETRY, **kw)


def ends(entries: Sequence[Entry]) -> int:
    return sum(e.type == EntryType.TRANSACTIONEND or e.is_ddl for e in entries)


def nrows(entries: Sequence[Entry]) -> int:
    return sum(len(e.rows) for e in entries)


def summary(entries: Sequence[Entry]) -> list[tuple[str, str, str]]:
    return [(e.type.value, e.header.event_type.value, e.header.table) for e in entries]


def after_values(e: Entry) -> list[dict[str, Any]]:
    return [{c.name: c.value for c in r.after} for r in e.rows]


WORKLOAD = (
    "CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20))",
    "INSERT INTO {db}.t VALUES (1, 'a'), (2, 'b')",
    "UPDATE {db}.t SET v = 'c' WHERE id = 1",
    "DELETE FROM {db}.t WHERE id = 2",
    "ALTER TABLE {db}.t ADD COLUMN w INT",
    "TRUNCATE TABLE {db}.t",
    "DROP TABLE {db}.t",
)


def test_transactions_give_the_exact_entry_sequence(db: Sandbox) -> None:
    name = "t_reader_seq"
    db.primary.execute(f"CREATE DATABASE IF NOT EXISTS {name}", f"DROP TABLE IF EXISTS {name}.t")
    start = here(db)
    db.primary.execute(*(s.format(db=name) for s in WORKLOAD[:4]))
    db.primary.execute(
        "BEGIN",
        f"INSERT INTO {name}.t VALUES (3, 'x')",
        f"UPDATE {name}.t SET v = 'y' WHERE id = 3",
        "COMMIT",
    )
    db.primary.execute(*(s.format(db=name) for s in WORKLOAD[4:]))
    run = start_reader(config(db, 6101), start)
    try:
        entries = run.wait_for(lambda es: ends(es) >= 8, "8 transactions")
    finally:
        run.stop()
    B, R, E = "TRANSACTIONBEGIN", "ROWDATA", "TRANSACTIONEND"
    assert summary(entries) == [
        (R, "CREATE", "t"),
        (B, "GTID", ""), (R, "INSERT", "t"), (E, "QUERY", ""),
        (B, "GTID", ""), (R, "UPDATE", "t"), (E, "QUERY", ""),
        (B, "GTID", ""), (R, "DELETE", "t"), (E, "QUERY", ""),
        (B, "GTID", ""), (R, "INSERT", "t"), (R, "UPDATE", "t"), (E, "QUERY", ""),
        (R, "ALTER", "t"), (R, "TRUNCATE", "t"), (R, "ERASE", "t"),
    ]  # fmt: skip
    assert after_values(entries[2]) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    upd = entries[5].rows[0]
    assert [(c.name, c.value, c.updated) for c in upd.after] == [("id", 1, False), ("v", "c", True)]
    assert [c.value for c in upd.before] == [1, "a"]
    assert [c.value for c in entries[8].rows[0].before] == [2, "b"]
    assert entries[0].is_ddl and entries[0].sql.startswith("CREATE TABLE")
    assert all(e.header.schema == name for e in entries if e.type == EntryType.ROWDATA)
    # Headers: offsets tile, GTIDs of the transaction, state includes it.
    for a, b in itertools.pairwise(entries):
        assert a.header.end_offset <= b.header.offset
        if b.type == EntryType.TRANSACTIONBEGIN:  # a transaction starts where one ended
            assert a.header.end_offset == b.header.offset
    gtids = [e.header.gtid for e in entries]
    assert all(g.startswith("0-1-") for g in gtids)
    last = ""  # the state to resume from: including the transaction at its END or DDL,
    for e in entries:  # the state before it inside it (one domain: the previous GTID)
        if e.type == EntryType.TRANSACTIONEND or e.is_ddl:
            assert e.gtid_state == e.header.gtid
            last = e.gtid_state
        else:
            assert last and e.gtid_state == last, e
    assert len(set(gtids)) == 8
    assert all(e.header.server_id == db.primary.server_id for e in entries)
    assert all(e.header.timestamp_ms > 1_600_000_000_000 for e in entries)
    assert all(e.header.logfile == start.journal for e in entries)
    assert entries[0].header.offset == start.offset + 42  # after the DDL's 42-byte GTID event
    assert entries[1].header.offset == entries[0].header.end_offset


def _key(e: Entry) -> tuple[str, str, int]:
    return (e.header.gtid, e.type.value, e.header.offset)


def _workload(box: Sandbox, name: str, n: int, first: int = 0) -> None:
    box.primary.execute(
        f"CREATE DATABASE IF NOT EXISTS {name}",
        f"CREATE TABLE IF NOT EXISTS {name}.t (id INT PRIMARY KEY, v INT)",
        *(f"INSERT INTO {name}.t VALUES ({i}, {i})" for i in range(first, first + n)),
    )


def _resume_case(box: Sandbox, name: str, gtid_mode: bool, slave_id: int) -> None:
    box.primary.execute(f"DROP DATABASE IF EXISTS {name}")
    start = here(box)
    _workload(box, name, 6)
    run = start_reader(config(box, slave_id, gtid_mode=gtid_mode), start)
    try:
        full = run.wait_for(lambda es: ends(es) >= 8, "8 transactions")
    finally:
        run.stop()
    cut = [i for i, e in enumerate(full) if e.type == EntryType.TRANSACTIONEND][2]
    pos = full[cut].position()
    if gtid_mode:
        pos = EntryPosition(gtid=pos.gtid)  # GTID only: no file, no offset
    assert pos.gtid == full[cut].header.gtid
    again = start_reader(config(box, slave_id, gtid_mode=gtid_mode), pos)
    try:
        rest = again.wait_for(lambda es: len(es) >= len(full) - cut - 1, "the rest")
    finally:
        again.stop()
    assert [_key(e) for e in rest] == [_key(e) for e in full[cut + 1 :]]
    assert [e.rows for e in rest] == [e.rows for e in full[cut + 1 :]]


def test_resume_by_file_offset_from_a_transaction_end(db: Sandbox) -> None:
    _resume_case(db, "t_reader_resume_file", gtid_mode=False, slave_id=6102)


def test_resume_by_gtid(db: Sandbox) -> None:
    _resume_case(db, "t_reader_resume_gtid", gtid_mode=True, slave_id=6103)


def test_resume_by_gtid_from_inside_a_transaction_reads_it_again_on_the_replica(
    db: Sandbox,
) -> None:
    """A cursor inside a transaction (batches are cut by entry count), read on the
    primary; a resume by its GTID state alone on the replica (another database, other
    offsets) reads that transaction again from its BEGIN instead of skipping it."""
    name = "t_reader_resume_inside"
    db.primary.execute(
        f"DROP DATABASE IF EXISTS {name}",
        f"CREATE DATABASE {name}",
        f"CREATE TABLE {name}.t (id INT PRIMARY KEY)",
    )
    start = here(db)
    db.primary.execute(
        "BEGIN",
        *(f"INSERT INTO {name}.t VALUES ({i})" for i in range(1, 4)),
        "COMMIT",
        f"INSERT INTO {name}.t VALUES (4)",
    )
    run = start_reader(config(db, 6108, gtid_mode=True), start)
    try:
        full = run.wait_for(lambda es: ends(es) >= 2, "2 transactions")
    finally:
        run.stop()
    assert summary(full)[:5] == [
        ("TRANSACTIONBEGIN", "GTID", ""), ("ROWDATA", "INSERT", "t"),
        ("ROWDATA", "INSERT", "t"), ("ROWDATA", "INSERT", "t"), ("TRANSACTIONEND", "QUERY", ""),
    ]  # fmt: skip
    cursor = full[2].position()  # after the second row: inside the transaction
    db.replica.wait_caught_up(db.primary)
    standby = ReaderConfig(master=db.replica.dsn(), slave_id=6108, retry=FAST_RETRY, gtid_mode=True)
    again = start_reader(standby, EntryPosition(gtid=cursor.gtid))
    try:
        last = full[-1].header.gtid  # the END of the next transaction
        rest = again.wait_for(lambda es: any(e.header.gtid == last for e in es), last)
    finally:
        again.stop()
    assert [_key(e)[:2] for e in rest] == [_key(e)[:2] for e in full]  # (GTID, type)
    assert [e.rows for e in rest] == [e.rows for e in full]


def _kill_dump(box: Sandbox, reader: BinlogReader) -> int:
    wait_until(lambda: reader.dump_thread_id is not None, "dump connection", 60)
    tid = reader.dump_thread_id
    assert tid is not None
    rows = box.primary.execute("SHOW PROCESSLIST")
    assert any(int(r[0]) == tid and r[4] == "Binlog Dump" for r in rows)
    box.primary.execute(f"KILL {tid}")
    return tid


def test_reconnect_after_kill_has_no_loss_or_duplicates(db: Sandbox) -> None:
    name = "t_reader_kill"
    db.primary.execute(f"DROP DATABASE IF EXISTS {name}")
    _workload(db, name, 0)
    run = start_reader(config(db, 6104), here(db))
    try:
        for round_ in range(3):
            _workload(db, name, 20, first=round_ * 20)
            n = 20 * (round_ + 1)
            run.wait_for(lambda es, n=n: nrows(es) >= n, f"{n} rows")  # type: ignore[misc]
            killed = _kill_dump(db, run.reader)
            wait_until(
                lambda k=killed: run.reader.dump_thread_id not in (None, k),  # type: ignore[misc]
                "reconnected",
                60,
            )
        _workload(db, name, 20, first=60)
        entries = run.wait_for(lambda es: nrows(es) >= 80, "80 rows")
    finally:
        run.stop()
    ids = [r.after[0].value for e in entries for r in e.rows]
    assert ids == list(range(80))
    assert len({e.header.gtid for e in entries if not e.is_ddl}) == 80
    assert sum(e.type == EntryType.TRANSACTIONEND for e in entries) == 80
    assert run.reader.dump_error_count == 0
    assert run.result == [RunResult.STOPPED]


def test_transaction_size_splits_big_transactions(db: Sandbox) -> None:
    name = "t_reader_split"
    db.primary.execute(f"DROP DATABASE IF EXISTS {name}")
    _workload(db, name, 0)
    start = here(db)
    db.primary.execute(
        "BEGIN", *(f"INSERT INTO {name}.t VALUES ({i}, 0)" for i in range(10)), "COMMIT"
    )
    db.primary.execute(f"INSERT INTO {name}.t VALUES (100, 0)")
    run = start_reader(config(db, 6105, transaction_size=4), start)
    try:
        entries = run.wait_for(lambda es: nrows(es) >= 11, "2 transactions")
    finally:
        run.stop()
    sizes = [len(p) for p in run.pieces]
    assert sizes == [4, 4, 4, 3]  # BEGIN + 10 rows + END in pieces of 4; then 3
    assert [e.type for e in entries[:12]] == (
        [EntryType.TRANSACTIONBEGIN] + [EntryType.ROWDATA] * 10 + [EntryType.TRANSACTIONEND]
    )


# -- the assembler with fake events (skip after reconnect) ------------------------------


def _fake(cls: type, start: int, end: int, **attrs: Any) -> Any:
    ev: Any = object.__new__(cls)
    ev.packet = SimpleNamespace(log_pos=end, event_size=end - start, server_id=1)
    ev.timestamp = 1_700_000_000
    for k, v in attrs.items():
        setattr(ev, k, v)
    return ev


def _fake_tx(seq: int, at: int, rows: int) -> list[Any]:
    cols = [
        LibColumn(
            type=FIELD_TYPE.LONG, name="id", unsigned=False, is_primary=True,
            collation_name=None, enum_values=None, set_values=None,
        )
    ]  # fmt: skip
    evs = [_fake(MariadbGtidEvent, at, at + 10, gtid=f"0-1-{seq}", domain_id=0, flags=0)]
    for i in range(rows):
        ev = _fake(WriteRowsEvent, at + 10 + i * 10, at + 20 + i * 10, schema="s", table="t")
        ev.table_id, ev.columns = 1, cols
        ev._RowsEvent__rows = [{"values": {"id": seq * 100 + i}, "none_sources": {}}]
        evs.append(ev)
    evs.append(_fake(XidEvent, at + 10 + rows * 10, at + 20 + rows * 10, xid=seq))
    return evs


def test_assembler_skips_what_was_delivered_before_a_reconnect() -> None:
    got: list[list[Entry]] = []
    start = EntryPosition(journal="f.000001", offset=100)
    tx1, tx2 = _fake_tx(1, 100, 2), _fake_tx(2, 140, 6)
    asm = TransactionAssembler(lambda es: got.append(list(es)), start, "0-1-0", 3)
    for ev in tx1 + tx2[:5]:  # tx2 cut after 4 rows: BEGIN + 2 rows delivered
        asm.on_event(ev)
    assert [len(p) for p in got] == [3, 1, 3]
    assert asm.committed.offset == tx1[-1].packet.log_pos
    assert asm.committed.gtid == "0-1-1"
    skip = asm.resume_skip
    assert skip == Skip("0-1-2", 3, by_gtid=True)
    # Resume from the committed position: tx2 again, from its start.
    again = TransactionAssembler(lambda es: got.append(list(es)), asm.committed, "0-1-1", 3, skip)
    for ev in tx2:
        again.on_event(ev)
    tx2_entries = [e for p in got[2:] for e in p]
    assert [e.type for e in tx2_entries] == (
        [EntryType.TRANSACTIONBEGIN] + [EntryType.ROWDATA] * 6 + [EntryType.TRANSACTIONEND]
    )
    assert [r.after[0].value for e in tx2_entries for r in e.rows] == [200 + i for i in range(6)]
    assert again.resume_skip == NO_SKIP


def test_a_second_loss_while_reading_a_transaction_again_keeps_its_skip() -> None:
    """The connection drops after a transaction's BEGIN and 5 rows were put, then again
    while the resume still skips them: the third dump skips all 6 again, not the 2 the
    second one had read (nothing is stored twice)."""
    got: list[Entry] = []
    start = EntryPosition(journal="f.000001", offset=100)
    tx1, tx2 = _fake_tx(1, 100, 2), _fake_tx(2, 140, 6)
    first = TransactionAssembler(got.extend, start, "0-1-0", 3)
    for ev in tx1 + tx2[:7]:  # BEGIN + 5 rows of tx2 put (two pieces of 3)
        first.on_event(ev)
    assert first.resume_skip == Skip("0-1-2", 6, by_gtid=True)
    second = TransactionAssembler(got.extend, first.committed, "0-1-1", 3, first.resume_skip)
    for ev in tx2[:2]:  # lost again while skipping
        second.on_event(ev)
    assert second.resume_skip == Skip("0-1-2", 6, by_gtid=True)
    third = TransactionAssembler(got.extend, second.committed, "0-1-1", 3, second.resume_skip)
    for ev in tx2:
        third.on_event(ev)
    tx2_entries = got[4:]
    assert [e.type for e in tx2_entries] == (
        [EntryType.TRANSACTIONBEGIN] + [EntryType.ROWDATA] * 6 + [EntryType.TRANSACTIONEND]
    )
    assert [r.after[0].value for e in tx2_entries for r in e.rows] == [200 + i for i in range(6)]


def test_a_transaction_shorter_than_its_skip_still_ends() -> None:
    """Another database has the same transaction (same GTID) in fewer rows events than
    the entries already put: its END still reaches the sink, so the next BEGIN does not
    land inside it."""
    got: list[Entry] = []
    start = EntryPosition(journal="f.000001", offset=100)
    on_a = TransactionAssembler(got.extend, start, "0-1-1", 3)
    for ev in _fake_tx(2, 140, 6)[:7]:  # BEGIN + 5 rows put, in two pieces
        on_a.on_event(ev)
    on_b = TransactionAssembler(got.extend, start, "0-1-1", 3, on_a.resume_skip)
    for ev in _fake_tx(2, 400, 3) + _fake_tx(3, 500, 1):  # the same GTID, 3 rows events
        on_b.on_event(ev)
    assert [e.type for e in got] == [EntryType.TRANSACTIONBEGIN] + [EntryType.ROWDATA] * 5 + [
        EntryType.TRANSACTIONEND, EntryType.TRANSACTIONBEGIN, EntryType.ROWDATA,
        EntryType.TRANSACTIONEND,
    ]  # fmt: skip


def test_classify_ddl() -> None:
    cases = {
        "CREATE TABLE a (x int)": (EventType.CREATE, "d", "a"),
        "create table if not exists `s`.`b` (x int)": (EventType.CREATE, "s", "b"),
        "ALTER TABLE s.c ADD COLUMN y INT": (EventType.ALTER, "s", "c"),
        "DROP TABLE IF EXISTS `e` /* generated by server */": (EventType.ERASE, "d", "e"),
        "TRUNCATE TABLE f": (EventType.TRUNCATE, "d", "f"),
        "RENAME TABLE g TO h": (EventType.RENAME, "d", "g"),
        "CREATE UNIQUE INDEX i ON s.j (x)": (EventType.CINDEX, "s", "j"),
        "DROP INDEX i ON k": (EventType.DINDEX, "d", "k"),
        "CREATE DATABASE z": (EventType.QUERY, "d", ""),
    }
    for sql, want in cases.items():
        assert classify_ddl(sql, "d") == want, sql


# -- heartbeat detection: switch to the standby ---------------------------------------------


def test_heartbeat_switches_to_the_standby(make_sandbox: Any) -> None:
    box = make_sandbox(standby=True)
    name = "t_reader_switch"
    _workload(box, name, 0)
    switched: list[str] = []
    cfg = ReaderConfig(
        master=box.primary.dsn(),
        standby=box.replica.dsn(),
        slave_id=6106,
        gtid_mode=True,
        heartbeat_s=1.0,
        retry=FAST_RETRY,
        detecting=DetectingConfig(enable=True, interval_s=0.2, retry_threshold=3, timeout_s=1.0),
    )
    run = start_reader(cfg, here(box), on_switch=switched.append)
    try:
        _workload(box, name, 5)
        run.wait_for(lambda es: nrows(es) >= 5, "5 rows")
        box.replica.wait_caught_up(box.primary)
        box.primary.kill()
        wait_until(lambda: bool(run.result), "reader returned after the switch", 60)
    except BaseException:
        run.stop()
        raise
    standby_address = f"127.0.0.1:{box.replica.port}"
    assert run.result == [RunResult.SWITCHED]
    assert switched == [standby_address]
    assert run.reader.identity.source_address == standby_address
    # The caller finds the position on the new source (here: our GTID state) and goes on.
    last = run.reader.last_position
    assert last is not None and last.gtid
    box.replica.promote()
    before = len(run.entries)
    run_again(run, EntryPosition(gtid=last.gtid))
    try:
        box.replica.execute(*(f"INSERT INTO {name}.t VALUES ({i}, {i})" for i in range(5, 8)))
        entries = run.wait_for(lambda es: nrows(es[before:]) >= 3, "3 rows on the standby")
    finally:
        run.stop()
    new = entries[before:]
    assert [r.after[0].value for e in new for r in e.rows] == [5, 6, 7]
    assert all(e.header.server_id == box.replica.server_id for e in new)
    assert run.result == [RunResult.STOPPED]
    box.stop()
    with warnings.catch_warnings():  # sockets the sandbox start leaked (see reader_fixtures)
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_another_database_at_the_same_address_ends_a_file_offset_resume(
    make_sandbox: Any,
) -> None:
    """A moved VIP: the replica answers at the primary's address. Resuming there by the
    primary's file and offset would read the replica's binlog from a point that means
    nothing on it (here the file name exists there too, so the server does not refuse):
    the run ends SWITCHED before anything is read, so the finder chooses the start."""
    box = make_sandbox(standby=True)
    primary, replica = box.primary, box.replica
    primary.execute("FLUSH BINARY LOGS")  # not replicated: the primary's file .000002
    replica.wait_caught_up(primary)
    cfg = ReaderConfig(master=primary.dsn(), slave_id=6109, retry=FAST_RETRY, heartbeat_s=1.0)
    run = start_reader(cfg, EntryPosition(here(box).journal, 4))  # valid on both servers
    try:
        wait_until(lambda: run.reader.identity.source_server_id != 0, "first dump", 60)
        assert run.reader.identity.source_server_id == primary.server_id
        primary.kill()
        replica.promote()
        replica.stop()
        moved = MariaDBServer("moved", replica.root, replica.server_id, primary.port)
        moved.start()  # a restart begins its binlog .000002: the reader's file exists
        box.add_process(moved.process)
        assert run.reader.last_position is not None
        assert run.reader.last_position.journal in moved.binlog_files()
        moved.execute("CREATE DATABASE t_reader_vip")
        wait_until(lambda: bool(run.result), "reader returned", 60)
    finally:
        run.stop()
    assert run.result == [RunResult.SWITCHED]
    assert run.entries == []  # nothing read from the moved address before the switch
    assert run.reader.identity.source_server_id == replica.server_id
    box.stop()
    collect_leaked_sockets()


def test_a_blocking_sink_holds_the_reader_back_without_loss(db: Sandbox) -> None:
    name = "t_reader_backpressure"
    db.primary.execute(f"DROP DATABASE IF EXISTS {name}")
    _workload(db, name, 0)
    start = here(db)
    release = threading.Event()
    calls: list[list[Entry]] = []

    def sink(entries: Sequence[Entry]) -> None:
        calls.append(list(entries))
        release.wait(60)  # a full store: put blocks

    reader = BinlogReader(config(db, 6107), sink)
    thread = threading.Thread(target=reader.run, args=(start,), daemon=True)
    thread.start()
    try:
        _workload(db, name, 30)
        wait_until(lambda: len(calls) == 1, "first put", 60)
        # More transactions are committed meanwhile; the reader waits in the sink.
        assert len(calls) == 1
        release.set()
        wait_until(lambda: nrows([e for c in list(calls) for e in c]) >= 30, "all rows", 60)
    finally:
        release.set()
        reader.stop()
        thread.join(30)
    assert not thread.is_alive()
    ids = [r.after[0].value for c in calls for e in c for r in e.rows]
    assert ids == list(range(30))
