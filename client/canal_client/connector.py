"""The connectors: ``Connector`` (the API), ``SimpleConnector`` and ``ClusterConnector``.

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

The parts, one private module each: the session state machine (``_session``), the
retry policy with its deadlines and backoff (``_retry``), the batch calls
(``_batches``) and their book of outstanding batches and request ids
(``_outstanding``); the active role is ``exclusive.ActiveGate``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from canal_client._batches import BatchCalls, as_model, as_packed, check_get
from canal_client._retry import DEFAULT_RETRY, Retries
from canal_client._session import Session, Sessions, StartArg
from canal_client.exclusive import ActiveGate, Inactive
from canal_client.packed import PackedBatch
from canal_client.resolver import EtcdResolver, Leader, LeaderResolver, StaticResolver
from canal_client.stream import BatchStream
from canal_client.wire import HttpChannel, WireFormat
from canal_cluster.coordinator import Coordinator
from canal_cluster.keys import DEFAULT_PREFIX, Keys, validate_id
from canal_cluster.retry import RetryPolicy
from canal_cluster.running import ElectionConfig
from canal_protocol import Batch
from canal_protocol.errors import (
    ConfigError,
    InvalidArgument,
    UnexpectedResponse,
    UnknownDestination,
)

if TYPE_CHECKING:
    from canal_cluster.etcd_security import EtcdSecurity

__all__ = ["DEFAULT_RETRY", "ClusterConnector", "Connector", "SimpleConnector"]


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
        self._resolver = resolver
        self._gate = gate
        self._channel_args: dict[str, Any] = {
            "wire": wire,
            "token": token,
            "timeout_s": request_timeout_s,
            "transport": transport,
        }
        self._lock = threading.RLock()
        self._retries = Retries(retry, resolver, self._what, connect_timeout_s)
        self._sessions = Sessions(
            destination, client_id, resolver, gate, self._retries, rollback_on_connect
        )
        self._calls = BatchCalls(self._sessions, self._retries, gate, self._lock, request_timeout_s)

    # -- properties of the contract -----------------------------------------------------

    @property
    def epoch(self) -> int:
        """The highest epoch seen (0 before the first reply)."""
        return self._sessions.epoch

    @property
    def leader_url(self) -> str | None:
        session = self._sessions.session
        return session.url if session is not None else None

    @property
    def connected(self) -> bool:
        return self._sessions.channel is not None

    @property
    def reached(self) -> bool:
        """A leader was reached once (with a gate: found in etcd)."""
        return self._retries.reached

    @property
    def rollback_on_connect(self) -> bool:
        """A new session rolls back what the client had out (Canal's processActiveEnter)."""
        return self._sessions.rollback_on_connect

    @rollback_on_connect.setter
    def rollback_on_connect(self, value: bool) -> None:
        self._sessions.rollback_on_connect = value

    @property
    def connect_timeout_s(self) -> float | None:
        return self._retries.connect_timeout_s

    def set_deadline(self, when: float | None) -> None:
        """Calls retrying past ``when`` (``time.monotonic()``) give up with
        ``RetryExhausted``; None: retry as the policy says."""
        self._retries.deadline = when

    def _what(self, what: str) -> str:
        return f"{self.destination}/{self.client_id}: {what}"

    # -- lifecycle ----------------------------------------------------------------------

    def connect(self) -> None:
        """Start following the leader; without a gate open the session (rollback) now.
        Bounded by ``connect_timeout_s`` (see the module docstring)."""
        sessions = self._sessions
        with self._lock:
            if sessions.channel is not None:
                return
            sessions.closing.clear()
            sessions.channel = HttpChannel(**self._channel_args)
            self._retries.start_connect()
            self._resolver.start()
        try:
            if self._gate is None:
                sessions.call("connect", lambda session: None)
                return
            self._gate.check_access()
            if self._retries.connect_deadline is not None:
                self._await_leader(self._retries.connect_deadline)
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
            if remaining <= 0 or self._sessions.closing.is_set():
                raise self._retries.not_connected("connect", attempts, problem)
            self._resolver.wait_change(min(remaining, 1.0))
            self._resolver.reload()
        self._retries.reached = True

    def disconnect(self) -> None:
        """Stop; a call retrying in another thread gives up (``ClientError``)."""
        sessions = self._sessions
        sessions.closing.set()
        self._resolver.close()  # wakes a retry waiting for a leader change
        if sessions.inflight is not None:
            sessions.inflight.interrupt()  # and a call waiting on a request
        with self._lock:
            if self._gate is not None:
                self._gate.stop()
            self._resolver.close()
            sessions.close()

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
        sessions = self._sessions
        with self._lock:
            sessions.filter, sessions.start = filter, start
            if self._gate is not None and not self._gate.is_active():
                return  # sent when this consumer becomes active
            try:
                sessions.call(
                    "subscribe", lambda s: sessions.put_subscription(s.url, filter, leader=s)
                )
            except Inactive:
                return

    def get_without_ack(self, size: int, timeout_s: float, ack: int | None = None) -> Batch:
        """Up to ``size`` entries, waiting up to ``timeout_s``; ack or roll back later.

        ``ack``: the id of a batch you have processed, acknowledged by the same request
        before the leader takes the next batch (one round trip less per batch than
        ``ack()`` then ``get_without_ack()``; the same rules as ``ack``: pass it only
        once its entries are processed)."""
        return self._calls.get_acking(size, timeout_s, False, ack)

    def get(self, size: int, timeout_s: float, ack: int | None = None) -> Batch:
        """Like ``get_without_ack`` but acknowledged by the server at once."""
        return self._calls.get_acking(size, timeout_s, True, ack)

    def stream(self, size: int, timeout_s: float, prefetch: bool = True) -> BatchStream:
        """The batches as an iterator (``canal_client.stream``): each batch is acked by
        a later get once you ask for the next one; with ``prefetch`` the next get is in
        flight (a worker thread) while you process a batch. Use it in a ``with`` block:
        its end rolls back what was not processed (``commit()`` acks the last batch)."""
        check_get(size, timeout_s)
        return BatchStream(self, size, timeout_s, prefetch)

    def outstanding(self, batch_id: int) -> bool:
        """``batch_id`` was handed out to this connector and not acked or rolled back."""
        return batch_id in self._calls.book

    def get_batch(self, batch_id: int) -> Batch:
        """An outstanding batch again (``UnknownBatch`` once acked or rolled back)."""
        return self._calls.refetch(batch_id, as_model, tuples=True)

    def get_without_ack_packed(
        self, size: int, timeout_s: float, ack: int | None = None
    ) -> PackedBatch:
        """``get_without_ack`` as the leader's msgpack bytes with an index of the entries
        (``canal_client.packed``): no Python object per row value. msgpack wire only."""
        empty = PackedBatch(-1)
        return self._calls.get_acking(size, timeout_s, False, ack, as_packed, empty)

    @property
    def last_ack_taken(self) -> bool | None:
        """Whether the leader took the ``ack`` of the last get: False when it was dropped
        (its batch came from an earlier session: its entries come again), None when
        that get carried no ack (or did not reach a leader)."""
        return self._calls.rids.ack_taken

    def get_batch_packed(self, batch_id: int) -> PackedBatch:
        """``get_batch`` as the leader's bytes (see ``get_without_ack_packed``)."""
        return self._calls.refetch(batch_id, as_packed, raw=True)

    def table(self, name: str) -> dict[str, Any]:
        """The columns of table ``name`` (``schema.table``) as the leader's database has
        them (``GET /v1/destinations/{d}/tables/{name}``); opens no session.
        ``UnknownTable`` when it does not exist."""
        sessions = self._sessions

        def op(leader: Leader) -> dict[str, Any]:
            channel = sessions.require_channel()
            path = f"/v1/destinations/{self.destination}/tables/{name}"
            reply = channel.request("GET", leader.url, path, follow_redirects=True)
            sessions.note_epoch(reply.epoch)
            if not isinstance(reply.body, dict):
                raise UnexpectedResponse(f"GET {path}: not an object")
            return reply.body

        with self._lock:
            return sessions.call_leader("table", op)

    def ack(self, batch_id: int) -> bool:
        """Acknowledge every outstanding batch up to ``batch_id``; False when the ack was
        dropped (the batch came from an earlier session, rolled back by a reconnect, or
        this consumer is no longer active): its entries come again."""
        return self._calls.finish("ack", batch_id)

    def rollback(self, batch_id: int | None = None) -> None:
        """Roll back ``batch_id`` and the later ones; None: every outstanding batch."""
        if batch_id is None:
            with self._lock:
                try:
                    self._sessions.call("rollback", self._sessions.rollback_all)
                except Inactive:
                    return
                self._calls.book.clear()
            return
        self._calls.finish("rollback", batch_id)

    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None:
        """Commit through the entry starting at ``logfile``:``offset`` (``POST C/cursor``):
        the leader drops every outstanding batch of the client and moves its cursor
        forward to that entry, as far as its store reaches; the cursor after it (or None)."""
        sessions = self._sessions
        with self._lock:

            def op(session: Session) -> Any:
                path = f"{sessions.base()}/cursor"
                body = {"logfile": logfile, "offset": offset}
                return sessions.request(session, "POST", path, body).body

            try:
                reply = sessions.call("move_cursor", op)
            except Inactive:
                return None
            self._calls.book.clear()
        cursor = reply.get("cursor") if isinstance(reply, dict) else None
        return cursor if isinstance(cursor, dict) else None

    def cursor(self) -> dict[str, Any] | None:
        """The last acked position (LogPosition as a dict) or None; opens no session."""
        sessions = self._sessions

        def op(leader: Leader) -> dict[str, Any] | None:
            channel = sessions.require_channel()
            reply = channel.request(
                "GET", leader.url, f"{sessions.base()}/cursor", follow_redirects=True
            )
            sessions.note_epoch(reply.epoch)
            body = reply.body
            if isinstance(body, dict) and "cursor" in body and "position" not in body:
                body = body["cursor"]
            return body if isinstance(body, dict) and body else None

        with self._lock:
            return sessions.call_leader("cursor", op)


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
