"""The web console: ``/console`` (a page from the package's own files,
``canal_server/static/console``: no build step, nothing from the network) and its JSON.

* ``GET /v1/console/node``: this node's part (``canal_server.console.node_state``).
* ``GET /v1/console/state``: the whole cluster as this node sees it: the nodes etcd
  knows, each asked for its part (``CONSOLE_PEER_TIMEOUT_S``); ``etcd.reachable`` false
  when this node lost etcd (the page shows a banner).
* ``POST /v1/console/actions``: an admin action (start / cancel a snapshot, roll back a
  client's outstanding batches, step down), forwarded with the caller's bearer token to
  the destination's leader, whose status and answer it returns.

The two reads need no token, like ``/v1/health`` and ``/metrics`` (the page is
read-only without one); the action needs an admin token (401 without a known token,
403 for a consumer token), checked here and again by the leader.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, Response

from canal_protocol.errors import CoordinationError
from canal_server.api import models as m
from canal_server.api.deps import node_of, read_body, require_admin
from canal_server.api.errors import ApiError, unavailable
from canal_server.api.openapi import ERRORS, answers, body_doc
from canal_server.api.responses import respond
from canal_server.api.routes_docs import STATIC_DIR
from canal_server.console import Throughput, merge, node_state
from canal_server.node import Node

__all__ = [
    "CONSOLE_PEER_TIMEOUT_S",
    "FORWARD_TIMEOUT_S",
    "peer_tls",
    "router",
    "throughput_of",
]

router = APIRouter(tags=["console"])
log = logging.getLogger(__name__)

CONSOLE_PEER_TIMEOUT_S = 2.0
FORWARD_TIMEOUT_S = 30.0
CONSOLE_HTML = STATIC_DIR / "console" / "index.html"


def peer_tls(request: Request) -> ssl.SSLContext:
    """How this node verifies the other nodes' HTTPS: the system's CAs (``SSL_CERT_FILE``
    too) and, when the node serves TLS, its own certificate (nodes sharing one)."""
    state = request.app.state
    ctx: ssl.SSLContext | None = getattr(state, "peer_tls", None)
    if ctx is None:
        ctx = ssl.create_default_context()
        cert = node_of(request).config.tls.cert_file
        if cert:
            ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            ctx.load_verify_locations(cafile=cert)
        state.peer_tls = ctx
    return ctx


def throughput_of(request: Request) -> Throughput:
    """The node's rows/s sampler, started on first use."""
    state = request.app.state
    tp: Throughput | None = getattr(state, "throughput", None)
    if tp is None:
        tp = state.throughput = Throughput.of(node_of(request))
    return tp.start()


@router.get("/console", include_in_schema=False)
async def console() -> FileResponse:
    return FileResponse(CONSOLE_HTML, media_type="text/html", headers={"Cache-Control": "no-store"})


@router.get("/v1/console/node", responses=answers(m.ConsoleNodeOut))
async def console_node(request: Request) -> Response:
    """This node's part of the console: health, and per destination the reader's lag,
    rows/s, the leadership changes it saw, and (on the leader) clients and snapshots."""
    node, tp = node_of(request), throughput_of(request)
    return respond(request, await anyio.to_thread.run_sync(lambda: node_state(node, tp)))


async def _peer_parts(
    request: Request, cluster: dict[str, Any] | None, own: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    parts: dict[str, dict[str, Any]] = {own["node"]: own}
    peers = [n for n in (cluster or {}).get("nodes", []) if str(n.get("node")) != own["node"]]
    if not peers:
        return parts
    timeout = httpx.Timeout(CONSOLE_PEER_TIMEOUT_S)
    async with httpx.AsyncClient(
        timeout=timeout, trust_env=False, verify=peer_tls(request)
    ) as http:

        async def ask(peer: dict[str, Any]) -> dict[str, Any]:
            node_id, url = str(peer.get("node")), str(peer.get("url", ""))
            try:
                r = await http.get(f"{url}/v1/console/node")
                r.raise_for_status()
                part: dict[str, Any] = r.json()
                return part
            except (httpx.HTTPError, ValueError) as exc:
                return {"node": node_id, "url": url, "error": f"{type(exc).__name__}: {exc}"}

        for part in await asyncio.gather(*(ask(p) for p in peers)):
            parts[str(part["node"])] = part
    return parts


@router.get("/v1/console/state", responses=answers(m.ConsoleStateOut))
async def console_state(request: Request) -> Response:
    """The whole cluster for the console: nodes (alive = registered in etcd), each
    destination's leader, epoch, reader position, binlog end, lag, rows/s history,
    leadership changes, clients and snapshots; `etcd.reachable` false when this node
    lost etcd (then only what this node knows)."""
    node, tp = node_of(request), throughput_of(request)
    own = await anyio.to_thread.run_sync(lambda: node_state(node, tp))
    cluster: dict[str, Any] | None
    try:
        cluster = await anyio.to_thread.run_sync(node.cluster)
        etcd_error = ""
    except CoordinationError as exc:
        cluster, etcd_error = None, f"{type(exc).__name__}: {exc}"
    parts = await _peer_parts(request, cluster, own)
    return respond(request, merge(own, cluster, parts, etcd_error))


# The leader's status is the action's: its ConsoleActionOut, or this node's own refusal
_ACTION_OR_ERROR = {
    "anyOf": [
        {"$ref": "#/components/schemas/ConsoleActionOut"},
        {"$ref": "#/components/schemas/ErrorBody"},
    ]
}
_ACTION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **answers(m.ConsoleActionOut, description="the leader's answer (its status is this answer's)"),
    201: {
        "model": m.ConsoleActionOut,
        "description": "start_snapshot: the leader's answer (its status is this answer's)",
    },
    **{
        code: {
            "description": f"this node's refusal (`ErrorBody`), or the leader's answer with "
            f"this status (`ConsoleActionOut`): {ERRORS[code]}",
            "content": {"application/json": {"schema": _ACTION_OR_ERROR}},
        }
        for code in (307, 400, 401, 403, 404, 408, 409, 413, 503)
    },
}


def _request_of(body: m.ConsoleActionRequest) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path, json body) of the API call an action is; 400 naming a missing field."""
    base = f"/v1/destinations/{body.destination}"

    def need(field: str) -> str:
        value = getattr(body, field)
        if not value:
            raise ApiError(400, "invalid_argument", f"{body.action} needs {field}", field=field)
        return str(value)

    if body.action == "step_down":
        return "POST", f"{base}/step-down", ({"to": body.to} if body.to else {})
    if body.action == "start_snapshot":
        if not body.tables:
            raise ApiError(400, "invalid_argument", "start_snapshot needs tables", field="tables")
        return "POST", f"{base}/snapshots", {"tables": body.tables}
    if body.action == "cancel_snapshot":
        return "DELETE", f"{base}/snapshots/{need('snapshot_id')}", None
    return "POST", f"{base}/clients/{need('client_id')}/rollback", None


def _leader_url(node: Node, destination: str) -> str:
    view = node.view(destination)  # 404 unknown destination
    if view.serving is not None:
        return node.url
    if view.leader is None or not view.leader.url:
        raise unavailable("no_leader", f"{destination}: no leader is known right now")
    return view.leader.url


@router.post(
    "/v1/console/actions",
    responses=_ACTION_RESPONSES,
    openapi_extra=body_doc(m.ConsoleActionRequest, True),
    dependencies=[Depends(require_admin)],  # every action changes the cluster
)
async def console_action(request: Request) -> Response:
    """Run an admin action on the destination's leader with the caller's token; the
    answer has the leader's status, its URL and its answer (`result`)."""
    body = await read_body(request, m.ConsoleActionRequest)
    method, path, payload = _request_of(body)
    node = node_of(request)
    url = _leader_url(node, body.destination)
    headers = {"Accept": "application/json"}
    if "authorization" in request.headers:
        headers["Authorization"] = request.headers["authorization"]
    try:
        async with httpx.AsyncClient(
            timeout=FORWARD_TIMEOUT_S, trust_env=False, verify=peer_tls(request)
        ) as http:
            r = await http.request(method, url + path, json=payload, headers=headers)
            if r.status_code == 307 and r.headers.get("X-Canal-Leader"):  # it moved meanwhile
                url = r.headers["X-Canal-Leader"]
                r = await http.request(method, url + path, json=payload, headers=headers)
    except httpx.HTTPError as exc:
        raise unavailable(
            "unavailable", f"{body.destination}: the leader at {url} did not answer: {exc}"
        ) from None
    try:
        result: Any = r.json()
    except ValueError:
        result = None
    if not isinstance(result, dict):
        result = {"error": "bad_answer", "message": r.text[:500]}
    log.info(
        "%s: console %s sent to the leader %s (node %s, epoch %d): HTTP %d",
        body.destination, body.action, url, node.id, node.epoch_of(body.destination),
        r.status_code,
    )  # fmt: skip
    out = {"action": body.action, "destination": body.destination, "leader": url,
           "status": r.status_code, "result": result}  # fmt: skip
    return respond(request, out, status=r.status_code)
