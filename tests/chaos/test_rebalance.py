"""Continuous rebalancing under write load: step-downs, a rolling restart by SIGTERM,
and the balancer moving destinations back after each; the usual checker at the end."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from canal_cluster.balance import read_view
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun

MakeRun = Callable[[Sandbox], ChaosRun]
FLUSH_S = 0.2
WINDOW_S = FLUSH_S + 1.0  # one flush period of acks, plus an ack in flight
DESTS = ("rb1", "rb2", "rb3")
WAIT_S = 60.0


def _wait_spread(run: ChaosRun) -> None:
    """Every destination led, one per node (the balancer's fair share)."""
    coord = EtcdCoordinator(run.box.etcd_endpoints, timeout_s=2.0)

    def spread() -> bool:
        leaders = read_view(coord, Keys(run.prefix)).leaders
        return len(leaders) == len(DESTS) and len(set(leaders.values())) == len(DESTS)

    try:
        wait_until(spread, "one leader per node", WAIT_S)
    finally:
        coord.close()


def _step_down(run: ChaosRun, destination: str) -> None:
    leader = run.leader(destination)
    run.wait_delivered_after(time.time())
    run.fault(f"step-down {destination} on {leader.id}")
    with leader.client() as http:
        r = http.post(f"/v1/destinations/{destination}/step-down", json={})
    assert r.status_code == 200, r.text


def _rolling_step(run: ChaosRun, index: int) -> None:
    node = run.nodes[index]
    run.wait_delivered_after(time.time())
    run.fault(f"SIGTERM {node.id}")
    assert node.stop() == 0
    run.wait_delivered_after(time.time())
    run.fault(f"{node.id} back: destinations move to it")
    node.restart()


@pytest.mark.chaos
def test_continuous_rebalancing_under_load(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox)
    run.start_multi(DESTS, nodes=3, balance={"hold_s": 2.0})
    for d in DESTS:
        run.start_consumer("c1", d)
    run.wait_subscribed()
    run.start_load()
    run.wait_consumers_ready()
    _wait_spread(run)
    rnd = random.Random(20)
    for step in range(6):
        if step % 2 == 0:  # a step-down: the successor then leads 2, one moves back
            _step_down(run, rnd.choice(DESTS))
        else:  # SIGTERM node1, node2, node3 in turn: a rolling restart
            _rolling_step(run, step // 2)
        _wait_spread(run)
        run.wait_delivered_after(time.time())
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()
    assert len(result.epochs) >= len(DESTS) + 6  # every step moved at least one leader
