"""An in-memory ``Coordinator`` for fast unit tests, with etcd's semantics.

Revisions start at 1 and grow by one per write; keys carry create/mod revisions and
a lease; leases expire by an injectable clock (checked on every call, or ``tick()``);
watches replay from a start revision and are called in the thread that made the
change, after the store's lock is released. ``available = False`` makes every call
raise ``CoordinatorUnavailable`` (an etcd outage); leases keep expiring meanwhile.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from canal_cluster.coordinator import (
    CampaignResult,
    Coordinator,
    Delete,
    KeyValue,
    Lease,
    Op,
    Put,
    RangeResult,
    Watch,
    WatchCallback,
    WatchEvent,
    WatchEventType,
)
from canal_protocol.errors import CoordinatorUnavailable, Fenced

__all__ = ["MemoryCoordinator"]

T = TypeVar("T")


@dataclass
class _MemWatch(Watch):
    key: str
    prefix: bool
    callback: WatchCallback
    active: bool = True

    def matches(self, key: str) -> bool:
        return key.startswith(self.key) if self.prefix else key == self.key

    def cancel(self) -> None:
        self.active = False


@dataclass
class _LeaseState:
    lease: Lease
    expires_at: float
    keys: set[str] = field(default_factory=set)


class MemoryCoordinator(Coordinator):
    """etcd-like store in a dict; ``clock`` drives lease expiry."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, timeout_s: float = 1.0):
        self._clock = clock
        self._timeout_s = timeout_s
        self._lock = threading.RLock()
        self._kv: dict[str, KeyValue] = {}
        self._leases: dict[int, _LeaseState] = {}
        self._history: list[WatchEvent] = []
        self._watches: list[_MemWatch] = []
        self._pending: list[WatchEvent] = []
        self._revision = 1
        self._lease_ids = itertools.count(0x1000)
        self.available = True
        self.calls = 0

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def revision(self) -> int:
        return self._revision

    # -- internals ----------------------------------------------------------------

    def _enter(self) -> list[WatchEvent]:
        """Expire due leases; raise when 'etcd' is down. Caller holds the lock."""
        self.calls += 1
        events = self._expire()
        if not self.available:
            self._pending.extend(events)
            raise CoordinatorUnavailable("memory coordinator: unavailable (simulated outage)")
        return events

    def _expire(self) -> list[WatchEvent]:
        now = self._clock()
        events: list[WatchEvent] = []
        for lease_id in [i for i, s in self._leases.items() if s.expires_at <= now]:
            events += self._drop_lease(lease_id)
        return events

    def _drop_lease(self, lease_id: int) -> list[WatchEvent]:
        state = self._leases.pop(lease_id)
        keys = [k for k in sorted(state.keys) if k in self._kv]
        if not keys:
            return []
        self._revision += 1
        return [self._apply_delete(k) for k in keys]

    def _apply_put(self, key: str, value: bytes, lease: Lease | None) -> WatchEvent:
        old = self._kv.get(key)
        if old is not None and old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        lease_id = 0
        if lease is not None:
            if lease.id not in self._leases:
                raise Fenced(f"lease {lease.id:x} not found")
            self._leases[lease.id].keys.add(key)
            lease_id = lease.id
        create = old.create_revision if old is not None else self._revision
        version = old.version + 1 if old is not None else 1
        self._kv[key] = KeyValue(key, value, create, self._revision, version, lease_id)
        event = WatchEvent(WatchEventType.PUT, key, value, create, self._revision)
        self._history.append(event)
        return event

    def _apply_delete(self, key: str) -> WatchEvent:
        old = self._kv.pop(key)
        if old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        event = WatchEvent(WatchEventType.DELETE, key, b"", 0, self._revision)
        self._history.append(event)
        return event

    def _keys_for(self, op: Delete) -> list[str]:
        if op.prefix:
            return sorted(k for k in self._kv if k.startswith(op.key))
        return [op.key] if op.key in self._kv else []

    def _apply(self, ops: Sequence[Op]) -> list[WatchEvent]:
        for op in ops:  # validate leases before writing anything (atomic)
            if isinstance(op, Put) and op.lease is not None and op.lease.id not in self._leases:
                raise Fenced(f"lease {op.lease.id:x} not found")
        if not ops:
            return []
        self._revision += 1
        events: list[WatchEvent] = []
        for op in ops:
            if isinstance(op, Put):
                events.append(self._apply_put(op.key, op.value, op.lease))
            else:
                events += [self._apply_delete(k) for k in self._keys_for(op)]
        return events

    def _dispatch(self, events: list[WatchEvent]) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), []
            watches = [w for w in self._watches if w.active]
        for event in pending + events:
            for w in watches:
                if w.active and w.matches(event.key):
                    w.callback(event)

    def _run(self, fn: Callable[[], tuple[list[WatchEvent], T]]) -> T:
        events: list[WatchEvent] = []
        try:
            with self._lock:
                events = self._enter()
                more, result = fn()
                events += more
        finally:
            self._dispatch(events)
        return result

    # -- test helpers ---------------------------------------------------------------

    def tick(self) -> None:
        """Process lease expiry now (delivers the DELETE events)."""
        with self._lock:
            events = self._expire()
        self._dispatch(events)

    def lease_ids(self) -> set[int]:
        with self._lock:
            return set(self._leases)

    # -- leases -----------------------------------------------------------------------

    def grant_lease(self, ttl_s: float) -> Lease:
        def op() -> tuple[list[WatchEvent], Lease]:
            lease = Lease(next(self._lease_ids), max(1, math.ceil(ttl_s)))
            self._leases[lease.id] = _LeaseState(lease, self._clock() + lease.ttl_s)
            return [], lease

        return self._run(op)

    def keepalive(self, lease: Lease) -> int:
        def op() -> tuple[list[WatchEvent], int]:
            state = self._leases.get(lease.id)
            if state is None:
                raise Fenced(f"lease {lease.id:x} expired")
            state.expires_at = self._clock() + state.lease.ttl_s
            return [], state.lease.ttl_s

        return self._run(op)

    def revoke(self, lease: Lease) -> None:
        def op() -> tuple[list[WatchEvent], None]:
            if lease.id not in self._leases:
                return [], None
            return self._drop_lease(lease.id), None

        self._run(op)

    # -- election -----------------------------------------------------------------------

    def campaign(self, key: str, value: bytes, lease: Lease) -> CampaignResult:
        def op() -> tuple[list[WatchEvent], CampaignResult]:
            holder = self._kv.get(key)
            if holder is not None:
                return [], CampaignResult(False, None, holder)
            events = self._apply([Put(key, value, lease)])
            return events, CampaignResult(True, self._kv[key].create_revision, self._kv[key])

        return self._run(op)

    def resign(self, key: str, epoch: int) -> bool:
        def op() -> tuple[list[WatchEvent], bool]:
            kv = self._kv.get(key)
            if kv is None or kv.create_revision != epoch:
                return [], False
            return self._apply([Delete(key)]), True

        return self._run(op)

    def fenced_txn(self, running_key: str, epoch: int, ops: Sequence[Op]) -> int:
        def op() -> tuple[list[WatchEvent], int]:
            kv = self._kv.get(running_key)
            actual = kv.create_revision if kv is not None else 0
            if actual != epoch:
                raise Fenced(f"{running_key}: epoch {epoch} is stale (now {actual})")
            return self._apply(ops), self._revision

        return self._run(op)

    # -- plain keys ---------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        def op() -> tuple[list[WatchEvent], KeyValue | None]:
            return [], self._kv.get(key)

        return self._run(op)

    def get_prefix(self, prefix: str) -> RangeResult:
        def op() -> tuple[list[WatchEvent], RangeResult]:
            items = tuple(self._kv[k] for k in sorted(self._kv) if k.startswith(prefix))
            return [], RangeResult(items, self._revision)

        return self._run(op)

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        def op() -> tuple[list[WatchEvent], int]:
            return self._apply([Put(key, value, lease)]), self._revision

        return self._run(op)

    def delete(self, key: str, prefix: bool = False) -> int:
        def op() -> tuple[list[WatchEvent], int]:
            keys = self._keys_for(Delete(key, prefix))
            return self._apply([Delete(key, prefix)]) if keys else [], len(keys)

        return self._run(op)

    # -- watches ------------------------------------------------------------------------

    def watch(
        self,
        key: str,
        callback: WatchCallback,
        prefix: bool = False,
        start_revision: int | None = None,
    ) -> Watch:
        w = _MemWatch(key, prefix, callback)
        with self._lock:
            replay = [
                e
                for e in self._history
                if start_revision is not None and e.mod_revision >= start_revision
            ]
            self._watches.append(w)
        for event in replay:
            if w.matches(event.key):
                callback(event)
        return w

    def close(self) -> None:
        with self._lock:
            for w in self._watches:
                w.cancel()
            self._watches.clear()
