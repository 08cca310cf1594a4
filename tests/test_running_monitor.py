"""RunningMonitor.cycle decisions, on the in-memory coordinator with a fake clock.

Fast and deterministic: every test drives ``cycle(now)`` by hand and asserts on the
returned reasons. The monitor threads on the real etcd are at the end of this file;
etcd members killed or stopped are in test_etcd_outage.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from coord_fixtures import (
    ETCD_CFG,
    ETCD_TIMEOUT_S,
    WAIT_S,
    Calls,
    Cluster,
    FakeClock,
    etcd_endpoints,
)
from memory_coordinator import MemoryCoordinator

from canal_cluster.coordinator import CampaignResult, Lease, Put
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_cluster.running import (
    ElectionConfig,
    Reason,
    RunningInfo,
    RunningMonitor,
    client_running_monitor,
    read_running,
    server_running_monitor,
)
from canal_protocol.errors import ConfigError, CoordinatorUnavailable, Fenced, HandoverTimeout

__all__ = ["etcd_endpoints"]  # fixture used below

R = Reason
CFG = ElectionConfig(ttl_s=10, safety_margin_s=2, loop_interval_s=1, switch_delay_s=5)
KEY = Keys().running("d1")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mem(clock: FakeClock) -> MemoryCoordinator:
    return MemoryCoordinator(clock=clock, timeout_s=1.0)


@pytest.fixture
def calls() -> Calls:
    return Calls()


def monitor(mem: MemoryCoordinator, clock: FakeClock, node: str, calls: Calls) -> RunningMonitor:
    return RunningMonitor(
        mem, KEY, node, f"http://{node}", CFG,
        on_gained=calls.gained(node), on_lost=calls.lost(node),
        clock=clock,
    )  # fmt: skip


def test_first_campaign_wins_and_keeps_leading(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a = monitor(mem, clock, "a", calls)
    assert a.cycle(clock()) is R.WON
    epoch = a.leader_epoch()
    assert epoch is not None and a.is_leader()
    assert calls.log == [("gained", "a", epoch)]
    info = read_running(mem, KEY)
    assert info == RunningInfo("a", "http://a", epoch)
    for _ in range(20):  # well past the ttl: keepalives keep it
        clock.advance(1)
        assert a.cycle(clock()) is R.STILL_LEADER
    assert a.leader_epoch() == epoch


def test_exactly_one_leader_among_three(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    ms = [monitor(mem, clock, n, calls) for n in "abc"]
    reasons = [m.cycle(clock()) for m in ms]
    assert reasons == [R.WON, R.OTHER_LEADER, R.OTHER_LEADER]
    assert [m.is_leader() for m in ms] == [True, False, False]


def test_lease_revoked_previous_owner_regrabs_at_once_others_wait(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a, b = monitor(mem, clock, "a", calls), monitor(mem, clock, "b", calls)
    assert a.cycle(clock()) is R.WON
    assert b.cycle(clock()) is R.OTHER_LEADER
    first = a.leader_epoch()
    assert first is not None
    lease_id = mem.get(KEY).lease  # type: ignore[union-attr]
    mem.revoke(Lease(lease_id, 10))
    assert b.cycle(clock()) is R.WAITING_SWITCH_DELAY
    assert a.cycle(clock()) is R.LOST
    assert not a.is_leader()
    assert a.cycle(clock()) is R.RECAMPAIGN_AS_PREVIOUS_OWNER
    second = a.leader_epoch()
    assert second is not None and second > first
    assert b.cycle(clock()) is R.OTHER_LEADER
    assert calls.log == [
        ("gained", "a", first),
        ("lost", "a", first),
        ("gained", "a", second),
    ]


def test_crashed_leader_is_replaced_after_lease_expiry_and_switch_delay(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a, b = monitor(mem, clock, "a", calls), monitor(mem, clock, "b", calls)
    a.cycle(clock())
    b.cycle(clock())
    first = a.leader_epoch()
    clock.advance(10.5)  # a stopped cycling: its lease expires
    assert b.cycle(clock()) is R.WAITING_SWITCH_DELAY
    clock.advance(4.9)
    assert b.cycle(clock()) is R.WAITING_SWITCH_DELAY
    clock.advance(0.2)
    assert b.cycle(clock()) is R.WON
    second = b.leader_epoch()
    assert first is not None and second is not None and second > first


def test_leader_fences_itself_by_its_own_clock_when_etcd_is_gone(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a = monitor(mem, clock, "a", calls)
    a.cycle(clock())
    epoch = a.leader_epoch()
    start = clock()
    mem.available = False
    clock.advance(1)
    assert a.cycle(clock()) is R.KEEPALIVE_FAILED
    assert a.is_leader()
    clock.now = start + CFG.ttl_s - CFG.safety_margin_s  # no cycle needed to stop leading
    assert not a.is_leader()
    assert a.cycle(clock()) is R.FENCED
    assert calls.log[-1] == ("lost", "a", epoch)
    assert a.cycle(clock()) is R.ETCD_UNAVAILABLE
    assert a.history()[-2].reason is R.FENCED and a.history()[-2].epoch == epoch


def test_fenced_leader_clears_its_stale_record_and_regrabs_when_etcd_returns(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a, b = monitor(mem, clock, "a", calls), monitor(mem, clock, "b", calls)
    a.cycle(clock())
    b.cycle(clock())
    first = a.leader_epoch()
    mem.available = False
    clock.advance(8.5)
    assert a.cycle(clock()) is R.FENCED
    assert b.cycle(clock()) is R.ETCD_UNAVAILABLE
    mem.available = True  # back before the lease ran out: the record is still there
    assert b.cycle(clock()) is R.OTHER_LEADER
    assert a.cycle(clock()) is R.RECAMPAIGN_AS_PREVIOUS_OWNER
    assert b.cycle(clock()) is R.OTHER_LEADER
    second = a.leader_epoch()
    assert first is not None and second is not None and second > first


def test_stale_epoch_write_makes_the_writer_step_down(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a = monitor(mem, clock, "a", calls)
    a.cycle(clock())
    epoch = a.leader_epoch()
    assert epoch is not None
    mem.delete(KEY)  # an operator removes the record, someone else takes it
    other = mem.campaign(KEY, RunningInfo("x", "").to_bytes(), mem.grant_lease(10))
    assert other.won
    with pytest.raises(Fenced):
        mem.fenced_txn(KEY, epoch, [Put("/canal/destinations/d1/c/cursor", b"1")])
    a.report_fenced(epoch)
    assert not a.is_leader()
    assert a.cycle(clock()) is R.STALE_EPOCH
    assert calls.log[-1] == ("lost", "a", epoch)
    assert a.cycle(clock()) is R.OTHER_LEADER


def test_deleted_record_is_noticed_by_the_leader(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a = monitor(mem, clock, "a", calls)
    a.cycle(clock())
    mem.delete(KEY)
    assert a.cycle(clock()) is R.LOST
    assert a.cycle(clock()) is R.RECAMPAIGN_AS_PREVIOUS_OWNER


def test_restarted_node_clears_its_own_old_record_at_once(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    old = monitor(mem, clock, "a", calls)
    old.cycle(clock())
    first = old.leader_epoch()
    new = monitor(mem, clock, "a", calls)  # same node name, fresh process
    assert new.cycle(clock()) is R.RECAMPAIGN_AS_PREVIOUS_OWNER
    assert new.leader_epoch() is not None and new.leader_epoch() > first  # type: ignore[operator]
    clock.advance(1)
    assert old.cycle(clock()) is R.LOST


def test_graceful_stop_releases_and_others_wait_the_switch_delay(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a, b = monitor(mem, clock, "a", calls), monitor(mem, clock, "b", calls)
    a.cycle(clock())
    b.cycle(clock())
    epoch = a.leader_epoch()
    a.stop()
    assert a.history()[-1].reason is R.RELEASED and a.history()[-1].epoch == epoch
    assert calls.log[-1] == ("lost", "a", epoch)
    assert mem.get(KEY) is None
    assert mem.lease_ids() == set()  # the lease was revoked too
    assert b.cycle(clock()) is R.WAITING_SWITCH_DELAY
    clock.advance(5)
    assert b.cycle(clock()) is R.WON


def test_failed_activation_releases_and_backs_off(mem: MemoryCoordinator, clock: FakeClock) -> None:
    def boom(epoch: int) -> None:
        raise RuntimeError("cannot start")

    a = RunningMonitor(mem, KEY, "a", "", CFG, on_gained=boom, clock=clock)
    assert a.cycle(clock()) is R.ACTIVATION_FAILED
    assert mem.get(KEY) is None and not a.is_leader()
    assert a.cycle(clock()) is R.WAITING_SWITCH_DELAY
    clock.advance(5)
    assert a.cycle(clock()) is R.ACTIVATION_FAILED


class LostReply(MemoryCoordinator):
    """Applies the first campaign but 'loses' the reply, like a timeout after commit."""

    lose = True

    def campaign(self, key: str, value: bytes, lease: Lease) -> CampaignResult:
        result = super().campaign(key, value, lease)
        if self.lose:
            self.lose = False
            raise CoordinatorUnavailable("reply lost")
        return result


def test_campaign_whose_reply_was_lost_is_adopted(clock: FakeClock, calls: Calls) -> None:
    mem = LostReply(clock=clock)
    a = monitor(mem, clock, "a", calls)
    assert a.cycle(clock()) is R.ETCD_UNAVAILABLE
    assert a.cycle(clock()) is R.WON
    kv = mem.get(KEY)
    assert kv is not None and a.leader_epoch() == kv.create_revision


def test_a_won_campaign_counts_as_campaigning_until_it_leads(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    """Between the campaign's answer and the term's start, the node's API must see the
    monitor as campaigning or leading ("starting": the request waits for the term), not
    as neither: that answered 503 no_leader with Retry-After 1 s to the first client."""
    a = monitor(mem, clock, "a", calls)
    with a._state:  # holds _activate just before the term is set (white box: no hook)
        t = threading.Thread(target=a.cycle, args=(clock(),))
        t.start()
        wait_until(lambda: mem.get(KEY) is not None, "the campaign is in etcd", WAIT_S)
        time.sleep(0.05)  # the cycle has two statements to run before the lock: it can
        # only make this pass wrongly (fixed: campaigning until the lock is taken)
        assert a.campaigning(), "won in etcd, neither campaigning nor leading"
    t.join(WAIT_S)
    assert a.leader_epoch() is not None and not a.campaigning()


def test_etcd_unavailable_for_followers(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a = monitor(mem, clock, "a", calls)
    mem.available = False
    assert a.cycle(clock()) is R.ETCD_UNAVAILABLE
    mem.available = True
    assert a.cycle(clock()) is R.WON


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (ElectionConfig(ttl_s=3, safety_margin_s=1, loop_interval_s=1), "election.ttl_s"),
        (ElectionConfig(ttl_s=10, safety_margin_s=10), "election.safety_margin_s"),
        (ElectionConfig(ttl_s=10, safety_margin_s=0), "election.safety_margin_s"),
        (ElectionConfig(loop_interval_s=0), "election.loop_interval_s"),
        (ElectionConfig(switch_delay_s=-1), "election.switch_delay_s"),
    ],
)
def test_bad_timing_is_rejected_at_construction(
    mem: MemoryCoordinator, cfg: ElectionConfig, key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        RunningMonitor(mem, KEY, "a", "", cfg)
    assert err.value.key == key


def test_ttl_bound_uses_the_coordinator_timeout(clock: FakeClock) -> None:
    slow = MemoryCoordinator(clock=clock, timeout_s=4.0)
    with pytest.raises(ConfigError) as err:
        RunningMonitor(slow, KEY, "a", "", CFG)  # 10 - 2 < 1 + 2 x 4
    assert err.value.key == "election.ttl_s"


def test_server_and_client_monitors_use_their_keys(mem: MemoryCoordinator) -> None:
    keys = Keys()
    s = server_running_monitor(mem, keys, "d1", "n1", "http://n1", CFG)
    c = client_running_monitor(mem, keys, "d1", "c1", "consumer-1", "", CFG)
    assert s.key == "/canal/destinations/d1/running"
    assert c.key == "/canal/destinations/d1/c1/running"
    assert s.cycle(0) is R.WON and c.cycle(0) is R.WON


def test_history_records_transitions_not_every_loop(
    mem: MemoryCoordinator, clock: FakeClock, calls: Calls
) -> None:
    a = monitor(mem, clock, "a", calls)
    for _ in range(5):
        a.cycle(clock())
        clock.advance(1)
    assert [e.reason for e in a.history()] == [R.WON, R.STILL_LEADER]
    seqs = [e.seq for e in a.history()]
    assert seqs == sorted(seqs)


# -- monitor threads on the real etcd ---------------------------------------------------


@pytest.fixture
def cluster_of(etcd_endpoints: list[str]) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(key_name: str = "running", endpoints: list[str] | None = None) -> Cluster:
        key = f"/t-{uuid.uuid4().hex[:12]}/{key_name}"
        c = Cluster(endpoints or etcd_endpoints, key)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _lease_of(c: Cluster) -> Lease:
    kv = c.coords[0].get(c.key)
    assert kv is not None
    return Lease(kv.lease, 2)


@pytest.mark.parametrize("n", [2, 3])
def test_racing_monitors_elect_exactly_one_leader(
    cluster_of: Callable[..., Cluster], n: int
) -> None:
    c = cluster_of().start(*[f"n{i}" for i in range(n)])
    leader = c.wait_leader()
    info = read_running(c.coords[0], c.key)
    assert info is not None and info.node == leader
    assert info.epoch == c.monitors[leader].leader_epoch()
    wait_until(lambda: c.monitors[leader].keepalives_ok >= 10, "leader kept alive", WAIT_S)
    assert c.leaders() == [leader]
    assert c.violations == []
    for node in c.monitors:
        if node != leader:
            assert Reason.WON not in c.reasons(node)


def test_epochs_strictly_increase_across_handovers(cluster_of: Callable[..., Cluster]) -> None:
    c = cluster_of().start("a", "b", "c")
    epochs: list[int] = []
    leader = c.wait_leader()
    for _ in range(2):
        epoch = c.monitors[leader].leader_epoch()
        assert epoch is not None
        epochs.append(epoch)
        c.monitors[leader].stop()  # graceful: releases the key
        assert c.reasons(leader)[-1] is Reason.RELEASED
        leader = c.wait_leader(other_than=leader)
    last = c.monitors[leader].leader_epoch()
    assert last is not None
    epochs.append(last)
    assert epochs == sorted(set(epochs))
    assert c.violations == []
    gained = [e for (kind, _, e) in c.calls.log if kind == "gained"]
    assert gained == epochs


def test_crashed_leader_is_replaced_after_the_switch_delay(
    cluster_of: Callable[..., Cluster],
) -> None:
    c = cluster_of().start("a", "b", "c")
    old = c.wait_leader()
    old_epoch = c.monitors[old].leader_epoch()
    assert old_epoch is not None
    c.crash(old)
    c.coords[0].revoke(_lease_of(c))  # kill its lease instead of waiting for the ttl
    new = c.wait_leader(other_than=old)
    new_epoch = c.monitors[new].leader_epoch()
    assert new_epoch is not None and new_epoch > old_epoch
    reasons = c.reasons(new)
    assert reasons.index(Reason.WAITING_SWITCH_DELAY) < reasons.index(Reason.WON)
    assert c.violations == []


def test_previous_owner_regrabs_at_once_others_keep_waiting(
    cluster_of: Callable[..., Cluster],
) -> None:
    c = cluster_of().start("a", "b", "c")
    leader = c.wait_leader()
    m = c.monitors[leader]
    first = m.leader_epoch()
    assert first is not None
    c.coords[0].revoke(_lease_of(c))
    wait_until(lambda: (m.leader_epoch() or 0) > first, "previous owner leads again", WAIT_S)
    reasons = c.reasons(leader)
    lost = reasons.index(Reason.LOST)
    assert reasons[lost + 1] is Reason.RECAMPAIGN_AS_PREVIOUS_OWNER
    for node in c.monitors:
        if node != leader:
            assert Reason.WON not in c.reasons(node)
    assert c.violations == []


def test_stale_epoch_write_is_rejected_and_the_writer_steps_down(
    cluster_of: Callable[..., Cluster],
) -> None:
    c = cluster_of()
    zombie = c.add("z")  # driven by hand: it never notices on its own
    assert zombie.cycle(time.monotonic()) is Reason.WON
    epoch = zombie.leader_epoch()
    assert epoch is not None
    c.start("b")
    c.coords[0].revoke(_lease_of(c))
    assert c.wait_leader() == "b"
    cursor = c.key.rsplit("/", 1)[0] + "/d/c/cursor"
    with pytest.raises(Fenced):
        c.coords[0].fenced_txn(c.key, epoch, [Put(cursor, b"stale")])
    assert c.coords[0].get(cursor) is None
    zombie.report_fenced(epoch)
    assert not zombie.is_leader()
    assert zombie.cycle(time.monotonic()) is Reason.STALE_EPOCH
    assert c.calls.log[-1] == ("lost", "z", epoch)
    assert zombie.cycle(time.monotonic()) is Reason.OTHER_LEADER


def test_client_running_monitor_one_active_consumer(etcd_endpoints: list[str]) -> None:
    keys = Keys(f"/t-{uuid.uuid4().hex[:12]}")
    coords = [EtcdCoordinator(etcd_endpoints, timeout_s=ETCD_TIMEOUT_S) for _ in range(2)]
    ms = [
        client_running_monitor(co, keys, "d1", "c1", f"consumer{i}", "", ETCD_CFG).start()
        for i, co in enumerate(coords)
    ]
    try:
        wait_until(lambda: sum(m.is_leader() for m in ms) == 1, "one active consumer", WAIT_S)
        active = next(m for m in ms if m.is_leader())
        other = next(m for m in ms if m is not active)
        assert active.key == keys.client_running("d1", "c1")
        active.stop()
        wait_until(other.is_leader, "the other consumer takes over", WAIT_S)
    finally:
        for m in ms:
            m.stop()
        coords[0].delete(keys.prefix, prefix=True)
        for co in coords:
            co.close()


def test_a_new_terms_first_keepalive_comes_after_its_drawn_phase(
    etcd_endpoints: list[str],
) -> None:
    """Keepalives of a term that kept the win's schedule expire just after etcd's lease
    sweep tick when the win came a fixed switch delay after a sweep: the key then goes a
    whole tick late after a crash. A new term's first keepalive comes after a drawn
    fraction of loop_interval_s (here 5% of 8 s), not a whole interval after the win."""
    cfg = ElectionConfig(ttl_s=12, safety_margin_s=1.5, loop_interval_s=8, switch_delay_s=1)
    key = f"/t-{uuid.uuid4().hex[:12]}/running"
    draws: list[float] = []

    def phase() -> float:
        draws.append(0.05)
        return 0.05

    coord = EtcdCoordinator(etcd_endpoints, timeout_s=ETCD_TIMEOUT_S)
    m = RunningMonitor(coord, key, "a", "http://a", cfg, keepalive_phase=phase)
    try:
        m.start()
        wait_until(m.is_leader, "a leads", WAIT_S)
        assert m.keepalives_ok == 0
        # 0.4 s after the win with the drawn phase; a whole loop interval (8 s) before
        wait_until(lambda: m.keepalives_ok >= 1, "the term's first keepalive", 5.0)
        assert draws == [0.05]  # one draw per term
        assert [e.reason for e in m.history()] == [Reason.WON, Reason.STILL_LEADER]
    finally:
        m.stop()
        coord.close()


def test_a_handover_under_way_when_the_wait_ends_is_a_timeout_not_a_failure(
    etcd_endpoints: list[str],
) -> None:
    """The cycle took the request and is in the old leader's on_lost (its final flush:
    the reader's join alone can take seconds) when hand_over's wait ends: the handover
    goes ahead, so the caller hears HandoverTimeout (503 handover_timeout), never the
    HandoverFailed that says no node took it (a retry would move it a second time)."""
    cfg = ElectionConfig(ttl_s=10, safety_margin_s=2, loop_interval_s=0.2, switch_delay_s=1)
    keys = Keys(f"/t-{uuid.uuid4().hex[:12]}")
    flushing, flushed = threading.Event(), threading.Event()

    def slow_flush(epoch: int) -> None:
        flushing.set()
        assert flushed.wait(WAIT_S), "the test never let on_lost end"

    coords = [EtcdCoordinator(etcd_endpoints, timeout_s=ETCD_TIMEOUT_S) for _ in range(2)]
    a = server_running_monitor(coords[0], keys, "d1", "na", "http://a", cfg, on_lost=slow_flush)
    b = server_running_monitor(coords[1], keys, "d1", "nb", "http://b", cfg)
    try:
        a.start()
        wait_until(a.is_leader, "na leads", WAIT_S)
        b.start()
        epoch = a.leader_epoch()
        with pytest.raises(HandoverTimeout, match="under way") as timed_out:
            a.hand_over("nb", timeout_s=2.0)  # the cycle takes it at once, then waits in on_lost
        assert flushing.is_set(), timed_out.value
        flushed.set()
        wait_until(b.is_leader, "nb leads after the handover", WAIT_S)
        ended = [e for e in a.history() if e.reason is Reason.HANDED_OVER]
        assert [e.epoch for e in ended] == [epoch]
    finally:
        flushed.set()
        for m in (a, b):
            m.stop()
        for co in coords:
            co.close()
