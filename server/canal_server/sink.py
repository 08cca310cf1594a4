"""Canal's sink role: the reader's put path, instance filter → store → position record."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from canal_protocol.entry import Entry, EntryType
from canal_protocol.positions import LogIdentity, LogPosition
from canal_server.filter import EventFilter
from canal_server.parse.logposition import LogPositionManager
from canal_server.store import EventStore

__all__ = ["EventSink"]


class EventSink:
    """The reader's put path: filter a transaction, store it, record the position.

    ``sink(entries, identity)`` takes one transaction or a chunk of one, in binlog
    order. The position is persisted only when the chunk leaves the reader outside a
    transaction (after a TRANSACTIONEND, or after entries without boundaries, such as
    a DDL), and it is the position of the last *raw* entry, so filtered transactions
    are not read again after a restart. Blocks while the store is full.

    Incremental snapshots (``canal_server.snapshot``) put their chunks through the same
    store: ``cond`` is held for every put, and a chunk is put only while
    ``in_transaction`` is False (a transaction larger than the reader's
    ``transaction_size`` comes in pieces, and ``cond`` is free between them), so a chunk
    never lands inside a transaction; ``last`` / ``last_gtid`` are the position and GTID
    state of the last transaction boundary put (or where the reader started:
    ``reached``), notified on ``cond``; ``tap`` sees every raw entry, before the filter,
    to record the keys a snapshot must not overwrite.
    """

    def __init__(
        self,
        destination: str,
        event_filter: EventFilter,
        store: EventStore,
        positions: LogPositionManager,
    ) -> None:
        self.destination = destination
        self.filter = event_filter
        self.store = store
        self.positions = positions
        self._in_transaction = False
        self.cond = threading.Condition()
        self.last: LogPosition | None = None
        self.last_gtid = ""
        self.tap: Callable[[Sequence[Entry]], None] | None = None

    @property
    def in_transaction(self) -> bool:
        """A transaction's first pieces are put and its END is not (read under ``cond``)."""
        return self._in_transaction

    def sink(self, entries: Sequence[Entry], identity: LogIdentity) -> None:
        if not entries:
            return
        with self.cond:
            kept = self.filter.filter_transaction(entries)
            if kept:
                self.store.put(kept, identity)
            if self.tap is not None:
                self.tap(entries)
            for e in entries:
                if e.type is EntryType.TRANSACTIONBEGIN:
                    self._in_transaction = True
                elif e.type is EntryType.TRANSACTIONEND:
                    self._in_transaction = False
            if not self._in_transaction:
                position = LogPosition(identity, entries[-1].position())
                self.positions.persist(self.destination, position)
                self.reached(position, entries[-1].gtid_state)

    def reached(self, position: LogPosition, gtid_state: str) -> None:
        """The reader is at a transaction boundary at ``position`` (wakes snapshot chunks)."""
        with self.cond:
            self.last, self.last_gtid = position, gtid_state
            self.cond.notify_all()
