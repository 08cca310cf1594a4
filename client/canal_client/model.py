"""The client's typed view of API.md's wire model: Batch, Entry, Header, RowChange, Column.

Lightweight frozen dataclasses of its own (no server imports). ``from_wire`` reads the
plain dicts of a decoded msgpack or JSON body; with ``binary_as_base64`` (JSON bodies)
values of binary columns are decoded from base64 back to bytes. ``to_wire`` gives the
wire form again (``to_json_wire``: bytes as base64 text), which `canal-ha consume
--format json` prints.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack

__all__ = [
    "EMPTY_BATCH_ID",
    "Batch",
    "Column",
    "Entry",
    "EntryType",
    "Header",
    "Image",
    "Position",
    "RowChange",
    "RowImages",
    "TableColumns",
    "Value",
    "images_from_wire",
]

Value = int | float | str | bytes | None
EMPTY_BATCH_ID = -1
_BINARY_TYPES = ("binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob", "geometry")


def _is_binary_type(mysql_type: str) -> bool:
    return mysql_type.split("(", 1)[0].strip().lower() in _BINARY_TYPES


class EntryType(enum.StrEnum):
    TRANSACTIONBEGIN = "TRANSACTIONBEGIN"
    ROWDATA = "ROWDATA"
    TRANSACTIONEND = "TRANSACTIONEND"


@dataclass(frozen=True)
class Column:
    name: str
    value: Value
    is_key: bool = False
    updated: bool = False
    mysql_type: str = ""
    is_null: bool = False

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Column:
        value = d.get("value")
        mysql_type = str(d.get("mysql_type", ""))
        if binary_as_base64 and isinstance(value, str) and _is_binary_type(mysql_type):
            value = base64.b64decode(value)
        return cls(
            str(d["name"]),
            value,
            bool(d.get("is_key", False)),
            bool(d.get("updated", False)),
            mysql_type,
            bool(d.get("is_null", value is None)),
        )

    def to_wire(self, binary_as_base64: bool = False) -> dict[str, Any]:
        value = self.value
        if binary_as_base64 and isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii")
        return {
            "name": self.name,
            "value": value,
            "is_key": self.is_key,
            "updated": self.updated,
            "mysql_type": self.mysql_type,
            "is_null": self.is_null,
        }


@dataclass(frozen=True)
class RowChange:
    """One changed row: ``before`` (UPDATE, DELETE) and ``after`` (INSERT, UPDATE)."""

    before: tuple[Column, ...] = ()
    after: tuple[Column, ...] = ()

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> RowChange:
        return cls(
            tuple(Column.from_wire(c, binary_as_base64) for c in d.get("before") or ()),
            tuple(Column.from_wire(c, binary_as_base64) for c in d.get("after") or ()),
        )

    def to_wire(self, binary_as_base64: bool = False) -> dict[str, Any]:
        return {
            "before": [c.to_wire(binary_as_base64) for c in self.before],
            "after": [c.to_wire(binary_as_base64) for c in self.after],
        }

    def before_values(self) -> dict[str, Value]:
        return {c.name: c.value for c in self.before}

    def after_values(self) -> dict[str, Value]:
        return {c.name: c.value for c in self.after}


@dataclass(frozen=True)
class TableColumns:
    """A table's column metadata as its table map gives it (one per table map)."""

    names: tuple[str, ...]
    mysql_types: tuple[str, ...]
    keys: tuple[bool, ...]

    @cached_property
    def binary_indexes(self) -> tuple[int, ...]:
        """Indexes of binary columns (bytes values; base64 in JSON)."""
        return tuple(i for i, t in enumerate(self.mysql_types) if _is_binary_type(t))

    def to_wire(self) -> dict[str, Any]:
        return {"names": self.names, "mysql_types": self.mysql_types, "keys": self.keys}

    @cached_property
    def packed(self) -> bytes:
        """``to_wire`` as msgpack (made once per table map, joined into every entry)."""
        return bytes(msgpack.packb(self.to_wire(), use_bin_type=True))

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TableColumns:
        """From the wire; the entries of one table share one object (kept by content)."""
        names, types, keys = d["names"], d["mysql_types"], d["keys"]
        key = (tuple(names), tuple(types), tuple(keys))
        known = _TABLES.get(key)
        if known is None:
            known = cls(
                tuple(str(n) for n in names),
                tuple(str(t) for t in types),
                tuple(bool(k) for k in keys),
            )
            if len(_TABLES) >= _TABLES_MAX:
                _TABLES.clear()
            _TABLES[key] = known
        return known

    @classmethod
    def of(cls, columns: Sequence[Column]) -> TableColumns:
        return cls(
            tuple(c.name for c in columns),
            tuple(c.mysql_type for c in columns),
            tuple(c.is_key for c in columns),
        )


Image = tuple[Value, ...]


@dataclass(frozen=True)
class RowImages:
    """The rows of one rows event: INSERT has ``after`` images, DELETE ``before``,
    UPDATE both (the same number, row by row)."""

    columns: TableColumns
    before: tuple[Image, ...] = ()
    after: tuple[Image, ...] = ()

    def __len__(self) -> int:
        return max(len(self.before), len(self.after))

    def changes(self) -> tuple[RowChange, ...]:
        """Canal's per-column view of every row."""
        cols = self.columns
        if self.before and self.after:
            return tuple(
                RowChange(_columns(cols, b, None), _columns(cols, a, b))
                for b, a in zip(self.before, self.after, strict=True)
            )
        if self.after:
            return tuple(RowChange((), _columns(cols, a, True)) for a in self.after)
        return tuple(RowChange(_columns(cols, b, False)) for b in self.before)

    @classmethod
    def from_changes(cls, rows: Sequence[RowChange]) -> RowImages | None:
        """The compact form of per-column rows (all of one table); None for no rows."""
        if not rows:
            return None
        first = rows[0].after or rows[0].before
        return cls(
            TableColumns.of(first),
            tuple(tuple(c.value for c in r.before) for r in rows if r.before),
            tuple(tuple(c.value for c in r.after) for r in rows if r.after),
        )

    def to_compact_wire(self) -> dict[str, Any]:
        """``columns`` and the value lists (bytes stay bytes: the JSON encoder base64s them)."""
        return {"columns": self.columns.to_wire(), "before": self.before, "after": self.after}


def _columns(cols: TableColumns, values: Image, prev: Image | bool | None) -> tuple[Column, ...]:
    """Columns of one image; ``prev``: the before image (UPDATE) or ``updated`` for all."""
    names, types, keys = cols.names, cols.mysql_types, cols.keys
    if isinstance(prev, tuple):
        return tuple(
            Column(names[i], v, keys[i], v != prev[i] or (v is None) != (prev[i] is None),
                   types[i], v is None)
            for i, v in enumerate(values)
        )  # fmt: skip
    updated = bool(prev)
    return tuple(
        Column(names[i], v, keys[i], updated, types[i], v is None) for i, v in enumerate(values)
    )


_TABLES: dict[tuple[Any, ...], TableColumns] = {}
_TABLES_MAX = 1024


def _images(raw: Any) -> tuple[Image, ...]:
    """Row images of the wire as tuples (msgpack decoded with tuples: as they are)."""
    if not raw:
        return ()
    if type(raw) is tuple and type(raw[0]) is tuple:
        return raw
    return tuple(map(tuple, raw))


def images_from_wire(d: dict[str, Any], binary_as_base64: bool = False) -> RowImages | None:
    """The rows of a wire entry in either layout (compact ``columns`` or ``rows``)."""
    if "columns" not in d:
        rows = [RowChange.from_wire(r, binary_as_base64) for r in d.get("rows") or ()]
        return RowImages.from_changes(rows)
    images = RowImages(
        TableColumns.from_wire(d["columns"]),
        _images(d.get("before")),
        _images(d.get("after")),
    )
    return _unb64(images) if binary_as_base64 else images


def _unb64(images: RowImages) -> RowImages:
    """``images`` with the base64 text of binary columns (a JSON body) as bytes again."""
    binary = images.columns.binary_indexes
    if not binary:
        return images

    def fix(rows: tuple[Image, ...]) -> tuple[Image, ...]:
        out = []
        for row in rows:
            values = list(row)
            for i in binary:
                if isinstance(values[i], str):
                    values[i] = base64.b64decode(values[i])  # type: ignore[arg-type]
            out.append(tuple(values))
        return tuple(out)

    return RowImages(images.columns, fix(images.before), fix(images.after))


@dataclass(frozen=True)
class Header:
    logfile: str
    offset: int
    server_id: int
    timestamp_ms: int
    end_offset: int = 0
    gtid: str = ""
    schema: str = ""
    table: str = ""
    event_type: str = ""

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Header:
        offset = int(d.get("offset", 0))
        return cls(
            str(d.get("logfile", "")),
            offset,
            int(d.get("server_id", 0)),
            int(d.get("timestamp_ms", 0)),
            int(d.get("end_offset", offset)),
            str(d.get("gtid", "")),
            str(d.get("schema", "")),
            str(d.get("table", "")),
            str(d.get("event_type", "")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "logfile": self.logfile,
            "offset": self.offset,
            "end_offset": self.end_offset,
            "server_id": self.server_id,
            "timestamp_ms": self.timestamp_ms,
            "gtid": self.gtid,
            "schema": self.schema,
            "table": self.table,
            "event_type": self.event_type,
        }


@dataclass(frozen=True)
class Entry:
    """One entry of a batch (Canal's Entry); ``rows`` is made from ``images`` on first use."""

    type: EntryType
    header: Header
    is_ddl: bool = False
    sql: str = ""
    images: RowImages | None = None

    @cached_property
    def rows(self) -> tuple[RowChange, ...]:
        return self.images.changes() if self.images is not None else ()

    @property
    def row_count(self) -> int:
        return len(self.images) if self.images is not None else 0

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Entry:
        """Either layout (``rows``, or ``compact``)."""
        return cls(
            EntryType(d["type"]),
            Header.from_wire(d.get("header") or {}),
            bool(d.get("is_ddl", False)),
            str(d.get("sql") or ""),
            images_from_wire(d, binary_as_base64),
        )

    @property
    def full_name(self) -> str:
        """``schema.table``."""
        return f"{self.header.schema}.{self.header.table}"

    def to_wire(self, binary_as_base64: bool = False) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "header": self.header.to_wire(),
            "is_ddl": self.is_ddl,
            "sql": self.sql,
            "rows": [r.to_wire(binary_as_base64) for r in self.rows],
        }

    def to_json_wire(self) -> dict[str, Any]:
        return self.to_wire(binary_as_base64=True)


@dataclass(frozen=True)
class Position:
    """A LogPosition of the wire (batch start/end, cursor), flattened."""

    journal: str = ""
    offset: int = 0
    server_id: int = 0
    gtid: str = ""
    timestamp_ms: int = 0
    included: bool = False
    source_address: str = ""
    slave_id: int = 0

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Position:
        pos = d.get("position") or {}
        ident = d.get("identity") or {}
        return cls(
            str(pos.get("journal", "")),
            int(pos.get("offset", 0)),
            int(pos.get("server_id", 0)),
            str(pos.get("gtid", "")),
            int(pos.get("timestamp_ms", 0)),
            bool(pos.get("included", False)),
            str(ident.get("source_address", "")),
            int(ident.get("slave_id", 0)),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "identity": {"source_address": self.source_address, "slave_id": self.slave_id},
            "position": {
                "journal": self.journal,
                "offset": self.offset,
                "server_id": self.server_id,
                "gtid": self.gtid,
                "timestamp_ms": self.timestamp_ms,
                "included": self.included,
            },
        }


@dataclass(frozen=True)
class Batch:
    """A batch (Canal's Message); ``id == -1`` and no entries when nothing arrived."""

    id: int
    entries: list[Entry] = field(default_factory=list)
    start: Position | None = None
    end: Position | None = None

    @classmethod
    def empty(cls) -> Batch:
        return cls(EMPTY_BATCH_ID)

    @property
    def is_empty(self) -> bool:
        return self.id == EMPTY_BATCH_ID or not self.entries

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Batch:
        start, end = d.get("start"), d.get("end")
        return cls(
            int(d["id"]),
            [Entry.from_wire(e, binary_as_base64) for e in d.get("entries") or ()],
            Position.from_wire(start) if start else None,
            Position.from_wire(end) if end else None,
        )

    def to_wire(self, binary_as_base64: bool = False) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "id": self.id,
            "entries": [e.to_wire(binary_as_base64) for e in self.entries],
        }
        if self.start is not None and self.end is not None:
            wire["start"] = self.start.to_wire()
            wire["end"] = self.end.to_wire()
        return wire
