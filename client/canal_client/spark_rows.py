"""Rows, entry keys and offsets of the Spark source, without importing pyspark.

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

Entries are ordered by their **key** (``EntryKey``): ``(logfile, offset)``, the event's
start in the binlog of the database the destination reads, and across a database switch
(another database, other binlog names) the entry's GTID and place in its transaction.
It is also how the source recognises entries a server delivers twice. An **offset** of
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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any

__all__ = [
    "ADDED_FIELDS",
    "FIELDS",
    "MIN_KEY",
    "READ_PLACE",
    "EntryKey",
    "Offset",
    "entry_key",
    "entry_rows",
    "entry_timestamp_ms",
    "gtid_of",
    "gtid_order",
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
_SEQ = re.compile(r"\.(\d+)$")


_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
UNKNOWN_SUB = 1 << 30  # an entry's unknown place in its transaction sorts after the known
READ_PLACE = UNKNOWN_SUB + 1  # a snapshot entry's: after every entry of its GTID state


def gtid_of(gtid: str) -> tuple[int, int] | None:
    """``"0-1-42"`` → (domain, sequence number); None for anything else."""
    m = _GTID.match(gtid)
    return (int(m.group(1)), int(m.group(3))) if m else None


@lru_cache(maxsize=4096)
def _domains(gtid: str) -> dict[int, int] | None:
    """A MariaDB GTID or GTID state (``"0-1-42,1-2-7"``) → {domain: sequence number};
    None for anything else (MySQL's, none)."""
    seqs: dict[int, int] = {}
    for one in gtid.split(","):
        parsed = gtid_of(one.strip())
        if parsed is None:
            return None
        seqs[parsed[0]] = parsed[1]
    return seqs


def gtid_order(mine: str, theirs: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The sequence numbers that order two transactions (or GTID states, which a READ
    entry carries) across databases: of the one domain of either, or of every domain
    when both states have the same ones (states of one history compare that way); None
    when they cannot be compared (other domains, no GTIDs, MySQL's)."""
    a, b = _domains(mine), _domains(theirs)
    if not a or not b:
        return None
    if len(a) > 1 and len(b) > 1:
        same = a.keys() == b.keys()
        return (tuple(a[d] for d in sorted(a)), tuple(b[d] for d in sorted(a))) if same else None
    domain = next(iter(a if len(a) == 1 else b))
    if domain not in a or domain not in b:
        return None
    return (a[domain],), (b[domain],)


@dataclass(frozen=True)
class EntryKey:
    """Where an entry is: binlog order on one database; GTID order across two.

    ``(file, pos)`` is the event's start in the binlog of ``source`` (host:port of the
    database it was read from, "" when not known), then ``snap``, the ordinal of an
    incremental snapshot's entries put at that position (0 for binlog entries; READ
    entries of one chunk share a binlog position). Two keys of the same (or an unknown)
    source compare in that order, ``part`` (the entry's place inside a MySQL 8
    compressed transaction, whose entries all start at its payload event; 0 outside
    one) between ``pos`` and ``snap``. Keys of two databases (a database switch: other
    binlog names and offsets) compare by their transaction's GTID sequence number (same
    GTID domain; ``gtid_order``), ``sub``, the entry's place in its transaction (0: its
    BEGIN; -1: unknown, after the known ones), and ``snap``; without GTIDs they fall back
    to binlog order. A snapshot entry's ``gtid`` is the GTID state of the position it
    was put at and its place at least ``READ_PLACE``: after every entry of the
    transactions that state includes, before the next. ``end`` is where the next event
    starts (-1: unknown).
    """

    base: str
    number: int
    pos: int
    file: str
    source: str = ""
    gtid: str = ""
    sub: int = -1
    end: int = -1
    snap: int = 0
    part: int = 0

    @classmethod
    def of(cls, file: str, pos: int, **place: Any) -> EntryKey:
        m = _SEQ.search(file)
        if m is None:
            return cls(file, -1, pos, file, **place)
        return cls(file[: m.start()], int(m.group(1)), pos, file, **place)

    def _place(self) -> int:
        if self.snap:
            return max(self.sub, READ_PLACE)
        return self.sub if self.sub >= 0 else UNKNOWN_SUB

    def _orders(self, other: EntryKey) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        if self.source and other.source and self.source != other.source:
            seqs = gtid_order(self.gtid, other.gtid)
            if seqs is not None:
                return (
                    (*seqs[0], self._place(), self.snap),
                    (*seqs[1], other._place(), other.snap),
                )
        return (
            (self.base, self.number, self.pos, self.part, self.snap),
            (other.base, other.number, other.pos, other.part, other.snap),
        )

    def __lt__(self, other: EntryKey) -> bool:
        a, b = self._orders(other)
        return a < b

    def __le__(self, other: EntryKey) -> bool:
        a, b = self._orders(other)
        return a <= b

    def __gt__(self, other: EntryKey) -> bool:
        a, b = self._orders(other)
        return a > b

    def __ge__(self, other: EntryKey) -> bool:
        a, b = self._orders(other)
        return a >= b

    def same_event(self, other: EntryKey) -> bool:
        """The same binlog event (or snapshot entry) of the same database."""
        return (self.source, self.file, self.pos, self.part, self.snap) == (
            other.source, other.file, other.pos, other.part, other.snap,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "pos": self.pos}
        unset_values = (("source", ""), ("gtid", ""), ("sub", -1), ("end", -1), ("part", 0),
                        ("snap", 0))  # fmt: skip
        for name, unset in unset_values:
            if getattr(self, name) != unset:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EntryKey:
        return cls.of(
            str(d["file"]), int(d["pos"]), source=str(d.get("source", "")),
            gtid=str(d.get("gtid", "")), sub=int(d.get("sub", -1)), end=int(d.get("end", -1)),
            snap=int(d.get("snap", 0)), part=int(d.get("part", 0)),
        )  # fmt: skip

    def __str__(self) -> str:
        if not self.file:
            return "(start)"
        snap = (f"#{self.part}" if self.part else "") + (f"+r{self.snap}" if self.snap else "")
        return f"{self.file}:{self.pos}{snap}" + (f" ({self.gtid})" if self.gtid else "")


MIN_KEY = EntryKey.of("", 0)


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


def entry_key(entry: Any, source: str = "", sub: int = -1) -> EntryKey:
    """The key of an entry from its header (``source`` and ``sub``: see ``EntryKey``;
    by default no source, place in its transaction unknown)."""
    header = _get(entry, "header")
    get = header.get if type(header) is dict else partial(_get, header)  # a wire dict: fast
    return EntryKey.of(
        str(get("logfile", "")), int(get("offset", 0)), source=source,
        gtid=str(get("gtid", "") or ""), sub=sub, end=int(get("end_offset", -1)),
        snap=int(get("snapshot", 0) or 0), part=int(get("part", 0) or 0),
    )  # fmt: skip


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
