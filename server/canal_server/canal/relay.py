"""A standby's relay of one Canal session to the destination's leader.

A node that does not lead a session's destination opens its own Canal connection to the
leader's listener (the ``canal`` address of the leader's node record), logs in there
as the client's user (``auth.upstream_password``: the scramble for the leader's seeds
from SHA1(password), which the standby recovered when it checked the client) with
``Packet.magic_number = RELAY_MAGIC``, and from then on passes the client's frames to
the leader and the leader's bytes back, unchanged: batch ids, ACKs and error ACKs are
the leader's own, its fencing and epoch checks apply, and a MESSAGES packet is never
decoded on the way.

A relayed login is never relayed again: a node that receives one and does not lead the
destination answers an error ACK (no relay loops between nodes with stale views).

The relay ends, closing the client's connection, when either side closes, when a
client frame names another destination, when the client is idle longer than its
``net_read_timeout``, or when this node's view of the destination's leader (node and
epoch) changes: the client reconnects (to any node) and resumes from its cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from canal_cluster.running import RunningInfo
from canal_protocol.canal import packet_pb2 as pb
from canal_server.canal import wire
from canal_server.canal.auth import Credential, upstream_password
from canal_server.instance import Role
from canal_server.node import Node

__all__ = [
    "CONNECT_TIMEOUT_S",
    "PIPE_BYTES",
    "RELAY_MAGIC",
    "WATCH_S",
    "Relay",
    "RelayRefused",
    "destination_of",
]

log = logging.getLogger(__name__)

RELAY_MAGIC = 0x43484131  # "CHA1": Packet.magic_number of a login relayed by a node
CONNECT_TIMEOUT_S = 5.0  # connecting to the leader and its handshake and login answers
WATCH_S = 0.2  # how often the relay compares the leader it serves with the node's view
PIPE_BYTES = 1 << 16  # the leader's bytes are passed on in reads of up to this much

_BODIES: dict[
    int, type[pb.Sub] | type[pb.Unsub] | type[pb.Get] | type[pb.ClientAck] | type[pb.ClientRollback]
] = {
    pb.SUBSCRIPTION: pb.Sub,
    pb.UNSUBSCRIPTION: pb.Unsub,
    pb.GET: pb.Get,
    pb.CLIENTACK: pb.ClientAck,
    pb.CLIENTROLLBACK: pb.ClientRollback,
}


class RelayRefused(Exception):
    """The leader refused the relayed login (its error ACK's message), or answered
    something else than Canal's handshake and ACK."""


def destination_of(body: bytes) -> str | None:
    """The destination a client frame names (None: none, or not one of the packets
    that name one, or unreadable: the leader answers those)."""
    try:
        packet = pb.Packet.FromString(body)
        kind = _BODIES.get(packet.type)
        return kind.FromString(packet.body).destination or None if kind is not None else None
    except Exception:  # protobuf's DecodeError, and anything else a fuzzer finds
        return None


@dataclass
class Relay:
    """An open, logged-in connection to ``leader``'s Canal listener for ``destination``."""

    destination: str
    leader: RunningInfo
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(
        cls,
        destination: str,
        leader: RunningInfo,
        address: str,
        cred: Credential,
        timeouts_ms: tuple[int, int],
        subscribe: tuple[str, str] | None = None,
    ) -> Relay:
        """Connect to ``address`` and log in as ``cred``'s user; ``subscribe`` (client
        id, filter): a login that subscribes (Canal's login with a destination).
        ``RelayRefused`` or ``OSError`` / ``TimeoutError`` when it cannot."""
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port), limit=PIPE_BYTES),
            CONNECT_TIMEOUT_S,
        )
        try:
            seeds = await _handshake(reader)
            auth = pb.ClientAuth(
                username=cred.username,
                password=upstream_password(cred.stage1, seeds),
                net_read_timeout=timeouts_ms[0],
                net_write_timeout=timeouts_ms[1],
            )
            if subscribe is not None:
                auth.destination = destination
                auth.client_id, auth.filter = subscribe
            login = pb.Packet(magic_number=RELAY_MAGIC, type=pb.CLIENTAUTHENTICATION)
            login.body = auth.SerializeToString()
            writer.write(wire.frame(login.SerializeToString()))
            await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT_S)
            answer = await asyncio.wait_for(wire.read_frame(reader), CONNECT_TIMEOUT_S)
            _check_ack(answer, address)
        except BaseException:
            writer.close()
            raise
        return cls(destination, leader, address, reader, writer)

    async def pipe(
        self,
        node: Node,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        timeouts_s: tuple[float, float],
        first: bytes | None,
    ) -> str:
        """Pass frames both ways until one of the module doc's ends; why it ended.
        ``timeouts_s``: the client's idle read and write timeouts."""
        if first is not None:
            self.writer.write(wire.frame(first))
        tasks = {
            asyncio.create_task(self._to_leader(client_reader, timeouts_s[0]), name="to leader"),
            asyncio.create_task(self._to_client(client_writer, timeouts_s[1]), name="to client"),
            asyncio.create_task(self._watch(node), name="leader watch"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finished = done.pop()
            try:
                why = finished.result()
            except (OSError, TimeoutError, asyncio.IncompleteReadError, wire.FrameError) as exc:
                why = f"{finished.get_name()}: {type(exc).__name__}: {exc}"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.close()
        return why

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def _to_leader(self, reader: asyncio.StreamReader, idle_s: float) -> str:
        while True:
            try:
                body = await asyncio.wait_for(wire.read_frame(reader), idle_s)
            except TimeoutError:
                return f"the client was idle for {idle_s:g} s"
            if body is None:
                return "the client closed the connection"
            named = destination_of(body)
            if named is not None and named != self.destination:
                return f"the client named destination {named!r} on a relay of {self.destination!r}"
            self.writer.write(wire.frame(body))
            await self.writer.drain()

    async def _to_client(self, writer: asyncio.StreamWriter, write_s: float) -> str:
        while True:
            chunk = await self.reader.read(PIPE_BYTES)
            if not chunk:
                return f"the leader ({self.address}) closed the connection"
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), write_s)

    async def _watch(self, node: Node) -> str:
        while True:
            await asyncio.sleep(WATCH_S)
            view = node.view(self.destination)
            now = view.leader
            if view.role is not Role.STANDBY:
                return f"this node is {view.role.value} for {self.destination} now"
            if now is None or (now.node, now.epoch) != (self.leader.node, self.leader.epoch):
                what = f"node {now.node} (epoch {now.epoch})" if now is not None else "unknown"
                return (
                    f"the leader changed from node {self.leader.node} (epoch "
                    f"{self.leader.epoch}) to {what}"
                )


async def _handshake(reader: asyncio.StreamReader) -> bytes:
    body = await asyncio.wait_for(wire.read_frame(reader), CONNECT_TIMEOUT_S)
    if body is None:
        raise RelayRefused("the leader closed the connection before its handshake")
    packet = pb.Packet.FromString(body)
    if packet.type != pb.HANDSHAKE or packet.version != wire.VERSION:
        raise RelayRefused(f"expected a handshake, got {wire.type_name(packet.type)}")
    return pb.Handshake.FromString(packet.body).seeds


def _check_ack(body: bytes | None, address: str) -> None:
    if body is None:
        raise RelayRefused(f"the leader ({address}) closed the connection at login")
    packet = pb.Packet.FromString(body)
    if packet.type != pb.ACK:
        raise RelayRefused(f"the leader ({address}) answered {wire.type_name(packet.type)}")
    ack = pb.Ack.FromString(packet.body)
    if ack.error_code:
        raise RelayRefused(ack.error_message)
