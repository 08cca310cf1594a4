"""Where an entry lies: ``EntryKey`` and the order of entries across batches, leaders
and databases.

An entry's **key** is ``(logfile, offset)``, the start of its event in the binlog of the
database the destination reads, then its place inside a MySQL 8 compressed transaction
(``part``) and its incremental snapshot ordinal (``snap``). Across a database switch
(another database, other binlog names) keys compare by the entry's MariaDB GTID
(``MariadbGtidState.order``) and place in its transaction (``sub``). Every client path
(the connector's consumers, ``canal-ha consume``, the Spark source) orders entries and
recognises an entry delivered twice by it.

Entries and batches are read duck-typed: the ``canal_protocol`` models, docs/api.md's
wire dicts and the client's packed entries (a header dict) all have a key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any

from canal_protocol.gtid import MariadbGtid, MariadbGtidState

__all__ = [
    "AFTER_SNAPSHOTS",
    "MIN_KEY",
    "READ_PLACE",
    "UNKNOWN_SUB",
    "EntryKey",
    "batch_end",
    "batch_source",
    "entry_key",
    "gtid_order",
    "point_key",
]

_SEQ = re.compile(r"\.(\d+)$")
UNKNOWN_SUB = 1 << 30  # an entry's unknown place in its transaction sorts after the known
READ_PLACE = UNKNOWN_SUB + 1  # a snapshot entry's: after every entry of its GTID state
AFTER_SNAPSHOTS = 1 << 62  # a snapshot ordinal after every real one

_state = lru_cache(maxsize=4096)(MariadbGtidState.read)  # keys compare often: parse once


def gtid_order(mine: str, theirs: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``MariadbGtidState.order`` of two GTIDs or GTID states given as text (a READ
    entry carries a state); None when either is not a MariaDB one (MySQL's, none)."""
    a, b = _state(mine), _state(theirs)
    return a.order(b) if a is not None and b is not None else None


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


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Attribute of a model object or key of a wire dict."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


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


def point_key(
    journal: str, offset: int, source: str = "", state: str = "", snap: int = 0
) -> EntryKey:
    """The key of a position (where the next event starts): after every entry of the
    transactions a one-domain GTID ``state`` includes, across databases too; ``snap``:
    after the incremental snapshot's entry of that ordinal at this binlog position."""
    gtid = state.strip() if MariadbGtid.read(state.strip()) is not None else ""
    return EntryKey.of(journal, offset, source=source, gtid=gtid, sub=UNKNOWN_SUB + 1, snap=snap)


def batch_source(batch: Any) -> str:
    """The database a batch was read from (its ``end``'s identity), "" if not known."""
    for pos in (getattr(batch, "end", None), getattr(batch, "start", None)):
        address = str(getattr(pos, "source_address", "") or "")
        if address:
            return address
    return ""


def batch_end(batch: Any) -> EntryKey:
    """How far a batch reaches in the binlog: its ``end`` (the last raw event, ones the
    client filter dropped included), else where its last entry ends."""
    best, source = MIN_KEY, batch_source(batch)
    end: Any = getattr(batch, "end", None)
    journal = str(getattr(end, "journal", "") or "")
    if journal:
        snap = int(getattr(getattr(end, "position", None), "snapshot", 0) or 0)
        best = point_key(
            journal, int(end.offset), source, str(getattr(end, "gtid", "") or ""), snap
        )
        best = replace(best, part=int(getattr(getattr(end, "position", None), "part", 0) or 0))
    for entry in list(batch.entries)[-1:]:
        header = entry.header
        get = header.get if isinstance(header, Mapping) else partial(getattr, header)
        stop = int(get("end_offset", 0) or get("offset", 0))
        snap, part = int(get("snapshot", 0) or 0), int(get("part", 0) or 0)
        if part and entry.type != "TRANSACTIONEND":  # inside a compressed transaction
            stop = int(get("offset", 0))
        else:
            part = 0
        last = EntryKey.of(str(get("logfile", "")), stop, source=source, snap=snap, part=part)
        best = max(best, last)
    return best
