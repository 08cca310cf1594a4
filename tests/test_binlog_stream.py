"""binlog_stream: offsets, the GTID dump length fix, no silent reconnect, config checks."""

from __future__ import annotations

import gc
import struct
import threading
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)
from pymysqlreplication.table import Table

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import Entry
from canal_protocol.errors import BinlogConfigError, BinlogConnectionLost
from canal_protocol.positions import EntryPosition
from canal_server.parse import binlog_stream, rowcodec
from canal_server.parse.binlog_stream import (
    check_binlog_config,
    check_server_config,
    event_span,
    interrupt,
    next_event,
    open_stream,
)
from canal_server.parse.reader import EVENTS
from canal_server.parse.transaction import TransactionAssembler

GOOD = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


def _write_some(sandbox: Sandbox, db: str) -> None:
    sandbox.primary.execute(
        f"CREATE DATABASE IF NOT EXISTS {db}",
        f"CREATE TABLE IF NOT EXISTS {db}.t (id INT PRIMARY KEY, v VARCHAR(20))",
        f"INSERT INTO {db}.t VALUES (1, 'a'), (2, 'b')",
        f"UPDATE {db}.t SET v = 'c' WHERE id = 1",
        f"DELETE FROM {db}.t WHERE id = 2",
    )


def _drain(stream: BinLogStreamReader) -> list[Any]:
    events = []
    try:
        while (ev := next_event(stream)) is not None:
            events.append(ev)
    finally:
        stream.close()
    return events


def test_offsets_match_show_binlog_events(db: Sandbox) -> None:
    sandbox = db
    _write_some(sandbox, "t_stream_offsets")
    journal, _ = sandbox.primary.master_status()
    shown = sandbox.primary.execute(f"SHOW BINLOG EVENTS IN '{journal}'")
    # (Pos, End_log_pos) -> Event_type
    expected = {(int(r[1]), int(r[4])): str(r[2]) for r in shown}
    events = _drain(open_stream(sandbox.primary.dsn(), 5101, journal=journal, blocking=False))
    assert type(events[0]).__name__ == "RotateEvent" and events[0].timestamp == 0
    assert event_span(events[0]).artificial
    real = [ev for ev in events if not event_span(ev).artificial]
    assert len(real) > 10
    names = {"MariadbGtidEvent": "Gtid", "XidEvent": "Xid", "QueryEvent": "Query"}
    for ev in real:
        span = event_span(ev)
        assert (span.start, span.end) in expected, (type(ev).__name__, span)
        kind = type(ev).__name__
        if kind in names:
            assert expected[(span.start, span.end)] == names[kind]
        assert span.server_id == sandbox.primary.server_id
    # Consecutive real events tile the file (no gaps except filtered events).
    # The set is built once: the session's shared journal can hold tens of thousands of
    # events by the time this runs, and a set per element made this check quadratic.
    starts = sorted(s for s, _ in expected)
    seen = [event_span(ev).start for ev in real]
    seen_set = set(seen)
    assert seen == [s for s in starts if s in seen_set]


def test_resume_from_offset_starts_there(db: Sandbox) -> None:
    sandbox = db
    _write_some(sandbox, "t_stream_resume")
    journal, _ = sandbox.primary.master_status()
    shown = sandbox.primary.execute(f"SHOW BINLOG EVENTS IN '{journal}'")
    gtid_rows = [r for r in shown if r[2] == "Gtid"]
    start = int(gtid_rows[-2][1])
    events = _drain(
        open_stream(sandbox.primary.dsn(), 5102, journal=journal, offset=start, blocking=False)
    )
    real = [ev for ev in events if not event_span(ev).artificial]
    assert event_span(real[0]).start == start
    assert type(real[0]).__name__ == "MariadbGtidEvent"


def _gtid_of_last_transactions(sandbox: Sandbox, n: int) -> tuple[str, list[str]]:
    """A GTID state n transactions back, and the GTIDs that follow it."""
    journal, _ = sandbox.primary.master_status()
    shown = sandbox.primary.execute(f"SHOW BINLOG EVENTS IN '{journal}'")
    gtids = [str(r[5]).split()[-1] for r in shown if r[2] == "Gtid"]
    # Info looks like "BEGIN GTID 0-1-7" or "GTID 0-1-5".
    return gtids[-n - 1], gtids[-n:]


def _big_transaction_after(sandbox: Sandbox, db: str) -> str:
    """A GTID state, then one transaction of ~200 kB of row events after it."""
    sandbox.primary.execute(
        f"CREATE DATABASE IF NOT EXISTS {db}",
        f"CREATE TABLE IF NOT EXISTS {db}.t (id INT PRIMARY KEY, v VARCHAR(20))",
    )
    state = str(sandbox.primary.scalar("SELECT @@gtid_binlog_pos"))
    sandbox.primary.execute(
        f"INSERT INTO {db}.t SELECT seq, CONCAT('row-', seq) "
        f"FROM {db}.seq_1_to_20000 WHERE seq NOT IN (SELECT id FROM {db}.t)"
    )
    return state


def _read_after_server_finished(sandbox: Sandbox, stream: BinLogStreamReader) -> int:
    """Read one event, wait until the server has sent everything and closed the
    dump connection, then read the rest; the number of events read."""
    count = 1
    assert next_event(stream) is not None
    tid = stream._stream_connection.server_thread_id[0]

    def gone() -> bool:
        return tid not in {int(r[0]) for r in sandbox.primary.execute("SHOW PROCESSLIST")}

    try:
        wait_until(gone, "dump thread finished", 60)
        while next_event(stream) is not None:
            count += 1
    finally:
        stream.close()
    return count


def test_gtid_resume_with_fixed_dump_length(db: Sandbox) -> None:
    sandbox = db
    _write_some(sandbox, "t_stream_gtid")
    state, following = _gtid_of_last_transactions(sandbox, 3)
    events = _drain(open_stream(sandbox.primary.dsn(), 5103, gtid=state, blocking=False))
    got = [ev.gtid for ev in events if type(ev).__name__ == "MariadbGtidEvent"]
    assert got == following
    # A dump the server finishes (and closes) before we read it ends cleanly.
    state = _big_transaction_after(sandbox, "t_stream_gtid_big")
    stream = open_stream(sandbox.primary.dsn(), 5103, gtid=state, blocking=False)
    assert _read_after_server_finished(sandbox, stream) > 10


def test_unfixed_library_breaks_the_gtid_dump(db: Sandbox) -> None:
    """Reproduces the bug: the library declares 14 bytes and sends 15; the server
    closes the finished dump with one unread byte, i.e. with a TCP reset, and the
    events we had not read yet are lost (error 2013)."""
    sandbox = db
    state = _big_transaction_after(sandbox, "t_stream_gtid_bug")
    plain = BinLogStreamReader(
        connection_settings=binlog_stream._connection_kwargs(sandbox.primary.dsn()),
        server_id=5104,
        is_mariadb=True,
        auto_position=state,
        blocking=False,
        pymysql_wrapper=binlog_stream._guarded_connect,  # no silent reconnect loop
        enable_logging=False,
    )
    with pytest.raises(BinlogConnectionLost, match="reset"):
        _read_after_server_finished(sandbox, plain)


def test_fix_dump_length_repacks_header() -> None:
    payload = bytes([0x12]) + struct.pack("<iHI", 4, 1, 77) + b"\0\0\0\0"
    wrong = struct.pack("<i", 14) + payload
    fixed = binlog_stream._fix_dump_length(wrong)
    assert fixed[4:] == payload
    assert struct.unpack("<i", fixed[:4])[0] == len(payload) == 15


def _dump_thread_ids(sandbox: Sandbox, user: str = "canal") -> list[int]:
    rows = sandbox.primary.execute("SHOW PROCESSLIST")
    return [int(r[0]) for r in rows if r[4] == "Binlog Dump" and r[1] == user]


def _connected_thread(stream: BinLogStreamReader) -> int | None:
    conn = getattr(stream, "_stream_connection", None)
    ident = getattr(conn, "server_thread_id", None)
    return int(ident[0]) if ident else None


def test_killed_dump_raises_instead_of_silent_reconnect(db: Sandbox) -> None:
    sandbox = db
    _write_some(sandbox, "t_stream_kill")
    journal, offset = sandbox.primary.master_status()
    stream = open_stream(sandbox.primary.dsn(), 5105, journal=journal, offset=offset)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while next_event(stream) is not None:
                pass
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        wait_until(lambda: _connected_thread(stream) is not None, "dump connection", 30)
        tid = _connected_thread(stream)
        wait_until(lambda: tid in _dump_thread_ids(sandbox), "dump thread listed", 30)
        sandbox.primary.execute(f"KILL {tid}")
        t.join(30)
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], BinlogConnectionLost)
    finally:
        interrupt(stream)
        t.join(10)
        stream.close()


def test_interrupt_ends_a_blocked_read(db: Sandbox) -> None:
    sandbox = db
    journal, offset = sandbox.primary.master_status()
    stream = open_stream(sandbox.primary.dsn(), 5106, journal=journal, offset=offset)
    # Read the artificial events so the next read blocks on the socket.
    assert type(next_event(stream)).__name__ == "RotateEvent"
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while next_event(stream) is not None:
                pass
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    interrupt(stream)
    t.join(30)
    stream.close()
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], BinlogConnectionLost)


def test_check_binlog_config_names_each_wrong_variable() -> None:
    check_binlog_config(GOOD)
    bad = dict(GOOD, binlog_format="MIXED", binlog_row_metadata="MINIMAL")
    del bad["log_bin"]
    with pytest.raises(BinlogConfigError) as info:
        check_binlog_config(bad)
    msg = str(info.value)
    assert "binlog_format=MIXED" in msg
    assert "binlog_row_metadata=MINIMAL" in msg
    assert "log_bin=<missing>" in msg
    assert "binlog_row_image" not in msg


def test_real_server_config_checked(make_sandbox: Any) -> None:
    box = make_sandbox()
    check_server_config(box.primary.dsn())
    box.primary.execute("SET GLOBAL binlog_row_metadata = MINIMAL")
    with pytest.raises(BinlogConfigError, match="binlog_row_metadata=MINIMAL"):
        check_server_config(box.primary.dsn())
    with pytest.raises(BinlogConfigError):
        open_stream(box.primary.dsn(), 5107, gtid="0-1-1", blocking=False)
    box.stop()
    with warnings.catch_warnings():  # sockets the sandbox start leaked (see reader_fixtures)
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_no_tls_attempt_on_loopback_hosts(db: Sandbox) -> None:
    # pymysql's "preferred" TLS builds a CA-loaded SSL context per connection (tens of
    # ms each, several per new leader's start); on loopback it protects nothing
    for host in ("127.0.0.1", "127.0.0.5", "localhost", "::1"):
        assert binlog_stream._connection_kwargs({"host": host, "port": 1})["ssl_disabled"]
    assert "ssl_disabled" not in binlog_stream._connection_kwargs({"host": "db.example"})
    with binlog_stream.connect(db.primary.dsn()) as conn:
        assert conn.ssl is False


# -- table maps parsed once -----------------------------------------------------------------


def test_a_repeated_table_map_is_parsed_once_and_again_after_alter_table(db: Sandbox) -> None:
    name = "t_stream_table_maps"
    db.primary.execute(
        f"CREATE DATABASE IF NOT EXISTS {name}", f"DROP TABLE IF EXISTS {name}.t",
        f"CREATE TABLE {name}.t (id INT PRIMARY KEY, v VARCHAR(20))",
    )  # fmt: skip
    journal, offset = db.primary.master_status()
    db.primary.execute(*(f"INSERT INTO {name}.t VALUES ({i}, 'v{i}')" for i in range(3)))
    db.primary.execute(
        f"ALTER TABLE {name}.t ADD COLUMN w INT, MODIFY v VARCHAR(40) CHARACTER SET latin1",
        f"INSERT INTO {name}.t VALUES (3, 'x', 30)",
        f"INSERT INTO {name}.t VALUES (4, 'y', 40)",
    )
    stream = open_stream(
        db.primary.dsn(), 5108, journal=journal, offset=offset, blocking=False,
        only_events=[WriteRowsEvent],
    )  # fmt: skip
    events = [ev for ev in _drain(stream) if ev.schema == name]
    assert len(events) == 5
    # three transactions, three table maps of the same bytes: parsed once, the rows share
    # the first one's column objects (what RowsDecoder caches its codec by)
    first = events[0].columns
    assert events[1].columns is first and events[2].columns is first
    assert stream.table_maps.hits >= 3 and stream.table_maps.misses >= 2
    # ALTER TABLE: a table map of other bytes (a new table id), parsed afresh
    assert events[3].columns is not first and events[4].columns is events[3].columns
    assert [c.name for c in events[3].columns] == ["id", "v", "w"]
    assert [ev.rows[0]["values"] for ev in events] == [
        {"id": 0, "v": "v0"}, {"id": 1, "v": "v1"}, {"id": 2, "v": "v2"},
        {"id": 3, "v": "x", "w": 30}, {"id": 4, "v": "y", "w": 40},
    ]  # fmt: skip


def _table_map_packet(table_id: int, body: bytes, crc: bytes) -> bytes:
    header = struct.pack("<IBIIIH", 1, 0x13, 1, 19 + 6 + len(body) + 4, 999, 0)
    return b"\x00" + header + table_id.to_bytes(6, "little") + body + crc


def test_table_map_cache_forgets_on_other_bytes_under_the_same_id() -> None:
    stream = SimpleNamespace(table_map={}, _BinLogStreamReader__use_checksum=True)
    maps = binlog_stream._TableMaps(stream)
    assert not maps.see(_table_map_packet(7, b"\x00\x00db.t-int", b"AAAA"))  # to the library
    assert not maps.see(_table_map_packet(8, b"\x00\x00db.u-int", b"AAAA"))
    stream.table_map.update({7: "parsed t", 8: "parsed u"})  # as the library does
    # same body, other crc: dropped before the library (True)
    assert maps.see(_table_map_packet(7, b"\x00\x00db.t-int", b"BBBB"))
    assert maps.see(_table_map_packet(8, b"\x00\x00db.u-int", b"CCCC"))
    assert stream.table_map == {7: "parsed t", 8: "parsed u"} and maps.hits == 2
    del stream.table_map[8]  # a rotate empties the library's map: parsed again
    assert not maps.see(_table_map_packet(8, b"\x00\x00db.u-int", b"DDDD"))
    stream.table_map[8] = "parsed u"
    maps.see(_table_map_packet(7, b"\x00\x00db.t-varchar", b"DDDD"))  # same id, new metadata
    assert stream.table_map == {8: "parsed u"} and maps.misses == 4
    stream.table_map[7] = "parsed t-varchar"
    maps.see(_table_map_packet(7, b"\x00\x00db.t-int", b"EEEE"))  # the old bytes again
    assert stream.table_map == {8: "parsed u"} and maps.misses == 5
    rows = b"\x00" + struct.pack("<IBIIIH", 1, 0x1E, 1, 40, 999, 0) + (8).to_bytes(6, "little")
    maps.see(rows + bytes(15))  # not a table map: nothing dropped
    assert stream.table_map == {8: "parsed u"}
    unknown = SimpleNamespace(table_map={7: "kept", 8: "kept"})  # checksum use not known
    unsure = binlog_stream._TableMaps(unknown)
    for _ in range(2):
        unknown.table_map[7] = "parsed"
        unsure.see(_table_map_packet(7, b"\x00\x00db.t-int", b"AAAA"))
        assert unknown.table_map == {8: "kept"}  # never trusted: parsed every time
    assert unsure.hits == 0 and unsure.misses == 2


def _gtid_xid_fields(ev: Any) -> tuple[Any, ...]:
    common = (type(ev).__name__, ev.timestamp, ev.event_type, event_span(ev), ev.to_dict())
    if isinstance(ev, XidEvent):
        return (*common, ev.xid)
    return (*common, ev.gtid, ev.domain_id, ev.server_id, ev.gtid_seq_no, ev.flags)


def test_gtid_and_xid_events_made_without_the_library_equal_its_own(db: Sandbox) -> None:
    name = "t_stream_light"
    journal, offset = db.primary.master_status()
    _write_some(db, name)  # DDL (standalone GTIDs) and three transactions
    db.primary.execute(f"INSERT INTO {name}.t VALUES (7, 'x')")
    wanted = [MariadbGtidEvent, XidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent]
    ours = open_stream(
        db.primary.dsn(), 5109, journal=journal, offset=offset, blocking=False,
        only_events=wanted,
    )  # fmt: skip
    got = _drain(ours)
    library = BinLogStreamReader(
        connection_settings=binlog_stream._connection_kwargs(db.primary.dsn()),
        server_id=5110, blocking=False, only_events=wanted, is_mariadb=False,
        resume_stream=True, log_file=journal, log_pos=offset,
        pymysql_wrapper=binlog_stream._guarded_connect,  # (only renames its "db" keyword)
    )  # fmt: skip
    want = _drain(library)
    # every XID follows a rows event: read by the stream, not the library (whose own loop
    # reads on past an event not wanted, such as a DDL's query, and makes what follows)
    xids = [ev for ev in got if isinstance(ev, XidEvent)]
    assert len(xids) == 4 and all(isinstance(ev.packet, binlog_stream._Packet) for ev in xids)
    assert ours.light_events >= 6  # the XIDs and the GTIDs after them
    assert [type(ev) for ev in got] == [type(ev) for ev in want]
    pairs = [(a, b) for a, b in zip(got, want, strict=True) if not isinstance(a, RowsEvent)]
    assert [_gtid_xid_fields(a) for a, _ in pairs] == [_gtid_xid_fields(b) for _, b in pairs]
    assert {ev.flags & 1 for ev in got if isinstance(ev, MariadbGtidEvent)} == {0, 1}
    # rows events after a table map seen before are made here too: the same answers
    assert ours.light_rows >= 3 and ours.light_events >= 6 + ours.light_rows
    pairs = [(a, b) for a, b in zip(got, want, strict=True) if isinstance(a, RowsEvent)]
    assert [_rows_fields(a) for a, _ in pairs] == [_rows_fields(b) for _, b in pairs]
    rows = [ev.rows for ev in got if isinstance(ev, RowsEvent)]
    assert rows == [ev.rows for ev in want if isinstance(ev, RowsEvent)] and len(rows) == 4


def _rows_fields(ev: Any) -> tuple[Any, ...]:
    """What is asked of a rows event before its rows are read."""
    names = (
        "table_id", "schema", "table", "primary_key", "flags", "number_of_columns",
        "columns_present_bitmap", "event_type", "event_size", "timestamp", "complete",
    )  # fmt: skip
    second = getattr(ev, "columns_present_bitmap2", None)
    columns = [vars(c) for c in ev.columns]
    packet = ev.packet
    wrapper = (packet.read_bytes, packet.packet._position, packet.log_pos, packet.server_id)
    return (*(getattr(ev, n) for n in names), second, columns, wrapper, event_span(ev))


def _light_rows_workload(box: Sandbox, name: str) -> None:
    """Inserts, updates and deletes on a table of fast-path types, on one the generic
    path decodes (MariaDB's old TIME/DATETIME formats), an image without every column
    (MINIMAL) and a table map change (ALTER TABLE)."""
    fast = f"{name}.fast"
    box.primary.execute(
        f"CREATE DATABASE {name}",
        f"CREATE TABLE {fast} (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(10,2), "
        "t DATETIME(3), e ENUM('a','b'), s SET('x','y'), b BLOB, bits BIT(5), "
        "u BIGINT UNSIGNED NULL, f DOUBLE, y YEAR)",
        f"CREATE TABLE {name}.latin (id INT PRIMARY KEY, l VARCHAR(10) CHARACTER SET latin1)",
    )  # fmt: skip
    old = box.primary.scalar("SELECT @@GLOBAL.mysql56_temporal_format")
    try:
        box.primary.execute("SET GLOBAL mysql56_temporal_format = OFF")
        box.primary.execute(f"CREATE TABLE {name}.slow (id INT PRIMARY KEY, t TIME, dt DATETIME)")
    finally:
        box.primary.execute(f"SET GLOBAL mysql56_temporal_format = {int(old)}")
    for i in range(4):
        box.primary.execute(
            f"INSERT INTO {fast} VALUES ({i}, 'v{i}', {i}.25, '2024-01-0{i + 1} 10:00:00.123', "
            f"'a', 'x,y', x'00ff{i:02x}', b'101', NULL, 1.5, 2024)",
            f"INSERT INTO {name}.latin VALUES ({i}, 'caf\u00e9{i}')",
            f"INSERT INTO {name}.slow VALUES ({i}, '12:34:5{i}', '2020-02-02 01:02:0{i}')",
        )  # fmt: skip
    box.primary.execute(
        f"INSERT INTO {fast} (id, v) VALUES (10, 'a'), (11, 'b'), (12, NULL)",
        f"UPDATE {fast} SET v = 'w', u = 18446744073709551615 WHERE id < 3",
        f"UPDATE {name}.slow SET t = '23:59:59' WHERE id = 1",
        f"DELETE FROM {fast} WHERE id IN (1, 11)",
        f"DELETE FROM {name}.slow WHERE id = 2",
    )
    box.primary.execute(
        "SET SESSION binlog_row_image = MINIMAL", f"UPDATE {fast} SET v = 'm' WHERE id = 0"
    )
    box.primary.execute(
        f"ALTER TABLE {fast} ADD COLUMN z INT DEFAULT 7",
        f"INSERT INTO {fast} (id, v) VALUES (20, 'after')",
        f"INSERT INTO {fast} (id, v) VALUES (21, 'alter')",
        f"UPDATE {fast} SET z = 8 WHERE id = 20",
        f"DELETE FROM {fast} WHERE id = 21",
    )


def _assemble(box: Sandbox, start: EntryPosition, server_id: int) -> tuple[list[Entry], Any]:
    """Every entry of the binlog from ``start`` as the reader's assembler makes them, and
    the stream (its counts, and the row decoder's as ``decoder``)."""
    entries: list[Entry] = []
    asm = TransactionAssembler(entries.extend, start, "", 1000)
    stream = open_stream(
        box.primary.dsn(), server_id, journal=start.journal, offset=start.offset,
        blocking=False, only_events=EVENTS,
    )  # fmt: skip
    for ev in _drain(stream):
        asm.on_event(ev)
    stream.decoder = asm._decoder
    return entries, stream


def test_rows_events_made_without_the_library_give_the_same_entries(
    db: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, offset = db.primary.master_status()
    _light_rows_workload(db, "t_stream_light_rows")
    start = EntryPosition(journal=journal, offset=offset)
    light, ours = _assemble(db, start, 5111)
    monkeypatch.setattr(binlog_stream._MariadbStreamReader, "LIGHT_ROWS", False)
    library, theirs = _assemble(db, start, 5112)
    # every rows event after a table map seen before (all but each table id's first)
    assert ours.light_rows >= 15 and theirs.light_rows == 0
    # the light events went every way: packed by C, decoded to tuples (latin1), generic
    made = ours.decoder
    assert made.packed_events >= 8 and made.fast_events >= made.packed_events + 3
    assert made.generic_events >= 5  # the old temporal formats, the MINIMAL image
    assert len(light) == len(library) and len(light) > 50
    for a, b in zip(light, library, strict=True):
        assert a == b
        assert (a.header.offset, a.header.end_offset) == (b.header.offset, b.header.end_offset)
        assert a.position() == b.position()


def _offline_stream(table_map: dict[int, Any], post_header_lengths: Any = None) -> Any:
    """A MariaDB stream as ``_made_here`` sees it after its connect (no server)."""
    stream: Any = object.__new__(binlog_stream._MariadbStreamReader)
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mariadb")
    light = {code: cls for code, (cls, _) in binlog_stream._ROWS.items()}
    stream.__dict__.update({
        "_BinLogStreamReader__use_checksum": True, "skip_to_timestamp": None, "log_pos": 0,
        "light_rows": 0, "_ctl_connection": ctl, "mysql_version": (10, 11),
        "_BinLogStreamReader__post_header_lengths": post_header_lengths,
        "_BinLogStreamReader__enable_logging": False,
        "_BinLogStreamReader__use_column_name_cache": False,
        "_BinLogStreamReader__ignore_decode_errors": False, "_light": light,
        "table_map": table_map,
    })  # fmt: skip
    return stream


def _library_event(stream: Any, data: bytes) -> Any:
    wrapper = BinLogPacketWrapper(
        MysqlPacket(data, "utf8"), stream.table_map, stream._ctl_connection,
        stream.mysql_version, True, {cls for cls, _ in binlog_stream._ROWS.values()}, None, None,
        None, None, False, False, False, False, False, False,
        stream._BinLogStreamReader__post_header_lengths,
    )  # fmt: skip
    return wrapper.event


def _rows_packet(
    event_type: int, post: bytes, columns: int, bitmaps: bytes, table_id: int = 7
) -> bytes:
    body = table_id.to_bytes(6, "little") + post + bytes([columns]) + bitmaps + b"\x00\x2a\x00"
    header = struct.pack("<IBIIIH", 1700000000, event_type, 3, 19 + len(body) + 4, 4321, 0)
    return b"\x00" + header + body + b"CRC!"


_EXTRA = ("extra_data_length", "extra_data_type", "partition_id", "source_partition_id",
          "nbd_info_length", "nbd_info_format", "nbd_info", "extra_data")  # fmt: skip


def test_v1_and_v2_rows_events_made_from_packets_equal_the_librarys() -> None:
    columns = [SimpleNamespace(name="id"), SimpleNamespace(name="v")]
    table_map = {7: Table(7, "db", "t", columns, primary_key="id")}
    stream = _offline_stream(table_map)
    cases = [
        (0x17, b"\x01\x00"),  # v1 write
        (0x19, b"\x01\x00"),  # v1 delete
        (0x1E, b"\x01\x00\x02\x00"),  # v2 write without extra data
        (0x1E, b"\x01\x00\x05\x00\x01\x09\x00"),  # partition id
        (0x1F, b"\x01\x00\x07\x00\x01\x09\x00\x08\x00"),  # update: partition ids
        (0x20, b"\x01\x00\x07\x00\x00\x04\x05ab"),  # ndb information
        (0x20, b"\x01\x00\x06\x00\x05xyz"),  # another kind
    ]
    for event_type, post in cases:
        bitmaps = b"\x03\x03" if event_type in (0x18, 0x1F) else b"\x03"
        data = _rows_packet(event_type, post, 2, bitmaps)
        ours = stream._made_here(MysqlPacket(data, "utf8"))
        theirs = _library_event(stream, data)
        assert type(ours) is type(theirs), event_type
        assert _rows_fields(ours) == _rows_fields(theirs), event_type
        extra = [getattr(ours, n, None) for n in _EXTRA]
        assert extra == [getattr(theirs, n, None) for n in _EXTRA], event_type
        assert rowcodec.rows_body(ours) == rowcodec.rows_body(theirs) is not None
    assert stream.light_rows == len(cases)
    # left to the library: an image without every column, another column count, an
    # unknown table id, extra data longer than the event, a truncated packet, and (below)
    # a longer post-header declared
    left = [
        _rows_packet(0x17, b"\x01\x00", 2, b"\x01"),
        _rows_packet(0x1F, b"\x01\x00\x02\x00", 2, b"\x03\x02"),
        _rows_packet(0x17, b"\x01\x00", 3, b"\x07"),
        _rows_packet(0x17, b"\x01\x00", 2, b"\x03", table_id=8),
        _rows_packet(0x20, b"\x01\x00\x07\x00\x00\x09\x05ab", 2, b"\x03"),
        _rows_packet(0x20, b"\x01\x00\x07\x00\x00\x04\x05ab", 2, b"\x03")[:-8],
    ]
    for data in left:
        assert stream._made_here(MysqlPacket(data, "utf8")) is None, data.hex()
    longer = _offline_stream(table_map, post_header_lengths=[0] * 22 + [10, 10, 10])
    assert longer._made_here(MysqlPacket(_rows_packet(0x17, b"\x01\x00", 2, b"\x03"), "")) is None
    assert stream.light_rows == len(cases) and longer.light_rows == 0
