"""Node parts: end to end (msgpack, JSON), commit latency, failover time, node RSS.

All of them run the real ``canal-ha server`` (bench_cluster) and the real client
(``canal_client``). End to end reads the generated binlog from its start position: the
clock starts when the leader's reader is seen running and stops at the last ack.
"""

from __future__ import annotations

import gc
import importlib
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from benchmarks import e2e_consumer
from benchmarks.bench_cluster import (
    DEST,
    FAST_ELECTION,
    BenchNode,
    start_nodes,
    stop_all,
    wait_leader,
)
from benchmarks.bench_common import (
    REPO,
    Context,
    NotYet,
    median_runs,
    percentile,
    warnings_of,
)
from benchmarks.bench_data import COLUMNS, SCHEMA, TX_ROWS, row_select
from canal_cluster.retry import wait_until

__all__ = ["e2e_json", "e2e_msgpack", "failover", "latency", "node_rss"]

BATCH_SIZE = 1000  # entries per get (Canal's batchSize)
LATENCY_RATES = (100.0, 1000.0, 3000.0, 5000.0)  # tx/s of one-row transactions
LATENCY_GOAL_TPS = (1000.0, 5000.0)
LATENCY_GOAL_P99_MS = 20.0
LATENCY_ACK_MODES = ("on_get", "separate")  # each rate in both, alternating (A/B)
# the node's HTTP stack (node.http, node.loop): today's default, then the one before it
LATENCY_STACKS = ({"http": "httptools", "loop": "uvloop"}, {"http": "h11", "loop": "asyncio"})
E2E_TIMEOUT_S = 1800.0
# a trial signals the leader after a random wait of up to one etcd lease-sweep tick (500
# ms): the trial loop's steps take about the same time every trial, so without it every
# crash would come at the same phase of that tick and the lease's lateness with it
KILL_JITTER_S = 0.5


def _require() -> Any:
    """The canal_client.connector module, or NotYet naming what is missing."""
    for module in ("canal_ha.server_cli", "canal_server.node", "canal_client.connector"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise NotYet(f"{module} is not importable: {exc}") from exc
    return importlib.import_module("canal_client.connector")


def _e2e(ctx: Context, wire: str) -> dict[str, Any]:
    """``ctx.repeat`` rounds, each with a fresh node and client id per run (median, as the
    readers): the consumer in a process of its own, get after get (the headline); the
    same with a prefetching stream; and, beside them, the get loop inside this process
    (``in_harness_*``)."""
    runs, ahead, inside = [], [], []
    for run in range(ctx.repeat):
        runs.append(_e2e_once(ctx, wire, run, prefetch=False, own_process=True))
        ahead.append(_e2e_once(ctx, wire, run, prefetch=True, own_process=True))
        inside.append(_e2e_once(ctx, wire, run, prefetch=False, own_process=False))
    with_prefetch, in_harness = median_runs(ahead), median_runs(inside)
    return {
        **median_runs(runs),
        "prefetch_rows_per_s": with_prefetch["rows_per_s"],
        "prefetch_runs": with_prefetch["runs"],
        "in_harness_rows_per_s": in_harness["rows_per_s"],
        "in_harness_runs": in_harness["runs"],
    }


def _consume_here(url: str, wire: str, rows: int) -> dict[str, Any]:
    """``e2e_consumer``'s get loop run in this process (its objects share the harness's GC)."""
    with warnings_of("canal_client") as client_warnings:
        return e2e_consumer.consume(
            url, DEST, f"e2e-{wire}", wire=wire, rows=rows, batch_size=BATCH_SIZE,
            timeout_s=E2E_TIMEOUT_S, prefetch=False, warnings=client_warnings,
        )  # fmt: skip


def _consume_apart(url: str, wire: str, rows: int, prefetch: bool) -> dict[str, Any]:
    """``python -m benchmarks.e2e_consumer`` in a process of its own; its JSON line."""
    argv = [
        sys.executable, "-m", "benchmarks.e2e_consumer", "--url", url, "--destination", DEST,
        "--client-id", f"e2e-{wire}", "--wire", wire, "--rows", str(rows),
        "--batch-size", str(BATCH_SIZE), "--timeout-s", str(E2E_TIMEOUT_S),
        *(["--prefetch"] if prefetch else []),
    ]  # fmt: skip
    wait_s = E2E_TIMEOUT_S + 60.0
    try:
        done = subprocess.run(
            argv, cwd=REPO, capture_output=True, text=True, timeout=wait_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the e2e consumer did not finish within {wait_s:.0f}s") from exc
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the e2e consumer exited {done.returncode}: {tail}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _e2e_once(
    ctx: Context, wire: str, run: int, prefetch: bool, own_process: bool
) -> dict[str, Any]:
    _require()
    ds = ctx.dataset
    master = {"journal_name": ds.journal, "position": ds.offset}
    label = f"e2e-{wire}-{run}{'-ahead' if prefetch else ''}{'' if own_process else '-here'}"
    nodes = start_nodes(ctx, 1, label, destination={"master": master})
    try:
        wait_leader(nodes)
        if own_process:
            got = _consume_apart(nodes[0].url, wire, ds.rows, prefetch)
        else:
            got = _consume_here(nodes[0].url, wire, ds.rows)
    finally:
        stop_all(nodes)
    if got["rows"] != ds.rows:
        raise RuntimeError(f"the client got {got['rows']} row changes, the binlog has {ds.rows}")
    return {
        **got, "seconds": round(got["seconds"], 3), "rows_per_s": got["rows"] / got["seconds"],
        "client_connect_s": round(got["client_connect_s"], 3),
        "batch_size_entries": BATCH_SIZE, "wire": wire,
        "path": "leader node -> REST -> SimpleConnector in a process of its own "
        "(benchmarks/e2e_consumer.py; startup objects frozen out of the GC, as the node and "
        "the latency consumer do), get_without_ack carrying the ack of the batch before; "
        "prefetch_*: Connector.stream(prefetch=True), the next get in flight (a worker "
        "thread) while one is read; in_harness_*: the get loop inside the benchmark's "
        "process (no freeze); timed from the connector's "
        "creation to the last row read",
        "prefetch": prefetch, "own_process": own_process,
    }  # fmt: skip


def e2e_msgpack(ctx: Context) -> dict[str, Any]:
    return _e2e(ctx, "msgpack")


def e2e_json(ctx: Context) -> dict[str, Any]:
    return _e2e(ctx, "json")


# -- commit -> client latency -------------------------------------------------------------------


@dataclass
class _Arrivals:
    """Latency samples by row id, filled by the consumer thread."""

    latency_us: dict[int, int] = field(default_factory=dict)
    insert_us: dict[int, int] = field(default_factory=dict)  # the INSERT's round trip
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)
    epochs: list[tuple[float, int]] = field(default_factory=list)
    ack_on_get: bool = True  # the consumer acks with its next get, else on its own
    gets: int = 0  # get requests made (each a request to the node), empty ones included


def _consume(conn: Any, table: str, arrivals: _Arrivals) -> None:
    """Get + ack until stopped; record (arrival - sent) per row of ``table`` and the epoch
    with the time of every non-empty batch. Acks ride on the next get
    (``arrivals.ack_on_get``), else each is its own request."""
    done: int | None = None  # processed, not acked yet
    try:
        while not arrivals.stop.is_set():
            if done is not None and not arrivals.ack_on_get:
                conn.ack(done)
                done = None
            batch = conn.get_without_ack(BATCH_SIZE, 0.5, ack=done)
            now_us = time.time_ns() // 1000
            arrivals.gets += 1
            done = None
            if batch.is_empty:
                continue
            arrivals.epochs.append((time.monotonic(), conn.epoch))
            for entry in batch.entries:
                if entry.header.table != table:
                    continue
                for row in entry.rows:
                    values = {c.name: c.value for c in row.after}
                    arrivals.latency_us.setdefault(
                        int(values["id"]), now_us - int(values["sent_us"])
                    )
            done = batch.id
        if done is not None:
            conn.ack(done)
    except BaseException as exc:  # reported by the part
        arrivals.error.append(exc)


def _paced_writer(socket: str, table: str, first_id: int, tps: float, n: int, out: Any) -> None:
    """In its own process (the consumer's GIL is not the writer's): ``n`` autocommit
    one-row inserts at ``tps``; sends (elapsed s, {id: INSERT round trip µs}, CPU s) to
    ``out``."""
    import pymysql

    insert_us: dict[int, int] = {}
    conn = pymysql.connect(unix_socket=socket, user="root", autocommit=True, charset="utf8mb4")
    with conn, conn.cursor() as cur:
        sql = f"INSERT INTO {SCHEMA}.{table} VALUES (%s, %s, 'x')"
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(n):
            delay = t0 + i / tps - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent_us = time.time_ns() // 1000
            cur.execute(sql, (first_id + i, sent_us))
            insert_us[first_id + i] = time.time_ns() // 1000 - sent_us
        elapsed = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
    out.send((elapsed, insert_us, cpu_s))
    out.close()


def _write_paced(
    ctx: Context, table: str, first_id: int, tps: float, seconds: float, arrivals: _Arrivals
) -> tuple[int, float, float]:
    """Autocommit one-row inserts at ``tps`` for ``seconds`` from a writer process of its
    own; (rows written, achieved tps, the writer's CPU s while writing). Records each
    INSERT's round trip (stamp -> the database acknowledged the commit)."""
    n = max(1, int(tps * seconds))
    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    socket = str(ctx.sandbox.primary.socket)
    writer = spawn.Process(target=_paced_writer, args=(socket, table, first_id, tps, n, send))
    writer.start()
    send.close()
    try:
        if not receive.poll(seconds * 3 + 120):
            raise TimeoutError(f"the writer process sent nothing in {seconds * 3 + 120} s")
        elapsed, insert_us, cpu_s = receive.recv()
    finally:
        writer.join(30)
        receive.close()
    arrivals.insert_us.update(insert_us)
    return n, n / elapsed, cpu_s


def _rate_stats(arrivals: _Arrivals, ids: range, tps: float, achieved: float) -> dict[str, Any]:
    wait_until(
        lambda: all(i in arrivals.latency_us for i in ids) or bool(arrivals.error),
        f"{len(ids)} rows at the client", 120,
    )  # fmt: skip
    if arrivals.error:
        raise arrivals.error[0]
    ms = [arrivals.latency_us[i] / 1000 for i in ids]
    insert_ms = [arrivals.insert_us[i] / 1000 for i in ids]
    after_ms = [(arrivals.latency_us[i] - arrivals.insert_us[i]) / 1000 for i in ids]
    return {
        "target_tps": tps, "achieved_tps": round(achieved, 1), "samples": len(ms),
        "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms),
        "mean_ms": round(statistics.fmean(ms), 3),
        "insert_p50_ms": percentile(insert_ms, 50), "insert_p99_ms": percentile(insert_ms, 99),
        "after_commit_p50_ms": percentile(after_ms, 50),
        "after_commit_p99_ms": percentile(after_ms, 99),
    }  # fmt: skip


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _machine_busy_s() -> tuple[float, float]:
    """(busy CPU s, all CPU s) of the whole machine so far, every core (/proc/stat)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick


def thread_waits_s(pid: int, proc: str = "/proc") -> dict[str, float] | None:
    """Seconds each thread of ``pid`` has spent runnable but waiting for a core (the
    second field of ``/proc/PID/task/TID/schedstat``), by thread id; None when the
    kernel keeps no schedstat."""
    waits: dict[str, float] = {}
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                waits[tid] = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile, or no schedstat
    return waits if waits or not tids else None


def waited_s(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Thread-seconds spent waiting for a core between two ``thread_waits_s``: threads
    that ended meanwhile are left out, threads started meanwhile count whole."""
    if before is None or after is None:
        return None
    return sum(w - before.get(tid, 0.0) for tid, w in after.items())


class _CpuMeter:
    """CPU used by the node, MariaDB, this process (the client) and the whole machine
    from ``__init__`` to ``cores``: where a rate's CPU goes, in cores; and how long the
    threads of the first three waited for a core meanwhile."""

    def __init__(self, node_pid: int, db_pid: int) -> None:
        self._pids = {"node": node_pid, "mariadb": db_pid, "client": os.getpid()}
        self._t0 = time.monotonic()
        self._cpu0 = {name: _cpu_s(pid) for name, pid in self._pids.items()}
        self._wait0 = {name: thread_waits_s(pid) for name, pid in self._pids.items()}
        self._busy0, self._all0 = _machine_busy_s()

    def cores(self, writer_cpu_s: float) -> dict[str, float | None]:
        wall = time.monotonic() - self._t0
        used = {name: _cpu_s(pid) - self._cpu0[name] for name, pid in self._pids.items()}
        used["writer"] = writer_cpu_s
        busy, total = _machine_busy_s()
        used["machine"] = busy - self._busy0
        out: dict[str, float | None] = {
            f"{name}_cores": round(cpu / wall, 2) for name, cpu in used.items()
        }
        out["others_cores"] = round(
            (used["machine"] - sum(v for k, v in used.items() if k != "machine")) / wall, 2
        )
        out["machine_busy_pct"] = round(100 * used["machine"] / max(total - self._all0, 1e-9), 1)
        for name, pid in self._pids.items():
            waited = waited_s(self._wait0[name], thread_waits_s(pid))
            out[f"{name}_cpu_wait"] = None if waited is None else round(waited / wall, 2)
        return out


def _create_small_table(ctx: Context, table: str) -> None:
    ctx.sandbox.primary.execute(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA}.{table} "
        "(id BIGINT PRIMARY KEY, sent_us BIGINT NOT NULL, note VARCHAR(16))"
    )


def latency(ctx: Context) -> dict[str, Any]:
    seconds = float(ctx.options.get("latency_seconds", 10.0))
    rates = []
    for stack in ctx.options.get("latency_stacks") or LATENCY_STACKS:
        rates += _latency_with(ctx, stack, seconds)
    return {
        "rates": rates,
        "seconds_per_rate": seconds,
        "stacks": "each rate on a node with node.http/node.loop httptools/uvloop (the default "
        "when installed), then h11/asyncio (before)",
        "writer": "one-row autocommit INSERTs from a process of its own, row stamped with the "
        "time before its commit; insert_*: stamp -> commit acknowledged, after_commit_*: "
        "acknowledged -> client; achieved_tps: what the writer reached",
        "consumer": f"SimpleConnector msgpack, get_without_ack({BATCH_SIZE}, 0.5 s); ack: "
        "on_get = the ack rides on the next get, separate = its own request (each rate in "
        "both, one after the other); its process freezes its startup objects out of the GC",
        "node_cpu": "node process CPU (user + system) from the first write of a rate to its "
        "last row at the client, per transaction written",
        "cores": "*_cores: CPU (user + system) over the same span / its wall time, of the "
        "node, MariaDB, the writer (its INSERT loop), this process (the client), the whole "
        "machine (/proc/stat, all cores) and others (machine minus those four: other "
        "jobs on the machine); machine_busy_pct of all cores; *_cpu_wait: thread-seconds "
        "the node's, MariaDB's and the client's threads spent runnable but waiting for a "
        "core (schedstat), per second of the same span (null without schedstat)",
        "gets_per_tx": "get requests the client made per transaction written (each one a "
        "request the node serves)",
    }


def _latency_with(ctx: Context, stack: dict[str, str], seconds: float) -> list[dict[str, Any]]:
    """Every rate and ack mode on a fresh node with the HTTP ``stack``."""
    connector = _require()
    _create_small_table(ctx, "lat")
    ctx.sandbox.primary.execute(f"TRUNCATE TABLE {SCHEMA}.lat")  # ids start at 1 again
    nodes = start_nodes(ctx, 1, f"latency-{stack['http']}", node=stack)
    arrivals = _Arrivals()
    try:
        wait_leader(nodes)
        with connector.SimpleConnector(nodes[0].url, DEST, "latency") as conn:
            conn.subscribe()
            gc.collect()
            gc.freeze()  # as the node does: full collections skip the startup objects
            consumer = threading.Thread(target=_consume, args=(conn, "lat", arrivals))
            consumer.start()
            try:
                rates = _latency_rates(ctx, arrivals, seconds, nodes[0].pid)
            finally:
                arrivals.stop.set()
                consumer.join(30)
    finally:
        stop_all(nodes)
    return [{**rate, "http": f"{stack['http']}/{stack['loop']}"} for rate in rates]


def _latency_rates(
    ctx: Context, arrivals: _Arrivals, seconds: float, node_pid: int
) -> list[dict[str, Any]]:
    """Each rate's latency, with the node's CPU time per transaction (reader, store, REST:
    what the machine's load does not change, unlike the latency) and the load average."""
    next_id = 1
    warm, _, _ = _write_paced(ctx, "lat", next_id, 100, 0.5, arrivals)  # warm-up, not counted
    _rate_stats(arrivals, range(next_id, next_id + warm), 100, 100)
    next_id += warm
    rates = []
    db_pid = ctx.sandbox.primary.process.pid or 0
    for tps in ctx.options.get("latency_rates") or LATENCY_RATES:
        for mode in ctx.options.get("latency_ack_modes") or LATENCY_ACK_MODES:
            arrivals.ack_on_get = mode == "on_get"
            cpu0, gets0 = _cpu_s(node_pid), arrivals.gets
            meter = _CpuMeter(node_pid, db_pid)
            n, achieved, writer_cpu = _write_paced(ctx, "lat", next_id, tps, seconds, arrivals)
            stats = _rate_stats(arrivals, range(next_id, next_id + n), tps, achieved)
            stats["ack"] = mode
            stats["node_cpu_us_per_tx"] = round((_cpu_s(node_pid) - cpu0) / n * 1e6, 1)
            stats.update(meter.cores(writer_cpu))
            stats["gets_per_tx"] = round((arrivals.gets - gets0) / n, 3)
            stats["loadavg_1m"] = round(os.getloadavg()[0], 2)
            if tps in LATENCY_GOAL_TPS:
                stats["goal_p99_ms"] = LATENCY_GOAL_P99_MS
            rates.append(stats)
            next_id += n
    return rates


# -- failover ----------------------------------------------------------------------------------


def _election(ctx: Context) -> dict[str, float]:
    """The election settings of the failover nodes (``--failover-ttl``/``-switch-delay``)."""
    ttl = float(ctx.options.get("failover_ttl_s", FAST_ELECTION["ttl_s"]))
    switch = float(ctx.options.get("failover_switch_delay_s", FAST_ELECTION["switch_delay_s"]))
    margin = 1.0 if ttl < 6 else 2.0
    return {**FAST_ELECTION, "ttl_s": ttl, "switch_delay_s": switch, "safety_margin_s": margin}


class _Trickle(threading.Thread):
    """Writes one-row transactions at a steady rate until stopped."""

    def __init__(self, ctx: Context, table: str, tps: float) -> None:
        super().__init__(name="bench-trickle", daemon=True)
        self.ctx, self.table, self.tps = ctx, table, tps
        self.halt = threading.Event()

    def run(self) -> None:
        with self.ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
            i = 0
            while not self.halt.wait(1 / self.tps):
                i += 1
                cur.execute(
                    f"INSERT INTO {SCHEMA}.{self.table} VALUES (%s, %s, 'f')",
                    (i, time.time_ns() // 1000),
                )


@dataclass
class _RunningWatch:
    """Times (monotonic) of the destination's running-key events, seen by etcd's watch."""

    events: list[tuple[float, str, int]] = field(default_factory=list)

    def __call__(self, event: Any) -> None:
        self.events.append((time.monotonic(), event.type.value, event.create_revision))

    def first(self, kind: str, after: float, epoch_above: int = 0) -> float | None:
        for t, k, rev in list(self.events):
            if t > after and k == kind and (kind == "delete" or rev > epoch_above):
                return t
        return None


def _one_failover(
    nodes: list[BenchNode], arrivals: _Arrivals, how: str, watch: _RunningWatch, jitter_s: float
) -> dict[str, Any]:
    """SIGKILL (``how="sigkill"``) or SIGSTOP the leader once, ``jitter_s`` after it
    serves; seconds from the signal to the first batch of a higher epoch, and when etcd
    saw the key go and the next leader."""
    leader = wait_leader(nodes)
    d = leader.destination()
    assert d is not None
    epoch = int(d["epoch"])
    wait_until(lambda: any(e >= epoch for _, e in arrivals.epochs[-5:]), "batches", 120)
    time.sleep(jitter_s)
    t0 = time.monotonic()
    if how == "sigkill":
        leader.kill()
    else:
        leader.process.pause()
    got: list[float] = []

    def new_epoch_batch() -> bool:
        if arrivals.error:
            raise arrivals.error[0]
        got[:] = [t for t, e in list(arrivals.epochs) if t > t0 and e > epoch][:1]
        return bool(got)

    wait_until(new_epoch_batch, "first batch from the new leader", 120, 0.01, 0.02)
    gone, elected = watch.first("delete", t0), watch.first("put", t0, epoch)
    if how == "sigkill":
        leader.restart()
    else:  # the zombie wakes up, finds its lease gone and steps down by itself
        leader.process.resume()
        wait_until(lambda: (leader.destination() or {}).get("role") == "standby",
                   "the zombie steps down", 120)  # fmt: skip
    return {
        "s": round(got[0] - t0, 3),
        "jitter_s": round(jitter_s, 3),
        "key_gone_s": None if gone is None else round(gone - t0, 3),
        "elected_s": None if elected is None else round(elected - t0, 3),
    }


def _summary(trials: list[dict[str, Any]], goal_median: float, goal_max: float) -> dict[str, Any]:
    times = [t["s"] for t in trials]
    phases = {}
    for name in ("key_gone_s", "elected_s"):
        known = [t[name] for t in trials if t[name] is not None]
        phases[f"median_{name}"] = statistics.median(known) if known else None
    after = [t["s"] - t["elected_s"] for t in trials if t["elected_s"] is not None]
    phases["median_elected_to_batch_s"] = round(statistics.median(after), 3) if after else None
    median, worst = statistics.median(times), max(times)
    return {
        "trials_s": times, "median_s": median, "max_s": worst, **phases, "trials": trials,
        "goal_median_s": goal_median, "goal_max_s": goal_max,
        "meets_goal": median <= goal_median and worst <= goal_max,
    }  # fmt: skip


def failover(ctx: Context) -> dict[str, Any]:
    connector = _require()
    from canal_cluster.etcd_coordinator import EtcdCoordinator
    from canal_cluster.keys import Keys

    trials = int(ctx.options.get("failover_trials", 20))
    rng = random.Random(18)  # the signal's jitter: the same draws in every run
    _create_small_table(ctx, "fo")
    ctx.sandbox.primary.execute(f"TRUNCATE TABLE {SCHEMA}.fo")
    election = _election(ctx)
    budget = election["ttl_s"] + election["switch_delay_s"]
    nodes = start_nodes(ctx, 2, "failover", election=election)
    arrivals, writer = _Arrivals(), _Trickle(ctx, "fo", 50.0)
    results: dict[str, list[dict[str, Any]]] = {"sigkill": [], "sigstop": []}
    coord = EtcdCoordinator(ctx.sandbox.etcd_endpoints, timeout_s=2.0)
    watch = _RunningWatch()
    watcher = coord.watch(Keys(nodes[0].prefix).running(DEST), watch)
    try:
        wait_leader(nodes)
        writer.start()
        conn = connector.ClusterConnector(DEST, "failover", etcd=ctx.sandbox.etcd_endpoints,
                                          prefix=nodes[0].prefix)  # fmt: skip
        with conn:
            conn.subscribe()
            consumer = threading.Thread(target=_consume, args=(conn, "fo", arrivals))
            consumer.start()
            try:
                for how in ("sigkill", "sigstop"):
                    for _ in range(trials):
                        jitter = rng.uniform(0.0, KILL_JITTER_S)
                        results[how].append(_one_failover(nodes, arrivals, how, watch, jitter))
            finally:
                arrivals.stop.set()
                consumer.join(30)
    finally:
        watcher.cancel()
        coord.close()
        writer.halt.set()
        writer.join(10)
        stop_all(nodes)
    kinds = {how: _summary(t, budget + 0.3, budget + 1.0) for how, t in results.items()}
    return {
        "kinds": kinds, "election": election, "nodes": 2, "writer_tps": 50,
        "trials_s": kinds["sigkill"]["trials_s"], "median_s": kinds["sigkill"]["median_s"],
        "max_s": kinds["sigkill"]["max_s"],
        "client": "ClusterConnector (etcd), get_without_ack(1000, 0.5 s) + ack",
        "measured": "signal to the leader -> first batch of a higher epoch at the client; "
        "SIGSTOP: past the TTL, the zombie resumed after; the signal after a random "
        f"0-{KILL_JITTER_S:g} s wait (jitter_s, seeded)",
    }  # fmt: skip


# -- node RSS ----------------------------------------------------------------------------------


def _wait_store_settled(node: BenchNode) -> None:
    """Until two samples of the store's entry count, 0.5 s apart, agree."""
    seen = [-1.0]

    def settled() -> bool:
        now = node.metric("canal_store_entries")
        same, seen[0] = now == seen[0], now
        return same

    wait_until(settled, "store settled", 120, interval_s=0.5, max_interval_s=0.5)


def node_rss(ctx: Context) -> dict[str, Any]:
    connector = _require()
    rows = int(ctx.options.get("rss_rows", 100_000))
    db = ctx.sandbox.primary
    db.execute(f"DROP TABLE IF EXISTS {SCHEMA}.rss", f"CREATE TABLE {SCHEMA}.rss ({COLUMNS})")
    memory = {"buffer_size": 10_000_000, "buffer_bytes": 8 * 2**30}
    nodes = start_nodes(ctx, 1, "rss", destination={"memory": memory})
    try:
        node = wait_leader(nodes)
        with connector.SimpleConnector(node.url, DEST, "rss") as conn:
            conn.subscribe()  # subscribed, never gets nor acks: everything stays buffered
            time.sleep(1.0)  # let the idle node settle before the baseline sample
            before = node.rss()
            for first in range(1, rows + 1, TX_ROWS):
                db.execute(
                    f"INSERT INTO {SCHEMA}.rss {row_select(first, min(rows, first + TX_ROWS - 1))}"
                )
            wait_until(lambda: node.metric("canal_rows_total") >= rows, f"{rows} rows parsed", 600)
            _wait_store_settled(node)
            store_bytes = node.metric("canal_store_bytes")
            entries = node.metric("canal_store_entries")
            after = node.rss()
    finally:
        stop_all(nodes)
    return {
        "rows": rows, "rss_before_bytes": before, "rss_after_bytes": after,
        "bytes_per_row": (after - before) / rows, "store_entries": int(entries),
        "store_bytes": int(store_bytes), "store_bytes_per_row": store_bytes / rows,
        "memory": memory, "table": f"{SCHEMA}.rss (same columns as the binlog tables)",
    }  # fmt: skip
