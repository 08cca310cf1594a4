"""Binlog positions, as Canal has them: EntryPosition, LogIdentity, LogPosition.

All are frozen and ordered. ``EntryPosition`` orders by (journal sequence, offset),
which is binlog order on one server. ``min_position`` is Canal's rule for the
minimum of two LogPositions: from the same source compare journal then offset,
otherwise compare commit timestamps (positions of different servers are not
comparable by offset).

Offsets here point *after* the event they describe (``ev.packet.log_pos``), so a
position is where reading resumes. Every type has a stable dict form (``to_dict`` /
``from_dict``) used for JSON, msgpack and etcd.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EntryPosition", "LogIdentity", "LogPosition", "journal_seq", "min_position"]

_SEQ = re.compile(r"\.(\d+)$")


@functools.lru_cache(maxsize=1024)
def journal_seq(journal: str) -> tuple[str, int]:
    """Sort key of a binlog file name: (base name, numeric suffix). Cached: every
    position made (several per transaction) asks it of the same few names."""
    m = _SEQ.search(journal)
    if m is None:
        return (journal, -1)
    return (journal[: m.start()], int(m.group(1)))


@dataclass(frozen=True, order=True)
class EntryPosition:
    """A point in one server's binlog.

    ``journal``/``offset`` locate it (offset = start of the next event); ``gtid`` is
    the MariaDB GTID state to resume from (e.g. ``"0-1-42"``, comma separated for
    several domains): including the transaction that ends at this position, the state
    before it when the position lies inside a transaction; ``timestamp_ms`` the commit
    time; ``included`` is Canal's flag (True: the event at this position was already
    consumed, resume after it). ``snapshot`` orders the READ entries of an incremental
    snapshot that sit at one binlog position: 0 for binlog entries, 1, 2, ... for the
    snapshot entries put after the binlog reached that position (docs/snapshot.md).
    ``part`` orders the entries of one MySQL 8 compressed transaction (one
    TRANSACTION_PAYLOAD event holds them all): a position with a part lies inside the
    transaction whose payload event *starts* at ``offset``, after its event number
    ``part`` (1, 2, ...; resume: read that transaction again, skipping what lies at or
    before the position); its TRANSACTIONEND's position is the payload's end with part
    0, like every position between transactions. Dict forms without it read as 0.
    """

    sort_key: tuple[tuple[str, int], int, int, int] = field(init=False, repr=False)
    journal: str = ""
    offset: int = 0
    server_id: int = 0
    gtid: str = ""
    timestamp_ms: int = 0
    included: bool = False
    snapshot: int = 0
    part: int = 0

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, not {self.offset}")
        if self.timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be >= 0, not {self.timestamp_ms}")
        if self.snapshot < 0:
            raise ValueError(f"snapshot must be >= 0, not {self.snapshot}")
        if self.part < 0:
            raise ValueError(f"part must be >= 0, not {self.part}")
        key = (journal_seq(self.journal), self.offset, self.part, self.snapshot)
        object.__setattr__(self, "sort_key", key)

    def to_dict(self) -> dict[str, Any]:
        """The dict form; ``snapshot`` and ``part`` only when not 0 (binlog positions keep
        their form)."""
        out: dict[str, Any] = {
            "journal": self.journal,
            "offset": self.offset,
            "server_id": self.server_id,
            "gtid": self.gtid,
            "timestamp_ms": self.timestamp_ms,
            "included": self.included,
        }
        if self.snapshot:
            out["snapshot"] = self.snapshot
        if self.part:
            out["part"] = self.part
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EntryPosition:
        return cls(
            journal=str(d.get("journal", "")),
            offset=int(d.get("offset", 0)),
            server_id=int(d.get("server_id", 0)),
            gtid=str(d.get("gtid", "")),
            timestamp_ms=int(d.get("timestamp_ms", 0)),
            included=bool(d.get("included", False)),
            snapshot=int(d.get("snapshot", 0)),
            part=int(d.get("part", 0)),
        )

    def __str__(self) -> str:
        gtid = f" gtid={self.gtid}" if self.gtid else ""
        snap = f"+r{self.snapshot}" if self.snapshot else ""
        part = f"#{self.part}" if self.part else ""
        return f"{self.journal}:{self.offset}{part}{snap}{gtid} ts={self.timestamp_ms}"


@dataclass(frozen=True, order=True)
class LogIdentity:
    """Where a position came from: the database address, our replication slave id, and
    the ``@@server_id`` of the database that answered there (``source_server_id``; 0:
    not known). A VIP can move to another database: positions read from two databases
    behind one address have different identities, so they are never compared by offset.
    """

    source_address: str = ""
    slave_id: int = 0
    source_server_id: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "source_address": self.source_address,
            "slave_id": self.slave_id,
            "source_server_id": self.source_server_id,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogIdentity:
        return cls(
            str(d.get("source_address", "")),
            int(d.get("slave_id", 0)),
            int(d.get("source_server_id", 0)),
        )

    def same_source(self, other: LogIdentity) -> bool:
        """The same database read as the same replica; a server id not known yet (0, e.g. a
        reader's start position before its dump named the server) matches any."""
        return (
            self.source_address == other.source_address
            and self.slave_id == other.slave_id
            and (
                self.source_server_id == other.source_server_id
                or 0 in (self.source_server_id, other.source_server_id)
            )
        )


@dataclass(frozen=True, order=True)
class LogPosition:
    """An EntryPosition together with the source it was read from."""

    identity: LogIdentity
    position: EntryPosition

    def to_dict(self) -> dict[str, Any]:
        return {"identity": self.identity.to_dict(), "position": self.position.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogPosition:
        return cls(
            LogIdentity.from_dict(d.get("identity") or {}),
            EntryPosition.from_dict(d.get("position") or {}),
        )

    # The position's fields, read flat (``batch.end.offset``).
    @property
    def journal(self) -> str:
        return self.position.journal

    @property
    def offset(self) -> int:
        return self.position.offset

    @property
    def gtid(self) -> str:
        return self.position.gtid

    @property
    def timestamp_ms(self) -> int:
        return self.position.timestamp_ms

    @property
    def source_address(self) -> str:
        return self.identity.source_address


def min_position(a: LogPosition, b: LogPosition) -> LogPosition:
    """Canal's minimum: same source → binlog order; different sources → older timestamp."""
    if a.identity == b.identity:
        return a if a.position.sort_key <= b.position.sort_key else b
    return a if a.position.timestamp_ms <= b.position.timestamp_ms else b
