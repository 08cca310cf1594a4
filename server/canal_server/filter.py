"""Table filters (Canal's AviaterRegexFilter) and how they apply to entries.

Syntax, as Canal's ``filter.regex`` / ``filter.black_regex``: a comma-separated list
of regexes, each matched against the *whole* ``schema.table`` name,
case-insensitively. ``.*\\..*`` means every table. An empty include list means
everything; an empty exclude list means nothing.

The regexes run on RE2 (``google-re2``), whose matching time is linear in the name
whatever the pattern, instead of a backtracking engine on which ``(.*){50}!`` took
seconds per name: Perl's syntax without backreferences, look-around, possessive or
atomic groups and ``\\Z`` (``\\z`` ends the text); repetitions up to ``{1000}``. A
list whose compiled program exceeds ``MAX_PROGRAM`` instructions is refused too, so one
name costs at most ~10 ms on this machine's core (the benchmarks' figure), and each
filter remembers its answer for the last ``NAME_MEMO`` names: a batch of entries on a
few tables matches each table once. A pattern outside this is ``InvalidArgument``
naming the field (the API's 400 naming ``filter``; a config error naming the key).

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

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import re2

from canal_protocol.entry import Entry, EntryType
from canal_protocol.errors import InvalidArgument

__all__ = ["MAX_PROGRAM", "NAME_MEMO", "EventFilter", "NameFilter", "NameRegex", "Narrower"]

MAX_PROGRAM = 20_000  # RE2 program instructions of one filter (all its regexes)
NAME_MEMO = 4096  # names whose answer a filter remembers (then it starts over)


def _options() -> Any:
    options = re2.Options()
    options.case_sensitive = False
    options.never_capture = True  # no submatches: RE2 may use its DFA
    options.log_errors = False  # a bad pattern is the caller's 400, not a log line
    return options


_OPTIONS = _options()


class NameRegex:
    """One whole-name, case-insensitive regex on the filters' engine (RE2): what a
    filter and a snapshot's ``tables`` use. ``pattern`` is the source."""

    def __init__(self, pattern: str, field: str) -> None:
        self.pattern = pattern
        shown = pattern if len(pattern) <= 200 else pattern[:200] + "..."
        try:
            self._re = re2.compile(pattern, _OPTIONS)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode(errors="replace")
            raise InvalidArgument(
                field,
                f"{shown!r} is not a regex the filters' engine (RE2) takes: {reason} "
                "(no backreferences, look-around, possessive or atomic groups, \\Z)",
            ) from None
        size = int(self._re.programsize)
        if size > MAX_PROGRAM:
            raise InvalidArgument(
                field,
                f"{shown!r} is too complex: {size} RE2 instructions, at most {MAX_PROGRAM}",
            )

    def fullmatch(self, name: str) -> bool:
        return self._re.fullmatch(name) is not None


class NameFilter:
    """A comma-separated list of whole-name, case-insensitive regexes.

    ``matches`` returns ``if_empty`` when the list is empty. A bad regex (or a list too
    complex, ``MAX_PROGRAM``) raises InvalidArgument naming ``field``. The regexes are
    one RE2 alternation; each answer is remembered for the next ``NAME_MEMO`` names.
    """

    def __init__(self, spec: str, field: str, if_empty: bool) -> None:
        self.spec = spec.strip()
        self.if_empty = if_empty
        parts = [p.strip() for p in self.spec.split(",") if p.strip()]
        for p in parts:  # each alone first: the error names the bad one
            NameRegex(p, field)
        joined = "|".join(f"(?:{p})" for p in parts)
        self._regex = NameRegex(joined, field) if parts else None
        self._memo: dict[str, bool] = {}

    @property
    def empty(self) -> bool:
        return self._regex is None

    def matches(self, name: str) -> bool:
        if self._regex is None:
            return self.if_empty
        hit = self._memo.get(name)
        if hit is None:
            hit = self._regex.fullmatch(name)
            if len(self._memo) >= NAME_MEMO:
                self._memo.clear()
            self._memo[name] = hit
        return hit

    def __repr__(self) -> str:
        return f"NameFilter({self.spec!r})"


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
