"""The routes of one destination's client: ``/v1/destinations/{d}/clients/{c}/...``.

Each reads its body (if any), runs one EmbeddedServer call on the destination's leader
(``Lead``) and answers with ``respond`` (the destination's epoch in ``X-Canal-Epoch``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from canal_protocol.positions import LogPosition
from canal_server.api import models as m
from canal_server.api.deps import Lead, check_token, read_body
from canal_server.api.openapi import BatchPath, LayoutQuery, TimeoutQuery, body_doc, ok
from canal_server.api.responses import respond
from canal_server.embedded import EmbeddedServer, Start

__all__ = ["router", "taker"]

BASE = "/v1/destinations/{destination}/clients/{client_id}"
_TAGS: list[str | enum.Enum] = ["destinations"]

router = APIRouter(prefix=BASE, tags=_TAGS, dependencies=[Depends(check_token)])


def _start_of(start: str | m.PositionIn) -> Start:
    if isinstance(start, m.PositionIn):
        return LogPosition.from_dict(start.model_dump())
    return "earliest" if start == "earliest" else "latest"


@router.put(
    "/subscription",
    responses=ok(m.SubscriptionOut),
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


@router.delete("/subscription", responses=ok(m.UnsubscribeOut))
async def unsubscribe(request: Request, lead: Lead) -> Response:
    """Unsubscribe: forget the client's cursor and batches (idempotent)."""
    _, epoch = await lead.call(lambda s: s.unsubscribe(lead.client_id))
    out = {"destination": lead.destination, "client_id": lead.client_id, "subscribed": False}
    return respond(request, out, epoch=epoch)


@router.post(
    "/batches",
    responses=ok(m.BatchOut, "a batch; `{id: -1, entries: []}` when nothing arrived"),
    openapi_extra=body_doc(m.BatchRequest, False),
)
async def get_batch(request: Request, lead: Lead) -> Response:
    """getWithoutAck (long poll up to timeout_ms); `auto_ack: true` is Canal's get. A retry
    with the same `request_id` answers the batch its first attempt took. `ack: <batch id>`
    acknowledges a processed batch before taking the next (one round trip less)."""
    body = await read_body(request, m.BatchRequest)
    batch, epoch = await lead.call(taker(lead.client_id, body))
    return respond(request, batch, epoch=epoch, layout=body.layout)


def taker(client: str, body: m.BatchRequest) -> Callable[[EmbeddedServer], Any]:
    """The get ``body`` asks of ``client``'s leader (the route's and ``lane``'s)."""
    timeout_s, rid = body.timeout_ms / 1000, body.request_id

    def take(s: EmbeddedServer) -> Any:
        if body.auto_ack:
            return s.get(client, body.size, timeout_s, rid, body.ack)
        return s.get_without_ack(client, body.size, timeout_s, rid, body.ack)

    return take


@router.get("/batches/{batch_id}", responses=ok(m.BatchOut))
async def refetch(
    request: Request,
    lead: Lead,
    batch_id: int = BatchPath,
    timeout_ms: int = TimeoutQuery,
    layout: m.Layout = LayoutQuery,
) -> Response:
    """The same outstanding batch again (404 once acked or rolled back)."""
    client = lead.client_id
    batch, epoch = await lead.call(
        lambda s: s.get_batch(client, batch_id, timeout_ms / 1000), "get"
    )
    return respond(request, batch, epoch=epoch, layout=layout)


@router.post("/batches/{batch_id}/ack", responses=ok(m.AckOut))
async def ack(request: Request, lead: Lead, batch_id: int = BatchPath) -> Response:
    """Ack every outstanding batch <= batch_id (409 if batch_id is not outstanding)."""
    _, epoch = await lead.call(lambda s: s.ack(lead.client_id, batch_id))
    return respond(request, {"acked": batch_id}, epoch=epoch)


@router.post("/batches/{batch_id}/rollback", responses=ok(m.RollbackOut))
async def rollback_one(request: Request, lead: Lead, batch_id: int = BatchPath) -> Response:
    """Roll back batch_id and every later outstanding batch."""
    _, epoch = await lead.call(lambda s: s.rollback(lead.client_id, batch_id))
    return respond(request, {"rolled_back": batch_id}, epoch=epoch)


@router.post("/rollback", responses=ok(m.RollbackOut))
async def rollback_all(request: Request, lead: Lead) -> Response:
    """Roll back every outstanding batch (a no-op for a client not subscribed)."""
    _, epoch = await lead.call(lambda s: s.rollback(lead.client_id))
    return respond(request, {"rolled_back": None}, epoch=epoch)


@router.get("/cursor", responses=ok(m.CursorOut))
async def cursor(request: Request, lead: Lead) -> Response:
    """The client's position: its last ack, or where its subscription started."""
    pos, epoch = await lead.call(lambda s: s.cursor(lead.client_id))
    out = {"cursor": pos.to_dict() if pos is not None else None}
    return respond(request, out, epoch=epoch)


@router.post(
    "/cursor",
    responses=ok(m.CursorOut, "the cursor after the move"),
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
