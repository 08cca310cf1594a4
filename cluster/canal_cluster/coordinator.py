"""The coordination store seen by the HA logic: an abstract ``Coordinator`` and its values.

The election and meta code talks only to this interface (the way Patroni's AbstractDCS
keeps HA logic apart from the store); ``EtcdCoordinator`` implements it on etcd and
the tests' ``MemoryCoordinator`` (tests/memory_coordinator.py) in memory. Semantics both follow:

- every key carries etcd's ``create_revision`` / ``mod_revision``; revisions grow by
  one per write transaction; a key's create revision is the **epoch** of whoever
  created it;
- ``campaign`` = txn ``create_revision(key) == 0 → put(value, lease)``;
- ``fenced_txn`` applies puts/deletes only if ``create_revision(running key) == epoch``,
  else raises ``Fenced``;
- watches survive outages: they are re-established from the last seen revision; when
  events may have been lost (compaction) the callback gets a ``RESYNC`` event and the
  caller must re-read;
- every call is bounded by ``timeout_s``; failures to reach the store raise
  ``CoordinatorUnavailable``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "CampaignResult",
    "Coordinator",
    "Delete",
    "KeyValue",
    "Lease",
    "Op",
    "Put",
    "RangeResult",
    "Watch",
    "WatchCallback",
    "WatchEvent",
    "WatchEventType",
]


@dataclass(frozen=True)
class KeyValue:
    """One key as stored: value plus etcd's revisions and lease id (0 = no lease)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int = 1
    lease: int = 0


@dataclass(frozen=True)
class RangeResult:
    """The keys under a prefix (sorted by key) and the store revision of the read."""

    items: tuple[KeyValue, ...]
    revision: int


@dataclass(frozen=True)
class Lease:
    """A granted lease: its id and the TTL the store granted (seconds)."""

    id: int
    ttl_s: int


@dataclass(frozen=True)
class CampaignResult:
    """Outcome of a campaign: ``epoch`` when won, else the current ``holder`` (if any)."""

    won: bool
    epoch: int | None = None
    holder: KeyValue | None = None


@dataclass(frozen=True)
class Put:
    """Put ``value`` at ``key`` (attached to ``lease`` when given)."""

    key: str
    value: bytes
    lease: Lease | None = None


@dataclass(frozen=True)
class Delete:
    """Delete ``key`` (every key under it when ``prefix``)."""

    key: str
    prefix: bool = False


Op = Put | Delete


class WatchEventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"
    RESYNC = "resync"  # events may have been missed: re-read the watched keys


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by a watch; DELETE carries an empty value and create revision 0."""

    type: WatchEventType
    key: str
    value: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0


WatchCallback = Callable[[WatchEvent], None]


class Watch(ABC):
    """A live watch; ``cancel`` stops it (idempotent)."""

    @abstractmethod
    def cancel(self) -> None: ...


class Coordinator(ABC):
    """The primitives the election and the meta managers need from a store like etcd."""

    @property
    @abstractmethod
    def timeout_s(self) -> float:
        """Upper bound of one call (the election checks its TTL against it)."""

    # -- leases -------------------------------------------------------------------

    @abstractmethod
    def grant_lease(self, ttl_s: float) -> Lease:
        """A new lease of ``ttl_s`` seconds (rounded up to whole seconds)."""

    @abstractmethod
    def keepalive(self, lease: Lease) -> int:
        """Refresh ``lease``; returns its new TTL. ``Fenced`` when it has expired."""

    @abstractmethod
    def revoke(self, lease: Lease) -> None:
        """Revoke ``lease`` (deletes its keys); an unknown lease is not an error."""

    # -- election -----------------------------------------------------------------

    @abstractmethod
    def campaign(self, key: str, value: bytes, lease: Lease) -> CampaignResult:
        """Create ``key`` under ``lease`` unless it exists; epoch = its create revision."""

    @abstractmethod
    def resign(self, key: str, epoch: int) -> bool:
        """Delete ``key`` only if its create revision is still ``epoch``."""

    @abstractmethod
    def fenced_txn(self, running_key: str, epoch: int, ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if ``create_revision(running_key) == epoch``.

        Returns the store revision after the write; raises ``Fenced`` otherwise.
        """

    # -- plain keys -----------------------------------------------------------------

    @abstractmethod
    def get(self, key: str) -> KeyValue | None:
        """The key, or None."""

    @abstractmethod
    def get_prefix(self, prefix: str) -> RangeResult:
        """Every key starting with ``prefix``, sorted by key."""

    @abstractmethod
    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        """Unconditional put (node records, tests); returns the new revision."""

    @abstractmethod
    def delete(self, key: str, prefix: bool = False) -> int:
        """Delete ``key`` (or the prefix); returns how many keys were deleted."""

    def register(self, key: str, value: bytes, lease: Lease) -> int:
        """Node registration: ``key`` lives as long as ``lease`` is kept alive."""
        return self.put(key, value, lease)

    def check_access(self, prefix: str, write: bool = True) -> None:
        """Raise ``CoordinatorAccessDenied`` when the store refuses us reads (and with
        ``write``, writes) under ``prefix``; ``CoordinatorUnavailable`` when it does not
        answer. Writes nothing. The default has nothing to check (no access control)."""
        return None

    # -- watches --------------------------------------------------------------------

    @abstractmethod
    def watch(
        self,
        key: str,
        callback: WatchCallback,
        prefix: bool = False,
        start_revision: int | None = None,
    ) -> Watch:
        """Call ``callback`` for every change of ``key`` (or under the prefix).

        Never raises for an unreachable store: the watch is (re-)established in the
        background, resuming after the last revision it saw. Callbacks run on a
        watch thread and must be quick.
        """

    @abstractmethod
    def close(self) -> None:
        """Cancel every watch and release connections."""
