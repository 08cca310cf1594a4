"""Node-wide routes: ``/v1/health``, ``/v1/cluster``, ``/metrics``."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from canal_protocol.errors import CoordinationError
from canal_server.api import models as m
from canal_server.api.deps import check_token, in_thread, node_of
from canal_server.api.errors import api_error_of
from canal_server.api.openapi import answers
from canal_server.api.responses import respond
from canal_server.metrics import CONTENT_TYPE

__all__ = ["router"]

router = APIRouter(tags=["node"])


@router.get("/v1/health", responses=answers(m.HealthOut))
async def health(request: Request) -> Response:
    """Node id, its row decoder and whether etcd answers; per destination: role,
    epoch, leader, the reader's state or error, where the reader is, (on the leader)
    where the source's binlog ends, and whether the database answers."""
    # asks etcd and the databases: off the event loop, apart from the long polls' limiter
    return respond(request, await anyio.to_thread.run_sync(node_of(request).health))


@router.get(
    "/v1/cluster", responses=answers(m.ClusterOut, 401, 503), dependencies=[Depends(check_token)]
)
async def cluster(request: Request) -> Response:
    """Nodes and destination leaders as etcd has them."""
    try:
        data = await in_thread(request, node_of(request).cluster)
    except CoordinationError as exc:
        err = api_error_of(exc)
        assert err is not None
        raise err from None
    return respond(request, data)


@router.get(
    "/metrics",
    responses={200: {"description": "Prometheus text", "content": {CONTENT_TYPE: {}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this node."""
    return Response(node_of(request).metrics.render(), media_type=CONTENT_TYPE)
