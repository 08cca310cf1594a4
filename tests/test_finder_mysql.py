"""PositionFinder on MySQL bytes: the branches of tests/test_finder.py (same names) against
``mysql_replay.MySQLReplayServer``, a test double of a MySQL 8.4 server that serves binlog
files written by real MySQL servers (tests/fixtures/mysql, see NOTICE).

The three files come from three servers (three server uuids); served here as one
server's binlog index, oldest first, in the order of their times. Their contents are
MySQL's; their succession is ours. Expected offsets and times are the files' own (what
``mysqlbinlog`` prints as ``# at`` and the event times).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from mysql_fixtures import FIXTURES
from mysql_replay import MySQLReplayServer
from pymysqlreplication.event import GtidEvent, RotateEvent

from canal_protocol.errors import PurgedPosition
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.parse import binlog_stream
from canal_server.parse.binlog_search import StreamEventSource
from canal_server.parse.finder import (
    ConfiguredPosition,
    DatabaseLink,
    FinderConfig,
    FindReason,
    PositionFinder,
)
from canal_server.parse.local_reader import LocalBinlogReader, LocalReaderConfig
from canal_server.parse.logposition import MemoryLogPositionManager

DEST = "finder-mysql"
SLAVE_ID = 6301
R = FindReason
FILES = {
    "mysql-bin.000001": "rmc__binlog-invisible-columns.000001",  # 8.0.26, Nov 2021
    "mysql-bin.000002": "rmc__mysql_type_bit.000001",  # 8.0, Jan 2022
    "mysql-bin.000003": "rmc__mysql-enum-string-set.000001",  # 8.0, Mar 2022
}
ENUM_UUID = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
BIT_UUID = "fbda2ad0-7c46-11ec-ae30-4ef7efc81a2a"
# mysql-bin.000003: transaction 3 (GTID event at 791, BEGIN 870, rows 1077, XID ends
# 1560) at 1647193281; transaction 4 (791..2659) at 1647193297; 5 at 1647193306.
T3, T4 = 1647193281, 1647193297
CLOCK = 1700000000  # the replay server's UNIX_TIMESTAMP()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MySQLReplayServer]:
    root = tmp_path_factory.mktemp("mysql-finder")
    for served, fixture in FILES.items():
        shutil.copy(FIXTURES / fixture, root / served)
    with MySQLReplayServer(root, clock=CLOCK) as srv:
        yield srv


def _link(srv: MySQLReplayServer) -> DatabaseLink:
    return DatabaseLink.connect(srv.dsn(), SLAVE_ID)


def _finder(history: LogPosition | None = None, **config: object) -> PositionFinder:
    positions = MemoryLogPositionManager()
    if history is not None:
        positions.persist(DEST, history)
    return PositionFinder(FinderConfig(DEST, **config), positions)  # type: ignore[arg-type]


def _config(srv: MySQLReplayServer, **kw: object) -> ConfiguredPosition:
    return ConfiguredPosition(address=srv.address, **kw)  # type: ignore[arg-type]


# -- branch 2: no history -------------------------------------------------------------------


def test_config_journal_and_offset_is_used(server: MySQLReplayServer) -> None:
    cfg = _config(server, journal="mysql-bin.000003", offset=1560)
    found = _finder(master=cfg).find(_link(server))
    assert found.reasons == (R.CONFIG_POSITION,)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000003", 1560)
    assert found.position.gtid == f"{ENUM_UUID}:1-3"  # read from the binlog, not SQL
    assert found.position.timestamp_ms == T3 * 1000  # the XID that ends there
    assert found.identity.source_address == server.address
    assert found.identity.source_server_id == 1  # @@server_id


def test_config_offset_inside_transaction_moves_to_its_begin(server: MySQLReplayServer) -> None:
    cfg = _config(server, journal="mysql-bin.000003", offset=1077)  # its rows event
    found = _finder(master=cfg).find(_link(server))
    assert found.reasons == (R.CONFIG_POSITION, R.MOVED_TO_TRANSACTION_BEGIN)
    assert found.position.offset == 791  # the GTID event before BEGIN
    assert found.position.gtid == f"{ENUM_UUID}:1-2"


def test_config_journal_and_time_searches_that_file(server: MySQLReplayServer) -> None:
    cfg = _config(server, journal="mysql-bin.000003", timestamp_ms=T4 * 1000)
    found = _finder(master=cfg).find(_link(server))
    assert found.reasons == (R.CONFIG_FILE_TIME,)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000003", 2659)
    assert found.position.gtid == f"{ENUM_UUID}:1-4"
    assert found.position.timestamp_ms == T4 * 1000


def test_config_time_only_bisects_files_and_scans_one(server: MySQLReplayServer) -> None:
    found = _finder(master=_config(server, timestamp_ms=1642940552 * 1000)).find(_link(server))
    assert found.reasons == (R.TIME_SEARCH,)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000002", 1001)
    assert found.position.gtid == f"{BIT_UUID}:1-3"


def test_nothing_configured_starts_at_the_end(server: MySQLReplayServer) -> None:
    found = _finder().find(_link(server))
    assert found.reasons == (R.END,)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000003", 3331)
    assert found.position.gtid == f"{ENUM_UUID}:1-5"
    assert found.position.timestamp_ms == CLOCK * 1000
    assert "SHOW BINARY LOG STATUS" in server.queries  # 8.4: the new statement


# -- branches 3-4: history ---------------------------------------------------------------------


def test_history_from_the_same_source_is_reused(server: MySQLReplayServer) -> None:
    pos = EntryPosition("mysql-bin.000002", 1001, 1, f"{BIT_UUID}:1-3", 1642940552000)
    history = LogPosition(LogIdentity(server.address, SLAVE_ID, 1), pos)
    found = _finder(history).find(_link(server))
    assert found.reasons == (R.HISTORY,)
    assert found.position == pos


def test_history_inside_transaction_moves_when_reader_asks(server: MySQLReplayServer) -> None:
    """A client cursor can lie inside a transaction (batches are cut by entry count):
    back to its GTID event, with the GTID state before it. At its end it stays."""
    inside = EntryPosition("mysql-bin.000003", 1855, 1, "", T4 * 1000)  # txn 4's rows
    history = LogPosition(LogIdentity(server.address, SLAVE_ID, 1), inside)
    finder = _finder(history)
    for found in (
        finder.find(_link(server)),
        finder.find(_link(server), need_transaction_begin=True),
    ):
        assert found.reasons == (R.HISTORY, R.MOVED_TO_TRANSACTION_BEGIN)
        assert found.position.offset == 1560
        assert found.position.gtid == f"{ENUM_UUID}:1-3"
    at_end = LogPosition(history.identity, EntryPosition("mysql-bin.000003", 2659, 1, "", 1))
    assert _finder(at_end).find(_link(server)).reasons == (R.HISTORY,)


@pytest.mark.parametrize("via", ["network", "local"])
def test_history_inside_a_compressed_transaction_moves_to_its_gtid_event(
    tmp_path: Path, via: str
) -> None:
    """MySQL 8.0.32's compressed transaction: anonymous GTID event at 197, its
    TRANSACTION_PAYLOAD 274..431 holds BEGIN, rows and XID. A cursor after its BEGIN
    (274, part 1) lies inside it: back to 197 (the payload is read again, the store
    skips what the client has). Its END (431, part 0) is a boundary: it stays."""
    shutil.copy(FIXTURES / "rmc__transaction_compression.000001", tmp_path / "mysql-bin.000001")
    inside = EntryPosition("mysql-bin.000001", 274, 1, "", 1_000, part=1)
    after = EntryPosition("mysql-bin.000001", 431, 1, "", 1_000)
    with MySQLReplayServer(tmp_path, clock=CLOCK, variables={"gtid_mode": "OFF"}) as srv:
        if via == "network":
            link = _link(srv)
        else:
            config = LocalReaderConfig(str(tmp_path), "", poll_s=0.05, slave_id=SLAVE_ID)
            link = LocalBinlogReader(config, lambda _: None).link()
        identity = LogIdentity(link.address, SLAVE_ID, 1 if via == "network" else 0)
        found = _finder(LogPosition(identity, inside)).find(link)
        assert found.reasons == (R.HISTORY, R.MOVED_TO_TRANSACTION_BEGIN)
        assert (found.position.offset, found.position.part) == (197, 0)
        found = _finder(LogPosition(identity, after)).find(link)
        assert found.reasons == (R.HISTORY,)
        assert (found.position.offset, found.position.part) == (431, 0)


def test_switch_to_promoted_standby_resumes_by_gtid_exactly(server: MySQLReplayServer) -> None:
    """A history read from another server (another address) with a MySQL GTID set:
    this server's own file and offset right after the transaction that completes the
    set (GTIDs keep their origin across replicas), no time fallback. A set this server
    does not hold all of (ahead of it) falls back by time, as Canal does."""
    old = LogIdentity("127.0.0.1:1", SLAVE_ID, 77)
    state = f"{ENUM_UUID}:1-3"
    history = LogPosition(old, EntryPosition("old-bin.000042", 999, 77, state, T3 * 1000))
    found = _finder(history).find(_link(server))
    assert found.reasons == (R.SWITCH_BY_GTID,)
    assert found.identity == LogIdentity(server.address, 0, 1)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000003", 1560)
    assert found.position.gtid == state
    whole = replace(history, position=replace(history.position, gtid=f"{ENUM_UUID}:1-5"))
    found = _finder(whole).find(_link(server))
    assert (found.reason, found.position.offset) == (R.SWITCH_BY_GTID, 3331)
    ahead = replace(history, position=replace(history.position, gtid=f"{ENUM_UUID}:1-9"))
    fallback = _finder(ahead, fallback_interval_s=60).find(_link(server))
    assert fallback.reasons == (R.FALLBACK_SOURCE_SWITCH,)


@pytest.mark.parametrize(
    ("numbers", "offset"),
    [
        ("1-10", 197),  # the file's PREVIOUS_GTIDS: after them
        ("1-11", 378),  # after a DDL (a statement of its own)
        ("1-12", 651),  # after a compressed transaction (its XID inside the payload)
        ("1-13", 1283),
        ("1-5", None),  # 6-10 were purged: the time fallback
        ("1-14", None),  # ahead of the server: the time fallback
    ],
)
def test_switch_by_gtid_reads_previous_gtids_and_the_gtid_events(
    tmp_path: Path, numbers: str, offset: int | None
) -> None:
    """mysql-bin.000057 (MySQL 8.0.31) alone: PREVIOUS_GTIDS uuid:1-10, then GTIDs 11 (a
    CREATE TABLE), 12 and 13 (compressed transactions)."""
    shutil.copy(FIXTURES / "ape__mysql-bin.000057", tmp_path / "mysql-bin.000057")
    state = f"76f3e7be-6720-11ed-9cad-0242ac110002:{numbers}"
    pos = EntryPosition("old-bin.000009", 999, 77, state, CLOCK * 1000)
    history = LogPosition(LogIdentity("127.0.0.1:1", SLAVE_ID, 77), pos)
    with MySQLReplayServer(tmp_path, clock=CLOCK) as srv:
        found = _finder(history, fallback_interval_s=60).find(_link(srv))
    if offset is None:
        assert found.reason is R.FALLBACK_SOURCE_SWITCH
    else:
        assert found.reasons == (R.SWITCH_BY_GTID,)
        assert (found.position.journal, found.position.offset) == ("mysql-bin.000057", offset)


def _sent_by_gtid_dump(srv: MySQLReplayServer, state: str) -> list[tuple[str, int]]:
    """Where each transaction a GTID dump from ``state`` sends starts (file, offset)."""
    sent, journal = [], ""
    only = (RotateEvent, GtidEvent)
    with binlog_stream.peek_stream(srv.dsn(), SLAVE_ID, gtid=state, only_events=only) as stream:
        while (ev := binlog_stream.next_event(stream)) is not None:
            if isinstance(ev, RotateEvent):
                journal = ev.next_binlog
            elif isinstance(ev, GtidEvent):
                sent.append((journal, binlog_stream.event_span(ev).start))
    return sent


@pytest.mark.parametrize(
    ("numbers", "offset"),
    [
        ("1-10:12", 197),  # lacks 11 (the DDL at 197): a dump sends 11 and 13
        ("1-10:13", 197),
        ("1-11:13", 378),  # lacks 12 (the compressed transaction at 378)
        ("1-12", 651),  # no gap: after 12, where 13 starts
    ],
)
def test_switch_by_gtid_starts_before_the_first_transaction_the_set_lacks(
    tmp_path: Path, numbers: str, offset: int
) -> None:
    """A set with a gap (the old server committed them in another order, e.g. a
    multi-threaded replica): the start lies at or before every transaction a GTID dump
    from the set sends, exactly at the first one; none of them is skipped."""
    shutil.copy(FIXTURES / "ape__mysql-bin.000057", tmp_path / "mysql-bin.000057")
    state = f"76f3e7be-6720-11ed-9cad-0242ac110002:{numbers}"
    pos = EntryPosition("old-bin.000009", 999, 77, state, CLOCK * 1000)
    history = LogPosition(LogIdentity("127.0.0.1:1", SLAVE_ID, 77), pos)
    with MySQLReplayServer(tmp_path, clock=CLOCK) as srv:
        sent = _sent_by_gtid_dump(srv, state)
        found = _finder(history, fallback_interval_s=60).find(_link(srv))
    assert found.reasons == (R.SWITCH_BY_GTID,)
    located = (found.position.journal, found.position.offset)
    assert sent and all(located <= at for at in sent), f"{located}: after some of {sent}"
    assert located == ("mysql-bin.000057", offset) == sent[0]


def test_history_of_another_database_at_the_same_address_falls_back_at_once(
    server: MySQLReplayServer,
) -> None:
    """The history names another @@server_id than the one answering at its address."""
    position = EntryPosition("mysql-bin.000003", 4, 99, "", (T4 + 1) * 1000)
    other = LogPosition(LogIdentity(server.address, 0, 2), position)
    found = _finder(other, fallback_interval_s=1).find(_link(server))
    assert found.reasons == (R.FALLBACK_SERVER_ID_CHANGED,)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000003", 2659)
    same = LogPosition(LogIdentity(server.address, 0, 1), position)
    assert _finder(same).find(_link(server), dump_errors=5).reasons == (R.HISTORY,)


def test_history_from_another_source_falls_back_by_time(server: MySQLReplayServer) -> None:
    pos = EntryPosition("other-bin.000009", 99, 7, "", (T4 + 60) * 1000)
    history = LogPosition(LogIdentity("127.0.0.1:1", SLAVE_ID, 7), pos)
    found = _finder(history, fallback_interval_s=60).find(_link(server))
    assert found.reasons == (R.FALLBACK_SOURCE_SWITCH,)
    assert (found.position.journal, found.position.offset) == ("mysql-bin.000003", 2659)
    assert found.position.gtid == f"{ENUM_UUID}:1-4"


# -- branch 1: GTID mode --------------------------------------------------------------------------


def test_gtid_mode(server: MySQLReplayServer) -> None:
    with_gtid = EntryPosition("mysql-bin.000003", 2659, 1, f"{ENUM_UUID}:1-4", T4 * 1000)
    history = LogPosition(LogIdentity(server.address, SLAVE_ID, 1), with_gtid)
    found = _finder(history, gtid_mode=True).find(_link(server))
    assert found.reasons == (R.GTID_HISTORY,)
    assert found.position == with_gtid
    cfg = _config(server, gtid=f"{ENUM_UUID}:1-2", journal="mysql-bin.000001", offset=4)
    found = _finder(master=cfg, gtid_mode=True).find(_link(server))
    assert found.reasons == (R.GTID_CONFIG,)
    assert found.position.gtid == f"{ENUM_UUID}:1-2" and not found.position.journal
    assert _finder(master=cfg).find(_link(server)).reason is R.CONFIG_POSITION
    assert _finder(gtid_mode=True).find(_link(server)).reason is R.END


# -- purged binlogs ------------------------------------------------------------------------


def test_purged_binlog_is_a_clear_error(tmp_path: Path) -> None:
    """The server keeps mysql-bin.000057 only (MySQL 8.0.31; its PREVIOUS_GTIDS
    uuid:1-10 were in the purged files)."""
    shutil.copy(FIXTURES / "ape__mysql-bin.000057", tmp_path / "mysql-bin.000057")
    with MySQLReplayServer(tmp_path) as srv:
        link = _link(srv)
        cfg = _config(srv, journal="mysql-bin.000056", offset=4)
        with pytest.raises(PurgedPosition, match=r"mysql-bin\.000056:4.*master\.timestamp"):
            _finder(master=cfg).find(link)
        old = EntryPosition("mysql-bin.000056", 120, 1, "", 1668952000000)
        history = LogPosition(LogIdentity(srv.address, SLAVE_ID, 1), old)
        with pytest.raises(PurgedPosition, match=r"mysql-bin\.000056.*reset the client cursor"):
            _finder(history).find(link)
        with pytest.raises(PurgedPosition, match=r"oldest.*76f3e7be.*:1-10.*purged"):
            _finder(master=_config(srv, timestamp_ms=1000)).find(link)
        with pytest.raises(PurgedPosition, match=r"mysql-bin\.000056 from offset 4"):
            list(StreamEventSource(srv.dsn(), SLAVE_ID).read("mysql-bin.000056", 4))


@pytest.mark.parametrize("number", ["000003", "000001"])
def test_time_before_the_oldest_binlog_without_gtids(tmp_path: Path, number: str) -> None:
    """gtid_mode OFF (MySQL 5.7.19's mysql-bin.000003 from Canal's tests: anonymous
    GTIDs, an empty PREVIOUS_GTIDS): nothing in the file says what came before it.
    Under its own name, 1-2 were purged: a time before it is PurgedPosition; as the
    server's first binlog, history starts there."""
    name = f"mysql-bin.{number}"
    shutil.copy(FIXTURES / "canal__tsdb_mysql-bin.000003", tmp_path / name)
    with MySQLReplayServer(tmp_path, clock=CLOCK, variables={"gtid_mode": "OFF"}) as srv:
        finder = _finder(master=_config(srv, timestamp_ms=1000))
        if number == "000003":
            with pytest.raises(PurgedPosition, match=rf"{name}.*master\.timestamp"):
                finder.find(_link(srv))
            return
        found = finder.find(_link(srv))
    assert found.reasons == (R.TIME_SEARCH,)
    assert (found.position.journal, found.position.offset, found.position.gtid) == (name, 4, "")
