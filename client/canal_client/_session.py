"""A connector's sessions with its destination's leader (see ``canal_client.connector``).

A session is a leader URL and its epoch, opened the way Canal's ``processActiveEnter``
does it: subscribe again with the last filter, then roll back (``rollback_on_connect``).
``Sessions`` is that state machine: it opens a session for each call (``call``),
drops it when the leader moved (a 307, another epoch, a stale epoch), suspends it on a
transport failure (resumed without a rollback when the same leader in the same epoch
answers next), refuses a lower epoch than one seen (``StaleLeader``) and, with a
watching resolver, runs every exchange in the ``InFlight`` worker, abandoned when etcd
names another leader. Calls retry per the connector's ``Retries``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from canal_client._retry import Retries
from canal_client.exclusive import ActiveGate, Inactive
from canal_client.inflight import Abandoned, InFlight
from canal_client.resolver import Leader, LeaderResolver
from canal_client.wire import HttpChannel, Redirected, Reply
from canal_protocol.errors import (
    ClientError,
    LeaderUnavailable,
    NotSubscribed,
    ServerUnreachable,
    StaleLeader,
)

__all__ = ["RETRYABLE", "Session", "SessionLost", "Sessions", "StartArg"]

log = logging.getLogger("canal_client")
T = TypeVar("T")

StartArg = str | Mapping[str, Any]  # "latest", "earliest" or a position dict


class SessionLost(ClientError):
    """The leader moved (307, new epoch): open a new session and retry."""


RETRYABLE = (ServerUnreachable, LeaderUnavailable, StaleLeader, SessionLost)


@dataclass
class Session:
    """A leader URL and its epoch (learned from the first reply carrying one)."""

    gen: int
    url: str
    epoch: int | None
    gate_gen: int


class Sessions:
    """The session state machine of one connector (see the module doc)."""

    def __init__(
        self,
        destination: str,
        client_id: str,
        resolver: LeaderResolver,
        gate: ActiveGate | None,
        retries: Retries,
        rollback_on_connect: bool,
    ) -> None:
        self.destination = destination
        self.client_id = client_id
        self.rollback_on_connect = rollback_on_connect
        self._resolver = resolver
        self._gate = gate
        self._retries = retries
        self.channel: HttpChannel | None = None
        self.closing = threading.Event()
        self.session: Session | None = None
        self._gen = 0
        self.filter: str | None = None  # the last subscription, sent again to a new leader
        self.start: StartArg | None = None
        self.epoch = 0  # the highest seen
        self._last_leader: tuple[str, int | None] | None = None
        self._suspended: Session | None = None  # the session a transport failure paused
        self.inflight: InFlight | None = None
        if resolver.follows_changes:
            self.inflight = InFlight(f"{destination}/{client_id}")
            resolver.add_listener(self.inflight.interrupt)

    def base(self) -> str:
        return f"/v1/destinations/{self.destination}/clients/{self.client_id}"

    def what(self, what: str) -> str:
        return f"{self.destination}/{self.client_id}: {what}"

    def close(self) -> None:
        """Close the channel and forget the sessions (``disconnect``)."""
        if self.inflight is not None:
            self.inflight.close()
        if self.channel is not None:
            self.channel.close()
        self.channel = None
        self.session = None
        self._suspended = None

    # -- running calls ------------------------------------------------------------------

    def call(self, what: str, op: Callable[[Session], T]) -> T:
        """Run ``op`` in a session, retrying per the policy (see the module docstring)."""

        def attempt() -> T:
            session = self.ensure()
            try:
                return op(session)
            except Redirected as exc:
                self._resolver.redirected(exc.leader_url)
                self.drop(session)
                raise SessionLost(str(exc)) from exc
            except Abandoned as exc:
                self.drop(session)
                raise SessionLost(str(exc)) from exc
            except ServerUnreachable as exc:
                self.on_failure(session.url, exc)
                self._suspend(session, what, exc)
                raise
            except RETRYABLE as exc:
                self.on_failure(session.url, exc)
                self.drop(session)
                raise

        return self._retries.run(what, attempt, RETRYABLE)

    def call_leader(self, what: str, op: Callable[[Leader], T]) -> T:
        """Run ``op`` against the current leader without a session (read-only calls)."""

        def attempt() -> T:
            self.require_channel()
            leader = self.leader()
            try:
                return op(leader)
            except RETRYABLE as exc:
                self.on_failure(leader.url, exc)
                raise

        return self._retries.run(what, attempt, RETRYABLE)

    def leader(self) -> Leader:
        """The leader to talk to; before one was reached, why there is none."""
        leader = self._resolver.current()
        if leader is None:
            self._resolver.reload()  # etcd may have come back without a watch event
            leader = self._resolver.current()
        if leader is not None:
            return leader
        if not self._retries.connecting:
            raise LeaderUnavailable(f"no leader known for {self.destination}")
        raise self._resolver.no_leader()

    def on_failure(self, url: str, exc: BaseException) -> None:
        self._retries.failed(exc)
        if not isinstance(exc, SessionLost):
            self._resolver.failed(url)

    # -- the state machine --------------------------------------------------------------

    def ensure(self) -> Session:
        self.require_channel()
        gate_gen = 0
        if self._gate is not None:
            gate_gen = self._gate.generation
            if not self._gate.is_active():
                self.session = None
                raise Inactive("this consumer is not the active one for its client id")
        leader = self.leader()
        if leader.epoch is not None and leader.epoch < self.epoch:
            raise StaleLeader(f"{leader.url} has epoch {leader.epoch} < {self.epoch}")
        s = self.session
        if (
            s is not None
            and s.url == leader.url
            and s.gate_gen == gate_gen
            and (leader.epoch is None or s.epoch is None or leader.epoch <= s.epoch)
        ):
            return s
        return self._open(leader, gate_gen)

    def _open(self, leader: Leader, gate_gen: int) -> Session:
        """Canal's processActiveEnter: subscribe with the last filter, then roll back;
        or resume the suspended session when the leader and its epoch are the same."""
        self.session = None
        resume, self._suspended = self._suspended, None
        if resume is not None and (resume.gate_gen != gate_gen or resume.epoch is None):
            resume = None
        if resume is not None and (leader.url, leader.epoch) == (resume.url, resume.epoch):
            return self._resume(resume)  # etcd names the same leader in the same term
        try:
            url, epoch = self._enter(leader, resume)
        except Abandoned as exc:
            self._suspended = resume
            raise SessionLost(str(exc)) from exc
        except RETRYABLE as exc:
            self._suspended = resume
            self.on_failure(leader.url, exc)
            raise
        if resume is not None and (url, epoch) == (resume.url, resume.epoch):
            return self._resume(resume)
        self._gen += 1
        self.session = Session(self._gen, url, epoch, gate_gen)
        self._retries.reached = True
        self._log_leader(url, epoch)
        return self.session

    def _enter(self, leader: Leader, resume: Session | None) -> tuple[str, int | None]:
        """Subscribe (or, to tell whether ``resume`` still holds, ask the cursor), then
        roll back unless the answering leader and epoch are ``resume``'s."""
        url, epochs = leader.url, [leader.epoch]
        if self.filter is not None or resume is not None:
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
        self.note_epoch(epoch)
        return url, epoch

    def _probe(self, leader: Leader) -> Reply | None:
        """The re-subscribe (idempotent), else the cursor read: who answers, in which
        epoch (None: not subscribed)."""
        if self.filter is not None:
            return self.put_subscription(leader.url, self.filter, follow=True, leader=leader)
        path = f"{self.base()}/cursor"
        channel = self.require_channel()
        try:
            reply = self.exchange(
                leader, lambda: channel.request("GET", leader.url, path, follow_redirects=True)
            )
        except NotSubscribed:
            return None
        self.note_epoch(reply.epoch)
        return reply

    def _suspend(self, session: Session, what: str, exc: BaseException) -> None:
        """A transport failure: the session may resume with the same leader and epoch."""
        if self.session is session:
            self.session = None
            self._suspended = session
        log.info(
            "%s: %s to %s (epoch %s) failed: %s; retrying",
            self.what(what), what, session.url, session.epoch, exc,
        )  # fmt: skip

    def _resume(self, session: Session) -> Session:
        self.session = session
        log.info(
            "%s/%s: resumed the session with %s (epoch %s): same leader, nothing rolled back",
            self.destination, self.client_id, session.url, session.epoch,
        )  # fmt: skip
        return session

    def exchange(self, leader: Leader | Session, fn: Callable[[], Reply]) -> Reply:
        """``fn()``; with a watching resolver in the worker, abandoned (``Abandoned``)
        as soon as the resolver names another leader than ``leader`` (or none)."""
        if self.inflight is None:
            return fn()
        url, epoch = leader.url, leader.epoch

        def reason_to_stop() -> str | None:
            if self.closing.is_set():
                return "disconnecting"
            now = self._resolver.current()
            if now is None:
                return f"{url} (epoch {epoch}) is no longer the leader; none is known yet"
            if now.url != url or (None not in (epoch, now.epoch) and now.epoch != epoch):
                return (
                    f"the leader moved from {url} (epoch {epoch}) to {now.url} (epoch {now.epoch})"
                )
            return None

        return self.inflight.run(fn, reason_to_stop)

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

    def drop(self, session: Session) -> None:
        if self.session is session:
            self.session = None

    def note_epoch(self, epoch: int | None) -> None:
        if epoch is None:
            return
        if epoch < self.epoch:
            raise StaleLeader(f"reply with epoch {epoch} < {self.epoch} seen: a stale leader")
        self.epoch = epoch

    # -- requests -----------------------------------------------------------------------

    def require_channel(self) -> HttpChannel:
        channel = self.channel
        if channel is None or self.closing.is_set():
            raise ClientError(f"{self.destination}/{self.client_id}: not connected")
        return channel

    def request(
        self,
        session: Session,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        extra_timeout_s: float = 0.0,
        tuples: bool = False,
        raw: bool = False,
    ) -> Reply:
        channel = self.require_channel()
        reply = self.exchange(
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
        self.note_epoch(reply.epoch)
        if reply.epoch is None or self.session is not session:
            return reply
        if session.epoch is None:
            session.epoch = reply.epoch
            self._last_leader = (session.url, reply.epoch)
        elif reply.epoch != session.epoch:
            raise SessionLost(f"{session.url} now answers with epoch {reply.epoch}")
        return reply

    def put_subscription(
        self, url: str, filter: str, follow: bool = False, leader: Leader | Session | None = None
    ) -> Reply:
        path = f"{self.base()}/subscription"
        body: dict[str, Any] = {"filter": filter}
        if self.start is not None:
            body["start"] = self.start if isinstance(self.start, str) else dict(self.start)
        channel = self.require_channel()

        def put() -> Reply:
            return channel.request("PUT", url, path, body, follow_redirects=follow)

        reply = put() if leader is None else self.exchange(leader, put)
        self.note_epoch(reply.epoch)
        return reply

    def _rollback_at(self, leader: Leader, url: str) -> Reply | None:
        """Roll back every outstanding batch at ``url`` (following a redirect)."""
        path = f"{self.base()}/rollback"
        channel = self.require_channel()
        try:
            reply = self.exchange(
                leader, lambda: channel.request("POST", url, path, follow_redirects=True)
            )
        except NotSubscribed:
            return None  # nothing to roll back yet (Canal ignores it too)
        self.note_epoch(reply.epoch)
        return reply

    def rollback_all(self, session: Session) -> None:
        try:
            self.request(session, "POST", f"{self.base()}/rollback")
        except NotSubscribed:
            return
