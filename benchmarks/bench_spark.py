"""Spark end to end into parquet: ``examples/spark_to_parquet.py`` against a real node.

One node reads the generated binlog from its start; the example runs once
(``--trigger available-now``) as a subprocess and the rows in its parquet output are
counted with pyarrow. The example prints ``batch N: R rows`` as each micro-batch
completes; the clock runs from the leader being ready to the last such line (before
the example's own summary), so it includes the SparkSession start (~8-10 s here):
``first_batch_s`` says how long it took until the first micro-batch was done.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_cluster import DEST, start_nodes, stop_all, wait_leader
from benchmarks.bench_common import REPO, Context, NotYet

__all__ = ["spark_parquet"]

EXAMPLE = REPO / "examples" / "spark_to_parquet.py"
SPARK_TIMEOUT_S = 3600.0
BATCH_LINE = re.compile(r"^batch (\d+): (\d+) rows")


def _example(ctx: Context) -> Path:
    return Path(ctx.options.get("spark_example") or EXAMPLE)


def _argv(ctx: Context, url: str) -> list[str]:
    work = ctx.workdir / "spark"
    return [
        sys.executable, str(_example(ctx)), "--server", url, "--destination", DEST,
        "--client-id", "spark", "--output", str(work / "out"),
        "--checkpoint", str(work / "checkpoint"), "--trigger", "available-now",
    ]  # fmt: skip


def _count_parquet_rows(path: str) -> int:
    import pyarrow.dataset as pads

    return int(pads.dataset(path, format="parquet", partitioning="hive").count_rows())


def _run_example(argv: list[str], t0: float) -> tuple[list[tuple[float, int]], str, int]:
    """Run the example; (time since t0, rows) per batch line, its output, exit code."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    timer = threading.Timer(SPARK_TIMEOUT_S, proc.kill)
    timer.start()
    batches: list[tuple[float, int]] = []
    lines: list[str] = []
    try:
        for line in proc.stdout:
            m = BATCH_LINE.match(line)
            if m:
                batches.append((time.perf_counter() - t0, int(m.group(2))))
            lines.append(line)
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return batches, "".join(lines[-40:]), code


def spark_parquet(ctx: Context) -> dict[str, Any]:
    example = _example(ctx)
    if not example.exists():
        shown = example.relative_to(REPO) if example.is_relative_to(REPO) else example
        raise NotYet(f"{shown} does not exist yet")
    ds = ctx.dataset
    master = {"journal_name": ds.journal, "position": ds.offset}
    nodes = start_nodes(ctx, 1, "spark", destination={"master": master})
    try:
        wait_leader(nodes)
        argv = _argv(ctx, nodes[0].url)
        t0 = time.perf_counter()
        batches, output, code = _run_example(argv, t0)
        total = time.perf_counter() - t0
    finally:
        stop_all(nodes)
    if code != 0 or not batches:
        raise RuntimeError(f"{example.name} exit {code}, {len(batches)} batches: {output[-600:]}")
    rows = _count_parquet_rows(argv[argv.index("--output") + 1])
    if rows != ds.rows:
        raise RuntimeError(f"parquet holds {rows} rows, the binlog has {ds.rows}")
    elapsed = batches[-1][0]
    return {
        "rows": rows, "seconds": round(elapsed, 3), "rows_per_s": rows / elapsed,
        "micro_batches": len(batches), "first_batch_s": round(batches[0][0], 3),
        "rows_in_batches": sum(n for _, n in batches), "process_s": round(total, 3),
        "command": " ".join(argv[1:]).replace(str(ctx.workdir), "$WORK"),
        "includes": "SparkSession start-up (clock: leader ready -> last micro-batch)",
    }  # fmt: skip
