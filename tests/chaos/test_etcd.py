"""etcd failures under load: one of three members killed; quorum lost and restored."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from conftest import SandboxFactory
from node_fixtures import DEST

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun

MakeRun = Callable[[Sandbox], ChaosRun]
WINDOW_S = 0.2 + 1.0


@pytest.mark.chaos
def test_one_of_three_etcd_members_killed(make_sandbox: SandboxFactory, chaos_run: MakeRun) -> None:
    box = make_sandbox(etcd_members=3)
    run = chaos_run(box).start(3)
    run.start_consumer("c1")
    run.wait_consumers_ready()
    victim = box.etcd_cluster.members[0]  # the first endpoint every client tries
    run.fault(f"SIGKILL etcd member {victim.name}")
    victim.process.kill()
    run.wait_delivered_after(time.time())
    box.etcd_cluster.restart_member(victim.name)
    run.wait_delivered_after(time.time())
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()


@pytest.mark.chaos
def test_etcd_quorum_lost_and_restored(make_sandbox: SandboxFactory, chaos_run: MakeRun) -> None:
    box = make_sandbox(etcd_members=3)
    run = chaos_run(box).start(3)
    run.start_consumer("c1")
    run.wait_consumers_ready()
    leader = run.leader()
    lost = box.etcd_cluster.members[1:]
    run.fault("etcd quorum lost (2 of 3 members SIGKILLed)")
    for m in lost:
        m.process.kill()
    # Without etcd the leader must fence itself within its TTL: nobody leads.
    wait_until(
        lambda: all(n.role() != "leader" for n in run.nodes if n.is_running()),
        "every node fenced without quorum",
        30,
    )
    for m in lost:
        box.etcd_cluster.restart_member(m.name)
    run.leader()
    run.wait_delivered_after(time.time())
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()
    assert len(result.epochs) >= 2, f"{leader.id} kept epoch {result.epochs} through the outage"
    assert DEST
