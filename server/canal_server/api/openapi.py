"""What the OpenAPI schema says beyond the routes' signatures: documented error
answers, msgpack alternatives, request bodies (read by ``deps.read_body``, not by
FastAPI) and the path and query parameters."""

from __future__ import annotations

from typing import Any

from fastapi import Path, Query
from pydantic import BaseModel

from canal_server.api import models as m
from canal_server.api.encoding import MSGPACK

__all__ = [
    "ERRORS",
    "MAX_BODY",
    "BatchPath",
    "ClientPath",
    "DestPath",
    "LayoutQuery",
    "TimeoutQuery",
    "body_doc",
    "ok",
]

MAX_BODY = 64 * 1024

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": m.ErrorBody, "description": "bad input; `field` names it"},
    413: {"model": m.ErrorBody, "description": f"a body larger than {MAX_BODY} bytes"},
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


def ok(model: type[BaseModel], description: str = "OK") -> dict[int | str, dict[str, Any]]:
    """The documented answers of a route: ``model`` (JSON or msgpack) and the errors."""
    return {
        200: {
            "model": model,
            "description": description + " (JSON, or msgpack with `Accept: application/msgpack`)",
            "content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}},
        },
        **ERRORS,
    }


def body_doc(model: type[BaseModel], required: bool) -> dict[str, Any]:
    """``openapi_extra`` documenting ``model`` as the JSON or msgpack request body."""
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
TimeoutQuery = Query(0, ge=0, le=m.MAX_TIMEOUT_MS, description="wait for a re-read")
