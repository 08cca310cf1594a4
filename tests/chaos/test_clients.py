"""Consumer and ack failures: consumer SIGKILL before ack, server SIGKILL right after acks,
three destinations × three clients at once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun

MakeRun = Callable[[Sandbox], ChaosRun]


@pytest.mark.chaos
def test_consumer_sigkill_before_ack(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox).start(2)
    first = run.start_consumer("c1", "example", "--stall-after", "20")
    run.wait_consumers_ready()
    run.log_has(first, "stalled")
    stalled = [json.loads(x) for x in first.lines() if '"ev":"batch"' in x][-1]
    run.fault("consumer SIGKILL before ack")
    first.process.kill()
    run.start_consumer("c1")
    run.wait_delivered_after(time.time())
    # The server kept every ack: only the unacked batch may come again (window 0).
    result = run.finish(dup_window_s=0.0)
    assert result.ok, result.line()
    assert result.duplicates == len(stalled["ch"])


@pytest.mark.chaos
def test_server_sigkill_within_flush_period_after_acks(
    sandbox: Sandbox, chaos_run: MakeRun
) -> None:
    flush_s = 1.0
    run = chaos_run(sandbox).start(3, meta={"flush_period_ms": int(flush_s * 1000)})
    run.start_consumer("c1")
    run.wait_consumers_ready()
    leader = run.leader()
    acked_at = run.wait_ack(time.time())
    run.fault(f"SIGKILL {leader.id} {time.time() - acked_at:.3f}s after an ack")
    leader.kill()
    run.leader(exclude=[leader])
    run.wait_delivered_after(time.time())
    result = run.finish(dup_window_s=flush_s + 0.5)
    assert result.ok, result.line()


@pytest.mark.chaos
def test_three_destinations_three_clients(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox)
    dests = ("d1", "d2", "d3")
    run.start_multi(dests, nodes=3)
    for d in dests:
        for c in ("c1", "c2", "c3"):
            run.start_consumer(c, d)
    run.wait_subscribed()
    run.start_load()
    run.wait_consumers_ready()
    leader = run.leader("d1")
    run.fault(f"SIGKILL {leader.id} (leads d1)")
    leader.kill()
    for d in dests:
        run.leader(d, exclude=[leader])
    run.wait_delivered_after(time.time())
    result = run.finish(dup_window_s=0.2 + 1.0)
    assert result.ok, result.line()
    assert run.writer is not None
    assert result.required == 9 * sum(1 for c in run.writer.history() if c.required)
