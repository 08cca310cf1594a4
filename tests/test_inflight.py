"""InFlight: an exchange the caller stops waiting for when the leader moves."""

from __future__ import annotations

import threading

import pytest

from canal_client.inflight import Abandoned, InFlight

WAIT_S = 30.0


def test_results_and_errors_pass_through() -> None:
    flight = InFlight("t")
    assert flight.run(lambda: 42, lambda: None) == 42

    def boom() -> int:
        raise ValueError("x")

    with pytest.raises(ValueError, match="x"):
        flight.run(boom, lambda: None)
    flight.close()


def test_an_interrupt_with_a_reason_abandons_and_the_next_call_gets_a_new_worker() -> None:
    flight = InFlight("t")
    release = threading.Event()
    reasons: list[str | None] = [None, "moved"]  # the first interrupt is spurious
    started, asked = threading.Event(), threading.Event()

    def reason() -> str | None:
        asked.set()
        return reasons.pop(0) if reasons else "moved"

    def stuck() -> str:
        started.set()
        release.wait(WAIT_S)
        return "late"

    def interrupt_twice() -> None:
        started.wait(WAIT_S)
        flight.interrupt()
        asked.wait(WAIT_S)
        flight.interrupt()

    threading.Thread(target=interrupt_twice).start()
    with pytest.raises(Abandoned, match="moved"):
        flight.run(stuck, reason)
    assert flight.run(lambda: "fresh", lambda: None) == "fresh"  # not behind the stuck one
    release.set()
    flight.close()
