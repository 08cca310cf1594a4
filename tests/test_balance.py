"""Fair share and graceful handover, decided in RunningMonitor.cycle with a Balancer.

Fast and deterministic: the in-memory coordinator and a fake clock; each simulated node
is a Balancer plus one monitor per destination, and every round cycles every monitor
of every live node. The real processes are in test_scale.py.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterator

import pytest
from coord_fixtures import Calls, FakeClock
from memory_coordinator import MemoryCoordinator

from canal_cluster.balance import Balancer, ClusterView, fair_share, read_view
from canal_cluster.coordinator import Lease
from canal_cluster.keys import Keys
from canal_cluster.running import (
    ElectionConfig,
    HandoverHint,
    Reason,
    RunningMonitor,
    read_handover,
    read_running,
)
from canal_protocol.errors import HandoverFailed, InvalidArgument

R = Reason
CFG = ElectionConfig(ttl_s=10, safety_margin_s=2, loop_interval_s=1, switch_delay_s=5)
KEYS = Keys("/bal")
HOLD_S = 10.0
ROUND_S = 0.5
MOVES = frozenset({R.HANDED_OVER, R.REBALANCED})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mem(clock: FakeClock) -> Iterator[MemoryCoordinator]:
    coord = MemoryCoordinator(clock=clock, timeout_s=1.0)
    yield coord
    coord.close()


# -- the pure parts --------------------------------------------------------------------------


def test_fair_share_is_the_ceiling() -> None:
    assert [fair_share(9, n) for n in (1, 2, 3, 4)] == [9, 5, 3, 3]
    assert fair_share(16, 3) == 6 and fair_share(0, 3) == 0 and fair_share(4, 0) == 4


def test_view_counts_only_active_nodes_and_who_configures_what() -> None:
    view = ClusterView(
        nodes={"a": frozenset({"d1", "d2"}), "b": frozenset({"d2", "d3"}), "c": frozenset()},
        leaving=frozenset({"c"}),
        leaders={"d1": "a", "d2": "a", "d3": "gone"},
    )
    assert view.destinations == {"d1", "d2", "d3"}
    assert view.active == ["a", "b"] and view.share() == 2
    assert view.counts() == {"a": 2, "b": 0}
    assert view.eligible("d1") == ["a"] and view.eligible("d2", {"a"}) == ["b"]


# -- one key, handed over by hand ------------------------------------------------------------


def monitor(
    mem: MemoryCoordinator, clock: FakeClock, node: str, calls: Calls | None = None
) -> RunningMonitor:
    calls = calls or Calls()
    return RunningMonitor(
        mem, KEYS.running("d1"), node, f"http://{node}", CFG,
        on_gained=calls.gained(node), on_lost=calls.lost(node), clock=clock,
        handover_key=KEYS.handover("d1"),
    )  # fmt: skip


def test_handover_names_the_successor_who_takes_over_at_once_while_others_wait(
    mem: MemoryCoordinator, clock: FakeClock
) -> None:
    calls = Calls()
    a, b, c = (monitor(mem, clock, n, calls) for n in "abc")
    assert a.cycle(clock()) is R.WON
    assert b.cycle(clock()) is R.OTHER_LEADER and c.cycle(clock()) is R.OTHER_LEADER
    old = a.leader_epoch()
    assert old is not None
    holder_during_final_flush: list[str | None] = []

    def final_flush(epoch: int) -> None:
        info = read_running(mem, a.key)
        holder_during_final_flush.append(info.node if info is not None else None)

    a._on_lost = final_flush
    assert a.hand_over("b", "test") == old
    assert holder_during_final_flush == ["a"]  # on_lost ran while the key was still ours
    assert not a.is_leader() and read_running(mem, a.key) is None
    assert read_handover(mem, KEYS.handover("d1")) == HandoverHint("a", "b", old, "test")
    # no time passes: no TTL, no switch delay for the successor; the others wait
    assert a.cycle(clock()) is R.WAITING_HANDOVER
    assert c.cycle(clock()) is R.WAITING_HANDOVER
    assert b.cycle(clock()) is R.TOOK_OVER
    new = b.leader_epoch()
    assert new is not None and new > old
    assert read_handover(mem, KEYS.handover("d1")) is None  # served: deleted
    assert a.cycle(clock()) is R.OTHER_LEADER and c.cycle(clock()) is R.OTHER_LEADER
    assert a.history()[-3].reason is R.HANDED_OVER
    assert a.history()[-3].epoch == old and a.history()[-3].detail == "to b: test"
    assert b.history()[-1].reason is R.TOOK_OVER
    assert "from a" in b.history()[-1].detail


def test_a_handover_nobody_takes_expires_and_the_others_campaign(
    mem: MemoryCoordinator, clock: FakeClock
) -> None:
    a, b, c = (monitor(mem, clock, n) for n in "abc")
    assert a.cycle(clock()) is R.WON
    assert c.cycle(clock()) is R.OTHER_LEADER
    a.hand_over("b")  # b never cycles: as if it died just then
    for _ in range(int(CFG.ttl_s)):
        assert c.cycle(clock()) is R.WAITING_HANDOVER
        assert a.cycle(clock()) is R.WAITING_HANDOVER  # the old leader does not grab it back
        clock.advance(1.0)
    clock.advance(0.5)
    assert read_handover(mem, KEYS.handover("d1")) is None  # its lease ran out
    assert c.cycle(clock()) is R.WON  # the switch delay has long passed meanwhile
    assert b.cycle(clock()) is R.OTHER_LEADER


class Leaving:
    """A placement that only says the node is leaving."""

    def leaving(self) -> bool:
        return True

    def surplus(self, led_for_s: float) -> None:
        return None

    def defer(self, waited_s: float) -> None:
        return None


def test_a_leaving_successor_does_not_take_over_and_the_handover_expires(
    mem: MemoryCoordinator, clock: FakeClock
) -> None:
    a, c = monitor(mem, clock, "a"), monitor(mem, clock, "c")
    b = RunningMonitor(
        mem, KEYS.running("d1"), "b", "http://b", CFG, clock=clock,
        handover_key=KEYS.handover("d1"), placement=Leaving(),
    )  # fmt: skip
    assert a.cycle(clock()) is R.WON and c.cycle(clock()) is R.OTHER_LEADER
    a.hand_over("b")  # b started leaving after it was picked
    assert b.cycle(clock()) is R.LEAVING and c.cycle(clock()) is R.WAITING_HANDOVER
    clock.advance(CFG.ttl_s + 0.5)
    assert b.cycle(clock()) is R.LEAVING
    assert c.cycle(clock()) is R.WON  # the hint expired, the switch delay had passed


def test_hand_over_refuses_what_it_cannot_do(mem: MemoryCoordinator, clock: FakeClock) -> None:
    a, b = monitor(mem, clock, "a"), monitor(mem, clock, "b")
    assert a.cycle(clock()) is R.WON and b.cycle(clock()) is R.OTHER_LEADER
    with pytest.raises(HandoverFailed, match="does not lead"):
        b.hand_over("a")
    with pytest.raises(HandoverFailed, match="this node"):
        a.hand_over("a")
    with pytest.raises(InvalidArgument) as bad:
        a.hand_over("no such/node")
    assert bad.value.field == "to"
    assert a.is_leader()  # nothing happened
    mem.available = False
    with pytest.raises(HandoverFailed, match="failed"):
        a.hand_over("b")  # etcd did not take it: stopped leading, the lease expires
    assert not a.is_leader() and a.history()[-1].reason is R.HANDOVER_FAILED


# -- nodes with balancers --------------------------------------------------------------------


class SimNode:
    """A node: its registration (node lease) and one balanced monitor per destination."""

    def __init__(self, mem: MemoryCoordinator, clock: FakeClock, name: str, dests: list[str]):
        self.mem, self.name, self.clock = mem, name, clock
        self.balancer = Balancer(
            mem, KEYS, name, self.led, hold_s=HOLD_S, defer_s=CFG.switch_delay_s,
            refresh_s=CFG.loop_interval_s, handover_timeout_s=CFG.ttl_s, clock=clock,
        )  # fmt: skip
        self.monitors = {d: self._monitor(d) for d in dests}
        self.dests = dests
        self.lease: Lease = mem.grant_lease(CFG.ttl_s)
        self.register()

    def _monitor(self, d: str) -> RunningMonitor:
        return RunningMonitor(
            self.mem, KEYS.running(d), self.name, f"http://{self.name}", CFG, clock=self.clock,
            handover_key=KEYS.handover(d), placement=self.balancer.placement(d),
        )  # fmt: skip

    def register(self, leaving: bool = False) -> None:
        record = {"node": self.name, "destinations": self.dests, "leaving": leaving}
        self.mem.register(KEYS.node(self.name), json.dumps(record).encode(), self.lease)

    def led(self) -> set[str]:
        return {d for d, m in self.monitors.items() if m.is_leader()}

    def round(self) -> None:
        self.mem.keepalive(self.lease)
        self.balancer.refresh()  # the node's view thread
        for m in self.monitors.values():
            m.cycle(self.clock())

    def events(self, reasons: Collection[Reason]) -> list[str]:
        return [
            f"{self.name}:{d}:{e.reason.value}:{e.detail}"
            for d, m in self.monitors.items()
            for e in m.history()
            if e.reason in reasons
        ]


DESTS = [f"d{i}" for i in range(1, 10)]


def leaders(mem: MemoryCoordinator) -> Counter[str]:
    return Counter(read_view(mem, KEYS).leaders.values())


def run(mem: MemoryCoordinator, clock: FakeClock, nodes: list[SimNode], seconds: float) -> None:
    for _ in range(int(seconds / ROUND_S)):
        for n in nodes:
            n.round()
        clock.advance(ROUND_S)


def settle(
    mem: MemoryCoordinator, clock: FakeClock, nodes: list[SimNode], want: list[int]
) -> float:
    """Rounds until the leader counts are ``want``; the simulated seconds it took."""
    start = clock()
    for _ in range(400):
        if sorted(leaders(mem).values(), reverse=True) == want and len(leaders(mem)) == len(want):
            return clock() - start
        run(mem, clock, nodes, ROUND_S)
    raise AssertionError(f"not settled at {want}: {dict(leaders(mem))}")


def moves(nodes: list[SimNode]) -> list[str]:
    return [e for n in nodes for e in n.events(MOVES)]


def test_nine_destinations_settle_3_3_3_then_5_4_then_3_3_3_with_the_fewest_moves(
    mem: MemoryCoordinator, clock: FakeClock
) -> None:
    a, b, c = (SimNode(mem, clock, n, DESTS) for n in "abc")
    settle(mem, clock, [a, b, c], [3, 3, 3])
    assert moves([a, b, c]) == []  # spread by the campaigns alone (deferrals)
    assert any(e.split(":")[2] == "deferred" for n in (a, b, c) for e in n.events({R.DEFERRED}))
    run(mem, clock, [a, b, c], 60)  # settled: far beyond hold_s, nothing moves
    assert moves([a, b, c]) == [] and sorted(leaders(mem).values()) == [3, 3, 3]

    # c dies: its leases expire; its destinations spread without a handover
    took = settle(mem, clock, [a, b], [5, 4])
    assert took <= CFG.ttl_s + CFG.switch_delay_s + 3 * ROUND_S
    assert moves([a, b]) == []
    run(mem, clock, [a, b], 60)
    assert moves([a, b]) == [] and sorted(leaders(mem).values()) == [4, 5]

    # c comes back (a new incarnation): it takes its share, by exactly 5+4-3-3 = 3 moves
    c = SimNode(mem, clock, "c", DESTS)
    settle(mem, clock, [a, b, c], [3, 3, 3])
    made = moves([a, b, c])
    assert len(made) == 3, made
    assert all(":rebalanced:to c: node " in e and "> fair share 3" in e for e in made), made
    run(mem, clock, [a, b, c], 60)
    assert len(moves([a, b, c])) == 3 and sorted(leaders(mem).values()) == [3, 3, 3]


def test_a_destination_moves_only_after_hold_s_and_a_joining_node_takes_its_share(
    mem: MemoryCoordinator, clock: FakeClock
) -> None:
    a = SimNode(mem, clock, "a", DESTS)
    settle(mem, clock, [a], [9])
    b = SimNode(mem, clock, "b", DESTS)
    run(mem, clock, [a, b], HOLD_S - 2)  # a gained them just now: they stay
    assert moves([a, b]) == [] and sorted(leaders(mem).values()) == [9]
    settle(mem, clock, [a, b], [5, 4])
    assert len(moves([a, b])) == 4  # 9 -> 5/4: four moves, no more
    run(mem, clock, [a, b], 60)
    assert len(moves([a, b])) == 4


def test_a_leaving_node_campaigns_for_nothing_and_its_successors_spread(
    mem: MemoryCoordinator, clock: FakeClock
) -> None:
    a, b, c = (SimNode(mem, clock, n, DESTS) for n in "abc")
    settle(mem, clock, [a, b, c], [3, 3, 3])
    c.balancer.leave()
    c.register(leaving=True)
    for d in sorted(c.led()):
        to = c.balancer.successor(d)
        assert to in ("a", "b")
        c.monitors[d].hand_over(to, "leaving")
    settle(mem, clock, [a, b, c], [5, 4])
    assert not c.led()
    assert {e.split(":")[2] for e in c.events(MOVES)} == {"handed_over"}
    run(mem, clock, [a, b, c], 30)
    assert not c.led() and sorted(leaders(mem).values()) == [4, 5]


def test_successor_checks_the_named_node(mem: MemoryCoordinator, clock: FakeClock) -> None:
    a = SimNode(mem, clock, "a", DESTS)
    b = SimNode(mem, clock, "b", ["d1"])
    settle(mem, clock, [a, b], [8, 1])  # b can only take d1
    assert b.led() == {"d1"}
    d = sorted(a.led())[0]
    for to, needle in (("a", "this node"), ("zz", "not live"), ("b", "does not configure")):
        with pytest.raises(InvalidArgument, match=needle) as bad:
            a.balancer.successor(d, to)
        assert bad.value.field == "to"
    b.register(leaving=True)
    with pytest.raises(InvalidArgument, match="leaving"):
        a.balancer.successor("d1", "b")
    assert a.balancer.successor(d) is None  # nobody else configures it
