"""A session's calls on the embedded server of its destination, on the node that leads it.

``Served`` holds the leadership term that bound the session (``Instance.serving()``'s
server and epoch): ``check()`` raises ``TermEnded`` as soon as the instance no longer
serves that epoch (fenced, deposed, handed over), the check the REST API makes, so a
session never outlives its term.

A GET: a batch that is in the store already is taken on the event loop (no hop to a
worker thread and back); a wait for entries runs in a worker thread. A small batch (up
to ``LOOP_ROWS`` rows and entries) is encoded on the loop, a larger one in a worker
thread: Canal's protobuf costs the node tens of microseconds a row, which must never
hold the loop the REST API and the other sessions share.

**A batch taken ahead.** When a GET's batch was full (``fetch_size`` entries: the
client is behind), the next batch is taken (``get_without_ack``, no wait) and encoded
in a worker thread while the client reads this one: the node's encoding overlaps the
client's parsing. The client's next GET with the same ``fetch_size`` gets it; any other
packet first rolls it back (``rollback(client, id)``: the client never saw it), except a
CLIENTACK of a batch before it. Until then it is one more outstanding batch of the
client, like one whose answer was lost: rolled back when the client reconnects (Canal's
clients roll back on connect), never lost, never given twice in one session. GETs with
``auto_ack`` never take ahead (that would ack a batch the client has not seen).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

from canal_protocol.batch import Batch
from canal_protocol.canal import packet_pb2 as pb
from canal_protocol.entry import Entry
from canal_protocol.errors import CanalError, ServerError
from canal_server.canal import wire
from canal_server.embedded import EmbeddedServer
from canal_server.instance import Instance

__all__ = [
    "DEFAULT_FETCH_SIZE",
    "LOOP_ROWS",
    "WAIT_ROUND_S",
    "NotFirst",
    "Served",
    "TermEnded",
    "ack_in_order",
    "rollback_in_order",
    "wait_of",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_FETCH_SIZE = 1000  # a GET's fetch_size <= 0 (the Java client's own default)
WAIT_ROUND_S = 30.0  # a GET with timeout 0 waits in rounds of this (the term checked)
LOOP_ROWS = 64  # a batch of at most this many rows + entries is encoded on the event loop
_UNITS_S = (1e-9, 1e-6, 1e-3, 1.0, 60.0, 3600.0, 86400.0)  # TimeUnit ordinals


class TermEnded(Exception):
    """The leadership term that serves the session ended: the session ends."""


class NotFirst(ServerError):
    """Canal's ordering rule: a CLIENTACK or CLIENTROLLBACK of one batch must name the
    first outstanding one (Canal's ``MemoryClientIdentityBatch.removePositionRange``)."""


def _first_only(server: EmbeddedServer, client: str, batch_id: int) -> None:
    """``NotFirst`` when ``batch_id`` is outstanding but not the client's first
    outstanding batch (Canal refuses those; canal-ha's own ack is cumulative)."""
    ids = [bid for bid, _ in server.meta.batches(client)]
    if batch_id in ids and batch_id != ids[0]:
        raise NotFirst(f"batchId:{batch_id} is not the firstly:{ids[0]}")


def ack_in_order(server: EmbeddedServer, client: str, batch_id: int) -> None:
    """CLIENTACK: Canal's ordering rule, then the embedded server's ack."""
    _first_only(server, client, batch_id)
    server.ack(client, batch_id)


def rollback_in_order(server: EmbeddedServer, client: str, batch_id: int) -> None:
    """CLIENTROLLBACK of batch ``batch_id`` (0: every outstanding batch), with Canal's
    ordering rule for one batch."""
    if batch_id:
        _first_only(server, client, batch_id)
    server.rollback(client, batch_id or None)


def wait_of(get: pb.Get) -> float | None:
    """How long a GET may wait, in seconds: None = not at all (timeout -1 or absent,
    any negative), 0 = until something arrives."""
    if not get.HasField("timeout") or get.timeout < 0:
        return None
    unit = get.unit if get.HasField("unit") and 0 <= get.unit < len(_UNITS_S) else 2
    return get.timeout * _UNITS_S[unit]


@dataclass
class _Ahead:
    """The batch taken ahead for ``client``'s next GET of ``size`` (None: nothing was
    there), with its MESSAGES frame."""

    client: str
    size: int
    taking: asyncio.Future[tuple[Batch, bytes] | None]


class Served:
    """The term serving one session (module doc)."""

    def __init__(
        self,
        node_id: str,
        inst: Instance,
        serving: tuple[EmbeddedServer, int],
        executor: Executor,
        encode: Callable[[Sequence[Entry]], list[bytes]],
    ) -> None:
        self.node_id, self.inst = node_id, inst
        self.server, self.epoch = serving
        self._executor = executor
        self._encode = encode
        self._ahead: _Ahead | None = None

    def check(self) -> None:
        """TermEnded once the instance no longer serves this term's epoch."""
        serving = self.inst.serving()
        if serving is None or serving[1] != self.epoch:
            raise TermEnded(
                f"{self.inst.name}: node {self.node_id} no longer leads it (epoch {self.epoch} "
                "ended)"
            )

    async def _thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def call(self, fn: Callable[[EmbeddedServer], T]) -> T:
        """``fn(server)`` in a worker thread; the term checked before and after."""
        self.check()
        server = self.server
        try:
            return await self._thread(lambda: fn(server))
        finally:
            self.check()

    # -- GET --------------------------------------------------------------------------------

    def _frame(self, batch: Batch) -> bytes:
        items = self._encode(batch.entries) if not batch.is_empty else []
        return wire.messages_frame(batch.id, items)

    async def get(self, client: str, get: pb.Get) -> bytes:
        """The GET's MESSAGES frame; CanalError when the server refuses it."""
        self.check()
        server = self.server
        size = get.fetch_size if get.fetch_size > 0 else DEFAULT_FETCH_SIZE
        size = min(size, server.max_batch_size)
        auto = get.HasField("auto_ack") and get.auto_ack
        taken = await self._take_ahead_back(client, None if auto else size)
        if taken is not None:
            batch, frame = taken
        else:
            batch = await self._take(client, size, auto, wait_of(get))
            rows = len(batch.entries) + sum(e.row_count for e in batch.entries)
            frame = (
                self._frame(batch)
                if rows <= LOOP_ROWS
                else await self._thread(functools.partial(self._frame, batch))
            )
        self.check()
        if not auto and len(batch.entries) >= size:
            self._ahead = _Ahead(client, size, self._start(client, size))
        return frame

    async def _take(self, client: str, size: int, auto: bool, wait_s: float | None) -> Batch:
        server = self.server
        take = server.get if auto else server.get_without_ack
        batch = take(client, size, 0.0)  # a batch that is there: no thread hop
        while batch.is_empty and wait_s is not None:
            round_s = min(wait_s or WAIT_ROUND_S, server.max_timeout_s)
            batch = await self._thread(functools.partial(take, client, size, round_s))
            if wait_s:
                break
            self.check()
        return batch

    def _start(self, client: str, size: int) -> asyncio.Future[tuple[Batch, bytes] | None]:
        def take() -> tuple[Batch, bytes] | None:
            batch = self.server.get_without_ack(client, size, 0.0)
            return None if batch.is_empty else (batch, self._frame(batch))

        return asyncio.get_running_loop().run_in_executor(self._executor, take)

    async def _take_ahead_back(self, client: str, size: int | None) -> tuple[Batch, bytes] | None:
        """The batch taken ahead when this GET (``client``, ``size``; None: auto_ack) may
        have it; else it is rolled back."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        taken = await self._ahead_result(ahead)
        if taken is None:
            return None
        if ahead.client == client and ahead.size == size:
            return taken
        await self._roll_back(ahead.client, taken[0])
        return None

    async def settle(self, kind: int, client: str, batch_id: int) -> None:
        """Before any packet but a GET: roll the batch taken ahead back, unless the
        packet is a CLIENTACK of an earlier batch of the same client."""
        ahead = self._ahead
        if ahead is None:
            return
        taken = await self._ahead_result(ahead)
        if taken is not None:
            if kind == pb.CLIENTACK and client == ahead.client and 0 < batch_id < taken[0].id:
                return  # the usual ack of the batch before: keep it for the next GET
            await self._roll_back(ahead.client, taken[0])
        self._ahead = None

    async def _ahead_result(self, ahead: _Ahead) -> tuple[Batch, bytes] | None:
        try:
            return await ahead.taking
        except CanalError as exc:  # e.g. the store closed by the term's end
            self.check()
            log.info("%s: a batch taken ahead failed: %s", self.inst.name, exc)
            return None

    async def _roll_back(self, client: str, batch: Batch) -> None:
        try:
            await self.call(lambda s: s.rollback(client, batch.id))
        except CanalError as exc:  # acked or rolled back meanwhile: nothing to undo
            log.debug("%s: batch %d taken ahead: %s", self.inst.name, batch.id, exc)
