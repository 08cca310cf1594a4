"""The canal_tcp part's consumer: the whole binlog through Canal's TCP protocol.

It runs in a process of its own (``python -m benchmarks.canal_consumer ...``, started by
``bench_canal.canal_tcp``), as ``e2e_consumer`` does for REST. A Canal client of our
own on the project's generated protobuf classes (``canal_protocol.canal``): the Java
client's packets (login with the scramble, SUBSCRIPTION, CLIENTROLLBACK, then GET with
``fetch_size``, ``timeout`` 1000 ms and ``unit`` 2, and CLIENTACK after each batch).
Every ``Entry`` of every batch is parsed, every ROWDATA entry's ``RowChange`` too, and
every column value of every row image is read (as the REST part reads every value).

Its one line of output is a JSON object: rows, duplicates (an entry's binlog position
seen twice), batches, seconds (from connecting to the last row read), connect seconds,
reconnects (a session the node ended, e.g. its term fenced on a loaded machine),
and where the consumer's time went: ``wait_s`` (from a GET sent to its answer read:
the node's work and the transfer), ``parse_s`` (Packet, Messages, Entry and RowChange
parsing and reading the values), ``cpu_s`` (the process's CPU over the read).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import socket
import struct
import sys
import time
from typing import Any

from canal_protocol.canal import entry_pb2, packet_pb2

__all__ = ["RECONNECTS", "Refused", "consume", "main", "read_batch"]

_HEADER = struct.Struct(">i")
_ROWDATA = entry_pb2.ROWDATA


class _Conn:
    def __init__(self, address: str, timeout_s: float) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def send(self, kind: int, body: bytes) -> None:
        data = packet_pb2.Packet(type=kind, body=body).SerializeToString()  # type: ignore[arg-type]
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def read(self) -> bytes:
        (n,) = _HEADER.unpack(self._exactly(4))
        return self._exactly(n)

    def _exactly(self, n: int) -> bytes:
        view = bytearray(n)
        got = 0
        while got < n:
            r = self.sock.recv_into(memoryview(view)[got:], n - got)
            if not r:
                raise EOFError("the node closed the connection")
            got += r
        return bytes(view)


def _login(conn: _Conn, user: str, password: str | None) -> None:
    hs = packet_pb2.Packet.FromString(conn.read())
    if hs.type != packet_pb2.HANDSHAKE or hs.version != 1:
        raise RuntimeError(f"expected a version 1 handshake, got {hs}")
    seeds = packet_pb2.Handshake.FromString(hs.body).seeds
    scrambled = b""
    if password is not None:
        stage1 = hashlib.sha1(password.encode()).digest()
        mask = hashlib.sha1(seeds + hashlib.sha1(stage1).digest()).digest()
        scrambled = bytes(a ^ b for a, b in zip(stage1, mask, strict=True)).hex().encode()
    auth = packet_pb2.ClientAuth(username=user, password=scrambled)
    conn.send(packet_pb2.CLIENTAUTHENTICATION, auth.SerializeToString())
    _expect_ack(conn, "login")


class Refused(RuntimeError):
    """The node answered an error ACK."""


def _expect_ack(conn: _Conn, what: str) -> None:
    p = packet_pb2.Packet.FromString(conn.read())
    ack = packet_pb2.Ack.FromString(p.body)
    if p.type != packet_pb2.ACK or ack.error_code:
        raise Refused(f"{what}: {ack.error_code} {ack.error_message}")


def read_batch(body: bytes, seen: set[tuple[str, int]], tally: dict[str, int]) -> int:
    """Parse one MESSAGES packet; its batch id (rows and duplicates added to ``tally``)."""
    packet = packet_pb2.Packet.FromString(body)
    if packet.type != packet_pb2.MESSAGES:
        ack = packet_pb2.Ack.FromString(packet.body)
        raise Refused(f"GET answered {ack.error_code} {ack.error_message}")
    messages = packet_pb2.Messages.FromString(packet.body)
    values = chars = 0
    for item in messages.messages:
        entry = entry_pb2.Entry.FromString(item)
        if entry.entryType != _ROWDATA:
            continue
        change = entry_pb2.RowChange.FromString(entry.storeValue)
        rows = len(change.rowDatas)
        for row in change.rowDatas:
            for column in row.beforeColumns:
                if not column.isNull:
                    values += 1
                    chars += len(column.value)
            for column in row.afterColumns:
                if not column.isNull:
                    values += 1
                    chars += len(column.value)
        key = (entry.header.logfileName, entry.header.logfileOffset)
        if key in seen:
            tally["duplicate_rows"] += rows
        else:
            seen.add(key)
            tally["rows"] += rows
    tally["values"] += values
    tally["value_chars"] += chars
    return messages.batch_id


RECONNECTS = 20  # a leadership term that ends (a node fenced on a loaded machine) ends
# the session: the consumer connects again, rolls back and goes on, as Canal's clients do


def _session(
    address: str, destination: str, client_id: str, user: str, password: str | None
) -> _Conn:
    """A logged-in, subscribed connection, rolled back (Canal's client on connect)."""
    conn = _Conn(address, 60.0)
    _login(conn, user, password)
    sub = packet_pb2.Sub(destination=destination, client_id=client_id)
    conn.send(packet_pb2.SUBSCRIPTION, sub.SerializeToString())
    _expect_ack(conn, "subscribe")
    rollback = packet_pb2.ClientRollback(destination=destination, client_id=client_id)
    conn.send(packet_pb2.CLIENTROLLBACK, rollback.SerializeToString())
    return conn


def consume(
    address: str,
    destination: str,
    client_id: str,
    *,
    rows: int,
    batch_size: int,
    timeout_s: float,
    user: str = "",
    password: str | None = None,
) -> dict[str, Any]:
    """Connect, log in, subscribe, roll back, then read ``rows`` row changes (module
    doc); a session that ends is connected again (``reconnects``), up to ``RECONNECTS``."""
    tally = {"rows": 0, "duplicate_rows": 0, "batches": 0, "values": 0, "value_chars": 0}
    seen: set[tuple[str, int]] = set()
    t0 = time.perf_counter()
    conn = _session(address, destination, client_id, user, password)
    connected_s = time.perf_counter() - t0
    get = packet_pb2.Get(
        destination=destination, client_id=client_id, fetch_size=batch_size,
        timeout=1000, unit=2, auto_ack=False,
    ).SerializeToString()  # fmt: skip
    wait_s = parse_s = 0.0
    reconnects: list[str] = []
    cpu0 = time.process_time()
    while tally["rows"] < rows:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"{tally['rows']} of {rows} rows after {timeout_s}s")
        try:
            t1 = time.perf_counter()
            conn.send(packet_pb2.GET, get)
            body = conn.read()
            t2 = time.perf_counter()
            batch_id = read_batch(body, seen, tally)
            parse_s += time.perf_counter() - t2
            wait_s += t2 - t1
            if batch_id != -1:
                tally["batches"] += 1
                ack = packet_pb2.ClientAck(
                    destination=destination, client_id=client_id, batch_id=batch_id
                )
                conn.send(packet_pb2.CLIENTACK, ack.SerializeToString())
        except (OSError, EOFError, Refused) as exc:
            conn.sock.close()
            reconnects.append(f"{type(exc).__name__}: {exc}"[:300])
            if len(reconnects) > RECONNECTS:
                raise
            time.sleep(0.2)
            conn = _session(address, destination, client_id, user, password)
    done_at = time.perf_counter()
    cpu_s = time.process_time() - cpu0
    conn.sock.close()
    return {
        **tally, "seconds": done_at - t0, "client_connect_s": connected_s,
        "wait_s": round(wait_s, 3), "parse_s": round(parse_s, 3), "cpu_s": round(cpu_s, 3),
        "reconnects": len(reconnects), "first_reconnects": reconnects[:3],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--address", required=True, help="a node's Canal listener, host:port")
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--rows", type=int, required=True, help="row changes to read")
    p.add_argument("--batch-size", type=int, default=1000, help="entries per GET")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="give up after (s)")
    args = p.parse_args(argv)
    gc.collect()  # as e2e_consumer: startup objects out of the cyclic GC's sight
    gc.freeze()
    got = consume(
        args.address, args.destination, args.client_id, rows=args.rows,
        batch_size=args.batch_size, timeout_s=args.timeout_s,
    )  # fmt: skip
    print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
