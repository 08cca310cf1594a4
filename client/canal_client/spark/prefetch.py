"""The Spark reader's prefetch: the next server batches taken while the executors
run a micro-batch."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["PREFETCH_STOP_S", "Prefetch"]

log = logging.getLogger("canal_client.spark")


class Prefetch:
    """A thread calling ``step`` until it returns False (a trigger's worth held, or a
    poll found nothing) or ``finish`` is called. ``step`` is the reader's own fetch: the
    reader calls ``finish`` (which waits for the fetch under way) before it touches its
    ledger or its connector again, so the two never run at the same time."""

    def __init__(self, step: Callable[[], bool], what: str) -> None:
        self._step, self._what = step, what
        self._stop = threading.Event()
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="canal-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self._step():
                self.batches += 1
        except Exception as exc:  # the reader's next fetch meets it again, if it lasts
            level = logging.INFO if self._stop.is_set() else logging.WARNING
            log.log(level, "%s: prefetch stopped: %s", self._what, exc)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end by itself; True when it has."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def finish(self, timeout_s: float | None = None) -> bool:
        """Stop after the fetch under way; True when the thread has ended."""
        self._stop.set()
        return self.wait(timeout_s)


PREFETCH_STOP_S = 30.0  # ``stop()``: how long the prefetch thread may take to end
