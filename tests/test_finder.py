"""PositionFinder against real MariaDB: one named test per branch of findStartPosition.

A module fixture writes three batches of rows A, B, C on the session primary, each in
its own binlog file and in its own second(s), plus one multi-statement transaction.
Expected positions are checked through the GTID state at the found position
(``BINLOG_GTID_POS``): "after batch B" means the state's sequence number is B's last.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest
from pymysqlreplication.event import MariadbGtidEvent, RotateEvent
from pymysqlreplication.row_event import WriteRowsEvent

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_protocol.errors import PositionNotFound, PurgedPosition
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition, journal_seq
from canal_server.parse import binlog_stream
from canal_server.parse.binlog_search import BinlogEvent, StreamEventSource, locate_gtid_state
from canal_server.parse.finder import (
    ConfiguredPosition,
    DatabaseLink,
    FinderConfig,
    FindReason,
    FoundPosition,
    PositionFinder,
)
from canal_server.parse.logposition import MemoryLogPositionManager

SandboxFactory = Callable[..., Sandbox]
DEST = "finder"
SLAVE_ID = 6201
R = FindReason


# -- helpers --------------------------------------------------------------------------


def _address(server: MariaDBServer) -> str:
    return f"127.0.0.1:{server.port}"


def _seq(state: str) -> int:
    """Sequence number of domain 0 in a GTID state ("0-1-42,1-2-7" → 42; "" → 0)."""
    for part in filter(None, state.split(",")):
        domain, _server, seq = part.strip().split("-")
        if domain == "0":
            return int(seq)
    return 0


def _clock(server: MariaDBServer) -> int:
    return int(server.scalar("SELECT UNIX_TIMESTAMP()"))


def _next_second(server: MariaDBServer, after: int) -> None:
    wait_until(lambda: _clock(server) > after, "database clock in the next second", 10.0)


def _insert(server: MariaDBServer, db: str, ids: range) -> tuple[int, ...]:
    """One autocommit INSERT per id (ts column = the event's timestamp); GTID seqs."""
    seqs = []
    for i in ids:
        gtid = server.execute(
            f"INSERT INTO {db}.t VALUES ({i}, UNIX_TIMESTAMP())", "SELECT @@last_gtid"
        )[0][0]
        seqs.append(_seq(str(gtid)))
    return tuple(seqs)


def _txn_span(server: MariaDBServer, journal: str, seq: int) -> tuple[int, int, list[int]]:
    """(start of its GTID event, end of its last event, starts of its events)."""
    rows = server.execute(f"SHOW BINLOG EVENTS IN '{journal}'")
    for i, row in enumerate(rows):
        if str(row[5]).endswith(f"GTID 0-{server.server_id}-{seq}"):
            starts = [int(row[1])]
            for ev in rows[i + 1 :]:
                starts.append(int(ev[1]))
                if ev[2] in ("Xid", "Query"):
                    return int(row[1]), int(ev[4]), starts
    raise AssertionError(f"transaction {seq} not in {journal}")


def _finder(history: LogPosition | None = None, **config: object) -> PositionFinder:
    positions = MemoryLogPositionManager()
    if history is not None:
        positions.persist(DEST, history)
    return PositionFinder(FinderConfig(DEST, **config), positions)  # type: ignore[arg-type]


class CountingSource:
    """The real event source, recording how many events each read consumed."""

    def __init__(self, inner: StreamEventSource) -> None:
        self.inner = inner
        self.reads: list[tuple[str, int]] = []

    def read(self, journal: str, offset: int) -> Generator[BinlogEvent, None, None]:
        n = 0
        try:
            for ev in self.inner.read(journal, offset):
                n += 1
                yield ev
        finally:
            self.reads.append((journal, n))


def _link(server: MariaDBServer) -> DatabaseLink:
    return DatabaseLink.connect(server.dsn(), SLAVE_ID)


@contextmanager
def _quiet_sockets() -> Iterator[None]:
    """Starting a sandbox leaks unix sockets of its readiness probes (its own bug);
    their ResourceWarning, an error under ``filterwarnings = error``, would fail
    whichever test the garbage collector happens to run in. Start it in here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


@pytest.fixture(scope="module")
def box(request: pytest.FixtureRequest) -> Sandbox:
    """The session sandbox (started quietly if this module is the first to use it)."""
    with _quiet_sockets():
        sandbox: Sandbox = request.getfixturevalue("sandbox")
    return sandbox


def _private(make_sandbox: SandboxFactory, standby: bool = False) -> Sandbox:
    with _quiet_sockets():
        return make_sandbox(standby=standby)


# -- the timeline on the session primary ------------------------------------------------


@dataclass(frozen=True)
class Batch:
    journal: str
    seqs: tuple[int, ...]
    after_s: int  # the database clock just after the batch: ≥ every event time in it


@dataclass(frozen=True)
class Timeline:
    a: Batch
    b: Batch
    c: Batch
    txn_seq: int  # a BEGIN; INSERT; INSERT; COMMIT transaction in c's file


@pytest.fixture(scope="module")
def timeline(box: Sandbox) -> Timeline:
    p = box.primary
    p.execute(
        "CREATE DATABASE IF NOT EXISTS t_finder",
        "CREATE TABLE IF NOT EXISTS t_finder.t (id INT PRIMARY KEY, ts BIGINT)",
        "DELETE FROM t_finder.t",
    )
    for _ in range(4):  # enough files that a bisection reads fewer than all
        p.execute("FLUSH BINARY LOGS")
    batches = []
    after = _clock(p)
    for first in (1, 3, 5):
        _next_second(p, after)
        p.execute("FLUSH BINARY LOGS")  # the file is created after the previous batch's time
        seqs = _insert(p, "t_finder", range(first, first + 2))
        after = _clock(p)
        batches.append(Batch(p.master_status()[0], seqs, after))
    txn = p.execute(
        "BEGIN",
        "INSERT INTO t_finder.t VALUES (7, 0)",
        "INSERT INTO t_finder.t VALUES (8, 0)",
        "COMMIT",
        "SELECT @@last_gtid",
    )
    c = batches[2]
    batches[2] = Batch(c.journal, c.seqs, _clock(p))
    for _ in range(6):  # files after the batches: a linear search from the newest is slow
        p.execute("FLUSH BINARY LOGS")
    return Timeline(batches[0], batches[1], batches[2], _seq(str(txn[0][0])))


@pytest.fixture
def primary(box: Sandbox, timeline: Timeline) -> MariaDBServer:
    return box.primary


def _primary_config(primary: MariaDBServer, **kw: object) -> ConfiguredPosition:
    return ConfiguredPosition(address=_address(primary), **kw)  # type: ignore[arg-type]


def _assert_after(found: FoundPosition, journal: str, seq: int) -> None:
    assert found.position.journal == journal
    assert _seq(found.position.gtid) == seq


# -- branch 2: no history -------------------------------------------------------------------


def test_config_journal_and_offset_is_used(primary: MariaDBServer, timeline: Timeline) -> None:
    b = timeline.b
    _, end, _ = _txn_span(primary, b.journal, b.seqs[0])
    cfg = _primary_config(primary, journal=b.journal, offset=end)
    found = _finder(master=cfg).find(_link(primary))
    assert found.reasons == (R.CONFIG_POSITION,)
    assert (found.position.journal, found.position.offset) == (b.journal, end)
    assert _seq(found.position.gtid) == b.seqs[0]
    assert found.identity == LogIdentity(_address(primary), 0, primary.server_id)


def test_config_offset_inside_transaction_moves_to_its_begin(
    primary: MariaDBServer, timeline: Timeline
) -> None:
    journal = timeline.c.journal
    begin, _, starts = _txn_span(primary, journal, timeline.txn_seq)
    inside = starts[-3]  # an event after the first INSERT's rows, before the XID
    assert begin < inside
    cfg = _primary_config(primary, journal=journal, offset=inside)
    found = _finder(master=cfg).find(_link(primary))
    assert found.reasons == (R.CONFIG_POSITION, R.MOVED_TO_TRANSACTION_BEGIN)
    assert (found.position.journal, found.position.offset) == (journal, begin)
    assert _seq(found.position.gtid) == timeline.txn_seq - 1


def test_history_inside_transaction_moves_when_reader_asks(
    primary: MariaDBServer, timeline: Timeline
) -> None:
    journal = timeline.c.journal
    begin, _, starts = _txn_span(primary, journal, timeline.txn_seq)
    history = LogPosition(
        LogIdentity(_address(primary)), EntryPosition(journal, starts[-3], 1, "", 1)
    )
    finder = _finder(history)
    # Asked or not: a history position can be a client cursor, and batches are cut by
    # entry count, so it can lie inside a transaction.
    for found in (
        finder.find(_link(primary)),
        finder.find(_link(primary), need_transaction_begin=True),
    ):
        assert found.reasons == (R.HISTORY, R.MOVED_TO_TRANSACTION_BEGIN)
        assert found.position.offset == begin
        assert _seq(found.position.gtid) == timeline.txn_seq - 1
    # A history position at a transaction's end stays where it is.
    _, end, _ = _txn_span(primary, journal, timeline.txn_seq)
    at_end = LogPosition(history.identity, EntryPosition(journal, end, 1, "", 1))
    assert _finder(at_end).find(_link(primary)).reasons == (R.HISTORY,)


def test_config_journal_and_time_searches_that_file(
    primary: MariaDBServer, timeline: Timeline
) -> None:
    a, b = timeline.a, timeline.b
    cfg = _primary_config(primary, journal=b.journal, timestamp_ms=b.after_s * 1000)
    found = _finder(master=cfg).find(_link(primary))
    assert found.reasons == (R.CONFIG_FILE_TIME,)
    _assert_after(found, b.journal, b.seqs[-1])
    assert found.position.timestamp_ms <= b.after_s * 1000
    # A time before the file began: its start.
    cfg = _primary_config(primary, journal=b.journal, timestamp_ms=a.after_s * 1000)
    found = _finder(master=cfg).find(_link(primary))
    assert found.reasons == (R.CONFIG_FILE_START,)
    assert (found.position.journal, found.position.offset) == (b.journal, 4)
    assert _seq(found.position.gtid) == a.seqs[-1]


def test_config_time_only_bisects_files_and_scans_one(
    primary: MariaDBServer, timeline: Timeline
) -> None:
    files = primary.binlog_files()
    assert len(files) >= 14
    for batch in (timeline.a, timeline.b):
        link = _link(primary)
        counting = CountingSource(link.source)  # type: ignore[arg-type]
        link = DatabaseLink(link.address, link.inspector, counting)
        cfg = _primary_config(primary, timestamp_ms=batch.after_s * 1000)
        found = _finder(master=cfg).find(link)
        assert found.reasons == (R.TIME_SEARCH,)
        _assert_after(found, batch.journal, batch.seqs[-1])
        scanned = [journal for journal, n in counting.reads if n > 1]
        assert scanned == [batch.journal]
        # Bisected: about log2(files) first-event reads and one scan, not a read per file.
        assert len(counting.reads) <= len(files).bit_length() + 1


def test_nothing_configured_starts_at_the_end(primary: MariaDBServer, timeline: Timeline) -> None:
    end = primary.settled_master_status()  # not 45 bytes short of a late checkpoint
    state = str(primary.scalar("SELECT @@gtid_binlog_pos"))
    found = _finder().find(_link(primary))
    assert found.reasons == (R.END,)
    assert (found.position.journal, found.position.offset) == end
    assert found.position.gtid == state
    # A position configured for another address is not ours: the end too.
    cfg = ConfiguredPosition(address="127.0.0.1:1", journal=timeline.a.journal, offset=4)
    assert _finder(master=cfg).find(_link(primary)).reasons == (R.END,)


def test_standby_position_when_connected_to_the_standby(box: Sandbox, timeline: Timeline) -> None:
    replica = box.replica
    box.replica.wait_caught_up(box.primary)
    journal, offset = replica.master_status()
    master = _primary_config(box.primary, journal=timeline.a.journal, offset=4)
    standby = ConfiguredPosition(address=_address(replica), journal=journal, offset=offset)
    found = _finder(master=master, standby=standby).find(_link(replica))
    assert found.reasons == (R.CONFIG_POSITION,)
    assert (found.position.journal, found.position.offset) == (journal, offset)
    assert found.position.server_id == replica.server_id


def _row_time_ms(server: MariaDBServer, row_id: int) -> int:
    """The event time of the INSERT of ``row_id`` (its ts column is UNIX_TIMESTAMP())."""
    return int(server.scalar(f"SELECT ts FROM t_finder.t WHERE id = {row_id}")) * 1000


def test_every_found_position_carries_its_time(primary: MariaDBServer, timeline: Timeline) -> None:
    """Time fallback needs a timestamp on every start position (a destination's origin
    is one): the end gets the database clock, a file position the time of its event."""
    a, b = timeline.a, timeline.b
    before = _clock(primary) * 1000
    end = _finder().find(_link(primary))
    assert end.reason is R.END
    assert before <= end.position.timestamp_ms <= _clock(primary) * 1000
    # Configured journal + offset without a time: the time of the transaction there.
    _, after_3, _ = _txn_span(primary, b.journal, b.seqs[0])  # row 3's INSERT
    cfg = _primary_config(primary, journal=b.journal, offset=after_3)
    found = _finder(master=cfg).find(_link(primary))
    assert found.reason is R.CONFIG_POSITION
    assert found.position.timestamp_ms == _row_time_ms(primary, 3)
    # The start of a file: when the file began (after batch A, by batch B).
    cfg = _primary_config(primary, journal=b.journal, timestamp_ms=a.after_s * 1000)
    found = _finder(master=cfg).find(_link(primary))
    assert found.reason is R.CONFIG_FILE_START
    assert a.after_s * 1000 < found.position.timestamp_ms <= _row_time_ms(primary, 3)
    # History without a time (recorded before times were kept): its transaction's time.
    _, after_4, _ = _txn_span(primary, b.journal, b.seqs[1])
    old = EntryPosition(b.journal, after_4, primary.server_id)
    found = _finder(LogPosition(LogIdentity(_address(primary)), old)).find(_link(primary))
    assert found.reason is R.HISTORY
    assert found.position.timestamp_ms == _row_time_ms(primary, 4)


# -- branches 3 and 4: history -----------------------------------------------------------------


def _history_after_b(primary: MariaDBServer, timeline: Timeline, server_id: int) -> LogPosition:
    """The reader's last position: after batch B's last transaction, at C's time."""
    b = timeline.b
    _, end, _ = _txn_span(primary, b.journal, b.seqs[-1])
    ts = (b.after_s + 1) * 1000  # one second after B: a 1 s fallback lands after B
    return LogPosition(
        LogIdentity(_address(primary)), EntryPosition(b.journal, end, server_id, "", ts)
    )


def test_history_from_the_same_source_is_reused(primary: MariaDBServer, timeline: Timeline) -> None:
    history = _history_after_b(primary, timeline, primary.server_id)
    finder = _finder(history, master=_primary_config(primary, journal=timeline.a.journal, offset=4))
    found = finder.find(_link(primary), dump_errors=5)  # same server id: no fallback
    assert found.reasons == (R.HISTORY,)
    assert found.position == EntryPosition(
        history.position.journal,
        history.position.offset,
        history.position.server_id,
        found.position.gtid,
        history.position.timestamp_ms,
    )
    assert _seq(found.position.gtid) == timeline.b.seqs[-1]


def test_dump_errors_and_changed_server_id_fall_back_by_time(
    primary: MariaDBServer, timeline: Timeline
) -> None:
    """A VIP switch: same address, another server behind it. History is after batch A
    (in B's file); ``timestamp - 1 s`` lies after batch B: the search must find it."""
    a, b = timeline.a, timeline.b
    history = LogPosition(
        LogIdentity(_address(primary)),
        EntryPosition(b.journal, 4, 99, "", (b.after_s + 1) * 1000),
    )
    finder = _finder(history, fallback_interval_s=1, dump_error_threshold=2)
    assert finder.find(_link(primary), dump_errors=2).reason is R.HISTORY  # not > threshold
    found = finder.find(_link(primary), dump_errors=3)
    assert found.reasons == (R.FALLBACK_SERVER_ID_CHANGED,)
    _assert_after(found, b.journal, b.seqs[-1])
    assert found.position.server_id == primary.server_id
    # The reader's own record of the server id wins over the history's.
    same = finder.find(_link(primary), dump_errors=3, previous_server_id=primary.server_id)
    assert same.reason is R.HISTORY
    # With a standby configured, a changed server id is not taken for a VIP switch.
    standby = ConfiguredPosition(address="127.0.0.1:2")
    with_standby = _finder(history, fallback_interval_s=1, standby=standby)
    assert with_standby.find(_link(primary), dump_errors=3).reason is R.HISTORY
    assert a.seqs[-1] < b.seqs[0]


def test_history_of_another_database_at_the_same_address_falls_back_at_once(
    primary: MariaDBServer, timeline: Timeline
) -> None:
    """A moved VIP seen by the history's identity (the @@server_id it was read from):
    no dump errors needed. The same database keeps its history even when the events
    there came from another server (replicated events keep their origin's id)."""
    b = timeline.b
    position = EntryPosition(b.journal, 4, 99, "", (b.after_s + 1) * 1000)
    other = LogPosition(LogIdentity(_address(primary), 0, primary.server_id + 1), position)
    found = _finder(other, fallback_interval_s=1).find(_link(primary))
    assert found.reasons == (R.FALLBACK_SERVER_ID_CHANGED,)
    _assert_after(found, b.journal, b.seqs[-1])
    assert found.identity == LogIdentity(_address(primary), 0, primary.server_id)
    same = LogPosition(LogIdentity(_address(primary), 0, primary.server_id), position)
    assert _finder(same).find(_link(primary), dump_errors=5).reasons == (R.HISTORY,)


def test_history_from_another_source_falls_back_by_time(box: Sandbox, timeline: Timeline) -> None:
    """History read from the standby; we are connected to the primary now."""
    b = timeline.b
    history = LogPosition(
        LogIdentity(_address(box.replica)),
        EntryPosition("elsewhere-bin.000042", 123456, 2, "", (b.after_s + 2) * 1000),
    )
    found = _finder(history, fallback_interval_s=2).find(_link(box.primary))
    assert found.reasons == (R.FALLBACK_SOURCE_SWITCH,)
    _assert_after(found, b.journal, b.seqs[-1])
    # The default fallback is 60 s: before every batch of the timeline.
    found = _finder(history).find(_link(box.primary))
    assert found.reason is R.FALLBACK_SOURCE_SWITCH
    assert _seq(found.position.gtid) < timeline.a.seqs[0]


def test_history_without_timestamp_cannot_fall_back(primary: MariaDBServer) -> None:
    history = LogPosition(LogIdentity("127.0.0.1:1"), EntryPosition("x-bin.000001", 4, 1))
    with pytest.raises(PositionNotFound, match="no timestamp"):
        _finder(history).find(_link(primary))


# -- branch 1: GTID mode --------------------------------------------------------------------------


def test_gtid_mode(primary: MariaDBServer, timeline: Timeline) -> None:
    addr = _address(primary)
    with_gtid = EntryPosition("elsewhere-bin.000001", 4, 1, "0-1-3", 1000)
    found = _finder(LogPosition(LogIdentity(addr), with_gtid), gtid_mode=True).find(_link(primary))
    assert found.reasons == (R.GTID_HISTORY,)
    assert found.position == with_gtid
    # No history: the configured master GTID.
    cfg = _primary_config(primary, gtid="0-1-2", journal=timeline.a.journal, offset=4)
    found = _finder(master=cfg, gtid_mode=True).find(_link(primary))
    assert found.reasons == (R.GTID_CONFIG,)
    assert found.position.gtid == "0-1-2" and not found.position.journal
    # History from before GTID mode (no GTID): its file position, not the config GTID.
    history = _history_after_b(primary, timeline, primary.server_id)
    found = _finder(history, master=cfg, gtid_mode=True).find(_link(primary))
    assert found.reasons == (R.HISTORY,)
    # GTID mode off: the configured GTID is ignored.
    assert _finder(master=cfg).find(_link(primary)).reason is R.CONFIG_POSITION
    # Nothing with a GTID anywhere: on to the other branches.
    assert _finder(gtid_mode=True).find(_link(primary)).reason is R.END


# -- destructive: purged binlogs, a promoted standby ---------------------------------------------


def test_purged_binlog_is_a_clear_error(make_sandbox: SandboxFactory) -> None:
    p = _private(make_sandbox).primary
    p.execute("CREATE DATABASE t_finder_purge", "CREATE TABLE t_finder_purge.t (id INT, ts INT)")
    _insert(p, "t_finder_purge", range(1, 3))
    old = EntryPosition(*p.master_status(), p.server_id, "", _clock(p) * 1000)
    p.execute("FLUSH BINARY LOGS")
    current = p.master_status()[0]

    def purged() -> bool:  # a file InnoDB has not checkpointed yet is kept: retry
        p.execute(f"PURGE BINARY LOGS TO '{current}'")
        return old.journal not in p.binlog_files()

    wait_until(purged, f"{old.journal} purged", 30.0)
    link = _link(p)
    cfg = _primary_config(p, journal=old.journal, offset=old.offset)
    with pytest.raises(PurgedPosition, match=rf"{old.journal}:{old.offset}.*master\.timestamp"):
        _finder(master=cfg).find(link)
    history = LogPosition(LogIdentity(_address(p)), old)
    with pytest.raises(PurgedPosition, match=rf"{old.journal}.*reset the client cursor"):
        _finder(history).find(link)
    # A time older than every remaining binlog: the binlog for it was purged.
    with pytest.raises(PurgedPosition, match=r"oldest.*purged"):
        _finder(master=_primary_config(p, timestamp_ms=1000)).find(link)
    # Reading a purged file is errno 1236, reported as PurgedPosition.
    with pytest.raises(PurgedPosition, match=rf"{old.journal} from offset 4.*master\.timestamp"):
        list(StreamEventSource(p.dsn(), SLAVE_ID).read(old.journal, 4))


def _ids_after(server: MariaDBServer, position: EntryPosition) -> set[int]:
    """Row ids inserted in the binlog of ``server`` from ``position`` on."""
    stream = binlog_stream.open_stream(
        server.dsn(),
        SLAVE_ID,
        journal=position.journal,
        offset=position.offset,
        blocking=False,
        only_events=[WriteRowsEvent],
    )
    ids: set[int] = set()
    try:
        while (ev := binlog_stream.next_event(stream)) is not None:
            ids.update(int(row["values"]["id"]) for row in ev.rows)
    finally:
        stream.close()
    return ids


def test_switch_to_promoted_standby_misses_no_row_after_fallback(
    make_sandbox: SandboxFactory,
) -> None:
    private = _private(make_sandbox, standby=True)
    p, s = private.primary, private.replica
    p.execute(
        "CREATE DATABASE t_finder_sw", "CREATE TABLE t_finder_sw.t (id INT PRIMARY KEY, ts BIGINT)"
    )
    after = _clock(p)
    history: LogPosition | None = None
    for first in (1, 11, 21):  # three batches in three different seconds
        _next_second(p, after)
        _insert(p, "t_finder_sw", range(first, first + 3))
        after = _clock(p)
        if first == 11:  # the reader read up to here on the primary, then lost it
            ts = int(p.scalar("SELECT MAX(ts) FROM t_finder_sw.t"))
            pos = EntryPosition(*p.master_status(), p.server_id, "", ts * 1000)
            history = LogPosition(LogIdentity(_address(p), SLAVE_ID), pos)
    assert history is not None
    s.wait_caught_up(p)
    p.kill()
    s.promote()
    s.execute("INSERT INTO t_finder_sw.t VALUES (100, UNIX_TIMESTAMP())")
    master = _primary_config(p, journal=history.position.journal, offset=4)
    standby = ConfiguredPosition(address=_address(s))
    finder = _finder(history, master=master, standby=standby, fallback_interval_s=1)
    found = finder.find(_link(s))
    assert found.reasons == (R.FALLBACK_SOURCE_SWITCH,)
    assert found.identity.source_address == _address(s)
    target_s = history.position.timestamp_ms // 1000 - 1
    rows = {int(i): int(ts) for i, ts in s.execute("SELECT id, ts FROM t_finder_sw.t")}
    must = {i for i, ts in rows.items() if ts > target_s}
    got = _ids_after(s, found.position)
    assert {21, 22, 23, 100} <= must and {11, 12, 13} & must  # batch 2's last second
    assert must <= got, f"rows missed after {found.position}: {sorted(must - got)}"
    assert not {1, 2, 3} & got  # the fallback bounded the replay (batch 1 is older)


def test_switch_to_promoted_standby_resumes_by_gtid_exactly(
    make_sandbox: SandboxFactory,
) -> None:
    """A history with a MariaDB GTID state: the promoted standby's own file and offset
    where that state ends, no time fallback (nothing older replayed, nothing missed).
    A state the new source does not hold falls back by time, as Canal does."""
    private = _private(make_sandbox, standby=True)
    p, s = private.primary, private.replica
    p.execute(
        "CREATE DATABASE t_finder_gsw",
        "CREATE TABLE t_finder_gsw.t (id INT PRIMARY KEY, ts BIGINT)",
    )
    _insert(p, "t_finder_gsw", range(1, 4))
    _insert(p, "t_finder_gsw", range(11, 14))
    ts = int(p.scalar("SELECT MAX(ts) FROM t_finder_gsw.t"))
    journal, offset = p.master_status()
    state = str(p.scalar("SELECT @@gtid_binlog_pos"))
    history = LogPosition(
        LogIdentity(_address(p), SLAVE_ID, p.server_id),
        EntryPosition(journal, offset, p.server_id, state, ts * 1000),
    )
    _insert(p, "t_finder_gsw", range(21, 24))
    s.wait_caught_up(p)
    p.kill()
    s.promote()
    s.execute("INSERT INTO t_finder_gsw.t VALUES (100, UNIX_TIMESTAMP())")
    finder = _finder(history, standby=ConfiguredPosition(address=_address(s)))
    found = finder.find(_link(s))
    assert found.reasons == (R.SWITCH_BY_GTID,)
    assert found.identity == LogIdentity(_address(s), 0, s.server_id)
    assert found.position.gtid == state
    assert _ids_after(s, found.position) == {21, 22, 23, 100}
    # A state the standby never saw (ahead of it): the time fallback, with its replay.
    ahead = LogPosition(history.identity, replace(history.position, gtid="0-1-999999"))
    fallback = _finder(ahead).find(_link(s))
    assert fallback.reasons == (R.FALLBACK_SOURCE_SWITCH,)
    assert {1, 2, 3, 21, 22, 23, 100} <= _ids_after(s, fallback.position)


def _sent_by_gtid_dump(server: MariaDBServer, state: str) -> list[tuple[str, int, str]]:
    """What a GTID dump from ``state`` sends: (file, start, GTID) of each transaction."""
    sent, journal = [], ""
    with binlog_stream.peek_stream(server.dsn(), SLAVE_ID, gtid=state) as stream:
        while (ev := binlog_stream.next_event(stream)) is not None:
            if isinstance(ev, RotateEvent):
                journal = ev.next_binlog
            elif isinstance(ev, MariadbGtidEvent):
                sent.append((journal, binlog_stream.event_span(ev).start, str(ev.gtid)))
    return sent


def test_switch_by_gtid_with_interleaved_domains_misses_no_transaction(
    make_sandbox: SandboxFactory,
) -> None:
    """Two domains ordered differently on the new database (MariaDB's per-domain
    parallel replication). The new file's Gtid_list holds the state's domain 0, so
    MariaDB drops that domain at once and sends its next transaction while it still
    skips domain 1 up to the state's GTID (where its fake Gtid_list comes). The found
    position lies at or before every transaction such a GTID dump sends: exactly at the
    first one, so nothing the state holds before it is read again."""
    p = _private(make_sandbox).primary
    p.execute(
        "CREATE DATABASE t_finder_dom",
        "CREATE TABLE t_finder_dom.t (id INT PRIMARY KEY, ts BIGINT)",
    )

    def insert(domain: int, row: int) -> str:
        return str(
            p.execute(
                f"SET SESSION gtid_domain_id = {domain}",
                f"INSERT INTO t_finder_dom.t VALUES ({row}, UNIX_TIMESTAMP())",
                "SELECT @@last_gtid",
            )[0][0]
        )

    insert(1, 1000)
    before_0 = insert(0, 1)
    p.execute("FLUSH BINARY LOGS")  # the new file's Gtid_list holds before_0
    insert(1, 1001)
    insert(0, 2)  # not in the state: must be read
    last_1 = insert(1, 1002)
    state = f"{before_0},{last_1}"
    sent = _sent_by_gtid_dump(p, state)
    assert [gtid for _, _, gtid in sent] == [f"0-{p.server_id}-{_seq(before_0) + 1}"]
    located = locate_gtid_state(p.dsn(), SLAVE_ID, state)
    first = sent[0][:2]  # a dump sends in binlog order
    assert (journal_seq(located[0]), located[1]) <= (journal_seq(first[0]), first[1]), (
        f"located at {located}, after {sent[0]}, which the GTID dump sends"
    )
    assert located == first
    history = LogPosition(
        LogIdentity("127.0.0.1:1", SLAVE_ID, 99), EntryPosition("old-bin.000001", 4, 99, state, 1)
    )
    found = _finder(history).find(_link(p))
    assert found.reasons == (R.SWITCH_BY_GTID,)
    assert found.position.gtid == state
    assert _ids_after(p, found.position) == {2, 1002}  # 1002 again: it follows row 2
