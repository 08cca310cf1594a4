"""RetryPolicy and wait_until: backoff, attempt bounds, deadlines (fake clock, no real sleep)."""

from __future__ import annotations

import pytest

from canal_cluster.retry import RetryPolicy, wait_until
from canal_protocol.errors import RetryExhausted


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def test_backoff_grows_and_is_capped() -> None:
    p = RetryPolicy(initial_s=0.1, multiplier=2, max_delay_s=0.5, attempts=6)
    assert list(p.delays()) == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_call_retries_until_success() -> None:
    t = FakeTime()
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "up"

    p = RetryPolicy(initial_s=1, attempts=5, sleep=t.sleep, clock=t.clock)
    assert p.call(flaky, "flaky", retry_on=(ConnectionError,)) == "up"
    assert t.slept == [1, 2]


def test_call_gives_up_after_attempts_with_last_error() -> None:
    t = FakeTime()
    p = RetryPolicy(initial_s=1, attempts=3, sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryExhausted) as info:
        p.call(lambda: 1 / 0, "divide")
    assert info.value.attempts == 3
    assert isinstance(info.value.last_error, ZeroDivisionError)
    assert "divide" in str(info.value)


def test_call_respects_deadline() -> None:
    t = FakeTime()
    p = RetryPolicy(initial_s=1, multiplier=1, deadline_s=3.5, sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryExhausted):
        p.call(lambda: 1 / 0, "forever")
    assert t.now <= 3.5


def test_unexpected_errors_are_not_retried() -> None:
    p = RetryPolicy(attempts=5)
    empty: dict[str, int] = {}
    with pytest.raises(KeyError):
        p.call(lambda: empty["x"], "lookup", retry_on=(ConnectionError,))


@pytest.mark.parametrize(
    "kwargs", [{"attempts": 0}, {"attempts": -2}, {"multiplier": 0.5}, {"initial_s": -1}]
)
def test_bad_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(RetryExhausted, match="the moon"):
        wait_until(lambda: False, "the moon", timeout_s=0.2, interval_s=0.01)
