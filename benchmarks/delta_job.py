"""The Spark side of the ``delta_mirror`` benchmark part (``benchmarks/bench_delta.py``),
in its own process: one SparkSession (local[2]); for each table of ``--tables`` (a JSON
list of {table, rows, expect}) two available-now typed streams with ``maxRowsPerTrigger``
= ``--changes`` (each from its own node):
into ``canal_client.spark.delta.DeltaMirror`` (``<workdir>/delta``) and into
the parquet ``Mirror`` of ``examples/spark_mirror.py`` (``<workdir>/parquet``), whose
starting states the part wrote. Per micro-batch: rows, ``addBatch`` ms (the
``foreachBatch`` call) and the batch's whole duration. At the end each mirror's row count
and sum of ``qty`` are checked against ``expect``. Prints one JSON object (last line).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from canal_client.spark import local_session
from canal_client.spark.delta import DeltaMirror

WORKER_START = "Python worker failed to connect back"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "spark_mirror.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--destination", required=True)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument(
        "--tables", required=True, type=Path,
        help="JSON: [{table, rows, expect, delta_server, parquet_server}]",
    )  # fmt: skip
    p.add_argument("--changes", required=True, type=int, help="maxRowsPerTrigger")
    p.add_argument("--master", default="local[2]")
    return p.parse_args(argv)


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("spark_mirror", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(
    spark: SparkSession, args: argparse.Namespace, spec: dict[str, Any], kind: str, sink: Any
) -> dict[str, Any]:
    """One available-now typed query of ``spec``'s table into ``sink``: its micro-batches."""
    table = spec["table"]
    opts = {
        "server": spec[f"{kind}_server"], "destination": args.destination,
        "clientId": f"bench-{kind}-{table}", "table": table,
        "maxRowsPerTrigger": str(args.changes), "pollTimeoutMs": "2000",
    }  # fmt: skip
    ckpt = args.workdir / "ckpt" / kind / table
    restarts = 0
    while True:
        query = (
            spark.readStream.format("canal").options(**opts).load().writeStream
            .foreachBatch(sink).option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        with contextlib.suppress(Exception):  # query.exception() says what
            query.awaitTermination()
        failure = query.exception()
        # a source runner that missed Spark's fixed 10 s to connect back (a busy machine):
        # nothing of the query ran; start it again from its checkpoint
        if failure is not None and WORKER_START in str(failure) and restarts < 3:
            restarts += 1
            continue
        if failure is not None:
            raise SystemExit(f"{kind} {table}: {failure}")
        break
    batches = [
        {"rows": int(p["numInputRows"]), "add_batch_ms": int(p["durationMs"].get("addBatch", 0)),
         "batch_ms": int(p["batchDuration"])}
        for p in query.recentProgress if p["numInputRows"] > 0
    ]  # fmt: skip
    if not batches:
        raise SystemExit(f"{kind} {table}: no micro-batch with rows")
    later = [b["add_batch_ms"] for b in batches[1:]] or [b["add_batch_ms"] for b in batches]
    return {
        "micro_batches": len(batches), "rows": sum(b["rows"] for b in batches),
        "median_add_batch_ms": statistics.median(later), "batches": batches,
        "restarts": restarts,
    }  # fmt: skip


def _check(name: str, got: dict[str, int], want: dict[str, int]) -> None:
    if got != want:
        raise SystemExit(f"{name}: the mirror holds {got}, the table {want}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    spark = local_session(args.master, "canal-bench-delta")
    session_s = time.time() - t0
    example = _example()
    out: list[dict[str, Any]] = []
    for spec in json.loads(args.tables.read_text()):
        table, want = spec["table"], spec["expect"]
        delta_root, parquet_root = args.workdir / "delta", args.workdir / "parquet"
        sink = DeltaMirror(delta_root, tables=[table], keys=["id"])
        delta = run(spark, args, spec, "delta", sink)
        dt = DeltaTable(str(delta_root / table))
        rows = dt.to_pyarrow_dataset().to_table(columns=["qty"])
        _check(f"delta {table}", {"rows": rows.num_rows,
               "sum_qty": int(rows.column("qty").to_numpy().sum())}, want)  # fmt: skip
        delta["files"] = len(dt.file_uris())
        mirror = example.Mirror(spark, str(parquet_root), table, ["id"])
        parquet = run(spark, args, spec, "parquet", mirror)
        state = example.read_mirror(spark, str(parquet_root), table)
        total = state.selectExpr("count(*) AS n", "coalesce(sum(qty), 0) AS q").first()
        _check(f"parquet {table}", {"rows": int(total["n"]), "sum_qty": int(total["q"])}, want)
        out.append({"table": table, "rows": spec["rows"], "delta": delta, "parquet": parquet})
    spark.stop()
    print(json.dumps({"session_start_s": round(session_s, 3), "sizes": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
