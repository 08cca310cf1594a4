"""Row values of mysql-replication rows events → the API's lossless Column objects.

Value forms (docs/api.md): integers as int (unsigned by the FULL-metadata signedness),
DECIMAL as a string with the column's scale, FLOAT as the shortest decimal that
round-trips the stored float32, DOUBLE as float, DATE ``YYYY-MM-DD``, TIME
``[-]HH:MM:SS[.f]`` (hours up to 838), DATETIME ``YYYY-MM-DDTHH:MM:SS[.f]``,
TIMESTAMP the same in UTC with a ``Z`` suffix; fractions keep the column's digits
(``datetime(3)`` → ``.120``). Zero dates stay as the server has them
(``0000-00-00``, ``2020-00-00``, ``0000-00-00T00:00:00``; zero TIMESTAMP
``0000-00-00T00:00:00Z``). YEAR int (0 for 0000); CHAR/VARCHAR/TEXT/JSON str;
BINARY/VARBINARY/BLOB/GEOMETRY bytes (BINARY(n) padded with 0x00 to n as the
server returns it); ENUM str; SET the members in definition order joined by
commas; BIT int. NULL: ``value=None, is_null=True``.

``mysql_type`` is derived from the table map's metadata (valid for the schema at
the time of the event, also after an ALTER): e.g. ``int unsigned``,
``decimal(30,10)``, ``varchar(20)``, ``datetime(6)``, ``enum('a','b')``. MariaDB's
JSON is an alias of LONGTEXT and is reported as ``longtext``.

``install_fixes`` (run at import) replaces three readers of the library's RowsEvent
with correct ones: TIME2 (negative values with fractions came out wrong), DATE and
DATETIME2 (zero or partly zero dates came out as None, indistinguishable from NULL;
they are returned as strings now). These readers are only used to decode row values.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import RowsEvent

from canal_protocol.entry import Column, RowChange, RowImages, TableColumns, Value

__all__ = [
    "ColumnSpec", "column_specs", "install_fixes", "row_changes", "row_images", "table_columns",
    "type_name",
]  # fmt: skip

_INT_NAMES = {
    FIELD_TYPE.TINY: "tinyint",
    FIELD_TYPE.SHORT: "smallint",
    FIELD_TYPE.INT24: "mediumint",
    FIELD_TYPE.LONG: "int",
    FIELD_TYPE.LONGLONG: "bigint",
}
_BLOB_NAMES = {1: "tinyblob", 2: "blob", 3: "mediumblob", 4: "longblob"}
_TEXT_NAMES = {1: "tinytext", 2: "text", 3: "mediumtext", 4: "longtext"}
_MBMAXLEN = {
    "utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "ucs2": 2, "utf16": 4, "utf16le": 4, "utf32": 4,
    "big5": 2, "gbk": 2, "gb2312": 2, "sjis": 2, "cp932": 2, "euckr": 2, "ujis": 3,
    "eucjpms": 3,
}  # fmt: skip
_TIMEF_INT_OFS = 0x800000
_TIMEF_OFS = 0x800000000000
_DATETIMEF_INT_OFS = 0x8000000000


# -- column metadata ---------------------------------------------------------------


def _charset(col: Any) -> str:
    return str(col.collation_name or "").split("_", 1)[0]


def _is_binary(col: Any) -> bool:
    return bool(col.collation_name == "binary")


def _char_len(col: Any) -> int:
    return int(col.max_length) // (1 if _is_binary(col) else _MBMAXLEN.get(_charset(col), 1))


def _quoted(values: Sequence[str]) -> str:
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def type_name(col: Any) -> str:
    """The column's SQL type as text, from the table map's metadata."""
    t = col.type
    if t in _INT_NAMES:
        return _INT_NAMES[t] + (" unsigned" if col.unsigned else "")
    fsp = getattr(col, "fsp", 0)
    simple = {
        FIELD_TYPE.FLOAT: "float",
        FIELD_TYPE.DOUBLE: "double",
        FIELD_TYPE.DATE: "date",
        FIELD_TYPE.YEAR: "year",
        FIELD_TYPE.GEOMETRY: "geometry",
        FIELD_TYPE.TIME2: "time" + (f"({fsp})" if fsp else ""),
        FIELD_TYPE.DATETIME2: "datetime" + (f"({fsp})" if fsp else ""),
        FIELD_TYPE.TIMESTAMP2: "timestamp" + (f"({fsp})" if fsp else ""),
    }
    if t in simple:
        return simple[t]
    if t == FIELD_TYPE.NEWDECIMAL:
        return f"decimal({col.precision},{col.decimals})"
    if t == FIELD_TYPE.STRING:
        return f"{'binary' if _is_binary(col) else 'char'}({_char_len(col)})"
    if t == FIELD_TYPE.VARCHAR:
        return f"{'varbinary' if _is_binary(col) else 'varchar'}({_char_len(col)})"
    if t == FIELD_TYPE.BLOB:
        names = _BLOB_NAMES if _is_binary(col) else _TEXT_NAMES
        return names.get(col.length_size, "blob")
    if t == FIELD_TYPE.ENUM:
        return f"enum({_quoted((col.enum_values or [''])[1:])})"
    if t == FIELD_TYPE.SET:
        return f"set({_quoted(col.set_values or [])})"
    if t == FIELD_TYPE.BIT:
        return f"bit({col.bits})"
    return f"type{t}"


# -- value conversion ------------------------------------------------------------------


def _fraction(micro: int, fsp: int) -> str:
    return "." + f"{micro:06d}"[:fsp] if fsp else ""


def _float32(x: float) -> float:
    """The shortest decimal that reads back as the same float32."""
    packed = struct.pack("<f", x)
    for digits in range(6, 10):
        candidate = float(f"{x:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return x


def _time(v: Any, fsp: int) -> str:
    if isinstance(v, str):
        return v
    micro = (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
    sign = "-" if micro < 0 else ""
    secs, frac = divmod(abs(micro), 1_000_000)
    h, rest = divmod(secs, 3600)
    return f"{sign}{h:02d}:{rest // 60:02d}:{rest % 60:02d}{_fraction(frac, fsp)}"


def _datetime(v: Any, fsp: int) -> str:
    if isinstance(v, str):
        return v
    return str(v.strftime("%Y-%m-%dT%H:%M:%S")) + _fraction(v.microsecond, fsp)


def _timestamp(v: Any, fsp: int) -> str:
    if v.year == 1970 and v.replace(microsecond=0) == datetime.datetime(1970, 1, 1):
        return "0000-00-00T00:00:00" + _fraction(0, fsp) + "Z"  # TIMESTAMP 0 = zero date
    return _datetime(v, fsp) + "Z"


def _date(v: Any) -> str:
    return v if isinstance(v, str) else str(v.isoformat())


def _text_or_bytes(col: Any) -> Callable[[Any], Value]:
    binary = _is_binary(col)
    pad = int(col.max_length) if binary and col.type == FIELD_TYPE.STRING else 0

    def convert(v: Any) -> Value:
        if binary:
            b = v if isinstance(v, bytes) else str(v).encode("latin-1")
            return b.ljust(pad, b"\0") if pad else b
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)

    return convert


def _set(col: Any) -> Callable[[Any], Value]:
    members = list(col.set_values or [])
    return lambda v: ",".join(m for m in members if m in v)


def converter(col: Any) -> Callable[[Any], Value]:
    """A function from the library's value of this column (not None) to ours."""
    t = col.type
    fsp = int(getattr(col, "fsp", 0) or 0)
    table: dict[int, Callable[[Any], Value]] = {
        FIELD_TYPE.NEWDECIMAL: lambda v: format(decimal.Decimal(v), f".{col.decimals}f"),
        FIELD_TYPE.FLOAT: _float32,
        FIELD_TYPE.DOUBLE: float,
        FIELD_TYPE.DATE: _date,
        FIELD_TYPE.TIME2: lambda v: _time(v, fsp),
        FIELD_TYPE.DATETIME2: lambda v: _datetime(v, fsp),
        FIELD_TYPE.TIMESTAMP2: lambda v: _timestamp(v, fsp),
        FIELD_TYPE.YEAR: lambda v: 0 if v == 1900 else int(v),
        FIELD_TYPE.ENUM: str,
        FIELD_TYPE.SET: _set(col),
        FIELD_TYPE.BIT: lambda v: int(v, 2) if v else 0,
        FIELD_TYPE.GEOMETRY: bytes,
    }
    if t in _INT_NAMES:
        return int
    if t in table:
        return table[t]
    if t in (FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR, FIELD_TYPE.BLOB):
        return _text_or_bytes(col)
    return _identity


def _identity(v: Any) -> Value:
    return v  # type: ignore[no-any-return]


# -- rows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSpec:
    """What a table map says about one column, with its value converter."""

    name: str
    mysql_type: str
    is_key: bool
    convert: Callable[[Any], Value]
    empty_set: Value  # value when the library reports "empty set" (SET) else None


def column_specs(columns: Sequence[Any]) -> tuple[ColumnSpec, ...]:
    """Specs of a table map's columns (FULL metadata gives names and keys)."""
    return tuple(
        ColumnSpec(
            name=str(c.name),
            mysql_type=type_name(c),
            is_key=bool(c.is_primary),
            convert=converter(c),
            empty_set="" if c.type == FIELD_TYPE.SET else None,
        )
        for c in columns
    )


def _values(
    specs: Sequence[ColumnSpec], values: dict[str, Any], sources: dict[str, str]
) -> tuple[Value, ...]:
    out: list[Value] = []
    for spec in specs:
        raw = values.get(spec.name)
        if raw is None and sources.get(spec.name) != "empty set":
            out.append(None)
        elif raw is None:
            out.append(spec.empty_set)
        else:
            out.append(spec.convert(raw))
    return tuple(out)


def table_columns(specs: Sequence[ColumnSpec]) -> TableColumns:
    """The column metadata of entries, from the specs of a table map."""
    return TableColumns(
        tuple(s.name for s in specs),
        tuple(s.mysql_type for s in specs),
        tuple(s.is_key for s in specs),
    )


def row_images(
    kind: str, specs: Sequence[ColumnSpec], columns: TableColumns, rows: Sequence[dict[str, Any]]
) -> RowImages:
    """The compact rows of a rows event (the generic path; rowcodec is the fast one);
    ``columns``: ``table_columns(specs)``, made once per table map."""
    if kind == "UPDATE":
        return RowImages(
            columns,
            tuple(_values(specs, r["before_values"], r["before_none_sources"]) for r in rows),
            tuple(_values(specs, r["after_values"], r["after_none_sources"]) for r in rows),
        )
    images = tuple(_values(specs, r["values"], r["none_sources"]) for r in rows)
    return RowImages(columns, after=images) if kind == "INSERT" else RowImages(columns, images)


def _image(
    specs: Sequence[ColumnSpec],
    values: dict[str, Any],
    sources: dict[str, str],
    before: tuple[Column, ...] | None,
    changed: bool,
) -> tuple[Column, ...]:
    cols = []
    for i, (spec, value) in enumerate(zip(specs, _values(specs, values, sources), strict=True)):
        is_null = value is None
        if before is not None:
            prev = before[i]
            updated = prev.value != value or prev.is_null != is_null
        else:
            updated = changed
        cols.append(Column(spec.name, value, spec.is_key, updated, spec.mysql_type, is_null))
    return tuple(cols)


def row_changes(
    kind: str, specs: Sequence[ColumnSpec], rows: Sequence[dict[str, Any]]
) -> tuple[RowChange, ...]:
    """RowChanges of a rows event; ``kind`` is INSERT, UPDATE or DELETE."""
    out = []
    for row in rows:
        if kind == "UPDATE":
            before = _image(specs, row["before_values"], row["before_none_sources"], None, False)
            after = _image(specs, row["after_values"], row["after_none_sources"], before, True)
            out.append(RowChange(before, after))
        elif kind == "INSERT":
            out.append(RowChange((), _image(specs, row["values"], row["none_sources"], None, True)))
        else:
            out.append(RowChange(_image(specs, row["values"], row["none_sources"], None, False)))
    return tuple(out)


# -- fixed readers for the library ---------------------------------------------------


def _read_fraction(packet: Any, fsp: int) -> int:
    """Unsigned big-endian fraction bytes of a temporal value, as microseconds."""
    size = (fsp + 1) // 2
    if size == 0:
        return 0
    raw = int.from_bytes(packet.read(size), "big")
    return int(raw * 10 ** (6 - 2 * size))


def _read_time2(self: Any, column: Any) -> datetime.timedelta:
    """TIME2 as MySQL's my_time_packed_from_binary (correct for negatives)."""
    fsp = int(column.fsp or 0)
    size = (fsp + 1) // 2
    if size == 3:
        packed = int.from_bytes(self.packet.read(6), "big") - _TIMEF_OFS
    else:
        intpart = int.from_bytes(self.packet.read(3), "big") - _TIMEF_INT_OFS
        frac = int.from_bytes(self.packet.read(size), "big") if size else 0
        if intpart < 0 and frac:
            intpart += 1
            frac -= 1 << (8 * size)
        packed = (intpart << 24) + frac * (10000 if size == 1 else 100)
    sign = -1 if packed < 0 else 1
    packed = abs(packed)
    hms, micro = packed >> 24, packed % (1 << 24)
    delta = datetime.timedelta(
        hours=(hms >> 12) % (1 << 10), minutes=(hms >> 6) % 64, seconds=hms % 64,
        microseconds=micro,
    )  # fmt: skip
    return delta * sign


def _read_date(self: Any) -> datetime.date | str:
    v = int.from_bytes(self.packet.read(3), "little")
    year, month, day = v >> 9, (v >> 5) & 15, v & 31
    try:
        return datetime.date(year, month, day)
    except ValueError:
        return f"{year:04d}-{month:02d}-{day:02d}"


def _read_datetime2(self: Any, column: Any) -> datetime.datetime | str:
    v = int.from_bytes(self.packet.read(5), "big") - _DATETIMEF_INT_OFS
    micro = _read_fraction(self.packet, int(column.fsp or 0))
    ymd, hms = v >> 17, v & ((1 << 17) - 1)
    ym = ymd >> 5
    parts = (ym // 13, ym % 13, ymd & 31, hms >> 12, (hms >> 6) & 63, hms & 63)
    try:
        return datetime.datetime(*parts, micro)
    except ValueError:
        y, mo, d, h, mi, s = parts
        fsp = int(column.fsp or 0)
        return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{_fraction(micro, fsp)}"


def install_fixes() -> None:
    """Replace the library's TIME2/DATE/DATETIME2 readers (idempotent)."""
    RowsEvent._RowsEvent__read_time2 = _read_time2
    RowsEvent._RowsEvent__read_date = _read_date
    RowsEvent._RowsEvent__read_datetime2 = _read_datetime2


install_fixes()
