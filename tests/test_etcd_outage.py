"""Elections while etcd members die or freeze (private 3-member etcd per test).

- one member killed at a time: the leader keeps its lease, no leadership change;
- every member frozen (SIGSTOP): the leader fences itself by its own clock, nobody
  leads while etcd is gone, the process stays nearly idle, and once etcd is back
  exactly one leader is elected, after the old one fenced;
- every member killed and restarted: same, with dead endpoints (refused
  connections) instead of frozen ones;
- a watch is re-established after each of these, without losing or repeating events.
"""

from __future__ import annotations

import gc
import logging
import time
import uuid
import warnings
from collections.abc import Iterator

import pytest
from conftest import SandboxFactory
from coord_fixtures import ETCD_CFG, WAIT_S, Cluster

from canal_cluster.coordinator import WatchEvent, WatchEventType
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.retry import wait_until
from canal_cluster.running import ElectionConfig, MonitorEvent, Reason
from canal_ha.sandbox import Sandbox

log = logging.getLogger(__name__)

# An idle process sits near 0; a watch or client spinning on a dead endpoint takes a
# whole core. A generous bound catches the spin without depending on machine speed.
MAX_CPU_FRACTION = 0.3
OUTAGE_S = 10.0


@pytest.fixture
def etcd3(make_sandbox: SandboxFactory) -> Sandbox:
    with warnings.catch_warnings():  # MariaDB start-up leaks sockets (see coord_fixtures)
        warnings.simplefilter("ignore", ResourceWarning)
        box = make_sandbox(etcd_members=3)
        gc.collect()
    return box


@pytest.fixture
def cluster(etcd3: Sandbox) -> Iterator[Cluster]:
    c = Cluster(etcd3.etcd_endpoints, f"/t-{uuid.uuid4().hex[:12]}/running", ETCD_CFG)
    try:
        yield c
    finally:
        c.close()


def _cpu_fraction_while(wait: float) -> float:
    """CPU time this process used per wall second over the next ``wait`` seconds."""
    cpu0, t0 = time.process_time(), time.monotonic()
    time.sleep(wait)  # a measurement window, not a synchronisation
    fraction = (time.process_time() - cpu0) / (time.monotonic() - t0)
    log.info("CPU while etcd is down: %.1f%% of one core", 100 * fraction)
    return fraction


def _bad_events(c: Cluster) -> list[MonitorEvent]:
    bad = {Reason.LOST, Reason.FENCED, Reason.STALE_EPOCH}
    return [e for m in c.monitors.values() for e in m.history() if e.reason in bad]


def test_one_member_killed_at_a_time_changes_no_leadership(
    etcd3: Sandbox, cluster: Cluster
) -> None:
    cluster.cfg = ElectionConfig(
        ttl_s=3, safety_margin_s=0.5, loop_interval_s=0.2, switch_delay_s=1
    )
    cluster.start("a", "b", "c")
    leader = cluster.wait_leader()
    monitor = cluster.monitors[leader]
    epoch = monitor.leader_epoch()
    cpu: list[float] = []
    for member in etcd3.etcd_cluster.members:
        member.process.kill()
        before = monitor.keepalives_ok
        cpu0, t0 = time.process_time(), time.monotonic()
        wait_until(lambda: monitor.keepalives_ok >= before + 15, "keepalives go on", WAIT_S)  # noqa: B023
        cpu.append((time.process_time() - cpu0) / (time.monotonic() - t0))
        assert cluster.leaders() == [leader] and monitor.leader_epoch() == epoch
        etcd3.etcd_cluster.restart_member(member.name)
    assert _bad_events(cluster) == []
    assert cluster.violations == []
    log.info("CPU with one member down: %s", ", ".join(f"{100 * x:.1f}%" for x in cpu))
    assert max(cpu) < MAX_CPU_FRACTION, cpu


def _fenced_before_new_leader(cluster: Cluster, old: str, old_epoch: int) -> None:
    new = cluster.wait_leader()
    monitor = cluster.monitors[new]
    before = monitor.keepalives_ok
    wait_until(lambda: monitor.keepalives_ok >= before + 5, "new leader stays", WAIT_S)
    assert cluster.leaders() == [new]
    new_epoch = monitor.leader_epoch()
    assert new_epoch is not None and new_epoch > old_epoch
    fenced = [e for e in cluster.monitors[old].history() if e.reason is Reason.FENCED]
    assert fenced and fenced[0].epoch == old_epoch
    gained = [
        e
        for m in cluster.monitors.values()
        for e in m.history()
        if e.epoch == new_epoch and e.reason in (Reason.WON, Reason.RECAMPAIGN_AS_PREVIOUS_OWNER)
    ]
    assert len(gained) == 1
    assert fenced[0].seq < gained[0].seq and fenced[0].at <= gained[0].at
    assert cluster.violations == []


def test_frozen_etcd_leader_fences_then_exactly_one_leader(
    etcd3: Sandbox, cluster: Cluster
) -> None:
    cluster.start("a", "b", "c")
    old = cluster.wait_leader()
    old_epoch = cluster.monitors[old].leader_epoch()
    assert old_epoch is not None
    members = etcd3.etcd_cluster.members
    for m in members:
        m.process.pause()
    try:
        t0 = time.monotonic()
        wait_until(lambda: not cluster.monitors[old].is_leader(), "old leader fenced", WAIT_S)
        wait_until(lambda: Reason.FENCED in cluster.reasons(old), "FENCED recorded", WAIT_S)
        cpu = _cpu_fraction_while(max(1.0, OUTAGE_S - (time.monotonic() - t0)))
        assert cluster.leaders() == []  # nobody leads while etcd is frozen
    finally:
        for m in members:
            m.process.resume()
    assert cpu < MAX_CPU_FRACTION
    _fenced_before_new_leader(cluster, old, old_epoch)


def test_killed_etcd_leader_fences_then_exactly_one_leader_after_restart(
    etcd3: Sandbox, cluster: Cluster
) -> None:
    cluster.start("a", "b", "c")
    old = cluster.wait_leader()
    old_epoch = cluster.monitors[old].leader_epoch()
    assert old_epoch is not None
    members = etcd3.etcd_cluster.members
    for m in members:
        m.process.kill()
    t0 = time.monotonic()
    wait_until(lambda: Reason.FENCED in cluster.reasons(old), "old leader fenced", WAIT_S)
    cpu = _cpu_fraction_while(max(1.0, OUTAGE_S - (time.monotonic() - t0)))
    assert cluster.leaders() == []
    for m in members:
        m.process.start()
    for m in members:
        m.wait_healthy(WAIT_S)
    assert cpu < MAX_CPU_FRACTION
    _fenced_before_new_leader(cluster, old, old_epoch)


def test_watch_is_re_established_without_losing_or_repeating_events(etcd3: Sandbox) -> None:
    coord = EtcdCoordinator(etcd3.etcd_endpoints, timeout_s=1.0)
    prefix = f"/t-{uuid.uuid4().hex[:12]}/"
    seen: list[WatchEvent] = []
    start = coord.get_prefix("/").revision + 1
    watch = coord.watch(prefix, seen.append, prefix=True, start_revision=start)
    written: list[str] = []

    def put(name: str) -> None:
        # a put retried after a lost reply may land twice: one key per put tells them apart
        wait_until(lambda: coord.put(prefix + name, b"x") > 0, f"put {name}", WAIT_S)
        written.append(prefix + name)

    try:
        put("first")
        members = etcd3.etcd_cluster.members
        for i, member in enumerate(members):  # whichever member the stream is on dies once
            member.process.kill()
            put(f"while-{member.name}-down")
            etcd3.etcd_cluster.restart_member(member.name)
            put(f"after-{i}")
        for member in members:  # then all at once
            member.process.kill()
        for member in members:
            member.process.start()
        for member in members:
            member.wait_healthy(WAIT_S)
        put("after-full-outage")
        wait_until(lambda: {e.key for e in seen} >= set(written), "every put seen", WAIT_S)
        assert list(dict.fromkeys(e.key for e in seen)) == written  # in order
        revisions = [e.mod_revision for e in seen]
        assert revisions == sorted(set(revisions))  # nothing delivered twice
        assert all(e.type is WatchEventType.PUT for e in seen)
    finally:
        watch.cancel()
        coord.close()
