"""The connectors: ``Connector`` (the logic), ``SimpleConnector`` and ``ClusterConnector``.

A connector talks to the leader of one destination for one client id over the REST
API of docs/api.md. The leader comes from a ``LeaderResolver`` (a URL list following 307,
or etcd's running key followed by watch). Everything is done within a *session*: a
leader URL and its epoch, opened the way Canal's ``processActiveEnter`` does it:
subscribe again with the last filter, then roll back (``rollback_on_connect``), so
batches the previous leader handed out (and which we may never have seen) are
delivered again instead of being acked blindly.

Rules:

- one ``RetryPolicy`` drives every call: transport failures, 503 (``Retry-After`` is
  honoured), a 307 while in a session and stale-epoch replies drop the session and
  retry, re-resolving the leader; the wait between attempts ends early when the
  resolver sees a leader change;
- the connector never accepts a lower epoch than one it has seen (``X-Canal-Epoch``):
  such a reply comes from a stale leader (``StaleLeader``, retried); a reply with
  another epoch than the session's means the leader changed under the same URL;
- batches belong to the session that fetched them. ``ack``/``rollback`` of a batch of
  an earlier session are dropped with a warning: the reconnect rolled it back and its
  entries come again (duplicates are bounded by the unacked batches plus the acks the
  old leader had not yet flushed). A new leader may issue again an id its predecessor
  never flushed: a batch whose id is still held by a batch of an earlier session is
  rolled back at once and fetched again under the next id, so an id names one batch;
- a transport failure (timeout, reset) *suspends* the session instead of ending it:
  when the next attempt finds the same leader in the same epoch (etcd's record, or the
  epoch of the re-subscribe's answer), the session resumes without a rollback, so
  while nothing failed nothing is delivered twice. A retried get carries the same
  ``request_id`` (the server answers the batch the lost attempt took, never the next
  one); a retried ack or rollback whose batch is no longer outstanding was done by the
  lost attempt. A get that raises all the same (its policy or ``set_deadline`` gave up,
  an answer it could not read, an interrupt) leaves its ``request_id`` to the next get,
  which is its retry: a batch its lost attempt took is answered then, not skipped (and
  acked unseen by the ack after it). Every attempt of a request id carries the same
  ``ack``; a greater one goes on its own first (the leader answers a retried request id
  without acking anything more);
- with an etcd resolver every exchange runs in a worker thread (``InFlight``): when the
  watch names another leader (or none) while a request waits on the old one, the
  request is abandoned at once and the call goes on with the new leader; a late answer
  of the deposed leader is dropped, and any answer with a lower epoch than one seen is
  refused (``StaleLeader``);
- with an ``ActiveGate`` (ClientRunningMonitor) only the active consumer opens a
  session; the others wait in ``get_without_ack`` (returning empty batches). A get's
  long poll ends by the role's fencing deadline (later, the next active consumer may
  have rolled back on connect already). A batch that came while the role was lost is
  dropped and rolled back in its session (best effort, for ``request_timeout_s``: the
  next active consumer would ack it unseen with a later batch), except one the leader
  acked at once (``get``): nobody else would receive it;
- each leader change followed is logged on the ``canal_client`` logger with the
  destination, client id, old and new leader URL and epoch;
- bounded waits: with ``connect_timeout_s``, ``connect()`` gives up (``RetryExhausted``,
  its ``last_error`` names what was not reachable) when no leader was reached in that
  time: with a gate, a leader in etcd; without, a leader that answered. Until then an
  unknown destination (no node registered in etcd configures it, or a 404
  ``unknown_destination``) fails at once (``UnknownDestination``). Once a leader was
  reached, calls retry as the policy says (failover), but never past ``set_deadline``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httpx

from canal_client.exclusive import ActiveGate
from canal_client.inflight import Abandoned, InFlight
from canal_client.packed import PackedBatch
from canal_client.resolver import EtcdResolver, Leader, LeaderResolver, StaticResolver
from canal_client.stream import BatchStream
from canal_client.wire import HttpChannel, Redirected, Reply, WireFormat
from canal_cluster.coordinator import Coordinator
from canal_cluster.keys import DEFAULT_PREFIX, Keys, validate_id
from canal_cluster.retry import RetryPolicy
from canal_cluster.running import ElectionConfig
from canal_protocol import Batch
from canal_protocol.errors import (
    CanalError,
    ClientError,
    ConfigError,
    InvalidArgument,
    LeaderUnavailable,
    NotSubscribed,
    RetryExhausted,
    ServerUnreachable,
    StaleLeader,
    UnexpectedResponse,
    UnknownBatch,
    UnknownDestination,
)

if TYPE_CHECKING:
    from canal_cluster.etcd_security import EtcdSecurity

__all__ = ["DEFAULT_RETRY", "ClusterConnector", "Connector", "SimpleConnector"]

log = logging.getLogger("canal_client")
T = TypeVar("T")
B = TypeVar("B", Batch, PackedBatch)

DEFAULT_RETRY = RetryPolicy(initial_s=0.1, multiplier=2.0, max_delay_s=2.0, attempts=-1)
MAX_RETRY_AFTER_S = 30.0


class _SessionLost(ClientError):
    """The leader moved (307, new epoch): open a new session and retry."""


class _Inactive(ClientError):
    """This consumer is not the active one for its client id."""


StartArg = str | Mapping[str, Any]  # "latest", "earliest" or a position dict

_RETRYABLE = (ServerUnreachable, LeaderUnavailable, StaleLeader, _SessionLost)


@dataclass
class _Session:
    """A leader URL and its epoch (learned from the first reply carrying one)."""

    gen: int
    url: str
    epoch: int | None
    gate_gen: int


class Connector:
    """Connector over a ``LeaderResolver``; see the module docstring."""

    def __init__(
        self,
        destination: str,
        client_id: str,
        resolver: LeaderResolver,
        *,
        token: str | None = None,
        wire: WireFormat = "msgpack",
        retry: RetryPolicy | None = None,
        rollback_on_connect: bool = True,
        request_timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        gate: ActiveGate | None = None,
        connect_timeout_s: float | None = None,
    ) -> None:
        if connect_timeout_s is not None and connect_timeout_s <= 0:
            raise InvalidArgument("connect_timeout_s", f"must be > 0, got {connect_timeout_s!r}")
        self.destination = validate_id(destination, "destination")
        Keys().client_prefix(destination, client_id)  # validates client_id
        self.client_id = client_id
        self.rollback_on_connect = rollback_on_connect
        self._resolver = resolver
        self._gate = gate
        self._channel_args: dict[str, Any] = {
            "wire": wire,
            "token": token,
            "timeout_s": request_timeout_s,
            "transport": transport,
        }
        self._channel: HttpChannel | None = None
        self._retry = dataclasses.replace(retry or DEFAULT_RETRY, sleep=self._backoff_sleep)
        self._lock = threading.RLock()
        self._session: _Session | None = None
        self._gen = 0
        self._filter: str | None = None
        self._start: StartArg | None = None
        self._batches: dict[int, int] = {}  # outstanding batch id -> session gen
        self._epoch = 0
        self._last_leader: tuple[str, int | None] | None = None
        self._retry_after = 0.0
        self._backoff: tuple[Leader | None, Iterator[float]] | None = None  # leader, its delays
        self._closing = threading.Event()
        self.connect_timeout_s = connect_timeout_s
        self._connect_deadline: float | None = None
        self._deadline: float | None = None
        self._reached = False  # a leader was reached once: retry through failovers
        self._suspended: _Session | None = None  # the session a transport failure paused
        self._rid_prefix = uuid.uuid4().hex[:12]
        self._rids = itertools.count(1)
        self._unanswered: tuple[str, int | None] | None = None  # request id, its ack
        self._acks_on_get = True  # False once a server refused `ack` on a get (older)
        self._ack_taken: bool | None = None  # the fate of the last get's ack (last_ack_taken)
        self._inflight: InFlight | None = None
        if resolver.follows_changes:
            self._inflight = InFlight(f"{destination}/{client_id}")
            resolver.add_listener(self._inflight.interrupt)

    # -- properties of the contract -----------------------------------------------------

    @property
    def epoch(self) -> int:
        """The highest epoch seen (0 before the first reply)."""
        return self._epoch

    @property
    def leader_url(self) -> str | None:
        session = self._session
        return session.url if session is not None else None

    @property
    def connected(self) -> bool:
        return self._channel is not None

    @property
    def reached(self) -> bool:
        """A leader was reached once (with a gate: found in etcd)."""
        return self._reached

    def set_deadline(self, when: float | None) -> None:
        """Calls retrying past ``when`` (``time.monotonic()``) give up with
        ``RetryExhausted``; None: retry as the policy says."""
        self._deadline = when

    def _base(self) -> str:
        return f"/v1/destinations/{self.destination}/clients/{self.client_id}"

    # -- lifecycle ----------------------------------------------------------------------

    def connect(self) -> None:
        """Start following the leader; without a gate open the session (rollback) now.
        Bounded by ``connect_timeout_s`` (see the module docstring)."""
        with self._lock:
            if self._channel is not None:
                return
            self._closing.clear()
            self._channel = HttpChannel(**self._channel_args)
            if self.connect_timeout_s is not None and not self._reached:
                self._connect_deadline = time.monotonic() + self.connect_timeout_s
            self._resolver.start()
        try:
            if self._gate is None:
                self._call("connect", lambda session: None)
                return
            self._gate.check_access()
            if self._connect_deadline is not None:
                self._await_leader(self._connect_deadline)
            with self._lock:
                self._gate.start()
        except BaseException:
            self.disconnect()
            raise

    def _await_leader(self, deadline: float) -> None:
        """With a gate: wait until etcd names a leader (the active role comes later)."""
        attempts = 0
        while self._resolver.current() is None:
            attempts += 1
            problem = self._resolver.no_leader()
            if isinstance(problem, UnknownDestination):
                raise problem
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closing.is_set():
                raise self._not_connected("connect", attempts, problem)
            self._resolver.wait_change(min(remaining, 1.0))
            self._resolver.reload()
        self._reached = True

    def disconnect(self) -> None:
        """Stop; a call retrying in another thread gives up (``ClientError``)."""
        self._closing.set()
        self._resolver.close()  # wakes a retry waiting for a leader change
        if self._inflight is not None:
            self._inflight.interrupt()  # and a call waiting on a request
        with self._lock:
            if self._gate is not None:
                self._gate.stop()
            self._resolver.close()
            if self._inflight is not None:
                self._inflight.close()
            if self._channel is not None:
                self._channel.close()
            self._channel = None
            self._session = None
            self._suspended = None

    def __enter__(self) -> Connector:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.disconnect()

    # -- the calls ----------------------------------------------------------------------

    def subscribe(self, filter: str = "", start: StartArg | None = None) -> None:
        """Subscribe (again) with ``filter``; kept and re-sent after every leader change.

        ``start`` applies only when the client id is not subscribed yet (a re-subscribe
        keeps its cursor): ``"latest"`` (the server's default: only changes after now),
        ``"earliest"`` (the oldest change the destination still holds) or a position
        dict (``cursor()``, a batch's start/end).
        """
        if start not in (None, "latest", "earliest") and not isinstance(start, Mapping):
            raise InvalidArgument(
                "start", f'must be "latest", "earliest" or a position dict, not {start!r}'
            )
        with self._lock:
            self._filter, self._start = filter, start
            if self._gate is not None and not self._gate.is_active():
                return  # sent when this consumer becomes active
            try:
                self._call("subscribe", lambda s: self._put_subscription(s.url, filter, leader=s))
            except _Inactive:
                return

    def get_without_ack(self, size: int, timeout_s: float, ack: int | None = None) -> Batch:
        """Up to ``size`` entries, waiting up to ``timeout_s``; ack or roll back later.

        ``ack``: the id of a batch you have processed, acknowledged by the same request
        before the leader takes the next batch (one round trip less per batch than
        ``ack()`` then ``get_without_ack()``; the same rules as ``ack``: pass it only
        once its entries are processed)."""
        return self._get_acking(size, timeout_s, False, ack)

    def get(self, size: int, timeout_s: float, ack: int | None = None) -> Batch:
        """Like ``get_without_ack`` but acknowledged by the server at once."""
        return self._get_acking(size, timeout_s, True, ack)

    def stream(self, size: int, timeout_s: float, prefetch: bool = True) -> BatchStream:
        """The batches as an iterator (``canal_client.stream``): each batch is acked by
        a later get once you ask for the next one; with ``prefetch`` the next get is in
        flight (a worker thread) while you process a batch. Use it in a ``with`` block:
        its end rolls back what was not processed (``commit()`` acks the last batch)."""
        _check_get(size, timeout_s)
        return BatchStream(self, size, timeout_s, prefetch)

    def outstanding(self, batch_id: int) -> bool:
        """``batch_id`` was handed out to this connector and not acked or rolled back."""
        return batch_id in self._batches

    def get_batch(self, batch_id: int) -> Batch:
        """An outstanding batch again (``UnknownBatch`` once acked or rolled back)."""
        return self._refetch(batch_id, _as_model, tuples=True)

    def get_without_ack_packed(
        self, size: int, timeout_s: float, ack: int | None = None
    ) -> PackedBatch:
        """``get_without_ack`` as the leader's msgpack bytes with an index of the entries
        (``canal_client.packed``): no Python object per row value. msgpack wire only."""
        empty = PackedBatch(-1)
        return self._get_acking(size, timeout_s, False, ack, _as_packed, empty)

    def _get_acking(
        self,
        size: int,
        timeout_s: float,
        auto_ack: bool,
        ack: int | None,
        decode: Callable[[Reply], B] | None = None,
        empty: B | None = None,
    ) -> B:
        """``_get`` with ``ack`` on the request; a server that does not know the field
        (older), an inactive consumer or an ack that cannot ride on the retry of an
        unanswered get (``_ack_rides``) gets a separate ``ack()`` first."""
        active = self._gate is None or self._gate.is_active()
        if ack is None or (self._acks_on_get and active and self._ack_rides(ack)):
            try:
                return self._get(size, timeout_s, auto_ack, decode, empty, ack)
            except InvalidArgument as exc:
                if ack is None or exc.field != "ack":
                    raise
                log.info("%s/%s: the leader takes no ack on a get (older server): %s",
                         self.destination, self.client_id, exc)  # fmt: skip
                self._acks_on_get = False
        taken = self.ack(ack)  # a separate ack first
        carry = taken and self._acks_on_get and self._unanswered is not None
        batch = self._get(size, timeout_s, auto_ack, decode, empty, ack if carry else None)
        self._ack_taken = taken
        return batch

    def _ack_rides(self, ack: int) -> bool:
        """Whether ``ack`` can go on the next get: not above the ack of an unanswered get,
        whose request id that get re-sends (the leader answers the batch it took and acks
        nothing more: only what its attempts carried)."""
        lost = self._unanswered
        return lost is None or (lost[1] is not None and ack <= lost[1])

    def _request_id(self, ack: int | None) -> tuple[str, int | None]:
        """The request id of a get and the ack it carries: an unanswered get's (its
        attempts may have taken a batch; they carried its ack, which only grows), else new.
        The get is unanswered until ``_get`` has its batch."""
        rid, carried = self._unanswered or (f"{self._rid_prefix}-{next(self._rids)}", None)
        if carried is not None and self._acks_on_get:
            ack = carried if ack is None else max(ack, carried)
        self._unanswered = (rid, ack)
        return rid, ack

    @property
    def last_ack_taken(self) -> bool | None:
        """Whether the leader took the ``ack`` of the last get: False when it was dropped
        (its batch came from an earlier session: its entries come again), None when
        that get carried no ack (or did not reach a leader)."""
        return self._ack_taken

    def get_batch_packed(self, batch_id: int) -> PackedBatch:
        """``get_batch`` as the leader's bytes (see ``get_without_ack_packed``)."""
        return self._refetch(batch_id, _as_packed, raw=True)

    def _refetch(
        self, batch_id: int, decode: Callable[[Reply], B], tuples: bool = False, raw: bool = False
    ) -> B:
        with self._lock:

            def op(session: _Session) -> B:
                self._check_batch_session(batch_id, session)
                path = f"{self._base()}/batches/{batch_id}?layout=compact"
                return decode(self._request(session, "GET", path, tuples=tuples, raw=raw))

            try:
                return self._call("get_batch", op)
            except (_Inactive, _StaleBatch) as exc:
                raise UnknownBatch(f"batch {batch_id}: {exc}") from exc

    def table(self, name: str) -> dict[str, Any]:
        """The columns of table ``name`` (``schema.table``) as the leader's database has
        them (``GET /v1/destinations/{d}/tables/{name}``); opens no session.
        ``UnknownTable`` when it does not exist."""

        def op(leader: Leader) -> dict[str, Any]:
            channel = self._require_channel()
            path = f"/v1/destinations/{self.destination}/tables/{name}"
            reply = channel.request("GET", leader.url, path, follow_redirects=True)
            self._note_epoch(reply.epoch)
            if not isinstance(reply.body, dict):
                raise UnexpectedResponse(f"GET {path}: not an object")
            return reply.body

        with self._lock:
            return self._call_leader("table", op)

    def ack(self, batch_id: int) -> bool:
        """Acknowledge every outstanding batch up to ``batch_id``; False when the ack was
        dropped (the batch came from an earlier session, rolled back by a reconnect, or
        this consumer is no longer active): its entries come again."""
        return self._finish_batch("ack", batch_id, f"/batches/{batch_id}/ack")

    def rollback(self, batch_id: int | None = None) -> None:
        """Roll back ``batch_id`` and the later ones; None: every outstanding batch."""
        if batch_id is None:
            with self._lock:
                try:
                    self._call("rollback", self._rollback_all)
                except _Inactive:
                    return
                self._batches.clear()
            return
        self._finish_batch("rollback", batch_id, f"/batches/{batch_id}/rollback")

    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None:
        """Commit through the entry starting at ``logfile``:``offset`` (``POST C/cursor``):
        the leader drops every outstanding batch of the client and moves its cursor
        forward to that entry, as far as its store reaches; the cursor after it (or None)."""
        with self._lock:

            def op(session: _Session) -> Any:
                path = f"{self._base()}/cursor"
                body = {"logfile": logfile, "offset": offset}
                return self._request(session, "POST", path, body).body

            try:
                reply = self._call("move_cursor", op)
            except _Inactive:
                return None
            self._batches.clear()
        cursor = reply.get("cursor") if isinstance(reply, dict) else None
        return cursor if isinstance(cursor, dict) else None

    def cursor(self) -> dict[str, Any] | None:
        """The last acked position (LogPosition as a dict) or None; opens no session."""

        def op(leader: Leader) -> dict[str, Any] | None:
            channel = self._require_channel()
            reply = channel.request(
                "GET", leader.url, f"{self._base()}/cursor", follow_redirects=True
            )
            self._note_epoch(reply.epoch)
            body = reply.body
            if isinstance(body, dict) and "cursor" in body and "position" not in body:
                body = body["cursor"]
            return body if isinstance(body, dict) and body else None

        with self._lock:
            return self._call_leader("cursor", op)

    # -- batches ------------------------------------------------------------------------

    def _get(
        self,
        size: int,
        timeout_s: float,
        auto_ack: bool,
        decode: Callable[[Reply], B] | None = None,
        empty: B | None = None,
        ack: int | None = None,
    ) -> B:
        """A batch, made by ``decode`` (default: the ``Batch`` model); ``empty`` when none.
        With ``ack``, that batch is acknowledged by the same request (dropped with a
        warning when an earlier session fetched it, as ``ack`` does). The request id is
        the one of an unanswered get, if any (``_request_id``)."""
        _check_get(size, timeout_s)
        make: Callable[[Reply], Any] = decode or _as_model
        none: Any = Batch.empty() if empty is None else empty
        if self._gate is not None and not self._gate.wait_active(timeout_s):
            return cast(B, none)
        packed = decode is _as_packed
        self._ack_taken = None
        with self._lock:
            rid, ack = self._request_id(ack)
            body = {"size": size, "auto_ack": auto_ack, "layout": "compact", "request_id": rid}
            acked: list[bool] = []  # the last attempt's: did its request carry the ack

            def op(session: _Session) -> tuple[Any, _Session]:
                path = f"{self._base()}/batches"
                wait = self._poll_wait(timeout_s)
                acking = ack is not None and not self._stale_ack(ack, session)
                acked[:] = [acking]
                sent = {**body, "timeout_ms": int(wait * 1000)}
                if acking:
                    sent["ack"] = ack
                reply = self._request(
                    session, "POST", path, sent, extra_timeout_s=wait,
                    tuples=not packed, raw=packed,
                )  # fmt: skip
                return make(reply), session

            try:
                batch, session = self._call("get_without_ack", op)
            except _Inactive:
                return cast(B, none)
            except UnknownBatch:  # the ack was never issued: refused, nothing taken
                self._unanswered = (rid, None)
                raise
            if ack is not None:
                self._ack_taken = acked == [True]
                self._forget_batches("ack", ack)
            if not auto_ack and self._lost_role(batch.id, session):
                self._unanswered = None
                self._give_back(batch.id, session)
                return cast(B, none)
            if not auto_ack and self._reissued(batch.id, session):
                self._unanswered = (rid, None)  # answered (its ack done): unanswered again
                return self._get_again(batch.id, session, size, timeout_s, decode, empty)
            self._unanswered = None
            return cast(B, self._handed_out(batch, session, auto_ack))

    def _reissued(self, batch_id: int, session: _Session) -> bool:
        """An earlier session handed out a batch with this id, which the caller may still
        ack or roll back: a new leader issues again ids its predecessor never flushed."""
        gen = self._batches.get(batch_id)
        return gen is not None and gen != session.gen

    def _get_again(
        self,
        batch_id: int,
        session: _Session,
        size: int,
        timeout_s: float,
        decode: Callable[[Reply], B] | None,
        empty: B | None,
    ) -> B:
        """Batch ``batch_id`` of ``session`` is ``_reissued``: roll it back and get the
        next batch (the same entries under a new id), so that an ack or rollback of the
        earlier session's batch is dropped as such, never taken for this one."""
        log.info(
            "%s/%s: batch %d from %s (epoch %s) reuses the id of a batch of an earlier "
            "session: rolled back, getting it again under a new id",
            self.destination, self.client_id, batch_id, session.url, session.epoch,
        )  # fmt: skip
        path = f"{self._base()}/batches/{batch_id}/rollback"

        def give_back(now: _Session) -> None:
            if now is session:  # else the new session rolled everything back on connect
                self._request(now, "POST", path)

        with contextlib.suppress(UnknownBatch, _Inactive):  # rolled back by an attempt
            self._call("rollback", give_back)  # whose answer was lost; by the next active
        taken = self._ack_taken
        batch = self._get(size, timeout_s, False, decode, empty)
        self._ack_taken = taken
        return batch

    def _poll_wait(self, timeout_s: float) -> float:
        """How long the leader may wait for entries: ``timeout_s``, but with a gate only
        until the active role's fencing deadline (``_Inactive`` once it passed): later,
        another consumer may have taken over and rolled back on connect, and a batch the
        poll took then would be acked unseen by that consumer's acks of later batches."""
        if self._gate is None:
            return timeout_s
        left = self._gate.valid_for()
        if left <= 0:
            raise _Inactive("this consumer is no longer the active one for its client id")
        return min(timeout_s, left)

    def _lost_role(self, batch_id: int, session: _Session) -> bool:
        """A get of ``session`` brought batch ``batch_id`` after this consumer lost the
        active role (perhaps regained since)."""
        gate = self._gate
        if batch_id < 0 or gate is None:
            return False
        return not gate.is_active() or gate.generation != session.gate_gen

    def _give_back(self, batch_id: int, session: _Session) -> None:
        """Roll back batch ``batch_id``, dropped by a get that brought it after the role
        was lost (``_lost_role``; a batch the leader acked, ``get()``, is kept: nobody
        else gets it): the next active consumer may have rolled back on connect before
        it was taken, and its ack of a later batch would ack this one unseen. Best effort:
        in ``session`` only (a new leader's sessions roll back on connect), retried
        through transport failures for ``request_timeout_s``; a late rollback only makes
        the next consumer's batches after it come again."""
        log.warning(
            "%s/%s: dropped batch %d: no longer the active consumer; rolling it back",
            self.destination, self.client_id, batch_id,
        )  # fmt: skip
        what = f"rollback of dropped batch {batch_id}"
        path = f"{self._base()}/batches/{batch_id}/rollback"
        policy = dataclasses.replace(self._retry, deadline_s=self._channel_args["timeout_s"])
        try:
            policy.call(
                lambda: self._request(session, "POST", path), self._what(what),
                (ServerUnreachable, LeaderUnavailable), self._logger(what),
            )  # fmt: skip
        except (UnknownBatch, NotSubscribed, Redirected, Abandoned, StaleLeader, _SessionLost):
            log.info(  # the next active one rolled back after the get, or acked past it
                "%s: not done: the batch is no longer outstanding or %s is no longer the "
                "leader (its successor's sessions roll back on connect)",
                self._what(what), session.url,
            )  # fmt: skip
        except CanalError as exc:
            log.error(
                "%s/%s: could not roll back batch %d, taken after this consumer lost the "
                "active role (%s): if the active consumer acks a later batch of %s, the "
                "entries of batch %d are lost",
                self.destination, self.client_id, batch_id, exc, session.url, batch_id,
            )  # fmt: skip

    def _handed_out(self, batch: B, session: _Session, auto_ack: bool) -> B:
        """``batch`` as the get returns it, recorded as outstanding in ``session``."""
        if batch.id < 0:
            return batch
        if not auto_ack:
            self._batches[batch.id] = session.gen
        log.debug(
            "%s/%s: batch %d (%d entries) from %s epoch %s",
            self.destination,
            self.client_id,
            batch.id,
            len(batch.entries),
            session.url,
            session.epoch,
        )
        return batch

    def _finish_batch(self, what: str, batch_id: int, path: str) -> bool:
        with self._lock:
            lost_in: set[int] = set()  # sessions in which an attempt's answer was lost

            def op(session: _Session) -> None:
                self._check_batch_session(batch_id, session)
                try:
                    self._request(session, "POST", self._base() + path)
                except ServerUnreachable:
                    lost_in.add(session.gen)
                    raise
                except UnknownBatch:
                    if session.gen not in lost_in:
                        raise
                    log.info(  # the same leader, same term: the lost attempt did it
                        "%s/%s: %s of batch %d was done by the attempt whose answer was lost",
                        self.destination, self.client_id, what, batch_id,
                    )  # fmt: skip

            done = True
            try:
                self._call(what, op)
            except (_StaleBatch, _Inactive) as exc:
                done = False
                log.warning(
                    "%s/%s: %s of batch %d dropped: %s; its entries will be delivered again",
                    self.destination,
                    self.client_id,
                    what,
                    batch_id,
                    exc,
                )
            self._forget_batches(what, batch_id)
            return done

    def _forget_batches(self, what: str, batch_id: int) -> None:
        """Batches no longer outstanding after ``what`` (ack or rollback) of batch_id."""
        gen = self._batches.get(batch_id)
        for bid in [b for b, g in self._batches.items() if g == gen]:
            if bid <= batch_id if what == "ack" else bid >= batch_id:
                del self._batches[bid]
        self._batches.pop(batch_id, None)

    def _stale_ack(self, batch_id: int, session: _Session) -> bool:
        """True (and a warning) when batch_id came from an earlier session: its ack is
        dropped, the reconnect rolled it back and its entries come again."""
        try:
            self._check_batch_session(batch_id, session)
        except _StaleBatch as exc:
            log.warning(
                "%s/%s: ack of batch %d dropped: %s; its entries will be delivered again",
                self.destination, self.client_id, batch_id, exc,
            )  # fmt: skip
            return True
        return False

    def _check_batch_session(self, batch_id: int, session: _Session) -> None:
        gen = self._batches.get(batch_id)
        if gen is not None and gen != session.gen:
            raise _StaleBatch("rolled back by a reconnect to the leader since it was fetched")

    # -- sessions -----------------------------------------------------------------------

    def _call(self, what: str, op: Callable[[_Session], T]) -> T:
        """Run ``op`` in a session, retrying per the policy (see the module docstring)."""

        def attempt() -> T:
            session = self._ensure_session()
            try:
                return op(session)
            except Redirected as exc:
                self._resolver.redirected(exc.leader_url)
                self._drop_session(session)
                raise _SessionLost(str(exc)) from exc
            except Abandoned as exc:
                self._drop_session(session)
                raise _SessionLost(str(exc)) from exc
            except ServerUnreachable as exc:
                self._on_failure(session.url, exc)
                self._suspend(session, what, exc)
                raise
            except _RETRYABLE as exc:
                self._on_failure(session.url, exc)
                self._drop_session(session)
                raise

        return self._retrying(what, attempt)

    def _call_leader(self, what: str, op: Callable[[Leader], T]) -> T:
        """Run ``op`` against the current leader without a session (read-only calls)."""

        def attempt() -> T:
            self._require_channel()
            leader = self._leader()
            try:
                return op(leader)
            except _RETRYABLE as exc:
                self._on_failure(leader.url, exc)
                raise

        return self._retrying(what, attempt)

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt`` under the policy, bounded by the connect timeout (until a leader
        was reached) and by ``set_deadline``."""
        give_up = self._give_up_at()
        policy = self._retry
        if give_up is not None:
            policy = dataclasses.replace(policy, deadline_s=max(0.0, give_up - time.monotonic()))
        try:
            return policy.call(attempt, self._what(what), _RETRYABLE, self._logger(what))
        except RetryExhausted as exc:
            if self._reached or self._connect_deadline is None:
                raise
            raise self._not_connected(what, exc.attempts, exc.last_error) from exc

    def _give_up_at(self) -> float | None:
        bounds = [self._deadline] if self._deadline is not None else []
        if not self._reached and self._connect_deadline is not None:
            bounds.append(self._connect_deadline)
        return min(bounds, default=None)

    def _not_connected(
        self, what: str, attempts: int, last: BaseException | None
    ) -> RetryExhausted:
        return RetryExhausted(
            f"{self._what(what)}: not connected after {self.connect_timeout_s:g} s",
            attempts,
            last,
        )

    def _leader(self) -> Leader:
        """The leader to talk to; before one was reached, why there is none."""
        leader = self._resolver.current()
        if leader is None:
            self._resolver.reload()  # etcd may have come back without a watch event
            leader = self._resolver.current()
        if leader is not None:
            return leader
        if self._reached or self._connect_deadline is None:
            raise LeaderUnavailable(f"no leader known for {self.destination}")
        raise self._resolver.no_leader()

    def _what(self, what: str) -> str:
        return f"{self.destination}/{self.client_id}: {what}"

    def _on_failure(self, url: str, exc: BaseException) -> None:
        if isinstance(exc, LeaderUnavailable) and exc.retry_after_s is not None:
            self._retry_after = min(exc.retry_after_s, MAX_RETRY_AFTER_S)
        if not isinstance(exc, _SessionLost):
            self._resolver.failed(url)

    def _ensure_session(self) -> _Session:
        self._require_channel()
        gate_gen = 0
        if self._gate is not None:
            gate_gen = self._gate.generation
            if not self._gate.is_active():
                self._session = None
                raise _Inactive("this consumer is not the active one for its client id")
        leader = self._leader()
        if leader.epoch is not None and leader.epoch < self._epoch:
            raise StaleLeader(f"{leader.url} has epoch {leader.epoch} < {self._epoch}")
        s = self._session
        if (
            s is not None
            and s.url == leader.url
            and s.gate_gen == gate_gen
            and (leader.epoch is None or s.epoch is None or leader.epoch <= s.epoch)
        ):
            return s
        return self._open_session(leader, gate_gen)

    def _open_session(self, leader: Leader, gate_gen: int) -> _Session:
        """Canal's processActiveEnter: subscribe with the last filter, then roll back;
        or resume the suspended session when the leader and its epoch are the same."""
        self._session = None
        resume, self._suspended = self._suspended, None
        if resume is not None and (resume.gate_gen != gate_gen or resume.epoch is None):
            resume = None
        if resume is not None and (leader.url, leader.epoch) == (resume.url, resume.epoch):
            return self._resume(resume)  # etcd names the same leader in the same term
        try:
            url, epoch = self._enter(leader, resume)
        except Abandoned as exc:
            self._suspended = resume
            raise _SessionLost(str(exc)) from exc
        except _RETRYABLE as exc:
            self._suspended = resume
            self._on_failure(leader.url, exc)
            raise
        if resume is not None and (url, epoch) == (resume.url, resume.epoch):
            return self._resume(resume)
        self._gen += 1
        self._session = _Session(self._gen, url, epoch, gate_gen)
        self._reached = True
        self._log_leader(url, epoch)
        return self._session

    def _enter(self, leader: Leader, resume: _Session | None) -> tuple[str, int | None]:
        """Subscribe (or, to tell whether ``resume`` still holds, ask the cursor), then
        roll back unless the answering leader and epoch are ``resume``'s."""
        url, epochs = leader.url, [leader.epoch]
        if self._filter is not None or resume is not None:
            reply = self._probe(leader)
            if reply is not None:
                url, epochs = reply.url, [*epochs, reply.epoch]
        epoch = max((e for e in epochs if e is not None), default=None)
        same = resume is not None and (url, epoch) == (resume.url, resume.epoch)
        if self.rollback_on_connect and not same:
            rolled = self._rollback_at(leader, url)
            if rolled is not None:
                url, epochs = rolled.url, [*epochs, rolled.epoch]
        if url != leader.url:
            self._resolver.redirected(url)
        epoch = max((e for e in epochs if e is not None), default=None)
        self._note_epoch(epoch)
        return url, epoch

    def _probe(self, leader: Leader) -> Reply | None:
        """The re-subscribe (idempotent), else the cursor read: who answers, in which
        epoch (None: not subscribed)."""
        if self._filter is not None:
            return self._put_subscription(leader.url, self._filter, follow=True, leader=leader)
        path = f"{self._base()}/cursor"
        channel = self._require_channel()
        try:
            reply = self._exchange(
                leader, lambda: channel.request("GET", leader.url, path, follow_redirects=True)
            )
        except NotSubscribed:
            return None
        self._note_epoch(reply.epoch)
        return reply

    def _suspend(self, session: _Session, what: str, exc: BaseException) -> None:
        """A transport failure: the session may resume with the same leader and epoch."""
        if self._session is session:
            self._session = None
            self._suspended = session
        log.info(
            "%s: %s to %s (epoch %s) failed: %s; retrying",
            self._what(what), what, session.url, session.epoch, exc,
        )  # fmt: skip

    def _resume(self, session: _Session) -> _Session:
        self._session = session
        log.info(
            "%s/%s: resumed the session with %s (epoch %s): same leader, nothing rolled back",
            self.destination, self.client_id, session.url, session.epoch,
        )  # fmt: skip
        return session

    def _exchange(self, leader: Leader | _Session, fn: Callable[[], Reply]) -> Reply:
        """``fn()``; with a watching resolver in the worker, abandoned (``Abandoned``)
        as soon as the resolver names another leader than ``leader`` (or none)."""
        if self._inflight is None:
            return fn()
        url, epoch = leader.url, leader.epoch

        def reason_to_stop() -> str | None:
            if self._closing.is_set():
                return "disconnecting"
            now = self._resolver.current()
            if now is None:
                return f"{url} (epoch {epoch}) is no longer the leader; none is known yet"
            if now.url != url or (None not in (epoch, now.epoch) and now.epoch != epoch):
                return (
                    f"the leader moved from {url} (epoch {epoch}) to {now.url} (epoch {now.epoch})"
                )
            return None

        return self._inflight.run(fn, reason_to_stop)

    def _log_leader(self, url: str, epoch: int | None) -> None:
        previous, self._last_leader = self._last_leader, (url, epoch)
        if previous is None:
            log.info(
                "%s/%s: connected to leader %s (epoch %s)",
                self.destination,
                self.client_id,
                url,
                epoch,
            )
        elif previous != (url, epoch):
            log.warning(
                "%s/%s: following leader change %s (epoch %s) -> %s (epoch %s)",
                self.destination,
                self.client_id,
                previous[0],
                previous[1],
                url,
                epoch,
            )
        else:
            log.info("%s/%s: reconnected to leader %s", self.destination, self.client_id, url)

    def _drop_session(self, session: _Session) -> None:
        if self._session is session:
            self._session = None

    def _note_epoch(self, epoch: int | None) -> None:
        if epoch is None:
            return
        if epoch < self._epoch:
            raise StaleLeader(f"reply with epoch {epoch} < {self._epoch} seen: a stale leader")
        self._epoch = epoch

    # -- requests -----------------------------------------------------------------------

    def _require_channel(self) -> HttpChannel:
        channel = self._channel
        if channel is None or self._closing.is_set():
            raise ClientError(f"{self.destination}/{self.client_id}: not connected")
        return channel

    def _request(
        self,
        session: _Session,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        extra_timeout_s: float = 0.0,
        tuples: bool = False,
        raw: bool = False,
    ) -> Reply:
        channel = self._require_channel()
        reply = self._exchange(
            session,
            lambda: channel.request(
                method,
                session.url,
                path,
                body,
                extra_timeout_s=extra_timeout_s,
                tuples=tuples,
                raw=raw,
            ),
        )
        self._note_epoch(reply.epoch)
        if reply.epoch is None or self._session is not session:
            return reply
        if session.epoch is None:
            session.epoch = reply.epoch
            self._last_leader = (session.url, reply.epoch)
        elif reply.epoch != session.epoch:
            raise _SessionLost(f"{session.url} now answers with epoch {reply.epoch}")
        return reply

    def _put_subscription(
        self, url: str, filter: str, follow: bool = False, leader: Leader | _Session | None = None
    ) -> Reply:
        path = f"{self._base()}/subscription"
        body: dict[str, Any] = {"filter": filter}
        if self._start is not None:
            body["start"] = self._start if isinstance(self._start, str) else dict(self._start)
        channel = self._require_channel()

        def put() -> Reply:
            return channel.request("PUT", url, path, body, follow_redirects=follow)

        reply = put() if leader is None else self._exchange(leader, put)
        self._note_epoch(reply.epoch)
        return reply

    def _rollback_at(self, leader: Leader, url: str) -> Reply | None:
        """Roll back every outstanding batch at ``url`` (following a redirect)."""
        path = f"{self._base()}/rollback"
        channel = self._require_channel()
        try:
            reply = self._exchange(
                leader, lambda: channel.request("POST", url, path, follow_redirects=True)
            )
        except NotSubscribed:
            return None  # nothing to roll back yet (Canal ignores it too)
        self._note_epoch(reply.epoch)
        return reply

    def _rollback_all(self, session: _Session) -> None:
        try:
            self._request(session, "POST", f"{self._base()}/rollback")
        except NotSubscribed:
            return

    # -- waiting ------------------------------------------------------------------------

    def _backoff_sleep(self, delay: float) -> None:
        """Wait before the next attempt: the policy's delay, but counted again from its
        start when the leader changed since the last wait (the backoff that grew against
        a dead leader must not delay the first calls to the new one), and at least the
        server's Retry-After; a leader change ends the wait early."""
        leader = self._resolver.current()
        if self._backoff is None or self._backoff[0] != leader:
            self._backoff = (leader, self._retry.delays())
        fresh = next(self._backoff[1], delay)
        wait, self._retry_after = max(fresh, self._retry_after), 0.0
        give_up = self._give_up_at()
        if give_up is not None:  # a long Retry-After must not outlast the deadline
            wait = min(wait, max(0.0, give_up - time.monotonic()))
        self._resolver.wait_change(wait)

    def _logger(self, what: str) -> Callable[[int, BaseException], None]:
        def log_retry(attempt: int, exc: BaseException) -> None:
            level = logging.INFO if attempt <= 3 else logging.WARNING
            log.log(level, "%s: attempt %d failed: %s", self._what(what), attempt, exc)

        return log_retry


def _check_get(size: int, timeout_s: float) -> None:
    """The arguments of a get: ``InvalidArgument`` naming the field."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise InvalidArgument("size", f"must be an int > 0, got {size!r}")
    if timeout_s < 0:
        raise InvalidArgument("timeout_s", f"must be >= 0, got {timeout_s!r}")


def _as_model(reply: Reply) -> Batch:
    return Batch.from_wire(reply.body, reply.binary_as_base64)


def _as_packed(reply: Reply) -> PackedBatch:
    return PackedBatch.parse(reply.body)


class _StaleBatch(ClientError):
    """The batch was fetched in an earlier session (rolled back on reconnect)."""


class SimpleConnector(Connector):
    """One server URL; follows 307 redirects to the leader (Canal's SimpleCanalConnector)."""

    def __init__(self, url: str, destination: str, client_id: str, **options: Any) -> None:
        super().__init__(destination, client_id, StaticResolver([url]), **options)


class ClusterConnector(Connector):
    """Follows the leader by etcd's running key (``etcd=``) or over ``servers=`` URLs.

    With etcd, ``exclusive=True`` adds the ClientRunningMonitor (one active consumer per
    client id; ``election`` tunes it). ``coordinator`` injects a ready Coordinator
    (tests); otherwise one ``EtcdCoordinator`` is made and closed on ``disconnect``, so
    such a connector cannot connect again after ``disconnect`` (make a new one).
    ``etcd_security`` (``canal_cluster.etcd_security.EtcdSecurity``): TLS files and an
    etcd user for ``https://`` endpoints; etcd refusing them fails ``connect`` at once.
    """

    def __init__(
        self,
        destination: str,
        client_id: str,
        etcd: Sequence[str] | None = None,
        servers: Sequence[str] | None = None,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        exclusive: bool = False,
        election: ElectionConfig | None = None,
        coordinator: Coordinator | None = None,
        etcd_timeout_s: float = 2.0,
        etcd_security: EtcdSecurity | None = None,
        **options: Any,
    ) -> None:
        self._owned: Coordinator | None = None
        gate: ActiveGate | None = None
        if etcd or coordinator is not None:
            coord = coordinator or self._make_coordinator(etcd or (), etcd_timeout_s, etcd_security)
            keys = Keys(prefix)
            where = f"etcd {','.join(etcd)}" if etcd else "etcd"
            resolver: LeaderResolver = EtcdResolver(coord, keys, destination, where)
            if exclusive:
                gate = ActiveGate(coord, keys, destination, client_id, election)
        elif servers:
            if exclusive:
                raise ConfigError("exclusive", "needs etcd (the client running key)")
            resolver = StaticResolver(servers)
        else:
            raise ConfigError("etcd", "give etcd endpoints or server URLs")
        super().__init__(
            destination, client_id, resolver, token=token, retry=retry, gate=gate, **options
        )

    def _make_coordinator(
        self, endpoints: Sequence[str], timeout_s: float, security: EtcdSecurity | None
    ) -> Coordinator:
        from canal_cluster.etcd_coordinator import EtcdCoordinator

        self._owned = EtcdCoordinator(list(endpoints), timeout_s=timeout_s, security=security)
        return self._owned

    def disconnect(self) -> None:
        super().disconnect()
        if self._owned is not None:
            self._owned.close()
            self._owned = None
