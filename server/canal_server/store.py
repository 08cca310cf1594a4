"""The per-destination event store (Canal's MemoryEventStoreWithBuffer).

One shared, bounded buffer of ``StoredEvent`` s. Every event gets a sequence number
(``seq``, 1, 2, 3, … over the store's life). Bounds: ``buffer_size`` events AND
``buffer_bytes`` estimated bytes (``estimate_size``); an event larger than the byte
bound alone is still admitted when the buffer is empty, so nothing can deadlock.

* ``put`` (the reader's sink thread) blocks while the buffer is full: backpressure,
  never a drop. It is woken by ``ack``, ``unregister`` and ``register`` freeing space.
* ``get(after, max_entries, timeout_s)`` returns events after a seq or after a
  LogPosition (``None``: from the first stored event), waiting up to ``timeout_s``
  for the first one. The store keeps no read pointer: the embedded server keeps
  each client's pointer with its outstanding batches, because rollback(id) must
  rewind to the start of a given batch.
* Several clients share the buffer. Each registered client has an ack seq; an
  event is freed once every registered client has acked it (the store's ack
  sequence is the minimum over clients). A newly registered client pins what is
  stored now, or only what lies after a given position (what lies before it is freed
  at once when no other client pins it). With no client registered nothing is freed.
  ``last_position`` (of the last event put) and ``freed_position`` (of the last event
  freed) stay known after the events are gone.
* ``stop`` wakes every waiter with StoreClosed.

Thread-safe: one lock, two conditions (readable, writable); nothing polls.
Positions in the buffer are assumed to increase with seq for one source (each
binlog event gives at most one entry); lookups by LogPosition rely on that.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from canal_protocol.entry import Entry, Value
from canal_protocol.errors import InvalidArgument, StoreClosed, StoreError
from canal_protocol.positions import LogIdentity, LogPosition, journal_seq
from canal_server.packed import PackedRows

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_BUFFER_SIZE",
    "EventStore",
    "StoredEvent",
    "estimate_size",
    "is_after",
]

log = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE = 16384
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024

_ENTRY_OVERHEAD = 256
_IMAGE_OVERHEAD = 56  # a tuple object
_VALUE_OVERHEAD = 40  # a pointer and a small object's header
_SCALAR_SIZE = 8


def estimate_size(entry: Entry) -> int:
    """A cheap, deterministic estimate of an entry's memory in bytes.

    A fixed overhead per entry, per row image and per value, plus the SQL text and
    the rows' payload: the binlog event's size when the header spans one (the
    encoded values; no per-value walk on the hot path), else the length of every
    string or bytes value (numbers count 8 bytes). Rows the C decoder left as
    msgpack (``PackedRows``) count their bytes only.
    """
    h = entry.header
    size = _ENTRY_OVERHEAD + len(entry.sql) + len(h.schema) + len(h.table)
    images = entry.images
    if images is None:
        return size
    if isinstance(images, PackedRows):  # bytes only, until someone asks for the values
        return size + len(images.packed_before) + len(images.packed_after)
    count = len(images.before) + len(images.after)
    size += count * (_IMAGE_OVERHEAD + _VALUE_OVERHEAD * len(images.columns.names))
    span = h.end_offset - h.offset
    return size + (span if span > 0 else _payload(images.before) + _payload(images.after))


def _payload(rows: tuple[tuple[Value, ...], ...]) -> int:
    return sum(len(v) if isinstance(v, str | bytes) else _SCALAR_SIZE for row in rows for v in row)


class StoredEvent(NamedTuple):
    """One stored entry (Canal's Event): its seq, position and estimated size. A named
    tuple (immutable like a frozen dataclass): one is made per entry put, and building
    a frozen dataclass costs several times more (and more memory per buffered entry)."""

    seq: int
    entry: Entry
    position: LogPosition
    size: int


def is_after(position: LogPosition, reference: LogPosition) -> bool:
    """True when ``position`` lies after ``reference``.

    Same source: binlog order. Another source (a database switch): by commit time,
    ``>=`` so that an entry of the same second is delivered again rather than lost.
    """
    if position.identity == reference.identity:
        return position.position.sort_key > reference.position.sort_key
    return position.position.timestamp_ms >= reference.position.timestamp_ms


def _not_before(position: LogPosition, reference: LogPosition) -> bool:
    if position.identity == reference.identity:
        return position.position.sort_key >= reference.position.sort_key
    return position.position.timestamp_ms >= reference.position.timestamp_ms


def _start_order(entry: Entry) -> tuple[tuple[str, int], int, int, int, int]:
    """Where an entry starts, in the order the store holds entries: binlog order, the
    entries of a snapshot chunk at a position before the binlog event starting there."""
    h = entry.header
    return journal_seq(h.logfile), h.offset, 0 if h.snapshot else 1, h.part, h.snapshot


After = int | LogPosition | None


class EventStore:
    """Bounded, multi-client ring buffer of one destination's entries."""

    def __init__(
        self,
        destination: str,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        if buffer_size < 1:
            raise InvalidArgument("memory.buffer_size", f"must be >= 1, not {buffer_size}")
        if buffer_bytes < 1:
            raise InvalidArgument("memory.buffer_bytes", f"must be >= 1, not {buffer_bytes}")
        self.destination = destination
        self.buffer_size = buffer_size
        self.buffer_bytes = buffer_bytes
        self._lock = threading.Lock()
        self._readable = threading.Condition(self._lock)
        self._writable = threading.Condition(self._lock)
        self._events: list[StoredEvent] = []
        self._head = 0  # index in _events of the first live event
        self._freed = 0  # seq of the last freed event (first live seq = _freed + 1)
        self._bytes = 0
        self._acks: dict[str, int] = {}
        self._closed = False
        self._last_position: LogPosition | None = None
        self._freed_position: LogPosition | None = None

    # ---- state -------------------------------------------------------------
    def stats(self) -> tuple[int, int]:
        """(stored events, stored estimated bytes)."""
        with self._lock:
            return len(self._events) - self._head, self._bytes

    @property
    def last_seq(self) -> int:
        """Seq of the last event ever put (0 when none)."""
        with self._lock:
            return self._freed + len(self._events) - self._head

    @property
    def last_position(self) -> LogPosition | None:
        """Position of the last event ever put (None when none)."""
        with self._lock:
            return self._last_position

    @property
    def freed_position(self) -> LogPosition | None:
        """Position of the last event freed (None when none): the first stored event,
        or the next one put, lies after it."""
        with self._lock:
            return self._freed_position

    @property
    def first_seq(self) -> int:
        """Seq the first stored event has or the next put will get."""
        with self._lock:
            return self._freed + 1

    # ---- producer ------------------------------------------------------------
    def put(
        self, entries: Sequence[Entry], identity: LogIdentity, timeout_s: float | None = None
    ) -> int:
        """Append entries in order, blocking while full; returns how many were put.

        With ``timeout_s`` None it waits as long as needed (until ``stop``:
        StoreClosed); otherwise it returns early with the count put so far.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        done = 0
        with self._lock:
            for entry in entries:
                size = estimate_size(entry)
                while not self._has_room(size):
                    self._check_open()
                    if done:
                        self._readable.notify_all()
                    if not self._wait(self._writable, deadline):
                        return done
                self._check_open()
                seq = self._freed + len(self._events) - self._head + 1
                pos = LogPosition(identity, entry.position())
                self._events.append(StoredEvent(seq, entry, pos, size))
                self._last_position = pos
                self._bytes += size
                done += 1
            if done:
                self._readable.notify_all()
        return done

    def _has_room(self, size: int) -> bool:
        count = len(self._events) - self._head
        if count == 0:
            return True
        return count < self.buffer_size and self._bytes + size <= self.buffer_bytes

    # ---- consumers -----------------------------------------------------------
    def register(self, client: str, after: LogPosition | None = None) -> LogPosition | None:
        """Start tracking ``client``'s acks; returns the position it starts after.

        ``after`` None: it pins every event stored now and starts after the last freed
        event (None: nothing was freed). A position: it pins the stored events after
        it; when some of those were freed already, it starts after the last freed
        event instead (that position is returned). A client already registered keeps
        what it pins (``after`` is returned). What every registered client has passed
        is freed, waking a put blocked on a store filled while nobody was registered.
        """
        with self._lock:
            if client in self._acks:
                return after
            freed = self._freed_position
            if after is None or (freed is not None and is_after(freed, after)):
                self._acks[client] = self._freed
                return freed
            idx = self._index_after_position(after)
            self._acks[client] = self._events[idx - 1].seq if idx > self._head else self._freed
            self._free()
            return after

    def unregister(self, client: str) -> None:
        with self._lock:
            if self._acks.pop(client, None) is not None:
                self._free()

    def ack(self, client: str, seq: int) -> None:
        """``client`` has consumed every event up to ``seq``; free what all consumed."""
        with self._lock:
            if client not in self._acks:
                raise StoreError(f"{self.destination}: client {client!r} is not registered")
            if seq > self._acks[client]:
                self._acks[client] = min(seq, self._last_seq())
                self._free()

    def get(self, after: After, max_entries: int, timeout_s: float = 0.0) -> list[StoredEvent]:
        """Up to ``max_entries`` events after ``after``, waiting up to ``timeout_s``.

        ``after`` is a seq, a LogPosition, or None for "from the first stored event".
        A seq whose successors were already freed raises StoreError.
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._lock:
            while True:
                self._check_open()
                start = self._start_index(after)
                if start < len(self._events):
                    return self._events[start : start + max_entries]
                if not self._wait(self._readable, deadline):
                    return []

    def wait_for(self, after: After, timeout_s: float) -> bool:
        """Wait until an event after ``after`` is stored; False on timeout."""
        return bool(self.get(after, 1, timeout_s))

    def get_range(self, first_seq: int, last_seq: int) -> list[StoredEvent]:
        """The stored events with seq in [first_seq, last_seq]; StoreError if freed."""
        with self._lock:
            self._check_open()
            if first_seq <= self._freed:
                raise StoreError(f"{self.destination}: seq {first_seq} was already freed")
            lo = self._head + first_seq - self._freed - 1
            hi = self._head + last_seq - self._freed
            return self._events[lo:hi]

    def find_range(self, start: LogPosition, end: LogPosition) -> tuple[int, int] | None:
        """Seqs (first, last) of the stored events with start <= position <= end.

        None while nothing at or after ``end`` is stored yet (the reader has not
        re-read that far); StoreError when the range is no longer stored.
        """
        with self._lock:
            self._check_open()
            reaches_end = self._bisect(lambda p: _not_before(p, end))
            if reaches_end == len(self._events):
                return None
            lo = self._bisect(lambda p: _not_before(p, start))
            hi = self._bisect(lambda p: is_after(p, end))
            if lo >= hi or (is_after(self._events[lo].position, start) and lo == self._head):
                raise StoreError(
                    f"{self.destination}: positions {start} .. {end} are not in the store"
                )
            return self._events[lo].seq, self._events[hi - 1].seq

    def seq_at_or_before(self, position: LogPosition) -> int | None:
        """Seq of the last stored event not after ``position`` (None if there is none)."""
        with self._lock:
            idx = self._index_after_position(position)
            return self._events[idx - 1].seq if idx > self._head else None

    def last_starting_by(self, journal: str, offset: int) -> StoredEvent | None:
        """The last stored event whose entry starts at or before ``journal``:``offset``
        (an entry's header start, not its resume position), in the order events are
        stored. An incremental snapshot's chunk put at ``offset`` (a transaction's end)
        is stored before the binlog event that starts there too (MariaDB: the next
        transaction's GTID event, its BEGIN): while one is stored, the answer is the
        event before it, so a commit through ``offset`` never passes over snapshot
        entries (at worst they are delivered again). The entries of a compressed
        transaction starting there (``header.part``) come after it as well."""
        at = (journal_seq(journal), offset)
        with self._lock:
            live = range(self._head, len(self._events))

            def start(i: int) -> tuple[tuple[str, int], int, int, int, int]:
                return _start_order(self._events[i].entry)

            first_at = bisect.bisect_left(live, (*at, 0, 0, 1), key=start)
            if first_at < len(live) and start(live[first_at])[:3] == (*at, 0):
                idx = first_at  # a chunk at ``offset``: stop before it
            else:
                idx = bisect.bisect_right(live, (*at, 1, 0, 0), key=start)
            return self._events[self._head + idx - 1] if idx else None

    def stop(self) -> None:
        """Close the store: every waiting put/get raises StoreClosed."""
        with self._lock:
            self._closed = True
            self._readable.notify_all()
            self._writable.notify_all()
        log.info("%s: event store stopped", self.destination)

    # ---- internals (lock held) ----------------------------------------------
    def _last_seq(self) -> int:
        return self._freed + len(self._events) - self._head

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"{self.destination}: event store is stopped")

    def _wait(self, cond: threading.Condition, deadline: float | None) -> bool:
        if deadline is None:
            cond.wait()
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        cond.wait(remaining)
        return True

    def _start_index(self, after: After) -> int:
        if after is None:
            return self._head
        if isinstance(after, LogPosition):
            return self._index_after_position(after)
        if after < self._freed:
            raise StoreError(
                f"{self.destination}: events after seq {after} were freed (first stored "
                f"seq is {self._freed + 1})"
            )
        return self._head + after - self._freed

    def _bisect(self, pred: Callable[[LogPosition], bool]) -> int:
        """Index of the first live event whose position satisfies a monotone ``pred``."""
        n = len(self._events)
        return (
            bisect.bisect_left(
                range(self._head, n), True, key=lambda i: pred(self._events[i].position)
            )
            + self._head
        )

    def _index_after_position(self, ref: LogPosition) -> int:
        return self._bisect(lambda p: is_after(p, ref))

    def _free(self) -> None:
        if not self._acks:
            return
        target = min(min(self._acks.values()), self._last_seq())
        count = target - self._freed
        if count <= 0:
            return
        for ev in self._events[self._head : self._head + count]:
            self._bytes -= ev.size
        self._freed_position = self._events[self._head + count - 1].position
        self._head += count
        self._freed = target
        if self._head > 1024 and self._head * 2 > len(self._events):
            del self._events[: self._head]
            self._head = 0
        self._writable.notify_all()
