"""One Canal client connection, as Canal 1.1.x's server handles it (its
``HandshakeInitializationHandler``, ``ClientAuthenticationHandler`` and
``SessionHandler``).

Order: the node sends HANDSHAKE (``version = 1``, 8 random seeds, no compression); the
first packet must be CLIENTAUTHENTICATION (``auth.CanalUser.check``), answered by an ACK
or by ``auth failed for user:NAME`` (400) and a close; a login that names a destination
and client id subscribes it, as Canal's does. Then, one packet at a time, in order:

* SUBSCRIPTION / UNSUBSCRIPTION: ACK (or an error ACK). A new Canal client starts at
  the oldest change the store still holds (Canal's ``getFirstPosition``); a
  re-subscribe keeps the cursor and replaces the filter.
* GET: MESSAGES with the batch id (-1 and no entries when nothing came) and one
  serialized ``Entry`` per entry; ``timeout`` -1 (or absent): no wait, 0: wait until
  something arrives, else wait up to ``timeout`` in ``unit`` (TimeUnit's ordinal; an
  unknown one is ms, as Canal reads it), at most the server's ``max_timeout_s`` per get
  (then an empty MESSAGES). The answer comes as soon as one entry is there.
  ``auto_ack``: the batch is acked as it is given (``EmbeddedServer.get``).
* CLIENTACK / CLIENTROLLBACK: no answer (the client does not read one). One batch must
  be the first outstanding one (Canal's meta rule: ``batchId:7 is not the firstly:6``).
  Batch 0 rolls every outstanding batch back; an ACK of batch -1 (the last get was
  empty) is ignored and of batch 0 is Canal's 402. Their errors surface on the client's
  next read: the next packet that expects an answer gets the error ACK instead of being
  carried out.
* anything else (HEARTBEAT, DUMP, ...): Canal's 400 ``packet type: X is NOT supported!``.

Canal's error ACKs: 401 ``destination or clientId is null. Sub: ...`` for a packet
without destination or client id; 400 ``something goes wrong with channel: ...,
exception: ...CanalServerException: <Canal's message>`` for what the embedded server
refuses (``ack error , clientId:1001 batchId:7 is not exist , please check``,
``ClientIdentity:... should subscribe first``, an unknown destination's ``destination:x
should start first``).

The connection is closed, after an error ACK where there is one to give: on a frame that
is not one of Canal's (``wire.MAX_FRAME_BYTES``, a Packet that does not parse), a
refused login, a client silent longer than its ``net_read_timeout`` (ms; 1 h when it
sends none, as Canal) or not reading for its ``net_write_timeout``, no login within
``LOGIN_TIMEOUT_S``, and when this node stops leading the session's destination (its
epoch ended: fenced, deposed, handed over): the client reconnects and resumes from its
cursor. A session never outlives the leadership term it is served by, so it never sees
one batch id for two batches.

One destination per connection: the first packet that names one binds the session to
it (a later one naming another gets an error ACK; a relayed session is closed). When
this node leads it, the term's ``EmbeddedServer`` serves the session (``local.Served``:
what runs on the event loop and what in worker threads, the batch taken ahead for a
client that is behind). When another node leads it, the session is relayed there
(``relay``); until a leader is known it waits up to ``LEADER_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from canal_cluster.keys import Keys, validate_id
from canal_protocol.canal import packet_pb2 as pb
from canal_protocol.entry import Entry
from canal_protocol.errors import (
    CanalError,
    CoordinationError,
    InvalidArgument,
    NotSubscribed,
    StoreClosed,
    UnknownBatch,
)
from canal_server.canal import wire
from canal_server.canal.auth import CanalUser, Credential, new_seed
from canal_server.canal.local import (
    NotFirst,
    Served,
    TermEnded,
    ack_in_order,
    rollback_in_order,
)
from canal_server.canal.relay import RELAY_MAGIC, Relay, RelayRefused
from canal_server.instance import Role
from canal_server.node import Node

__all__ = ["IDLE_MS", "LEADER_WAIT_S", "LOGIN_TIMEOUT_S", "Context", "Session"]

log = logging.getLogger(__name__)

T = TypeVar("T")

LOGIN_TIMEOUT_S = 30.0  # from the handshake to the client's login
IDLE_MS = 60 * 60 * 1000  # Canal's defaultSubscriptorDisconnectIdleTimeout
LEADER_WAIT_S = 10.0  # a session waits this long for its destination to have a leader
_EXCEPTION = "com.alibaba.otter.canal.server.exception.CanalServerException"
_META_EXCEPTION = "com.alibaba.otter.canal.meta.exception.CanalMetaManagerException"
_NO_ANSWER = (pb.CLIENTACK, pb.CLIENTROLLBACK)
_BODIES: dict[int, Any] = {
    pb.SUBSCRIPTION: pb.Sub,
    pb.UNSUBSCRIPTION: pb.Unsub,
    pb.GET: pb.Get,
    pb.CLIENTACK: pb.ClientAck,
    pb.CLIENTROLLBACK: pb.ClientRollback,
}
_NAMES = {
    pb.SUBSCRIPTION: "Sub",
    pb.UNSUBSCRIPTION: "Unsub",
    pb.GET: "Get",
    pb.CLIENTACK: "Ack",
    pb.CLIENTROLLBACK: "Rollback",
}


@dataclass(frozen=True)
class Context:
    """What every session of a listener shares."""

    node: Node
    user: CanalUser
    executor: ThreadPoolExecutor
    encode: Callable[[Sequence[Entry]], list[bytes]]


class _End(Exception):
    """The session ends (after sending ``frame``, when there is one)."""

    def __init__(self, why: str, frame: bytes | None = None) -> None:
        super().__init__(why)
        self.frame = frame


class Session:
    """One client connection (module doc); ``run()`` serves it until it ends."""

    def __init__(
        self, ctx: Context, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.ctx = ctx
        self.reader, self.writer = reader, writer
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        self.peer = _address(peer)
        self.channel = f"[id: 0x{id(self) & 0xFFFFFFFF:08x}, /{self.peer} => /{_address(local)}]"
        self.cred: Credential | None = None
        self.relayed_in = False  # logged in through another node's relay
        self.timeouts_ms = (IDLE_MS, IDLE_MS)
        self.destination: str | None = None
        self.local: Served | None = None
        self.pending: bytes | None = None  # an error ACK owed to the next packet with an answer
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    @property
    def timeouts_s(self) -> tuple[float, float]:
        return self.timeouts_ms[0] / 1000, self.timeouts_ms[1] / 1000

    # -- the connection ------------------------------------------------------------------

    async def run(self) -> None:
        why = "the client closed the connection"
        try:
            relay = await self._login()
            while relay is None:
                try:
                    body = await asyncio.wait_for(wire.read_frame(self.reader), self.timeouts_s[0])
                except TimeoutError:
                    why = f"idle for more than {self.timeouts_s[0]:g} s"
                    break
                if body is None:
                    break
                relay, first = await self._handle(body)
            if relay is not None:
                why = "relay: " + await relay.pipe(
                    self.ctx.node, self.reader, self.writer, self.timeouts_s, first
                )
        except _End as end:
            why = str(end)
            if end.frame is not None:
                with contextlib.suppress(OSError, TimeoutError):
                    await self._send(end.frame)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, wire.FrameError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                self.writer.close()
        log.info("canal session %s (%s) closed: %s", self.peer, self.destination or "-", why)

    async def _send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await asyncio.wait_for(self.writer.drain(), self.timeouts_s[1])

    async def _thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.ctx.executor, fn)

    def _exception(self, message: str, cls: str = "") -> str:
        """Canal's error text: ``message`` as the exception ``cls`` (Canal's server
        exception by default) of this channel."""
        return (
            f"something goes wrong with channel: {self.channel}, exception: "
            f"{cls or _EXCEPTION}: {message}"
        )

    # -- login -----------------------------------------------------------------------------

    async def _login(self) -> Relay | None:
        seed = new_seed()
        await self._send(wire.handshake_frame(seed))
        try:
            body = await asyncio.wait_for(wire.read_frame(self.reader), LOGIN_TIMEOUT_S)
        except TimeoutError:
            raise _End(f"no login within {LOGIN_TIMEOUT_S:g} s") from None
        if body is None:
            raise _End("the client closed the connection before its login")
        try:
            packet = pb.Packet.FromString(body)
            auth = pb.ClientAuth.FromString(packet.body)
        except DecodeError as exc:
            error = wire.error_frame(400, "auth failed: unreadable login packet")
            raise _End(f"unreadable login: {exc}", error) from None
        if packet.type != pb.CLIENTAUTHENTICATION:
            kind = wire.type_name(packet.type)
            raise _End(
                f"{kind} before the login",
                wire.error_frame(400, f"expected CLIENTAUTHENTICATION, got packet type: {kind}"),
            )
        cred = self.ctx.user.check(auth.username, auth.password, seed)
        if cred is None:
            message = f"auth failed for user:{auth.username}"
            raise _End(message, wire.error_frame(400, message))
        self.cred = cred
        self.relayed_in = packet.HasField("magic_number") and packet.magic_number == RELAY_MAGIC
        self.timeouts_ms = (
            auth.net_read_timeout if auth.net_read_timeout > 0 else IDLE_MS,
            auth.net_write_timeout if auth.net_write_timeout > 0 else IDLE_MS,
        )
        relay = None
        if auth.destination and auth.client_id:  # Canal's login that subscribes
            subscribe = (auth.client_id, auth.filter)
            relay = await self._login_subscribe(auth.destination, subscribe)
        await self._send(wire.ack_frame())
        return relay

    async def _login_subscribe(self, destination: str, subscribe: tuple[str, str]) -> Relay | None:
        refusal = self._refusal(destination, subscribe[0])
        if refusal is not None:
            raise _End(refusal, wire.error_frame(400, refusal))
        relay = await self._route(destination, subscribe)
        if relay is None:
            client, flt = subscribe
            try:
                await self._current().call(lambda s: s.subscribe(client, flt, "earliest"))
            except TermEnded as exc:
                raise self._ended_by(exc) from None
            except CanalError as exc:
                self._ended(exc)
                message = _canal_message(pb.SUBSCRIPTION, destination, client, 0, exc)
                raise _End(message, wire.error_frame(400, self._exception(message))) from None
        return relay

    # -- packets -----------------------------------------------------------------------------

    async def _handle(self, body: bytes) -> tuple[Relay | None, bytes | None]:
        """Carry out one packet; a relay (and this packet, for it) when the session moves
        to one."""
        try:
            packet = pb.Packet.FromString(body)
        except DecodeError as exc:
            raise _End(f"unreadable packet: {exc}") from None
        kind = packet.type
        if kind not in _NO_ANSWER and self.pending is not None:
            frame, self.pending = self.pending, None
            await self._send(frame)
            return None, None
        body_type = _BODIES.get(kind)
        if body_type is None:
            unsupported = f"packet type: {wire.type_name(kind)} is NOT supported!"
            await self._send(wire.error_frame(400, unsupported))
            return None, None
        try:
            msg = body_type.FromString(packet.body)
        except DecodeError as exc:
            await self._fail(kind, 400, self._exception(f"InvalidProtocolBufferException: {exc}"))
            return None, None
        if not msg.destination or not msg.client_id:
            await self._fail(kind, 401, f"destination or clientId is null. {_NAMES[kind]}: {msg}")
            return None, None
        if kind == pb.CLIENTACK and msg.batch_id == 0:
            await self._fail(kind, 402, f"batchId should assign value. Ack: {msg}")
            return None, None
        if kind == pb.CLIENTACK and msg.batch_id == -1:  # the last get was empty
            return None, None
        refusal = self._refusal(msg.destination, msg.client_id)
        if refusal is not None:
            await self._fail(kind, 400, self._exception(refusal))
            return None, None
        relay = await self._route(msg.destination)
        if relay is not None:
            return relay, body
        await self._serve(kind, msg)
        return None, None

    async def _fail(self, kind: int, code: int, message: str) -> None:
        """An error ACK: now, or owed to the next packet with an answer (CLIENTACK and
        CLIENTROLLBACK have none; the first such error is kept)."""
        frame = wire.error_frame(code, message)
        if kind in _NO_ANSWER:
            log.info("canal session %s: %s", self.peer, message)
            self.pending = self.pending or frame
        else:
            await self._send(frame)

    def _refusal(self, destination: str, client: str) -> str | None:
        """Why this packet may not be carried out at all (None: it may)."""
        if self.destination is not None and destination != self.destination:
            return (
                f"this connection serves destination {self.destination}; open another "
                f"connection for {destination}"
            )
        try:
            validate_id(destination, "destination")
            Keys().client_prefix(destination, client)
        except InvalidArgument as exc:
            return str(exc)
        assert self.cred is not None
        refusal = self.cred.grant.refusal(destination, client)
        if refusal is not None:
            return f"user {self.cred.username!r}: " + refusal.replace("consumer token", "user")
        if destination not in self.ctx.node.instances:
            return f"destination:{destination} should start first"
        return None

    # -- who serves the session ------------------------------------------------------------

    async def _route(
        self, destination: str, subscribe: tuple[str, str] | None = None
    ) -> Relay | None:
        """Bind the session to ``destination``: None when this node serves it (the
        term's epoch checked again), a logged-in ``Relay`` to its leader otherwise."""
        if self.destination is not None:
            self._current()
            return None
        node = self.ctx.node
        inst = node.instance(destination)
        deadline = time.monotonic() + LEADER_WAIT_S
        why = "no leader is known"
        while True:
            serving = inst.serving()
            if serving is not None:
                self.destination = destination
                self.local = Served(node.id, inst, serving, self.ctx.executor, self.ctx.encode)
                log.info(
                    "canal session %s: %s served here (epoch %d)",
                    self.peer, destination, serving[1],
                )  # fmt: skip
                return None
            view = node.view(destination)
            leader = view.leader
            other = leader.node if leader is not None and leader.node != node.id else None
            if view.role is not Role.STANDBY:
                other = None
            if self.relayed_in and other is not None:  # a relay never relays again: no loops
                why = f"node {node.id} does not lead it (node {other} does)"
                raise _End(f"{destination}: {why}", wire.error_frame(400, self._exception(why)))
            if self.relayed_in:
                why = f"node {node.id} does not lead it"
            elif other is not None:
                relay, why = await self._relay(destination, subscribe)
                if relay is not None:
                    self.destination = destination
                    return relay
            if time.monotonic() >= deadline:
                message = self._exception(f"{destination}: {why}; connect again")
                raise _End(f"{destination}: {why}", wire.error_frame(400, message))
            await asyncio.sleep(0.05)

    async def _relay(
        self, destination: str, subscribe: tuple[str, str] | None
    ) -> tuple[Relay | None, str]:
        """A relay to the leader of the node's view, or (None, why not yet)."""
        node = self.ctx.node
        leader = node.view(destination).leader
        if leader is None:
            return None, "no leader is known"
        try:
            address = await self._thread(lambda: node.canal_address(leader.node))
        except CoordinationError as exc:
            return None, f"etcd: {exc}"
        if address is None:
            return None, f"node {leader.node} leads it and has no Canal listener"
        assert self.cred is not None
        try:
            relay = await Relay.open(
                destination, leader, address, self.cred, self.timeouts_ms, subscribe
            )
        except RelayRefused as exc:
            message = f"node {leader.node} ({address}) refused the relayed session: {exc}"
            raise _End(message, wire.error_frame(400, self._exception(message))) from None
        except (OSError, TimeoutError, asyncio.IncompleteReadError, wire.FrameError) as exc:
            return None, f"node {leader.node} ({address}) cannot be reached: {exc}"
        log.info(
            "canal session %s: %s relayed to node %s at %s (epoch %d)",
            self.peer, destination, leader.node, address, leader.epoch,
        )  # fmt: skip
        return relay, ""

    def _current(self) -> Served:
        """The term serving the session, while its epoch lasts (else the session ends)."""
        local = self.local
        assert local is not None
        try:
            local.check()
        except TermEnded as exc:
            raise self._ended_by(exc) from None
        return local

    def _ended_by(self, exc: Exception) -> _End:
        return _End(str(exc), wire.error_frame(400, self._exception(f"{exc}; connect again")))

    # -- the embedded server ----------------------------------------------------------------

    async def _serve(self, kind: int, msg: Any) -> None:
        client: str = msg.client_id
        batch_id = msg.batch_id if kind in _NO_ANSWER else 0
        local = self._current()
        try:
            if kind == pb.GET:
                await self._send(await local.get(client, msg))
                return
            await local.settle(kind, client, batch_id)
            if kind == pb.SUBSCRIPTION:
                flt = msg.filter
                await local.call(lambda s: s.subscribe(client, flt, "earliest"))
                await self._send(wire.ack_frame())
            elif kind == pb.UNSUBSCRIPTION:
                await local.call(lambda s: s.unsubscribe(client))
                await self._send(wire.ack_frame())
            elif kind == pb.CLIENTACK:
                await local.call(lambda s: ack_in_order(s, client, batch_id))
            else:
                await local.call(lambda s: rollback_in_order(s, client, batch_id))
        except TermEnded as exc:
            raise self._ended_by(exc) from None
        except CanalError as exc:
            self._ended(exc)
            message = _canal_message(kind, self.destination or "", client, batch_id, exc)
            cls = _META_EXCEPTION if isinstance(exc, NotFirst) else _EXCEPTION
            await self._fail(kind, 400, self._exception(message, cls))

    def _ended(self, exc: CanalError) -> None:
        """End the session when the error comes from its term's end (the store closed
        by a lost leadership, or the epoch moved on)."""
        self._current()
        if isinstance(exc, StoreClosed):
            raise self._ended_by(exc)


def _canal_message(kind: int, destination: str, client: str, batch_id: int, exc: CanalError) -> str:
    """Canal's wording for what its embedded server refuses the same way."""
    if isinstance(exc, NotSubscribed):
        return (
            f"ClientIdentity:ClientIdentity[destination={destination},clientId={client},"
            "filter=<null>] should subscribe first"
        )
    if isinstance(exc, UnknownBatch) and kind == pb.CLIENTACK:
        return f"ack error , clientId:{client} batchId:{batch_id} is not exist , please check"
    if isinstance(exc, UnknownBatch) and kind == pb.CLIENTROLLBACK:
        return f"rollback error, clientId:{client} batchId:{batch_id} is not exist , please check"
    return str(exc)


def _address(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)
