"""Incremental snapshots under faults: leader SIGKILL, leader SIGSTOP past the TTL, the
database primary killed and the replica promoted, each mid-snapshot under the write
load. Besides the usual checks (every change delivered, order per key, duplicates
bounded, one leader per epoch), each consumer's applied state (READ rows and changes
applied in the order received) must equal the tables at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import SandboxFactory
from node_fixtures import DEST

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from chaos.checker import BatchSeen, applied_state
from chaos.harness import ChaosRun

MakeRun = Callable[[Sandbox], ChaosRun]
PREFILL = 6000  # rows per table before the destination starts: only the snapshot has them
SNAPSHOT = {"snapshot": {"chunk_rows": 20}, "memory": {"buffer_size": 60}}
WINDOW_S = 1.2
WAIT_S = 120.0


def _start_snapshot(run: ChaosRun) -> str:
    assert run.writer is not None
    with run.leader().client() as http:
        r = http.post(f"/v1/destinations/{DEST}/snapshots",
                      json={"tables": [run.writer.filter_regex]})  # fmt: skip
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _reads(run: ChaosRun) -> int:
    return min(
        (sum(1 for e in s if isinstance(e, BatchSeen) for r in e.reads if r[2] == "R")
         for s in run.streams().values()),
        default=0,
    )  # fmt: skip


def _wait_reads(run: ChaosRun, n: int) -> None:
    wait_until(lambda: _reads(run) >= n, f"{n} snapshot rows at every consumer", WAIT_S)


def _snapshot_state(run: ChaosRun, snapshot_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def ended() -> bool:
        try:
            with run.leader().client() as http:
                found[:] = [http.get(f"/v1/destinations/{DEST}/snapshots/{snapshot_id}").json()]
        except (httpx.HTTPError, KeyError, ValueError):
            return False
        return found[0].get("state") in ("done", "failed", "cancelled")

    wait_until(ended, f"snapshot {snapshot_id} ends", WAIT_S * 2)
    return found[0]


def _assert_applied_state(run: ChaosRun, ignore: set[tuple[str, int]] = frozenset()) -> None:  # type: ignore[assignment]
    assert run.writer is not None
    source = {k: v for k, v in run.writer.db_state().items() if k not in ignore}
    for client, stream in run.streams().items():
        got = {k: v for k, v in applied_state(stream).items() if k not in ignore}
        missing = sorted(set(source) - set(got))[:5]
        extra = sorted(set(got) - set(source))[:5]
        wrong = sorted(k for k in set(got) & set(source) if got[k] != source[k])[:5]
        assert got == source, f"{client}: missing {missing}, extra {extra}, different {wrong}"


def _finish(run: ChaosRun, snapshot_id: str, dup_window_s: float) -> None:
    state = _snapshot_state(run, snapshot_id)
    assert state["state"] == "done", state
    result = run.finish(dup_window_s=dup_window_s)
    assert result.ok, result.line()
    _assert_applied_state(run, run.writer.db_lost_keys() if run.writer else set())


def _fault_mid_snapshot(run: ChaosRun, fault: Callable[[ChaosRun], object]) -> str:
    """A consumer, a snapshot half read by it, then ``fault``; the snapshot's id."""
    run.start_consumer("c1")
    run.wait_consumers_ready()
    snapshot_id = _start_snapshot(run)
    _wait_reads(run, PREFILL // 2)
    fault(run)
    return snapshot_id


@pytest.mark.chaos
def test_snapshot_leader_sigkill_mid_snapshot(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox).start(3, prefill=PREFILL, destination=SNAPSHOT)
    _finish(run, _fault_mid_snapshot(run, lambda r: r.kill_leader(" mid-snapshot")), WINDOW_S)


@pytest.mark.chaos
def test_snapshot_leader_sigstop_past_ttl(sandbox: Sandbox, chaos_run: MakeRun) -> None:
    run = chaos_run(sandbox).start(3, prefill=PREFILL, destination=SNAPSHOT)
    _finish(
        run, _fault_mid_snapshot(run, lambda r: r.pause_leader_past_ttl(" mid-snapshot")), WINDOW_S
    )


@pytest.mark.chaos
def test_snapshot_primary_killed_replica_promoted(
    make_sandbox: SandboxFactory, chaos_run: MakeRun
) -> None:
    box = make_sandbox(standby=True)
    replica = box.replica
    destination: dict[str, Any] = {
        **SNAPSHOT,
        "standby": {"address": f"127.0.0.1:{replica.port}"},
        "fallback_interval_s": 5,
        "detecting": {"enable": True, "interval_s": 0.5, "retry_threshold": 2, "timeout_s": 1.0},
    }
    run = chaos_run(box).start(3, prefill=PREFILL, destination=destination)
    replica.wait_caught_up(box.primary)
    _finish(run, _fault_mid_snapshot(run, lambda r: r.promote_replica(" mid-snapshot")), 5 + 2.0)
