"""One retry policy object instead of hand-written retry loops.

``RetryPolicy`` describes backoff (initial delay, multiplier, cap), a bound on
attempts (-1 = forever) and an optional overall deadline. ``call`` retries a
function on chosen exceptions; ``wait_until`` polls a predicate (readiness checks).
Sleeping goes through an injectable function so unit tests need no real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from canal_protocol.errors import RetryExhausted

__all__ = ["RetryPolicy", "wait_until"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with a cap, an attempt bound and an optional deadline."""

    initial_s: float = 0.05
    multiplier: float = 2.0
    max_delay_s: float = 2.0
    attempts: int = -1
    deadline_s: float | None = None
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_delay_s < 0:
            raise ValueError("retry delays must be >= 0")
        if self.multiplier < 1:
            raise ValueError("retry multiplier must be >= 1")
        if self.attempts == 0 or self.attempts < -1:
            raise ValueError("retry attempts must be >= 1 or -1 (forever)")

    def delays(self) -> Iterator[float]:
        """Delays to sleep between attempts, bounded by attempts (not by deadline)."""
        delay = self.initial_s
        n = 1
        while self.attempts == -1 or n < self.attempts:
            yield min(delay, self.max_delay_s)
            delay *= self.multiplier
            n += 1

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        on_retry: Callable[[int, BaseException], None] | None = None,
    ) -> T:
        """Call ``fn`` until it returns; retry on ``retry_on`` with backoff."""
        start = self.clock()
        attempt = 0
        delays = self.delays()
        while True:
            attempt += 1
            try:
                return fn()
            except retry_on as exc:
                delay = next(delays, None)
                if delay is None or self._past_deadline(start, delay):
                    raise RetryExhausted(what, attempt, exc) from exc
                if on_retry is not None:
                    on_retry(attempt, exc)
                self.sleep(delay)

    def _past_deadline(self, start: float, next_delay: float) -> bool:
        if self.deadline_s is None:
            return False
        return self.clock() + next_delay - start > self.deadline_s


def wait_until(
    predicate: Callable[[], bool],
    what: str,
    timeout_s: float,
    interval_s: float = 0.05,
    max_interval_s: float = 0.5,
) -> None:
    """Poll ``predicate`` with backoff until true; RetryExhausted after ``timeout_s``.

    Exceptions from the predicate count as "not yet" and the last one is reported.
    """
    policy = RetryPolicy(
        initial_s=interval_s, multiplier=1.5, max_delay_s=max_interval_s, deadline_s=timeout_s
    )

    def check() -> None:
        if not predicate():
            raise _NotYet(what)

    policy.call(check, what)


class _NotYet(Exception):
    def __str__(self) -> str:
        return f"{self.args[0]} not reached yet"
