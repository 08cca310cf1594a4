"""How a connector retries: one ``RetryPolicy`` (``canal_cluster.retry``) for every call.

- the wait between attempts is the policy's delay, counted again from its start when
  the leader changed since the last wait (the backoff that grew against a dead leader
  must not delay the first calls to the new one), at least the server's Retry-After
  (at most ``MAX_RETRY_AFTER_S``), and ended early by a leader change;
- until a leader was reached once, calls give up by the connect timeout
  (``RetryExhausted`` naming what was not reachable); later ones retry through
  failovers, but never past ``set_deadline``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from canal_client.resolver import Leader, LeaderResolver
from canal_cluster.retry import RetryPolicy
from canal_protocol.errors import LeaderUnavailable, RetryExhausted

__all__ = ["DEFAULT_RETRY", "MAX_RETRY_AFTER_S", "Retries"]

log = logging.getLogger("canal_client")
T = TypeVar("T")

DEFAULT_RETRY = RetryPolicy(initial_s=0.1, multiplier=2.0, max_delay_s=2.0, attempts=-1)
MAX_RETRY_AFTER_S = 30.0


class Retries:
    """A connector's retry policy with its deadlines and backoff (see the module doc)."""

    def __init__(
        self,
        policy: RetryPolicy | None,
        resolver: LeaderResolver,
        what: Callable[[str], str],
        connect_timeout_s: float | None,
    ) -> None:
        self.policy = dataclasses.replace(policy or DEFAULT_RETRY, sleep=self._sleep)
        self._resolver = resolver
        self._what = what
        self.connect_timeout_s = connect_timeout_s
        self.connect_deadline: float | None = None
        self.deadline: float | None = None  # ``set_deadline``
        self.reached = False  # a leader was reached once: retry through failovers
        self._retry_after = 0.0
        self._backoff: tuple[Leader | None, Iterator[float]] | None = None  # leader, its delays

    @property
    def connecting(self) -> bool:
        """No leader was reached yet and the connect timeout bounds the calls."""
        return not self.reached and self.connect_deadline is not None

    def start_connect(self) -> None:
        """``connect()``: the connect timeout starts now, unless a leader was reached."""
        if self.connect_timeout_s is not None and not self.reached:
            self.connect_deadline = time.monotonic() + self.connect_timeout_s

    def failed(self, exc: BaseException) -> None:
        """An attempt failed with ``exc``: the next wait lasts at least its Retry-After."""
        if isinstance(exc, LeaderUnavailable) and exc.retry_after_s is not None:
            self._retry_after = min(exc.retry_after_s, MAX_RETRY_AFTER_S)

    def run(
        self,
        what: str,
        attempt: Callable[[], T],
        retryable: tuple[type[BaseException], ...],
    ) -> T:
        """``attempt`` under the policy, bounded by the connect timeout (until a leader
        was reached) and by ``set_deadline``."""
        give_up = self.give_up_at()
        policy = self.policy
        if give_up is not None:
            policy = dataclasses.replace(policy, deadline_s=max(0.0, give_up - time.monotonic()))
        try:
            return policy.call(attempt, self._what(what), retryable, self.logger(what))
        except RetryExhausted as exc:
            if not self.connecting:
                raise
            raise self.not_connected(what, exc.attempts, exc.last_error) from exc

    def give_up_at(self) -> float | None:
        bounds = [self.deadline] if self.deadline is not None else []
        if self.connecting:
            assert self.connect_deadline is not None
            bounds.append(self.connect_deadline)
        return min(bounds, default=None)

    def not_connected(self, what: str, attempts: int, last: BaseException | None) -> RetryExhausted:
        return RetryExhausted(
            f"{self._what(what)}: not connected after {self.connect_timeout_s:g} s",
            attempts,
            last,
        )

    def logger(self, what: str) -> Callable[[int, BaseException], None]:
        def log_retry(attempt: int, exc: BaseException) -> None:
            level = logging.INFO if attempt <= 3 else logging.WARNING
            log.log(level, "%s: attempt %d failed: %s", self._what(what), attempt, exc)

        return log_retry

    def _sleep(self, delay: float) -> None:
        """Wait before the next attempt: the policy's delay, but counted again from its
        start when the leader changed since the last wait, and at least the server's
        Retry-After; a leader change ends the wait early."""
        leader = self._resolver.current()
        if self._backoff is None or self._backoff[0] != leader:
            self._backoff = (leader, self.policy.delays())
        fresh = next(self._backoff[1], delay)
        wait, self._retry_after = max(fresh, self._retry_after), 0.0
        give_up = self.give_up_at()
        if give_up is not None:  # a long Retry-After must not outlast the deadline
            wait = min(wait, max(0.0, give_up - time.monotonic()))
        self._resolver.wait_change(wait)
