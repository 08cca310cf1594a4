"""The Canal TCP listener of a node: ``canal.listen``, one ``Session`` per connection.

It runs on the node's event loop, the one uvicorn serves the REST API on (``serve``
starts it before the API and closes it first). One loop for both: the usual get, a
batch that is there already, is answered on the loop without a hop to a thread and
back (as the REST get's lane does), and each blocking call of the embedded server (a
wait for entries, an ack, a subscribe that writes to etcd) runs in a worker thread of
the listener's own pool (``MAX_THREADS``), so neither protocol can stall the other's
loop behind a blocking call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from canal_protocol.entry import Entry
from canal_server.canal.auth import CanalUser
from canal_server.canal.convert import encode_entries
from canal_server.canal.session import Context, Session
from canal_server.node import Node

__all__ = ["MAX_THREADS", "CanalListener"]

log = logging.getLogger(__name__)

MAX_THREADS = 256  # Canal calls waiting in worker threads at once (long polls), per node


class CanalListener:
    """``start()`` binds ``canal.listen`` (OSError when it cannot); ``close()`` stops
    accepting and ends every session."""

    def __init__(
        self,
        node: Node,
        encode: Callable[[Sequence[Entry]], list[bytes]] = encode_entries,
    ) -> None:
        section = node.config.canal
        self.host, self.port = section.host, section.port
        self._executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="canal")
        self._ctx = Context(node, CanalUser.of(section), self._executor, encode)
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """``host:port`` bound (the actual port when ``canal.listen`` asked for 0)."""
        if self._server is not None and self._server.sockets:
            host, port = self._server.sockets[0].getsockname()[:2]
            return f"{host}:{port}"
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        log.info("canal listener on %s", self.address)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._sessions):
            task.cancel()
        if self._sessions:
            await asyncio.gather(*self._sessions, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            await Session(self._ctx, reader, writer).run()
        except asyncio.CancelledError:
            writer.close()
            raise
        except Exception:  # one session's bug must never reach the loop or other sessions
            log.exception("canal session %s failed", writer.get_extra_info("peername"))
            writer.close()
        finally:
            self._sessions.discard(task)
