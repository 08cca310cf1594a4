"""Fast, exact decoding of the row images of rows events (per table, C or generated Python).

``decoding`` is the reference: mysql-replication reads every value through a generic
per-value reader, ``decoding.row_changes`` converts it. This module gives the same
values (same Python type and value, for every type it supports) much faster:

- ``table_codec(columns)`` builds a ``TableCodec`` for one table map (None when a
  column type has no fast decoder: the caller keeps the generic path). Build it once
  per table-map version and reuse it for every rows event of that table.
- ``rows_body(ev)`` finds the still unread row data of a mysql-replication RowsEvent
  (``(data, pos, end)``) without consuming anything, or None when the fast path does
  not apply (partial JSON update, an image without every column, rows already read...).
- ``TableCodec.decode(data, pos, end, images_per_row)`` decodes every row image of the
  body into value tuples (UPDATE: before, after, before, after...). Truncated or corrupt
  data raises ``RowDecodeError``; nothing is read outside ``data[pos:end]``.
- ``TableCodec.decode_packed(data, pos, end, images_per_row, side)`` writes the same
  images straight to msgpack (``before``/``after`` bytes, byte-identical to
  ``msgpack.packb`` of ``decode``'s tuples), in C, without a Python object per value,
  the GIL released for large bodies; None when it cannot (``packable`` false, or a
  value only the reference decodes): the caller uses ``decode`` then.

Releasing the GIL costs the caller up to the interpreter's switch interval (5 ms) to
get it back whenever another thread is busy running Python: it waits for that thread
to hand over. A rows event is about 8 KB (``binlog_row_event_max_size``), packed in
~20 us, so releasing it per event lets a busy thread starve the reader (measured against
a pure-Python thread: 1.9M -> 22k rows/s, benchmarks/bench_rowcodec.py). By default
``decode_packed`` releases the GIL only for bodies of ``NOGIL_MIN_BYTES`` or more,
where the work is worth that wait.

Two implementations give the same values: the C extension ``canal_server.parse._rowcodec``
(used when it is importable, unless ``CANAL_ROWCODEC=python``) and, per table, Python
source generated for that table's columns (a loop over row images, one null-bitmap
test per image, merged ``struct`` reads for runs of fixed-width columns, inline code
per column type). Values the fast code does not format itself (years before 1000,
out-of-range fields of corrupt data, ...) are decoded by the reference's own reader
on that value's bytes (``_reference_value``), so they can never differ.

Text: the library decodes CHAR/VARCHAR/TEXT with the column's charset (utf8mb3/utf8mb4
as UTF-8, latin1 as cp1252, ...), strictly; charsets Python does not know stay bytes
and ``decoding`` decodes them as UTF-8. The same is done here (a byte sequence the
codec rejects is a RowDecodeError, where the reference raises UnicodeDecodeError; the
library's ``ignore_decode_errors`` option is not followed: ``open_stream`` leaves it off).
"""

from __future__ import annotations

import codecs
import datetime
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import pymysql.protocol
from pymysqlreplication.constants import BINLOG, FIELD_TYPE
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import RowsEvent

from canal_protocol.entry import Value
from canal_protocol.errors import RowDecodeError
from canal_server.parse import decoding

try:
    from canal_server.parse import _rowcodec

    HAVE_NATIVE = True
except ImportError:  # the C extension is not built: the generated Python is used
    HAVE_NATIVE = False
# an extension built before decode_packed existed has no pack()
_HAVE_PACK = HAVE_NATIVE and hasattr(_rowcodec, "pack")

__all__ = [
    "EMPTY_IMAGES", "ENV", "HAVE_NATIVE", "NOGIL_MIN_BYTES", "Packed", "Row", "Side",
    "TableCodec", "decoder_name", "rows_body", "table_codec",
]  # fmt: skip

Row = tuple[Value, ...]
Side = Literal["before", "after"]
Packed = tuple[int, bytes, bytes]  # (rows, before, after): see TableCodec.decode_packed
EMPTY_IMAGES = b"\x90"  # msgpack.packb([]): the side a rows event has no images on
NOGIL_MIN_BYTES = 1 << 20  # decode_packed releases the GIL for bodies this long (see above)

# Column kinds; the same numbers are in _rowcodec.c.
(_K_I8, _K_U8, _K_I16, _K_U16, _K_I24, _K_U24, _K_I32, _K_U32, _K_I64, _K_U64, _K_FLOAT, _K_DOUBLE,
 _K_DECIMAL, _K_DATE, _K_TIME2, _K_DATETIME2, _K_TIMESTAMP2, _K_YEAR, _K_UTF8, _K_BYTES, _K_ENUM,
 _K_SET, _K_BIT) = range(1, 24)  # fmt: skip

_INT_KINDS = {
    FIELD_TYPE.TINY: _K_I8,
    FIELD_TYPE.SHORT: _K_I16,
    FIELD_TYPE.INT24: _K_I24,
    FIELD_TYPE.LONG: _K_I32,
    FIELD_TYPE.LONGLONG: _K_I64,
}
_SIMPLE_KINDS = {
    FIELD_TYPE.FLOAT: _K_FLOAT,
    FIELD_TYPE.DOUBLE: _K_DOUBLE,
    FIELD_TYPE.DATE: _K_DATE,
    FIELD_TYPE.YEAR: _K_YEAR,
}
_TEMPORAL_KINDS = {
    FIELD_TYPE.TIME2: _K_TIME2,
    FIELD_TYPE.DATETIME2: _K_DATETIME2,
    FIELD_TYPE.TIMESTAMP2: _K_TIMESTAMP2,
}
_ROWS_EVENTS = frozenset({
    BINLOG.WRITE_ROWS_EVENT_V1, BINLOG.UPDATE_ROWS_EVENT_V1, BINLOG.DELETE_ROWS_EVENT_V1,
    BINLOG.WRITE_ROWS_EVENT_V2, BINLOG.UPDATE_ROWS_EVENT_V2, BINLOG.DELETE_ROWS_EVENT_V2,
})  # fmt: skip
_UPDATE_EVENTS = frozenset({BINLOG.UPDATE_ROWS_EVENT_V1, BINLOG.UPDATE_ROWS_EVENT_V2})
ENV = "CANAL_ROWCODEC"  # "python" forces the generated Python decoder


# -- per-column plan ----------------------------------------------------------------


@dataclass(frozen=True)
class _Col:
    """How one column's values are stored: kind and its parameters.

    ``a``: fsp (temporal), precision (decimal), length-prefix size (strings), pack
    size (enum/set), bytes (bit). ``b``: scale (decimal), pad length
    (BINARY(n)), kept bits (bit). ``values``: ENUM values (index 0 is "") or SET
    members. ``encoding``: a text codec other than UTF-8 (C returns bytes, decoded after).
    """

    kind: int
    a: int = 0
    b: int = 0
    values: tuple[str, ...] = ()
    encoding: str = ""


def _text_plan(col: Any, kind_t: int, prefix: int) -> _Col | None:
    """CHAR/VARCHAR/TEXT/BINARY/VARBINARY/BLOB as the library + decoding convert them."""
    name = col.character_set_name
    codec: str | None = "utf-8"
    encoding = ""
    if name is not None:
        encoding = str(RowsEvent.charset_to_encoding(name))
        try:
            codec = codecs.lookup(encoding).name
        except LookupError:
            codec = None  # the library keeps the bytes
    if col.collation_name == "binary":
        if codec is not None:
            return None  # the library would return text here: not handled
        pad = int(col.max_length) if kind_t == FIELD_TYPE.STRING else 0
        return _Col(_K_BYTES, prefix, pad)
    if codec is None or codec == "utf-8":
        return _Col(_K_UTF8, prefix)
    return _Col(_K_BYTES, prefix, 0, encoding=encoding)


def _bit_plan(col: Any) -> _Col | None:
    nbytes, bits = int(col.bytes), int(col.bits)
    if not 1 <= nbytes <= 8:
        return None
    end = bits if nbytes == 1 else (bits % 8 or 8)
    return _Col(_K_BIT, nbytes, end + 8 * (nbytes - 1))


def _enum_set_plan(col: Any, t: int) -> _Col | None:
    size = int(col.size)
    if t == FIELD_TYPE.ENUM:
        values = col.enum_values
        if not values or size not in (1, 2) or not all(isinstance(v, str) for v in values):
            return None
        return _Col(_K_ENUM, size, 0, tuple(values))
    members = list(col.set_values or [])
    if not 1 <= size <= 8 or len(set(members)) != len(members) or len(members) > 64:
        return None
    if not all(isinstance(m, str) for m in members):
        return None
    return _Col(_K_SET, size, 0, tuple(members))


def _utf8_values(plan: _Col | None) -> _Col | None:
    """ENUM/SET values must be valid UTF-8 text (the C decoder keeps them as UTF-8)."""
    try:
        for v in plan.values if plan else ():
            v.encode()
    except UnicodeEncodeError:
        return None
    return plan


def _plan_column(col: Any) -> _Col | None:
    """The plan of one table-map column; None when it has no fast decoder."""
    t = col.type
    if t in _INT_KINDS:
        return _Col(_INT_KINDS[t] + (1 if col.unsigned else 0))
    if t in _SIMPLE_KINDS:
        return _Col(_SIMPLE_KINDS[t])
    if t in _TEMPORAL_KINDS:
        fsp = col.fsp
        return _Col(_TEMPORAL_KINDS[t], fsp) if isinstance(fsp, int) and 0 <= fsp <= 6 else None
    if t == FIELD_TYPE.NEWDECIMAL:
        prec, scale = int(col.precision), int(col.decimals)
        return _Col(_K_DECIMAL, prec, scale) if 0 <= scale <= prec <= 65 and prec else None
    if t in (FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR):
        return _text_plan(col, t, 2 if col.max_length > 255 else 1)
    if t in (FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY):
        size = int(col.length_size)
        if not 1 <= size <= 4:
            return None
        return _Col(_K_BYTES, size) if t == FIELD_TYPE.GEOMETRY else _text_plan(col, t, size)
    if t in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        return _utf8_values(_enum_set_plan(col, t))
    if t == FIELD_TYPE.BIT:
        return _bit_plan(col)
    return None


def _plan(columns: Sequence[Any]) -> tuple[_Col, ...] | None:
    names = [c.name for c in columns]
    if not names or not all(isinstance(n, str) and n for n in names):
        return None  # the library keys values by name: unnamed columns are not handled
    if len(set(names)) != len(names):
        return None
    plan = [_plan_column(c) for c in columns]
    return None if any(p is None for p in plan) else tuple(p for p in plan if p is not None)


# -- the reference, for single values --------------------------------------------------


def _reference_value(column: Any, spec: decoding.ColumnSpec, raw: bytes) -> Value:
    """One non-NULL value decoded exactly as the reference does: the library's reader
    on ``raw`` (the value's bytes), then decoding's converter."""
    wrapper = BinLogPacketWrapper.__new__(BinLogPacketWrapper)
    wrapper.read_bytes = 0
    wrapper._BinLogPacketWrapper__data_buffer = b""
    wrapper.packet = pymysql.protocol.MysqlPacket(raw, "utf8")
    ev = RowsEvent.__new__(RowsEvent)
    ev.packet = wrapper
    ev.table_id = 0
    ev.table_map = {0: SimpleNamespace(columns=[column])}
    ev._RowsEvent__none_sources = {}
    ev._ignore_decode_errors = False
    try:
        value = ev._RowsEvent__read_values_name(
            column, b"\x00", 0, False, b"\x01", column.unsigned, 0
        )
        if wrapper.read_bytes != len(raw):
            raise ValueError(f"read {wrapper.read_bytes} of {len(raw)} bytes")
        if value is None:
            empty = ev._RowsEvent__none_sources.get(column.name) == "empty set"
            return spec.empty_set if empty else None
        return spec.convert(value)
    except Exception as exc:  # the reference fails on these bytes
        raise RowDecodeError(
            f"column {spec.name} ({spec.mysql_type}): cannot decode {raw.hex()}: {exc!r}"
        ) from exc


# -- the codec ---------------------------------------------------------------------------


def _use_native() -> bool:
    return HAVE_NATIVE and os.environ.get(ENV, "").lower() != "python"


def decoder_name() -> Literal["c", "python"]:
    """The row decoder new table codecs use: ``c`` (the extension) or ``python``."""
    return "c" if _use_native() else "python"


class TableCodec:
    """Decoder of one table map's row images (see the module doc).

    ``names``/``mysql_types``/``keys`` are what ``decoding.column_specs`` says;
    ``native`` tells whether the C decoder is used. ``native=None`` picks C when it is
    importable and ``CANAL_ROWCODEC`` is not ``python``. ``packable`` tells whether
    ``decode_packed`` can work for this table at all (the C decoder, and no text column
    in a charset other than UTF-8, which needs decoding in Python). Raises ValueError
    for columns without a fast decoder (``table_codec`` returns None then) or
    native=True without C.
    """

    def __init__(self, columns: Sequence[Any], *, native: bool | None = None) -> None:
        plan = _plan(columns)
        if plan is None:
            raise ValueError("a column of this table has no fast decoder")
        specs = decoding.column_specs(columns)
        self.names: tuple[str, ...] = tuple(s.name for s in specs)
        self.mysql_types: tuple[str, ...] = tuple(s.mysql_type for s in specs)
        self.keys: tuple[bool, ...] = tuple(s.is_key for s in specs)
        self.native: bool = _use_native() if native is None else native
        if self.native and not HAVE_NATIVE:
            raise ValueError("the C row decoder (canal_server.parse._rowcodec) is not built")
        self._columns = tuple(columns)
        self._specs = specs
        self._post = tuple((i, c.encoding) for i, c in enumerate(plan) if c.encoding)
        self.packable: bool = self.native and _HAVE_PACK and not self._post
        self._native: object = None
        self._python: Callable[[bytes], list[Row]] | None = None
        if self.native:
            spec = tuple((c.kind, c.a, c.b, c.values) for c in plan)
            self._native = _rowcodec.compile(spec)
        else:
            self._python = _generate(plan, self._slow)

    def _slow(self, index: int, raw: bytes) -> Value:
        return _reference_value(self._columns[index], self._specs[index], raw)

    def decode(self, data: bytes, pos: int, end: int, images_per_row: int) -> list[Row]:
        """Every row image in ``data[pos:end]``, in order (UPDATE: before0, after0, ...).

        Raises RowDecodeError on truncated or corrupt data (also when the number of
        images is not a multiple of ``images_per_row``).
        """
        if not 0 <= pos <= end <= len(data) or images_per_row not in (1, 2):
            raise RowDecodeError(f"bad rows body bounds {pos}..{end} of {len(data)}")
        try:
            if self._python is None:
                rows = _rowcodec.decode(self._native, data, pos, end, images_per_row, self._slow)
                return self._decode_text(rows) if self._post else rows
            body = data[pos:end]
            rows = self._python(body if type(body) is bytes else bytes(body))
        except RowDecodeError:
            raise
        except (ValueError, IndexError, OverflowError, ArithmeticError, struct.error) as exc:
            raise RowDecodeError(f"corrupt row data ({len(self.names)} columns): {exc}") from exc
        if len(rows) % images_per_row:
            raise RowDecodeError(f"{len(rows)} row images, not pairs of before/after images")
        return rows

    def decode_packed(
        self, data: bytes, pos: int, end: int, images_per_row: int, side: Side = "after",
        *, release_gil: bool | None = None,
    ) -> Packed | None:  # fmt: skip
        """The row images of ``data[pos:end]`` as msgpack: ``(rows, before, after)``.

        ``before`` and ``after`` are each one msgpack array of value arrays, byte-identical
        to ``msgpack.packb(images, use_bin_type=True)`` where ``images`` are ``decode``'s
        tuples of that side: with ``images_per_row=2`` (UPDATE) the even images before,
        the odd ones after; with 1, every image on ``side`` ("after": INSERT, "before":
        DELETE) and ``EMPTY_IMAGES`` on the other. ``rows`` = images / images_per_row.
        Written by C without Python objects. ``release_gil``: whether the GIL is released
        while it works (True, False; None: for bodies of ``NOGIL_MIN_BYTES`` or more, see
        the module doc).

        None, and the caller uses ``decode``: ``packable`` is false, or a value is one
        only the reference decodes (a year before 1000, fields out of range: corrupt or
        odd data). Raises RowDecodeError where ``decode`` raises (truncated or corrupt
        data, invalid UTF-8), or returns None there.
        """
        if not 0 <= pos <= end <= len(data) or images_per_row not in (1, 2):
            raise RowDecodeError(f"bad rows body bounds {pos}..{end} of {len(data)}")
        if side not in ("before", "after"):
            raise ValueError(f"side must be 'before' or 'after', not {side!r}")
        if not self.packable:
            return None
        release = end - pos >= NOGIL_MIN_BYTES if release_gil is None else release_gil
        try:
            packed: Packed | None = _rowcodec.pack(
                self._native, data, pos, end, images_per_row, side == "after", release
            )
        except ValueError as exc:
            raise RowDecodeError(f"corrupt row data ({len(self.names)} columns): {exc}") from exc
        return packed

    def _decode_text(self, rows: list[Row]) -> list[Row]:
        """Non-UTF-8 text columns: the C decoder gives bytes, decoded here."""
        out = []
        for row in rows:
            values = list(row)
            for i, encoding in self._post:
                v = values[i]
                if isinstance(v, bytes):
                    values[i] = v.decode(encoding)
            out.append(tuple(values))
        return out


_CODECS: dict[tuple[Any, ...], TableCodec | None] = {}
_CODECS_MAX = 256


def _column_key(attrs: dict[str, Any]) -> tuple[Any, ...]:
    """Everything the library's Column says (its attributes), hashable."""
    values = tuple(attrs.values())
    if attrs.get("enum_values") is not None or attrs.get("set_values") is not None:
        values = tuple(tuple(v) if isinstance(v, list) else v for v in values)
    return (tuple(attrs), values)


def table_codec(columns: Sequence[Any], *, native: bool | None = None) -> TableCodec | None:
    """The codec of a table map's columns; None when a column type is not supported.

    Codecs are kept by what the columns say (the library makes new column objects for
    every table map event, i.e. every transaction): the same table gets the same codec.
    ``native`` as for TableCodec (True without the C extension raises ValueError).
    """
    use_native = _use_native() if native is None else native
    try:
        key = (use_native, tuple(_column_key(vars(c)) for c in columns))
        if key in _CODECS:
            return _CODECS[key]
    except TypeError:  # an attribute that cannot be hashed: not cached
        key = None
    try:
        codec: TableCodec | None = TableCodec(columns, native=use_native)
    except ValueError:
        if native and _plan(columns) is not None:
            raise
        codec = None
    if key is not None:
        if len(_CODECS) >= _CODECS_MAX:
            del _CODECS[next(iter(_CODECS))]  # the oldest
        _CODECS[key] = codec
    return codec


# -- where the rows are ------------------------------------------------------------------


def _all_present(bitmap: Any, n: int) -> bool:
    if not isinstance(bitmap, bytes) or len(bitmap) != (n + 7) // 8:
        return False
    full = (1 << n) - 1
    return int.from_bytes(bitmap, "little") & full == full


def rows_body(ev: Any) -> tuple[bytes, int, int] | None:
    """``(data, pos, end)``: the unread row images of a RowsEvent, read in place.

    None (and nothing consumed) when the fast path does not apply: not a plain
    v1/v2 rows event (a partial JSON update), not complete, its rows already read,
    an image without every column (binlog_row_image other than FULL), or the packet
    not positioned as expected.
    """
    try:
        if ev.event_type not in _ROWS_EVENTS or not ev.complete:
            return None
        if getattr(ev, "_RowsEvent__rows", None) is not None:
            return None  # ev.rows already consumed the body
        wrapper = ev.packet
        if wrapper._BinLogPacketWrapper__data_buffer:
            return None
        data, pos = wrapper.packet._data, wrapper.packet._position
        n = ev.number_of_columns
        if not isinstance(data, bytes) or not isinstance(pos, int) or n != len(ev.columns):
            return None
        if not _all_present(ev.columns_present_bitmap, n):
            return None
        if ev.event_type in _UPDATE_EVENTS and not _all_present(ev.columns_present_bitmap2, n):
            return None
        end = pos + int(ev.event_size) - int(wrapper.read_bytes)
    except AttributeError:
        return None
    return (data, pos, end) if 0 <= pos <= end <= len(data) else None


# -- helpers of the generated code ----------------------------------------------------------


def _time_text(packed: int, fsp: int) -> str:
    """A TIME2 value (MySQL's packed form) as decoding formats it."""
    sign = "-" if packed < 0 else ""
    a = -packed if packed < 0 else packed
    hms = a >> 24
    total = (((hms >> 12) % 1024) * 3600 + ((hms >> 6) % 64) * 60 + hms % 64) * 1_000_000
    total += a % 16_777_216
    if not total:
        sign = ""
    secs, frac = divmod(total, 1_000_000)
    h, rest = divmod(secs, 3600)
    text = f"{sign}{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return text + "." + f"{frac:06d}"[:fsp] if fsp else text


class _Texts(dict[int, str]):
    """A bounded cache of formatted pieces of values: ``texts[key]`` makes a missing
    text with ``make`` (and keeps it while there are fewer than ``limit``)."""

    def __init__(self, make: Callable[[int], str], limit: int = 32768) -> None:
        super().__init__()
        self.make = make
        self.limit = limit

    def __missing__(self, key: int) -> str:
        text = self.make(key)
        if len(self) < self.limit:
            self[key] = text
        return text


_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()


def _datetime_date(ymd: int) -> str:
    """The date part of a DATETIME2 (ymd >= 0); "" when the reference's strftime would
    not zero-pad the year (1..999: decoded by the reference reader instead)."""
    ym = ymd >> 5
    year = ym // 13
    return "" if 0 < year < 1000 else f"{year:04d}-{ym % 13:02d}-{ymd & 31:02d}"


# date texts (cached, at most ~12 MB in all) and clock texts shared by generated decoders
_DAYS = _Texts(lambda days: datetime.date.fromordinal(_EPOCH_ORDINAL + days).isoformat())
_DATETIME_DATES = _Texts(_datetime_date)
_DATES = _Texts(lambda x: f"{x >> 9:04d}-{x >> 5 & 15:02d}-{x & 31:02d}")
_HOURS_MINUTES = tuple(f"{h:02d}:{m:02d}" for h in range(32) for m in range(64))  # hms >> 6
_DAY_MINUTES = tuple(f"{m // 60:02d}:{m % 60:02d}" for m in range(1440))
_SECONDS = tuple(f"{s:02d}" for s in range(64))


# -- the generated Python decoder ------------------------------------------------------------

_LE_PIECES = {1: "B", 2: "H", 3: "HB", 4: "I", 5: "IB", 6: "IH", 7: "IHB", 8: "Q"}
_BE_PIECES = {1: "B", 2: "H", 3: "BH", 4: "I", 5: "BI", 6: "HI", 7: "BHI", 8: "Q"}
_SIMPLE_CODES = {
    _K_I8: "b", _K_U8: "B", _K_I16: "h", _K_U16: "H", _K_I32: "i", _K_U32: "I", _K_I64: "q",
    _K_U64: "Q", _K_DOUBLE: "d",
}  # fmt: skip
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


@dataclass(frozen=True)
class _Fixed:
    """Generated code of a fixed-width column: its struct pieces (``endian`` + ``codes``
    unpacked into ``names``) and the lines setting ``v<i>`` from them; ``@O`` in a line
    stands for the column's offset in ``buf``."""

    endian: str
    codes: str
    names: tuple[str, ...]
    lines: tuple[str, ...] = ()

    @property
    def width(self) -> int:
        return struct.calcsize(self.endian + self.codes)


def _pieces(i: int, first: int, codes: str) -> list[str]:
    return [f"f{i}_{first + k}" for k in range(len(codes))]


def _join(names: Sequence[str], codes: str, big: bool) -> str:
    """The integer made of unsigned pieces (big- or little-endian order)."""
    if len(names) == 1:
        return names[0]
    parts, shift = [], 0
    pairs = list(zip(names, codes, strict=True))
    for name, code in reversed(pairs) if big else pairs:
        parts.append(f"{name} << {shift}" if shift else name)
        shift += 8 * struct.calcsize(code)
    return "(" + " | ".join(parts) + ")"


def _slow_line(i: int, width: int) -> str:
    return f"v{i} = SLOW({i}, buf[@O:@O + {width}])"


def _decimal_groups(prec: int, scale: int) -> list[tuple[int, int, bool]]:
    """(bytes, digits, integral) of each group of a binary DECIMAL, in storage order."""
    intg = prec - scale
    groups = [(_DIG2BYTES[intg % 9], intg % 9, True)] if intg % 9 else []
    groups += [(4, 9, True)] * (intg // 9) + [(4, 9, False)] * (scale // 9)
    return groups + ([(_DIG2BYTES[scale % 9], scale % 9, False)] if scale % 9 else [])


def _weighted(groups: Sequence[tuple[int, int]]) -> str:
    """Sum of groups (index, digits) as one number: earlier groups are the high digits."""
    terms, weight = [], 1
    for k, digits in reversed(groups):
        terms.append(f"g{k} * {weight}" if weight > 1 else f"g{k}")
        weight *= 10**digits
    return " + ".join(reversed(terms))


def _decimal_fixed(i: int, col: _Col) -> _Fixed:
    groups = _decimal_groups(col.a, col.b)
    codes, names, lines = "", list[str](), list[str]()
    for k, (nbytes, _, _) in enumerate(groups):
        pieces = _BE_PIECES[nbytes]
        these = _pieces(i, len(names), pieces)
        codes, names = codes + pieces, names + these
        lines.append(f"g{k} = {_join(these, pieces, True)}")
    top = 1 << (8 * groups[0][0] - 1)
    lines += [f"if g0 & {top}:", f"    g0 ^= {top}", '    sg = ""', "else:"]
    lines += [f"    g0 ^= {((1 << 8 * groups[0][0]) - 1) ^ top}", '    sg = "-"']
    lines[-1:-1] = [f"    g{k} ^= {(1 << 8 * g[0]) - 1}" for k, g in enumerate(groups) if k]
    integral = [(k, g[1]) for k, g in enumerate(groups) if g[2]]
    fraction = [(k, g[1]) for k, g in enumerate(groups) if not g[2]]
    text = "{sg}" + ("{" + _weighted(integral) + "}" if integral else "0")
    if fraction:
        text += ".{" + _weighted(fraction) + f":0{col.b}d" + "}"
    fixed = _Fixed(">", codes, tuple(names))
    cond = " and ".join(f"g{k} < {10 ** g[1]}" for k, g in enumerate(groups))
    lines += [f"if {cond}:", f'    v{i} = f"{text}"', "else:", "    " + _slow_line(i, fixed.width)]
    return _Fixed(">", codes, tuple(names), tuple(lines))


def _datetime_fixed(i: int, col: _Col) -> _Fixed:
    fsp, size = col.a, (col.a + 1) // 2
    codes = "BI" + ("", "B", "H", "BH")[size]
    a, b, *fr = _pieces(i, 0, codes)
    width = 5 + size
    text = "{d}T{HM[x >> 6 & 2047]}:{SS[x & 63]}"
    cond, pre = f"{a} & 128", []
    if fsp:
        pre = [f"us = {_join(fr, codes[2:], True)}"]
        cond += f" and us < {10 ** (2 * size)}"
        text += ".{" + ("us" if fsp % 2 == 0 else "us // 10") + f":0{fsp}d" + "}"
    lines = [
        *pre, f"if {cond}:", f"    x = ({a} & 127) << 32 | {b}", "    d = DTDATES[x >> 17]",
        "    if d:", f'        v{i} = f"{text}"', "    else:",
        "        " + _slow_line(i, width), "else:", "    " + _slow_line(i, width),
    ]  # fmt: skip
    return _Fixed(">", codes, (a, b, *fr), tuple(lines))


def _time_fixed(i: int, col: _Col) -> _Fixed:
    fsp, size = col.a, (col.a + 1) // 2
    if size == 3:
        a, b = _pieces(i, 0, "HI")
        return _Fixed(">", "HI", (a, b), (f"v{i} = TIME(({a} << 32 | {b}) - {1 << 47}, {fsp})",))
    codes = "BH" + ("", "B", "H")[size]
    a, b, *fr = _pieces(i, 0, codes)
    lines = [f"ip = ({a} << 16 | {b}) - 8388608"]
    if size:
        lines += [f"fr = {fr[0]}", "if ip < 0 and fr:", "    ip += 1", f"    fr -= {1 << 8 * size}"]
        lines.append(f"v{i} = TIME(ip * 16777216 + fr * {10000 if size == 1 else 100}, {fsp})")
    else:
        lines.append(f"v{i} = TIME(ip * 16777216, 0)")
    return _Fixed(">", codes, (a, b, *fr), tuple(lines))


def _timestamp_fixed(i: int, col: _Col) -> _Fixed:
    fsp, size = col.a, (col.a + 1) // 2
    codes = "i" + ("", "b", "h", "bH")[size]
    sec, *fr = _pieces(i, 0, codes)
    width = 4 + size
    text = "{DAYS[" + sec + " // 86400]}T{DM[" + sec + " % 86400 // 60]}:{SS[" + sec + " % 60]}"
    zero = "0000-00-00T00:00:00" + ("." + "0" * fsp if fsp else "") + "Z"
    lines, ok = [], ""
    if fsp:
        raw = f"({fr[0]} << 16 | {fr[1]})" if size == 3 else fr[0]
        lines = [f"fr = {raw}", f"dg = {'fr // 10' if fsp % 2 else 'fr'} if fr > 0 else 0"]
        ok = f" and dg < {10**fsp}"
        text += ".{dg:0" + str(fsp) + "d}"
    lines += [
        f"if {sec} > 0{ok}:", f'    v{i} = f"{text}Z"',
        f"elif not {sec}{ok}:", f"    v{i} = {zero!r}", "else:", "    " + _slow_line(i, width),
    ]  # fmt: skip
    return _Fixed(">", codes, (sec, *fr), tuple(lines))


def _small_fixed(i: int, col: _Col, ns: dict[str, Any]) -> _Fixed | None:
    """Integers, floats, YEAR, DATE, ENUM, SET, BIT."""
    k, v = col.kind, f"v{i}"
    if k in _SIMPLE_CODES:
        return _Fixed("<", _SIMPLE_CODES[k], (v,))
    if k in (_K_I24, _K_U24):
        a, b = _pieces(i, 0, "HB")
        if k == _K_I24:
            return _Fixed("<", "Hb", (a, b), (f"{v} = {a} + ({b} << 16)",))
        return _Fixed("<", "HB", (a, b), (f"{v} = {a} | {b} << 16",))
    if k in (_K_FLOAT, _K_YEAR, _K_ENUM):
        (a,) = _pieces(i, 0, "B")
        if k == _K_FLOAT:
            return _Fixed("<", "f", (a,), (f"{v} = F32({a})",))
        if k == _K_YEAR:
            return _Fixed("<", "B", (a,), (f"{v} = {a} + 1900 if {a} else 0",))
        ns[f"E{i}"] = col.values
        return _Fixed("<", _LE_PIECES[col.a], (a,), (f"{v} = E{i}[{a}]",))
    if k == _K_DATE:
        a, b = _pieces(i, 0, "HB")
        return _Fixed("<", "HB", (a, b), (f"{v} = DATES[{a} | {b} << 16]",))
    if k == _K_SET:
        codes = _LE_PIECES[col.a]
        names = _pieces(i, 0, codes)
        ns[f"SET{i}"] = _Texts(_set_function(col.values), 4096)
        return _Fixed("<", codes, tuple(names), (f"{v} = SET{i}[{_join(names, codes, False)}]",))
    if k == _K_BIT:
        codes = _BE_PIECES[col.a]
        names = _pieces(i, 0, codes)
        return _Fixed(
            ">", codes, tuple(names), (f"{v} = {_join(names, codes, True)} & {(1 << col.b) - 1}",)
        )
    return None


def _set_function(members: tuple[str, ...]) -> Callable[[int], str]:
    """A SET value's text: the members whose bit is set, in definition order."""
    return lambda mask: ",".join(m for i, m in enumerate(members) if mask >> i & 1)


def _fixed(i: int, col: _Col, ns: dict[str, Any]) -> _Fixed | None:
    """The fixed-width code of column ``i``; None for a variable-length column."""
    if col.kind == _K_DECIMAL:
        return _decimal_fixed(i, col)
    if col.kind == _K_DATETIME2:
        return _datetime_fixed(i, col)
    if col.kind == _K_TIME2:
        return _time_fixed(i, col)
    if col.kind == _K_TIMESTAMP2:
        return _timestamp_fixed(i, col)
    return _small_fixed(i, col, ns)


_LENGTHS = {
    1: "L = buf[p]",
    2: "L = buf[p] | buf[p + 1] << 8",
    3: "L = buf[p] | buf[p + 1] << 8 | buf[p + 2] << 16",
    4: "(L,) = U32(buf, p)",
}


def _var_lines(i: int, col: _Col) -> list[str]:
    """A length-prefixed column: text, bytes (BINARY(n) padded with 0x00)."""
    v = f"v{i}"
    lines = [_LENGTHS[col.a], f"p += {col.a}", "q = p + L"]
    if col.kind == _K_UTF8:
        lines.append(f"{v} = buf[p:q].decode()")
    elif col.encoding:
        lines.append(f"{v} = buf[p:q].decode({col.encoding!r})")
    else:
        lines.append(f"{v} = buf[p:q]")
        if col.b:
            lines += [f"if L < {col.b}:", f'    {v} = {v}.ljust({col.b}, b"\\0")']
    return [*lines, "p = q"]


class _Structs:
    """The precompiled struct readers the generated code uses, by format."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self._ns = ns
        self._names: dict[str, str] = {}

    def name(self, fmt: str) -> str:
        if fmt not in self._names:
            self._names[fmt] = f"S{len(self._names)}"
            self._ns[self._names[fmt]] = struct.Struct(fmt).unpack_from
        return self._names[fmt]


def _run_lines(run: Sequence[_Fixed], structs: _Structs) -> list[str]:
    """One struct read for a run of fixed-width columns, then each column's lines."""
    fmt = run[0].endian + "".join(f.codes for f in run)
    names = [n for f in run for n in f.names]
    lines = [f"{', '.join(names)}, = {structs.name(fmt)}(buf, p)"]
    offset = 0
    for f in run:
        where = f"p + {offset}" if offset else "p"
        lines += [line.replace("@O", where) for line in f.lines]
        offset += f.width
    return [*lines, f"p += {offset}"]


def _fast_lines(cols: Sequence[_Fixed | list[str]], structs: _Structs) -> list[str]:
    """Every column of an image without NULLs; fixed-width runs read at once."""
    lines: list[str] = []
    run: list[_Fixed] = []
    for col in [*cols, None]:
        if run and not (isinstance(col, _Fixed) and col.endian == run[0].endian):
            lines += _run_lines(run, structs)
            run = []
        if isinstance(col, _Fixed):
            run.append(col)
        elif col is not None:
            lines += col
    return lines


def _null_lines(cols: Sequence[_Fixed | list[str]], structs: _Structs) -> list[str]:
    """Every column of an image with NULLs: a null-bit test per column."""
    lines = []
    for i, col in enumerate(cols):
        body = _run_lines([col], structs) if isinstance(col, _Fixed) else col
        lines += [f"if nb & {1 << i}:", f"    v{i} = None", "else:"]
        lines += ["    " + line for line in body]
    return lines


def _generate(
    plan: Sequence[_Col], slow: Callable[[int, bytes], Value]
) -> Callable[[bytes], list[Row]]:
    """Compile the decoder of a whole rows body for this table's columns."""
    ns: dict[str, Any] = {
        "SLOW": slow, "TIME": _time_text, "RDE": RowDecodeError, "F32": decoding._float32,
        "U32": struct.Struct("<I").unpack_from, "DAYS": _DAYS, "DTDATES": _DATETIME_DATES,
        "HM": _HOURS_MINUTES, "DM": _DAY_MINUTES, "SS": _SECONDS, "DATES": _DATES,
    }  # fmt: skip
    structs = _Structs(ns)
    cols = [_fixed(i, c, ns) or _var_lines(i, c) for i, c in enumerate(plan)]
    n, nbytes = len(plan), (len(plan) + 7) // 8
    read_nulls = (
        ["nb = buf[p]"] if nbytes == 1 else [f'nb = int.from_bytes(buf[p:p + {nbytes}], "little")']
    )
    loop = [
        *read_nulls, f"p += {nbytes}", f"if not nb & {(1 << n) - 1}:",
        *("    " + line for line in _fast_lines(cols, structs)), "else:",
        *("    " + line for line in _null_lines(cols, structs)), "if p > n:",
        '    raise RDE("a row image runs past the end of the rows event")',
        f"append(({', '.join(f'v{i}' for i in range(n))},))",
    ]  # fmt: skip
    source = "\n".join([
        f"def make({', '.join(sorted(ns))}):", "    def decode(buf):", "        out = []",
        "        append = out.append", "        n = len(buf)", "        p = 0",
        "        while p < n:", *("            " + line for line in loop), "        return out",
        "    return decode",
    ])  # fmt: skip
    scope: dict[str, Any] = {}
    exec(compile(source, f"<rowcodec: {n} columns>", "exec"), scope)
    decode: Callable[[bytes], list[Row]] = scope["make"](**ns)
    return decode
