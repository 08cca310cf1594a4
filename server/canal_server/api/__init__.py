"""The REST pull API of API.md as a FastAPI app: ``create_app(node)``.

Modules: ``app`` (``create_app``: the app, its routers, handlers and middleware),
``routes_node`` / ``routes_destinations`` / ``routes_docs`` (the routes, as APIRouters),
``deps`` (the bearer-token check, the leader lookup of a destination route, request
bodies, worker threads), ``responses`` (the one response helper: JSON or msgpack, with
``X-Canal-Epoch``), ``errors`` (``ApiError`` and the exception tree → status codes),
``encoding`` (JSON / msgpack), ``openapi`` (documented responses and parameters),
``models`` (request and response models), ``lane`` (the get's express lane: the usual
``POST .../batches`` served without FastAPI's routing and dependency layers).
"""

from canal_server.api.app import create_app
from canal_server.api.encoding import MSGPACK
from canal_server.api.errors import ApiError

__all__ = ["MSGPACK", "ApiError", "create_app"]
