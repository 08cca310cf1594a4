"""Run a node: uvicorn serving the API of a ``Node``, with a clean stop on signals.

Before serving, ``access.check_at_start``: etcd and the databases must let the node in
with what it needs (a refusal ends the start naming the key; see ``canal_server.access``).

SIGTERM / SIGINT: stop serving and parsing at once and hand every led destination
over to another node (final meta flush while the epoch still holds; the successor
takes over at once), let uvicorn finish the requests in flight (a few seconds at
most), release what nobody could take, revoke the node lease and exit 0.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from canal_server.access import check_at_start
from canal_server.api import create_app
from canal_server.config import NodeConfig
from canal_server.node import Node

__all__ = ["GRACEFUL_S", "SWITCH_INTERVAL_S", "freeze_startup_objects", "run_node"]

GRACEFUL_S = 3
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms).
# The binlog reader is CPU-bound under load; every request crosses threads (event loop ->
# worker -> event loop) and each crossing waited up to a full interval for the reader:
# 15-20 ms per request, two requests (get, ack) per batch. 1 ms cuts that wait fivefold.
SWITCH_INTERVAL_S = 0.001


class _NodeServer(uvicorn.Server):
    """uvicorn that tells the node to stop serving the moment a signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

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
        http=config.node.http,
        loop=config.node.loop,
    )
    uv = _NodeServer(uv_config, node.begin_leaving)
    node.start()
    freeze_startup_objects()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        uv.run()
    finally:
        node.stop()
    if not uv.started:
        print(f"canal-ha server: could not listen on {config.node.listen}")
        return 1
    return 0
