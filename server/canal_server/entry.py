"""The entry model of API.md (Canal's Entry), frozen, with its wire forms.

An ``Entry`` is one of TRANSACTIONBEGIN, ROWDATA or TRANSACTIONEND. ROWDATA entries
carry row changes or, for DDL, the statement (``is_ddl`` / ``sql``). ``header.offset``
is the start of the binlog event that produced the entry (what ``mariadb-binlog``
prints as ``# at N``); ``header.end_offset`` is where the next event starts, so
``Entry.position()`` is where reading would resume after this entry.

Values are lossless: ints (unsigned included) stay ints, DECIMAL is a string,
temporal types are ISO-8601 strings, binary is bytes (base64 text in JSON), JSON
columns are text, SET is a comma-separated string, BIT an int.

A ROWDATA entry of a rows event keeps its rows compactly (``RowImages``): the
table's column metadata once (``TableColumns``, shared by every entry of that table
map) and one tuple of values per row image. ``Entry.rows`` gives Canal's per-column
view (``RowChange`` of ``Column``) on demand; ``is_null`` is ``value is None`` and
``updated`` follows Canal: every column of an INSERT's after image, no column of a
before image, and in an UPDATE's after image the columns whose value changed.

``to_wire`` gives plain dicts/lists for msgpack (bytes stay bytes); ``to_json_wire``
the same with bytes as base64 strings. ``to_compact_wire`` is the compact layout
(``columns`` once, ``before``/``after`` as lists of value lists) that the Python
client asks for; the verbose per-column layout stays API.md's default.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack

from canal_client.model import (
    Column,
    EntryType,
    Image,
    RowChange,
    RowImages,
    TableColumns,
    Value,
    images_from_wire,
)
from canal_server.positions import EntryPosition

__all__ = [
    "Column",
    "Entry",
    "EntryType",
    "EventType",
    "Header",
    "PackedRows",
    "RowChange",
    "RowImages",
    "TableColumns",
    "Value",
]


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
class PackedRows:
    """A rows event's rows as the C decoder wrote them: msgpack bytes, no objects.

    ``packed_before`` / ``packed_after`` are each one msgpack array of value arrays
    (``b"\\x90"`` when empty), byte-identical to packing ``RowImages.before`` /
    ``after``. The value tuples are made only when something asks for them (a JSON or
    ``rows`` layout client, a filter on values): a compact msgpack batch sends these
    bytes as they are. Reads like a ``RowImages``.
    """

    columns: TableColumns
    count: int
    packed_before: bytes
    packed_after: bytes

    def __len__(self) -> int:
        return self.count

    @cached_property
    def images(self) -> RowImages:
        before = msgpack.unpackb(self.packed_before, raw=False, use_list=False)
        after = msgpack.unpackb(self.packed_after, raw=False, use_list=False)
        return RowImages(self.columns, before, after)

    @property
    def before(self) -> tuple[Image, ...]:
        return self.images.before

    @property
    def after(self) -> tuple[Image, ...]:
        return self.images.after

    def changes(self) -> tuple[RowChange, ...]:
        return self.images.changes()

    def to_compact_wire(self) -> dict[str, Any]:
        return self.images.to_compact_wire()


_PACKER = msgpack.Packer(use_bin_type=True)
_KEYS = {
    k: _PACKER.pack(k) for k in ("type", "header", "is_ddl", "sql", "columns", "before", "after")
}


@dataclass(frozen=True)
class Entry:
    """One entry of a batch.

    ``images`` holds a rows event's rows compactly; ``rows`` is Canal's per-column
    view of them, made on first use. ``gtid_state`` is the GTID state after this
    entry's transaction (for GTID resume); it is internal and not part of the wire form.
    """

    type: EntryType
    header: Header
    is_ddl: bool = False
    sql: str = ""
    images: RowImages | PackedRows | None = None
    gtid_state: str = ""

    @cached_property
    def rows(self) -> tuple[RowChange, ...]:
        return self.images.changes() if self.images is not None else ()

    @property
    def row_count(self) -> int:
        return len(self.images) if self.images is not None else 0

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
        """API.md's layout: ``rows`` of per-column objects."""
        return {
            "type": self.type.value,
            "header": self.header.to_wire(),
            "is_ddl": self.is_ddl,
            "sql": self.sql,
            "rows": [r.to_wire(binary_as_base64) for r in self.rows],
        }

    def to_json_wire(self) -> dict[str, Any]:
        return self.to_wire(binary_as_base64=True)

    def to_compact_wire(self) -> dict[str, Any]:
        """The compact layout: ``columns`` once and value lists instead of ``rows``."""
        wire: dict[str, Any] = {
            "type": self.type.value,
            "header": self.header.to_wire(),
            "is_ddl": self.is_ddl,
            "sql": self.sql,
        }
        if self.images is not None:
            wire.update(self.images.to_compact_wire())
        return wire

    @cached_property
    def packed_compact(self) -> bytes:
        """``to_compact_wire`` as msgpack, made once: every batch (every client, every
        re-fetch) that holds this entry reuses these bytes. Rows the C decoder wrote
        as msgpack (``PackedRows``) are joined in as they are."""
        rows = self.images
        if not isinstance(rows, PackedRows):
            return bytes(msgpack.packb(self.to_compact_wire(), use_bin_type=True))
        pack, keys = msgpack.Packer(use_bin_type=True).pack, _KEYS
        return b"".join((
            b"\x87", keys["type"], pack(self.type.value),
            keys["header"], pack(self.header.to_wire()),
            keys["is_ddl"], pack(self.is_ddl), keys["sql"], pack(self.sql),
            keys["columns"], rows.columns.packed, keys["before"], rows.packed_before,
            keys["after"], rows.packed_after,
        ))  # fmt: skip

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Entry:
        """Either layout."""
        return cls(
            EntryType(d["type"]),
            Header.from_wire(d["header"]),
            bool(d.get("is_ddl", False)),
            d.get("sql", ""),
            images_from_wire(d, binary_as_base64),
        )
