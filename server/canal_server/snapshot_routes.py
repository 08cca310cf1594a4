"""REST routes of incremental snapshots (docs/api.md, "Snapshots"), added to the app by
``add_snapshot_routes(app, node, parts)``:

* ``POST   /v1/destinations/{d}/snapshots``       start one: ``{"tables": [regex, ...],
  "chunk_rows"?: n}`` → 201 and its progress
* ``GET    /v1/destinations/{d}/snapshots``       every snapshot the destination keeps
* ``GET    /v1/destinations/{d}/snapshots/{id}``  one snapshot's progress
* ``DELETE /v1/destinations/{d}/snapshots/{id}``  cancel it

Only the destination's leader answers (a standby redirects, like every destination
route). Errors name the field: 400 ``invalid_argument`` (a bad regex, a table outside the
filter, without a key, not InnoDB), 404 ``unknown_table`` / ``unknown_snapshot``, 409
``snapshot_conflict`` (a table already in a snapshot that runs; cancel of an ended one).
The API's own helpers (auth, leader lookup, encoding, body reading) come in ``parts``,
so this module depends on none of the API's internals.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import MySQLdb
from fastapi import Depends, FastAPI, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from canal_protocol.errors import SnapshotConflict, StoreClosed, UnknownSnapshot, UnknownTable
from canal_server.node import Node
from canal_server.snapshot import Snapshots

__all__ = [
    "SnapshotListOut",
    "SnapshotOut",
    "SnapshotRequest",
    "SnapshotRouteParts",
    "TableProgressOut",
    "add_snapshot_routes",
]

M = TypeVar("M", bound=BaseModel)
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tables: list[str] = Field(
        min_length=1,
        max_length=256,
        description="regexes matched against the whole `schema.table` (case-insensitive); "
        "every table must be InnoDB, inside the destination's filter, with a primary key "
        "or a unique key of NOT NULL columns",
    )
    chunk_rows: int | None = Field(
        default=None, ge=1, le=1_000_000, description="rows per chunk (default: the config's)"
    )


class TableProgressOut(BaseModel):
    table: str
    done: bool
    rows: int = Field(description="rows read into the stream (re-read chunks count again)")
    chunks: int
    last_key: list[Any] | None = Field(description="the last key read (bytes as {b64})")
    note: str = Field(description='"dropped" when the table went away during the snapshot')


class SnapshotOut(BaseModel):
    id: str
    state: str = Field(description="pending, running, done, cancelled or failed")
    tables: list[TableProgressOut]
    tables_done: int
    tables_total: int
    rows: int
    chunks: int
    rows_per_s: float = Field(
        description="running: since this leader took the snapshot up; done: over its run"
    )
    chunk_rows: int
    created_ms: int
    started_ms: int
    finished_ms: int
    error: str


class SnapshotListOut(BaseModel):
    snapshots: list[SnapshotOut]


@dataclass(frozen=True)
class SnapshotRouteParts:
    """The API's helpers the routes use: the bearer-token dependency, the leader lookup
    (raises the 307/503 answers when this node does not lead ``d``), the JSON/msgpack
    encoder and the body reader (400 naming the field)."""

    check_token: Callable[..., Any]  # a FastAPI dependency (sync or async)
    leader_of: Callable[[Request, str, str | None], object]
    encode: Callable[..., Response]
    read_body: Callable[[Request, type[M]], Awaitable[M]]


def _doc(model: type[BaseModel], status: int = 200) -> dict[int | str, dict[str, Any]]:
    return {
        status: {
            "model": model,
            "description": "JSON, or msgpack with `Accept: application/msgpack`",
        }
    }


def add_snapshot_routes(app: FastAPI, node: Node, parts: SnapshotRouteParts) -> None:
    """Add the snapshot routes and the answers of their errors to ``app``."""
    base = "/v1/destinations/{destination}/snapshots"
    deps = [Depends(parts.check_token)]
    tags: list[Any] = ["snapshots"]
    dest_path = Path(description="destination id [A-Za-z0-9_.-]{1,64}")
    id_path = Path(description="snapshot id (`s1`, `s2`, ... or `initial`)")

    def snapshots(request: Request, destination: str) -> Snapshots:
        parts.leader_of(request, destination, None)
        return node.instance(destination).snapshots

    def error(
        request: Request, status: int, code: str, exc: Exception, field: str | None
    ) -> Response:
        body: dict[str, Any] = {"error": code, "message": str(exc)}
        if field is not None:
            body["field"] = field
        return parts.encode(request, body, status)

    @app.exception_handler(UnknownSnapshot)
    async def unknown_snapshot(request: Request, exc: UnknownSnapshot) -> Response:
        return error(request, 404, "unknown_snapshot", exc, "snapshot_id")

    @app.exception_handler(UnknownTable)
    async def unknown_table(request: Request, exc: UnknownTable) -> Response:
        return error(request, 404, "unknown_table", exc, exc.field)

    @app.exception_handler(SnapshotConflict)
    async def conflict(request: Request, exc: SnapshotConflict) -> Response:
        return error(request, 409, "snapshot_conflict", exc, exc.field)

    async def run(fn: Callable[[], Any]) -> Any:
        try:
            return await anyio.to_thread.run_sync(fn)
        except StoreClosed as exc:  # the term ended meanwhile
            body = {"error": "fenced", "message": str(exc)}
            raise _Answer(503, body, {"Retry-After": "1"}) from None
        except MySQLdb.Error as exc:  # the source database did not answer
            body = {"error": "source_unavailable", "message": f"the database: {exc}"}
            raise _Answer(503, body, {"Retry-After": "2"}) from None

    @app.exception_handler(_Answer)
    async def answer(request: Request, exc: _Answer) -> Response:
        return parts.encode(request, exc.body, exc.status, exc.headers)

    @app.post(
        base, status_code=201, responses=_doc(SnapshotOut, 201), dependencies=deps, tags=tags,
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": SnapshotRequest.model_json_schema()}}}},
    )  # fmt: skip
    async def start(request: Request, destination: str = dest_path) -> Response:
        """Start an incremental snapshot of the matching tables (READ entries in the stream)."""
        body = await parts.read_body(request, SnapshotRequest)
        s = snapshots(request, destination)
        out = await run(lambda: s.create(body.tables, body.chunk_rows))
        return parts.encode(request, out, 201)

    @app.get(base, responses=_doc(SnapshotListOut), dependencies=deps, tags=tags)
    async def list_all(request: Request, destination: str = dest_path) -> Response:
        """Every snapshot the destination keeps (the running ones and the last 20 ended)."""
        s = snapshots(request, destination)
        return parts.encode(request, {"snapshots": s.runs()})

    @app.get(f"{base}/{{snapshot_id}}", responses=_doc(SnapshotOut), dependencies=deps, tags=tags)
    async def one(
        request: Request, destination: str = dest_path, snapshot_id: str = id_path
    ) -> Response:
        """One snapshot's progress."""
        s = snapshots(request, destination)
        return parts.encode(request, s.get(_checked(snapshot_id)))

    @app.delete(
        f"{base}/{{snapshot_id}}", responses=_doc(SnapshotOut), dependencies=deps, tags=tags
    )
    async def cancel(
        request: Request, destination: str = dest_path, snapshot_id: str = id_path
    ) -> Response:
        """Cancel a snapshot that has not ended (409 once it has)."""
        s = snapshots(request, destination)
        out = await run(lambda: s.cancel(_checked(snapshot_id)))
        return parts.encode(request, out)


def _checked(snapshot_id: str) -> str:
    if _ID.fullmatch(snapshot_id) is None:
        raise UnknownSnapshot(f"no snapshot {snapshot_id!r}")
    return snapshot_id


class _Answer(Exception):
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(body.get("message", ""))
        self.status, self.body, self.headers = status, body, headers
