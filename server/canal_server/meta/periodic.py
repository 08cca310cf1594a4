"""PeriodicMetaManager (Canal's PeriodMixedMetaManager): memory first, etcd every period.

Reads and writes are the ``MemoryMetaManager``'s (this class extends it); a thread
writes what changed to etcd every ``flush_period_ms`` in **fenced** transactions
(applied only while the running key's create revision is our epoch).
Keys (docs/architecture.md):

    {p}/destinations/{d}/{client}/subscription      {"filter", "subscribed", "last_batch_id"}
    {p}/destinations/{d}/{client}/cursor            LogPosition.to_dict()
    {p}/destinations/{d}/{client}/mark/{batch:020}  PositionRange.to_dict()
    {p}/destinations/{d}/snapshots/{id}             an incremental snapshot's progress

A flush writes the difference between the memory state and what the last successful
flush left in etcd, so a failed flush is simply retried by the next one: nothing is
dropped. ``Fenced`` stops the flusher and calls ``on_fenced(epoch)`` (wire it to
``RunningMonitor.report_fenced``). Lifecycle, driven by the destination's monitor:
``activate(epoch)`` on gaining leadership loads subscriptions, cursors and marks from
etcd; ``deactivate()`` on release or loss stops the flusher after a final flush.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from canal_cluster.coordinator import Coordinator, Delete, Op, Put
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy
from canal_protocol.errors import CoordinatorUnavailable, Fenced, InvalidArgument, RetryExhausted
from canal_protocol.positions import LogPosition
from canal_server.meta.memory import (
    ClientMeta,
    MemoryMetaManager,
    MetaSnapshot,
    PositionRange,
)

__all__ = ["EXTRA_PREFIXES", "MAX_TXN_OPS", "PeriodicMetaManager", "decode_meta", "encode_meta"]

log = logging.getLogger(__name__)
MAX_TXN_OPS = 100  # etcd refuses more than 128 operations in one transaction
EXTRA_PREFIXES = ("snapshots/",)  # MetaSnapshot.extras: keys under the destination prefix


def _json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def encode_meta(keys: Keys, snapshot: MetaSnapshot) -> dict[str, bytes]:
    """Every etcd key and value that stands for ``snapshot``."""
    d = snapshot.destination
    out: dict[str, bytes] = {}
    for client, meta in sorted(snapshot.clients.items()):
        try:
            sub = keys.subscription(d, client)
        except InvalidArgument:
            log.error("%s: client id %r cannot be stored in etcd; skipped", d, client)
            continue
        out[sub] = _json(
            {
                "filter": meta.filter,
                "subscribed": meta.subscribed,
                "last_batch_id": meta.last_batch_id,
            }
        )
        if meta.cursor is not None:
            out[keys.cursor(d, client)] = _json(meta.cursor.to_dict())
        for batch_id, positions in meta.batches:
            out[keys.mark(d, client, batch_id)] = _json(positions.to_dict())
    if snapshot.origin is not None:
        out[keys.origin(d)] = _json(snapshot.origin.to_dict())
    base = keys.destination_prefix(d)
    for rel, value in sorted(snapshot.extras.items()):
        out[base + rel] = value
    return out


def decode_meta(keys: Keys, destination: str, stored: Mapping[str, bytes]) -> MetaSnapshot:
    """The snapshot that etcd's keys under the destination stand for (inverse of encode)."""
    parts: dict[str, dict[str, Any]] = {}
    base = keys.destination_prefix(destination)
    origin: LogPosition | None = None
    extras: dict[str, bytes] = {}
    for key, value in stored.items():
        if key == keys.origin(destination):
            origin = LogPosition.from_dict(json.loads(value))
            continue
        if key[len(base) :].startswith(EXTRA_PREFIXES):
            extras[key[len(base) :]] = value
            continue
        client, _, rest = key[len(base) :].partition("/")
        entry = parts.setdefault(client, {"batches": []})
        data = json.loads(value)
        if rest == "subscription":
            entry.update(data)
        elif rest == "cursor":
            entry["cursor"] = data
        elif rest.startswith("mark/"):
            entry["batches"].append((Keys.batch_id_of(key), data))
    clients = {c: _client_meta(e) for c, e in parts.items()}
    return MetaSnapshot(
        destination, MappingProxyType(clients), origin=origin, extras=MappingProxyType(extras)
    )


def _client_meta(e: Mapping[str, Any]) -> ClientMeta:
    batches = tuple(sorted((b, PositionRange.from_dict(r)) for b, r in e["batches"]))
    last = max([int(e.get("last_batch_id", 0)), *(b for b, _ in batches)])
    cursor = LogPosition.from_dict(e["cursor"]) if e.get("cursor") else None
    return ClientMeta(
        str(e.get("filter", "")), cursor, batches, bool(e.get("subscribed", True)), last
    )


def _is_meta_key(keys: Keys, destination: str, key: str) -> bool:
    if key == keys.origin(destination):
        return True
    rest = key[len(keys.destination_prefix(destination)) :]
    if rest.startswith(EXTRA_PREFIXES):
        return True
    client, _, kind = rest.partition("/")
    if client in ("running", "cluster") or not kind:
        return False
    return kind in ("subscription", "cursor") or kind.startswith("mark/")


class PeriodicMetaManager(MemoryMetaManager):
    """The memory meta manager, whose state the destination's leader flushes to etcd."""

    def __init__(
        self,
        coordinator: Coordinator,
        keys: Keys,
        destination: str,
        flush_period_ms: int = 1000,
        on_fenced: Callable[[int], None] | None = None,
    ) -> None:
        if flush_period_ms <= 0:
            raise InvalidArgument("flush_period_ms", "must be > 0")
        super().__init__(destination)
        self._coord = coordinator
        self._keys = keys
        self._running_key = keys.running(destination)
        self._period_s = flush_period_ms / 1000
        self._on_fenced = on_fenced
        self._flush_lock = threading.Lock()
        self._epoch: int | None = None
        self._flushed: dict[str, bytes] = {}  # what etcd holds after our last flush
        self._flushed_version = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def epoch(self) -> int | None:
        return self._epoch

    # -- lifecycle ----------------------------------------------------------------------

    def activate(self, epoch: int) -> None:
        """On gaining leadership: load the destination's meta from etcd, start flushing."""
        self.deactivate(final_flush=False)
        prefix = self._keys.destination_prefix(self.destination)
        found = self._coord.get_prefix(prefix).items
        stored = {
            kv.key: kv.value for kv in found if _is_meta_key(self._keys, self.destination, kv.key)
        }
        with self._flush_lock:
            self.restore(decode_meta(self._keys, self.destination, stored))
            self._flushed = stored
            self._flushed_version = -1  # the encoding may differ: rewrite on the next flush
            self._epoch = epoch
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop,
            args=(self._stop,),
            name=f"meta-flush {self.destination}",
            daemon=True,
        )
        self._thread.start()
        log.info(
            "%s: meta loaded (epoch %d, %d clients)", self.destination, epoch, len(self.clients())
        )

    def deactivate(self, final_flush: bool = True) -> None:
        """On release or loss: stop the flusher, flush a last time (fenced), forget the epoch."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if final_flush and self._epoch is not None:
            self._final_flush()
        self._epoch = None

    def _final_flush(self) -> None:
        policy = RetryPolicy(initial_s=0.1, max_delay_s=0.5, deadline_s=2 * self._coord.timeout_s)
        try:
            policy.call(
                self.flush, f"final meta flush of {self.destination}", (CoordinatorUnavailable,)
            )
        except (RetryExhausted, Fenced) as exc:
            log.error(
                "%s: final meta flush failed (epoch %s): %s", self.destination, self._epoch, exc
            )

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._period_s):
            try:
                self.flush()
            except CoordinatorUnavailable as exc:  # retried by the next flush
                log.warning("%s: meta flush failed, will retry: %s", self.destination, exc)
            except Fenced:
                return

    # -- flushing ------------------------------------------------------------------------

    def flush(self) -> bool:
        """Write what changed since the last successful flush; True if anything was written.

        Raises ``CoordinatorUnavailable`` (retry later, nothing lost) or ``Fenced``
        (our epoch is stale: flushing stops and ``on_fenced`` is called).
        """
        with self._flush_lock:
            epoch = self._epoch
            if epoch is None or not self.dirty_since(self._flushed_version):
                return False
            snapshot = self.snapshot()
            wanted = encode_meta(self._keys, snapshot)
            ops: list[Op] = [Put(k, v) for k, v in wanted.items() if self._flushed.get(k) != v]
            ops += [Delete(k) for k in self._flushed if k not in wanted]
            for i in range(0, len(ops), MAX_TXN_OPS):
                self._write(epoch, ops[i : i + MAX_TXN_OPS])
            self._flushed_version = snapshot.version
            return bool(ops)

    def _write(self, epoch: int, ops: list[Op]) -> None:
        try:
            self._coord.fenced_txn(self._running_key, epoch, ops)
        except Fenced:
            log.error(
                "%s: meta flush fenced: epoch %d is stale; stepping down", self.destination, epoch
            )
            self._stop.set()
            self._epoch = None
            if self._on_fenced is not None:
                self._on_fenced(epoch)
            raise
        for op in ops:  # etcd now holds these: the next flush diffs against them
            if isinstance(op, Put):
                self._flushed[op.key] = op.value
            else:
                self._flushed.pop(op.key, None)
