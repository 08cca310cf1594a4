"""The routes of incremental snapshots (docs/snapshot.md; docs/api.md, "Snapshots"):

* ``POST   /v1/destinations/{d}/snapshots``       start one: ``{"tables": [regex, ...],
  "chunk_rows"?: n}`` → 201 and its progress
* ``GET    /v1/destinations/{d}/snapshots``       every snapshot the destination keeps
* ``GET    /v1/destinations/{d}/snapshots/{id}``  one snapshot's progress
* ``DELETE /v1/destinations/{d}/snapshots/{id}``  cancel it

Snapshots change the cluster: admin tokens only. Like every destination route they
answer on the leader (``DestLead``: a standby answers 307), ids are checked first (400
naming ``destination`` or ``snapshot_id``), and every call runs in the app's worker
threads (``LeaderLookup.call``). Errors (``errors.api_error_of``) name the field: 400
``invalid_argument`` (a bad regex, a table outside the filter, without a key, not
InnoDB), 404 ``unknown_table`` / ``unknown_snapshot``, 409 ``snapshot_conflict`` (a
table already in a snapshot that runs; cancel of an ended one), 503
``source_unavailable`` (the database did not answer) or ``fenced`` (the term ended).
"""

from __future__ import annotations

import enum

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from canal_protocol.ids import validate_id
from canal_server.api import models as m
from canal_server.api.deps import DestLead, node_of, read_body, require_admin
from canal_server.api.openapi import DEST_ERRORS, SnapshotPath, answers, body_doc
from canal_server.api.responses import respond
from canal_server.snapshot import Snapshots

__all__ = ["router"]

_TAGS: list[str | enum.Enum] = ["snapshots"]
router = APIRouter(
    prefix="/v1/destinations/{destination}/snapshots",
    tags=_TAGS,
    dependencies=[Depends(require_admin)],
)


def _snapshots(request: Request, lead: DestLead) -> Snapshots:
    return node_of(request).instance(lead.destination).snapshots


@router.post(
    "",
    status_code=201,
    responses=answers(m.SnapshotOut, *DEST_ERRORS, 409, status=201, body=True),
    openapi_extra=body_doc(m.SnapshotRequest, True),
)
async def start(request: Request, lead: DestLead) -> Response:
    """Start an incremental snapshot of the matching tables (READ entries in the stream)."""
    body = await read_body(request, m.SnapshotRequest)
    s = _snapshots(request, lead)
    out, epoch = await lead.call(lambda _server: s.create(body.tables, body.chunk_rows))
    return respond(request, out, epoch=epoch, status=201)


@router.get("", responses=answers(m.SnapshotListOut, *DEST_ERRORS))
async def list_all(request: Request, lead: DestLead) -> Response:
    """Every snapshot the destination keeps (the running ones and the last 20 ended)."""
    s = _snapshots(request, lead)
    runs, epoch = await lead.call(lambda _server: s.runs())
    return respond(request, {"snapshots": runs}, epoch=epoch)


@router.get("/{snapshot_id}", responses=answers(m.SnapshotOut, *DEST_ERRORS))
async def one(request: Request, lead: DestLead, snapshot_id: str = SnapshotPath) -> Response:
    """One snapshot's progress."""
    validate_id(snapshot_id, "snapshot_id")
    s = _snapshots(request, lead)
    out, epoch = await lead.call(lambda _server: s.get(snapshot_id))
    return respond(request, out, epoch=epoch)


@router.delete("/{snapshot_id}", responses=answers(m.SnapshotOut, *DEST_ERRORS, 409))
async def cancel(request: Request, lead: DestLead, snapshot_id: str = SnapshotPath) -> Response:
    """Cancel a snapshot that has not ended (409 once it has)."""
    validate_id(snapshot_id, "snapshot_id")
    s = _snapshots(request, lead)
    out, epoch = await lead.call(lambda _server: s.cancel(snapshot_id))
    return respond(request, out, epoch=epoch)
