"""InFlight: an exchange the caller stops waiting for when the leader moves."""

from __future__ import annotations

import threading

import pytest

from canal_client.inflight import Abandoned, InFlight

WAIT_S = 30.0
SHORT_S = 5.0  # "at once" on a loaded machine


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


def test_a_leader_change_before_the_wait_abandons_at_once() -> None:
    """The watch named another leader after the caller picked its leader and before
    ``run()`` began to wait: no interrupt comes later, yet ``run()`` abandons at once
    and sends nothing (it asks ``reason_to_stop`` before waiting)."""
    flight = InFlight("t")
    release, started = threading.Event(), threading.Event()
    outcome: list[object] = []

    def stuck() -> str:
        started.set()
        release.wait(WAIT_S)
        return "late"

    def call() -> None:
        try:
            outcome.append(flight.run(stuck, lambda: "moved"))
        except Abandoned as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(SHORT_S)
    waited = caller.is_alive()
    release.set()  # a caller still waiting (the bug) gets "late"
    caller.join(WAIT_S)
    flight.close()
    assert not waited, f"run() still waited after {SHORT_S} s for an interrupt that never comes"
    assert len(outcome) == 1 and isinstance(outcome[0], Abandoned), outcome
    assert str(outcome[0]) == "moved"
    assert not started.is_set(), "the exchange was sent to the deposed leader"
