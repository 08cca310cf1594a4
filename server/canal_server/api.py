"""The REST pull API of API.md as a FastAPI app: ``create_app(node)``.

* JSON by default, msgpack with ``Accept: application/msgpack`` (request bodies too,
  with ``Content-Type: application/msgpack``); bytes stay bytes in msgpack and are
  base64 in JSON.
* Destination routes answer only on the destination's leader: a standby answers 307
  (``Location`` = the same path on the leader, ``X-Canal-Leader``); 503 with
  ``Retry-After`` while no leader is known, the node is fenced or still starting.
* Every response carries ``X-Canal-Epoch`` (the destination's; on node-wide routes
  the highest epoch of the node's destinations).
* Bearer tokens when configured (not for ``/v1/health`` and ``/metrics``).
* Blocking store calls (long polls) run in a worker thread, never on the event loop.
* Batches in API.md's ``rows`` layout, or with ``layout=compact`` (what the Python
  client asks for) each rows entry's ``columns`` once and ``before``/``after`` value
  lists; compact msgpack batches are joined from the entries' once-made bytes.

Errors are ``{"error": code, "message": ..., "field"?: ..., "leader"?: ...}``:
400 invalid_argument / bad_body, 401 unauthorized, 404 unknown_destination /
unknown_batch / not_found, 405 method_not_allowed, 409 not_subscribed /
batch_not_outstanding, 307 not_leader, 503 no_leader / fenced / starting /
unavailable / etcd_unavailable.
"""

from __future__ import annotations

import base64
import enum
import hmac
import json
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgpack
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canal_cluster.keys import Keys, validate_id
from canal_protocol.batch import Batch
from canal_protocol.errors import (
    BatchUnavailable,
    CoordinationError,
    InvalidArgument,
    NotSubscribed,
    StoreError,
    UnknownBatch,
    UnknownDestination,
)
from canal_server import api_models as m
from canal_server.embedded import EmbeddedServer
from canal_server.instance import Role
from canal_server.metrics import CONTENT_TYPE
from canal_server.node import Node
from canal_server.snapshot_routes import SnapshotRouteParts, add_snapshot_routes

__all__ = ["MSGPACK", "ApiError", "create_app"]

log = logging.getLogger(__name__)
MSGPACK = "application/msgpack"
MAX_BODY = 64 * 1024
_DEST_PATH = re.compile(r"^/v1/destinations/([^/]+)")
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """An error answer: status, code, message (and headers, field, leader)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        leader: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field, self.leader = field, leader
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        if self.leader is not None:
            out["leader"] = self.leader
        return out


def _unavailable(code: str, message: str, retry_after: int = 1) -> ApiError:
    return ApiError(503, code, message, headers={"Retry-After": str(retry_after)})


# -- encoding ---------------------------------------------------------------------------


def wants_msgpack(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return MSGPACK in accept or "application/x-msgpack" in accept


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def encode(
    request: Request, data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    if wants_msgpack(request):
        body = msgpack.packb(data, use_bin_type=True, default=str)
        return Response(body, status, headers, media_type=MSGPACK)
    text = json.dumps(data, default=_json_default, separators=(",", ":"))
    return Response(text, status, headers, media_type="application/json")


def _batch_response(
    request: Request, batch: Batch, layout: str, headers: dict[str, str]
) -> Response:
    """A batch in ``layout``; compact msgpack joins the entries' once-made bytes, the
    rest goes through ``encode`` (which turns bytes into base64 for JSON)."""
    if layout == "compact" and wants_msgpack(request):
        return Response(batch.pack_compact(), 200, headers, media_type=MSGPACK)
    return encode(request, batch.to_wire(compact=layout == "compact"), headers=headers)


async def read_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise ApiError(400, "bad_body", f"body larger than {MAX_BODY} bytes", field="body")
    data: Any = {}
    if raw.strip():
        ctype = request.headers.get("content-type", "")
        try:
            if MSGPACK in ctype or "application/x-msgpack" in ctype:
                data = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            else:
                data = json.loads(raw)
        except Exception as exc:
            raise ApiError(400, "bad_body", f"unreadable body: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "bad_body", "the body must be an object", field="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        name = ".".join(str(p) for p in e["loc"]) or "body"
        raise ApiError(400, "invalid_argument", f"{name}: {e['msg']}", field=name) from None


# -- the epoch header -------------------------------------------------------------------


class EpochHeader:
    """Adds ``X-Canal-Epoch`` to every response that does not carry one yet."""

    def __init__(self, app: ASGIApp, node: Node) -> None:
        self.app = app
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        match = _DEST_PATH.match(scope.get("path", ""))

        async def send_with_epoch(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "x-canal-epoch" not in headers:
                    headers["X-Canal-Epoch"] = str(self._epoch(match))
            await send(message)

        await self.app(scope, receive, send_with_epoch)

    def _epoch(self, match: re.Match[str] | None) -> int:
        if match is not None:
            return self.node.epoch_of(match.group(1))
        return max((self.node.epoch_of(d) for d in self.node.instances), default=0)


# -- the app ------------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": m.ErrorBody, "description": "bad input; `field` names it"},
    401: {"model": m.ErrorBody, "description": "no or bad bearer token"},
    404: {"model": m.ErrorBody, "description": "unknown destination (or batch)"},
    409: {"model": m.ErrorBody, "description": "not subscribed, or batch not outstanding"},
    307: {
        "model": m.ErrorBody,
        "description": "this node is a standby: `Location` and `X-Canal-Leader` name the leader",
    },
    503: {
        "model": m.ErrorBody,
        "description": "no leader known, fenced, starting, or data not available yet; "
        "see `Retry-After`",
    },
}


def _ok(model: type[BaseModel], description: str = "OK") -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "model": model,
            "description": description + " (JSON, or msgpack with `Accept: application/msgpack`)",
            "content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}},
        },
        **_ERRORS,
    }


def _body_doc(model: type[BaseModel], required: bool) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}, MSGPACK: {"schema": schema}},
        }
    }


DestPath = Path(description="destination id [A-Za-z0-9_.-]{1,64}")
ClientPath = Path(description="client id [A-Za-z0-9_.-]{1,64}")
BatchPath = Path(ge=0, le=2**63 - 1, description="batch id")
LayoutQuery = Query("rows", description=m.LAYOUT_DOC)


def create_app(node: Node) -> FastAPI:
    """The API of ``node``."""
    app = FastAPI(
        title="canal-ha",
        version="1",
        description=__doc__,
        responses={401: {"model": m.ErrorBody}},
    )
    bearer = HTTPBearer(auto_error=False, description="when the node has auth.tokens")
    tokens = [t.encode() for t in node.config.auth.tokens]
    holder: dict[str, anyio.CapacityLimiter] = {}

    def check_token(
        creds: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
    ) -> None:
        if not tokens:
            return
        given = creds.credentials.encode() if creds is not None else b""
        if not any(hmac.compare_digest(given, t) for t in tokens):
            raise ApiError(
                401, "unauthorized", "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip

    async def in_thread(fn: Callable[[], T]) -> T:
        limiter = holder.get("limiter")
        if limiter is None:
            limiter = holder["limiter"] = anyio.CapacityLimiter(256)
        return await anyio.to_thread.run_sync(fn, limiter=limiter)

    def leader_of(request: Request, d: str, c: str | None) -> tuple[EmbeddedServer, int]:
        validate_id(d, "destination")
        if c is not None:
            Keys().client_prefix(d, c)  # InvalidArgument("client_id")
        inst = node.instance(d)
        serving = inst.serving()
        if serving is not None:
            return serving
        view = node.view(d)
        if view.role is Role.STARTING:
            raise _unavailable(  # ready in moments: no wait asked, the client's backoff paces
                "starting", f"{d}: this node is starting to lead (epoch {view.epoch})", 0
            )
        if view.role is Role.FENCED:
            raise _unavailable("fenced", f"{d}: this node is fenced or stopping")
        leader = view.leader
        if leader is not None and leader.node != node.id and leader.url:
            target = leader.url + request.url.path
            if request.url.query:
                target += "?" + request.url.query
            raise ApiError(
                307, "not_leader", f"{d}: node {leader.node} leads (epoch {leader.epoch})",
                leader=leader.url,
                headers={"Location": target, "X-Canal-Leader": leader.url,
                         "X-Canal-Epoch": str(leader.epoch)},
            )  # fmt: skip
        raise _unavailable("no_leader", f"{d}: no leader is known right now")

    async def call(
        request: Request, d: str, c: str, fn: Callable[[EmbeddedServer], T], op: str = ""
    ) -> tuple[T, int]:
        server, epoch = leader_of(request, d, c)
        try:
            result = await in_thread(lambda: fn(server))
        except UnknownBatch as exc:
            if op == "get":
                raise ApiError(404, "unknown_batch", str(exc)) from None
            raise ApiError(409, "batch_not_outstanding", str(exc)) from None
        except NotSubscribed as exc:
            raise ApiError(409, "not_subscribed", str(exc)) from None
        except (BatchUnavailable, StoreError) as exc:
            raise _unavailable("unavailable", str(exc)) from None
        still = node.instance(d).serving()
        if still is None or still[1] != epoch:
            raise _unavailable("fenced", f"{d}: leadership of epoch {epoch} ended")
        return result, epoch

    def epoch_headers(epoch: int) -> dict[str, str]:
        return {"X-Canal-Epoch": str(epoch)}

    # -- errors ------------------------------------------------------------------------

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return encode(request, exc.body(), exc.status, exc.headers)

    @app.exception_handler(InvalidArgument)
    async def invalid(request: Request, exc: InvalidArgument) -> Response:
        err = ApiError(400, "invalid_argument", str(exc), field=exc.field)
        return encode(request, err.body(), 400)

    @app.exception_handler(UnknownDestination)
    async def unknown_destination(request: Request, exc: UnknownDestination) -> Response:
        return encode(request, ApiError(404, "unknown_destination", str(exc)).body(), 404)

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, exc: RequestValidationError) -> Response:
        e = exc.errors()[0]
        loc = [str(p) for p in e.get("loc", ())]
        name = loc[-1] if loc else "request"
        err = ApiError(400, "invalid_argument", f"{name}: {e.get('msg', 'invalid')}", field=name)
        return encode(request, err.body(), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = {"error": code, "message": str(exc.detail)}
        return encode(request, body, exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return encode(request, {"error": "internal", "message": type(exc).__name__}, 500)

    # -- node routes ---------------------------------------------------------------------

    @app.get("/v1/health", responses=_ok(m.HealthOut), tags=["node"])
    async def health(request: Request) -> Response:
        """Node id; per destination: role, epoch, leader, the reader's state or error, where
        the reader is and (on the leader) where the source's binlog ends."""
        # binlog_end asks the database: off the event loop, apart from the long polls' limiter
        return encode(request, await anyio.to_thread.run_sync(node.health))

    @app.get(
        "/v1/cluster",
        responses=_ok(m.ClusterOut),
        tags=["node"],
        dependencies=[Depends(check_token)],
    )
    async def cluster(request: Request) -> Response:
        """Nodes and destination leaders as etcd has them."""
        try:
            data = await in_thread(node.cluster)
        except CoordinationError as exc:
            raise _unavailable("etcd_unavailable", f"etcd: {exc}", 2) from None
        return encode(request, data)

    @app.get(
        "/metrics",
        tags=["node"],
        responses={200: {"description": "Prometheus text", "content": {CONTENT_TYPE: {}}}},
    )
    async def metrics() -> Response:
        """Prometheus metrics of this node."""
        return Response(node.metrics.render(), media_type=CONTENT_TYPE)

    _destination_routes(app, check_token, call, epoch_headers)
    _cursor_move_route(app, check_token, call, epoch_headers)
    add_snapshot_routes(app, node, SnapshotRouteParts(check_token, leader_of, encode, read_body))
    app.add_middleware(EpochHeader, node=node)
    app.state.node = node
    return app


def _destination_routes(
    app: FastAPI,
    check_token: Callable[..., None],
    call: Callable[..., Any],
    epoch_headers: Callable[[int], dict[str, str]],
) -> None:
    base = "/v1/destinations/{destination}/clients/{client_id}"
    deps = [Depends(check_token)]
    tags: list[str | enum.Enum] = ["destinations"]

    @app.put(
        f"{base}/subscription",
        responses=_ok(m.SubscriptionOut),
        openapi_extra=_body_doc(m.SubscriptionRequest, False),
        dependencies=deps,
        tags=tags,
    )
    async def subscribe(
        request: Request, destination: str = DestPath, client_id: str = ClientPath
    ) -> Response:
        """Subscribe (idempotent; a new filter replaces the old one)."""
        body = await read_body(request, m.SubscriptionRequest)
        _, epoch = await call(
            request, destination, client_id, lambda s: s.subscribe(client_id, body.filter)
        )
        out = {"destination": destination, "client_id": client_id, "filter": body.filter}
        return encode(request, out, headers=epoch_headers(epoch))

    @app.delete(
        f"{base}/subscription", responses=_ok(m.UnsubscribeOut), dependencies=deps, tags=tags
    )
    async def unsubscribe(
        request: Request, destination: str = DestPath, client_id: str = ClientPath
    ) -> Response:
        """Unsubscribe: forget the client's cursor and batches (idempotent)."""
        _, epoch = await call(request, destination, client_id, lambda s: s.unsubscribe(client_id))
        out = {"destination": destination, "client_id": client_id, "subscribed": False}
        return encode(request, out, headers=epoch_headers(epoch))

    @app.post(
        f"{base}/batches",
        responses=_ok(m.BatchOut, "a batch; `{id: -1, entries: []}` when nothing arrived"),
        openapi_extra=_body_doc(m.BatchRequest, False),
        dependencies=deps,
        tags=tags,
    )
    async def get_batch(
        request: Request, destination: str = DestPath, client_id: str = ClientPath
    ) -> Response:
        """getWithoutAck (long poll up to timeout_ms); `auto_ack: true` is Canal's get."""
        body = await read_body(request, m.BatchRequest)
        timeout_s = body.timeout_ms / 1000

        def take(s: EmbeddedServer) -> Any:
            if body.auto_ack:
                return s.get(client_id, body.size, timeout_s)
            return s.get_without_ack(client_id, body.size, timeout_s)

        batch, epoch = await call(request, destination, client_id, take)
        return _batch_response(request, batch, body.layout, epoch_headers(epoch))

    @app.get(
        f"{base}/batches/{{batch_id}}", responses=_ok(m.BatchOut), dependencies=deps, tags=tags
    )
    async def refetch(
        request: Request,
        destination: str = DestPath,
        client_id: str = ClientPath,
        batch_id: int = BatchPath,
        timeout_ms: int = Query(0, ge=0, le=m.MAX_TIMEOUT_MS, description="wait for a re-read"),
        layout: m.Layout = LayoutQuery,
    ) -> Response:
        """The same outstanding batch again (404 once acked or rolled back)."""
        batch, epoch = await call(
            request, destination, client_id,
            lambda s: s.get_batch(client_id, batch_id, timeout_ms / 1000), "get",
        )  # fmt: skip
        return _batch_response(request, batch, layout, epoch_headers(epoch))

    @app.post(
        f"{base}/batches/{{batch_id}}/ack", responses=_ok(m.AckOut), dependencies=deps, tags=tags
    )
    async def ack(
        request: Request,
        destination: str = DestPath,
        client_id: str = ClientPath,
        batch_id: int = BatchPath,
    ) -> Response:
        """Ack every outstanding batch <= batch_id (409 if batch_id is not outstanding)."""
        _, epoch = await call(request, destination, client_id, lambda s: s.ack(client_id, batch_id))
        return encode(request, {"acked": batch_id}, headers=epoch_headers(epoch))

    @app.post(
        f"{base}/batches/{{batch_id}}/rollback",
        responses=_ok(m.RollbackOut),
        dependencies=deps,
        tags=tags,
    )
    async def rollback_one(
        request: Request,
        destination: str = DestPath,
        client_id: str = ClientPath,
        batch_id: int = BatchPath,
    ) -> Response:
        """Roll back batch_id and every later outstanding batch."""
        _, epoch = await call(
            request, destination, client_id, lambda s: s.rollback(client_id, batch_id)
        )
        return encode(request, {"rolled_back": batch_id}, headers=epoch_headers(epoch))

    @app.post(f"{base}/rollback", responses=_ok(m.RollbackOut), dependencies=deps, tags=tags)
    async def rollback_all(
        request: Request, destination: str = DestPath, client_id: str = ClientPath
    ) -> Response:
        """Roll back every outstanding batch (a no-op for a client not subscribed)."""
        _, epoch = await call(request, destination, client_id, lambda s: s.rollback(client_id))
        return encode(request, {"rolled_back": None}, headers=epoch_headers(epoch))

    @app.get(f"{base}/cursor", responses=_ok(m.CursorOut), dependencies=deps, tags=tags)
    async def cursor(
        request: Request, destination: str = DestPath, client_id: str = ClientPath
    ) -> Response:
        """The client's last acked position (null before its first ack)."""
        pos, epoch = await call(request, destination, client_id, lambda s: s.cursor(client_id))
        out = {"cursor": pos.to_dict() if pos is not None else None}
        return encode(request, out, headers=epoch_headers(epoch))


def _cursor_move_route(
    app: FastAPI,
    check_token: Callable[..., None],
    call: Callable[..., Any],
    epoch_headers: Callable[[int], dict[str, str]],
) -> None:
    """``POST C/cursor``: commit through an entry (``EmbeddedServer.move_cursor``)."""

    @app.post(
        "/v1/destinations/{destination}/clients/{client_id}/cursor",
        responses=_ok(m.CursorOut, "the cursor after the move"),
        openapi_extra=_body_doc(m.CursorRequest, True),
        dependencies=[Depends(check_token)],
        tags=["destinations"],
    )
    async def move_cursor(
        request: Request, destination: str = DestPath, client_id: str = ClientPath
    ) -> Response:
        """Commit through an entry: drop every outstanding batch, then move the cursor forward
        through the stored entry starting at `logfile`:`offset` (never backwards)."""
        body = await read_body(request, m.CursorRequest)
        pos, epoch = await call(
            request, destination, client_id,
            lambda s: s.move_cursor(client_id, body.logfile, body.offset),
        )  # fmt: skip
        out = {"cursor": pos.to_dict() if pos is not None else None}
        return encode(request, out, headers=epoch_headers(epoch))
