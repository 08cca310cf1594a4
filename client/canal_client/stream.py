"""``BatchStream``: a connector's batches as an iterator, each batch acked once the
caller asks for the next one, optionally with the next get already in flight.

``Connector.stream(size, timeout_s, prefetch=True)`` makes one. Rules (the ack rules
of docs/guarantees.md):

- asking for the next batch (``next()``, the ``for`` loop) says the batch yielded before
  is processed: its ack rides on the next get the stream sends (``ack`` on ``POST
  .../batches``), never earlier;
- with ``prefetch`` the get of the next batch is in flight (in one worker thread) while
  the caller processes a batch; that get was sent before the caller finished the batch,
  so it carries the ack of the batch before it: a processed batch is acked by the get
  after the one in flight. Batches come in the order the leader hands them out, one get
  at a time;
- ``commit()`` acks the batch yielded last (and every earlier one) now;
- ``close()`` (the ``with`` block's end) sends the acks of processed batches and rolls
  back everything else: the batch yielded last unless committed, and a prefetched batch
  the caller never saw; they come again on the next get. A failure of the prefetched
  get is logged, not raised (its batch, if it took one, comes again); with an error
  leaving the ``with`` block, a failure of ``close()`` is logged and that error is the
  one raised;
- with ``prefetch``, ``close()`` sends its acks and rollbacks from the worker, after
  the get in flight (it holds the connector), and waits for them at most ``timeout_s +
  WAIT_MARGIN_S``: past that (a get retrying through an outage) it raises
  ``ClientError`` saying what it waited for, and the worker still sends them once that
  get ends;
- a leader change is the connector's: the get (in flight or not) follows the new
  leader, which rolled back what the old session handed out; an ack of a batch of the
  old session is dropped with a warning (its entries come again);
- an error of a get ends the stream (closed, nothing acked or rolled back by it) and is
  raised from ``next()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from types import TracebackType
from typing import Protocol

from canal_protocol import Batch
from canal_protocol.errors import CanalError, ClientError

__all__ = ["WAIT_MARGIN_S", "BatchSource", "BatchStream"]

log = logging.getLogger("canal_client")

# How much longer than the gets' timeout_s close() waits for the get in flight and its
# own acks and rollbacks: the connector's default request_timeout_s, what a long poll's
# HTTP read may take beyond its timeout.
WAIT_MARGIN_S = 10.0


class BatchSource(Protocol):
    """What a stream needs of its connector (``canal_client.connector.Connector``)."""

    destination: str
    client_id: str

    def get_without_ack(self, size: int, timeout_s: float, ack: int | None = None) -> Batch: ...
    def ack(self, batch_id: int) -> bool: ...
    def rollback(self, batch_id: int | None = None) -> None: ...
    def outstanding(self, batch_id: int) -> bool: ...


class BatchStream(Iterator[Batch]):
    """See the module docstring; made by ``Connector.stream``."""

    def __init__(
        self, conn: BatchSource, size: int, timeout_s: float, prefetch: bool = True
    ) -> None:
        self._conn, self._size, self._timeout_s = conn, size, timeout_s
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix=f"canal-prefetch {conn.destination}")
            if prefetch
            else None
        )
        self._pending: Future[Batch] | None = None  # the get in flight (prefetch)
        self._yielded: int | None = None  # the batch yielded last: not known processed
        self._unacked: int | None = None  # processed, its ack not sent yet
        self._closed = False

    @property
    def prefetch(self) -> bool:
        return self._pool is not None

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        self._processed()
        try:
            if self._pool is None:
                batch = self._get(self._take_ack())
            else:
                if self._pending is None:
                    self._pending = self._submit()
                future, self._pending = self._pending, None
                batch = future.result()
                self._pending = self._submit()
        except BaseException:
            self._end()
            raise
        if not batch.is_empty:
            self._yielded = batch.id
        return batch

    def commit(self) -> None:
        """Ack the batch yielded last, and every earlier one, now."""
        self._processed()
        ack = self._take_ack()
        if ack is not None:
            self._conn.ack(ack)

    def close(self) -> None:
        """Send the acks of processed batches, roll back the rest (see the module
        docstring); with ``prefetch`` in the worker, after the get in flight, waiting
        for them at most ``timeout_s + WAIT_MARGIN_S`` (then ``ClientError``)."""
        if self._closed:
            return
        current, self._yielded = self._yielded, None
        ack, pending, self._pending = self._take_ack(), self._pending, None
        if self._pool is None:
            self._end()
            self._settle(ack, current, None)
            return
        settled = self._pool.submit(self._settle, ack, current, pending)
        self._end()  # the worker still runs what was submitted
        if not wait([settled], self._timeout_s + WAIT_MARGIN_S).done:
            raise self._gave_up(ack, current)
        settled.result()

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as failed:  # the block's own error is the one raised
            log.warning("%s: closing the stream after %r failed: %s", self._what(), exc, failed)

    # -- internals ------------------------------------------------------------------

    def _processed(self) -> None:
        if self._yielded is not None:
            self._unacked, self._yielded = self._yielded, None

    def _take_ack(self) -> int | None:
        ack, self._unacked = self._unacked, None
        return ack

    def _get(self, ack: int | None) -> Batch:
        return self._conn.get_without_ack(self._size, self._timeout_s, ack=ack)

    def _submit(self) -> Future[Batch]:
        assert self._pool is not None
        return self._pool.submit(self._get, self._take_ack())

    def _settle(self, ack: int | None, current: int | None, pending: Future[Batch] | None) -> None:
        """close()'s acks and rollbacks (in the worker with prefetch, after the get in
        flight): each is tried, each failure logged, the first one raised."""
        prefetched = self._prefetched(pending)
        steps: list[tuple[str, Callable[[], object]]] = []
        if ack is not None:
            steps.append((f"ack of batch {ack}", partial(self._conn.ack, ack)))
        if current is not None:  # and the later ones of its session
            steps.append((f"rollback of batch {current}", partial(self._conn.rollback, current)))
        if prefetched is not None:  # e.g. fetched in a session after current's
            roll_back = partial(self._roll_back_prefetched, prefetched.id)
            steps.append((f"rollback of the prefetched batch {prefetched.id}", roll_back))
        first: Exception | None = None
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                log.warning("%s: closing the stream: the %s failed: %s", self._what(), what, exc)
                first = first or exc
        if first is not None:
            raise first

    def _prefetched(self, pending: Future[Batch] | None) -> Batch | None:
        """The prefetched batch, once its get ended; None if none or it failed (then
        the ack it carried may be lost: that batch comes again, as after any failure)."""
        if pending is None:
            return None
        try:
            batch = pending.result()
        except CanalError as exc:
            log.info("%s: the prefetched get failed on close: %s", self._what(), exc)
            return None
        except Exception:
            log.warning("%s: the prefetched get failed on close", self._what(), exc_info=True)
            return None
        return None if batch.is_empty else batch

    def _roll_back_prefetched(self, batch_id: int) -> None:
        if self._conn.outstanding(batch_id):
            self._conn.rollback(batch_id)

    def _gave_up(self, ack: int | None, current: int | None) -> ClientError:
        acked = f"batch {ack} is acked and " if ack is not None else ""
        rolled = "the prefetched batch is"
        if current is not None:
            rolled = f"batch {current} and the prefetched one are"
        return ClientError(
            f"{self._what()}: closing the stream: gave up after "
            f"{self._timeout_s + WAIT_MARGIN_S:g} s waiting for the get in flight to end; "
            f"{acked}{rolled} rolled back once it ends (in the stream's worker)"
        )

    def _what(self) -> str:
        return f"{self._conn.destination}/{self._conn.client_id}"

    def _end(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)
