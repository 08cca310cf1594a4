"""Raw binlog events (bytes as MySQL or MariaDB wrote them) → mysql-replication event objects.

The network reader gets its events from mysql-replication's ``BinLogStreamReader``; a
binlog *file* (the local reader) and MySQL 8's compressed transactions need the same
event objects made from bytes. ``EventDecoder.decode(raw, start)`` does that, one event
(header + body + checksum) at a time, keeping what a stream keeps between events: the
format description (server version, post-header lengths, checksum algorithm) and the
table maps. The row events it returns are the library's own, so ``RowsDecoder`` and the
``TransactionAssembler`` handle them exactly as on the network path.

MySQL event types handled here:

- ``GTID_LOG_EVENT`` (33): the library's ``GtidEvent`` (``ev.gtid`` = ``uuid:n``).
- ``ANONYMOUS_GTID_LOG_EVENT`` (34): ``AnonymousGtidEvent`` (a transaction starts; no GTID).
- ``PREVIOUS_GTIDS_LOG_EVENT`` (35): ``PreviousGtidsEvent`` with ``gtids`` a ``GtidSet``
  (the library's text form of it is wrong).
- ``TRANSACTION_PAYLOAD_EVENT`` (40, ``binlog_transaction_compression``): the payload is
  decompressed (zstd, or none) and its events decoded in order; they carry no checksum
  and log_pos 0 in their headers, so each is given the payload event's own span (start
  and end offset): every entry of a compressed transaction points at its payload event,
  and its end (after the XID) is the payload's end. ``ev.packet.part`` numbers the events
  inside one payload 1, 2, ... (0 for every other event): the entries' ``part``, which
  orders them within the one position they share.
- ``PARTIAL_UPDATE_ROWS_EVENT`` (39, ``binlog_row_value_options=PARTIAL_JSON``): refused
  with a ``BinlogConfigError`` giving the reason (its after image holds JSON diffs, not
  the values; applying them is not implemented).
- ``ROWS_QUERY_LOG_EVENT`` (29), ``HEARTBEAT_LOG_EVENT`` (27, 41), and any type this
  decoder does not know (Aurora's 100, ...): returned as ``SkippedEvent`` (nothing to
  deliver, but the position moves past it).

Checksums (CRC32) are verified when the format description says they are on: a damaged
event is a ``BinlogError`` naming its offset, never a wrong value.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql.protocol
from pymysqlreplication import event as lib_event
from pymysqlreplication import row_event as lib_rows
from pymysqlreplication.packet import BinLogPacketWrapper

from canal_protocol.errors import BinlogConfigError, BinlogError
from canal_protocol.gtid import GtidSet

__all__ = [
    "HEADER_LEN",
    "AnonymousGtidEvent",
    "EventDecoder",
    "PreviousGtidsEvent",
    "SkippedEvent",
    "TableHook",
    "read_header",
]

HEADER_LEN = 19
_FDE, _ROTATE, _TABLE_MAP = 15, 4, 19
_GTID, _ANONYMOUS_GTID, _PREVIOUS_GTIDS = 33, 34, 35
_ROWS_QUERY, _HEARTBEAT, _HEARTBEAT_V2 = 29, 27, 41
_PARTIAL_UPDATE, _TRANSACTION_PAYLOAD = 39, 40
_ZSTD, _NO_COMPRESSION = 0, 255
_IN_USE = 0x1  # LOG_EVENT_BINLOG_IN_USE_F of a format description
_MAX_PAYLOAD = 1 << 30  # MySQL's max_allowed_packet ceiling: a larger size is corrupt data

# The library classes made from bytes here (the rest become SkippedEvent).
_LIBRARY_EVENTS = (
    lib_event.QueryEvent,
    lib_event.RotateEvent,
    lib_event.FormatDescriptionEvent,
    lib_event.XidEvent,
    lib_event.GtidEvent,
    lib_event.MariadbGtidEvent,
    lib_event.MariadbGtidListEvent,
    lib_event.HeartbeatLogEvent,
    lib_rows.TableMapEvent,
    lib_rows.WriteRowsEvent,
    lib_rows.UpdateRowsEvent,
    lib_rows.DeleteRowsEvent,
    lib_rows.PartialUpdateRowsEvent,
)

TableHook = Callable[[Any], None]  # called with every TableMapEvent before rows use it


@dataclass(frozen=True)
class Header:
    timestamp: int
    type: int
    server_id: int
    size: int
    log_pos: int
    flags: int


def read_header(raw: bytes, at: int = 0) -> Header:
    return Header(*struct.unpack_from("<IBIIIH", raw, at))


class _Span:
    """What ``binlog_stream.event_span`` reads of ``ev.packet``."""

    def __init__(self, header: Header, log_pos: int, size: int, part: int = 0) -> None:
        self.log_pos = log_pos
        self.event_size = size
        self.part = part  # 1, 2, ...: the event's place inside a transaction payload
        self.server_id = header.server_id
        self.timestamp = header.timestamp
        self.event_type = header.type


class _OwnEvent:
    """An event this module parses itself; ``packet`` holds its span."""

    def __init__(self, span: _Span) -> None:
        self.packet = span
        self.timestamp = span.timestamp
        self.event_type = span.event_type


class SkippedEvent(_OwnEvent):
    """An event with nothing to deliver (ROWS_QUERY, heartbeats, unknown types)."""


class AnonymousGtidEvent(_OwnEvent):
    """MySQL's ANONYMOUS_GTID_LOG_EVENT: a transaction starts (gtid_mode OFF)."""


class PreviousGtidsEvent(_OwnEvent):
    """MySQL's PREVIOUS_GTIDS_LOG_EVENT: every GTID in the binlogs before this file."""

    def __init__(self, span: _Span, gtids: GtidSet) -> None:
        super().__init__(span)
        self.gtids = gtids


class _Ctl:
    """What the library's events ask of their control connection."""

    charset = "utf8mb4"

    def __init__(self, dbms: str) -> None:
        self._dbms = dbms

    def _get_dbms(self) -> str:
        return self._dbms


def _previous_gtids(body: bytes) -> GtidSet:
    """n_sids (8) then per sid: uuid (16), n_intervals (8), [start (8), end+1 (8)]..."""
    (n,) = struct.unpack_from("<Q", body, 0)
    at, found = 8, {}
    for _ in range(n):
        h = body[at : at + 16].hex()
        (count,) = struct.unpack_from("<Q", body, at + 16)
        at += 24
        ivs = []
        for _ in range(count):
            start, stop = struct.unpack_from("<QQ", body, at)
            ivs.append((start, stop - 1))
            at += 16
        found[f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"] = ivs
    return GtidSet.of(found)


def _net_int(data: bytes, at: int) -> tuple[int, int]:
    """A length-encoded integer (MySQL's net_field_length) and the offset after it."""
    first = data[at]
    if first < 251:
        return first, at + 1
    size = {252: 2, 253: 3, 254: 8}.get(first)
    if size is None:
        raise BinlogError(f"bad length-encoded integer 0x{first:02x} in a payload header")
    return int.from_bytes(data[at + 1 : at + 1 + size], "little"), at + 1 + size


def _payload(body: bytes, where: str) -> bytes:
    """The inner events of a TRANSACTION_PAYLOAD_EVENT body (without its checksum)."""
    fields: dict[int, int] = {}
    at = 0
    while True:
        kind, at = _net_int(body, at)
        if kind == 0:
            break
        length, at = _net_int(body, at)
        fields[kind] = _net_int(body[at : at + length], 0)[0]  # the value is length-encoded too
        at += length
    compression = fields.get(2, _NO_COMPRESSION)
    size, raw_size = fields.get(1, len(body) - at), fields.get(3, 0)
    data = body[at : at + size]
    if compression == _NO_COMPRESSION:
        return data
    if compression != _ZSTD:
        raise BinlogError(
            f"{where}: transaction payload compressed with unknown type {compression}"
        )
    import zstandard  # the server extra's dependency; only compressed binlogs need it

    limit = raw_size if 0 < raw_size <= _MAX_PAYLOAD else _MAX_PAYLOAD
    try:
        out: bytes = zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise BinlogError(f"{where}: cannot decompress the transaction payload: {exc}") from exc
    if raw_size and len(out) != raw_size:
        raise BinlogError(f"{where}: payload is {len(out)} bytes, its header says {raw_size}")
    return out


class EventDecoder:
    """One binlog's events from bytes; see the module doc.

    ``dbms`` ("mysql" or "mariadb") picks the library's charset tables; ``on_table``
    sees every table map before the rows that use it (to fill in column names a
    MySQL 5.7 binlog does not carry). ``where`` names the file in errors.
    """

    def __init__(self, dbms: str = "mysql", on_table: TableHook | None = None) -> None:
        self._ctl = _Ctl(dbms)
        self._on_table = on_table
        self.table_map: dict[int, Any] = {}
        self.version: tuple[int, ...] = (5, 7, 0)
        self.version_text = ""
        self.checksum = False
        self._post_header: tuple[int, ...] | None = None
        self.described = False  # a format description was read
        self._where = ""

    def decode(self, raw: bytes, where: str = "", end: int | None = None) -> list[Any]:
        """The events of one raw event (several for a transaction payload). ``end``
        replaces the header's log_pos (a file reader knows the real offsets)."""
        self._where = where
        header = read_header(raw)
        if header.size != len(raw):
            raise BinlogError(f"{where}: event size {header.size} but {len(raw)} bytes given")
        if header.type == _FDE:
            return [self._format_description(raw, header, end)]
        if self.checksum:
            self._verify(raw, where)
        span = _Span(header, header.log_pos if end is None else end, header.size)
        if header.type == _TRANSACTION_PAYLOAD:
            return self._transaction_payload(raw, span, where)
        return self._one(raw, span, self.checksum)

    def _verify(self, raw: bytes, where: str) -> None:
        (want,) = struct.unpack_from("<I", raw, len(raw) - 4)
        if zlib.crc32(raw[:-4]) != want:
            raise BinlogError(f"{where}: CRC32 checksum mismatch (damaged binlog event)")

    def _format_description(self, raw: bytes, header: Header, end: int | None) -> Any:
        version = raw[HEADER_LEN + 2 : HEADER_LEN + 52].rstrip(b"\0").decode("ascii", "replace")
        numbers = tuple(int(x) for x in version.split("-")[0].split(".") if x.isdigit())
        aware = numbers >= (5, 6, 1) or numbers[:1] >= (10,)
        self.checksum = aware and raw[-5] == 1
        if self.checksum:  # computed with LOG_EVENT_BINLOG_IN_USE_F (still open) cleared
            flags = struct.unpack_from("<H", raw, 17)[0] & ~_IN_USE
            self._verify(raw[:17] + struct.pack("<H", flags) + raw[19:], "format description")
        ev = self._library(raw, self.checksum)
        if end is not None:
            ev.packet.log_pos = end
        self.version, self.version_text = numbers, version
        self._ctl = _Ctl("mariadb" if "mariadb" in version.lower() else "mysql")
        self._post_header = tuple(ev.post_header_len)
        self.described = True
        self.table_map = {}
        return ev

    def _transaction_payload(self, raw: bytes, span: _Span, where: str) -> list[Any]:
        body = raw[HEADER_LEN : len(raw) - (4 if self.checksum else 0)]
        inner = _payload(body, where)
        out: list[Any] = []
        at, part = 0, 0
        while at < len(inner):
            if len(inner) - at < HEADER_LEN:
                raise BinlogError(f"{where}: truncated event inside a transaction payload")
            h = read_header(inner, at)
            if h.size < HEADER_LEN or at + h.size > len(inner):
                raise BinlogError(f"{where}: bad event size {h.size} inside a transaction payload")
            event_raw = inner[at : at + h.size]
            part += 1
            inner_span = _Span(h, span.log_pos, span.event_size, part)
            out.extend(self._one(event_raw, inner_span, False))
            at += h.size
        return out

    def _one(self, raw: bytes, span: _Span, checksum: bool) -> list[Any]:
        kind = span.event_type
        if kind == _ANONYMOUS_GTID:
            return [AnonymousGtidEvent(span)]
        if kind == _PREVIOUS_GTIDS:
            end = len(raw) - (4 if checksum else 0)
            return [PreviousGtidsEvent(span, _previous_gtids(raw[HEADER_LEN:end]))]
        if kind == _PARTIAL_UPDATE:
            raise BinlogConfigError(
                f"{self._where}: a PARTIAL_UPDATE_ROWS_EVENT (binlog_row_value_options="
                "PARTIAL_JSON): its after image holds JSON diffs, not the row; canal needs "
                "full row images: set binlog_row_value_options='' on the server"
            )
        if kind in (_ROWS_QUERY, _HEARTBEAT_V2):
            return [SkippedEvent(span)]
        ev = self._library(raw, checksum)
        if ev is None:
            return [SkippedEvent(span)]
        ev.packet.log_pos, ev.packet.event_size = span.log_pos, span.event_size
        ev.packet.part = span.part
        if isinstance(ev, lib_rows.TableMapEvent):
            table = ev.get_table()
            self.table_map[ev.table_id] = table
            if self._on_table is not None:
                self._on_table(ev)
        elif isinstance(ev, lib_event.RotateEvent) and ev.timestamp:
            self.table_map = {}
        return [ev]

    def _library(self, raw: bytes, checksum: bool) -> Any:
        """The library's event object for ``raw`` (None: a type it does not parse)."""
        packet = pymysql.protocol.MysqlPacket(b"\x00" + raw, "utf8")
        wrapper = BinLogPacketWrapper(
            packet, self.table_map, self._ctl, self.version, checksum, _LIBRARY_EVENTS,
            None, None, None, None, False, False, False, True, False, False, self._post_header,
        )  # fmt: skip
        return wrapper.event
