"""Admin routes: ``POST /v1/destinations/{destination}/step-down`` (graceful handover).

The destination's leader stops serving, flushes its meta a last time and hands the
destination over to the node named in the body (``to``), else to the live node that
leads the fewest destinations; the answer comes once the successor leads. On any other
node the route answers 307 to the leader (like the client routes), 503 while none is
known.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from canal_protocol.errors import CoordinationError, HandoverFailed, HandoverTimeout
from canal_server.api import models as m
from canal_server.api.deps import DestLead, in_thread, node_of, read_body, require_admin
from canal_server.api.errors import ApiError, api_error_of, unavailable
from canal_server.api.openapi import DEST_ERRORS, answers, body_doc
from canal_server.api.responses import respond

__all__ = ["router"]

router = APIRouter(tags=["admin"])

_RESPONSES = {
    **answers(m.StepDownOut, *DEST_ERRORS, body=True, description="the successor leads"),
    409: {"model": m.ErrorBody, "description": "`handover_failed`: no other node can take it"},
    503: {
        "model": m.ErrorBody,
        "description": "no leader known, or `handover_timeout`: handed over, but the successor "
        "did not lead within `timeout_ms` (the handover expires and the other nodes campaign)",
    },
}


@router.post(
    "/v1/destinations/{destination}/step-down",
    responses=_RESPONSES,
    openapi_extra=body_doc(m.StepDownRequest, False),
    dependencies=[Depends(require_admin)],  # a step-down changes the cluster: admin tokens only
)
async def step_down(request: Request, lead: DestLead) -> Response:
    """Graceful handover: the leader stops serving, flushes its meta, and the chosen
    node takes over at once (no TTL, no switch delay); clients follow it."""
    body = await read_body(request, m.StepDownRequest)
    lead.leader()  # 307 to the leader, or 503
    node, destination = node_of(request), lead.destination
    try:
        out = await in_thread(
            request, lambda: node.step_down(destination, body.to, body.timeout_ms / 1000)
        )
    except HandoverTimeout as exc:
        raise unavailable("handover_timeout", str(exc)) from None
    except HandoverFailed as exc:
        raise ApiError(409, "handover_failed", str(exc)) from None
    except CoordinationError as exc:
        err = api_error_of(exc, destination)
        assert err is not None
        raise err from None
    return respond(request, out, epoch=int(out["new_epoch"]))
