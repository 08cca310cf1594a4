"""The entry model of API.md (Canal's Entry), frozen, with its wire forms.

An ``Entry`` is one of TRANSACTIONBEGIN, ROWDATA or TRANSACTIONEND. ROWDATA entries
carry row changes or, for DDL, the statement (``is_ddl`` / ``sql``). ``header.offset``
is the start of the binlog event that produced the entry (what ``mariadb-binlog``
prints as ``# at N``); ``header.end_offset`` is where the next event starts, so
``Entry.position()`` is where reading would resume after this entry.

Values are lossless: ints (unsigned included) stay ints, DECIMAL is a string,
temporal types are ISO-8601 strings, binary is bytes (base64 text in JSON), JSON
columns are text, SET is a comma-separated string, BIT an int.

``to_wire`` gives plain dicts/lists for msgpack (bytes stay bytes); ``to_json_wire``
the same with bytes as base64 strings.
"""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass
from typing import Any

from canal_server.positions import EntryPosition

__all__ = [
    "Column",
    "Entry",
    "EntryType",
    "EventType",
    "Header",
    "RowChange",
    "Value",
]

Value = int | float | str | bytes | None


class EntryType(enum.StrEnum):
    TRANSACTIONBEGIN = "TRANSACTIONBEGIN"
    ROWDATA = "ROWDATA"
    TRANSACTIONEND = "TRANSACTIONEND"


class EventType(enum.StrEnum):
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    QUERY = "QUERY"
    CREATE = "CREATE"
    ALTER = "ALTER"
    ERASE = "ERASE"
    TRUNCATE = "TRUNCATE"
    RENAME = "RENAME"
    CINDEX = "CINDEX"
    DINDEX = "DINDEX"
    GTID = "GTID"
    XACOMMIT = "XACOMMIT"
    HEARTBEAT = "HEARTBEAT"


@dataclass(frozen=True)
class Column:
    name: str
    value: Value
    is_key: bool
    updated: bool
    mysql_type: str
    is_null: bool

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

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Column:
        value = d["value"]
        if binary_as_base64 and isinstance(value, str) and _is_binary_type(d["mysql_type"]):
            value = base64.b64decode(value)
        return cls(
            d["name"],
            value,
            bool(d["is_key"]),
            bool(d["updated"]),
            d["mysql_type"],
            bool(d["is_null"]),
        )


_BINARY_TYPES = ("binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob", "geometry")


def _is_binary_type(mysql_type: str) -> bool:
    return mysql_type.split("(", 1)[0].lower() in _BINARY_TYPES


@dataclass(frozen=True)
class RowChange:
    """One changed row: ``before`` (UPDATE, DELETE) and ``after`` (INSERT, UPDATE)."""

    before: tuple[Column, ...] = ()
    after: tuple[Column, ...] = ()

    def to_wire(self, b64: bool = False) -> dict[str, Any]:
        return {
            "before": [c.to_wire(b64) for c in self.before],
            "after": [c.to_wire(b64) for c in self.after],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any], b64: bool = False) -> RowChange:
        return cls(
            tuple(Column.from_wire(c, b64) for c in d.get("before", [])),
            tuple(Column.from_wire(c, b64) for c in d.get("after", [])),
        )


@dataclass(frozen=True)
class Header:
    logfile: str
    offset: int
    end_offset: int
    server_id: int
    timestamp_ms: int
    gtid: str = ""
    schema: str = ""
    table: str = ""
    event_type: EventType = EventType.QUERY

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
            "event_type": self.event_type.value,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Header:
        return cls(
            d["logfile"],
            int(d["offset"]),
            int(d.get("end_offset", d["offset"])),
            int(d["server_id"]),
            int(d["timestamp_ms"]),
            d.get("gtid", ""),
            d.get("schema", ""),
            d.get("table", ""),
            EventType(d.get("event_type", "QUERY")),
        )


@dataclass(frozen=True)
class Entry:
    """One entry of a batch.

    ``gtid_state`` is the GTID state after this entry's transaction (for GTID resume);
    it is internal and not part of the wire form.
    """

    type: EntryType
    header: Header
    is_ddl: bool = False
    sql: str = ""
    rows: tuple[RowChange, ...] = ()
    gtid_state: str = ""

    def position(self) -> EntryPosition:
        """Where reading resumes after this entry."""
        h = self.header
        return EntryPosition(
            journal=h.logfile,
            offset=h.end_offset,
            server_id=h.server_id,
            gtid=self.gtid_state,
            timestamp_ms=h.timestamp_ms,
            included=True,
        )

    @property
    def full_name(self) -> str:
        """``schema.table`` as the filters see it."""
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

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Entry:
        return cls(
            EntryType(d["type"]),
            Header.from_wire(d["header"]),
            bool(d.get("is_ddl", False)),
            d.get("sql", ""),
            tuple(RowChange.from_wire(r, binary_as_base64) for r in d.get("rows", [])),
        )
