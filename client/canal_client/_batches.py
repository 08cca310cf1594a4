"""A connector's batch calls: gets (with the ack riding on them), re-fetches, acks and
rollbacks, each within a session (``canal_client._session``), keeping the book of what
is outstanding and the request id of an unanswered get (``canal_client._outstanding``).

With an ``ActiveGate``, a get's long poll ends by the role's fencing deadline, and a
batch that came while the role was lost is dropped and rolled back in its session (best
effort, for ``request_timeout_s``: the next active consumer would ack it unseen with a
later batch), except one the leader acked at once (``get``): nobody else would receive it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from canal_client._outstanding import BatchBook, RequestIds, StaleBatch
from canal_client._retry import Retries
from canal_client._session import Session, SessionLost, Sessions
from canal_client.exclusive import ActiveGate, Inactive
from canal_client.inflight import Abandoned
from canal_client.packed import PackedBatch
from canal_client.wire import Redirected, Reply
from canal_protocol import Batch
from canal_protocol.errors import (
    CanalError,
    InvalidArgument,
    LeaderUnavailable,
    NotSubscribed,
    ServerUnreachable,
    StaleLeader,
    UnknownBatch,
)

__all__ = ["B", "BatchCalls", "as_model", "as_packed", "check_get"]

log = logging.getLogger("canal_client")
B = TypeVar("B", Batch, PackedBatch)


def check_get(size: int, timeout_s: float) -> None:
    """The arguments of a get: ``InvalidArgument`` naming the field."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise InvalidArgument("size", f"must be an int > 0, got {size!r}")
    if timeout_s < 0:
        raise InvalidArgument("timeout_s", f"must be >= 0, got {timeout_s!r}")


def as_model(reply: Reply) -> Batch:
    return Batch.from_wire(reply.body, reply.binary_as_base64)


def as_packed(reply: Reply) -> PackedBatch:
    return PackedBatch.parse(reply.body)


class BatchCalls:
    """The batch calls of one connector (see the module doc), under its lock."""

    def __init__(
        self,
        sessions: Sessions,
        retries: Retries,
        gate: ActiveGate | None,
        lock: threading.RLock,
        request_timeout_s: float,
    ) -> None:
        self._sessions = sessions
        self._retries = retries
        self._gate = gate
        self._lock = lock
        self._request_timeout_s = request_timeout_s
        self.book = BatchBook()
        self.rids = RequestIds()

    # -- gets ---------------------------------------------------------------------------

    def get_acking(
        self,
        size: int,
        timeout_s: float,
        auto_ack: bool,
        ack: int | None,
        decode: Callable[[Reply], B] | None = None,
        empty: B | None = None,
    ) -> B:
        """``get`` with ``ack`` on the request; a server that does not know the field
        (older), an inactive consumer or an ack that cannot ride on the retry of an
        unanswered get (``RequestIds.ack_rides``) gets a separate ack first."""
        rids = self.rids
        active = self._gate is None or self._gate.is_active()
        if ack is None or (rids.acks_on_get and active and rids.ack_rides(ack)):
            try:
                return self.get(size, timeout_s, auto_ack, decode, empty, ack)
            except InvalidArgument as exc:
                if ack is None or exc.field != "ack":
                    raise
                log.info("%s/%s: the leader takes no ack on a get (older server): %s",
                         self._sessions.destination, self._sessions.client_id, exc)  # fmt: skip
                rids.acks_on_get = False
        taken = self.finish("ack", ack)  # a separate ack first
        carry = taken and rids.acks_on_get and rids.unanswered is not None
        batch = self.get(size, timeout_s, auto_ack, decode, empty, ack if carry else None)
        rids.ack_taken = taken
        return batch

    def get(
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
        the one of an unanswered get, if any (``RequestIds.next``)."""
        check_get(size, timeout_s)
        make: Callable[[Reply], Any] = decode or as_model
        none: Any = Batch.empty() if empty is None else empty
        if self._gate is not None and not self._gate.wait_active(timeout_s):
            return cast(B, none)
        packed = decode is as_packed
        sessions, rids = self._sessions, self.rids
        rids.ack_taken = None
        with self._lock:
            rid, ack = rids.next(ack)
            body = {"size": size, "auto_ack": auto_ack, "layout": "compact", "request_id": rid}
            acked: list[bool] = []  # the last attempt's: did its request carry the ack

            def op(session: Session) -> tuple[Any, Session]:
                path = f"{sessions.base()}/batches"
                wait = self._poll_wait(timeout_s)
                acking = ack is not None and not self._stale_ack(ack, session)
                acked[:] = [acking]
                sent = {**body, "timeout_ms": int(wait * 1000)}
                if acking:
                    sent["ack"] = ack
                reply = sessions.request(
                    session, "POST", path, sent, extra_timeout_s=wait,
                    tuples=not packed, raw=packed,
                )  # fmt: skip
                return make(reply), session

            try:
                batch, session = sessions.call("get_without_ack", op)
            except Inactive:
                return cast(B, none)
            except UnknownBatch:  # the ack was never issued: refused, nothing taken
                rids.unanswered_again(rid)
                raise
            if ack is not None:
                rids.ack_taken = acked == [True]
                self.book.forget("ack", ack)
            if not auto_ack and self._lost_role(batch.id, session):
                rids.answered()
                self._give_back(batch.id, session)
                return cast(B, none)
            if not auto_ack and self.book.reissued(batch.id, session.gen):
                rids.unanswered_again(rid)  # answered (its ack done): unanswered again
                return self._get_again(batch.id, session, size, timeout_s, decode, empty)
            rids.answered()
            return cast(B, self._handed_out(batch, session, auto_ack))

    def _get_again(
        self,
        batch_id: int,
        session: Session,
        size: int,
        timeout_s: float,
        decode: Callable[[Reply], B] | None,
        empty: B | None,
    ) -> B:
        """Batch ``batch_id`` of ``session`` is ``reissued``: roll it back and get the
        next batch (the same entries under a new id), so that an ack or rollback of the
        earlier session's batch is dropped as such, never taken for this one."""
        sessions = self._sessions
        log.info(
            "%s/%s: batch %d from %s (epoch %s) reuses the id of a batch of an earlier "
            "session: rolled back, getting it again under a new id",
            sessions.destination, sessions.client_id, batch_id, session.url, session.epoch,
        )  # fmt: skip
        path = f"{sessions.base()}/batches/{batch_id}/rollback"

        def give_back(now: Session) -> None:
            if now is session:  # else the new session rolled everything back on connect
                sessions.request(now, "POST", path)

        with contextlib.suppress(UnknownBatch, Inactive):  # rolled back by an attempt
            sessions.call("rollback", give_back)  # whose answer was lost; by the next active
        taken = self.rids.ack_taken
        batch = self.get(size, timeout_s, False, decode, empty)
        self.rids.ack_taken = taken
        return batch

    def refetch(
        self, batch_id: int, decode: Callable[[Reply], B], tuples: bool = False, raw: bool = False
    ) -> B:
        """An outstanding batch again (``UnknownBatch`` once acked or rolled back)."""
        sessions = self._sessions
        with self._lock:

            def op(session: Session) -> B:
                self.book.check(batch_id, session.gen)
                path = f"{sessions.base()}/batches/{batch_id}?layout=compact"
                return decode(sessions.request(session, "GET", path, tuples=tuples, raw=raw))

            try:
                return sessions.call("get_batch", op)
            except (Inactive, StaleBatch) as exc:
                raise UnknownBatch(f"batch {batch_id}: {exc}") from exc

    def _poll_wait(self, timeout_s: float) -> float:
        """How long the leader may wait for entries: ``timeout_s``, but with a gate only
        until the active role's fencing deadline (``Inactive`` once it passed): later,
        another consumer may have taken over and rolled back on connect, and a batch the
        poll took then would be acked unseen by that consumer's acks of later batches."""
        if self._gate is None:
            return timeout_s
        left = self._gate.valid_for()
        if left <= 0:
            raise Inactive("this consumer is no longer the active one for its client id")
        return min(timeout_s, left)

    def _lost_role(self, batch_id: int, session: Session) -> bool:
        """A get of ``session`` brought batch ``batch_id`` after this consumer lost the
        active role (perhaps regained since)."""
        gate = self._gate
        if batch_id < 0 or gate is None:
            return False
        return not gate.is_active() or gate.generation != session.gate_gen

    def _give_back(self, batch_id: int, session: Session) -> None:
        """Roll back batch ``batch_id``, dropped by a get that brought it after the role
        was lost (``_lost_role``; a batch the leader acked, ``get()``, is kept: nobody
        else gets it): the next active consumer may have rolled back on connect before
        it was taken, and its ack of a later batch would ack this one unseen. Best effort:
        in ``session`` only (a new leader's sessions roll back on connect), retried
        through transport failures for ``request_timeout_s``; a late rollback only makes
        the next consumer's batches after it come again."""
        sessions = self._sessions
        log.warning(
            "%s/%s: dropped batch %d: no longer the active consumer; rolling it back",
            sessions.destination, sessions.client_id, batch_id,
        )  # fmt: skip
        what = f"rollback of dropped batch {batch_id}"
        path = f"{sessions.base()}/batches/{batch_id}/rollback"
        policy = dataclasses.replace(self._retries.policy, deadline_s=self._request_timeout_s)
        try:
            policy.call(
                lambda: sessions.request(session, "POST", path), sessions.what(what),
                (ServerUnreachable, LeaderUnavailable), self._retries.logger(what),
            )  # fmt: skip
        except (UnknownBatch, NotSubscribed, Redirected, Abandoned, StaleLeader, SessionLost):
            log.info(  # the next active one rolled back after the get, or acked past it
                "%s: not done: the batch is no longer outstanding or %s is no longer the "
                "leader (its successor's sessions roll back on connect)",
                sessions.what(what), session.url,
            )  # fmt: skip
        except CanalError as exc:
            log.error(
                "%s/%s: could not roll back batch %d, taken after this consumer lost the "
                "active role (%s): if the active consumer acks a later batch of %s, the "
                "entries of batch %d are lost",
                sessions.destination, sessions.client_id, batch_id, exc, session.url, batch_id,
            )  # fmt: skip

    def _handed_out(self, batch: B, session: Session, auto_ack: bool) -> B:
        """``batch`` as the get returns it, recorded as outstanding in ``session``."""
        if batch.id < 0:
            return batch
        if not auto_ack:
            self.book.record(batch.id, session.gen)
        log.debug(
            "%s/%s: batch %d (%d entries) from %s epoch %s",
            self._sessions.destination,
            self._sessions.client_id,
            batch.id,
            len(batch.entries),
            session.url,
            session.epoch,
        )
        return batch

    # -- acks and rollbacks -------------------------------------------------------------

    def finish(self, what: str, batch_id: int) -> bool:
        """``what`` (``ack`` or ``rollback``) of ``batch_id``; False when it was dropped
        (a batch of an earlier session, or this consumer is no longer active)."""
        sessions = self._sessions
        path = f"{sessions.base()}/batches/{batch_id}/{what}"
        with self._lock:
            lost_in: set[int] = set()  # sessions in which an attempt's answer was lost

            def op(session: Session) -> None:
                self.book.check(batch_id, session.gen)
                try:
                    sessions.request(session, "POST", path)
                except ServerUnreachable:
                    lost_in.add(session.gen)
                    raise
                except UnknownBatch:
                    if session.gen not in lost_in:
                        raise
                    log.info(  # the same leader, same term: the lost attempt did it
                        "%s/%s: %s of batch %d was done by the attempt whose answer was lost",
                        sessions.destination, sessions.client_id, what, batch_id,
                    )  # fmt: skip

            done = True
            try:
                sessions.call(what, op)
            except (StaleBatch, Inactive) as exc:
                done = False
                log.warning(
                    "%s/%s: %s of batch %d dropped: %s; its entries will be delivered again",
                    sessions.destination,
                    sessions.client_id,
                    what,
                    batch_id,
                    exc,
                )
            self.book.forget(what, batch_id)
            return done

    def _stale_ack(self, batch_id: int, session: Session) -> bool:
        """True (and a warning) when batch_id came from an earlier session: its ack is
        dropped, the reconnect rolled it back and its entries come again."""
        try:
            self.book.check(batch_id, session.gen)
        except StaleBatch as exc:
            log.warning(
                "%s/%s: ack of batch %d dropped: %s; its entries will be delivered again",
                self._sessions.destination, self._sessions.client_id, batch_id, exc,
            )  # fmt: skip
            return True
        return False
