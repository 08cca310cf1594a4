"""Long polls that wait on the event loop, not in a thread.

A long poll (``POST .../batches`` or ``GET .../batches/{id}`` with ``timeout_ms``) is a
loop of tries that never wait (the store's and the client's locks, microseconds; in a
worker thread when the client has a filter) and, between them, a wait on the event loop
for the destination's store to get its next event (``StoreWatch``). A waiting poll
holds no thread: thousands wait at once, each answers at its deadline (plus the last
try and the answer's way out), and ``/v1/health`` and every other route keep their
threads.

``Polls`` is the app's book of them: at most ``node.max_long_polls`` wait at once; one
more is answered 503 ``overloaded`` with ``Retry-After`` at once (never queued).

``StoreWatch`` (one per store, made on demand): a daemon thread, alive only while some
poll waits on that store, blocks on the store's condition and wakes the event loop's
waiters (``call_soon_threadsafe``) when an event after theirs is stored, or the store
closed (the term ended: their next try answers that).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

import anyio

from canal_protocol.batch import Batch
from canal_protocol.errors import BatchUnavailable, StoreClosed, StoreError
from canal_server.api import models as m
from canal_server.api.deps import LeaderLookup
from canal_server.api.errors import unavailable
from canal_server.embedded import EmbeddedServer
from canal_server.store import EventStore

__all__ = ["RETRY_AFTER_S", "Polls", "StoreWatch", "poll_batch", "poll_refetch", "taker"]

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_AFTER_S = 1  # what an overloaded node tells a poll it refused
_IDLE_CHECK_S = 0.5  # how often a watch thread looks whether anyone still waits


class StoreWatch:
    """Wakes the event loop's waiters on ``store``: ``wait(after, timeout)`` returns
    once the store holds an event after seq ``after``, it closed, or ``timeout`` passed."""

    def __init__(self, store: EventStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store, self._loop = store, loop
        self._lock = threading.Lock()
        self._count = 0  # waiters (under _lock: the thread reads it)
        self._thread_alive = False
        self._closed = False
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}  # on the loop only

    async def wait(self, after: int, timeout_s: float) -> None:
        if self._closed or self._store.last_seq > after:
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault(after, []).append(fut)
        with self._lock:
            self._count += 1
            if not self._thread_alive:
                self._thread_alive = True
                thread = threading.Thread(
                    target=self._run, args=(after,), name="store-watch", daemon=True
                )
                thread.start()
        try:
            await asyncio.wait({fut}, timeout=timeout_s)
        finally:
            with self._lock:
                self._count -= 1
            waiting = self._waiters.get(after)
            if waiting is not None and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._waiters[after]

    def _wake(self, seq: int) -> None:
        """On the loop: every waiter after a seq below ``seq`` goes on."""
        for after in [a for a in self._waiters if a < seq]:
            for fut in self._waiters.pop(after):
                if not fut.done():
                    fut.set_result(None)

    def _run(self, known: int) -> None:
        """The watch thread: waits for an event after ``known``, then wakes the loop."""
        store = self._store
        while True:
            with self._lock:
                if self._count == 0:
                    self._thread_alive = False
                    return
            try:
                store.wait_for(known, _IDLE_CHECK_S)
            except StoreClosed:
                self._closed = True
                self._signal(2**63)
                with self._lock:
                    self._thread_alive = False
                return
            except StoreError:  # the events after ``known`` were freed: newer ones exist
                pass
            seq = store.last_seq
            if seq > known:
                known = seq
                if not self._signal(seq):
                    with self._lock:
                        self._thread_alive = False
                    return

    def _signal(self, seq: int) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._wake, seq)
        except RuntimeError:  # the loop closed: nobody waits any more
            return False
        return True


class Polls:
    """The long polls of one app: their limit, and a ``StoreWatch`` per store."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting = 0
        self._watches: weakref.WeakKeyDictionary[EventStore, StoreWatch] = (
            weakref.WeakKeyDictionary()
        )

    def admit(self) -> None:
        """Count one more waiting poll; 503 ``overloaded`` at once when ``limit`` wait."""
        if self.waiting >= self.limit:
            raise unavailable(
                "overloaded",
                f"{self.waiting} long polls wait on this node already (node.max_long_polls)",
                RETRY_AFTER_S,
            )
        self.waiting += 1

    def release(self) -> None:
        self.waiting -= 1

    async def wait(self, store: EventStore, after: int, timeout_s: float) -> None:
        watch = self._watches.get(store)
        if watch is None:
            watch = self._watches[store] = StoreWatch(store, asyncio.get_running_loop())
        await watch.wait(after, timeout_s)


def taker(client: str, body: m.BatchRequest) -> Callable[[EmbeddedServer], Batch]:
    """The get ``body`` asks of ``client``'s leader, without waiting (one try)."""
    rid, ack, size = body.request_id, body.ack, body.size

    def take(s: EmbeddedServer) -> Batch:
        if body.auto_ack:
            return s.get(client, size, 0.0, rid, ack)
        return s.get_without_ack(client, size, 0.0, rid, ack)

    return take


def _filtered(server: EmbeddedServer, client: str) -> bool:
    """The client has a filter: its tries run in a worker thread, never on the loop."""
    return bool((server.meta.subscription(client) or "").strip())


async def _poll(
    polls: Polls,
    lead: LeaderLookup,
    timeout_s: float,
    attempt: Callable[[EmbeddedServer], T | None],
    last: Callable[[EmbeddedServer], T],
    here: Callable[[EmbeddedServer], bool],
    op: str = "",
    quiet: Callable[[], T] | None = None,
) -> tuple[T, int]:
    """``attempt`` on the leader until it gives something (not None); between tries a
    wait on the event loop for the store's next event, until ``timeout_s`` passed; then
    ``last`` once (its answer, or its error), or ``quiet()`` without a try when the store
    got nothing since the previous one (a get's empty batch: thousands of polls ending
    together cost the loop no more than their answers). The first wait is admitted by
    ``polls``."""
    deadline = anyio.current_time() + timeout_s
    admitted = False
    try:
        while True:
            server, epoch = await lead.ready_leader()
            seen = server.store.last_seq
            remaining = deadline - anyio.current_time()
            final = remaining <= 0
            fn = last if final else attempt
            result = await lead.run(server, epoch, fn, op=op, here=here(server))
            if result is not None or final:
                assert result is not None
                return result, epoch
            if not admitted:
                polls.admit()
                admitted = True
            await polls.wait(server.store, seen, remaining)
            if quiet is not None and anyio.current_time() >= deadline:
                now = lead.leader()  # 307 / 503 when the leadership ended meanwhile
                if now[0] is server and server.store.last_seq == seen:
                    return quiet(), now[1]
    finally:
        if admitted:
            polls.release()


async def poll_batch(polls: Polls, lead: LeaderLookup, body: m.BatchRequest) -> tuple[Batch, int]:
    """A get (``POST .../batches``): the next batch, or an empty one after ``timeout_ms``."""
    take = taker(lead.client_id, body)

    def attempt(s: EmbeddedServer) -> Batch | None:
        batch = take(s)
        return None if batch.is_empty else batch

    def here(s: EmbeddedServer) -> bool:
        return not _filtered(s, lead.client_id)

    timeout_s = body.timeout_ms / 1000
    return await _poll(polls, lead, timeout_s, attempt, take, here, quiet=Batch.empty)


async def poll_refetch(
    polls: Polls, lead: LeaderLookup, batch_id: int, timeout_s: float
) -> tuple[Batch, int]:
    """A re-fetch (``GET .../batches/{id}``): waits up to ``timeout_s`` for a batch that
    is not re-read from the binlog yet (after a failover); then 503 ``unavailable``."""
    client = lead.client_id

    def last(s: EmbeddedServer) -> Batch:
        return s.get_batch(client, batch_id, 0.0)

    def attempt(s: EmbeddedServer) -> Batch | None:
        try:
            return last(s)
        except BatchUnavailable:
            return None

    return await _poll(polls, lead, timeout_s, attempt, last, lambda _s: False, "get")
