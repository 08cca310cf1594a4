"""What the OpenAPI schema says beyond the routes' signatures: the answers each route
really gives (``answers``; no 422: validation answers 400), msgpack alternatives,
request bodies (read by ``deps.read_body``, not by FastAPI), the path and query
parameters with the id rule as a pattern (``canal_protocol.ids``), and ``install``:
the document FastAPI builds, made self-contained (every ``$ref`` resolves from its
root).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Path, Query
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from canal_protocol.ids import ID_JSON_PATTERN, ID_MAX_LEN
from canal_server.api import models as m
from canal_server.api.encoding import MSGPACK

__all__ = [
    "DEST_ERRORS",
    "ERRORS",
    "MAX_BODY",
    "BatchPath",
    "ClientPath",
    "DestPath",
    "LayoutQuery",
    "SnapshotPath",
    "TimeoutQuery",
    "answers",
    "body_doc",
    "install",
]

MAX_BODY = 64 * 1024
_REF = "#/components/schemas/{model}"

ERRORS: dict[int, str] = {
    307: "this node is a standby: `Location` (the same path and query on the leader) and "
    "`X-Canal-Leader` name the leader",
    400: "bad input; `field` names it",
    401: "no or bad bearer token (when the node has tokens)",
    403: "a consumer token out of its limits, or on a route that changes the cluster",
    404: "unknown destination, batch, table or snapshot (`error` says which)",
    408: "the body did not arrive within `node.body_timeout_s`",
    409: "not subscribed, batch not outstanding, a snapshot conflict or a failed handover",
    413: f"a body larger than {MAX_BODY} bytes",
    503: "no leader known, fenced, starting, handing over, overloaded, or data or a "
    "database not available yet; see `Retry-After`",
}
_BODY_ERRORS = (408, 413)


def answers(
    model: type[BaseModel] | None,
    *errors: int,
    status: int = 200,
    description: str = "OK",
    body: bool = False,
) -> dict[int | str, dict[str, Any]]:
    """The documented answers of a route: ``model`` at ``status`` (JSON, or msgpack) and
    the error statuses it really gives (``body``: it reads a body, so 408 and 413 too)."""
    out: dict[int | str, dict[str, Any]] = {}
    if model is not None:
        out[status] = {
            "model": model,
            "description": description + " (JSON, or msgpack with `Accept: application/msgpack`)",
            "content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}},
        }
    for code in sorted({*errors, *(_BODY_ERRORS if body else ())}):
        out[code] = {"model": m.ErrorBody, "description": ERRORS[code]}
    return out


# What every destination route may answer besides its own 200 (an unknown destination is
# 404; 409 where the route has its conflicts)
DEST_ERRORS = (307, 400, 401, 403, 404, 503)


def body_doc(model: type[BaseModel], required: bool) -> dict[str, Any]:
    """``openapi_extra`` documenting ``model`` as the JSON or msgpack request body
    (its schema joins the document's components in ``install``)."""
    schema = model.model_json_schema(ref_template=_REF)
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}, MSGPACK: {"schema": schema}},
        }
    }


def install(app: FastAPI) -> None:
    """``app.openapi()`` builds FastAPI's document once, then: no 422 answers (and no
    validation-error schemas: bad input is 400 ``ErrorBody``), and the request bodies'
    nested schemas moved into ``components/schemas`` (each ``$ref`` resolves from the
    document's root)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _tidy(doc)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _tidy(doc: dict[str, Any]) -> dict[str, Any]:
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for item in doc.get("paths", {}).values():
        for op in item.values():
            responses = op.get("responses", {})
            responses.pop("422", None)
            for media in op.get("requestBody", {}).get("content", {}).values():
                schema = media.get("schema", {})
                for name, sub in schema.pop("$defs", {}).items():
                    schemas.setdefault(name, sub)
    return doc


def _id_path(what: str) -> Any:
    return Path(
        description=f"{what} id: 1-{ID_MAX_LEN} of `A-Z a-z 0-9 _ . -`, not `.` or `..`",
        json_schema_extra={"pattern": ID_JSON_PATTERN, "minLength": 1, "maxLength": ID_MAX_LEN},
    )


DestPath = _id_path("destination")
ClientPath = _id_path("client")
SnapshotPath = _id_path("snapshot (`s1`, `s2`, ... or `initial`)")
BatchPath = Path(ge=0, le=2**63 - 1, description="batch id")
LayoutQuery = Query("rows", description=m.LAYOUT_DOC)
TimeoutQuery = Query(0, ge=0, le=m.MAX_TIMEOUT_MS, description="wait for a re-read")
