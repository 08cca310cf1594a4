"""How ``HttpChannel`` sends a request: a keep-alive pool on the standard library's
``http.client`` (the default), or an ``httpx.Client`` when a transport is given.

Why a pool of our own: a get of a small batch costs the client ~0.40-0.55 ms of CPU
through ``httpx.Client`` (request and response models, auth and redirect layers,
``httpcore`` and ``h11`` parsing in Python), ~0.24 ms through ``urllib3`` and ~0.13 ms
through ``http.client`` (C-accelerated header parsing, one socket per connection);
measured here with a 40 KB msgpack body (docs/benchmarks.md). The channel follows
redirects, retries and maps errors itself, so what it needs from HTTP is small: one
request on a kept-alive connection with a connect and a read timeout. An
``httpx.BaseTransport`` (a test's fake cluster, a proxy) still goes through httpx.

Both answer an ``Answer``: status, lower-cased headers, the body's bytes, and the
method and URL asked. A transport failure (refused, reset, timed out, closed early)
raises ``ServerUnreachable``.
"""

from __future__ import annotations

import functools
import http.client
import select
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from canal_protocol.errors import ServerUnreachable

__all__ = ["Answer", "HttpxSender", "PooledSender", "Sender", "tls_context"]

MAX_IDLE_PER_ORIGIN = 8  # kept-alive connections waiting for a request, per node


@dataclass(frozen=True)
class Answer:
    """One HTTP response, read whole."""

    status: int
    reason: str
    headers: Mapping[str, str]  # lower-cased names
    content: bytes
    method: str
    url: str

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class Sender(Protocol):
    def send(
        self, method: str, url: str, content: bytes | None, headers: Mapping[str, str],
        timeout_s: float,
    ) -> Answer: ...  # fmt: skip

    def close(self) -> None: ...


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CAs, verified), made once per process:
    httpx builds one for every new client, loading the CA bundle (20-160 ms here)."""
    return httpx.create_ssl_context()


def _unreachable(method: str, url: str, exc: BaseException) -> ServerUnreachable:
    return ServerUnreachable(f"{method} {url}: {type(exc).__name__}: {exc}")


class HttpxSender:
    """Through an ``httpx.Client`` over ``transport``."""

    def __init__(
        self, transport: httpx.BaseTransport, headers: Mapping[str, str], connect_timeout_s: float
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._client = httpx.Client(
            headers=dict(headers), follow_redirects=False, transport=transport,
            trust_env=False, verify=tls_context(),
        )  # fmt: skip

    def send(
        self, method: str, url: str, content: bytes | None, headers: Mapping[str, str],
        timeout_s: float,
    ) -> Answer:  # fmt: skip
        timeout = httpx.Timeout(timeout_s, connect=self._connect_timeout_s)
        try:
            r = self._client.request(
                method, url, content=content, headers=dict(headers), timeout=timeout
            )
        except httpx.TransportError as exc:
            raise _unreachable(method, url, exc) from exc
        lowered = {k.lower(): v for k, v in r.headers.items()}
        return Answer(r.status_code, r.reason_phrase, lowered, r.content, method, url)

    def close(self) -> None:
        self._client.close()


_Origin = tuple[str, str, int]


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle connection the server closed (or wrote to: nothing is expected)."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()  # not select(): no limit on the descriptor's number
    poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
    try:
        return bool(poller.poll(0))
    except OSError:
        return True


class PooledSender:
    """Keep-alive HTTP/1.1 connections per origin (``http.client``), thread-safe: each
    request takes a connection of its own and gives it back once its answer is read."""

    def __init__(self, headers: Mapping[str, str], connect_timeout_s: float) -> None:
        self._headers = dict(headers)
        self._connect_timeout_s = connect_timeout_s
        self._idle: dict[_Origin, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def send(
        self, method: str, url: str, content: bytes | None, headers: Mapping[str, str],
        timeout_s: float,
    ) -> Answer:  # fmt: skip
        parts = urlsplit(url)
        origin = self._origin_of(parts.scheme, parts.hostname, parts.port, url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._take(origin)
        try:
            if conn.sock is None:
                conn.connect()  # within the connect timeout (TLS handshake included)
            assert conn.sock is not None
            conn.sock.settimeout(timeout_s)  # each read of the answer
            conn.request(method, target, body=content, headers={**self._headers, **headers})
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise _unreachable(method, url, exc) from exc
        except BaseException:
            conn.close()
            raise
        lowered = {k.lower(): v for k, v in response.getheaders()}
        if response.will_close:
            conn.close()
        else:
            self._give(origin, conn)
        return Answer(response.status, response.reason, lowered, body, method, url)

    @staticmethod
    def _origin_of(scheme: str, host: str | None, port: int | None, url: str) -> _Origin:
        if scheme not in ("http", "https") or not host:
            raise ServerUnreachable(f"{url}: not an http:// or https:// URL")
        return scheme, host, port or (443 if scheme == "https" else 80)

    def _take(self, origin: _Origin) -> http.client.HTTPConnection:
        with self._lock:
            idle = self._idle.get(origin, [])
            while idle:
                conn = idle.pop()
                if not _dropped(conn):
                    return conn
                conn.close()
        scheme, host, port = origin
        if scheme == "https":
            return http.client.HTTPSConnection(
                host, port, timeout=self._connect_timeout_s, context=tls_context()
            )
        return http.client.HTTPConnection(host, port, timeout=self._connect_timeout_s)

    def _give(self, origin: _Origin, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                idle = self._idle.setdefault(origin, [])
                if len(idle) < MAX_IDLE_PER_ORIGIN:
                    idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        """Closes the idle connections; one in use closes when its request ends."""
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()
