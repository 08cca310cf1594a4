"""The client's own HTTP pool (``canal_client._http.PooledSender``) against a real HTTP/1.1
server on a free loopback port: kept-alive connections are reused, one the server
closed is replaced, a read timeout, a refused port and a reset become
``ServerUnreachable`` within their bounds, concurrent requests each get a connection."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from canal_client._http import PooledSender
from canal_client.wire import HttpChannel
from canal_protocol.errors import LeaderUnavailable, ServerUnreachable


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless an answer says otherwise
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(body)

    def do_GET(self) -> None:
        self._answer(b"")

    def _answer(self, body: bytes) -> None:
        srv = self.server
        srv.requests.append((self.command, self.path, self.client_address[1], body))
        if self.path.startswith("/slow"):
            time.sleep(float(self.path.rsplit("/", 1)[1]))
        if self.path == "/reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            self.close_connection = True
            return
        status = 503 if self.path == "/busy" else 200
        out = b"echo:" + body
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Canal-Epoch", "7")
        if status == 503:
            self.send_header("Retry-After", "0.5")
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(out)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, int, bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def ports(self) -> list[int]:
        """The client's port of each request: one per connection used."""
        return [r[2] for r in self.requests]


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def _sender(**kw: Any) -> PooledSender:
    return PooledSender({"Accept": "text/plain"}, connect_timeout_s=2.0, **kw)


def test_connections_are_kept_alive_and_reused(server: _Server) -> None:
    sender = _sender()
    try:
        answers = [
            sender.send("POST", f"{server.url}/x?i={i}", b"b%d" % i, {}, 5.0) for i in range(5)
        ]
    finally:
        sender.close()
    assert [a.content for a in answers] == [b"echo:b%d" % i for i in range(5)]
    assert [a.status for a in answers] == [200] * 5
    assert answers[0].header("X-CANAL-EPOCH") == "7"  # names are case-insensitive
    assert [r[1] for r in server.requests] == [f"/x?i={i}" for i in range(5)]
    assert len(set(server.ports())) == 1, server.ports()


def test_a_connection_the_server_closed_is_replaced(server: _Server) -> None:
    sender = _sender()
    try:
        assert sender.send("GET", f"{server.url}/close", None, {}, 5.0).status == 200
        assert sender.send("GET", f"{server.url}/a", None, {}, 5.0).status == 200
        # the server drops the idle connection on its own (e.g. its keep-alive timeout)
        assert sender.send("GET", f"{server.url}/b", None, {}, 5.0).status == 200
        idle = sender._idle[("http", "127.0.0.1", server.server_address[1])]
        assert len(idle) == 1
        assert idle[0].sock is not None
        idle[0].sock.shutdown(socket.SHUT_RDWR)  # as if the server had closed it
        assert sender.send("GET", f"{server.url}/c", None, {}, 5.0).content == b"echo:"
    finally:
        sender.close()
    ports = server.ports()
    assert ports[0] != ports[1] and ports[1] == ports[2] and ports[2] != ports[3], ports


def test_a_read_timeout_is_unreachable_within_its_bound(server: _Server) -> None:
    sender = _sender()
    try:
        started = time.monotonic()
        with pytest.raises(ServerUnreachable, match=r"GET http://127\.0\.0\.1:\d+/slow/3"):
            sender.send("GET", f"{server.url}/slow/3", None, {}, 0.3)
        assert time.monotonic() - started < 2.5
        # the timed-out connection is not reused: the next request gets a fresh one
        assert sender.send("GET", f"{server.url}/after", None, {}, 5.0).status == 200
    finally:
        sender.close()
    assert server.ports()[-1] != server.ports()[0]


def test_a_refused_port_and_a_reset_are_unreachable(server: _Server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # nobody listens once the socket is closed
    sender = _sender()
    try:
        with pytest.raises(ServerUnreachable, match="ConnectionRefusedError"):
            sender.send("GET", f"http://127.0.0.1:{free}/x", None, {}, 5.0)
        with pytest.raises(ServerUnreachable, match="/reset"):
            sender.send("GET", f"{server.url}/reset", None, {}, 5.0)
        with pytest.raises(ServerUnreachable, match="not an http"):
            sender.send("GET", "ftp://127.0.0.1/x", None, {}, 5.0)
    finally:
        sender.close()


def test_concurrent_requests_each_take_a_connection(server: _Server) -> None:
    sender = _sender()
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                sender.send("GET", f"{server.url}/slow/0.3", None, {}, 5.0).status
            )
        )
        for _ in range(3)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        sender.close()
    assert results == [200, 200, 200]
    assert len(set(server.ports())) == 3


def test_close_closes_idle_connections_and_those_still_in_use(server: _Server) -> None:
    origin = ("http", "127.0.0.1", server.server_address[1])
    sender = _sender()
    sender.send("GET", f"{server.url}/a", None, {}, 5.0)
    (idle,) = sender._idle[origin]
    sender.close()
    assert idle.sock is None  # closed

    sender = _sender()
    sender.send("GET", f"{server.url}/a", None, {}, 5.0)
    (busy,) = sender._idle[origin]  # the slow request below takes it
    done: list[int] = []
    slow = threading.Thread(
        target=lambda: done.append(sender.send("GET", f"{server.url}/slow/0.5", None, {}, 5).status)
    )
    slow.start()
    time.sleep(0.2)
    sender.close()
    slow.join(10)
    assert done == [200]  # the request in flight ends normally, then its connection closes
    assert busy.sock is None
    assert sender._idle == {}


def test_the_channel_maps_statuses_and_headers_through_the_pool(server: _Server) -> None:
    channel = HttpChannel(wire="json")
    try:
        with pytest.raises(LeaderUnavailable) as err:
            channel.request("GET", server.url, "/busy")
        assert err.value.retry_after_s == 0.5
        assert channel.get_text(server.url, "/metrics") == "echo:"
    finally:
        channel.close()
    assert len(set(server.ports())) == 1


def test_connections_past_descriptor_1024_are_reused(server: _Server) -> None:
    # select() refuses a descriptor over 1024: each idle connection would look dropped
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1200, hard), hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    sender = _sender()
    try:
        for i in range(3):
            sender.send("GET", f"{server.url}/{i}", None, {}, 5.0)
        (conn,) = sender._idle[("http", "127.0.0.1", server.server_address[1])]
        assert conn.sock is not None and conn.sock.fileno() > 1024
    finally:
        sender.close()
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(set(server.ports())) == 1, server.ports()
