"""Scale out against real nodes and etcd: leaders spread over the nodes (fair share),
graceful handover by step-down (REST and `canal-ha step-down`) and by SIGTERM.

The decisions themselves are unit-tested in test_balance.py; here the node processes
must reach and keep the same shapes, and consumers must lose nothing across handovers.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from node_fixtures import (  # noqa: F401
    FAST_ELECTION,
    WAIT_S,
    NodeProc,
    fresh_database,
    node_cluster,
    wait_leader,
)

from canal_client.connector import ClusterConnector
from canal_cluster.balance import read_view
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox

DB = "t_scale"
Cluster = Callable[..., list[NodeProc]]
NINE = [f"d{i}" for i in range(1, 10)]
BALANCE = {"hold_s": 2.0}


@pytest.fixture
def table(sandbox: Sandbox) -> Iterator[Any]:
    with fresh_database(sandbox.primary, DB) as p:
        yield p


def counts(coord: EtcdCoordinator, prefix: str) -> Counter[str]:
    """Destinations led per node, as etcd has it."""
    return Counter(read_view(coord, Keys(prefix)).leaders.values())


def wait_counts(coord: EtcdCoordinator, prefix: str, want: list[int]) -> None:
    """Until the nodes lead ``want`` destinations (largest first), e.g. [5, 4]."""

    def shaped() -> bool:
        return sorted(counts(coord, prefix).values(), reverse=True) == want

    wait_until(shaped, f"leaders per node {want}", WAIT_S)


def epochs(coord: EtcdCoordinator, prefix: str, names: list[str]) -> dict[str, int]:
    keys = Keys(prefix)
    out = {}
    for d in names:
        kv = coord.get(keys.running(d))
        out[d] = kv.create_revision if kv is not None else 0
    return out


def test_nine_destinations_settle_3_3_3_then_5_4_and_back_without_flapping(
    node_cluster: Cluster,  # noqa: F811
    coord: EtcdCoordinator,
) -> None:
    nodes = node_cluster(3, names=NINE, balance=BALANCE)
    prefix = nodes[0].prefix
    wait_counts(coord, prefix, [3, 3, 3])
    settled = epochs(coord, prefix, NINE)
    # settled: a few hold periods later nothing moved (no handover, no new epoch)
    deadline = time.monotonic() + 4 * BALANCE["hold_s"]
    while time.monotonic() < deadline:
        assert epochs(coord, prefix, NINE) == settled
        time.sleep(0.5)

    nodes[2].kill()
    wait_counts(coord, prefix, [5, 4])
    moved = epochs(coord, prefix, NINE)
    kept = [d for d in NINE if moved[d] == settled[d]]
    assert len(kept) == 6  # only node3's three destinations changed hands

    nodes[2].restart()
    wait_counts(coord, prefix, [3, 3, 3])
    back = epochs(coord, prefix, NINE)
    assert sum(back[d] != moved[d] for d in NINE) == 3  # 5/4 -> 3/3/3: three moves
    logs = nodes[0].log_tail(400) + nodes[1].log_tail(400)
    assert "rebalanced, handing over to node node3" in logs
    assert "> fair share 3 (9 destinations on 3 nodes)" in logs
    assert "took_over, leading (node node3" in nodes[2].log_tail(400)
    for node in nodes:  # every destination is served by its leader
        health = node.health()
        assert health is not None
        for d, h in health["destinations"].items():
            assert h["role"] in ("leader", "standby", "starting"), (node.id, d, h)


@dataclass
class Consumer:
    """A ClusterConnector in a thread, following the leader through etcd."""

    destination: str
    endpoints: list[str]
    prefix: str
    client_id: str = "c1"
    ids: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Consumer:
        self.thread = threading.Thread(target=self._run, name=f"consumer {self.destination}")
        self.thread.start()
        assert self.ready.wait(WAIT_S), self.errors
        return self

    def _run(self) -> None:
        retry = RetryPolicy(initial_s=0.05, max_delay_s=0.5)
        conn = ClusterConnector(
            self.destination, self.client_id, etcd=self.endpoints, prefix=self.prefix, retry=retry
        )
        try:
            with conn:
                conn.subscribe(f"{DB}\\..*")
                self.ready.set()
                while not self.stop.is_set():
                    batch = conn.get_without_ack(100, 0.5)
                    for e in batch.entries:
                        self.ids += [int(str(r.after_values()["id"])) for r in e.rows]
                    if batch.id >= 0:
                        conn.ack(batch.id)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
            self.ready.set()

    def wait_for(self, n: int) -> None:
        wait_until(lambda: len(set(self.ids)) >= n or bool(self.errors), f"{n} rows", WAIT_S)
        assert not self.errors, self.errors

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(WAIT_S)


def test_step_down_hands_over_at_once_and_the_consumer_follows(
    node_cluster: Cluster,  # noqa: F811
    table: Any,
    sandbox: Sandbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="canal_client")
    nodes = node_cluster(3, destination={"filter": {"regex": f"{DB}\\..*"}})
    by_id = {n.id: n for n in nodes}
    leader = wait_leader(nodes)
    consumer = Consumer(leader.destination, sandbox.etcd_endpoints, leader.prefix).start()
    path = f"/v1/destinations/{leader.destination}/step-down"
    try:
        table.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(1, 51)))
        consumer.wait_for(50)
        standby = next(n for n in nodes if n is not leader)
        with standby.client() as http:  # any node: 307 to the leader
            r = http.post(path, json={"to": "nope"}, follow_redirects=True)
            assert r.status_code == 400 and r.json()["field"] == "to", r.text
            assert "not live" in r.json()["message"]
            r = http.post(path, json={"to": 3}, follow_redirects=True)
            assert r.status_code == 400 and r.json()["field"] == "to", r.text
            r = http.post(path, json={}, follow_redirects=True)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["from"] == leader.id and out["to"] != leader.id
        assert out["new_epoch"] > out["epoch"]
        assert int(r.headers["X-Canal-Epoch"]) == out["new_epoch"]
        successor = by_id[out["to"]]
        assert wait_leader(nodes) is successor
        table.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(51, 101)))
        consumer.wait_for(100)

        # the CLI: to a named node, found through etcd
        target = next(n for n in nodes if n not in (successor,))
        cli = [sys.executable, "-m", "canal_ha.cli", "step-down", "--etcd",
               ",".join(sandbox.etcd_endpoints), "--prefix", leader.prefix,
               "--destination", leader.destination]  # fmt: skip
        res = subprocess.run([*cli, "--to", target.id], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert f"{successor.id} (epoch {out['new_epoch']}) -> {target.id} (epoch" in res.stdout
        assert wait_leader(nodes) is target
        bad = subprocess.run([*cli, "--to", target.id], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "--to:" in bad.stderr and "this node" in bad.stderr
        table.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(101, 151)))
        consumer.wait_for(150)
    finally:
        consumer.close()
    assert sorted(set(consumer.ids)) == list(range(1, 151))  # nothing lost
    assert len(consumer.ids) - 150 <= 2 * 100  # at most the batch outstanding per handover
    follows = [r for r in caplog.records if "following leader change" in r.getMessage()]
    assert len(follows) == 2, [r.getMessage() for r in follows]  # one per handover: no storm
    assert "took_over, leading" in successor.log_tail(200)
    assert "took_over, leading" in target.log_tail(200)


def test_sigterm_rolling_restart_hands_every_destination_over_and_loses_nothing(
    node_cluster: Cluster,  # noqa: F811
    table: Any,
    sandbox: Sandbox,
    coord: EtcdCoordinator,
) -> None:
    names = ["r1", "r2", "r3"]
    nodes = node_cluster(
        3, names=names, balance=BALANCE, destination={"filter": {"regex": f"{DB}\\..*"}}
    )
    prefix = nodes[0].prefix
    wait_counts(coord, prefix, [1, 1, 1])
    consumers = [Consumer(d, sandbox.etcd_endpoints, prefix).start() for d in names]
    written = 0
    try:
        for node in nodes:
            led = [d for d, n in read_view(coord, Keys(prefix)).leaders.items() if n == node.id]
            table.execute(*(f"INSERT INTO {DB}.t VALUES ({written + i})" for i in range(1, 21)))
            written += 20
            before = epochs(coord, prefix, names)
            assert node.stop() == 0  # SIGTERM: handed over, then exit 0
            for d in led:
                was = before[d]
                wait_until(
                    lambda d=d, was=was: epochs(coord, prefix, [d])[d] > was,  # type: ignore[misc]
                    f"a new leader of {d}",
                    WAIT_S,
                )
                took = f"{Keys(prefix).running(d)}: took_over, leading"
                assert any(took in n.log_tail(400) for n in nodes if n is not node), d
            table.execute(*(f"INSERT INTO {DB}.t VALUES ({written + i})" for i in range(1, 21)))
            written += 20
            for c in consumers:
                c.wait_for(written)
            log = node.log_tail(200)
            assert all(f"{d}: handed over to node" in log for d in led), log
            node.restart()
            wait_counts(coord, prefix, [1, 1, 1])
    finally:
        for c in consumers:
            c.close()
    for c in consumers:
        assert sorted(set(c.ids)) == list(range(1, written + 1)), c.destination
