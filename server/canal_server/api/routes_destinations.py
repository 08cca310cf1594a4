"""The routes of one destination's client: ``/v1/destinations/{d}/clients/{c}/...``.

Each reads its body (if any), runs one EmbeddedServer call on the destination's leader
(``Lead``) and answers with ``respond`` (the destination's epoch in ``X-Canal-Epoch``).
"""

from __future__ import annotations

import enum

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from canal_protocol.positions import LogPosition
from canal_server.api import models as m
from canal_server.api.deps import Lead, check_token, read_body
from canal_server.api.openapi import (
    DEST_ERRORS,
    BatchPath,
    LayoutQuery,
    TimeoutQuery,
    answers,
    body_doc,
)
from canal_server.api.poll import poll_batch, poll_refetch
from canal_server.api.responses import respond
from canal_server.embedded import Start

__all__ = ["router"]

BASE = "/v1/destinations/{destination}/clients/{client_id}"
_TAGS: list[str | enum.Enum] = ["destinations"]

router = APIRouter(prefix=BASE, tags=_TAGS, dependencies=[Depends(check_token)])


def _start_of(start: str | m.PositionIn) -> Start:
    if isinstance(start, m.PositionIn):
        return LogPosition.from_dict(start.model_dump())
    return "earliest" if start == "earliest" else "latest"


@router.put(
    "/subscription",
    responses=answers(m.SubscriptionOut, *DEST_ERRORS, body=True),
    openapi_extra=body_doc(m.SubscriptionRequest, False),
)
async def subscribe(request: Request, lead: Lead) -> Response:
    """Subscribe (idempotent; a new filter replaces the old one). A new subscription
    starts at `start` (default `latest`); a re-subscribe keeps the cursor."""
    body = await read_body(request, m.SubscriptionRequest)
    start, client = _start_of(body.start), lead.client_id
    sub, epoch = await lead.call(lambda s: s.subscribe(client, body.filter, start))
    out = {
        "destination": lead.destination,
        "client_id": client,
        "filter": body.filter,
        "cursor": sub.cursor.to_dict() if sub.cursor is not None else None,
        "created": sub.created,
    }
    return respond(request, out, epoch=epoch)


@router.delete("/subscription", responses=answers(m.UnsubscribeOut, *DEST_ERRORS))
async def unsubscribe(request: Request, lead: Lead) -> Response:
    """Unsubscribe: forget the client's cursor and batches (idempotent)."""
    _, epoch = await lead.call(lambda s: s.unsubscribe(lead.client_id))
    out = {"destination": lead.destination, "client_id": lead.client_id, "subscribed": False}
    return respond(request, out, epoch=epoch)


@router.post(
    "/batches",
    responses=answers(
        m.BatchOut, *DEST_ERRORS, 409, body=True,
        description="a batch; `{id: -1, entries: []}` when nothing arrived",
    ),
    openapi_extra=body_doc(m.BatchRequest, False),
)  # fmt: skip
async def get_batch(request: Request, lead: Lead) -> Response:
    """getWithoutAck (long poll up to timeout_ms); `auto_ack: true` is Canal's get. A retry
    with the same `request_id` answers the batch its first attempt took. `ack: <batch id>`
    acknowledges a processed batch before taking the next (one round trip less). 503
    `overloaded` (at once) when `node.max_long_polls` polls wait already."""
    body = await read_body(request, m.BatchRequest)
    batch, epoch = await poll_batch(request.app.state.polls, lead, body)
    return respond(request, batch, epoch=epoch, layout=body.layout)


@router.get("/batches/{batch_id}", responses=answers(m.BatchOut, *DEST_ERRORS, 409))
async def refetch(
    request: Request,
    lead: Lead,
    batch_id: int = BatchPath,
    timeout_ms: int = TimeoutQuery,
    layout: m.Layout = LayoutQuery,
) -> Response:
    """The same outstanding batch again (404 once acked or rolled back)."""
    polls = request.app.state.polls
    batch, epoch = await poll_refetch(polls, lead, batch_id, timeout_ms / 1000)
    return respond(request, batch, epoch=epoch, layout=layout)


@router.post("/batches/{batch_id}/ack", responses=answers(m.AckOut, *DEST_ERRORS, 409))
async def ack(request: Request, lead: Lead, batch_id: int = BatchPath) -> Response:
    """Ack every outstanding batch <= batch_id (409 if batch_id is not outstanding)."""
    _, epoch = await lead.call(lambda s: s.ack(lead.client_id, batch_id))
    return respond(request, {"acked": batch_id}, epoch=epoch)


@router.post("/batches/{batch_id}/rollback", responses=answers(m.RollbackOut, *DEST_ERRORS, 409))
async def rollback_one(request: Request, lead: Lead, batch_id: int = BatchPath) -> Response:
    """Roll back batch_id and every later outstanding batch."""
    _, epoch = await lead.call(lambda s: s.rollback(lead.client_id, batch_id))
    return respond(request, {"rolled_back": batch_id}, epoch=epoch)


@router.post("/rollback", responses=answers(m.RollbackOut, *DEST_ERRORS, 409))
async def rollback_all(request: Request, lead: Lead) -> Response:
    """Roll back every outstanding batch (a no-op for a client not subscribed)."""
    _, epoch = await lead.call(lambda s: s.rollback(lead.client_id))
    return respond(request, {"rolled_back": None}, epoch=epoch)


@router.get("/cursor", responses=answers(m.CursorOut, *DEST_ERRORS, 409))
async def cursor(request: Request, lead: Lead) -> Response:
    """The client's position: its last ack, or where its subscription started."""
    pos, epoch = await lead.call(lambda s: s.cursor(lead.client_id))
    out = {"cursor": pos.to_dict() if pos is not None else None}
    return respond(request, out, epoch=epoch)


@router.post(
    "/cursor",
    responses=answers(
        m.CursorOut, *DEST_ERRORS, 409, description="the cursor after the move", body=True
    ),
    openapi_extra=body_doc(m.CursorRequest, True),
)
async def move_cursor(request: Request, lead: Lead) -> Response:
    """Commit through an entry: drop every outstanding batch, then move the cursor forward
    through the stored entry starting at `logfile`:`offset` (never backwards)."""
    body = await read_body(request, m.CursorRequest)
    client = lead.client_id
    pos, epoch = await lead.call(lambda s: s.move_cursor(client, body.logfile, body.offset))
    out = {"cursor": pos.to_dict() if pos is not None else None}
    return respond(request, out, epoch=epoch)
