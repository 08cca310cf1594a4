"""Spark into parquet, beside Spark's own anchors in the same SparkSession.

One node reads the generated binlog from its start (its store holds two micro-batches:
``STORE``); ``benchmarks/spark_job.py`` runs as
a subprocess (its own SparkSession, ``local[2]``): a warm-up (both anchors over ``range``
rows, not timed), the ``canal`` source in map mode over every table, a typed stream of
one table, then the two anchors with the same number of rows of the same shape: Spark's
JVM ``range`` → parquet, and a Python data source yielding the rows the canal run wrote,
from memory, as Arrow record batches of the canal run's ``rowsPerPartition``. The canal
runs are available-now streams: ``rows_per_s`` is their steady state (the micro-batches
after the first, from the end of the first to the end of the last); ``first_batch_s``
is from the query's start to the end of its first micro-batch (the SparkSession was
already up: ``session_start_s``). The parquet output is counted with pyarrow.
``CANAL_BENCH_SPARK_B=key=value,...`` (e.g. ``prefetch=false``) adds an A/B: the same
map-mode run with those options, right after the first, on a node of its own (``b``).
``cpu_us_per_row``: microseconds of CPU per row of each process class (``proc_cpu``:
node, JVM, source runner, executors, driver) over each run's timed window (a stream's
steady state, an anchor's write); ``CANAL_BENCH_SPARK_PIDS=1`` adds every process of the
canal run and of the Python anchor (``canal_pids``, ``python_arrow_pids``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench_cluster import DEST, start_nodes, stop_all, wait_leader
from benchmarks.bench_common import REPO, Context
from benchmarks.proc_cpu import CpuSampler

__all__ = ["OPTIONS", "spark_parquet"]

JOB = REPO / "benchmarks" / "spark_job.py"
SPARK_TIMEOUT_S = 1800.0
# the source's defaults (batchSize 1000, maxBatchesPerTrigger 100, maxRowsPerTrigger
# 500000, rowsPerPartition 250000): what a user gets. A steady state of several
# micro-batches of that size wants `--rows 2000000` (the README's figures).
OPTIONS: tuple[str, ...] = ()
# the nodes' store holds two micro-batches of those defaults (~120 bytes a row in the
# store): the source prefetches the next one while the executors run the current one
# (README "Prefetch and the leader's store"); the default 64 MiB holds ~1.1
STORE: dict[str, int] = {"buffer_bytes": 256 * 1024 * 1024, "buffer_size": 65_536}


def _count_parquet_rows(path: str) -> int:
    import pyarrow.dataset as pads

    return int(pads.dataset(path, format="parquet").count_rows())


def _run_job(argv: list[str], log: Path, sampler: CpuSampler) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    job = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )  # fmt: skip
    sampler.add_root(job.pid)
    try:
        stdout, stderr = job.communicate(timeout=SPARK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        job.kill()
        job.communicate()
        raise RuntimeError(f"spark_job.py did not finish within {SPARK_TIMEOUT_S:g} s") from exc
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(stdout + stderr)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if job.returncode != 0 or not lines:
        tail = (stdout + stderr)[-1500:]
        raise RuntimeError(f"spark_job.py exit {job.returncode} (log {log}): {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cpu_us_per_row(sampler: CpuSampler, run: dict[str, Any], rows: int) -> dict[str, Any]:
    """Microseconds of CPU per row of each process class over a run's timed window
    (``steady_from``/``steady_to`` of a stream, ``from``/``to`` of an anchor)."""
    t0, t1 = run.get("steady_from", run.get("from")), run.get("steady_to", run.get("to"))
    if t0 is None or t1 is None or rows <= 0:
        return {}
    used = sampler.cpu_between(float(t0), float(t1))
    out: dict[str, Any] = {k: round(v * 1e6 / rows, 2) for k, v in sorted(used.items())}
    out["total"] = round(sum(used.values()) * 1e6 / rows, 2)
    out["wall_us"] = round((float(t1) - float(t0)) * 1e6 / rows, 2)
    return out


def _b_run(b: dict[str, Any], options: list[str], jvm_rows_per_s: float) -> dict[str, Any]:
    """The B run of an A/B (``CANAL_BENCH_SPARK_B``): its options, rate and micro-batches."""
    keep = ("rows", "rows_per_s", "steady_s", "first_batch_s", "micro_batches", "batches")
    return {
        "options": options, **{k: b[k] for k in keep},
        "vs_jvm_range": round(b["rows_per_s"] / jvm_rows_per_s, 3),
    }  # fmt: skip


def spark_parquet(ctx: Context) -> dict[str, Any]:
    ds = ctx.dataset
    master = {"journal_name": ds.journal, "position": ds.offset}
    destination: dict[str, Any] = {"master": master, "memory": STORE}
    nodes = start_nodes(ctx, 1, "spark", destination=destination)
    # the typed run reads from its own node: the map run's acks free the first one's store
    nodes += start_nodes(ctx, 1, "spark-typed", destination=destination)
    b_options = [o for o in os.environ.get("CANAL_BENCH_SPARK_B", "").split(",") if o]
    if b_options:
        nodes += start_nodes(ctx, 1, "spark-b", destination=destination)
    work = ctx.workdir / "spark"
    table = ds.tables[0]
    argv = [
        sys.executable, str(JOB), "--server", nodes[0].url, "--typed-server", nodes[1].url,
        "--destination", DEST, "--workdir", str(work), "--table", table,
        "--warm-up-rows", str(ds.rows),
        *(arg for opt in OPTIONS for arg in ("--option", opt)),
    ]  # fmt: skip
    if b_options:
        argv += ["--b-server", nodes[2].url, *(a for o in b_options for a in ("--b-option", o))]
    sampler = CpuSampler([n.pid for n in nodes], [n.pid for n in nodes])
    try:
        for node in nodes:
            wait_leader([node])
        sampler.start()
        log = Path(os.environ.get("CANAL_BENCH_SPARK_LOG", work / "job.log"))
        result = _run_job(argv, log, sampler)
    finally:
        sampler.stop()
        stop_all(nodes)
    canal, typed = result["canal"], result["canal_typed"]
    rows = _count_parquet_rows(canal["output"])
    if rows != ds.rows or canal["rows"] != ds.rows:
        raise RuntimeError(f"parquet holds {rows} rows, the binlog has {ds.rows}")
    typed_rows = _count_parquet_rows(typed["output"])
    if typed_rows != typed["rows"]:
        raise RuntimeError(f"typed parquet holds {typed_rows} rows, not {typed['rows']}")
    jvm, arrow, arrow_typed = (
        result["jvm_range"],
        result["python_arrow"],
        result["python_arrow_typed"],
    )
    b = result.get("canal_b")
    cpu: dict[str, Any] = {
        "canal": _cpu_us_per_row(sampler, canal, canal["steady_rows"]),
        "canal_typed": _cpu_us_per_row(sampler, typed, typed["steady_rows"]),
        "jvm_range": _cpu_us_per_row(sampler, jvm, jvm["rows"]),
        "python_arrow": _cpu_us_per_row(sampler, arrow, arrow["rows"]),
        **({"canal_b": _cpu_us_per_row(sampler, b, b["steady_rows"])} if b else {}),
    }
    if os.environ.get("CANAL_BENCH_SPARK_PIDS"):  # every process's CPU over the canal run
        cpu["canal_pids"] = sampler.per_pid(canal["steady_from"], canal["steady_to"])
        cpu["python_arrow_pids"] = sampler.per_pid(arrow["from"], arrow["to"])
    return {
        "cpu_us_per_row": cpu,
        **({"b": _b_run(b, b_options, jvm["rows_per_s"])} if b else {}),
        "rows": rows, "rows_per_s": canal["rows_per_s"], "seconds": canal["steady_s"],
        "first_batch_s": canal["first_batch_s"], "micro_batches": canal["micro_batches"],
        "rows_per_micro_batch": canal["rows_per_micro_batch"],
        "batches_rows_per_s": canal["batches_rows_per_s"],
        "warm_up_s": result["warm_up"]["seconds"],
        "session_start_s": result["session_start_s"], "batches": canal["batches"],
        "typed": {
            "table": table, **typed, "python_arrow": arrow_typed,
            "vs_python_arrow": round(typed["rows_per_s"] / arrow_typed["rows_per_s"], 3),
        },
        "anchors": {"jvm_range": jvm, "python_arrow": arrow},
        "vs_jvm_range": round(canal["rows_per_s"] / jvm["rows_per_s"], 3),
        "vs_python_arrow": round(canal["rows_per_s"] / arrow["rows_per_s"], 3),
        "command": " ".join(argv[1:]).replace(str(ctx.workdir), "$WORK"),
        "node_store": STORE,
        "includes": "steady state: micro-batches after the first (see first_batch_s)",
    }  # fmt: skip
