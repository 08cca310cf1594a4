"""Shared fixtures: a real MariaDB (primary + GTID standby) and a real etcd, started here.

``sandbox`` is one session-wide sandbox for tests that only read and write rows.
Tests that kill, pause, promote or purge use ``make_sandbox`` to get their own.
Every process is stopped by pid at the end, also when a test fails.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_ha.sandbox import Sandbox

# Fixture modules shared by several test files, registered once here.
pytest_plugins = ("reader_fixtures",)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """Session-wide sandbox: MariaDB primary + GTID standby, one etcd member."""
    box = Sandbox(tmp_path_factory.mktemp("sandbox"), etcd_members=1, standby=True).start()
    try:
        yield box
    finally:
        box.stop()


SandboxFactory = Callable[..., Sandbox]


@pytest.fixture
def make_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFactory]:
    """A private sandbox for destructive tests: ``make_sandbox(etcd_members=3, standby=True)``."""
    started: list[Sandbox] = []
    counter = itertools.count()

    def make(etcd_members: int = 1, standby: bool = False) -> Sandbox:
        root = tmp_path_factory.mktemp(f"box{next(counter)}")
        box = Sandbox(Path(root), etcd_members=etcd_members, standby=standby)
        started.append(box)
        return box.start()

    try:
        yield make
    finally:
        for box in started:
            box.stop()


@pytest.fixture
def coord(sandbox: Sandbox) -> Iterator[EtcdCoordinator]:
    """A coordinator on the session's etcd, for looking at what the nodes wrote."""
    c = EtcdCoordinator(sandbox.etcd_endpoints, timeout_s=2.0)
    yield c
    c.close()
