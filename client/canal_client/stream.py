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
  the caller never saw; they come again on the next get;
- a leader change is the connector's: the get (in flight or not) follows the new
  leader, which rolled back what the old session handed out; an ack of a batch of the
  old session is dropped with a warning (its entries come again);
- an error of a get ends the stream (closed, nothing acked or rolled back by it) and is
  raised from ``next()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING

from canal_protocol import Batch
from canal_protocol.errors import ClientError

if TYPE_CHECKING:
    from canal_client.connector import Connector

__all__ = ["BatchStream"]

log = logging.getLogger("canal_client")


class BatchStream(Iterator[Batch]):
    """See the module docstring; made by ``Connector.stream``."""

    def __init__(self, conn: Connector, size: int, timeout_s: float, prefetch: bool = True) -> None:
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
        docstring); waits for a get in flight (up to its ``timeout_s``)."""
        if self._closed:
            return
        current, self._yielded = self._yielded, None
        prefetched = self._wait_pending()
        self._end()
        ack = self._take_ack()
        if ack is not None:
            self._conn.ack(ack)
        if current is not None:
            self._conn.rollback(current)  # and the later ones of its session
        if prefetched is not None and self._conn.outstanding(prefetched.id):
            self._conn.rollback(prefetched.id)  # e.g. fetched in a session after current's

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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

    def _wait_pending(self) -> Batch | None:
        """The prefetched batch, once its get ended; None if none or it failed (then
        the ack it carried may be lost: that batch comes again, as after any failure)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            return pending.result()
        except ClientError as exc:
            log.info("%s: the prefetched get failed on close: %s", self._conn.destination, exc)
            return None

    def _end(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)
