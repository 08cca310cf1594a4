"""The MySQL flavour over the network, against a replay of MySQL's own binlog bytes.

``mysql_replay.MySQLReplayServer`` is a test double of the network peer (no MySQL server
can be installed here): it speaks the MySQL protocol and serves the fixture files
(tests/fixtures/mysql, see NOTICE) event by event. What is proven here: canal-ha's
network reader chooses the MySQL flavour from ``VERSION()``, dumps by file and offset
and by GTID set (``COM_BINLOG_DUMP_GTID``), decodes MySQL's bytes into the same entries
as the local reader, reads ``SHOW BINARY LOG STATUS`` (8.4) or ``SHOW MASTER STATUS``
(8.0), and refuses a wrong server setting at start, naming it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mysql_fixtures import FIXTURES, Reading, rows, wait_for
from mysql_replay import MySQLReplayServer
from pymysqlreplication.event import QueryEvent, XidEvent

from canal_protocol.entry import EntryType
from canal_protocol.errors import BinlogConfigError, PurgedPosition
from canal_protocol.gtid import GtidSet
from canal_protocol.positions import EntryPosition
from canal_server.instance import query_master_status
from canal_server.parse.binlog_search import SqlBinlogInspector
from canal_server.parse.binlog_stream import (
    check_server_config,
    event_span,
    next_event,
    open_stream,
)

ENUM = "rmc__mysql-enum-string-set.000001"  # MySQL 8.0, FULL metadata, GTIDs uuid:1-5
UUID = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
BINLOG = "mysql-bin.000001"


def _serve(tmp: Path, files: dict[str, str], **kw: Any) -> MySQLReplayServer:
    for served, fixture in files.items():
        shutil.copy(FIXTURES / fixture, tmp / served)
    return MySQLReplayServer(tmp, **kw)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MySQLReplayServer]:
    with _serve(tmp_path, {BINLOG: ENUM}) as srv:
        yield srv


def test_mysql_flavour_reads_a_binlog_by_file_and_offset(server: MySQLReplayServer) -> None:
    """Same entries, positions and GTIDs as the local reader gives for these bytes."""
    entries = Reading(server).until(EntryPosition(BINLOG, 4), (BINLOG, 3331))
    kinds = [(e.type.value, e.header.gtid, e.header.offset, e.header.end_offset) for e in entries]
    assert kinds == [
        ("ROWDATA", f"{UUID}:1", 236, 493),
        ("ROWDATA", f"{UUID}:2", 572, 791),
        ("TRANSACTIONBEGIN", f"{UUID}:3", 870, 946),
        ("ROWDATA", f"{UUID}:3", 1077, 1529),
        ("TRANSACTIONEND", f"{UUID}:3", 1529, 1560),
        ("TRANSACTIONBEGIN", f"{UUID}:4", 1639, 1724),
        ("ROWDATA", f"{UUID}:4", 1855, 2628),
        ("TRANSACTIONEND", f"{UUID}:4", 2628, 2659),
        ("TRANSACTIONBEGIN", f"{UUID}:5", 2738, 2814),
        ("ROWDATA", f"{UUID}:5", 2945, 3300),
        ("TRANSACTIONEND", f"{UUID}:5", 3300, 3331),
    ]
    assert [(t, kind) for t, kind, _ in rows(entries)] == [
        ("t", "INSERT"),
        ("t", "UPDATE"),
        ("t", "DELETE"),
    ]
    first = next(rows(entries))[2][1]
    assert first is not None and first["f3"] == "var1" and first["f4"] == "one,three"
    assert GtidSet.parse(entries[-1].gtid_state) == GtidSet.parse(f"{UUID}:1-5")
    assert server.dumps[0]["file"] == BINLOG and server.dumps[0]["gtids"] is None
    assert not server.unknown  # every statement canal-ha sent is one MySQL knows


def test_idle_dump_gets_heartbeats_and_stays_connected(server: MySQLReplayServer) -> None:
    """At the end of the binlog MySQL sends HEARTBEAT events (every heartbeat_s, asked
    with @master_heartbeat_period); the reader's socket times out after three missed
    ones, so without them it would reconnect (seen: a second dump from 3331 after a
    2013 timeout). Five heartbeats later: one dump, no error, no entry twice."""
    reading = Reading(server)  # heartbeat_s=1.0: read timeout 3 s
    thread = reading.start(EntryPosition(BINLOG, 4))
    try:
        wait_for(lambda: reading.error is not None or reading.at((BINLOG, 3331)))
        wait_for(lambda: reading.error is not None or server.heartbeats >= 5)
    finally:
        reading.reader.stop()
        thread.join(10)
    assert reading.error is None
    assert len([d for d in server.dumps if not d["flags"] & 1]) == 1  # blocking dumps
    assert reading.reader.dump_error_count == 0
    assert len(reading.entries) == 11


def test_resume_inside_a_file_gets_the_gtid_state_from_the_binlog(
    server: MySQLReplayServer,
) -> None:
    """MySQL has no BINLOG_GTID_POS: the state at 1560 is read from the file (its
    PREVIOUS_GTIDS and the GTIDs before the offset); the dump starts there."""
    entries = Reading(server).until(EntryPosition(BINLOG, 1560), (BINLOG, 3331))
    assert [kind for _, kind, _ in rows(entries)] == ["UPDATE", "DELETE"]
    assert entries[0].gtid_state == f"{UUID}:1-3"
    assert entries[-1].gtid_state == f"{UUID}:1-5"
    assert any(d["pos"] == 1560 for d in server.dumps)


def test_gtid_dump_sends_only_the_transactions_the_set_lacks(server: MySQLReplayServer) -> None:
    """COM_BINLOG_DUMP_GTID with uuid:1-3: transactions 4 and 5 only."""
    start = EntryPosition(gtid=f"{UUID}:1-3")
    entries = Reading(server, gtid_mode=True).until(start, (BINLOG, 3331))
    assert [e.header.gtid for e in entries if e.type is EntryType.TRANSACTIONEND] == [
        f"{UUID}:4",
        f"{UUID}:5",
    ]
    assert [kind for _, kind, _ in rows(entries)] == ["UPDATE", "DELETE"]
    assert entries[-1].gtid_state == f"{UUID}:1-5"
    dump = server.dumps[-1]
    assert dump["gtids"] == GtidSet.parse(f"{UUID}:1-3") and dump["flags"] & 0x04


def test_gtid_dump_of_purged_transactions_is_refused(tmp_path: Path) -> None:
    """The oldest binlog's PREVIOUS_GTIDS (uuid:1-10) were purged: a set without them is
    errno 1236, a PurgedPosition."""
    with _serve(tmp_path, {"mysql-bin.000057": "ape__mysql-bin.000057"}) as srv:
        start = EntryPosition(gtid="76f3e7be-6720-11ed-9cad-0242ac110002:1-3")
        with pytest.raises(PurgedPosition, match="purged required binary logs"):
            Reading(srv, gtid_mode=True).until(start, ("never", 0))


def test_binary_log_status_on_84_and_master_status_before(tmp_path: Path) -> None:
    """8.4 has only SHOW BINARY LOG STATUS, 8.0.36 only SHOW MASTER STATUS: the end of
    the binlog and its GTID set (Executed_Gtid_Set) either way."""
    shutil.copy(FIXTURES / ENUM, tmp_path / BINLOG)
    for version in ("8.4.3", "8.0.36"):
        with MySQLReplayServer(tmp_path, version=version) as srv:
            assert SqlBinlogInspector(srv.dsn()).master_status() == (BINLOG, 3331)
            status = query_master_status(srv.dsn())
            assert status is not None and status["gtid"] == f"{UUID}:1-5"
            check_server_config(srv.dsn())  # the grants check asks the same statement
            assert "SHOW MASTER STATUS" not in srv.unknown or version == "8.4.3"
            assert "SHOW BINARY LOG STATUS" not in srv.unknown or version == "8.0.36"


@pytest.mark.parametrize(
    ("setting", "version", "gtid_mode", "message"),
    [
        ({"binlog_format": "MIXED"}, "8.4.3", False, r"binlog_format=MIXED \(need ROW\)"),
        ({"binlog_row_image": "MINIMAL"}, "8.4.3", False, r"binlog_row_image=MINIMAL"),
        ({"binlog_row_metadata": "MINIMAL"}, "8.0.36", False, r"binlog_row_metadata=MINIMAL"),
        ({"gtid_mode": "OFF"}, "8.4.3", True, r"gtid_mode=OFF \(need ON\)"),
        ({"binlog_row_value_options": "PARTIAL_JSON"}, "8.0.36", False, r"PARTIAL_JSON"),
        ({}, "5.7.40-log", False, r"MySQL 5\.7\.40-log has no binlog_row_metadata"),
    ],
)
def test_start_checks_refuse_a_wrong_setting(
    tmp_path: Path, setting: dict[str, str], version: str, gtid_mode: bool, message: str
) -> None:
    with _serve(tmp_path, {BINLOG: ENUM}, version=version, variables=setting) as srv:
        with pytest.raises(BinlogConfigError, match=message):
            check_server_config(srv.dsn(), gtid_mode=gtid_mode)
        start = EntryPosition(BINLOG, 4, gtid=f"{UUID}:1" if gtid_mode else "")
        with pytest.raises(BinlogConfigError, match=message):
            Reading(srv, gtid_mode=gtid_mode).until(start, ("never", 0))
        assert not srv.dumps  # refused before any dump


def test_gtid_mode_off_is_accepted_without_gtid_positions(tmp_path: Path) -> None:
    with _serve(tmp_path, {BINLOG: ENUM}, variables={"gtid_mode": "OFF"}) as srv:
        check_server_config(srv.dsn(), gtid_mode=False)


def test_table_without_column_names_is_refused_over_the_network(tmp_path: Path) -> None:
    """MySQL 8.0.31 rows written with binlog_row_metadata=MINIMAL (the server's setting
    changed since): refused naming the table, never delivered with guessed names."""
    minimal = {"mysql-bin.000057": "ape__mysql-bin.000057"}
    with (
        _serve(tmp_path, minimal) as srv,
        pytest.raises(BinlogConfigError, match=r"a\.\w+: the binlog carries no column"),
    ):
        Reading(srv).until(EntryPosition("mysql-bin.000057", 4), ("never", 0))


def test_missing_binlog_file_is_a_purged_position(server: MySQLReplayServer) -> None:
    with pytest.raises(PurgedPosition, match="Could not find first log file"):
        Reading(server).until(EntryPosition("mysql-bin.000000", 4), ("never", 0))


def test_compressed_transaction_is_decoded_over_the_network(tmp_path: Path) -> None:
    """MySQL 8.0.32, binlog_transaction_compression=ON, gtid_mode OFF: the table map sits
    inside the zstd TRANSACTION_PAYLOAD (after an anonymous GTID event); it is reached
    over the network and, written without column names, refused naming the table."""
    compressed = {BINLOG: "rmc__transaction_compression.000001"}
    with (
        _serve(tmp_path, compressed, variables={"gtid_mode": "OFF"}) as srv,
        pytest.raises(BinlogConfigError, match=r"table test\.tb1: the binlog carries no column"),
    ):
        Reading(srv).until(EntryPosition(BINLOG, 4), ("never", 0))


def test_events_inside_a_compressed_transaction_are_numbered_over_the_network(
    tmp_path: Path,
) -> None:
    """The network dump's events go through the same decoder as the files: the events
    inside the TRANSACTION_PAYLOAD (274..431) get their ``part`` (BEGIN 1, table map 2,
    rows 3, XID 4), the entries' order inside the one position they share. (Rows are
    not asked for: this table has no column names, the reader refuses it.)"""
    compressed = {BINLOG: "rmc__transaction_compression.000001"}
    with _serve(tmp_path, compressed, variables={"gtid_mode": "OFF"}) as srv:
        stream = open_stream(
            srv.dsn(),
            4712,
            journal=BINLOG,
            offset=4,
            blocking=False,
            check_config=False,
            only_events=(QueryEvent, XidEvent),
        )
        spans = []
        try:
            while (ev := next_event(stream)) is not None:
                span = event_span(ev)
                if not span.artificial:
                    spans.append((type(ev).__name__, span.start, span.end, span.part))
        finally:
            stream.close()
    inside = [s for s in spans if (s[1], s[2]) == (274, 431)]
    assert [(name, part) for name, _, _, part in inside] == [
        ("QueryEvent", 1), ("XidEvent", 4)
    ]  # fmt: skip
    assert all(part == 0 for _, _, end, part in spans if end != 431)


@pytest.mark.parametrize("version", ["8.4.3", "8.0.36"])
def test_wrong_password_is_refused_clearly(tmp_path: Path, version: str) -> None:
    """caching_sha2_password (8.x's default; its fast path) checks the scramble: a wrong
    db.password is a BinlogConfigError naming it, not a retried dump."""
    with _serve(tmp_path, {BINLOG: ENUM}, version=version, password="right") as srv:
        check_server_config(srv.dsn())
        with pytest.raises(BinlogConfigError, match=r"refused the database user.*db\.password"):
            check_server_config(srv.dsn(password="wrong"))


def test_first_login_without_tls_does_the_full_caching_sha2_authentication(
    tmp_path: Path,
) -> None:
    """MySQL 8's caching_sha2_password after a server start: no user is in its cache, so
    no fast path; without TLS (canal-ha's default on loopback) the client asks for the
    server's RSA public key and sends the password encrypted with it (pymysql needs
    ``cryptography`` for that: in the ``server`` extra). A wrong password is refused
    naming db.password there too; after one login the fast path serves, and a dump
    (mysql-replication's own connections) reads the rows."""
    with _serve(tmp_path, {BINLOG: ENUM}, password="s3cret") as srv:
        with pytest.raises(BinlogConfigError, match=r"refused the database user.*db\.password"):
            check_server_config(srv.dsn(password="wrong"))
        assert (srv.full_auths, srv.key_requests) == (0, 1)
        check_server_config(srv.dsn())
        assert (srv.full_auths, srv.key_requests) == (1, 2)
        check_server_config(srv.dsn())  # cached: the fast path, no key
        assert (srv.full_auths, srv.key_requests) == (1, 2)
        entries = Reading(srv).until(EntryPosition(BINLOG, 4), (BINLOG, 3331))
        assert len(list(rows(entries))) == 3
