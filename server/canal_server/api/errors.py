"""Error answers: ``{"error": code, "message": ..., "field"?: ..., "leader"?: ...}``.

``api_error_of`` maps canal-ha's exception tree (``canal_protocol.errors``), and the
database drivers' errors, to status codes; ``install`` registers the handlers that turn
every exception into such an answer, and ``Guard`` (the outermost middleware) answers
what nothing else did: 500 ``internal``, logged with its traceback at most once per
cause and minute (``canal_server.log_limit``), never re-raised into the server's log.
An answer never carries a database's own error text (it names the database; the node's
log has the rest).
"""

from __future__ import annotations

import logging
from typing import Any

import MySQLdb
import pymysql
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canal_protocol.errors import (
    BatchUnavailable,
    CanalError,
    CoordinationError,
    Fenced,
    InvalidArgument,
    NotSubscribed,
    SnapshotConflict,
    StartUnavailable,
    StoreClosed,
    StoreError,
    UnknownBatch,
    UnknownDestination,
    UnknownSnapshot,
    UnknownTable,
)
from canal_server.api.encoding import encode

__all__ = ["SOURCE_ERRORS", "ApiError", "Guard", "api_error_of", "install", "unavailable"]

# What the database drivers raise when the source database does not answer (or refuses)
SOURCE_ERRORS: tuple[type[Exception], ...] = (pymysql.err.MySQLError, MySQLdb.Error)

log = logging.getLogger("canal_server.api")


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


def unavailable(code: str, message: str, retry_after: int = 1) -> ApiError:
    """503 with ``Retry-After``."""
    return ApiError(503, code, message, headers={"Retry-After": str(retry_after)})


def api_error_of(exc: BaseException, destination: str = "", op: str = "") -> ApiError | None:
    """The answer for a canal-ha exception or a database driver's error (None: not one
    the API maps). ``op`` "get": an unknown batch is 404 (a re-fetch), else 409 (an ack
    or rollback)."""
    match exc:
        case UnknownTable():  # an InvalidArgument: before it
            return ApiError(404, "unknown_table", str(exc), field=exc.field)
        case UnknownSnapshot():
            return ApiError(404, "unknown_snapshot", str(exc), field="snapshot_id")
        case SnapshotConflict():
            return ApiError(409, "snapshot_conflict", str(exc), field=exc.field)
        case StoreClosed():  # the term ended during the call
            return unavailable("fenced", f"{destination}: {exc}")
        case InvalidArgument():
            return ApiError(400, "invalid_argument", str(exc), field=exc.field)
        case UnknownDestination():
            return ApiError(404, "unknown_destination", str(exc))
        case UnknownBatch() if op == "get":
            return ApiError(404, "unknown_batch", str(exc))
        case UnknownBatch():
            return ApiError(409, "batch_not_outstanding", str(exc))
        case NotSubscribed():
            return ApiError(409, "not_subscribed", str(exc))
        case BatchUnavailable() | StartUnavailable() | StoreError():
            return unavailable("unavailable", str(exc))
        case Fenced():
            return unavailable("fenced", f"{destination}: {exc}")
        case CoordinationError():  # e.g. a subscription's meta could not be flushed
            return unavailable("etcd_unavailable", f"etcd: {exc}", 2)
        case Exception() if isinstance(exc, SOURCE_ERRORS):
            # the driver's text is the database's business (and may quote the request)
            log.warning("%s: the source database did not answer: %.300s", destination, exc)
            return unavailable(
                "source_unavailable",
                f"{destination}: the source database did not answer (the node's log says why)",
                2,
            )
    return None


def install(app: FastAPI) -> None:
    """Every exception a route raises becomes an error answer (500 ``internal`` for
    the unexpected, logged)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return encode(request, exc.body(), exc.status, exc.headers)

    @app.exception_handler(CanalError)
    async def mapped(request: Request, exc: Exception) -> Response:
        err = api_error_of(exc, request.path_params.get("destination", ""))
        if err is None:
            raise exc  # Guard answers it: 500
        return encode(request, err.body(), err.status, err.headers)

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


class Guard:
    """The outermost middleware: an exception nothing answered becomes 500 ``internal``
    (or, once the answer has started, a closed connection), logged once per cause and
    minute with its traceback (``log_limit``), and goes no further: uvicorn logs nothing
    more."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            route = getattr(scope.get("route"), "path", "(no route)")
            log.error(
                "unexpected %s on %s %s", type(exc).__name__, scope.get("method"), route,
                exc_info=exc,
            )  # fmt: skip
            if started:
                return  # the server closes a connection whose answer did not complete
            body = {"error": "internal", "message": type(exc).__name__}
            await encode(Request(scope), body, 500)(scope, receive, send)
