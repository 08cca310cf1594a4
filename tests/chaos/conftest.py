"""Chaos fixtures and markers.

Every scenario is marked ``chaos``; the slow ones also ``chaos_full``. ``chaos_full``
tests are *deselected* (not skipped) unless ``--chaos-full`` is given::

    .venv/bin/pytest tests/chaos --chaos-full        # every scenario
    CANAL_CHAOS_FULL=1 bash scripts/test.sh          # the same, inside the whole suite
    .venv/bin/pytest tests/chaos                     # the quick subset
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun

FULL_OPTION = "--chaos-full"
FULL_ENV = "CANAL_CHAOS_FULL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(FULL_OPTION, action="store_true", help="also run the chaos_full scenarios")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: a failure scenario under load (tests/chaos)")
    config.addinivalue_line("markers", "chaos_full: a slow chaos scenario (needs --chaos-full)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # --chaos-full exists when this conftest is an initial one (pytest tests/chaos ...);
    # CANAL_CHAOS_FULL=1 works for any invocation (pytest tests, scripts/test.sh).
    if config.getoption(FULL_OPTION, default=False) or os.environ.get(FULL_ENV) == "1":
        return
    keep = [i for i in items if i.get_closest_marker("chaos_full") is None]
    dropped = [i for i in items if i.get_closest_marker("chaos_full") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def collect_leaked_sockets() -> None:
    """Collect the sockets a sandbox start leaves in reference cycles, quietly (as
    reader_fixtures does; not imported from there: it is a plugin of tests/conftest.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def chaos_run(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[Sandbox], ChaosRun]]:
    """``chaos_run(sandbox)`` → a ChaosRun named after the test; closed at the end."""
    collect_leaked_sockets()
    made: list[ChaosRun] = []

    def make(box: Sandbox) -> ChaosRun:
        collect_leaked_sockets()  # what starting a private sandbox left behind
        name = request.node.name.removeprefix("test_")
        run = ChaosRun(name, box, tmp_path)
        made.append(run)
        return run

    try:
        yield make
    finally:
        for run in made:
            run.close()
        collect_leaked_sockets()
