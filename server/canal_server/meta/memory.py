"""Client metadata of one destination (Canal's CanalMetaManager), in memory.

Per client id: the subscription filter, the cursor (LogPosition of the last acked
entry), the outstanding batches ("marks": batch id → PositionRange, in id order)
and the last batch id ever issued. Batch ids grow per client and never repeat:
the counter is part of the metadata (``MetaSnapshot``), kept across unsubscribe,
so it survives failover once flushed.

The manager is deliberately dumb storage: the get/ack/rollback rules live in
``EmbeddedServer``. A MetaManager is per destination because the destination's
leader (and its epoch) owns all of it.

Persistence hook: every change bumps ``version``. ``snapshot()`` returns an
immutable ``MetaSnapshot`` (with that version) and ``restore(snapshot)`` replaces
the whole state. A periodic flusher (the etcd-backed manager) takes a snapshot,
writes it (or its diff against the last flushed one) when its version differs from
the last flushed version, and remembers that version. Unlike a "dirty" flag this
cannot lose a change made during a flush; ``dirty_since(version)`` is the check.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from canal_protocol.positions import LogPosition

__all__ = [
    "ClientMeta",
    "MemoryMetaManager",
    "MetaManager",
    "MetaSnapshot",
    "PositionRange",
]


@dataclass(frozen=True)
class PositionRange:
    """A batch's positions: of its first and of its last (raw, unfiltered) entry."""

    start: LogPosition
    end: LogPosition

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start.to_dict(), "end": self.end.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PositionRange:
        return cls(LogPosition.from_dict(d["start"]), LogPosition.from_dict(d["end"]))


@dataclass(frozen=True)
class ClientMeta:
    """Everything kept for one client id."""

    filter: str = ""
    cursor: LogPosition | None = None
    batches: tuple[tuple[int, PositionRange], ...] = ()
    subscribed: bool = True
    last_batch_id: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "filter": self.filter,
            "cursor": self.cursor.to_dict() if self.cursor else None,
            "batches": [[bid, r.to_dict()] for bid, r in self.batches],
            "subscribed": self.subscribed,
            "last_batch_id": self.last_batch_id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClientMeta:
        cursor = d.get("cursor")
        return cls(
            filter=str(d.get("filter", "")),
            cursor=LogPosition.from_dict(cursor) if cursor else None,
            batches=tuple((int(b), PositionRange.from_dict(r)) for b, r in d.get("batches", [])),
            subscribed=bool(d.get("subscribed", True)),
            last_batch_id=int(d.get("last_batch_id", 0)),
        )


@dataclass(frozen=True)
class MetaSnapshot:
    """A full, immutable copy of one destination's metadata.

    ``clients`` also holds unsubscribed client ids (``subscribed=False``) whose only
    content is their batch id counter. ``extras`` are other values the leader keeps
    fenced with the rest (the incremental snapshots' progress): key relative to the
    destination's prefix (``snapshots/{id}``) → bytes.
    """

    destination: str
    clients: Mapping[str, ClientMeta] = field(default_factory=dict)
    version: int = 0
    origin: LogPosition | None = None
    extras: Mapping[str, bytes] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "version": self.version,
            "clients": {c: m.to_dict() for c, m in sorted(self.clients.items())},
            "origin": self.origin.to_dict() if self.origin else None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MetaSnapshot:
        clients = {str(c): ClientMeta.from_dict(m) for c, m in d.get("clients", {}).items()}
        origin = LogPosition.from_dict(d["origin"]) if d.get("origin") else None
        return cls(
            str(d["destination"]), MappingProxyType(clients), int(d.get("version", 0)), origin
        )


class MetaManager(ABC):
    """Subscriptions, cursors and batch marks of one destination.

    Reads of an unknown or unsubscribed client return None / empty; writes to a
    client that is not subscribed raise KeyError (the embedded server checks
    first and raises NotSubscribed). Implementations must be thread-safe.
    """

    destination: str

    # subscriptions
    @abstractmethod
    def subscribe(self, client: str, filter: str) -> None:
        """Subscribe, or change the filter of an existing subscription."""

    @abstractmethod
    def unsubscribe(self, client: str) -> None:
        """Forget the filter, cursor and batches (the batch id counter is kept)."""

    @abstractmethod
    def is_subscribed(self, client: str) -> bool: ...

    @abstractmethod
    def subscription(self, client: str) -> str | None:
        """The client's filter, None if not subscribed."""

    @abstractmethod
    def clients(self) -> list[str]:
        """Subscribed client ids, sorted."""

    # cursors
    @abstractmethod
    def cursor(self, client: str) -> LogPosition | None: ...

    @abstractmethod
    def update_cursor(self, client: str, position: LogPosition) -> None: ...

    # batches
    @abstractmethod
    def add_batch(self, client: str, positions: PositionRange) -> int:
        """Record a new outstanding batch; returns its id (last issued + 1)."""

    @abstractmethod
    def batch(self, client: str, batch_id: int) -> PositionRange | None: ...

    @abstractmethod
    def batches(self, client: str) -> list[tuple[int, PositionRange]]:
        """Outstanding batches in id order."""

    @abstractmethod
    def remove_batch(self, client: str, batch_id: int) -> PositionRange | None: ...

    @abstractmethod
    def last_batch_id(self, client: str) -> int:
        """The last batch id ever issued to the client (0 if none)."""

    # persistence
    @property
    @abstractmethod
    def version(self) -> int:
        """Bumped by every change."""

    def dirty_since(self, version: int) -> bool:
        return self.version != version

    def flush(self) -> bool:
        """Make what changed durable now; True if anything was written. In memory:
        nothing to do. (The etcd-backed manager writes, or raises when it cannot.)"""
        return False

    @abstractmethod
    def origin(self) -> LogPosition | None:
        """Where the destination's history starts: the first leader's start position.

        A client without a cursor counts as being here, so a new leader never starts
        after changes that such a client has not acked yet."""

    @abstractmethod
    def set_origin(self, position: LogPosition) -> None: ...

    @abstractmethod
    def snapshot(self) -> MetaSnapshot: ...

    @abstractmethod
    def restore(self, snapshot: MetaSnapshot) -> None:
        """Replace the whole state (e.g. with what etcd holds, on becoming leader)."""


@dataclass
class _Client:
    filter: str = ""
    cursor: LogPosition | None = None
    batches: dict[int, PositionRange] = field(default_factory=dict)
    subscribed: bool = True
    last_batch_id: int = 0

    def frozen(self) -> ClientMeta:
        batches = tuple(sorted(self.batches.items()))
        return ClientMeta(self.filter, self.cursor, batches, self.subscribed, self.last_batch_id)

    @classmethod
    def thaw(cls, m: ClientMeta) -> _Client:
        return cls(m.filter, m.cursor, dict(m.batches), m.subscribed, m.last_batch_id)


class MemoryMetaManager(MetaManager):
    """The in-memory MetaManager; also the state an etcd-backed manager wraps."""

    def __init__(self, destination: str) -> None:
        self.destination = destination
        self._lock = threading.RLock()
        self._clients: dict[str, _Client] = {}
        self._origin: LogPosition | None = None
        self._extras: dict[str, bytes] = {}
        self._version = 0

    def _changed(self) -> None:
        self._version += 1

    def _sub(self, client: str) -> _Client:
        c = self._clients.get(client)
        if c is None or not c.subscribed:
            raise KeyError(f"{self.destination}: client {client!r} is not subscribed")
        return c

    def _get(self, client: str) -> _Client | None:
        c = self._clients.get(client)
        return c if c is not None and c.subscribed else None

    def subscribe(self, client: str, filter: str) -> None:
        with self._lock:
            c = self._clients.get(client)
            if c is None:
                self._clients[client] = _Client(filter=filter)
            elif not c.subscribed:
                self._clients[client] = _Client(filter=filter, last_batch_id=c.last_batch_id)
            elif c.filter == filter:
                return
            else:
                c.filter = filter
            self._changed()

    def unsubscribe(self, client: str) -> None:
        with self._lock:
            c = self._get(client)
            if c is not None:
                self._clients[client] = _Client(subscribed=False, last_batch_id=c.last_batch_id)
                self._changed()

    def is_subscribed(self, client: str) -> bool:
        with self._lock:
            return self._get(client) is not None

    def subscription(self, client: str) -> str | None:
        with self._lock:
            c = self._get(client)
            return c.filter if c is not None else None

    def clients(self) -> list[str]:
        with self._lock:
            return sorted(k for k, c in self._clients.items() if c.subscribed)

    def cursor(self, client: str) -> LogPosition | None:
        with self._lock:
            c = self._get(client)
            return c.cursor if c is not None else None

    def update_cursor(self, client: str, position: LogPosition) -> None:
        with self._lock:
            self._sub(client).cursor = position
            self._changed()

    def add_batch(self, client: str, positions: PositionRange) -> int:
        with self._lock:
            c = self._sub(client)
            c.last_batch_id += 1
            c.batches[c.last_batch_id] = positions
            self._changed()
            return c.last_batch_id

    def batch(self, client: str, batch_id: int) -> PositionRange | None:
        with self._lock:
            c = self._get(client)
            return c.batches.get(batch_id) if c is not None else None

    def batches(self, client: str) -> list[tuple[int, PositionRange]]:
        with self._lock:
            c = self._get(client)
            return sorted(c.batches.items()) if c is not None else []

    def remove_batch(self, client: str, batch_id: int) -> PositionRange | None:
        with self._lock:
            removed = self._sub(client).batches.pop(batch_id, None)
            if removed is not None:
                self._changed()
            return removed

    def last_batch_id(self, client: str) -> int:
        with self._lock:
            c = self._clients.get(client)
            return c.last_batch_id if c is not None else 0

    def origin(self) -> LogPosition | None:
        with self._lock:
            return self._origin

    def set_origin(self, position: LogPosition) -> None:
        with self._lock:
            if self._origin != position:
                self._origin = position
                self._changed()

    def extras(self) -> dict[str, bytes]:
        """The extra values (``MetaSnapshot.extras``), a copy."""
        with self._lock:
            return dict(self._extras)

    def set_extra(self, key: str, value: bytes | None) -> None:
        """Set (None: delete) one extra value; flushed like everything else."""
        with self._lock:
            if value is None:
                if self._extras.pop(key, None) is None:
                    return
            elif self._extras.get(key) == value:
                return
            else:
                self._extras[key] = value
            self._changed()

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def snapshot(self) -> MetaSnapshot:
        with self._lock:
            clients = {k: c.frozen() for k, c in self._clients.items()}
            return MetaSnapshot(
                self.destination, MappingProxyType(clients), self._version, self._origin,
                MappingProxyType(dict(self._extras)),
            )  # fmt: skip

    def restore(self, snapshot: MetaSnapshot) -> None:
        if snapshot.destination != self.destination:
            raise ValueError(
                f"snapshot of {snapshot.destination!r} restored into {self.destination!r}"
            )
        with self._lock:
            self._clients = {k: _Client.thaw(m) for k, m in snapshot.clients.items()}
            self._origin = snapshot.origin
            self._extras = dict(snapshot.extras)
            self._version = max(self._version, snapshot.version) + 1
