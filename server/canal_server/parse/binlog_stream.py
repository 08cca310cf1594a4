"""The one place that opens a mysql-replication 1.0.17 binlog stream (MariaDB or MySQL).

Use ``open_stream`` to start reading, ``next_event`` to read (it translates the
library's errors into ours), ``event_span`` for an event's offsets and server id, and
``interrupt`` to end a blocked read from another thread.

Fixes of the library's behaviour, applied to the streams opened here only:

- **File/offset resume** uses ``is_mariadb=False, resume_stream=True`` (with
  ``is_mariadb=True`` and no ``auto_position`` the library ignores log_file/log_pos
  and starts at the oldest binlog). GTID events still arrive as ``MariadbGtidEvent``.
- **GTID resume** uses ``is_mariadb=True, auto_position=<gtid state>``. The library's
  MariaDB COM_BINLOG_DUMP declares a 14-byte payload but sends 15 (command 1 + pos 4
  + flags 2 + server id 4 + empty file name 4); the server then reads one byte too
  few, and at the end of a non-blocking dump resets the connection (2013), which the
  library answers by reconnecting from the original GTID forever.
  ``_MariadbStreamReader`` re-packs the header with the real payload length.
- **No silent reconnect.** On errors 2013/2006 the library closes the stream and
  reconnects from the constructor's position (duplicates). Every pymysql connection
  made here converts those errors into ``BinlogConnectionLost`` (not a pymysql
  error, so the library's ``except`` does not swallow it): the caller resumes from
  its own last committed position. No global of the library is changed.
- **Table maps parsed once.** MariaDB writes a TABLE_MAP event before the rows of every
  transaction; the library parses each one again (about 40% of a one-row transaction's
  CPU). The stream keeps the bodies its ``table_map`` was parsed from and drops, before
  the library sees it, a table map whose bytes its id was parsed from; any
  other table map (a new table id after ALTER TABLE, changed metadata) drops its id's
  entry first, so it is parsed afresh (``_TableMaps``).
- **GTID, XID and rows events made here.** A one-row transaction's three events; the
  library's packet wrapper and event objects for them cost more than all else done
  with them. ``_MariadbStreamReader.fetchone`` reads the packet and, for these types
  (when wanted), makes the library's own classes with the attributes their
  ``__init__`` sets (``gtid``, ``domain_id``, ``server_id``, ``gtid_seq_no``,
  ``flags``; ``xid``). A rows event (WRITE/UPDATE/DELETE, v1 and v2) is made so when
  its table id is in ``table_map``, its post-header of the usual length, every column
  in its images (FULL) and no table/schema filter or checksum check is set: the
  library's attributes (``table_id``, ``schema``, ``table``, ``primary_key`` (the
  ``Table``'s, not the dict ``Table.data`` builds per event), ``flags``, the v2 extra
  data, ``number_of_columns``, ``columns``, the present-columns bitmaps) and a real
  ``BinLogPacketWrapper`` (made without its constructor) over the packet, positioned
  at the rows: ``rowcodec.rows_body`` reads them in place, and ``ev.rows`` (the
  generic path) reads them as the library's own event would. Any other packet goes
  to the library as before (``LIGHT_ROWS = False``: every rows event does).

MySQL (the flavour is chosen at connect from ``SELECT VERSION()``: MariaDB's says
"-MariaDB"): ``_MysqlStreamReader`` uses the library's connection and dump commands
(``COM_BINLOG_DUMP`` at a file and offset, ``COM_BINLOG_DUMP_GTID`` through its
``auto_position`` at a GTID set) but decodes every event with ``EventDecoder``, the
decoder of the local binlog reader: MySQL 8's compressed transactions, anonymous GTID
and PREVIOUS_GTIDS events, which the library does not parse, and the refusal of
PARTIAL_JSON updates are then the same on both paths. ``check_server_config`` checks
what the flavour needs (``binlog_row_metadata=FULL`` on MySQL 8.0+, ``gtid_mode=ON``
for a GTID destination, no ``PARTIAL_JSON``; MySQL 5.7 is refused: its row events
carry no column names). ``binary_log_status`` asks ``SHOW BINARY LOG STATUS`` (MySQL
8.2+; 8.4 removed ``SHOW MASTER STATUS``) and falls back to the older statement.

TLS: a DSN's ``tls`` entry (``{"ca", "cert", "key", "verify_identity"}``, from the
config's ``db.tls.*``) becomes one ``ssl.SSLContext`` per distinct setting, given to
every connection made here (binlog dump, its control connection and every query):
TLS is then required and the server's certificate verified.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
import ssl
import struct
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent, RotateEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, UpdateRowsEvent, WriteRowsEvent

from canal_protocol.errors import (
    BinlogConfigError,
    BinlogConnectionLost,
    BinlogError,
    PurgedPosition,
)
from canal_server.parse import grants
from canal_server.parse.event_decoder import EventDecoder
from canal_server.parse.schema import SchemaTracker

__all__ = [
    "CONNECTION_LOST_CODES",
    "REQUIRED_VARIABLES",
    "EventSpan",
    "access_error",
    "binary_log_status",
    "check_binlog_config",
    "check_server_config",
    "connect",
    "event_span",
    "interrupt",
    "is_mysql",
    "next_event",
    "open_stream",
    "peek_stream",
    "server_version",
    "tls_context",
]

CONNECTION_LOST_CODES = frozenset({2006, 2013})
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236

# What canal needs (server variable → required value).
REQUIRED_VARIABLES: Mapping[str, str] = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}

_CONN_KEYS = ("host", "port", "user", "password", "connect_timeout", "read_timeout")
_HEADER_LEN = 19  # a binlog event's common header
_TABLE_MAP_EVENT = 0x13
_XID_EVENT = 0x10
_MARIADB_GTID_EVENT = 0xA2
_BODY: Mapping[type, int] = {XidEvent: 8, MariadbGtidEvent: 13}  # bytes read of the body
_ROWS_MIN_BODY = 9  # a rows event's table id, flags and column count, at the least
# rows events (v1: MariaDB's, v2: with extra data) → class, post-header length
_ROWS: Mapping[int, tuple[type, int]] = {
    0x17: (WriteRowsEvent, 8), 0x18: (UpdateRowsEvent, 8), 0x19: (DeleteRowsEvent, 8),
    0x1E: (WriteRowsEvent, 10), 0x1F: (UpdateRowsEvent, 10), 0x20: (DeleteRowsEvent, 10),
}  # fmt: skip


# -- connections -----------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def tls_context(
    ca: str | None, cert: str | None, key: str | None, verify_identity: bool
) -> ssl.SSLContext:
    """TLS required, the server's certificate verified against ``ca`` (else the
    system's CAs) and, with ``verify_identity``, its name against the host."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = verify_identity
    ctx.verify_mode = ssl.CERT_REQUIRED
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def _connection_kwargs(conn: Mapping[str, Any]) -> dict[str, Any]:
    """host/port/user/password (+ timeouts, TLS) of a DSN dict; other keys are dropped.

    With ``tls`` (``db.tls.*``) the connection verifies as configured. Without it, TLS is
    off for a loopback host: pymysql otherwise tries TLS ("preferred", without
    verification) and builds a default SSL context for every connection, loading the
    system's CA store: 30-100 ms per connection, several per new leader's start,
    protecting nothing on loopback. Other hosts keep pymysql's default."""
    kw = {k: conn[k] for k in _CONN_KEYS if k in conn}
    kw.setdefault("connect_timeout", 5)
    kw["charset"] = "utf8mb4"
    tls = conn.get("tls")
    if tls:
        kw["ssl"] = tls_context(tls["ca"], tls["cert"], tls["key"], bool(tls["verify_identity"]))
    elif _is_loopback(str(conn.get("host", ""))):
        kw["ssl_disabled"] = True
    return kw


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _guarded_connect(**kwargs: Any) -> pymysql.connections.Connection[Any]:
    """pymysql.connect whose connection-loss errors become BinlogConnectionLost.

    The library passes the deprecated ``db`` keyword for its control connection
    (a DeprecationWarning in pymysql 1.2); it is renamed to ``database`` here.
    """
    if "db" in kwargs:
        kwargs["database"] = kwargs.pop("db")
    connection = pymysql.connect(**kwargs)
    read_packet = connection._read_packet

    def guarded_read_packet(*args: Any, **kw: Any) -> Any:
        try:
            return read_packet(*args, **kw)  # type: ignore[no-untyped-call]
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in CONNECTION_LOST_CODES:
                raise BinlogConnectionLost(f"binlog connection lost: {exc}") from exc
            raise

    connection._read_packet = guarded_read_packet  # type: ignore[method-assign]
    return connection


def connect(conn: Mapping[str, Any], **extra: Any) -> pymysql.connections.Connection[Any]:
    """A plain autocommit connection (queries, config checks) from a DSN dict."""
    return pymysql.connect(**_connection_kwargs(conn), autocommit=True, **extra)


# -- the flavour ---------------------------------------------------------------------


def is_mysql(version: str) -> bool:
    """True for a MySQL server's ``VERSION()`` (MariaDB's says "MariaDB")."""
    return bool(version) and "mariadb" not in version.lower()


def _version_numbers(version: str) -> tuple[int, ...]:
    head = version.split("-")[0]
    return tuple(int(p) for p in head.split(".") if p.isdigit())


def server_version(conn: Mapping[str, Any]) -> str:
    """``SELECT VERSION()`` of the server at ``conn``."""
    with connect(conn) as c, c.cursor() as cur:
        cur.execute("SELECT VERSION()")
        row = cur.fetchone()
    return str(row[0]) if row else ""


binary_log_status = grants.binary_log_status


# -- server configuration ------------------------------------------------------------

_MYSQL_EXTRA = ("gtid_mode", "binlog_row_value_options")


def check_binlog_config(
    variables: Mapping[str, str], version: str = "", gtid_mode: bool = False
) -> None:
    """Raise BinlogConfigError naming every required variable that is wrong or missing.

    ``version`` (``SELECT VERSION()``) picks the flavour: MySQL 8.0+ needs
    ``binlog_row_metadata=FULL``, ``gtid_mode=ON`` when ``gtid_mode`` (GTID positions)
    is configured, and no ``binlog_row_value_options=PARTIAL_JSON``; MySQL before 8.0
    is refused (no column names in its row events)."""
    lowered = {k.lower(): str(v) for k, v in variables.items()}
    mysql = is_mysql(version)
    if mysql and _version_numbers(version) < (8, 0):
        raise BinlogConfigError(
            f"MySQL {version} has no binlog_row_metadata: its row events carry no column "
            "names and no signedness, which canal would have to guess; use MySQL 8.0.14+ "
            "with binlog_row_metadata=FULL, or read its binlog files with a local "
            "destination (local.dir + local.schema_file)"
        )
    wanted = dict(REQUIRED_VARIABLES)
    if mysql and gtid_mode:
        wanted["gtid_mode"] = "ON"
    wrong = []
    for name, want in wanted.items():
        got = lowered.get(name)
        if got is None or got.upper() != want:
            wrong.append(f"{name}={got if got is not None else '<missing>'} (need {want})")
    if mysql and "PARTIAL_JSON" in lowered.get("binlog_row_value_options", "").upper():
        wrong.append(
            "binlog_row_value_options=PARTIAL_JSON (need ''; its updates hold JSON diffs, "
            "not the row)"
        )
    if wrong:
        raise BinlogConfigError("binlog settings canal needs are wrong: " + ", ".join(wrong))


def access_error(exc: pymysql.err.MySQLError, conn: Mapping[str, Any]) -> BinlogConfigError | None:
    """A refused login (1045) or a missing privilege (1227) as the BinlogConfigError
    naming it (the operator must act: retrying the same way cannot help), else None."""
    code = exc.args[0] if exc.args else None
    where = f"{conn.get('host')}:{conn.get('port')}"
    if code == grants.ER_ACCESS_DENIED:
        return BinlogConfigError(
            f"{where} refused the database user: {exc.args[-1]} (wrong db.username or "
            "db.password, or the server requires TLS or a client certificate: db.tls.*)"
        )
    if code == grants.ER_SPECIFIC_ACCESS_DENIED:
        return BinlogConfigError(
            f"the database user lacks a privilege on {where}: {exc.args[-1]} (docs/security.md)"
        )
    return None


def check_server_config(conn: Mapping[str, Any], gtid_mode: bool = False) -> str:
    """Read the server's version, binlog variables and the user's grants, and check them
    (BinlogConfigError naming each wrong variable, a refused login, a missing grant).
    ``gtid_mode``: the destination reads by GTID (MySQL then needs ``gtid_mode=ON``).
    Returns the server's ``VERSION()``."""
    names = ", ".join(f"'{n}'" for n in (*REQUIRED_VARIABLES, *_MYSQL_EXTRA))
    try:
        with connect(conn) as c, c.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0])
            cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
            variables = {str(r[0]): str(r[1]) for r in cur.fetchall()}
            check_binlog_config(variables, version, gtid_mode)
            missing = grants.missing_grants(cur)
            if missing:
                raise grants.grants_error(cur, missing, f"{conn.get('host')}:{conn.get('port')}")
    except pymysql.err.MySQLError as exc:
        denied = access_error(exc, conn)
        if denied is None:
            raise
        raise denied from exc
    return version


# -- the stream ----------------------------------------------------------------------


class _TableMaps:
    """The TABLE_MAP body each entry of the stream's ``table_map`` was parsed from.

    ``see`` looks at every packet of the dump before the library does. A table map whose
    body (table id, names, column types, metadata; not the header nor the checksum, which
    differ per event) is the one its id's entry was parsed from leaves ``table_map`` as it
    is, and its packet never reaches the library (no wrapper and event objects for it; the
    stream also runs with ``freeze_schema``, so the library would skip an id it has): the
    rows keep the same ``Table``/column objects (what ``RowsDecoder`` caches by). Other
    bytes (a first sight, other metadata under an id; ALTER TABLE gives a new id) drop
    that id's entry first, so the library parses it afresh, as it would without the cache.
    A rotate empties ``table_map`` (the library): every id is then parsed again.
    """

    MAX_IDS = 4096  # bodies kept; more forgets them all (each id is then parsed once more)

    def __init__(self, stream: BinLogStreamReader) -> None:
        self._stream = stream
        self._bodies: dict[int, bytes] = {}
        self.hits = 0
        self.misses = 0

    def see(self, data: bytes) -> bool:
        """True for a table map whose body its id's entry was parsed from: nothing in it
        is new, so the packet need not reach the library at all."""
        if len(data) < 1 + _HEADER_LEN + 6 or data[0] != 0 or data[5] != _TABLE_MAP_EVENT:
            return False
        start = 1 + _HEADER_LEN
        table_id = int.from_bytes(data[start : start + 6], "little")  # as the library reads it
        checksum = getattr(self._stream, "_BinLogStreamReader__use_checksum", None)
        body = None
        if checksum is True or checksum is False:  # else the layout is unknown: never cached
            body = data[start : len(data) - (4 if checksum else 0)]
            if self._bodies.get(table_id) == body and table_id in self._stream.table_map:
                self.hits += 1
                return True
        self.misses += 1
        self._stream.table_map.pop(table_id, None)
        if body is None:
            self._bodies.pop(table_id, None)
            return False
        if len(self._bodies) >= self.MAX_IDS:
            self._bodies.clear()
        self._bodies[table_id] = body
        return False


_Header = tuple[int, int, int, int, int, int]  # timestamp, type, server id, size, end, flags


class _Packet:
    """What readers of a light event ask of ``ev.packet``: the header's fields (as
    ``event_span`` reads them) and ``read_bytes`` (the library's ``to_dict``)."""

    def __init__(self, header: _Header, read: int) -> None:
        self.timestamp, self.event_type, self.server_id = header[0], header[1], header[2]
        self.event_size, self.log_pos, self.flags = header[3], header[4], header[5]
        self.read_bytes = read


def _light_event(stream: Any, cls: type, header: _Header, body: int, packet: Any) -> Any:
    """An instance of the library's ``cls`` with the attributes its ``BinLogEvent``
    constructor sets, made without it; ``body``: the payload's size, ``packet``: a
    ``_Packet`` or a packet wrapper made here."""
    ev: Any = object.__new__(cls)
    ev.packet = packet
    ev.event_type, ev.timestamp, ev.event_size = header[1], header[0], body
    ev.table_map, ev.complete, ev._processed, ev.dbms = stream.table_map, True, True, "mariadb"
    ev._ctl_connection, ev.mysql_version = stream._ctl_connection, stream.mysql_version
    ev._post_header_lengths = ev._is_event_valid = None
    ev._ignore_decode_errors = ev._verify_checksum = False
    return ev


def _wrapper(stream: Any, packet: Any, header: _Header, read: int) -> Any:
    """The library's packet wrapper of a rows event's ``packet`` (positioned after the
    bytes read: ``read`` of the body, the library's count), without its constructor,
    which would parse the event: ``ev.rows`` (the generic path) reads on from it."""
    wrapper: Any = object.__new__(BinLogPacketWrapper)
    wrapper.read_bytes, wrapper._BinLogPacketWrapper__data_buffer = read, b""
    wrapper.packet, wrapper.charset = packet, stream._ctl_connection.charset
    wrapper.enable_logging = stream._BinLogStreamReader__enable_logging
    wrapper.use_column_name_cache = stream._BinLogStreamReader__use_column_name_cache
    wrapper.timestamp, wrapper.event_type, wrapper.server_id = header[0], header[1], header[2]
    wrapper.event_size, wrapper.log_pos, wrapper.flags = header[3], header[4], header[5]
    return wrapper


def _extra_data(ev: Any, data: bytes, pos: int, length: int) -> int:
    """A v2 rows event's extra data read into ``ev`` as the library reads it (``pos``:
    after its length); the position after it, or -1 when the library's reading fails."""
    if length <= 2:
        return pos
    ev.extra_data_type = kind = data[pos]
    pos += 1
    if kind == 0:
        size = ev.nbd_info_length = data[pos]
        ev.nbd_info_format = data[pos + 1]
        if size < 2:
            return -1
        ev.nbd_info = data[pos + 2 : pos + size]
        return pos + size
    if kind == 1:
        if ev.event_type == 0x1F:
            ev.partition_id, ev.source_partition_id = struct.unpack_from("<HH", data, pos)
            return pos + 4
        (ev.partition_id,) = struct.unpack_from("<H", data, pos)
        return pos + 2
    if length < 3:
        return -1
    ev.extra_data = data[pos : pos + length - 3]
    return pos + length - 3


def _column_count(data: bytes, pos: int) -> tuple[int, int]:
    """The length-coded column count at ``pos`` and the position after it ((-1, -1):
    a form the light path leaves to the library)."""
    first = data[pos]
    if first < 251:
        return first, pos + 1
    if first == 252:
        return int.from_bytes(data[pos + 1 : pos + 3], "little"), pos + 3
    return -1, -1


class _MariadbStreamReader(BinLogStreamReader):  # type: ignore[misc]
    """BinLogStreamReader with the MariaDB GTID dump length corrected, table maps
    parsed once per distinct body, and GTID, XID and rows events made here (see module
    doc)."""

    LIGHT_ROWS = True  # rows events made here too (off: the library makes them all)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(freeze_schema=True, **kwargs)
        self.table_maps = _TableMaps(self)
        self._held: Any = None  # a packet read by ``fetchone`` for the library to wrap
        allowed = self._BinLogStreamReader__allowed_events_in_packet
        light = [(_XID_EVENT, XidEvent), (_MARIADB_GTID_EVENT, MariadbGtidEvent)]
        if self.LIGHT_ROWS and not self._rows_filtered():
            light += [(code, cls) for code, (cls, _) in _ROWS.items()]
        self._light = {code: cls for code, cls in light if cls in allowed}
        self.light_events = 0  # of them rows events: light_rows
        self.light_rows = 0

    def _rows_filtered(self) -> bool:
        """Options under which the library's rows events do more than read the packet
        (table or schema filters, checksum checks): rows events are then all its own."""
        names = ("only_tables", "ignored_tables", "only_schemas", "ignored_schemas")
        if any(getattr(self, f"_BinLogStreamReader__{n}") is not None for n in names):
            return True
        return bool(self._BinLogStreamReader__verify_checksum)

    def _BinLogStreamReader__set_mariadb_settings(self) -> bytes:
        prelude: bytes = super()._BinLogStreamReader__set_mariadb_settings()
        return _fix_dump_length(prelude)

    def _BinLogStreamReader__connect_to_stream(self) -> None:
        super()._BinLogStreamReader__connect_to_stream()
        connection = self._stream_connection
        read_packet, see = connection._read_packet, self.table_maps.see

        def read_dump_packet(*args: Any, **kw: Any) -> Any:
            packet, self._held = self._held, None
            if packet is not None:
                return packet
            packet = read_packet(*args, **kw)
            while see(packet.get_all_data()):  # a table map known already: next packet
                packet = read_packet(*args, **kw)
            return packet

        connection._read_packet = read_dump_packet

    def fetchone(self) -> Any:
        """The library's, except that a GTID or XID event (two of a small transaction's
        three events) is made here from the packet: the library's wrapper and event
        objects cost more than the rest of such an event's handling."""
        ready = self._BinLogStreamReader__connected_stream and self._light
        if ready and self._BinLogStreamReader__connected_ctl and not self.end_log_pos:
            packet = self._stream_connection._read_packet()
            ev = self._made_here(packet)
            if ev is not None:
                self.light_events += 1
                return ev
            self._held = packet  # the library reads it next
        return super().fetchone()

    def _made_here(self, packet: Any) -> Any:
        """A GTID, XID or rows event of an OK packet (None: the library's to make)."""
        data = packet.get_all_data()
        if len(data) < 1 + _HEADER_LEN + 8 or data[0] != 0:
            return None
        cls = self._light.get(data[5])
        if cls is None or self.skip_to_timestamp:
            return None
        header: _Header = struct.unpack_from("<IBIIIH", data, 1)
        checksum = self._BinLogStreamReader__use_checksum
        body = header[3] - _HEADER_LEN - (4 if checksum else 0)
        if (
            header[3] != len(data) - 1
            or not isinstance(checksum, bool)
            or body < _BODY.get(cls, _ROWS_MIN_BODY)
        ):
            return None  # not one whole event, or the layout is unknown: the library's
        if cls in _BODY:
            ev = self._made_small(data, header, cls, body)
        else:
            try:
                ev = self._made_rows(packet, header, cls, body)
            except (IndexError, struct.error):
                return None  # truncated: the library's (which raises what it raises)
            if ev is None:
                return None
            self.light_rows += 1
        if header[4]:
            self.log_pos = header[4]
        return ev

    def _made_small(self, data: bytes, header: _Header, cls: type, body: int) -> Any:
        """A GTID or XID event from its packet's bytes."""
        ev = _light_event(self, cls, header, body, _Packet(header, _BODY[cls]))
        if cls is XidEvent:
            (ev.xid,) = struct.unpack_from("<Q", data, 1 + _HEADER_LEN)
            return ev
        seq, domain, flags = struct.unpack_from("<QIB", data, 1 + _HEADER_LEN)
        ev.server_id, ev.gtid_seq_no, ev.domain_id, ev.flags = header[2], seq, domain, flags
        ev.gtid = f"{domain}-{header[2]}-{seq}"
        return ev

    def _made_rows(self, packet: Any, header: _Header, cls: type, body: int) -> Any:
        """A rows event as the library's constructor makes it, when its table id is in
        ``table_map``, the post-header of the usual length and every column in every
        image (FULL); the packet positioned at the rows (None: the library's to make)."""
        data, start = packet.get_all_data(), 1 + _HEADER_LEN
        table_id = int.from_bytes(data[start : start + 6], "little")
        table, post = self.table_map.get(table_id), _ROWS[header[1]][1]
        if table is None or self._post_header_len(header[1], post) != post:
            return None
        ev = _light_event(self, cls, header, body, None)
        ev.table_id, ev.primary_key = table_id, table.primary_key
        ev.schema, ev.table, ev.columns = table.schema, table.table, table.columns
        if post == 8:
            (ev.flags,), pos = struct.unpack_from("<H", data, start + 6), start + 8
        else:
            ev.flags, ev.extra_data_length = struct.unpack_from("<HH", data, start + 6)
            pos = _extra_data(ev, data, start + 10, ev.extra_data_length)
        n, pos = _column_count(data, pos) if pos >= 0 else (-1, -1)
        if n < 0 or n != len(ev.columns):
            return None
        width, full = (n + 7) // 8, (1 << n) - 1
        bitmaps = 2 if cls is UpdateRowsEvent else 1
        if pos + bitmaps * width > start + body:
            return None
        for i in range(bitmaps):
            bitmap = data[pos : pos + width]
            if int.from_bytes(bitmap, "little") & full != full:
                return None  # an image without every column: the library's
            setattr(ev, "columns_present_bitmap2" if i else "columns_present_bitmap", bitmap)
            pos += width
        ev.number_of_columns = n
        ev._RowsEvent__rows = ev._RowsEvent__only_tables = ev._RowsEvent__ignored_tables = None
        ev._RowsEvent__only_schemas = ev._RowsEvent__ignored_schemas = None
        ev._RowsEvent__use_column_name_cache = self._BinLogStreamReader__use_column_name_cache
        ev._RowsEvent__enable_logging = self._BinLogStreamReader__enable_logging
        ev._RowsEvent__none_sources = {}
        ev._post_header_lengths = self._BinLogStreamReader__post_header_lengths
        ev._ignore_decode_errors = self._BinLogStreamReader__ignore_decode_errors
        packet._position = pos
        ev.packet = _wrapper(self, packet, header, pos - start)
        ev.packet.event = ev
        return ev

    def _post_header_len(self, event_type: int, default: int) -> int:
        """The post-header length the format description declares (the library's rule)."""
        lengths = self._BinLogStreamReader__post_header_lengths
        index = event_type - 1
        if not lengths or index < 0 or index >= len(lengths):
            return default
        return int(lengths[index])


def _fix_dump_length(prelude: bytes) -> bytes:
    """Re-pack the 3-byte length (+ sequence id 0) with the real payload length."""
    payload = prelude[4:]
    return struct.pack("<i", len(payload)) + payload


def open_stream(
    conn: Mapping[str, Any],
    server_id: int,
    *,
    journal: str | None = None,
    offset: int | None = None,
    gtid: str | None = None,
    blocking: bool = True,
    only_events: Iterable[type] | None = None,
    heartbeat_s: float | None = None,
    check_config: bool = True,
    gtid_mode: bool = False,
) -> BinLogStreamReader:
    """Open a binlog stream at ``journal``/``offset`` or at the GTID state ``gtid``
    (MariaDB's ``domain-server-seq`` list, or a MySQL GTID set).

    ``server_id`` is our replication slave id (must differ from every server's and
    other readers'). The stream connects lazily at the first ``next_event``. With
    ``heartbeat_s`` the master sends heartbeats while idle and the socket read times
    out after three missed ones (BinlogConnectionLost). ``gtid_mode``: the destination
    reads by GTID (checked at start on MySQL). The flavour is the server's (its
    ``VERSION()``, asked here).
    """
    if (journal is None) == (gtid is None):
        raise ValueError("give exactly one of journal (+ offset) or gtid")
    if check_config:
        version = check_server_config(conn, gtid_mode=gtid_mode or gtid is not None)
    else:
        version = _guarded(conn, lambda: server_version(conn))
    mysql = is_mysql(version)
    settings = _connection_kwargs(conn)
    if heartbeat_s:
        settings["read_timeout"] = max(3 * heartbeat_s, 1.0)
    common: dict[str, Any] = {
        "connection_settings": settings,
        "server_id": server_id,
        "blocking": blocking,
        "only_events": list(only_events) if only_events is not None else None,
        "slave_heartbeat": heartbeat_s,
        "pymysql_wrapper": _guarded_connect,
        "enable_logging": False,
        "use_column_name_cache": False,
    }
    if mysql and gtid is not None:
        return _MysqlStreamReader(is_mariadb=False, auto_position=gtid, **common)
    if mysql:
        return _MysqlStreamReader(
            is_mariadb=False, resume_stream=True, log_file=journal, log_pos=offset or 4, **common
        )
    if gtid is not None:
        return _MariadbStreamReader(is_mariadb=True, auto_position=gtid, **common)
    return _MariadbStreamReader(
        is_mariadb=False, resume_stream=True, log_file=journal, log_pos=offset or 4, **common
    )


@contextlib.contextmanager
def peek_stream(conn: Mapping[str, Any], server_id: int, **where: Any) -> Iterator[Any]:
    """A non-blocking stream (``open_stream`` without the server checks) for a look into
    the binlog (the finder's searches, GTID states), closed when the block ends."""
    stream = open_stream(conn, server_id, blocking=False, check_config=False, **where)
    try:
        yield stream
    finally:
        stream.close()


def _guarded(conn: Mapping[str, Any], query: Any) -> Any:
    """A query made before the dump, its errors translated like ``next_event``'s."""
    try:
        return query()
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args else None
        if code in CONNECTION_LOST_CODES:
            raise BinlogConnectionLost(f"binlog connection lost: {exc}") from exc
        denied = access_error(exc, conn)
        if denied is not None:
            raise denied from exc
        raise


class _MysqlStreamReader(BinLogStreamReader):  # type: ignore[misc]
    """The library's MySQL dump (connection, checksum and heartbeat settings, the dump
    command), its events decoded by ``EventDecoder`` (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        wanted = kwargs.get("only_events")
        super().__init__(*args, **kwargs)
        self._wanted = tuple(wanted) if wanted is not None else None
        # a table map without column names (binlog_row_metadata=MINIMAL when it was
        # written) is refused, never delivered with guessed names
        rows = wanted is None or any(issubclass(w, RowsEvent) for w in wanted)
        self._decoder = EventDecoder("mysql", on_table=SchemaTracker().fill if rows else None)
        self._pending: deque[Any] = deque()
        self._journal = str(kwargs.get("log_file") or "")  # names the file in errors

    def fetchone(self) -> Any:
        while True:
            if self._pending:
                return self._pending.popleft()
            if not self._BinLogStreamReader__connected_stream:
                self._BinLogStreamReader__connect_to_stream()
                self._decoder.checksum = bool(self._BinLogStreamReader__use_checksum)
            packet = self._stream_connection._read_packet()
            if packet.is_eof_packet():
                self.close()
                return None
            if not packet.is_ok_packet():
                continue
            raw = packet.get_all_data()[1:]
            for ev in self._decoder.decode(raw, self._journal):
                if isinstance(ev, RotateEvent):
                    self._journal = str(ev.next_binlog)
                if self._wanted is None or isinstance(ev, self._wanted):
                    self._pending.append(ev)


def next_event(stream: BinLogStreamReader) -> Any:
    """The next event (None at the end of a non-blocking stream), errors translated.

    Raises BinlogConnectionLost on a broken connection, PurgedPosition on errno 1236
    (bad start: purged or unknown file/GTID, offset inside an event), BinlogConfigError
    on a refused login or a missing privilege, BinlogError on other server errors.
    """
    try:
        return stream.fetchone()
    except BinlogConnectionLost:
        raise
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args else None
        if code == ER_MASTER_FATAL_ERROR_READING_BINLOG:
            raise PurgedPosition(f"cannot start the binlog dump there: {exc}") from exc
        if code in CONNECTION_LOST_CODES:
            raise BinlogConnectionLost(f"binlog connection lost: {exc}") from exc
        settings = getattr(stream, "_BinLogStreamReader__connection_settings", {})
        denied = access_error(exc, settings)
        if denied is not None:
            raise denied from exc
        raise BinlogError(f"binlog read failed: {exc}") from exc
    except (OSError, struct.error) as exc:
        raise BinlogConnectionLost(f"binlog connection lost: {exc!r}") from exc


def interrupt(stream: BinLogStreamReader) -> None:
    """End a (possibly blocked) read from another thread; never blocks.

    Shuts the stream's socket down: a read blocked in ``next_event`` wakes with
    BinlogConnectionLost. Call ``stream.close()`` afterwards from the reading thread.
    """
    connection = getattr(stream, "_stream_connection", None)
    sock: socket.socket | None = getattr(connection, "_sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# -- positions of events --------------------------------------------------------------


class EventSpan(NamedTuple):
    """Where an event lies: ``start`` (what SHOW BINLOG EVENTS calls Pos), ``end``
    (End_log_pos, where the next event starts), the origin ``server_id``,
    ``timestamp`` (s), ``artificial`` (fake Rotate, or sent with log_pos 0) and ``part``
    (1, 2, ...: its place inside a MySQL transaction payload that spans start..end; 0
    for an event of its own, ``EventDecoder``). A named tuple, not a dataclass: one is
    made per binlog event, and a frozen dataclass costs several times more to build."""

    start: int
    end: int
    server_id: int
    timestamp: int
    artificial: bool
    part: int = 0


def event_span(ev: Any) -> EventSpan:
    """Offsets of an event: end = header log_pos; start = end - event_size.

    ``event_size`` in the event header counts the whole event: the 19-byte header,
    the body and the 4-byte checksum, so ``end - event_size`` is the start. Events the
    server makes up for the dump (the first RotateEvent with timestamp 0, a format
    description resent mid-file) carry log_pos 0: they are ``artificial``.
    """
    packet = ev.packet
    end = int(packet.log_pos)
    size = int(packet.event_size)
    artificial = end == 0 or int(ev.timestamp) == 0
    start = end - size if end >= size and not artificial else end
    part = int(packet.__dict__.get("part", 0))  # the library's __getattr__ raises slowly
    return EventSpan(start, end, int(packet.server_id), int(ev.timestamp), artificial, part)
