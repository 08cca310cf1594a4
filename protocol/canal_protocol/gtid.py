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

MySQL 8.3's tagged GTIDs (``uuid:tag:1-5``) are refused by ``parse``.

MariaDB's GTIDs are another thing: ``domain-server-seq``, numbered per replication
domain, and a server's state (``@@gtid_binlog_pos``, ``BINLOG_GTID_POS``, a Gtid_list
event, a position's ``gtid``) holds the last GTID of each domain. ``MariadbGtid`` is one,
``MariadbGtidState`` the state:

- immutable and canonical: one GTID per domain (a later one of a domain replaces an
  earlier), sorted by domain, so ``str`` gives MariaDB's text (``0-1-42,1-2-7``);
- ``parse`` names what is wrong in a ``ValueError``; ``read`` answers None instead (a
  MySQL GTID set, anything else);
- ``covers`` is "includes every transaction of": per domain, a sequence number at least
  as high (whatever server wrote it); ``order`` gives what orders two transactions or
  states of one history across databases (an entry's GTID against another's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Gtid",
    "GtidSet",
    "Interval",
    "MariadbGtid",
    "MariadbGtidState",
    "gtid_state_covers",
    "is_mariadb_gtid_state",
    "is_mysql_gtid_set",
]

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


# -- MariaDB ------------------------------------------------------------------------------

_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_MARIADB_STATE = re.compile(r"^\d+-\d+-\d+(,\d+-\d+-\d+)*$")


def is_mariadb_gtid_state(text: str) -> bool:
    """``0-1-42`` or ``0-1-42,1-2-7`` (spaces allowed): a MariaDB GTID state, not a
    MySQL GTID set, not ""."""
    return bool(_MARIADB_STATE.match(text.replace(" ", "")))


@dataclass(frozen=True, slots=True)
class MariadbGtid:
    """One MariaDB GTID: ``domain-server-seq``."""

    domain: int
    server_id: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> MariadbGtid:
        """``"0-1-42"``; ``ValueError`` naming the text otherwise."""
        m = _MARIADB_GTID.match(text.strip())
        if m is None:
            raise ValueError(f"MariaDB GTID: {text.strip()!r} is not domain-server-seq")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)))

    @classmethod
    def read(cls, text: str) -> MariadbGtid | None:
        """``parse``, or None for anything but one MariaDB GTID."""
        m = _MARIADB_GTID.match(text)
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"


Seqs = tuple[int, ...]


@dataclass(frozen=True)
class MariadbGtidState:
    """A MariaDB GTID state; see the module doc. Build with ``parse``/``read``/``of``."""

    gtids: tuple[MariadbGtid, ...] = ()  # one per domain, by domain

    # -- building

    @classmethod
    def of(cls, gtids: Iterable[MariadbGtid]) -> MariadbGtidState:
        """From GTIDs in any order; of a domain given twice, the later one."""
        last = {g.domain: g for g in gtids}
        return cls(tuple(last[d] for d in sorted(last)))

    @classmethod
    def parse(cls, text: str) -> MariadbGtidState:
        """``"0-1-42,1-2-7"`` (MariaDB's text; "" is the empty state, empty parts are
        passed over); ``ValueError`` naming the part that is not a GTID."""
        return cls.of(MariadbGtid.parse(p) for p in text.split(",") if p.strip())

    @classmethod
    def read(cls, text: str) -> MariadbGtidState | None:
        """``parse``, or None when ``text`` is not a MariaDB state (a MySQL GTID set)."""
        try:
            return cls.parse(text)
        except ValueError:
            return None

    def with_gtid(self, gtid: MariadbGtid) -> MariadbGtidState:
        """The state after transaction ``gtid`` (it replaces its domain's GTID)."""
        gtids = self.gtids
        if len(gtids) == 1 and gtids[0].domain == gtid.domain:  # one domain: the usual case
            return MariadbGtidState((gtid,))
        return MariadbGtidState.of((*gtids, gtid))

    def with_state(self, other: MariadbGtidState) -> MariadbGtidState:
        """This state with ``other``'s GTIDs replacing those of their domains."""
        return MariadbGtidState.of((*self.gtids, *other.gtids))

    # -- reading

    def __str__(self) -> str:
        return ",".join(map(str, self.gtids))

    def __bool__(self) -> bool:
        return bool(self.gtids)

    def __len__(self) -> int:
        """How many domains the state has."""
        return len(self.gtids)

    def __iter__(self) -> Iterator[MariadbGtid]:
        return iter(self.gtids)

    @property
    def seqs(self) -> dict[int, int]:
        """{domain: sequence number}."""
        return {g.domain: g.seq for g in self.gtids}

    def __contains__(self, gtid: object) -> bool:
        """Whether transaction ``gtid`` (a ``MariadbGtid`` or its text) is included."""
        if isinstance(gtid, str):
            gtid = MariadbGtid.read(gtid.strip())
        if not isinstance(gtid, MariadbGtid):
            return False
        return self.seqs.get(gtid.domain, -1) >= gtid.seq

    # -- comparing

    def covers(self, other: MariadbGtidState) -> bool:
        """Whether every transaction ``other`` includes is included (the empty state is
        covered by every state): per domain, a sequence number at least as high."""
        mine = self.seqs
        return all(mine.get(g.domain, -1) >= g.seq for g in other.gtids)

    def order(self, other: MariadbGtidState) -> tuple[Seqs, Seqs] | None:
        """The sequence numbers that order two transactions (or GTID states) of one
        history across databases: of the one domain of either, or of every domain when
        both have the same several domains; None when they cannot be compared (other
        domains, an empty state)."""
        if not self.gtids or not other.gtids:
            return None
        a, b = self.seqs, other.seqs
        if len(a) > 1 and len(b) > 1:
            return (tuple(a.values()), tuple(b.values())) if a.keys() == b.keys() else None
        domain = next(iter(a if len(a) == 1 else b))
        if domain not in a or domain not in b:
            return None
        return (a[domain],), (b[domain],)


def gtid_state_covers(state: str, wanted: str) -> bool:
    """Whether the GTID state ``state`` includes every transaction of ``wanted``, both
    text: MariaDB states (``MariadbGtidState.covers``) or MySQL GTID sets (the subset
    order). "" includes nothing and is included in every state; a state of the other
    kind includes none of ``wanted``'s transactions. ``ValueError`` for anything else."""
    if is_mysql_gtid_set(state) or is_mysql_gtid_set(wanted):
        if not wanted.strip():
            return True
        if not is_mysql_gtid_set(state) or not is_mysql_gtid_set(wanted):
            return False
        return GtidSet.parse(wanted) <= GtidSet.parse(state)
    return MariadbGtidState.parse(state).covers(MariadbGtidState.parse(wanted))
