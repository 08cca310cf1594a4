"""Chaos fixtures and the marker.

Every scenario is marked ``chaos`` and runs in ``make test`` (``scripts/test.sh``)::

    .venv/bin/pytest tests/chaos                     # every scenario + the 1-minute nemesis
    .venv/bin/pytest -m "not chaos"                  # everything else
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: a failure scenario under load (tests/chaos)")


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
