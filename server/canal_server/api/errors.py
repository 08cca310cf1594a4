"""Error answers: ``{"error": code, "message": ..., "field"?: ..., "leader"?: ...}``.

``api_error_of`` maps canal-ha's exception tree (``canal_protocol.errors``) to status
codes; ``install`` registers the handlers that turn every exception into such an answer.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from canal_protocol.errors import (
    BatchUnavailable,
    CoordinationError,
    Fenced,
    InvalidArgument,
    NotSubscribed,
    StartUnavailable,
    StoreError,
    UnknownBatch,
    UnknownDestination,
    UnknownTable,
)
from canal_server.api.encoding import encode

__all__ = ["ApiError", "api_error_of", "install", "unavailable"]

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
    """The answer for a canal-ha exception (None: not one the API maps). ``op`` "get":
    an unknown batch is 404 (a re-fetch), else 409 (an ack or rollback)."""
    match exc:
        case UnknownTable():  # an InvalidArgument: before it
            return ApiError(404, "unknown_table", str(exc), field=exc.field)
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
    return None


def install(app: FastAPI) -> None:
    """Every exception a route raises becomes an error answer (500 ``internal`` for
    the unexpected, logged)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return encode(request, exc.body(), exc.status, exc.headers)

    @app.exception_handler(InvalidArgument)
    @app.exception_handler(UnknownDestination)
    async def mapped(request: Request, exc: Exception) -> Response:
        err = api_error_of(exc)
        assert err is not None
        return encode(request, err.body(), err.status)

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
