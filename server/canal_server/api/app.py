"""The REST pull API of API.md as a FastAPI app: ``create_app(node)``.

* JSON by default, msgpack with ``Accept: application/msgpack`` (request bodies too,
  with ``Content-Type: application/msgpack``); bytes stay bytes in msgpack and are
  base64 in JSON.
* Destination routes answer only on the destination's leader: a standby answers 307
  (``Location`` = the same path on the leader, ``X-Canal-Leader``); 503 with
  ``Retry-After`` while no leader is known, the node is fenced or still starting.
* Every response carries ``X-Canal-Epoch`` (the destination's; on node-wide routes
  the highest epoch of the node's destinations).
* Bearer tokens when configured (not for ``/v1/health``, ``/metrics`` and ``/docs``):
  admin tokens (``auth.tokens``, ``auth.admin``) may do everything; consumer tokens
  (``auth.consumer``) only the client routes, of the destinations and client ids they
  are limited to, and the read-only node routes (``access.py``).
* ``/console`` is the web console (``routes_console``): static files of the package,
  fed by ``/v1/console/state``; admin actions through ``/v1/console/actions``.
* ``/docs`` is Swagger UI from the package's own files (``canal_server/static``): it
  works offline; ``/openapi.json`` documents the answers each route really gives.
* Blocking calls run in worker threads (at most ``deps.MAX_THREADS``), never on the
  event loop; a long poll waits on the event loop for its store (``poll``), holding no
  thread, at most ``node.max_long_polls`` at once (one more: 503 ``overloaded``).
* A usual get (``POST .../batches``: a valid body, an allowed token, this node leading)
  takes the express lane (``lane.BatchLane``): the route's own parts without FastAPI's
  routing and dependency layers; every other request, and every refusal, is the
  routes' own.
* Batches in API.md's ``rows`` layout, or with ``layout=compact`` (what the Python
  client asks for) each rows entry's ``columns`` once and ``before``/``after`` value
  lists; compact msgpack batches are joined from the entries' once-made bytes.

Errors are ``{"error": code, "message": ..., "field"?: ..., "leader"?: ...}``:
400 invalid_argument / bad_body, 408 request_timeout (a body slower than
``node.body_timeout_s``), 413 payload_too_large (a body over 64 KiB), 401 unauthorized,
403 forbidden (a consumer token out of its limits or on an admin route), 404
unknown_destination / unknown_batch / unknown_table / unknown_snapshot / not_found, 405
method_not_allowed, 409 not_subscribed / batch_not_outstanding / snapshot_conflict /
handover_failed, 307 not_leader, 503 no_leader / fenced / starting / handing_over /
overloaded / unavailable / source_unavailable / etcd_unavailable / handover_timeout; 500
internal (a bug: ``errors.Guard`` logs it).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from canal_server.api import (
    errors,
    openapi,
    routes_admin,
    routes_console,
    routes_destinations,
    routes_docs,
    routes_node,
    routes_snapshots,
    routes_tables,
)
from canal_server.api.access import Access
from canal_server.api.lane import BatchLane
from canal_server.api.poll import Polls
from canal_server.api.responses import EpochHeader
from canal_server.node import Node

__all__ = ["create_app"]


def create_app(node: Node) -> FastAPI:
    """The API of ``node``."""
    app = FastAPI(
        title="canal-ha",
        version="1",
        description=__doc__,
        docs_url=None,  # routes_docs serves it from the package's own Swagger UI files
        redoc_url=None,  # ReDoc would load its script from a CDN
    )
    app.state.node = node
    app.state.access = Access(node.config.auth)
    app.state.polls = Polls(node.config.node.max_long_polls)
    errors.install(app)
    openapi.install(app)
    app.mount("/static", StaticFiles(directory=routes_docs.STATIC_DIR), name="static")
    app.include_router(routes_docs.router)
    app.include_router(routes_node.router)
    app.include_router(routes_destinations.router)
    app.include_router(routes_tables.router)
    app.include_router(routes_snapshots.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_console.router)
    app.add_middleware(BatchLane, access=app.state.access)  # the get's lane: inside EpochHeader
    app.add_middleware(EpochHeader, node=node)
    app.add_middleware(errors.Guard)  # outermost of ours: what nothing answered is a 500
    return app
