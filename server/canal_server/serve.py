"""Run a node: uvicorn serving the API of a ``Node`` and, on the same event loop, the
Canal TCP listener (``canal_server.canal``), with a clean stop on signals.

Before serving, ``access.check_at_start``: etcd and the databases must let the node in
with what it needs (a refusal ends the start naming the key; see ``canal_server.access``).

SIGTERM / SIGINT: stop serving and parsing at once and hand every led destination
over to another node (final meta flush while the epoch still holds; the successor
takes over at once), let uvicorn finish the requests in flight (a few seconds at
most), release what nobody could take, revoke the node lease and exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Message

from canal_server.access import check_at_start
from canal_server.api import create_app
from canal_server.api.transport import protocol_class
from canal_server.canal.listener import CanalListener
from canal_server.config import NodeConfig
from canal_server.log_limit import install_log_limit
from canal_server.node import Node

__all__ = [
    "GRACEFUL_S",
    "SWITCH_INTERVAL_S",
    "WARM_UP_PATH",
    "freeze_startup_objects",
    "run_node",
    "warm_routes",
]

log = logging.getLogger(__name__)

GRACEFUL_S = 3
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms).
# The binlog reader is CPU-bound under load; every request crosses threads (event loop ->
# worker -> event loop) and each crossing waited up to a full interval for the reader:
# 15-20 ms per request, two requests (get, ack) per batch. 1 ms cuts that wait fivefold.
SWITCH_INTERVAL_S = 0.001


class _NodeServer(uvicorn.Server):
    """uvicorn that tells the node to stop serving the moment a signal arrives, and runs
    the Canal listener on its loop: bound before the API, closed before it."""

    def __init__(
        self, config: uvicorn.Config, on_exit: Callable[[], None], canal: CanalListener | None
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._canal = canal
        self.canal_failed = ""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self._canal is not None:
            try:
                await self._canal.start()
            except OSError as exc:
                self.canal_failed = f"canal.listen {self._canal.host}:{self._canal.port}: {exc}"
                log.error("could not listen on %s", self.canal_failed)
                self.should_exit = True
                return
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._canal is not None:
            await self._canal.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, minus re-raising the signal afterwards (that would kill the
        process before the node released its leases)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


# a path no route has: the warm-up request walks every router without matching one
WARM_UP_PATH = "/v1/.warm-up"


def warm_routes(app: ASGIApp) -> int:
    """Send one request through ``app`` before it serves, to a path no route has; its
    status (404).

    FastAPI builds each included router's route state (fields, validators) on the first
    request that walks it: 19-27 ms of a node's CPU measured on the first request, ~1 ms
    on the next. Without this the first client of a new leader (its subscribe, a cursor
    read, after a failover) paid it; now startup does, and the state joins the objects
    ``freeze_startup_objects`` sets aside."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": "GET", "scheme": "http", "path": WARM_UP_PATH,
        "raw_path": WARM_UP_PATH.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"host", b"warm-up")], "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0), "state": {},
    }  # fmt: skip
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def request() -> None:
        await app(scope, receive, send)

    asyncio.run(request())
    return next(int(m["status"]) for m in sent if m["type"] == "http.response.start")


def freeze_startup_objects() -> None:
    """Move every object made so far (modules, the app, the config) into the GC's
    permanent generation: a full collection then walks only what came later. Before,
    each gen-2 pass walked every imported module's objects: 50-450 ms pauses of the
    whole node a few times a minute, the tail of commit → client latency."""
    gc.collect()
    gc.freeze()


def run_node(config: NodeConfig) -> int:
    """Start the node, serve until a signal, stop cleanly; the exit code."""
    node = Node(config)
    try:
        check_at_start(config, node.coord)
    except BaseException:
        node.coord.close()
        raise
    app = create_app(node)
    uv_config = uvicorn.Config(
        app,
        host=config.listen_host,
        port=config.listen_port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_S,
        ssl_certfile=config.tls.cert_file or None,
        ssl_keyfile=config.tls.key_file or None,
        lifespan="off",
        http=protocol_class(config.node.http, config.node.header_timeout_s),
        loop=config.node.loop,
    )
    install_log_limit(logging.getLogger("uvicorn"))  # its own handlers: the same limit
    canal = CanalListener(node) if config.canal.enable else None
    uv = _NodeServer(uv_config, node.begin_leaving, canal)
    node.start()
    try:
        warm_routes(app)
    except Exception:  # only the first request's cost is at stake: serve anyway
        log.warning("the routes' warm-up request failed", exc_info=True)
    freeze_startup_objects()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        uv.run()
    finally:
        node.stop()
    if uv.canal_failed:
        print(f"canal-ha server: could not listen on {uv.canal_failed}")
        return 1
    if not uv.started:
        print(f"canal-ha server: could not listen on {config.node.listen}")
        return 1
    return 0
