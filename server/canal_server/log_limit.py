"""Logs no client can flood: a rate limit per cause, on the node's log handlers.

A cause is where a line is logged (file and line of the call) and, when the message's
first argument is a short string (mostly the destination), that argument. Each cause
may write ``LOG_BURST`` lines per ``LOG_WINDOW_S``; later ones in that window are
dropped and counted, and the cause's next line says how many were. Only the first line
of a cause in a window keeps its traceback. So a client repeating a bad request (or
any other repeated failure) writes a few lines a minute, whatever its rate.

``RateLimit`` is the budget (also for other callers that want one), ``LogRateFilter``
the ``logging.Filter``, ``install_log_limit`` puts one on every handler of a logger
(the root logger: ``canal-ha server`` does at start).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["LOG_BURST", "LOG_WINDOW_S", "LogRateFilter", "RateLimit", "install_log_limit"]

LOG_BURST = 10
LOG_WINDOW_S = 60.0
MAX_CAUSES = 4096  # causes tracked at once (the oldest is forgotten first)


@dataclass
class _Window:
    start: float
    used: int = 0
    dropped: int = 0  # in this window
    traced: bool = False  # a line of this window kept its traceback


@dataclass(frozen=True)
class Verdict:
    """What ``RateLimit.take`` decided: ``allowed``; ``dropped_before`` lines of the
    cause dropped in its previous window(s), to be reported now; ``first`` of its window."""

    allowed: bool
    dropped_before: int
    first: bool


class RateLimit:
    """``burst`` events per key per ``window_s`` (fixed windows); thread-safe."""

    def __init__(
        self,
        burst: int = LOG_BURST,
        window_s: float = LOG_WINDOW_S,
        max_keys: int = MAX_CAUSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst, self.window_s, self.max_keys, self._clock = burst, window_s, max_keys, clock
        self._lock = threading.Lock()
        self._windows: OrderedDict[Hashable, _Window] = OrderedDict()
        self._unreported: dict[Hashable, int] = {}

    def take(self, key: Hashable) -> Verdict:
        now = self._clock()
        with self._lock:
            w = self._windows.get(key)
            if w is None or now - w.start >= self.window_s:
                if w is not None and w.dropped:
                    self._unreported[key] = self._unreported.get(key, 0) + w.dropped
                w = _Window(now)
                self._windows[key] = w
                self._windows.move_to_end(key)
                while len(self._windows) > self.max_keys:
                    old, _ = self._windows.popitem(last=False)
                    self._unreported.pop(old, None)
            if w.used >= self.burst:
                w.dropped += 1
                return Verdict(False, 0, False)
            w.used += 1
            first = not w.traced
            w.traced = True
            return Verdict(True, self._unreported.pop(key, 0), first)


class LogRateFilter(logging.Filter):
    """Drops a cause's lines past its budget (``RateLimit``); strips the traceback of
    every line of a cause's window but the first; notes the lines dropped before."""

    def __init__(self, limit: RateLimit | None = None) -> None:
        super().__init__()
        self.limit = limit or RateLimit()

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = self.limit.take(_cause(record))
        if not verdict.allowed:
            return False
        notes: list[str] = []
        if verdict.dropped_before:
            notes.append(f"{verdict.dropped_before} similar lines dropped before this one")
        if not verdict.first and (record.exc_info or record.exc_text):
            record.exc_info, record.exc_text = None, None
            notes.append("traceback as in this cause's first line")
        if notes:
            record.msg, record.args = f"{record.getMessage()} [{'; '.join(notes)}]", None
        return True


def _cause(record: logging.LogRecord) -> Hashable:
    args = record.args
    first = args[0] if isinstance(args, tuple) and args else None
    tag = first if isinstance(first, str) and len(first) <= 64 else None
    return (record.pathname, record.lineno, tag)


def install_log_limit(logger: logging.Logger | None = None) -> None:
    """A ``LogRateFilter`` (one budget) on every handler of ``logger`` (default: root)."""
    handlers = (logger or logging.getLogger()).handlers
    shared = LogRateFilter()
    for handler in handlers:
        if not any(isinstance(f, LogRateFilter) for f in handler.filters):
            # first: a dropped line costs nothing more (no redaction, no formatting)
            handler.filters.insert(0, shared)
