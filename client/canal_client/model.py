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
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EMPTY_BATCH_ID",
    "Batch",
    "Column",
    "Entry",
    "EntryType",
    "Header",
    "Position",
    "RowChange",
    "Value",
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
    """One entry of a batch (Canal's Entry)."""

    type: EntryType
    header: Header
    is_ddl: bool = False
    sql: str = ""
    rows: tuple[RowChange, ...] = ()

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Entry:
        return cls(
            EntryType(d["type"]),
            Header.from_wire(d.get("header") or {}),
            bool(d.get("is_ddl", False)),
            str(d.get("sql") or ""),
            tuple(RowChange.from_wire(r, binary_as_base64) for r in d.get("rows") or ()),
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
