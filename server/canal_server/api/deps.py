"""What routes depend on: the bearer-token check, the leader lookup of a destination
route, request bodies and worker threads.

Tokens (``access.py``): ``check_token`` (401 without a known token when the node has
any; 403 when a consumer token is used on a destination or client id of the path it is
not limited to) returns the token's ``Grant``; ``require_admin`` adds the admin role
(403 for a consumer token). A route that changes the cluster (a snapshot, a step-down,
rolling back another client) declares it::

    @router.post("/v1/destinations/{destination}/snapshots",
                 dependencies=[Depends(require_admin)])

(FastAPI runs ``check_token`` once per request even when a router and ``require_admin``
both depend on it.)

``LeaderLookup`` (the ``Lead`` dependency) knows the destination and client of a
request and finds the destination's leader when the route asks (``call``), after it
read its body: so a bad body is a 400 on any node, and the leader is looked up as late
as possible. A standby answers 307, a node without a usable leader 503. A node that has
just won the election and is still loading its term holds the request (up to
``STARTING_WAIT_S``) instead of answering 503: the first calls of clients that
followed etcd's watch to it are served without a retry round.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TypeVar

import anyio
import msgpack
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from canal_cluster.keys import Keys, validate_id
from canal_cluster.running import RunningInfo
from canal_protocol.errors import CanalError
from canal_server.api.access import Access, Grant
from canal_server.api.encoding import is_msgpack
from canal_server.api.errors import ApiError, api_error_of, unavailable
from canal_server.api.openapi import MAX_BODY, ClientPath, DestPath
from canal_server.embedded import EmbeddedServer
from canal_server.instance import Role
from canal_server.node import Node

__all__ = [
    "DestLead",
    "Lead",
    "LeaderLookup",
    "TokenGrant",
    "bearer",
    "check_token",
    "decode_body",
    "destination_lookup",
    "in_thread",
    "leader_lookup",
    "node_of",
    "read_body",
    "require_admin",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
MAX_THREADS = 256  # long polls waiting at once, per app
STARTING_WAIT_S = 2.0  # a request to a node that just won waits this long for its term

bearer = HTTPBearer(
    auto_error=False,
    description="when the node has tokens (auth.tokens, auth.admin, auth.consumer)",
)


def node_of(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


async def check_token(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Grant | None:
    """The token's rights (None: the node has no tokens). 401 without a known token;
    403 when a consumer token is limited to other destinations or client ids than the
    path's."""
    access: Access = request.app.state.access
    if not access.enabled:
        return None
    given = creds.credentials.encode() if creds is not None else b""
    grant = access.grant_of(given)
    if grant is None:
        raise ApiError(
            401, "unauthorized", "a valid bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
    params = request.path_params
    why = grant.refusal(params.get("destination"), params.get("client_id"))
    if why is not None:
        raise ApiError(403, "forbidden", why)
    return grant


TokenGrant = Annotated[Grant | None, Depends(check_token)]


async def require_admin(request: Request, grant: TokenGrant) -> None:
    """403 for a consumer token: the route changes the cluster (needs ``auth.admin`` or
    ``auth.tokens``). Open when the node has no tokens."""
    if grant is not None and not grant.is_admin:
        raise ApiError(
            403, "forbidden",
            f"{request.method} {request.url.path} changes the cluster: it needs an admin "
            "token (auth.admin or auth.tokens), not a consumer token",
        )  # fmt: skip


async def in_thread(request: Request, fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread (blocking store calls never run on the event loop)."""
    state = request.app.state
    limiter = getattr(state, "limiter", None)
    if limiter is None:  # made inside the event loop, on first use
        limiter = state.limiter = anyio.CapacityLimiter(MAX_THREADS)
    return await anyio.to_thread.run_sync(fn, limiter=limiter)


@dataclass(frozen=True)
class LeaderLookup:
    """The destination and client of a request; ``call`` runs on their leader."""

    request: Request
    destination: str
    client_id: str

    def leader(self) -> tuple[EmbeddedServer, int]:
        """(server, epoch) of the destination on this node; else 307 to the leader,
        503 while none is usable; 400/404 for a bad id or an unknown destination."""
        d, node = self.destination, node_of(self.request)
        validate_id(d, "destination")
        if self.client_id:  # "" for destination-wide routes (snapshots, DestLead)
            Keys().client_prefix(d, self.client_id)  # InvalidArgument("client_id")
        serving = node.instance(d).serving()
        if serving is not None:
            return serving
        view = node.view(d)
        if view.handing_to is not None:
            self._handing_over(view.leader, view.handing_to)
        if view.role is Role.STARTING or self._won_not_ready():
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
        url = self.request.url
        target = leader.url + url.path + (f"?{url.query}" if url.query else "")
        d = self.destination
        raise ApiError(
            307, "not_leader", f"{d}: node {leader.node} leads (epoch {leader.epoch})",
            leader=leader.url,
            headers={"Location": target, "X-Canal-Leader": leader.url,
                     "X-Canal-Epoch": str(leader.epoch)},
        )  # fmt: skip

    def _won_not_ready(self) -> bool:
        """This node holds the election but its term is not serving yet (loading)."""
        inst = node_of(self.request).instance(self.destination)
        monitor = inst.monitor
        if monitor is None or monitor.leader_epoch() is None:
            return False
        return inst.role()[0] in (Role.STANDBY, Role.STARTING)

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
        ``here``: on the event loop instead, for a call that never waits (a get with
        no wait: the store's and the client's locks, held for microseconds)."""
        server, epoch = await self.ready_leader()
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
        still = node_of(self.request).instance(self.destination).serving()
        if still is None or still[1] != epoch:
            self._if_handing_over()
            raise unavailable("fenced", f"{self.destination}: leadership of epoch {epoch} ended")
        return result, epoch


async def leader_lookup(
    request: Request, destination: str = DestPath, client_id: str = ClientPath
) -> LeaderLookup:
    return LeaderLookup(request, destination, client_id)


Lead = Annotated[LeaderLookup, Depends(leader_lookup)]


async def destination_lookup(request: Request, destination: str = DestPath) -> LeaderLookup:
    return LeaderLookup(request, destination, "")


DestLead = Annotated[LeaderLookup, Depends(destination_lookup)]  # routes without a client


def _too_large() -> ApiError:
    return ApiError(413, "payload_too_large", f"body larger than {MAX_BODY} bytes", field="body")


async def _read_limited(request: Request) -> bytes:
    """The body, refused (413) as soon as it is over ``MAX_BODY``: never read whole."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_large()
        chunks.append(chunk)
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


async def read_body(request: Request, model: type[M]) -> M:
    """The JSON or msgpack body as ``model``: 413 over ``MAX_BODY``, 400 naming the
    field (the body's top-level field) when it does not validate."""
    data = decode_body(request, await _read_limited(request))
    if not isinstance(data, dict):
        raise ApiError(400, "bad_body", "the body must be an object", field="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        path = ".".join(str(p) for p in e["loc"]) or "body"
        name = str(e["loc"][0]) if e["loc"] else "body"  # the body's field (`start.position…`)
        raise ApiError(400, "invalid_argument", f"{path}: {e['msg']}", field=name) from None
