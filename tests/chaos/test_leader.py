"""Server leader failures: SIGKILL (once, repeated), zombie (SIGSTOP > TTL), short pause."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from node_fixtures import DEST, FAST_ELECTION

from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun

MakeRun = Callable[[Sandbox], ChaosRun]
FLUSH_S = 0.2
WINDOW_S = FLUSH_S + 1.0  # one flush period of acks, plus an ack in flight


def _kill_leader(run: ChaosRun) -> None:
    run.wait_delivered_after(time.time())
    run.kill_leader()


@pytest.mark.chaos
@pytest.mark.parametrize("ack", ["separate", "on-get"])
def test_leader_sigkill_once(sandbox: Sandbox, chaos_run: MakeRun, ack: str) -> None:
    run = chaos_run(sandbox).start(3)
    run.start_consumer("c1", DEST, *(["--ack-on-get"] if ack == "on-get" else []))
    run.wait_consumers_ready()
    _kill_leader(run)
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()
    assert len(result.epochs) >= 2


@pytest.mark.chaos
def test_leader_sigkill_repeated(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox).start(3)
    run.start_consumer("c1")
    run.wait_consumers_ready()
    for _ in range(10):
        _kill_leader(run)
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()
    assert len(result.epochs) >= 11


@pytest.mark.chaos
def test_zombie_leader_neither_serves_nor_writes(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox).start(3)
    run.start_consumer("c1")
    run.wait_consumers_ready()
    run.wait_delivered_after(time.time())
    old_epoch = run.leader().health()["destinations"][DEST]["epoch"]  # type: ignore[index]
    zombie, new = run.pause_leader_past_ttl()
    # At once after SIGCONT, before its monitor thread runs: it must not hand out batches.
    with zombie.client() as http:
        r = http.post(
            f"/v1/destinations/{DEST}/clients/zombie-probe/batches",
            json={"size": 10, "timeout_ms": 0},
            follow_redirects=False,
        )
    assert r.status_code in (307, 503), (r.status_code, r.text[:300])
    epoch = int(r.headers.get("X-Canal-Epoch", "0"))
    assert epoch != old_epoch or r.status_code == 503
    run.wait_delivered_after(time.time())
    assert run.leader().id == new.id
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()
    assert (old_epoch, zombie.url) in run.claims
    assert all(url == new.url for e, url in run.claims if e > old_epoch)


@pytest.mark.chaos
def test_short_pause_keeps_the_leader(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    election = {**FAST_ELECTION, "ttl_s": 6.0}  # 5 s budget: room for a loaded machine
    budget = election["ttl_s"] - election["safety_margin_s"]
    run = chaos_run(sandbox).start(3, election=election)
    run.start_consumer("c1")
    run.wait_consumers_ready()
    leader = run.leader()
    run.wait_delivered_after(time.time())
    epoch = leader.health()["destinations"][DEST]["epoch"]  # type: ignore[index]
    run.fault(f"SIGSTOP {leader.id} for {budget / 5:.1f}s")
    leader.pause()
    time.sleep(budget / 5)  # the fault itself: a pause well below ttl - safety_margin
    leader.resume()
    run.wait_delivered_after(time.time())
    assert run.leader().id == leader.id
    result = run.finish(dup_window_s=WINDOW_S)
    assert result.ok, result.line()
    assert result.epochs == [epoch]
    assert result.duplicates == 0
