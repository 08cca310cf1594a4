"""Requests the caller can stop waiting for: ``InFlight.run(fn, reason_to_stop)``.

A connector that follows the leader by etcd's watch runs each HTTP exchange through an
``InFlight``: ``fn`` runs in a daemon worker thread while the caller waits. The caller
asks ``reason_to_stop()`` before ``fn`` starts (the leader may have changed since the
caller picked it) and after each ``interrupt()`` (the resolver saw the leader change);
a reason abandons the exchange at once (``Abandoned``): the worker finishes it on its
own (its answer, if one ever comes, is dropped) and the next exchange gets a new
worker. So a long poll to a leader that was SIGSTOPped or lost its lease ends as soon
as the watch names a new leader, not at its HTTP read timeout.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from canal_protocol.errors import ClientError

__all__ = ["Abandoned", "InFlight"]

T = TypeVar("T")


class Abandoned(ClientError):
    """The caller stopped waiting for an exchange (the leader changed meanwhile)."""


class _Job(Generic[T]):
    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = False
        self.result: T | None = None
        self.error: BaseException | None = None


class _Worker(threading.Thread):
    """Runs jobs one after the other; once abandoned, ends after the job it runs."""

    def __init__(self, cond: threading.Condition, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.cond = cond
        self.jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self.abandoned = False

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller
                job.error = exc
            with self.cond:
                job.done = True
                self.cond.notify_all()
            if self.abandoned:
                return


class InFlight:
    """One exchange at a time, in a worker thread; see the module docstring."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._worker: _Worker | None = None
        self._interrupts = 0

    def interrupt(self) -> None:
        """Make a waiting caller ask its ``reason_to_stop`` (safe from any thread)."""
        with self._cond:
            self._interrupts += 1
            self._cond.notify_all()

    def run(self, fn: Callable[[], T], reason_to_stop: Callable[[], str | None]) -> T:
        """``fn()``'s result (or exception); ``Abandoned`` when ``reason_to_stop()``
        names a reason (it is called without any lock held): once before ``fn`` starts,
        for a change that came before this call began to count interrupts (no interrupt
        would tell of it), then after each interrupt."""
        job: _Job[T] = _Job(fn)
        with self._cond:
            seen = self._interrupts
        reason = reason_to_stop()
        if reason is not None:
            raise Abandoned(reason)  # nothing sent
        with self._cond:
            worker = self._start_worker()
        worker.jobs.put(job)
        while True:
            with self._cond:
                while not job.done and self._interrupts == seen:
                    self._cond.wait()
                if job.done:
                    break
                seen = self._interrupts
            reason = reason_to_stop()
            if reason is not None:
                with self._cond:
                    if job.done:
                        break
                    self._abandon(worker)
                raise Abandoned(reason)
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def close(self) -> None:
        """Let the worker end (a running exchange first finishes on its own)."""
        with self._cond:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.abandoned = True
            worker.jobs.put(None)

    def _start_worker(self) -> _Worker:
        if self._worker is None:
            self._worker = _Worker(self._cond, f"{self.name} request")
            self._worker.start()
        return self._worker

    def _abandon(self, worker: _Worker) -> None:
        worker.abandoned = True
        worker.jobs.put(None)  # ends it if it finishes before seeing the flag
        if self._worker is worker:
            self._worker = None
