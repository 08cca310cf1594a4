"""Database failures: primary killed and the replica promoted (nodes switch to the
standby, from time - fallback; a leader elected after the switch starts on the standby
too, not on the dead primary); binlog purged under a lagging cursor (a clear error,
never a silent skip)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import SandboxFactory
from node_fixtures import DEST

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun

MakeRun = Callable[[Sandbox], ChaosRun]
FALLBACK_S = 5


@pytest.mark.chaos
def test_primary_killed_replica_promoted(make_sandbox: SandboxFactory, chaos_run: MakeRun) -> None:
    box = make_sandbox(standby=True)
    replica = box.replica
    standby: dict[str, Any] = {
        "standby": {"address": f"127.0.0.1:{replica.port}"},
        "fallback_interval_s": FALLBACK_S,
        "detecting": {"enable": True, "interval_s": 0.5, "retry_threshold": 2, "timeout_s": 1.0},
    }
    run = chaos_run(box).start(3, destination=standby)
    run.start_consumer("c1")
    run.wait_consumers_ready()
    run.promote_replica()
    # A leader elected after the switch reads the standby (found by the nemesis: it
    # went back to the dead primary and retried it forever).
    leader = run.leader()
    run.fault(f"SIGKILL {leader.id} after the database switch")
    leader.kill()
    run.leader(exclude=[leader])
    run.wait_delivered_after(time.time(), timeout_s=90)
    # The time fallback replays up to FALLBACK_S seconds of acked changes.
    result = run.finish(dup_window_s=FALLBACK_S + 2.0)
    assert result.ok, result.line()
    h = run.leader(exclude=[leader]).health()
    assert h is not None
    assert h["destinations"][DEST]["reader"]["state"] == "running"


@pytest.mark.chaos
def test_binlog_purged_under_lagging_cursor(
    make_sandbox: SandboxFactory, chaos_run: MakeRun
) -> None:
    box = make_sandbox()
    run = chaos_run(box).start(3)
    consumer = run.start_consumer("c1")
    run.wait_consumers_ready()
    assert run.writer is not None
    consumer.process.stop()  # the cursor stays where this consumer acked
    written = run.writer.committed()
    wait_until(lambda: run.writer is not None and run.writer.committed() > written + 40,
               "changes the stopped consumer never saw", 60)  # fmt: skip
    run.fault("nodes stopped, binlogs purged under the cursor")
    for node in run.nodes:
        node.stop()
    purged = box.primary.purge_binary_logs()
    assert purged
    for node in run.nodes:
        node.restart()
    errors: list[dict[str, Any]] = []

    def failed_clearly() -> bool:
        for node in run.nodes:
            h = node.health()
            d = h["destinations"][DEST] if h else None
            if d and d["role"] == "leader" and d["reader"]["state"] == "failed":
                errors[:] = [d["reader"]]
                return True
        return False

    wait_until(failed_clearly, "the leader reports the purged position", 60)
    reader = errors[0]
    assert reader["error_type"] == "PurgedPosition", reader
    assert "purge" in reader["error"].lower(), reader
    run.start_consumer("c1")
    result = run.finish(dup_window_s=0.2 + 1.0, drain_s=5.0, lost_expected=True)
    # Changes after the cursor were purged: they are lost, but nothing after them may be
    # delivered as if the gap did not exist.
    assert result.lost > 0
    assert result.ok, result.line()  # no order violation: nothing after the gap arrived
