"""Where the binlog reader resumes (Canal's CanalLogPositionManager family).

* ``MemoryLogPositionManager``: the latest position the reader sank, per destination;
  right while this process keeps leading.
* ``MetaLogPositionManager``: the minimum cursor over a destination's clients (Canal's
  ``min_position`` rule), read from its MetaManager; what a new leader resumes from.
  A client that has no cursor yet (or no client at all) counts as being at the
  destination's origin (the first leader's start position), so changes nobody
  acked are never skipped by a new leader. ``holders(destination, position)`` tells
  who pins a position: clients whose acked cursor it is, or the origin (and the
  clients that have no cursor yet).
  ``persist`` is a no-op: cursors are written by acks.
* ``FailbackLogPositionManager``: ``get_latest`` asks the primary, then the secondary;
  ``persist`` writes to the primary, and to the secondary only if the primary fails.
  The usual wiring is ``Failback(Memory, Meta)``.

Wiring rule: the memory position is only valid together with the store it filled.
When a destination's store is discarded (leadership lost, instance rebuilt), call
``MemoryLogPositionManager.forget(destination)``, otherwise the reader would resume
after entries that clients have not acked yet, and those would never be delivered.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from canal_protocol.positions import LogPosition, min_position
from canal_server.meta import MetaManager

__all__ = [
    "FailbackLogPositionManager",
    "Holders",
    "LogPositionManager",
    "MemoryLogPositionManager",
    "MetaLogPositionManager",
]

log = logging.getLogger(__name__)


class LogPositionManager(ABC):
    """Latest position of a destination's reader."""

    @abstractmethod
    def get_latest(self, destination: str) -> LogPosition | None:
        """The position to resume after, or None when nothing is known."""

    @abstractmethod
    def persist(self, destination: str, position: LogPosition) -> None:
        """Record that the reader sank everything up to ``position``."""


class MemoryLogPositionManager(LogPositionManager):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._positions: dict[str, LogPosition] = {}

    def get_latest(self, destination: str) -> LogPosition | None:
        with self._lock:
            return self._positions.get(destination)

    def persist(self, destination: str, position: LogPosition) -> None:
        with self._lock:
            self._positions[destination] = position

    def forget(self, destination: str) -> None:
        """Drop what is known (e.g. when leadership of the destination is lost)."""
        with self._lock:
            self._positions.pop(destination, None)


@dataclass(frozen=True)
class Holders:
    """Who pins a position: ``cursors`` (clients that acked up to it); ``origin`` when it
    is the destination's origin, with ``without_cursor`` (clients that never acked)."""

    cursors: tuple[str, ...] = ()
    origin: bool = False
    without_cursor: tuple[str, ...] = ()

    @property
    def origin_only(self) -> bool:
        """Only the origin pins it: no client acked up to it."""
        return self.origin and not self.cursors


class MetaLogPositionManager(LogPositionManager):
    """Minimum client cursor of the destination's MetaManager (``lookup(destination)``)."""

    def __init__(self, lookup: Callable[[str], MetaManager | None]) -> None:
        self._lookup = lookup

    def get_latest(self, destination: str) -> LogPosition | None:
        meta = self._lookup(destination)
        if meta is None:
            return None
        origin = meta.origin()
        clients = meta.clients()
        cursors = [meta.cursor(c) for c in clients]
        candidates = [c if c is not None else origin for c in cursors] if clients else [origin]
        result: LogPosition | None = None
        for position in candidates:
            if position is not None:
                result = position if result is None else min_position(result, position)
        return result

    def holders(self, destination: str, position: LogPosition) -> Holders:
        meta = self._lookup(destination)
        if meta is None:
            return Holders()
        cursors = {c: meta.cursor(c) for c in meta.clients()}
        acked = tuple(c for c, p in cursors.items() if p == position)
        if position != meta.origin():
            return Holders(acked)
        return Holders(acked, True, tuple(c for c, p in cursors.items() if p is None))

    def persist(self, destination: str, position: LogPosition) -> None:
        """Nothing to do: client cursors are written by acks."""


class FailbackLogPositionManager(LogPositionManager):
    def __init__(self, primary: LogPositionManager, secondary: LogPositionManager) -> None:
        self.primary = primary
        self.secondary = secondary

    def get_latest(self, destination: str) -> LogPosition | None:
        latest = self.primary.get_latest(destination)
        return latest if latest is not None else self.secondary.get_latest(destination)

    def persist(self, destination: str, position: LogPosition) -> None:
        try:
            self.primary.persist(destination, position)
        except Exception:
            log.warning("%s: primary position manager failed, using secondary", destination)
            self.secondary.persist(destination, position)
