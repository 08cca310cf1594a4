"""The entry model (Canal's Entry), frozen, with its wire forms: defined once, here.

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
client asks for; the verbose per-column layout stays the API's default. ``from_wire``
reads either layout (``binary_as_base64``: a JSON body, binary values as base64 text).
The layouts are described in docs/api.md.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, TypeVar

from canal_protocol.positions import EntryPosition

__all__ = [
    "Column",
    "Entry",
    "EntryType",
    "EventType",
    "Header",
    "Image",
    "RowChange",
    "RowImages",
    "Rows",
    "TableColumns",
    "Value",
    "images_from_wire",
    "is_binary_type",
]

Value = int | float | str | bytes | None
_BINARY_TYPES = ("binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob", "geometry")


def is_binary_type(mysql_type: str) -> bool:
    return mysql_type.split("(", 1)[0].strip().lower() in _BINARY_TYPES


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
    READ = "READ"  # a row of an incremental snapshot (Debezium's "r"): ``after`` image only


# Members by value and values by member: a dict lookup where ``EventType(text)`` and
# ``member.value`` go through the enum machinery (a few µs per entry on the wire paths).
_ENTRY_TYPES = {m.value: m for m in EntryType}
_EVENT_TYPES = {m.value: m for m in EventType}
_ENTRY_VALUES = {m: m.value for m in EntryType}
_EVENT_VALUES = {m: m.value for m in EventType}


_E = TypeVar("_E", bound=enum.Enum)


def _member(members: dict[Any, _E], kind: type[_E], value: Any) -> _E:
    """``kind(value)`` by a dict lookup; the enum's own error for anything else."""
    try:
        return members[value]
    except (KeyError, TypeError):
        return kind(value)


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
        if binary_as_base64 and isinstance(value, str) and is_binary_type(mysql_type):
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
        return tuple(i for i, t in enumerate(self.mysql_types) if is_binary_type(t))

    def to_wire(self) -> dict[str, Any]:
        return {"names": self.names, "mysql_types": self.mysql_types, "keys": self.keys}

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


class Rows(Protocol):
    """What an entry's rows may be: ``RowImages``, or a server's form that reads like one
    (the server keeps the C decoder's msgpack bytes and makes tuples only when asked)."""

    @property
    def columns(self) -> TableColumns: ...

    @property
    def before(self) -> tuple[Image, ...]: ...

    @property
    def after(self) -> tuple[Image, ...]: ...

    def __len__(self) -> int: ...

    def changes(self) -> tuple[RowChange, ...]: ...

    def to_compact_wire(self) -> dict[str, Any]: ...


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
        if not d.get("rows"):
            return None  # a transaction's BEGIN or END, a DDL
        rows = [RowChange.from_wire(r, binary_as_base64) for r in d["rows"]]
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
    end_offset: int
    server_id: int
    timestamp_ms: int
    gtid: str = ""
    schema: str = ""
    table: str = ""
    event_type: EventType = EventType.QUERY
    snapshot: int = 0  # an incremental snapshot's entry: its ordinal at this binlog position
    part: int = 0  # an entry from inside a compressed transaction payload: 1, 2, ... in it

    def to_wire(self) -> dict[str, Any]:
        """The wire dict; ``snapshot`` only on the entries of an incremental snapshot,
        ``part`` only on those of a compressed transaction (MySQL 8 TRANSACTION_PAYLOAD)."""
        out: dict[str, Any] = {
            "logfile": self.logfile,
            "offset": self.offset,
            "end_offset": self.end_offset,
            "server_id": self.server_id,
            "timestamp_ms": self.timestamp_ms,
            "gtid": self.gtid,
            "schema": self.schema,
            "table": self.table,
            "event_type": _EVENT_VALUES[self.event_type],
        }
        if self.snapshot:
            out["snapshot"] = self.snapshot
        if self.part:
            out["part"] = self.part
        return out

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Header:
        get = d.get
        offset = int(get("offset", 0))
        event_type = get("event_type") or "QUERY"
        return cls(
            str(get("logfile", "")),
            offset,
            int(get("end_offset", offset)),
            int(get("server_id", 0)),
            int(get("timestamp_ms", 0)),
            str(get("gtid", "")),
            str(get("schema", "")),
            str(get("table", "")),
            _member(_EVENT_TYPES, EventType, event_type),
            int(get("snapshot", 0)),
            int(get("part", 0)),
        )


@dataclass(frozen=True)
class Entry:
    """One entry of a batch.

    ``images`` holds a rows event's rows compactly; ``rows`` is Canal's per-column
    view of them, made on first use. ``gtid_state`` is the server's GTID state to
    resume from after this entry: after its transaction for a TRANSACTIONEND or DDL,
    before it for the entries inside a transaction. ``xid`` (a TRANSACTIONEND's XID
    event) and ``thread_id`` (a MySQL TRANSACTIONBEGIN's ``BEGIN`` query) are what
    Canal's TransactionEnd/TransactionBegin carry; 0 where the binlog has none. None of
    the three is part of the wire form: an entry read from the wire has ``""`` and 0.
    """

    type: EntryType
    header: Header
    is_ddl: bool = False
    sql: str = ""
    images: Rows | None = None
    gtid_state: str = ""
    xid: int = 0
    thread_id: int = 0

    @cached_property
    def rows(self) -> tuple[RowChange, ...]:
        return self.images.changes() if self.images is not None else ()

    @property
    def row_count(self) -> int:
        return len(self.images) if self.images is not None else 0

    def position(self) -> EntryPosition:
        """Where reading resumes after this entry; inside a compressed transaction
        (``header.part``) the payload's start and the part, except for its END. Made
        once (the store and the sink both ask it of the entries they take)."""
        return self._position

    @cached_property
    def _position(self) -> EntryPosition:
        h = self.header
        inside = h.part > 0 and self.type is not EntryType.TRANSACTIONEND
        return EntryPosition(
            journal=h.logfile,
            offset=h.offset if inside else h.end_offset,
            server_id=h.server_id,
            gtid=self.gtid_state,
            timestamp_ms=h.timestamp_ms,
            included=True,
            snapshot=h.snapshot,
            part=h.part if inside else 0,
        )

    @property
    def full_name(self) -> str:
        """``schema.table`` as the filters see it."""
        return f"{self.header.schema}.{self.header.table}"

    def to_wire(self, binary_as_base64: bool = False) -> dict[str, Any]:
        """The default layout: ``rows`` of per-column objects."""
        return {
            "type": _ENTRY_VALUES[self.type],
            "header": self.header.to_wire(),
            "is_ddl": self.is_ddl,
            "sql": self.sql,
            "rows": [r.to_wire(binary_as_base64) for r in self.rows],
        }

    def to_json_wire(self) -> dict[str, Any]:
        return self.to_wire(binary_as_base64=True)

    def compact_head(self) -> dict[str, Any]:
        """The compact layout without the rows (``type``, ``header``, ``is_ddl``, ``sql``)."""
        return {
            "type": _ENTRY_VALUES[self.type],
            "header": self.header.to_wire(),
            "is_ddl": self.is_ddl,
            "sql": self.sql,
        }

    def to_compact_wire(self) -> dict[str, Any]:
        """The compact layout: ``columns`` once and value lists instead of ``rows``."""
        wire = self.compact_head()
        if self.images is not None:
            wire.update(self.images.to_compact_wire())
        return wire

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Entry:
        """Either layout (``rows``, or ``compact``)."""
        kind = d["type"]
        return cls(
            _member(_ENTRY_TYPES, EntryType, kind),
            Header.from_wire(d.get("header") or {}),
            bool(d.get("is_ddl", False)),
            str(d.get("sql") or ""),
            images_from_wire(d, binary_as_base64),
        )
