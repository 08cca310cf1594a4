"""The log's rate limit per cause (``canal_server.log_limit``), on a fake clock."""

from __future__ import annotations

import io
import logging

from canal_server.log_limit import LogRateFilter, RateLimit


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _logger(clock: _Clock, burst: int = 3) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(LogRateFilter(RateLimit(burst=burst, window_s=60.0, clock=clock)))
    logger = logging.getLogger(f"test_log_limit.{id(out)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return logger, out


def test_a_cause_writes_its_burst_per_window_then_says_what_it_dropped() -> None:
    clock = _Clock()
    log, out = _logger(clock)

    def bad(i: int) -> None:
        log.warning("%s: bad request %d", "example", i)  # one cause: this call site

    for i in range(100):
        bad(i)
    assert out.getvalue().count("bad request") == 3
    log.warning("%s: other", "example")  # another cause has its own budget
    assert "other" in out.getvalue()
    clock.now += 61
    bad(100)
    last = out.getvalue().splitlines()[-1]
    assert last == "WARNING example: bad request 100 [97 similar lines dropped before this one]"


def test_the_first_argument_tells_causes_apart() -> None:
    clock = _Clock()
    log, out = _logger(clock, burst=1)
    for d in ("d1", "d2", "d1", "d2"):
        log.info("%s: gained", d)
    assert out.getvalue().splitlines() == ["INFO d1: gained", "INFO d2: gained"]


def test_only_the_first_line_of_a_window_keeps_its_traceback() -> None:
    clock = _Clock()
    log, out = _logger(clock, burst=5)
    for _ in range(3):
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("unexpected %s", "ValueError")
    text = out.getvalue()
    assert text.count("Traceback") == 1
    assert text.count("[traceback as in this cause's first line]") == 2
