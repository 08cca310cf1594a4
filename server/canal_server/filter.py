"""Table filters (Canal's AviaterRegexFilter) and how they apply to entries.

Syntax, as Canal's ``filter.regex`` / ``filter.black_regex``: a comma-separated list
of Perl regexes, each matched against the *whole* ``schema.table`` name,
case-insensitively. ``.*\\..*`` means every table. An empty include list means
everything; an empty exclude list means nothing.

Where filters apply:

* The **instance filter** (``filter.regex``, ``filter.black_regex``, the heartbeat
  table) runs at put time, on each transaction the reader sinks
  (``EventFilter.filter_transaction``).
* A **client filter** (the regex a client subscribes with) runs per client at get
  time (``EventFilter.narrower``) and can only narrow what the instance stored.

Decisions (Canal's behaviour, written down):

* TRANSACTIONBEGIN / TRANSACTIONEND entries always pass, so clients see
  transaction boundaries.
* A ROWDATA entry passes when its ``schema.table`` passes. DDL entries are filtered
  by their ``schema.table`` too; a DDL without a table (``CREATE DATABASE d``) is seen
  as ``d.`` (``.*\\..*`` matches it, ``d\\..*`` too).
* Entries on the heartbeat table (``heartbeat_table``, ``schema.table``) are dropped,
  DDL included.
* Empty transactions (a BEGIN and its END with every row filtered) are dropped at
  put time, except that one is let through every ``empty_tx_interval_s`` seconds or
  every ``empty_tx_threshold`` dropped transactions, so that client cursors (and so
  the position a new leader restarts from) keep moving on a quiet filter (Canal's
  ``filterEmptyTransaction`` with ``emptyTransactionInterval``/``Threshold``).
  At get time an empty transaction is dropped when both its BEGIN and END fall in
  the same batch; a BEGIN at the end of a batch is kept.

The put path (Canal's EntryEventSink: instance filter → store → LogPositionManager)
is ``canal_server.sink.EventSink``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from canal_protocol.entry import Entry, EntryType
from canal_protocol.errors import InvalidArgument

__all__ = ["EventFilter", "NameFilter", "Narrower"]


class NameFilter:
    """A comma-separated list of whole-name, case-insensitive regexes.

    ``matches`` returns ``if_empty`` when the list is empty. A bad regex raises
    InvalidArgument naming ``field``.
    """

    def __init__(self, spec: str, field: str, if_empty: bool) -> None:
        self.spec = spec.strip()
        self.if_empty = if_empty
        parts = [p.strip() for p in self.spec.split(",") if p.strip()]
        self._patterns = tuple(_compile(p, field) for p in parts)

    @property
    def empty(self) -> bool:
        return not self._patterns

    def matches(self, name: str) -> bool:
        if not self._patterns:
            return self.if_empty
        return any(p.fullmatch(name) for p in self._patterns)

    def __repr__(self) -> str:
        return f"NameFilter({self.spec!r})"


def _compile(pattern: str, field: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise InvalidArgument(field, f"bad regex {pattern!r}: {exc}") from exc


@dataclass
class _EmptyTxGate:
    """Lets one empty transaction through every ``interval_s`` or ``threshold`` drops."""

    interval_s: float
    threshold: int
    clock: Callable[[], float]
    dropped: int = 0
    last_pass: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.last_pass = self.clock()

    def let_through(self) -> bool:
        now = self.clock()
        if self.dropped + 1 >= self.threshold or now - self.last_pass >= self.interval_s:
            self.dropped = 0
            self.last_pass = now
            return True
        self.dropped += 1
        return False


class EventFilter:
    """Include/exclude table filter plus heartbeat-table drop.

    ``EventFilter(include, exclude, heartbeat_table)`` is the instance filter;
    ``EventFilter.for_client(regex)`` a client's (bad regex → InvalidArgument("filter")).
    ``filter_transaction`` is stateful (the empty-transaction gate): call it from the
    one sink thread. ``accepts`` and ``narrower`` are stateless and thread-safe.
    """

    def __init__(
        self,
        include: str = "",
        exclude: str = "",
        heartbeat_table: str = "",
        *,
        include_field: str = "filter.regex",
        exclude_field: str = "filter.black_regex",
        empty_tx_interval_s: float = 5.0,
        empty_tx_threshold: int = 8192,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.include = NameFilter(include, include_field, if_empty=True)
        self.exclude = NameFilter(exclude, exclude_field, if_empty=False)
        self.heartbeat_table = heartbeat_table.strip().lower()
        self._gate = _EmptyTxGate(empty_tx_interval_s, empty_tx_threshold, clock)

    @classmethod
    def for_client(cls, regex: str) -> EventFilter:
        """A client's subscription filter (include only)."""
        return cls(regex, include_field="filter")

    @property
    def passes_everything(self) -> bool:
        return self.include.empty and self.exclude.empty and not self.heartbeat_table

    def accepts_name(self, full_name: str) -> bool:
        if self.heartbeat_table and full_name.lower() == self.heartbeat_table:
            return False
        return self.include.matches(full_name) and not self.exclude.matches(full_name)

    def accepts(self, entry: Entry) -> bool:
        """True for transaction boundaries; otherwise the entry's table decides."""
        if entry.type is not EntryType.ROWDATA:
            return True
        return self.accepts_name(entry.full_name)

    def filter_transaction(self, entries: Sequence[Entry]) -> list[Entry]:
        """Put-time filtering of one transaction (or a chunk of one).

        Drops rejected entries; when the chunk holds a BEGIN and an END and no
        ROWDATA survived, drops the whole transaction unless the empty-transaction
        gate lets it through.
        """
        accepts = self.accepts
        kept = list(entries) if self.passes_everything else [e for e in entries if accepts(e)]
        for e in kept:
            if e.type is EntryType.ROWDATA:
                return kept
        types = {e.type for e in entries}
        if EntryType.TRANSACTIONBEGIN in types and EntryType.TRANSACTIONEND in types:
            return kept if self._gate.let_through() else []
        return kept

    def narrower(self) -> Narrower:
        """A fresh get-time narrower for one batch."""
        return Narrower(self)

    def narrow(self, entries: Iterable[Entry]) -> list[Entry]:
        """Get-time narrowing of a whole batch (see ``Narrower``)."""
        n = self.narrower()
        out: list[Entry] = []
        for e in entries:
            out.extend(n.feed(e))
        out.extend(n.finish())
        return out

    def __repr__(self) -> str:
        return (
            f"EventFilter(include={self.include.spec!r}, exclude={self.exclude.spec!r}, "
            f"heartbeat_table={self.heartbeat_table!r})"
        )


class Narrower:
    """Streams one batch's raw entries through a client filter.

    A BEGIN is held back until a row of its transaction passes; a BEGIN followed
    by its END with nothing in between is dropped; a BEGIN still held at the end
    of the batch is emitted by ``finish``. The result depends only on the raw
    entries, so re-reading a batch's range gives the same entries.
    """

    def __init__(self, event_filter: EventFilter) -> None:
        self._filter = event_filter
        self._pending: Entry | None = None

    def feed(self, entry: Entry) -> list[Entry]:
        if entry.type is EntryType.TRANSACTIONBEGIN:
            held = self.finish()
            self._pending = entry
            return held
        if entry.type is EntryType.TRANSACTIONEND:
            if self._pending is not None:
                self._pending = None
                return []
            return [entry]
        if not self._filter.accepts(entry):
            return []
        return [*self.finish(), entry]

    def finish(self) -> list[Entry]:
        held, self._pending = self._pending, None
        return [held] if held is not None else []
