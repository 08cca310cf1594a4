"""MySQL GTID sets (``uuid:1-5:7,uuid2:1-3``) as a position type.

A MySQL GTID is ``source_uuid:transaction_number``; a server's state (``@@gtid_executed``,
``@@gtid_purged``, a PREVIOUS_GTIDS event, the set a COM_BINLOG_DUMP_GTID sends) is a
set of them, written per source uuid as closed intervals. ``GtidSet`` is that set:

- immutable and canonical: uuids lower case and sorted, intervals sorted, disjoint and
  not adjacent (``1-3:4-5`` is ``1-5``), so equal sets have equal text;
- ``|`` (``union``) merges, ``add`` adds one transaction, ``-`` (``difference``) removes;
- ``in`` tests one GTID (``"uuid:7" in s``), ``<=``/``<``/``>=``/``>`` are the subset
  order (a partial order: two sets may be incomparable; ``sorted`` of GtidSets is not
  meaningful, ``GtidSet.sort_key`` is a total order consistent with ``<`` for callers
  that need one);
- ``parse`` accepts what MySQL prints (whitespace and newlines after commas, upper-case
  uuids, ``uuid:5`` for ``uuid:5-5``) and names what is wrong in a ``ValueError``.

MariaDB's GTID state (``domain-server-seq`` per domain) is another thing; MySQL 8.3's
tagged GTIDs (``uuid:tag:1-5``) are refused by ``parse``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Gtid", "GtidSet", "Interval", "is_mysql_gtid_set"]

Interval = tuple[int, int]  # closed: (first, last), 1 <= first <= last
Gtid = tuple[str, int]  # (uuid, transaction number)

_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_MAX_GNO = (1 << 63) - 1  # MySQL's GNO_END is 2^63 - 1


def _uuid(text: str) -> str:
    u = text.strip().lower()
    if not _UUID.match(u):
        raise ValueError(f"GTID set: {text.strip()!r} is not a server uuid")
    h = u.replace("-", "")
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _interval(text: str, uuid: str) -> Interval:
    parts = text.strip().split("-")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"GTID set: interval {text.strip()!r} of {uuid} is not N or N-M")
    first, last = int(parts[0]), int(parts[-1])
    if not 1 <= first <= last <= _MAX_GNO:
        raise ValueError(f"GTID set: interval {text.strip()!r} of {uuid} is empty or out of range")
    return first, last


def _normalize(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    """Sorted, disjoint, non-adjacent intervals covering the same numbers."""
    out: list[Interval] = []
    for first, last in sorted(intervals):
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return tuple(out)


def _subtract(a: tuple[Interval, ...], b: tuple[Interval, ...]) -> tuple[Interval, ...]:
    out: list[Interval] = []
    for first, last in a:
        lo = first
        for bf, bl in b:
            if bl < lo or bf > last:
                continue
            if bf > lo:
                out.append((lo, bf - 1))
            lo = max(lo, bl + 1)
            if lo > last:
                break
        if lo <= last:
            out.append((lo, last))
    return tuple(out)


def _covers(outer: tuple[Interval, ...], inner: tuple[Interval, ...]) -> bool:
    return not _subtract(inner, outer)


@dataclass(frozen=True, eq=True)
class GtidSet:
    """A canonical MySQL GTID set; see the module doc. Build with ``parse``/``of``."""

    sets: tuple[tuple[str, tuple[Interval, ...]], ...] = ()

    # -- building

    @classmethod
    def parse(cls, text: str) -> GtidSet:
        """``"uuid:1-5:7,uuid2:1-3"`` (MySQL's text; "" is the empty set)."""
        found: dict[str, list[Interval]] = {}
        for part in text.replace("\n", "").split(","):
            if not part.strip():
                continue
            uuid_text, _, rest = part.partition(":")
            uuid = _uuid(uuid_text)
            if not rest.strip():
                raise ValueError(f"GTID set: {part.strip()!r} has no interval")
            found.setdefault(uuid, []).extend(_interval(i, uuid) for i in rest.split(":"))
        return cls.of(found)

    @classmethod
    def of(cls, intervals: Mapping[str, Iterable[Interval]]) -> GtidSet:
        """From {uuid: intervals} (any order, overlapping allowed)."""
        merged: dict[str, list[Interval]] = {}
        for uuid, ivs in intervals.items():
            for first, last in ivs:
                if not 1 <= first <= last <= _MAX_GNO:
                    raise ValueError(f"GTID set: interval {first}-{last} of {uuid} is invalid")
                merged.setdefault(_uuid(uuid), []).append((first, last))
        return cls(tuple((u, _normalize(merged[u])) for u in sorted(merged) if merged[u]))

    # -- reading

    def __str__(self) -> str:
        return ",".join(
            u + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in ivs) for u, ivs in self.sets
        )

    def __bool__(self) -> bool:
        return bool(self.sets)

    def __len__(self) -> int:
        """How many transactions the set holds."""
        return sum(b - a + 1 for _, ivs in self.sets for a, b in ivs)

    def __iter__(self) -> Iterator[Gtid]:
        for u, ivs in self.sets:
            for a, b in ivs:
                for n in range(a, b + 1):
                    yield (u, n)

    def intervals(self, uuid: str) -> tuple[Interval, ...]:
        return dict(self.sets).get(_uuid(uuid), ())

    def as_dict(self) -> dict[str, tuple[Interval, ...]]:
        return dict(self.sets)

    def __contains__(self, gtid: object) -> bool:
        """``"uuid:7"`` or ``(uuid, 7)`` in the set."""
        if isinstance(gtid, str):
            uuid, _, n = gtid.rpartition(":")
            gtid = (uuid, int(n))
        if not isinstance(gtid, tuple) or len(gtid) != 2:
            return False
        uuid, n = gtid
        return any(a <= int(n) <= b for a, b in self.intervals(str(uuid)))

    # -- combining

    def union(self, other: GtidSet) -> GtidSet:
        merged: dict[str, list[Interval]] = {}
        for u, ivs in (*self.sets, *other.sets):
            merged.setdefault(u, []).extend(ivs)
        return GtidSet(tuple((u, _normalize(merged[u])) for u in sorted(merged)))

    __or__ = union

    def difference(self, other: GtidSet) -> GtidSet:
        theirs = other.as_dict()
        out = ((u, _subtract(ivs, theirs.get(u, ()))) for u, ivs in self.sets)
        return GtidSet(tuple((u, ivs) for u, ivs in out if ivs))

    __sub__ = difference

    def add(self, uuid: str, number: int) -> GtidSet:
        """The set with one more transaction."""
        return self.union(GtidSet.of({uuid: [(number, number)]}))

    # -- the subset order

    def issubset(self, other: GtidSet) -> bool:
        theirs = other.as_dict()
        return all(_covers(theirs.get(u, ()), ivs) for u, ivs in self.sets)

    def __le__(self, other: Any) -> bool:
        if not isinstance(other, GtidSet):
            return NotImplemented
        return self.issubset(other)

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, GtidSet):
            return NotImplemented
        return self != other and self.issubset(other)

    def __ge__(self, other: Any) -> bool:
        if not isinstance(other, GtidSet):
            return NotImplemented
        return other.issubset(self)

    def __gt__(self, other: Any) -> bool:
        if not isinstance(other, GtidSet):
            return NotImplemented
        return self != other and other.issubset(self)

    def sort_key(self) -> tuple[int, str]:
        """A total order consistent with ``<`` (a proper subset has fewer transactions)."""
        return (len(self), str(self))


def is_mysql_gtid_set(text: str) -> bool:
    """True for MySQL GTID set text (``uuid:…``), False for MariaDB's ``0-1-42`` or ""."""
    return ":" in text
