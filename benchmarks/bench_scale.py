"""Scale-out parts: graceful handovers (consumer stall, duplicates) and the cost curve.

* ``handover``: 3 nodes, one destination, a steady one-row writer and a
  ClusterConnector consumer; ``--handovers`` steps of a rolling restart (SIGTERM the
  leader, start it again) and as many REST step-downs. Per handover the consumer's
  stall is the gap between its last batch from the old leader and its first batch from
  the new one (the writer commits every few ms, so the normal gap is that small).
* ``scale_clients``: end to end rows/s with 1, 4, 16 consumer processes on one
  destination of one node (every client reads the whole generated binlog).
* ``scale_destinations``: 1, 4, 16 destinations on one node, each reading the whole
  generated binlog (its own binlog stream), one consumer process each.
* ``idle_cost``: a node leading 1, 4, 16 idle destinations: RSS and CPU.
* ``settle``: 9 destinations on 3 nodes: the time to 3/3/3, that nothing moves then,
  a node SIGKILLed (5/4) and back (3/3/3), with the handovers each took.

Consumers run as separate processes (``bench_worker``) so the clients share no GIL
with each other; the node's own CPU use (cores, from its CPU time over the wall time)
shows what bounds it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.bench_cluster import DEST, FAST_ELECTION, BenchNode, start_nodes, stop_all
from benchmarks.bench_cluster import wait_leader as wait_bench_leader
from benchmarks.bench_common import REPO, Context, NotYet
from benchmarks.bench_data import SCHEMA
from canal_cluster.retry import wait_until

__all__ = ["handover", "idle_cost", "scale_clients", "scale_destinations", "settle"]

WAIT_S = 120.0
WRITER_TPS = 200.0
# The cost-curve nodes: the default election, etcd timeout and meta flush period (a node
# busy parsing must not fence itself on the fast test timings, nor flood etcd with
# flushes), and a store of 1024 entries, so the reader keeps pace with the slowest client
# and the measured window holds the parsing too.
CURVE_ELECTION = {"ttl_s": 10.0, "switch_delay_s": 5.0, "safety_margin_s": 2.0,
                  "loop_interval_s": 1.0}  # fmt: skip
CURVE_ETCD = {"timeout_s": 2.0}
CURVE_META = {"flush_period_ms": 1000}
CURVE_MEMORY = {"buffer_size": 1024}
CURVE_WAIT_S = 300.0


def _require() -> Any:
    try:
        from canal_client import connector
        from canal_server.node import Node

        if not hasattr(Node, "step_down"):
            raise ImportError("canal_server.node.Node has no step_down")
    except ImportError as exc:
        raise NotYet(f"graceful handover is not there: {exc}") from exc
    return connector


def _counts(option: Any, default: tuple[int, ...]) -> tuple[int, ...]:
    if not option:
        return default
    return tuple(int(x) for x in str(option).split(",") if x)


# -- handover ----------------------------------------------------------------------------------


@dataclass
class _Stream:
    """What the consumer thread saw: (monotonic time, epoch) per batch, ids received."""

    batches: list[tuple[float, int]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def consume(self, conn: Any) -> None:
        try:
            while not self.stop.is_set():
                batch = conn.get_without_ack(1000, 0.5)
                if batch.is_empty:
                    continue
                self.batches.append((time.monotonic(), conn.epoch))
                for entry in batch.entries:
                    if entry.header.table == "ho":
                        self.ids += [int(r.after[0].value) for r in entry.rows]
                conn.ack(batch.id)
        except BaseException as exc:  # reported by the part
            self.error.append(exc)

    def stall_after(self, t0: float, epoch: int) -> float:
        """Gap between the last batch of epoch <= ``epoch`` and the first of a higher one,
        both around ``t0`` (waits for the latter)."""
        first: list[float] = []

        def new_epoch() -> bool:
            if self.error:
                raise self.error[0]
            first[:] = [t for t, e in list(self.batches) if t > t0 - 1 and e > epoch][:1]
            return bool(first)

        wait_until(new_epoch, "a batch from the new leader", WAIT_S, 0.005, 0.02)
        last_old = max((t for t, e in list(self.batches) if e <= epoch), default=t0)
        return first[0] - last_old


class _Writer(threading.Thread):
    def __init__(self, ctx: Context, tps: float) -> None:
        super().__init__(name="bench-handover-writer", daemon=True)
        self.ctx, self.tps = ctx, tps
        self.halt = threading.Event()
        self.written = 0

    def run(self) -> None:
        with self.ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
            while not self.halt.wait(1 / self.tps):
                cur.execute(f"INSERT INTO {SCHEMA}.ho VALUES (%s)", (self.written + 1,))
                self.written += 1


def _epoch(node: BenchNode) -> int:
    d = node.destination()
    assert d is not None
    return int(d["epoch"])


def _flowing(stream: _Stream, epoch: int) -> None:
    n = len(stream.batches)
    wait_until(
        lambda: len(stream.batches) > n + 3 and stream.batches[-1][1] >= epoch,
        "batches from the leader", WAIT_S,
    )  # fmt: skip


def _sigterm_step(nodes: list[BenchNode], stream: _Stream) -> float:
    leader = wait_bench_leader(nodes)
    epoch = _epoch(leader)
    _flowing(stream, epoch)
    t0 = time.monotonic()
    leader.stop()  # SIGTERM: hands over, exits
    stall = stream.stall_after(t0, epoch)
    leader.restart()
    return stall


def _step_down_step(nodes: list[BenchNode], stream: _Stream) -> tuple[float, float]:
    leader = wait_bench_leader(nodes)
    epoch = _epoch(leader)
    _flowing(stream, epoch)
    t0 = time.monotonic()
    r = httpx.post(f"{leader.url}/v1/destinations/{DEST}/step-down", json={}, timeout=30)
    r.raise_for_status()
    return stream.stall_after(t0, epoch), float(r.json()["took_ms"])


def _series(stalls: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in stalls]
    return {
        "stalls_ms": [round(x, 1) for x in ms],
        "median_ms": round(statistics.median(ms), 1),
        "max_ms": round(max(ms), 1),
    }


def handover(ctx: Context) -> dict[str, Any]:
    connector = _require()
    steps = int(ctx.options.get("handovers", 20))
    db = ctx.sandbox.primary
    db.execute(
        f"DROP TABLE IF EXISTS {SCHEMA}.ho", f"CREATE TABLE {SCHEMA}.ho (id INT PRIMARY KEY)"
    )
    nodes = start_nodes(ctx, 3, "handover", election=dict(FAST_ELECTION))
    stream, writer = _Stream(), _Writer(ctx, WRITER_TPS)
    sigterm: list[float] = []
    step_down: list[tuple[float, float]] = []
    try:
        wait_bench_leader(nodes)
        conn = connector.ClusterConnector(DEST, "handover", etcd=ctx.sandbox.etcd_endpoints,
                                          prefix=nodes[0].prefix)  # fmt: skip
        with conn:
            conn.subscribe(f"{SCHEMA}\\.ho")
            consumer = threading.Thread(target=stream.consume, args=(conn,))
            consumer.start()
            writer.start()
            try:
                sigterm = [_sigterm_step(nodes, stream) for _ in range(steps)]
                step_down = [_step_down_step(nodes, stream) for _ in range(steps)]
                writer.halt.set()
                writer.join(10)
                wait_until(lambda: len(set(stream.ids)) >= writer.written, "drain", WAIT_S)
            finally:
                writer.halt.set()
                stream.stop.set()
                consumer.join(30)
    finally:
        stop_all(nodes)
    unique = set(stream.ids)
    return {
        "sigterm": _series(sigterm),
        "step_down": {**_series([s for s, _ in step_down]),
                      "took_ms": [round(t, 1) for _, t in step_down]},
        "handovers": 2 * steps, "rows_written": writer.written, "rows_received": len(stream.ids),
        "duplicate_rows": len(stream.ids) - len(unique),
        "lost_rows": len(set(range(1, writer.written + 1)) - unique),
        "writer_tps": WRITER_TPS, "nodes": 3, "election": FAST_ELECTION,
        "client": "ClusterConnector (etcd), get_without_ack(1000, 0.5 s) + ack",
        "stall": "last batch from the old leader -> first batch from the new one",
    }  # fmt: skip


# -- the cost curve ----------------------------------------------------------------------------


def _spawn(url: str, destination: str, client: str, rows: int, go: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "benchmarks.bench_worker", "--url", url, "--destination",
            destination, "--client-id", client, "--rows", str(rows), "--go", str(go)]  # fmt: skip
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a consumer exited ({proc.wait()}) without a word")
    data: dict[str, Any] = json.loads(line)
    if data.get("ev") == "error":
        raise RuntimeError(f"a consumer failed: {data['error']}")
    return data


def _run_consumers(
    node: BenchNode, pairs: list[tuple[str, str]], rows: int, go: Path
) -> dict[str, Any]:
    """Start one consumer process per (destination, client id), release them together,
    measure the node's CPU meanwhile; rows/s aggregate and per client."""
    procs = [_spawn(node.url, d, c, rows, go) for d, c in pairs]
    try:
        for p in procs:
            _line(p)  # ready
        cpu = psutil.Process(node.pid)
        cpu0, t0 = sum(cpu.cpu_times()[:2]), time.monotonic()
        go.touch()
        done = [_line(p) for p in procs]
        cpu_s, wall = sum(cpu.cpu_times()[:2]) - cpu0, time.monotonic() - t0
    finally:
        _reap(procs)
    span = max(d["end"] for d in done) - min(d["start"] for d in done)
    per = [d["rows"] / (d["end"] - d["start"]) for d in done]
    return {
        "consumers": len(pairs), "rows_total": sum(d["rows"] for d in done),
        "aggregate_rows_per_s": round(sum(d["rows"] for d in done) / span),
        "per_client_rows_per_s": round(statistics.median(per)),
        "min_client_rows_per_s": round(min(per)),
        "duplicate_rows": sum(d["duplicate_rows"] for d in done),
        "node_cpu_cores": round(cpu_s / wall, 2), "seconds": round(span, 2),
    }  # fmt: skip


def _reap(procs: list[subprocess.Popen[str]]) -> None:
    """Each consumer process has ended (done, or killed when the part failed)."""
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
        if p.stdout is not None:
            p.stdout.close()


def _reading_node(ctx: Context, label: str, names: tuple[str, ...]) -> BenchNode:
    """One node whose destinations ``names`` read the generated binlog from its start
    (its tables only: other parts write other tables meanwhile)."""
    ds = ctx.dataset
    master = {"journal_name": ds.journal, "position": ds.offset}
    only = {"regex": ",".join(t.replace(".", "\\.") for t in ds.tables)}
    dest = {"master": master, "filter": only, "memory": CURVE_MEMORY}
    nodes = start_nodes(
        ctx, 1, label, names,
        election=CURVE_ELECTION, etcd=CURVE_ETCD, meta=CURVE_META, destination=dest,
    )  # fmt: skip
    node = nodes[0]
    try:
        _wait_led(node, names)
    except BaseException:
        stop_all(nodes)
        raise
    return node


def _wait_led(node: BenchNode, names: tuple[str, ...]) -> None:
    def all_running() -> bool:
        h = node.health()
        return h is not None and all(
            h["destinations"][n]["role"] == "leader"
            and h["destinations"][n]["reader"]["state"] == "running"
            for n in names
        )

    try:
        wait_until(all_running, f"{node.id} leads {len(names)} destinations", CURVE_WAIT_S)
    except Exception:
        h = node.health() or {"destinations": {}}
        states = {n: (d["role"], d["reader"]["state"], d["reader"]["error"][:80])
                  for n, d in h["destinations"].items()}  # fmt: skip
        tail = node.process.log_tail(20)
        raise RuntimeError(f"{node.id} does not lead all of {names}: {states}\n{tail}") from None


def scale_clients(ctx: Context) -> dict[str, Any]:
    _require()
    rows = ctx.dataset.rows
    out = []
    for k in _counts(ctx.options.get("scale_clients"), (1, 4, 16)):
        node = _reading_node(ctx, f"clients{k}", (DEST,))
        try:
            pairs = [(DEST, f"c{i}") for i in range(k)]
            out.append(_run_consumers(node, pairs, rows, ctx.workdir / f"go-clients{k}"))
        finally:
            stop_all([node])
    return {
        "runs": out, "rows_per_client": rows, "memory": CURVE_MEMORY,
        "node": "1 node, 1 destination, msgpack; clock from the release of the clients",
    }  # fmt: skip


def scale_destinations(ctx: Context) -> dict[str, Any]:
    _require()
    rows = ctx.dataset.rows
    out = []
    for k in _counts(ctx.options.get("scale_destinations"), (1, 4, 16)):
        names = tuple(f"s{i}" for i in range(1, k + 1))
        node = _reading_node(ctx, f"dests{k}", names)
        try:
            pairs = [(n, "c1") for n in names]
            out.append(_run_consumers(node, pairs, rows, ctx.workdir / f"go-dests{k}"))
        finally:
            stop_all([node])
    return {
        "runs": out, "rows_per_destination": rows, "memory": CURVE_MEMORY,
        "node": "1 node, k destinations each reading the whole binlog, 1 client each",
    }  # fmt: skip


def idle_cost(ctx: Context) -> dict[str, Any]:
    _require()
    idle_s = float(ctx.options.get("idle_seconds", 10.0))
    out = []
    for k in _counts(ctx.options.get("scale_destinations"), (1, 4, 16)):
        names = tuple(f"i{i}" for i in range(1, k + 1))
        idle = {"heartbeat_s": 5.0}
        nodes = start_nodes(
            ctx, 1, f"idle{k}", names,
            election=CURVE_ELECTION, etcd=CURVE_ETCD, meta=CURVE_META, destination=idle,
        )  # fmt: skip
        node = nodes[0]
        try:
            _wait_led(node, names)
            time.sleep(2.0)  # settle after the start
            proc = psutil.Process(node.pid)
            cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            time.sleep(idle_s)
            cpu_s, wall = sum(proc.cpu_times()[:2]) - cpu0, time.monotonic() - t0
            out.append({"destinations": k, "rss_bytes": proc.memory_info().rss,
                        "cpu_percent": round(100 * cpu_s / wall, 2),
                        "threads": proc.num_threads()})  # fmt: skip
        finally:
            stop_all(nodes)
    first, last = out[0], out[-1]
    extra = last["destinations"] - first["destinations"] or 1
    return {
        "runs": out, "idle_seconds": idle_s, "heartbeat_s": 5.0,
        "rss_per_destination_bytes": round((last["rss_bytes"] - first["rss_bytes"]) / extra),
        "cpu_percent_per_destination": round(
            (last["cpu_percent"] - first["cpu_percent"]) / extra, 3),
    }  # fmt: skip


# -- fair share ----------------------------------------------------------------------------------

SETTLE_HOLD_S = 2.0
QUIET_S = 10.0


def _shape(coord: Any, prefix: str) -> dict[str, int]:
    from canal_cluster.balance import read_view
    from canal_cluster.keys import Keys

    return dict(Counter(read_view(coord, Keys(prefix)).leaders.values()))


def _moves(nodes: list[BenchNode]) -> int:
    return sum(n.process.log_tail(5000).count(": rebalanced, handing over") for n in nodes)


def _phase(
    coord: Any, nodes: list[BenchNode], what: str, want: list[int], t0: float, moves0: int
) -> dict[str, Any]:
    prefix = nodes[0].prefix
    wait_until(
        lambda: sorted(_shape(coord, prefix).values(), reverse=True) == want,
        f"leaders per node {want}", WAIT_S, 0.05, 0.2,
    )  # fmt: skip
    seconds = round(time.monotonic() - t0, 2)
    return {"phase": what, "leaders": _shape(coord, prefix), "seconds": seconds,
            "moves": _moves(nodes) - moves0}  # fmt: skip


def settle(ctx: Context) -> dict[str, Any]:
    _require()
    from canal_cluster.etcd_coordinator import EtcdCoordinator

    names = tuple(f"b{i}" for i in range(1, 10))
    idle = {"filter": {"regex": f"{SCHEMA}\\.none"}}
    balance = {"hold_s": SETTLE_HOLD_S}
    coord = EtcdCoordinator(ctx.sandbox.etcd_endpoints, timeout_s=2.0)
    t0 = time.monotonic()
    nodes = start_nodes(ctx, 3, "settle", names, balance=balance, destination=idle)
    try:
        phases = [_phase(coord, nodes, "3 nodes start", [3, 3, 3], t0, 0)]
        moves = _moves(nodes)
        time.sleep(QUIET_S)  # settled: nothing may move
        quiet = _moves(nodes) - moves
        t0, moves = time.monotonic(), _moves(nodes)
        nodes[2].kill()
        phases.append(_phase(coord, nodes, "node3 SIGKILLed", [5, 4], t0, moves))
        t0, moves = time.monotonic(), _moves(nodes)
        nodes[2].restart()
        phases.append(_phase(coord, nodes, "node3 back", [3, 3, 3], t0, moves))
    finally:
        stop_all(nodes)
        coord.close()
    return {
        "phases": phases, "destinations": len(names), "nodes": 3, "hold_s": SETTLE_HOLD_S,
        "quiet_window_s": QUIET_S, "moves_in_quiet_window": quiet, "election": FAST_ELECTION,
    }  # fmt: skip
