"""One chaos run: nodes, a write load, consumer processes, a leader poller, the checker.

``ChaosRun`` (made by the ``chaos_run`` fixture of ``conftest.py``)::

    run.start(nodes=3, election=..., meta=..., destination=...)   # nodes + load + poller
    run.start_consumer("c1")                                      # a consumer process
    leader = run.leader(); run.fault("leader SIGKILL"); leader.kill()
    run.wait_delivered_after(time.time())                         # load flows again
    result = run.finish(dup_window_s=...)                         # checker; JSON + line

Faults are recorded with ``fault(kind)`` just before they are injected; every
consumer's log and every /v1/health answer claiming leadership feed the checker.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node_fixtures import DEST, WAIT_S, NodeProc, node_config, start_nodes, wait_leader

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.ports import free_port
from canal_ha.sandbox.process import ManagedProcess
from canal_server.config import render_toml
from chaos.checker import (
    AckSeen,
    BatchSeen,
    CheckResult,
    Fault,
    check,
    parse_consumer_log,
)
from chaos.load import LoadWriter

__all__ = ["RESULTS", "ChaosRun", "ConsumerProc"]

log = logging.getLogger("chaos")

RESULTS = Path(__file__).parent / "results"
CONSUMER = Path(__file__).parent / "consumer.py"
SEQ_STRIDE = 1_000_000


@dataclass
class ConsumerProc:
    client_id: str
    destination: str
    out: Path
    process: ManagedProcess

    def lines(self) -> list[str]:
        try:
            return self.out.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []


@dataclass
class ChaosRun:
    name: str
    box: Sandbox
    workdir: Path
    nodes: list[NodeProc] = field(default_factory=list)
    writer: LoadWriter | None = None
    consumers: dict[tuple[str, str], list[ConsumerProc]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    claims: set[tuple[int, str]] = field(default_factory=set)
    # (time, destination, node url, epoch) of every /v1/health answer claiming leadership
    leader_samples: list[tuple[float, str, str, int]] = field(default_factory=list)
    destinations: tuple[str, ...] = (DEST,)
    tag: str = field(default_factory=lambda: f"cz{uuid.uuid4().hex[:8]}")
    _stop: threading.Event = field(default_factory=threading.Event)
    _pollers: list[threading.Thread] = field(default_factory=list)

    # -- set-up -----------------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self.nodes[0].prefix

    def start(
        self,
        nodes: int = 3,
        rate_txn_s: float = 40.0,
        load: bool = True,
        prefill: int = 0,
        **overrides: Any,
    ) -> ChaosRun:
        """Tables, ``nodes`` nodes (one destination, filtered to the load's tables), the
        leader poller; the load starts once a leader reads (``load=False``: call
        ``start_load`` yourself, e.g. after several clients subscribed: a client that
        subscribes later starts where the store is then). ``prefill``: rows per table
        written before the nodes start (for snapshots)."""
        self.writer = LoadWriter(self.box.primary, self.tag, rate_txn_s).setup()
        if prefill:
            self.writer.prefill(prefill)
        dest = {"filter": {"regex": self.writer.filter_regex}, **overrides.pop("destination", {})}
        self.nodes = start_nodes(self.box, nodes, self.workdir, destination=dest, **overrides)
        self._start_poller()
        self.leader()
        if load:
            self.writer.start()
        return self

    def start_load(self) -> None:
        assert self.writer is not None
        self.writer.start()

    def start_multi(
        self,
        destinations: Sequence[str],
        nodes: int = 3,
        rate_txn_s: float = 40.0,
        seed: int = 0,
        **overrides: Any,
    ) -> None:
        """Like ``start(load=False)`` with several destinations (same tables, own slave
        ids)."""
        self.writer = LoadWriter(self.box.primary, self.tag, rate_txn_s, seed).setup()
        self.destinations = tuple(destinations)
        prefix = f"/t{uuid.uuid4().hex[:12]}"
        for i in range(1, nodes + 1):
            port = free_port()
            cfg = node_config(self.box, f"node{i}", port, prefix, 1, DEST, **overrides)
            base = cfg["destinations"][DEST]
            cfg["destinations"] = {
                d: {**base, "slave_id": 7_000_000 + j * 1000 + random.randint(1, 999),
                    "filter": {"regex": self.writer.filter_regex}}
                for j, d in enumerate(destinations)
            }  # fmt: skip
            self.nodes.append(self._spawn(cfg, prefix, port))
        for node in self.nodes:
            wait_until(lambda n=node: n.health() is not None, f"{node.id} answers", WAIT_S)  # type: ignore[misc]
        self._start_poller()
        for d in destinations:
            self.leader(d)

    def _spawn(self, cfg: dict[str, Any], prefix: str, port: int) -> NodeProc:
        node_id = cfg["node"]["id"]
        path = self.workdir / "nodes" / f"{node_id}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_toml(cfg))
        argv = (sys.executable, "-m", "canal_ha.cli", "server", "--config", str(path))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        proc = ManagedProcess(f"chaos-{node_id}", argv, path.with_suffix(".log"), env=env)
        proc.start()
        return NodeProc(node_id, port, cfg["node"]["advertise_url"], path, proc, prefix)

    def start_consumer(self, client_id: str, destination: str = DEST, *extra: str) -> ConsumerProc:
        runs = self.consumers.setdefault((destination, client_id), [])
        name = f"{destination}-{client_id}-{len(runs)}"
        out = self.workdir / "consumers" / f"{name}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        endpoints = ",".join(self.box.etcd_endpoints)
        argv = (
            sys.executable, str(CONSUMER), "--etcd", endpoints, "--prefix", self.prefix,
            "--destination", destination, "--client-id", client_id, "--tag", self.tag,
            "--out", str(out), *extra,
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        tests_dir = str(Path(__file__).parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, env.get("PYTHONPATH")]))
        proc = ManagedProcess(f"consumer-{name}", argv, out.with_suffix(".log"), env=env)
        proc.start()
        consumer = ConsumerProc(client_id, destination, out, proc)
        runs.append(consumer)
        return consumer

    # -- observation ------------------------------------------------------------------------

    def _start_poller(self) -> None:
        """One poller per node (a paused node stalls only its own)."""

        def poll(node: NodeProc) -> None:
            while not self._stop.wait(0.2):
                h = node.health() if node.is_running() else None
                for name, d in (h or {}).get("destinations", {}).items():
                    if d.get("role") == "leader":
                        self.claims.add((int(d["epoch"]), node.url))
                        self.leader_samples.append((time.time(), name, node.url, int(d["epoch"])))

        for node in self.nodes:
            t = threading.Thread(target=poll, args=(node,), name=f"poll-{node.id}", daemon=True)
            t.start()
            self._pollers.append(t)

    def leader(self, destination: str = DEST, exclude: Sequence[NodeProc] = ()) -> NodeProc:
        return wait_leader(self.nodes, destination, WAIT_S, exclude)

    def cursors(self) -> dict[tuple[str, str], bytes | None]:
        """Each consumer's cursor as etcd has it (None: never flushed)."""
        coord = EtcdCoordinator(self.box.etcd_endpoints, timeout_s=2.0)
        keys = Keys(self.prefix)
        try:
            return {
                (d, c): (kv.value if (kv := coord.get(keys.cursor(d, c))) is not None else None)
                for d, c in self.consumers
            }
        finally:
            coord.close()

    def wait_subscribed(self, timeout_s: float = WAIT_S) -> None:
        """Every consumer's subscription reached etcd."""

        def subscribed() -> bool:
            coord = EtcdCoordinator(self.box.etcd_endpoints, timeout_s=2.0)
            keys = Keys(self.prefix)
            try:
                return all(
                    coord.get(keys.subscription(d, c)) is not None for d, c in self.consumers
                )
            finally:
                coord.close()

        wait_until(subscribed, "consumer subscriptions in etcd", timeout_s)

    def wait_consumers_ready(self, timeout_s: float = WAIT_S) -> None:
        """Every consumer got changes and its cursor reached etcd: from here on a new
        leader knows every client (before the first flush it would start at the end)."""
        self.wait_delivered_after(time.time(), timeout_s)
        wait_until(
            lambda: all(v is not None for v in self.cursors().values()),
            "consumer cursors flushed to etcd",
            timeout_s,
        )

    def wait_ack(self, after_t: float, timeout_s: float = WAIT_S) -> float:
        """The time of the first ack any consumer logged after ``after_t``."""
        found: list[float] = []

        def acked() -> bool:
            for stream in self.streams().values():
                found.extend(e.t for e in stream if isinstance(e, AckSeen) and e.t > after_t)
            return bool(found)

        wait_until(acked, f"an ack after {after_t}", timeout_s, max_interval_s=0.05)
        return min(found)

    def log_has(self, consumer: ConsumerProc, event: str, timeout_s: float = WAIT_S) -> None:
        needle = f'"ev":"{event}"'
        wait_until(
            lambda: any(needle in line for line in consumer.lines()),
            f"{event} in {consumer.out.name}",
            timeout_s,
        )

    def fault(self, kind: str, window_s: float | None = None) -> float:
        now = time.time()
        self.faults.append(Fault(kind, now, window_s))
        log.info("chaos %s: fault %s", self.name, kind)
        return now

    # -- faults used by several scenarios ---------------------------------------------------

    def kill_leader(self, note: str = "") -> NodeProc:
        """SIGKILL the leader, wait for another and for delivery, restart the old one."""
        leader = self.leader()
        self.fault(f"SIGKILL {leader.id}{note}")
        leader.kill()
        self.leader(exclude=[leader])
        self.wait_delivered_after(time.time())
        leader.restart()
        return leader

    def pause_leader_past_ttl(self, note: str = "") -> tuple[NodeProc, NodeProc]:
        """SIGSTOP the leader until another one delivers, then SIGCONT it: (zombie, new)."""
        zombie = self.leader()
        self.fault(f"SIGSTOP {zombie.id}{note}")
        zombie.pause()
        new = self.leader(exclude=[zombie])
        self.wait_delivered_after(time.time())
        zombie.resume()
        return zombie, new

    def promote_replica(self, note: str = "") -> None:
        """SIGKILL the MariaDB primary, promote the replica, move the writer to it and
        wait for delivery of changes written there."""
        assert self.writer is not None
        writer, replica = self.writer, self.box.replica
        self.fault(f"MariaDB primary SIGKILL{note}, replica promoted")
        self.box.primary.kill()
        replica.promote()
        writer.retarget(replica)
        wait_until(lambda: writer.errors > 0, "writer noticed", 30)
        self.wait_delivered_after(time.time(), timeout_s=90)

    def streams(self) -> dict[str, list[BatchSeen | AckSeen]]:
        out: dict[str, list[BatchSeen | AckSeen]] = {}
        for (dest, client), runs in self.consumers.items():
            events: list[BatchSeen | AckSeen] = []
            for i, c in enumerate(runs):
                events += parse_consumer_log(c.lines(), seq_base=i * SEQ_STRIDE)
            out[f"{dest}/{client}"] = events
        return out

    def delivered_after(self, t: float) -> bool:
        """Every consumer stream got a change committed after ``t``."""
        assert self.writer is not None
        later = {c.id for c in self.writer.history() if c.t > t}
        streams = self.streams()
        return bool(streams) and all(
            any(cid in later for e in s if isinstance(e, BatchSeen) for cid in e.changes)
            for s in streams.values()
        )

    def wait_delivered_after(self, t: float, timeout_s: float = WAIT_S) -> None:
        wait_until(lambda: self.delivered_after(t), f"delivery of changes after {t}", timeout_s)

    def _current(self, dup_window_s: float, lost_expected: bool = False) -> CheckResult:
        assert self.writer is not None
        return check(self.name, self.writer.history(), self.streams(), faults=self.faults,
                     leader_claims=self.claims, dup_window_s=dup_window_s,
                     lost_expected=lost_expected)  # fmt: skip

    # -- the end ------------------------------------------------------------------------------

    def finish(
        self, dup_window_s: float, drain_s: float = WAIT_S, lost_expected: bool = False
    ) -> CheckResult:
        """Stop the load, let consumers drain, stop them, check, write the result."""
        assert self.writer is not None
        self.writer.stop()
        try:
            wait_until(lambda: self._current(dup_window_s).lost == 0, "consumers drain", drain_s,
                       max_interval_s=1.0)  # fmt: skip
        except Exception as exc:  # RetryExhausted: the checker reports what is missing
            log.warning("chaos %s: drain incomplete: %s", self.name, exc)
        self.stop_consumers()
        self._stop.set()
        result = self._current(dup_window_s, lost_expected)
        path = result.write(RESULTS)
        print(result.line())
        print(f"[chaos {self.name}] result: {path}")
        if not result.ok:
            print(json.dumps(result.samples, indent=1)[:4000])
            for node in self.nodes:
                print(f"--- {node.id} log tail\n{node.log_tail(30)}")
        return result

    def stop_consumers(self) -> None:
        for runs in self.consumers.values():
            for c in runs:
                c.process.stop(timeout_s=10)

    def close(self) -> None:
        self._stop.set()
        if self.writer is not None and self.writer._thread is not None:
            self.writer.stop()
        self.stop_consumers()
        for node in self.nodes:
            node.process.resume()
            node.process.stop(timeout_s=20)
        for poller in self._pollers:
            poller.join(10)
