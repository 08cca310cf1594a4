"""Rows and offsets of the Spark source, without importing pyspark.

One Spark row per changed row (``FIELDS`` in order):

* ``before`` / ``after`` are ``map<string,string>``: column name → value as text, so one
  schema fits every table. NULL is a null map value; integers (unsigned included) are
  decimal text; DECIMAL, temporal and JSON values are the lossless strings of the wire;
  binary values are base64. Missing image (``before`` of an INSERT, ``after`` of a
  DELETE, both of DDL) is a null map.
* ``primary_key`` is the JSON object of the key columns in table order with values as in
  the maps, e.g. ``{"id":"42"}`` (of ``after``, of ``before`` for DELETE); null when the
  table has no key and for DDL.
* A DDL entry gives one row with ``is_ddl = true``, its ``sql`` and null maps.
* ``(logfile, offset, part, snapshot, row_index)`` identifies a change: the binlog
  event and the row in it. ``part`` is the event's place inside a MySQL 8 compressed
  transaction (its rows events all have the payload event's offset; 0 outside one),
  ``snapshot`` the ordinal of an incremental snapshot's entry at that position (its
  chunks' READ rows share it; 0 for the binlog's own changes).

Entries are ordered by their **key** (``canal_protocol.ordering.EntryKey``):
``(logfile, offset)``, the event's start in the binlog of the database the destination
reads, and across a database switch (another database, other binlog names) the entry's
GTID and place in its transaction. It is also how the source recognises entries a
server delivers twice. An **offset** of
the source is the JSON dict
``{"v": 1, "total": n, "last": {"file": f, "pos": p, ...}, "batches": [ids], "loose": m}``
(``last`` also has the key's ``source``, ``gtid``, ``sub``, ``end``, ``part`` and ``snap``
when known): ``total`` entries since the query began, the key of the last of them, the
server batches they came in (the batch ids are a hint for re-fetching; the key and the
count are what makes a replay exact), and how many of the entries were snapshot
entries or BEGINs (a new leader puts snapshot chunks again elsewhere: a replay checks
the count of the others).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from canal_protocol.ordering import MIN_KEY, EntryKey

__all__ = [
    "ADDED_FIELDS",
    "FIELDS",
    "Offset",
    "entry_rows",
    "entry_timestamp_ms",
    "value_text",
]

# Columns added after the first release go last (typed mode: after ``raw``), so that every
# older column keeps its place for code that reads rows by position.
ADDED_FIELDS: tuple[tuple[str, str], ...] = (("part", "int"), ("snapshot", "int"))
FIELDS: tuple[tuple[str, str], ...] = (
    ("schema", "string"),
    ("table", "string"),
    ("event_type", "string"),
    ("is_ddl", "boolean"),
    ("sql", "string"),
    ("gtid", "string"),
    ("logfile", "string"),
    ("offset", "bigint"),
    ("row_index", "int"),
    ("server_id", "bigint"),
    ("commit_ts", "timestamp"),
    ("before", "map<string,string>"),
    ("after", "map<string,string>"),
    ("primary_key", "string"),
    *ADDED_FIELDS,
)

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Offset:
    """A point of the stream: ``total`` entries so far, the last one's key, its batches;
    ``loose``: how many of the entries were snapshot entries or BEGINs, which a new
    leader may deliver at other keys (None: not known, an offset of an older version)."""

    total: int = 0
    last: EntryKey = MIN_KEY
    batches: tuple[int, ...] = ()
    loose: int | None = 0

    def to_dict(self) -> dict[str, Any]:
        out = {"v": 1, "total": self.total, "last": self.last.to_dict(), "batches": [*self.batches]}
        return out if self.loose is None else {**out, "loose": self.loose}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Offset:
        if d.get("v") != 1:
            raise ValueError(f"not an offset of the canal source: {d!r}")
        loose = d.get("loose")
        return cls(
            int(d["total"]), EntryKey.from_dict(d["last"]), tuple(int(b) for b in d["batches"]),
            None if loose is None else int(loose),
        )  # fmt: skip


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Attribute of a model object or key of a wire dict."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))


def entry_timestamp_ms(entry: Any) -> int:
    return int(_get(_get(entry, "header"), "timestamp_ms", 0))


def value_text(value: Any, is_null: bool = False) -> str | None:
    """A column value as map text (see the module docstring)."""
    if is_null or value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _image(columns: Any) -> dict[str, str | None] | None:
    if not columns:
        return None
    return {
        str(_get(c, "name")): value_text(_get(c, "value"), bool(_get(c, "is_null", False)))
        for c in columns
    }


def _primary_key(columns: Any) -> str | None:
    keys = {
        str(_get(c, "name")): value_text(_get(c, "value"), bool(_get(c, "is_null", False)))
        for c in columns or ()
        if _get(c, "is_key", False)
    }
    return json.dumps(keys, separators=(",", ":"), ensure_ascii=False) if keys else None


def entry_rows(entry: Any) -> list[Row]:
    """The Spark rows of one entry (model object or docs/api.md wire dict), in ``FIELDS`` order."""
    if _text(_get(entry, "type")) != "ROWDATA":
        return []
    h = _get(entry, "header")
    event_type = _text(_get(h, "event_type", ""))
    ts = datetime.fromtimestamp(int(_get(h, "timestamp_ms", 0)) / 1000, tz=UTC)
    common = (str(_get(h, "schema", "")), str(_get(h, "table", "")), event_type)
    where = (str(_get(h, "gtid", "")), str(_get(h, "logfile", "")), int(_get(h, "offset", 0)))
    server_id = int(_get(h, "server_id", 0))
    added = (int(_get(h, "part", 0) or 0), int(_get(h, "snapshot", 0) or 0))
    if _get(entry, "is_ddl", False):
        sql = str(_get(entry, "sql", "") or "")
        return [(*common, True, sql, *where, 0, server_id, ts, None, None, None, *added)]
    rows: list[Row] = []
    for index, change in enumerate(_get(entry, "rows", ()) or ()):
        before, after = _get(change, "before", ()), _get(change, "after", ())
        key = _primary_key(before if event_type == "DELETE" else after or before)
        image = (_image(before), _image(after), key)
        rows.append((*common, False, None, *where, index, server_id, ts, *image, *added))
    return rows
