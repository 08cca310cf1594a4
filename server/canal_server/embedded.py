"""The embedded server of one destination (Canal's CanalServerWithEmbedded).

Every REST route of docs/api.md maps to one call here; ``UnknownDestination`` is the
caller's business (it picks the EmbeddedServer by destination).

Semantics (Canal's server and client roles; docs/architecture.md, "Guarantees"):

* ``subscribe(client, filter, start)``: idempotent; a new filter replaces the old one.
  The FIRST subscription of a client id (or the first after an unsubscribe) sets its
  cursor from ``start``, and the meta is flushed before it returns, so a new leader
  keeps that start:

  - ``"latest"`` (default): the destination's current end (``StartBounds.latest``:
    the newest position the leader's reader put into the store, or where it began):
    the client gets only what comes after;
  - ``"earliest"``: just before the oldest entry the store still holds (the last
    entry freed because every client had acked it; none freed: where the store's
    contents begin, ``StartBounds.base``);
  - a ``LogPosition`` (a cursor, a batch's start or end): the client gets what
    follows it; it must lie within what is held (``InvalidArgument("start")``).

  A re-subscribe never moves the cursor (``start`` is ignored). ``StartUnavailable``
  while the bounds are not known yet. A client restored without a cursor (older
  metadata) starts at the first stored entry.
* ``get_without_ack(client, size, timeout_s)``: up to ``size`` entries after the
  client's last outstanding batch (else after its cursor, else from the first stored
  entry). Returns as soon as at least one entry is there, waiting up to
  ``timeout_s``; ``Batch.empty()`` (id -1) when nothing arrives. Records the batch
  (id and position range of the raw entries it covers) in the MetaManager.
* ``ack`` (optional, on both): a batch the client has processed, acknowledged (as
  ``ack``) before the get takes the next batch: one round trip less per batch. A batch
  issued but no longer outstanding is a no-op there (acked by a lost attempt of the
  same get, or rolled back); an id never issued is UnknownBatch.
* ``get``: the same, then ``ack``.
* ``request_id`` (optional, on both): the client's name for one get, the same on its
  retries. A get whose id already produced a batch answers that batch again (re-read
  by its range; for ``get`` the acked batch itself) instead of taking the next one, so
  a retry after a lost answer, even while the first attempt is still waiting, never
  skips nor re-delivers anything. The last ``REQUEST_IDS`` ids per client are kept.
* ``get_batch(client, id)``: an outstanding batch again, re-read from the store by its
  range (also after a restart, once the reader has re-read that far; until then
  it waits up to ``timeout_s`` and raises BatchUnavailable).
* ``ack(client, id)``: cumulative: every outstanding batch <= id; the cursor moves to
  the end of batch id; the store may free what every client acked. An id that is
  not outstanding (never issued, already acked or rolled back) is UnknownBatch.
* ``rollback(client, id)``: drops batch id and every later outstanding batch;
  ``rollback(client)`` drops all. The next get re-delivers from there. Like Canal,
  ``rollback(client)`` of a client that is not subscribed is a no-op (clients roll
  back on connect).
* ``move_cursor(client, logfile, offset)``: drops every outstanding batch and moves
  the cursor forward through the stored entry starting at that position (what a
  client committed elsewhere, e.g. a Spark checkpoint, after its batches were rolled
  back); never backwards.

A client filter narrows at get time (see ``canal_server.filter``). When everything a
get scanned is filtered out and the client has no outstanding batch, the cursor
simply moves past it ("skip"), so a quiet filter can never fill the store.

Thread-safe: one lock per client (different clients never wait for each other);
the long-poll wait happens outside it, so an ack is never stuck behind a get.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from canal_cluster.keys import Keys
from canal_protocol.batch import Batch
from canal_protocol.entry import Entry
from canal_protocol.errors import (
    BatchUnavailable,
    InvalidArgument,
    NotSubscribed,
    StoreError,
    UnknownBatch,
)
from canal_protocol.positions import LogPosition
from canal_server.filter import EventFilter
from canal_server.meta import MetaManager, PositionRange
from canal_server.store import EventStore, StoredEvent, is_after

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_TIMEOUT_S",
    "REQUEST_IDS",
    "EmbeddedServer",
    "Start",
    "StartBounds",
    "Subscription",
]

log = logging.getLogger(__name__)

MAX_BATCH_SIZE = 65536
MAX_TIMEOUT_S = 300.0
REQUEST_IDS = 16  # get request ids remembered per client (retries of recent gets)


Start = Literal["latest", "earliest"] | LogPosition


@dataclass(frozen=True)
class StartBounds:
    """What a new subscription can start from: ``base``, where the store's contents
    begin (its first entry lies after it; None: from the first stored entry), and
    ``latest``, the destination's current end (None: nothing read yet)."""

    base: LogPosition | None
    latest: LogPosition | None


@dataclass(frozen=True)
class Subscription:
    """A subscribe's outcome: ``cursor`` is where the client resumes after; ``created``
    tells a new subscription (its start applied) from a re-subscribe."""

    client: str
    filter: str
    cursor: LogPosition | None
    created: bool


@dataclass
class _ClientState:
    """Runtime state of one client; everything durable is in the MetaManager."""

    filter: EventFilter
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked_seq: int | None = None  # store seq of the cursor, when known in this store
    seqs: dict[int, tuple[int, int]] = field(default_factory=dict)  # batch id → seqs
    requests: dict[str, int] = field(default_factory=dict)  # get request id → batch id
    auto: tuple[str, Batch] | None = None  # the last auto-acked get: (request id, batch)


_Pointer = int | LogPosition | None


class EmbeddedServer:
    """get / ack / rollback for the clients of one destination.

    Build it after the MetaManager holds its final state (e.g. restored from etcd):
    it registers every subscribed client in the store, so the store keeps what
    they have not acked. A changed filter applies to later gets and to re-reads of
    outstanding batches; clients roll back when they change it.
    """

    def __init__(
        self,
        destination: str,
        store: EventStore,
        meta: MetaManager,
        *,
        max_batch_size: int = MAX_BATCH_SIZE,
        max_timeout_s: float = MAX_TIMEOUT_S,
        start_bounds: Callable[[], StartBounds] | None = None,
    ) -> None:
        self.destination = destination
        self.store = store
        self.meta = meta
        self._start_bounds = start_bounds or (lambda: StartBounds(None, store.last_position))
        self.max_batch_size = max_batch_size
        self.max_timeout_s = max_timeout_s
        self._lock = threading.Lock()
        self._clients: dict[str, _ClientState] = {}
        for client in meta.clients():
            self._clients[client] = _ClientState(
                EventFilter.for_client(meta.subscription(client) or "")
            )
            store.register(client)

    # ---- subscriptions -------------------------------------------------------
    def subscribe(self, client: str, filter: str = "", start: Start = "latest") -> Subscription:
        """Subscribe; a new subscription starts at ``start`` (see the module doc)."""
        Keys().subscription(self.destination, client)  # InvalidArgument("client_id")
        flt = EventFilter.for_client(filter)
        _check_start(start)
        with self._lock:
            created = not self.meta.is_subscribed(client)
            changed = self.meta.subscription(client) != filter
            cursor = self._register_start(client, start) if created else None
            self.meta.subscribe(client, filter)
            if cursor is not None:
                self.meta.update_cursor(client, cursor)
            self.store.register(client)
            state = self._clients.setdefault(client, _ClientState(flt))
            cursor = self.meta.cursor(client)
        if state.filter is not flt:
            with state.lock:  # never while holding self._lock: lock order is client → server
                state.filter = flt
        # In etcd before the answer, so a new leader keeps the start: also for a retry of
        # a subscribe whose flush failed (it stayed in memory); the flush writes only what
        # changed since the last one, so a repeated subscribe costs nothing.
        self.meta.flush()
        if created:
            log.info(
                "%s: client %s subscribed, filter %r, start %s: cursor %s",
                self.destination, client, filter, start, cursor,
            )  # fmt: skip
        elif changed:
            log.info("%s: client %s changed its filter to %r", self.destination, client, filter)
        return Subscription(client, filter, cursor, created)

    def unsubscribe(self, client: str) -> None:
        """Forget the client's subscription, cursor and batches (idempotent)."""
        with self._lock:
            state = self._clients.get(client)
        if state is None:
            self.meta.unsubscribe(client)
            return
        with state.lock, self._lock:  # waits for the client's running call
            if self._clients.get(client) is state:
                del self._clients[client]
            self.meta.unsubscribe(client)
            self.store.unregister(client)
        log.info("%s: client %s unsubscribed", self.destination, client)

    def subscriptions(self) -> dict[str, str]:
        """Subscribed client ids and their filters."""
        return {c: self.meta.subscription(c) or "" for c in self.meta.clients()}

    def cursor(self, client: str) -> LogPosition | None:
        """The client's cursor: its last acked entry, or where its subscription started
        (None only for a client subscribed before subscriptions recorded their start)."""
        self._state(client)
        return self.meta.cursor(client)

    # ---- get -------------------------------------------------------------------
    def get_without_ack(
        self,
        client: str,
        size: int,
        timeout_s: float = 0.0,
        request_id: str | None = None,
        ack: int | None = None,
    ) -> Batch:
        """The next batch; with ``ack``, batch ``ack`` (processed by the client) is
        acknowledged first, in the same call (see ``_ack_before_get``)."""
        self._check_size(size)
        self._check_timeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            state = self._state(client)
            with state.lock:
                self._check_current(client, state)
                again = self._answered(client, state, request_id)
                if again is not None:
                    return again
                if ack is not None:
                    self._ack_before_get(client, state, ack)
                    ack = None  # once: later rounds of the long poll only wait
                batch, wait_after = self._take(client, state, size)
                if batch is not None and request_id is not None:
                    _remember(state, request_id, batch.id)
            if batch is not None:
                return batch
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Batch.empty()
            self.store.wait_for(wait_after, remaining)

    def get(
        self,
        client: str,
        size: int,
        timeout_s: float = 0.0,
        request_id: str | None = None,
        ack: int | None = None,
    ) -> Batch:
        """get_without_ack, then ack (Canal's get)."""
        if request_id is not None:
            state = self._state(client)
            with state.lock:
                if state.auto is not None and state.auto[0] == request_id:
                    return state.auto[1]  # acked by the first attempt
        batch = self.get_without_ack(client, size, timeout_s, request_id, ack)
        if batch.is_empty:
            return batch
        try:
            self.ack(client, batch.id)
        except UnknownBatch:
            if request_id is None:
                raise
            # a concurrent attempt with the same request id acked it first
        if request_id is not None:
            state = self._state(client)
            with state.lock:
                state.auto = (request_id, batch)
        return batch

    def get_batch(self, client: str, batch_id: int, timeout_s: float = 0.0) -> Batch:
        """An outstanding batch again, with the same entries."""
        self._check_timeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            state = self._state(client)
            with state.lock:
                self._check_current(client, state)
                batch = self._reread(client, state, batch_id)
                seen = self.store.last_seq
            if batch is not None:
                return batch
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BatchUnavailable(
                    f"{self.destination}: batch {batch_id} of client {client} is not re-read "
                    "from the binlog yet; retry later or roll back"
                )
            self.store.wait_for(seen, remaining)

    # ---- ack / rollback ------------------------------------------------------
    def ack(self, client: str, batch_id: int) -> None:
        """Acknowledge every outstanding batch <= batch_id."""
        state = self._state(client)
        with state.lock:
            self._check_current(client, state)
            if not self._ack_locked(client, state, batch_id):
                raise self._unknown(client, batch_id, "ack")
        log.debug("%s: client %s acked batch %d", self.destination, client, batch_id)

    def _ack_locked(self, client: str, state: _ClientState, batch_id: int) -> bool:
        """Ack every outstanding batch <= batch_id (``state.lock`` held); False when
        batch_id is not outstanding (nothing done)."""
        outstanding = dict(self.meta.batches(client))
        if batch_id not in outstanding:
            return False
        end_seq = state.seqs.get(batch_id, (0, None))[1]
        for bid in sorted(outstanding):
            if bid <= batch_id:
                self.meta.remove_batch(client, bid)
                state.seqs.pop(bid, None)
        self._move_cursor(client, state, outstanding[batch_id].end, end_seq)
        return True

    def _ack_before_get(self, client: str, state: _ClientState, batch_id: int) -> None:
        """The ``ack`` of a get: like ``ack``, but a batch issued and no longer
        outstanding is a no-op (acked by an earlier attempt of the same get whose
        answer was lost, or rolled back: its entries come again); one never issued
        is ``UnknownBatch``."""
        if self._ack_locked(client, state, batch_id):
            log.debug("%s: client %s acked batch %d on a get", self.destination, client, batch_id)
        elif not 1 <= batch_id <= self.meta.last_batch_id(client):
            raise self._unknown(client, batch_id, "ack")

    def rollback(self, client: str, batch_id: int | None = None) -> None:
        """Drop batch_id and every later outstanding batch; None: all of them."""
        if batch_id is None and not self.meta.is_subscribed(client):
            return
        state = self._state(client)
        with state.lock:
            self._check_current(client, state)
            outstanding = [bid for bid, _ in self.meta.batches(client)]
            if batch_id is not None and batch_id not in outstanding:
                raise self._unknown(client, batch_id, "rollback")
            first = batch_id if batch_id is not None else 0
            for bid in outstanding:
                if bid >= first:
                    self.meta.remove_batch(client, bid)
                    state.seqs.pop(bid, None)
        log.info("%s: client %s rolled back from batch %s", self.destination, client, batch_id)

    def move_cursor(self, client: str, logfile: str, offset: int) -> LogPosition | None:
        """Move the cursor forward through the entry starting at ``logfile``:``offset``
        (one the client committed elsewhere, e.g. in a Spark checkpoint); the cursor
        after it. Every outstanding batch is dropped first, as by ``rollback(client)``.
        The cursor goes to the last stored event starting there or before and never
        backwards; a position not stored (yet) moves it only as far as the store reaches.
        """
        state = self._state(client)
        with state.lock:
            self._check_current(client, state)
            for bid, _ in self.meta.batches(client):
                self.meta.remove_batch(client, bid)
            state.seqs.clear()
            event = self.store.last_starting_by(logfile, offset)
            cursor = self.meta.cursor(client)
            if event is not None and (cursor is None or is_after(event.position, cursor)):
                self._move_cursor(client, state, event.position, event.seq)
                cursor = event.position
        log.info(
            "%s: client %s committed through %s:%d, cursor %s",
            self.destination, client, logfile, offset, cursor,
        )  # fmt: skip
        return cursor

    # ---- internals -------------------------------------------------------------
    def _register_start(self, client: str, start: Start) -> LogPosition | None:
        """Register a new client in the store at ``start``; its cursor (None: from the
        first stored entry)."""
        bounds = self._start_bounds()
        if start == "earliest":
            held = self.store.register(client)
            return held if held is not None else bounds.base
        if start == "latest":
            return self.store.register(client, bounds.latest)
        assert isinstance(start, LogPosition)
        if bounds.latest is not None and is_after(start, bounds.latest):
            raise InvalidArgument(
                "start", f"{start} lies after the destination's current end {bounds.latest}"
            )
        if bounds.base is not None and is_after(bounds.base, start):
            raise InvalidArgument(
                "start", f"{start} lies before what the destination holds (from {bounds.base})"
            )
        held = self.store.register(client, start)
        if held != start:
            self.store.unregister(client)
            raise InvalidArgument(
                "start", f"{start} is no longer held; the oldest held change follows {held}"
            )
        return start

    def _state(self, client: str) -> _ClientState:
        with self._lock:
            state = self._clients.get(client)
        if state is None:
            raise NotSubscribed(f"{self.destination}: client {client!r} has not subscribed")
        return state

    def _check_current(self, client: str, state: _ClientState) -> None:
        with self._lock:
            if self._clients.get(client) is not state:
                raise NotSubscribed(f"{self.destination}: client {client!r} unsubscribed")

    def _check_size(self, size: int) -> None:
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or not 1 <= size <= self.max_batch_size
        ):
            raise InvalidArgument("size", f"must be an integer in 1..{self.max_batch_size}")

    def _check_timeout(self, timeout_s: float) -> None:
        if not 0 <= timeout_s <= self.max_timeout_s:
            raise InvalidArgument("timeout", f"must be within 0..{self.max_timeout_s:g} s")

    def _unknown(self, client: str, batch_id: int, op: str) -> UnknownBatch:
        last = self.meta.last_batch_id(client)
        if not 1 <= batch_id <= last:
            why = f"was never issued (last batch issued to this client: {last})"
        else:
            why = "is not outstanding (already acked or rolled back)"
        return UnknownBatch(f"{self.destination}: {op} of client {client}: batch {batch_id} {why}")

    def _read_pointer(self, client: str, state: _ClientState) -> _Pointer:
        """Where the next get starts: after the last outstanding batch, cursor, or head."""
        batches = self.meta.batches(client)
        if batches:
            last_id, rng = batches[-1]
            seqs = state.seqs.get(last_id)
            return seqs[1] if seqs is not None else rng.end
        if state.acked_seq is not None:
            return state.acked_seq
        return self.meta.cursor(client)

    def _scan(
        self, state: _ClientState, after: _Pointer, size: int
    ) -> tuple[list[StoredEvent], list[Entry]]:
        """Raw events after ``after`` until ``size`` entries pass the client filter. They
        are of one database: a database switch (another source) starts the next batch, so
        a batch's ``start`` and ``end`` name the database of all its entries."""
        raw: list[StoredEvent] = []
        out: list[Entry] = []
        narrower = None if state.filter.passes_everything else state.filter.narrower()
        switched = False
        while len(out) < size and len(raw) < self.store.buffer_size and not switched:
            chunk = self.store.get(after, size - len(out))
            if not chunk:
                break
            for ev in chunk:
                if raw and ev.position.identity != raw[0].position.identity:
                    switched = True
                    break
                raw.append(ev)
                out.extend([ev.entry] if narrower is None else narrower.feed(ev.entry))
                if len(out) >= size:
                    break
            after = raw[-1].seq
        if narrower is not None:
            out.extend(narrower.finish())
        return raw, out

    def _take(self, client: str, state: _ClientState, size: int) -> tuple[Batch | None, _Pointer]:
        """Non-blocking get; returns (batch or None, what to wait after)."""
        pointer = self._read_pointer(client, state)
        raw, out = self._scan(state, pointer, size)
        if not raw:
            return None, pointer
        first, last = raw[0], raw[-1]
        if not out:
            if not self.meta.batches(client):
                self._move_cursor(client, state, last.position, last.seq)
                log.debug(
                    "%s: client %s skipped %d filtered entries", self.destination, client, len(raw)
                )
            return None, last.seq
        rng = PositionRange(first.position, last.position)
        batch_id = self.meta.add_batch(client, rng)
        state.seqs[batch_id] = (first.seq, last.seq)
        log.debug(
            "%s: client %s got batch %d (%d entries)", self.destination, client, batch_id, len(out)
        )
        return Batch(batch_id, out, rng.start, rng.end), last.seq

    def _answered(self, client: str, state: _ClientState, request_id: str | None) -> Batch | None:
        """The batch an earlier attempt of ``request_id`` took, if still outstanding."""
        if request_id is None or request_id not in state.requests:
            return None
        batch_id = state.requests[request_id]
        if self.meta.batch(client, batch_id) is None:  # acked or rolled back since
            del state.requests[request_id]
            return None
        log.info(
            "%s: client %s retried get %s: batch %d again",
            self.destination, client, request_id, batch_id,
        )  # fmt: skip
        batch = self._reread(client, state, batch_id)
        if batch is None:  # only a batch restored from etcd lacks its range in the store
            raise BatchUnavailable(f"{self.destination}: batch {batch_id} is not re-read yet")
        return batch

    def _reread(self, client: str, state: _ClientState, batch_id: int) -> Batch | None:
        rng = self.meta.batch(client, batch_id)
        if rng is None:
            raise self._unknown(client, batch_id, "get")
        seqs = state.seqs.get(batch_id)
        if seqs is None:
            try:
                seqs = self.store.find_range(rng.start, rng.end)
            except StoreError as exc:
                raise BatchUnavailable(f"{exc}; roll the batch back") from exc
            if seqs is None:
                return None
            state.seqs[batch_id] = seqs
        events = self.store.get_range(*seqs)
        entries = [ev.entry for ev in events]
        if not state.filter.passes_everything:
            entries = state.filter.narrow(entries)
        return Batch(batch_id, list(entries), rng.start, rng.end)

    def _move_cursor(
        self, client: str, state: _ClientState, position: LogPosition, seq: int | None
    ) -> None:
        self.meta.update_cursor(client, position)
        if seq is None:
            seq = self.store.seq_at_or_before(position)
        state.acked_seq = seq
        if seq is not None:
            self.store.ack(client, seq)


def _remember(state: _ClientState, request_id: str, batch_id: int) -> None:
    state.requests[request_id] = batch_id
    while len(state.requests) > REQUEST_IDS:
        del state.requests[next(iter(state.requests))]


def _check_start(start: object) -> None:
    if start not in ("latest", "earliest") and not isinstance(start, LogPosition):
        raise InvalidArgument("start", f'must be "latest", "earliest" or a position, not {start!r}')
