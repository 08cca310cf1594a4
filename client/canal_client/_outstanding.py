"""What a connector has out: the batches handed out and not yet acked or rolled back
(``BatchBook``), and the request id of a get whose answer never came (``RequestIds``).

- Batches belong to the session that fetched them: an ack or rollback of a batch of an
  earlier session is refused (``StaleBatch``: the reconnect rolled it back, its entries
  come again); a batch whose id is still held by a batch of an earlier session was
  issued again by a new leader (``reissued``).
- A get that raised (its answer lost, its policy or deadline gave up) leaves its request
  id to the next get, which is its retry: the leader answers the batch the lost attempt
  took instead of the next one. Every attempt of a request id carries the same ``ack``;
  a greater one cannot ride on it (``ack_rides``) and goes on its own first.
"""

from __future__ import annotations

import itertools
import uuid

from canal_protocol.errors import ClientError

__all__ = ["BatchBook", "RequestIds", "StaleBatch"]


class StaleBatch(ClientError):
    """The batch was fetched in an earlier session (rolled back on reconnect)."""


class BatchBook:
    """Outstanding batch ids and the session generation that fetched each."""

    def __init__(self) -> None:
        self._batches: dict[int, int] = {}  # outstanding batch id -> session gen

    def __contains__(self, batch_id: int) -> bool:
        return batch_id in self._batches

    def record(self, batch_id: int, gen: int) -> None:
        self._batches[batch_id] = gen

    def clear(self) -> None:
        self._batches.clear()

    def reissued(self, batch_id: int, gen: int) -> bool:
        """An earlier session than ``gen`` handed out a batch with this id, which the
        caller may still ack or roll back: a new leader issues again ids its predecessor
        never flushed."""
        held = self._batches.get(batch_id)
        return held is not None and held != gen

    def check(self, batch_id: int, gen: int) -> None:
        """``StaleBatch`` when ``batch_id`` came from an earlier session than ``gen``."""
        held = self._batches.get(batch_id)
        if held is not None and held != gen:
            raise StaleBatch("rolled back by a reconnect to the leader since it was fetched")

    def forget(self, what: str, batch_id: int) -> None:
        """Batches no longer outstanding after ``what`` (ack or rollback) of batch_id."""
        gen = self._batches.get(batch_id)
        for bid in [b for b, g in self._batches.items() if g == gen]:
            if bid <= batch_id if what == "ack" else bid >= batch_id:
                del self._batches[bid]
        self._batches.pop(batch_id, None)


class RequestIds:
    """The request ids of a connector's gets and the acks they carry (see the module
    doc); ``acks_on_get`` is False once a server refused ``ack`` on a get (older)."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:12]
        self._numbers = itertools.count(1)
        self.unanswered: tuple[str, int | None] | None = None  # request id, its ack
        self.acks_on_get = True
        self.ack_taken: bool | None = None  # the fate of the last get's ack (last_ack_taken)

    def ack_rides(self, ack: int) -> bool:
        """Whether ``ack`` can go on the next get: not above the ack of an unanswered get,
        whose request id that get re-sends (the leader answers the batch it took and acks
        nothing more: only what its attempts carried)."""
        lost = self.unanswered
        return lost is None or (lost[1] is not None and ack <= lost[1])

    def next(self, ack: int | None) -> tuple[str, int | None]:
        """The request id of a get and the ack it carries: an unanswered get's (its
        attempts may have taken a batch; they carried its ack, which only grows), else new.
        The get is unanswered until it has its batch (``answered``)."""
        rid, carried = self.unanswered or (f"{self._prefix}-{next(self._numbers)}", None)
        if carried is not None and self.acks_on_get:
            ack = carried if ack is None else max(ack, carried)
        self.unanswered = (rid, ack)
        return rid, ack

    def answered(self) -> None:
        self.unanswered = None

    def unanswered_again(self, rid: str) -> None:
        """``rid`` is to be sent again, carrying no ack (its ack was done or refused)."""
        self.unanswered = (rid, None)
