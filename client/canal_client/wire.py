"""HTTP exchanges with one server node: body codec, status → exception, redirects, epoch.

``HttpChannel.request`` sends one call of docs/api.md to a node's base URL and returns a
``Reply`` (decoded body, the node's ``X-Canal-Epoch``, the base URL that answered).
msgpack is the default body format (``Accept``/``Content-Type: application/msgpack``);
``"json"`` is the alternative. With ``follow_redirects`` a 307 is followed to the
leader (``X-Canal-Leader``, else ``Location``) a few hops deep; without it a 307
raises ``Redirected`` carrying the leader's base URL.

Failures become the exception tree of ``canal_protocol.errors``: transport errors →
``ServerUnreachable``; 503 → ``LeaderUnavailable`` (with ``Retry-After``); 401 →
``Unauthorized``; 403 → ``Forbidden``; 400 → ``InvalidArgument``; 404/409 → ``UnknownBatch`` /
``UnknownDestination`` / ``NotSubscribed`` by the body's error code.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import httpx
import msgpack

from canal_client._http import Answer, HttpxSender, PooledSender, Sender, tls_context
from canal_protocol.errors import (
    CanalError,
    Forbidden,
    InvalidArgument,
    LeaderUnavailable,
    NotSubscribed,
    ServerUnreachable,
    Unauthorized,
    UnexpectedResponse,
    UnknownBatch,
    UnknownDestination,
    UnknownTable,
)

__all__ = [
    "EPOCH_HEADER",
    "LEADER_HEADER",
    "HttpChannel",
    "Redirected",
    "Reply",
    "WireFormat",
    "base_url_of",
    "error_for",
    "gc_paused",
    "tls_context",
]

WireFormat = Literal["msgpack", "json"]
EPOCH_HEADER = "X-Canal-Epoch"
LEADER_HEADER = "X-Canal-Leader"
MSGPACK = "application/msgpack"
MAX_REDIRECTS = 5


class Redirected(CanalError):
    """A 307 to the leader at ``leader_url`` (raised when redirects are not followed)."""

    def __init__(self, leader_url: str, epoch: int | None) -> None:
        super().__init__(f"redirected to the leader at {leader_url}")
        self.leader_url = leader_url
        self.epoch = epoch


@dataclass(frozen=True)
class Reply:
    """A successful answer: decoded body, its format, the epoch header and who answered."""

    body: Any
    binary_as_base64: bool
    epoch: int | None
    url: str


def base_url_of(url: str) -> str:
    """``http://h:p/v1/destinations/...`` → ``http://h:p`` (keeps a path prefix before /v1)."""
    parts = urlsplit(url)
    path = parts.path.split("/v1/", 1)[0].rstrip("/") if "/v1/" in parts.path else ""
    return f"{parts.scheme}://{parts.netloc}{path}"


def _epoch(answer: Answer) -> int | None:
    raw = answer.header(EPOCH_HEADER)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off while a big body becomes objects (none of them cyclic).

    A batch is hundreds of thousands of new containers; with the GC on, each
    collection their growth triggers walks every live object again (4-5x slower).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _decode(response: Answer, tuples: bool = False) -> tuple[Any, bool]:
    """(body, binary_as_base64) by Content-Type; empty bodies decode to None.

    ``tuples``: msgpack arrays become tuples (a batch: its row images are then ready
    as they are, and tuples of plain values drop out of the GC's sight at its first
    look, where lists would be walked by every collection).
    """
    if not response.content:
        return None, False
    ctype = response.header("content-type") or ""
    try:
        if MSGPACK in ctype:
            body = msgpack.unpackb(
                response.content, raw=False, strict_map_key=False, use_list=not tuples
            )
            return body, False
        with gc_paused():
            return json.loads(response.content), True
    except (ValueError, msgpack.UnpackException) as exc:
        raise UnexpectedResponse(f"{response.url}: undecodable {ctype!r} body") from exc


def _retry_after(response: Answer) -> float | None:
    try:
        return max(0.0, float(response.header("retry-after") or ""))
    except ValueError:
        return None


def error_for(response: Answer) -> CanalError:
    """The exception for an error status (docs/api.md: ``{"error": code, "message": …}``)."""
    try:
        body, _ = _decode(response)
    except UnexpectedResponse:
        body = None
    body = body if isinstance(body, dict) else {}
    code = str(body.get("error", "")).lower()
    message = str(body.get("message") or body.get("detail") or code or response.reason)
    where = f"{response.method} {response.path}"
    status = response.status
    if status == 503:
        return LeaderUnavailable(f"{where}: {message}", _retry_after(response))
    if status == 401:
        return Unauthorized(f"{where}: {message}")
    if status == 403:
        return Forbidden(f"{where}: {message}")
    if status == 400:
        return InvalidArgument(str(body.get("field") or code or "request"), message)
    if status in (404, 409):
        if "subscri" in code:
            return NotSubscribed(f"{where}: {message}")
        if "destination" in code:
            return UnknownDestination(f"{where}: {message}")
        if "table" in code:
            return UnknownTable(str(body.get("field") or "table"), f"{where}: {message}")
        if "batch" in code or status == 409 or "/batches/" in where:
            return UnknownBatch(f"{where}: {message}")
        return UnexpectedResponse(f"{where}: {status} {message}")
    if status in (502, 504):
        return ServerUnreachable(f"{where}: {status} {message}")
    return UnexpectedResponse(f"{where}: {status} {message}")


class HttpChannel:
    """Calls of docs/api.md against node base URLs: kept-alive connections of the
    standard library's ``http.client`` (``_http.PooledSender``), or an ``httpx.Client``
    over ``transport`` when one is given (a test's fake cluster, a proxy)."""

    def __init__(
        self,
        wire: WireFormat = "msgpack",
        token: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 3.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if wire not in ("msgpack", "json"):
            raise ValueError(f"wire must be 'msgpack' or 'json', not {wire!r}")
        self.wire: WireFormat = wire
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        headers = {"Accept": MSGPACK if wire == "msgpack" else "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._sender: Sender = (
            PooledSender(headers, connect_timeout_s)
            if transport is None
            else HttpxSender(transport, headers, connect_timeout_s)
        )

    def close(self) -> None:
        self._sender.close()

    def request(
        self,
        method: str,
        base_url: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        follow_redirects: bool = False,
        extra_timeout_s: float = 0.0,
        tuples: bool = False,
        raw: bool = False,
    ) -> Reply:
        """One call; ``extra_timeout_s`` extends the read timeout (long polls);
        ``tuples``: msgpack arrays as tuples; ``raw``: the body's bytes as they came
        (``Reply.body`` is bytes; needs the msgpack wire)."""
        url = base_url
        for _ in range(MAX_REDIRECTS + 1):
            response = self._send(method, url + path, body, extra_timeout_s)
            if response.status != 307:
                return self._reply(response, url, tuples, raw)
            leader = self._leader_of(response)
            if not follow_redirects:
                raise Redirected(leader, _epoch(response))
            url = leader
        raise UnexpectedResponse(f"{method} {path}: more than {MAX_REDIRECTS} redirects")

    def get_text(self, base_url: str, path: str) -> str:
        """A plain-text GET (``/metrics``)."""
        response = self._send("GET", base_url + path, None, 0.0)
        if response.status >= 300:
            raise error_for(response)
        return response.text

    def _send(
        self, method: str, url: str, body: dict[str, Any] | None, extra_timeout_s: float
    ) -> Answer:
        content, headers = None, {}
        if body is not None:
            if self.wire == "msgpack":
                content, headers = msgpack.packb(body), {"Content-Type": MSGPACK}
            else:
                content = json.dumps(body).encode()
                headers = {"Content-Type": "application/json"}
        return self._sender.send(method, url, content, headers, self.timeout_s + extra_timeout_s)

    @staticmethod
    def _leader_of(response: Answer) -> str:
        leader = response.header(LEADER_HEADER) or response.header("location")
        if not leader:
            raise UnexpectedResponse(f"{response.url}: 307 without Location")
        if leader.startswith("/"):  # relative Location
            leader = urljoin(response.url, leader)
        return base_url_of(leader) if "/v1/" in leader else leader.rstrip("/")

    @staticmethod
    def _reply(response: Answer, url: str, tuples: bool = False, raw: bool = False) -> Reply:
        if response.status >= 300:
            raise error_for(response)
        if raw:
            ctype = response.header("content-type") or ""
            if MSGPACK not in ctype:
                raise UnexpectedResponse(f"{response.url}: {ctype!r}, not msgpack")
            return Reply(response.content, False, _epoch(response), url)
        body, b64 = _decode(response, tuples)
        return Reply(body, b64, _epoch(response), url)
