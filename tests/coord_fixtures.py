"""Fixtures for the coordinator and election tests: both backends behind one contract."""

from __future__ import annotations

import gc
import itertools
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from memory_coordinator import MemoryCoordinator

from canal_cluster.coordinator import Coordinator, Lease
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.retry import wait_until
from canal_cluster.running import ElectionConfig, Reason, RunningMonitor
from canal_ha.sandbox import Sandbox

__all__ = [
    "ETCD_CFG",
    "ETCD_TIMEOUT_S",
    "WAIT_S",
    "Backend",
    "Calls",
    "Cluster",
    "FakeClock",
    "backend",
    "etcd_endpoints",
]

WAIT_S = 60.0


@dataclass
class FakeClock:
    """A monotonic clock tests move by hand."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class Backend:
    """One coordinator under test plus how to make time pass for its leases."""

    name: str
    coord: Coordinator
    prefix: str
    clock: FakeClock | None = None
    _n: itertools.count[int] = field(default_factory=itertools.count)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def let_lease_expire(self, lease: Lease, key: str) -> None:
        """Stop caring for ``lease`` and return once etcd (or the fake) dropped ``key``."""
        if isinstance(self.coord, MemoryCoordinator):
            assert self.clock is not None
            self.clock.advance(lease.ttl_s + 0.001)
            self.coord.tick()
        wait_until(lambda: self.coord.get(key) is None, f"{key} expired", WAIT_S)


@pytest.fixture
def etcd_endpoints(request: pytest.FixtureRequest) -> list[str]:
    """The session sandbox's etcd endpoints.

    The sandbox is requested here, inside a filter that ignores ResourceWarning:
    its MariaDB start-up leaks unix sockets whose finalisation would otherwise fail
    whichever test happens to be running when the garbage collector finds them.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        box: Sandbox = request.getfixturevalue("sandbox")
        gc.collect()
    return box.etcd_endpoints


@pytest.fixture(params=["memory", "etcd"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    prefix = f"/t-{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        clock = FakeClock()
        coord: Coordinator = MemoryCoordinator(clock=clock)
        yield Backend("memory", coord, prefix, clock)
        coord.close()
        return
    endpoints = request.getfixturevalue("etcd_endpoints")
    coord = EtcdCoordinator(endpoints, timeout_s=5.0)
    try:
        yield Backend("etcd", coord, prefix)
    finally:
        coord.delete(prefix, prefix=True)
        coord.close()


class Calls:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, int]] = []

    def gained(self, node: str) -> Callable[[int], None]:
        return lambda epoch: self.log.append(("gained", node, epoch))

    def lost(self, node: str) -> Callable[[int], None]:
        return lambda epoch: self.log.append(("lost", node, epoch))


ETCD_CFG = ElectionConfig(ttl_s=2, safety_margin_s=0.5, loop_interval_s=0.2, switch_delay_s=1)
ETCD_TIMEOUT_S = 0.5


class Cluster:
    """Monitors of one key, each with its own etcd client (like separate nodes)."""

    def __init__(self, endpoints: list[str], key: str, cfg: ElectionConfig = ETCD_CFG) -> None:
        self.endpoints, self.key, self.cfg = endpoints, key, cfg
        self.monitors: dict[str, RunningMonitor] = {}
        self.coords: list[EtcdCoordinator] = []
        self.calls = Calls()
        self.violations: list[list[str]] = []
        self.sampled: set[str] = set()  # started and not crashed: may serve
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def add(self, node: str) -> RunningMonitor:
        coord = EtcdCoordinator(self.endpoints, timeout_s=ETCD_TIMEOUT_S)
        self.coords.append(coord)
        m = RunningMonitor(
            coord, self.key, node, f"http://{node}", self.cfg,
            on_gained=self.calls.gained(node), on_lost=self.calls.lost(node),
        )  # fmt: skip
        self.monitors[node] = m
        return m

    def start(self, *nodes: str) -> Cluster:
        ms = [self.add(n) for n in nodes]
        for m in ms:
            m.start()
        self.sampled.update(nodes)
        if not self._sampler.is_alive():
            self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            leaders = [n for n in list(self.sampled) if self.monitors[n].is_leader()]
            if len(leaders) > 1:
                self.violations.append(leaders)

    def crash(self, node: str) -> None:
        """Stop the node's thread without releasing anything (a dead process serves nothing)."""
        self.sampled.discard(node)
        self.monitors[node].stop(release=False)

    def leaders(self) -> list[str]:
        return [n for n in self.sampled if self.monitors[n].is_leader()]

    def wait_leader(self, other_than: str | None = None) -> str:
        def one() -> bool:
            ls = self.leaders()
            return len(ls) == 1 and ls[0] != other_than

        wait_until(one, f"one leader of {self.key}", WAIT_S)
        return self.leaders()[0]

    def reasons(self, node: str) -> list[Reason]:
        return [e.reason for e in self.monitors[node].history()]

    def close(self) -> None:
        self._stop.set()
        for m in self.monitors.values():
            m.stop()
        for c in self.coords:
            c.close()
        if self._sampler.is_alive():
            self._sampler.join()
