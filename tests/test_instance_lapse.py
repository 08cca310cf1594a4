"""The binlog reader of a leader's term through a short lapse of the election's
confirmation: a keepalive sent before the fencing deadline and answered after it makes
``leader_epoch()`` None meanwhile, then the same epoch again. The reader pauses (puts
nothing) and goes on; only the end of the term (``on_lost``, another epoch, or no
confirmation within ``election.ttl_s``) ends it.

Real parts: an ``Instance`` reading the session sandbox's MariaDB, its term driven by a
real ``RunningMonitor`` on the in-memory coordinator with a fake clock (the lapse is
made by a keepalive that holds while the clock passes the deadline), or by a stand-in
monitor for the cases a real one cannot produce on cue.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pytest
from coord_fixtures import FakeClock
from memory_coordinator import MemoryCoordinator

from canal_cluster.coordinator import Lease
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_cluster.running import ElectionConfig, Reason, RunningMonitor
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import EntryType
from canal_server.config import DestinationConfig
from canal_server.embedded import EmbeddedServer
from canal_server.instance import Instance, Role, build_instance

WAIT_S = 60.0
# Long enough that a paused reader never gives up during these tests (real seconds).
CFG = ElectionConfig(ttl_s=60, safety_margin_s=2, loop_interval_s=1, switch_delay_s=5)


class _LateKeepalive(MemoryCoordinator):
    """The next keepalive moves the clock by ``late_s`` (past the fencing deadline) and
    waits for ``answer`` before etcd handles it: a keepalive answered late."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.clock = clock
        self.late_s: float | None = None
        self.in_flight = threading.Event()
        self.answer = threading.Event()

    def keepalive(self, lease: Lease) -> int:
        late, self.late_s = self.late_s, None
        if late is not None:
            self.clock.advance(late)
            self.in_flight.set()
            assert self.answer.wait(WAIT_S), "the test never answered the keepalive"
        return super().keepalive(lease)


@dataclass
class _Stand:
    """A monitor stand-in: ``epoch`` is what ``leader_epoch()`` says."""

    epoch: int | None
    config: ElectionConfig = CFG
    fenced: list[int] = field(default_factory=list)

    def leader_epoch(self) -> int | None:
        return self.epoch

    def report_fenced(self, epoch: int) -> None:
        self.fenced.append(epoch)


class _Leader:
    """One destination's instance on the sandbox primary; rows go to ``schema.t``."""

    def __init__(self, db: Sandbox, name: str, slave_id: int, coord: MemoryCoordinator) -> None:
        dsn = db.primary.dsn()
        self.db, self.name, self.schema, self.coord = db, name, f"lapse_{name}", coord
        db.primary.execute(
            f"CREATE DATABASE IF NOT EXISTS {self.schema}",
            f"CREATE TABLE IF NOT EXISTS {self.schema}.t (id INT PRIMARY KEY)",
        )
        config = DestinationConfig.model_validate({
            "name": name, "slave_id": slave_id, "heartbeat_s": 1.0,
            "master": {"address": f"{dsn['host']}:{dsn['port']}"},
            "db": {"username": dsn["user"], "password": dsn["password"]},
            "filter": {"regex": f"{self.schema}\\..*"},
        })  # fmt: skip
        self.keys = Keys(f"/lapse-{name}")
        self.inst: Instance = build_instance(config, coord, self.keys, flush_period_ms=200)
        self.seen: list[int] = []

    def server(self) -> EmbeddedServer:
        serving = self.inst.serving()
        assert serving is not None, f"{self.name} is not serving"
        return serving[0]

    def reading(self) -> None:
        wait_until(lambda: self.inst.reader_status().state == "running", "reader runs", WAIT_S)

    def insert(self, key: int) -> None:
        self.db.primary.execute(f"INSERT INTO {self.schema}.t VALUES ({key})")

    def receive(self, server: EmbeddedServer, key: int) -> None:
        """Get and ack batches of client ``c`` until the row ``key`` came."""

        def got() -> bool:
            self.take(server, timeout_s=1.0)
            return key in self.seen

        wait_until(got, f"row {key} delivered", WAIT_S)

    def take(self, server: EmbeddedServer, timeout_s: float = 0.0) -> None:
        batch = server.get("c", 100, timeout_s)
        for e in batch.entries:
            if e.type is EntryType.ROWDATA:
                self.seen.extend(int(str(r.after[0].value)) for r in e.rows if r.after)

    def reader_threads(self) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == f"reader {self.name}"]

    def drop(self) -> None:
        self.db.primary.execute(f"DROP DATABASE IF EXISTS {self.schema}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def late(clock: FakeClock) -> Iterator[_LateKeepalive]:
    coord = _LateKeepalive(clock)
    yield coord
    coord.answer.set()  # never leave a keepalive waiting


def _elected(leader: _Leader, coord: MemoryCoordinator, clock: FakeClock) -> RunningMonitor:
    inst = leader.inst
    monitor = RunningMonitor(
        coord, leader.keys.running(leader.name), "n1", "http://n1", CFG,
        on_gained=inst.on_gained, on_lost=inst.on_lost, clock=clock,
    )  # fmt: skip
    inst.attach(monitor)
    assert monitor.cycle(clock()) is Reason.WON
    leader.reading()
    return monitor


def _late_cycle(
    monitor: RunningMonitor, late: _LateKeepalive, late_s: float
) -> tuple[threading.Thread, list[Reason]]:
    """Start a leader cycle whose keepalive is answered ``late_s`` after the clock's
    now, set just before the deadline; returns the thread and its reasons."""
    late.clock.now = monitor.valid_until - 0.5
    late.late_s = late_s
    reasons: list[Reason] = []
    t = threading.Thread(target=lambda: reasons.append(monitor.cycle(late.clock())))
    t.start()
    assert late.in_flight.wait(WAIT_S)
    assert monitor.leader_epoch() is None, "the deadline passed while the keepalive is out"
    return t, reasons


def _paused(leader: _Leader) -> None:
    def stopped() -> bool:
        return leader.inst.reader_status().state in ("paused", "idle")

    wait_until(stopped, "reader stopped putting", WAIT_S)
    status = leader.inst.reader_status()
    assert status.state == "paused", f"the reader ended: {status}"
    assert leader.reader_threads(), "the reader thread ended"


def test_reader_pauses_while_the_lead_is_unconfirmed_and_goes_on_in_the_same_epoch(
    db: Sandbox, late: _LateKeepalive, clock: FakeClock
) -> None:
    leader = _Leader(db, "lapse1", 7311, late)
    monitor = _elected(leader, late, clock)
    epoch = monitor.leader_epoch()
    try:
        server = leader.server()
        server.subscribe("c")
        leader.insert(1)
        leader.receive(server, 1)
        cycle, reasons = _late_cycle(monitor, late, late_s=1.0)
        leader.insert(2)
        _paused(leader)
        assert "not confirmed" in leader.inst.reader_status().error
        assert leader.inst.role() == (Role.FENCED, epoch)
        leader.take(server)
        assert 2 not in leader.seen, "nothing is put while the lead is unconfirmed"
        late.answer.set()
        cycle.join(WAIT_S)
        assert reasons == [Reason.STILL_LEADER] and monitor.leader_epoch() == epoch
        leader.receive(server, 2)
        leader.insert(3)
        leader.receive(server, 3)
        assert leader.seen == [1, 2, 3]
        assert leader.inst.reader_status().state == "running"
        assert leader.inst.reader_status().error == ""
    finally:
        late.answer.set()  # a failed test must not leave the cycle holding the monitor
        monitor.stop()
        leader.drop()
    assert not leader.reader_threads()


def test_a_paused_reader_ends_when_the_lease_turns_out_lost(
    db: Sandbox, late: _LateKeepalive, clock: FakeClock
) -> None:
    leader = _Leader(db, "lapse2", 7312, late)
    monitor = _elected(leader, late, clock)
    try:
        server = leader.server()
        server.subscribe("c")
        leader.insert(1)
        leader.receive(server, 1)
        cycle, reasons = _late_cycle(monitor, late, late_s=3.0)  # past the lease's TTL too
        leader.insert(2)
        _paused(leader)
        late.answer.set()
        cycle.join(WAIT_S)
        assert reasons == [Reason.LOST]
        assert leader.inst.role() == (Role.STANDBY, None)
        assert not leader.reader_threads(), "on_lost ends the paused reader"
    finally:
        late.answer.set()  # a failed test must not leave the cycle holding the monitor
        monitor.stop()
        leader.drop()


def _stand_in(leader: _Leader) -> _Stand:
    """The instance leads by a campaign of its own (its fenced meta writes apply) and
    asks a stand-in monitor, which says that epoch."""
    lease = leader.coord.grant_lease(CFG.ttl_s)
    won = leader.coord.campaign(leader.keys.running(leader.name), b'{"node": "n1"}', lease)
    assert won.epoch is not None
    stand = _Stand(won.epoch)
    leader.inst.attach(cast(RunningMonitor, stand))
    leader.inst.on_gained(won.epoch)
    leader.reading()
    return stand


def test_a_paused_reader_ends_when_another_epoch_leads(db: Sandbox) -> None:
    leader = _Leader(db, "lapse3", 7313, MemoryCoordinator())
    stand = _stand_in(leader)
    epoch = stand.epoch
    assert epoch is not None
    try:
        stand.epoch = None
        leader.insert(1)
        _paused(leader)
        stand.epoch = epoch + 10
        wait_until(lambda: not leader.reader_threads(), "reader ended", WAIT_S)
        assert leader.inst.reader_status().state == "idle" and stand.fenced == []
    finally:
        leader.inst.on_lost(epoch)
        leader.drop()


def test_a_reader_unconfirmed_for_the_ttl_gives_up_and_steps_down(db: Sandbox) -> None:
    leader = _Leader(db, "lapse4", 7314, MemoryCoordinator())
    stand = _stand_in(leader)
    epoch = stand.epoch
    assert epoch is not None
    stand.config = ElectionConfig(ttl_s=1, safety_margin_s=0.5)
    try:
        stand.epoch = None
        leader.insert(1)
        wait_until(lambda: not leader.reader_threads(), "reader gave up", WAIT_S)
        status = leader.inst.reader_status()
        assert stand.fenced == [epoch], "it makes the monitor step down"
        assert "not confirmed again within election.ttl_s" in status.error, status
    finally:
        leader.inst.on_lost(epoch)
        leader.drop()
