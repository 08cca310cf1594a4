"""What routes depend on: the bearer-token check, the leader lookup of a destination
route, request bodies and worker threads. The get's express lane (``lane``) uses the
same parts.

Tokens (``access.py``): ``authorize`` (401 without a known token when the node has
any; 403 when a consumer token is used on a destination or client id of the path it is
not limited to) returns the token's ``Grant``; ``check_token`` is it as a dependency,
``require_admin`` adds the admin role (403 for a consumer token). A route that changes
the cluster (a snapshot, a step-down, rolling back another client) declares it::

    @router.post("/v1/destinations/{destination}/snapshots",
                 dependencies=[Depends(require_admin)])

(FastAPI runs ``check_token`` once per request even when a router and ``require_admin``
both depend on it.)

``LeaderLookup`` (the ``Lead`` / ``DestLead`` dependencies) knows the destination and
client of a request, checks their ids at once (400 naming the field, on any node,
before anything else is looked up) and finds the destination's leader when the route
asks (``call``), after it read its body: so a bad body is a 400 on any node, and the
leader is looked up as late as possible. Whether this node serves the destination is
``Node.view``'s answer. A standby answers 307 (``Location``: the request's own path and
query as the client sent them, percent-encoded), a node without a usable leader 503. A
node that has just won the election and is still loading its term holds the request (up
to ``STARTING_WAIT_S``) instead of answering 503: the first calls of clients that
followed etcd's watch to it are served without a retry round.

Bodies: ``read_raw`` (413 over ``MAX_BODY``; 408 when the body does not arrive within
``node.body_timeout_s``) and ``parse_body`` (400 naming the field); ``read_body`` is both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import anyio
import msgpack
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from canal_cluster.keys import Keys
from canal_cluster.running import RunningInfo
from canal_protocol.errors import CanalError
from canal_protocol.ids import validate_id
from canal_server.api.access import Access, Grant
from canal_server.api.encoding import is_msgpack
from canal_server.api.errors import ApiError, api_error_of, unavailable
from canal_server.api.openapi import MAX_BODY, ClientPath, DestPath
from canal_server.embedded import EmbeddedServer
from canal_server.instance import Role
from canal_server.node import Node

__all__ = [
    "MAX_THREADS",
    "DestLead",
    "Lead",
    "LeaderLookup",
    "TokenGrant",
    "authorize",
    "bearer",
    "check_token",
    "destination_lookup",
    "in_thread",
    "leader_lookup",
    "node_of",
    "parse_body",
    "raw_target",
    "read_body",
    "read_raw",
    "require_admin",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
MAX_THREADS = 256  # blocking calls running at once, per app (none of them waits long)
STARTING_WAIT_S = 2.0  # a request to a node that just won waits this long for its term

bearer = HTTPBearer(
    auto_error=False,
    description="when the node has tokens (auth.tokens, auth.admin, auth.consumer)",
)


def node_of(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


def authorize(
    access: Access, authorization: str | None, destination: str | None, client: str | None
) -> Grant | None:
    """The rights of the ``Authorization`` header's bearer token (None: the node has no
    tokens). 401 without a known token; 403 when a consumer token is limited to other
    destinations or client ids than ``destination`` / ``client``."""
    if not access.enabled:
        return None
    scheme, credentials = get_authorization_scheme_param(authorization)
    given = credentials.encode() if scheme.lower() == "bearer" and credentials else b""
    grant = access.grant_of(given) if given else None
    if grant is None:
        raise ApiError(
            401, "unauthorized", "a valid bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
    why = grant.refusal(destination, client)
    if why is not None:
        raise ApiError(403, "forbidden", why)
    return grant


async def check_token(
    request: Request,
    _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],  # the docs' scheme
) -> Grant | None:
    """``authorize`` of the request's token, on the path's destination and client id."""
    params = request.path_params
    return authorize(
        request.app.state.access,
        request.headers.get("authorization"),
        params.get("destination"),
        params.get("client_id"),
    )


TokenGrant = Annotated[Grant | None, Depends(check_token)]


async def require_admin(request: Request, grant: TokenGrant) -> None:
    """403 for a consumer token: the route changes the cluster (needs ``auth.admin`` or
    ``auth.tokens``). Open when the node has no tokens."""
    if grant is not None and not grant.is_admin:
        raise ApiError(
            403, "forbidden",
            f"{request.method} {raw_target(request)} changes the cluster: it needs an admin "
            "token (auth.admin or auth.tokens), not a consumer token",
        )  # fmt: skip


async def in_thread(request: Request, fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread (blocking calls never run on the event loop), at most
    ``MAX_THREADS`` at once per app."""
    state = request.app.state
    limiter = getattr(state, "limiter", None)
    if limiter is None:  # made inside the event loop, on first use
        limiter = state.limiter = anyio.CapacityLimiter(MAX_THREADS)
    return await anyio.to_thread.run_sync(fn, limiter=limiter)


# What a URL's path and query may hold as they are (RFC 3986 pchar, "/" and "?"); every
# other byte, and "%" not starting an escape, is percent-encoded.
_SAFE = "/:@!$&'()*+,;=-._~?"


def raw_target(request: Request) -> str:
    """The request's path and query as the client sent them (not decoded), in ASCII:
    what a redirect names, so that ``%25`` stays ``%25`` and no decoded byte reaches a
    header."""
    scope = request.scope
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    target = path + (b"?" + query if query else b"")
    return _escape(target)


def _escape(raw: bytes) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        b = raw[i]
        is_escape = b == 0x25 and _is_hex(raw[i + 1 : i + 3])
        if is_escape:
            out.append(raw[i : i + 3].decode("ascii"))
            i += 3
            continue
        out.append(quote(bytes([b]), safe=_SAFE))
        i += 1
    return "".join(out)


def _is_hex(two: bytes) -> bool:
    return len(two) == 2 and all(c in b"0123456789abcdefABCDEF" for c in two)


@dataclass(frozen=True)
class LeaderLookup:
    """The destination and client of a request; ``call`` runs on their leader."""

    request: Request
    destination: str
    client_id: str

    def check_ids(self) -> None:
        """400 naming ``destination`` or ``client_id`` for an id outside the id rule (a
        reserved client id too): before any lookup, on any node."""
        validate_id(self.destination, "destination")
        if self.client_id:  # "" for destination-wide routes (snapshots, DestLead)
            Keys().client_prefix(self.destination, self.client_id)  # reserved ids too

    def leader(self) -> tuple[EmbeddedServer, int]:
        """(server, epoch) of the destination on this node; else 307 to the leader,
        503 while none is usable; 400/404 for a bad id or an unknown destination."""
        self.check_ids()
        d, node = self.destination, node_of(self.request)
        view = node.view(d)
        if view.serving is not None:
            return view.serving
        if view.handing_to is not None:
            self._handing_over(view.leader, view.handing_to)
        if view.role is Role.STARTING:
            raise unavailable(  # ready in moments: no wait asked, the client's backoff paces
                "starting", f"{d}: this node is starting to lead (epoch {view.epoch})", 0
            )
        if view.role is Role.FENCED:
            raise unavailable("fenced", f"{d}: this node is fenced or stopping")
        leader = view.leader
        if leader is not None and leader.node != node.id and leader.url:
            self._redirect(leader)
        raise unavailable("no_leader", f"{d}: no leader is known right now")

    def _if_handing_over(self) -> None:
        view = node_of(self.request).view(self.destination)
        if view.handing_to is not None:
            self._handing_over(view.leader, view.handing_to)

    def _handing_over(self, leader: RunningInfo | None, to: str) -> None:
        """A graceful handover is under way: 307 once the successor leads, else 503
        without a wait (the client's backoff paces; it follows the leader in etcd)."""
        if leader is not None and leader.node == to:
            self._redirect(leader)
        raise unavailable("handing_over", f"{self.destination}: handing over to node {to}", 0)

    def _redirect(self, leader: RunningInfo) -> NoReturn:
        d = self.destination
        raise ApiError(
            307, "not_leader", f"{d}: node {leader.node} leads (epoch {leader.epoch})",
            leader=leader.url,
            headers={"Location": leader.url + raw_target(self.request),
                     "X-Canal-Leader": leader.url, "X-Canal-Epoch": str(leader.epoch)},
        )  # fmt: skip

    async def ready_leader(self) -> tuple[EmbeddedServer, int]:
        """``leader()``, waiting up to ``STARTING_WAIT_S`` while this node starts to lead."""
        deadline = anyio.current_time() + STARTING_WAIT_S
        while True:
            try:
                return self.leader()
            except ApiError as err:
                if err.code != "starting" or anyio.current_time() >= deadline:
                    raise
            await anyio.sleep(0.01)

    async def call(
        self, fn: Callable[[EmbeddedServer], T], op: str = "", here: bool = False
    ) -> tuple[T, int]:
        """``fn(server)`` on the leader, in a worker thread; (result, epoch). Errors
        become answers (``api_error_of``); 503 when the leadership ended meanwhile.
        ``here``: on the event loop instead, for a call that never waits and runs no
        client filter (a get with no wait: the store's and the client's locks, held for
        microseconds)."""
        server, epoch = await self.ready_leader()
        return await self.run(server, epoch, fn, op, here), epoch

    async def run(
        self,
        server: EmbeddedServer,
        epoch: int,
        fn: Callable[[EmbeddedServer], T],
        op: str = "",
        here: bool = False,
    ) -> T:
        """``call`` on a leader already looked up (``ready_leader``)."""
        try:
            if here:
                result = fn(server)
            else:
                result = await in_thread(self.request, lambda: fn(server))
        except CanalError as exc:
            err = api_error_of(exc, self.destination, op)
            if err is None:
                raise
            self._if_handing_over()  # e.g. a long poll ended by the handover
            raise err from None
        still = node_of(self.request).view(self.destination).serving
        if still is None or still[1] != epoch:
            self._if_handing_over()
            raise unavailable("fenced", f"{self.destination}: leadership of epoch {epoch} ended")
        return result


async def leader_lookup(
    request: Request, destination: str = DestPath, client_id: str = ClientPath
) -> LeaderLookup:
    lead = LeaderLookup(request, destination, client_id)
    lead.check_ids()
    return lead


Lead = Annotated[LeaderLookup, Depends(leader_lookup)]


async def destination_lookup(request: Request, destination: str = DestPath) -> LeaderLookup:
    lead = LeaderLookup(request, destination, "")
    lead.check_ids()
    return lead


DestLead = Annotated[LeaderLookup, Depends(destination_lookup)]  # routes without a client


def _too_large() -> ApiError:
    return ApiError(413, "payload_too_large", f"body larger than {MAX_BODY} bytes", field="body")


async def read_raw(request: Request) -> bytes:
    """The body, refused (413) as soon as it is over ``MAX_BODY``: never read whole;
    408 ``request_timeout`` (and the connection closed) when it has not arrived within
    ``node.body_timeout_s``."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    limit_s = node_of(request).config.node.body_timeout_s
    with anyio.move_on_after(limit_s) as scope:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    raise _too_large()
                chunks.append(chunk)
        except ClientDisconnect:  # nobody reads the answer; no error of ours to log
            raise ApiError(400, "bad_body", "the client left before its body arrived") from None
    if scope.cancelled_caught:
        raise ApiError(
            408, "request_timeout", f"the body did not arrive within {limit_s:g} s",
            field="body", headers={"Connection": "close"},
        )  # fmt: skip
    return b"".join(chunks)


def decode_body(request: Request, raw: bytes) -> Any:
    """A request body by its Content-Type (msgpack, else JSON; empty: ``{}``); 400
    ``bad_body`` when unreadable."""
    if not raw.strip():
        return {}
    try:
        if is_msgpack(request.headers.get("content-type", "")):
            return msgpack.unpackb(raw, raw=False, strict_map_key=True)
        return json.loads(raw)
    except Exception as exc:
        raise ApiError(400, "bad_body", f"unreadable body: {exc}", field="body") from None


def parse_body(request: Request, raw: bytes, model: type[M]) -> M:
    """The JSON or msgpack ``raw`` body as ``model``: 400 naming the field (the body's
    top-level field) when it does not validate."""
    data = decode_body(request, raw)
    if not isinstance(data, dict):
        raise ApiError(400, "bad_body", "the body must be an object", field="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        path = ".".join(str(p) for p in e["loc"]) or "body"
        name = str(e["loc"][0]) if e["loc"] else "body"  # the body's field (`start.position…`)
        raise ApiError(400, "invalid_argument", f"{path}: {e['msg']}", field=name) from None


async def read_body(request: Request, model: type[M]) -> M:
    """The JSON or msgpack body as ``model`` (``read_raw``, then ``parse_body``)."""
    return parse_body(request, await read_raw(request), model)
