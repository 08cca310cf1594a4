"""A Canal client that behaves as Canal 1.1.x's Java client does, for the tests.

Written from Canal's documented packets and the behaviour of ``SimpleCanalConnector`` /
``ClusterCanalConnector`` (read from Canal's client source; nothing of it copied), with
the project's own generated protobuf classes:

* ``connect()``: the first packet must be a HANDSHAKE with ``version == 1`` (else
  "unsupported version at this client."); the login carries
  ``hex(scramble411(password, seeds))`` (a password of ``None`` sends an empty one) and
  ``net_read_timeout`` / ``net_write_timeout`` = the idle timeout in ms; the answer must be
  an ACK without error. Then, when a filter was given before, SUBSCRIPTION with it, and
  CLIENTROLLBACK(0) (``rollback_on_connect``).
* every packet names the destination and client id ``1001``;
* GET: ``auto_ack = false``, ``fetch_size`` (1000 when <= 0), ``timeout`` (-1: none) and
  ``unit = 2`` (ms); the answer must be MESSAGES (an ACK raises "something goes wrong
  with reason: ..."); ``get`` = GET then CLIENTACK. CLIENTACK and CLIENTROLLBACK read
  no answer.
* ``ClusterConnector``: over an address list, rotated on each new connection; a call
  that fails disconnects, sleeps ``retry_interval_s`` (Canal: 5 s), connects to the next
  address and tries again, ``retry_times`` (Canal: 3) times; connecting itself is tried
  ``retry_times`` times the same way.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from canal_protocol.canal import entry_pb2, packet_pb2

__all__ = ["CanalClientError", "ClusterConnector", "Message", "SimpleConnector", "scramble411"]

T = TypeVar("T")
CLIENT_ID = "1001"  # what SimpleCanalConnector always sends
_HEADER = struct.Struct(">i")


class CanalClientError(Exception):
    """What the Java client's CanalClientException says."""


@dataclass
class Message:
    """A GET's answer: ``id`` (-1: empty) and its entries."""

    id: int
    entries: list[entry_pb2.Entry] = field(default_factory=list)


def scramble411(password: bytes, seed: bytes) -> bytes:
    stage1 = hashlib.sha1(password).digest()
    stage2 = hashlib.sha1(stage1).digest()
    mask = hashlib.sha1(seed + stage2).digest()
    return bytes(a ^ b for a, b in zip(mask, stage1, strict=True))


class SimpleConnector:
    """One connection (``SimpleCanalConnector``)."""

    def __init__(
        self,
        address: tuple[str, int],
        username: str,
        password: str | None,
        destination: str,
        so_timeout_s: float = 60.0,
        idle_timeout_ms: int = 60 * 60 * 1000,
    ) -> None:
        self.address = address
        self.username, self.password, self.destination = username, password, destination
        self.so_timeout_s, self.idle_timeout_ms = so_timeout_s, idle_timeout_ms
        self.filter: str | None = None
        self.rollback_on_connect = True
        self.sock: socket.socket | None = None

    # -- connection --------------------------------------------------------------------

    def connect(self) -> None:
        try:
            self.sock = socket.create_connection(self.address, timeout=self.so_timeout_s)
        except OSError as exc:
            raise CanalClientError(str(exc)) from exc
        try:
            p = packet_pb2.Packet.FromString(self._read())
            if p.version != 1:
                raise CanalClientError("unsupported version at this client.")
            if p.type != packet_pb2.HANDSHAKE:
                raise CanalClientError("expect handshake but found other type.")
            seeds = packet_pb2.Handshake.FromString(p.body).seeds
            scrambled = ""
            if self.password is not None:
                scrambled = scramble411(self.password.encode(), seeds).hex()
            auth = packet_pb2.ClientAuth(
                username=self.username,
                password=scrambled.encode(),
                net_read_timeout=self.idle_timeout_ms,
                net_write_timeout=self.idle_timeout_ms,
            )
            self._write(packet_pb2.CLIENTAUTHENTICATION, auth.SerializeToString())
            ack = packet_pb2.Packet.FromString(self._read())
            if ack.type != packet_pb2.ACK:
                raise CanalClientError("unexpected packet type when ack is expected")
            body = packet_pb2.Ack.FromString(ack.body)
            if body.error_code > 0:
                raise CanalClientError(
                    "something goes wrong when doing authentication: " + body.error_message
                )
        except (OSError, ValueError) as exc:
            raise CanalClientError(str(exc)) from exc
        if self.filter is not None:
            self.subscribe(self.filter)
        if self.rollback_on_connect:
            self.rollback()

    def disconnect(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # -- calls ---------------------------------------------------------------------------

    def subscribe(self, flt: str = "") -> None:
        sub = packet_pb2.Sub(destination=self.destination, client_id=CLIENT_ID, filter=flt)
        self._ack_call(packet_pb2.SUBSCRIPTION, sub.SerializeToString(), "failed to subscribe")
        self.filter = flt

    def unsubscribe(self) -> None:
        unsub = packet_pb2.Unsub(destination=self.destination, client_id=CLIENT_ID)
        self._ack_call(
            packet_pb2.UNSUBSCRIPTION, unsub.SerializeToString(), "failed to unSubscribe"
        )

    def get_without_ack(self, batch_size: int, timeout_ms: int | None = None) -> Message:
        get = packet_pb2.Get(
            auto_ack=False,
            destination=self.destination,
            client_id=CLIENT_ID,
            fetch_size=batch_size if batch_size > 0 else 1000,
            timeout=-1 if timeout_ms is None or timeout_ms < 0 else timeout_ms,
            unit=2,
        )
        try:
            self._write(packet_pb2.GET, get.SerializeToString())
            p = packet_pb2.Packet.FromString(self._read())
        except (OSError, ValueError) as exc:
            raise CanalClientError(str(exc)) from exc
        if p.type == packet_pb2.MESSAGES:
            if p.compression not in (packet_pb2.NONE, packet_pb2.COMPRESSIONCOMPATIBLEPROTO2):
                raise CanalClientError("compression is not supported in this connector")
            messages = packet_pb2.Messages.FromString(p.body)
            entries = [entry_pb2.Entry.FromString(m) for m in messages.messages]
            return Message(messages.batch_id, entries)
        if p.type == packet_pb2.ACK:
            ack = packet_pb2.Ack.FromString(p.body)
            raise CanalClientError("something goes wrong with reason: " + ack.error_message)
        raise CanalClientError(f"unexpected packet type: {p.type}")

    def get(self, batch_size: int, timeout_ms: int | None = None) -> Message:
        message = self.get_without_ack(batch_size, timeout_ms)
        self.ack(message.id)
        return message

    def ack(self, batch_id: int) -> None:
        body = packet_pb2.ClientAck(
            destination=self.destination, client_id=CLIENT_ID, batch_id=batch_id
        )
        self._send(packet_pb2.CLIENTACK, body.SerializeToString())

    def rollback(self, batch_id: int = 0) -> None:
        body = packet_pb2.ClientRollback(
            destination=self.destination, client_id=CLIENT_ID, batch_id=batch_id
        )
        self._send(packet_pb2.CLIENTROLLBACK, body.SerializeToString())

    # -- frames ----------------------------------------------------------------------------

    def _ack_call(self, kind: int, body: bytes, what: str) -> None:
        try:
            self._write(kind, body)
            p = packet_pb2.Packet.FromString(self._read())
        except (OSError, ValueError) as exc:
            raise CanalClientError(str(exc)) from exc
        ack = packet_pb2.Ack.FromString(p.body)
        if ack.error_code > 0:
            raise CanalClientError(f"{what} with reason: {ack.error_message}")

    def _send(self, kind: int, body: bytes) -> None:
        try:
            self._write(kind, body)
        except OSError as exc:
            raise CanalClientError(str(exc)) from exc

    def _write(self, kind: int, body: bytes) -> None:
        assert self.sock is not None, "not connected"
        data = packet_pb2.Packet(type=kind, body=body).SerializeToString()  # type: ignore[arg-type]
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def _read(self) -> bytes:
        (size,) = _HEADER.unpack(self._exactly(_HEADER.size))
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        assert self.sock is not None, "not connected"
        parts, got = [], 0
        while got < n:
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise OSError("end of stream when reading header")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)


class ClusterConnector:
    """``ClusterCanalConnector`` over a fixed address list (its SimpleNodeAccessStrategy).

    ``events`` records what happened (``connect <addr>``, ``failed <op>: <error>``,
    ``connect failed <addr>: <error>``) for the tests' assertions."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        username: str,
        password: str | None,
        destination: str,
        retry_times: int = 3,
        retry_interval_s: float = 5.0,
        so_timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.addresses = list(addresses)
        self.index = 0
        self.username, self.password, self.destination = username, password, destination
        self.retry_times, self.retry_interval_s = retry_times, retry_interval_s
        self.so_timeout_s = so_timeout_s
        self.sleep = sleep
        self.filter: str | None = None
        self.current: SimpleConnector | None = None
        self.events: list[str] = []

    def _next_address(self) -> tuple[str, int]:
        try:
            return self.addresses[self.index]
        finally:
            self.index = (self.index + 1) % len(self.addresses)

    def connect(self) -> None:
        times = 0
        while self.current is None:
            address = self._next_address()
            conn = SimpleConnector(
                address, self.username, self.password, self.destination, self.so_timeout_s
            )
            conn.filter = self.filter
            try:
                conn.connect()
                self.current = conn
                self.events.append(f"connect {address[0]}:{address[1]}")
            except CanalClientError as exc:
                conn.disconnect()
                self.events.append(f"connect failed {address[0]}:{address[1]}: {exc}")
                times += 1
                if times >= self.retry_times:
                    raise
                self.sleep(self.retry_interval_s)

    def disconnect(self) -> None:
        if self.current is not None:
            self.current.disconnect()
            self.current = None

    def _restart(self) -> None:
        self.disconnect()
        self.sleep(self.retry_interval_s)
        self.connect()

    def _retried(self, op: str, fn: Callable[[SimpleConnector], T]) -> T:
        times = 0
        while times < self.retry_times:
            try:
                assert self.current is not None, "not connected"
                return fn(self.current)
            except (CanalClientError, OSError) as exc:
                self.events.append(f"failed {op}: {exc}")
                times += 1
                self._restart()
        raise CanalClientError(f"failed to {op} after {times} times retry")

    def subscribe(self, flt: str = "") -> None:
        self._retried("subscribe", lambda c: c.subscribe(flt))
        self.filter = flt

    def get_without_ack(self, batch_size: int, timeout_ms: int | None = None) -> Message:
        return self._retried("getWithoutAck", lambda c: c.get_without_ack(batch_size, timeout_ms))

    def get(self, batch_size: int, timeout_ms: int | None = None) -> Message:
        return self._retried("get", lambda c: c.get(batch_size, timeout_ms))

    def ack(self, batch_id: int) -> None:
        self._retried("ack", lambda c: c.ack(batch_id))

    def rollback(self, batch_id: int = 0) -> None:
        self._retried("rollback", lambda c: c.rollback(batch_id))
