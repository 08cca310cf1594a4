"""The REST pull API of API.md as a FastAPI app: ``create_app(node)``.

Modules: ``app`` (``create_app``: the app, its routers, handlers and middleware),
``routes_node`` / ``routes_destinations`` / ``routes_tables`` / ``routes_snapshots`` /
``routes_admin`` / ``routes_console`` / ``routes_docs`` (the routes, as APIRouters),
``deps`` (the bearer-token check, the leader lookup of a destination route, request
bodies, worker threads), ``poll`` (long polls waiting on the event loop, their limit),
``responses`` (the one response helper: JSON or msgpack, with ``X-Canal-Epoch``),
``errors`` (``ApiError``, the exception tree → status codes, ``Guard``), ``encoding``
(JSON / msgpack), ``openapi`` (the answers each route gives, parameters, the document),
``models`` (request and response models), ``lane`` (the get's express lane: the usual
``POST .../batches`` served without FastAPI's routing and dependency layers),
``transport`` (uvicorn's HTTP protocol with a deadline for a request's head).
"""

from canal_server.api.app import create_app
from canal_server.api.encoding import MSGPACK
from canal_server.api.errors import ApiError

__all__ = ["MSGPACK", "ApiError", "create_app"]
