"""The Delta mirror's cost per micro-batch as the table grows, beside the parquet mirror's.

For each size N (``--delta-sizes``): a table ``bench_delta_N.t`` (id INT PRIMARY KEY,
qty, price DECIMAL(12,2), note VARCHAR, created DATETIME(6)) filled with N rows without
the binlog (``sql_log_bin = 0``), and both mirrors' starting state written straight from
the same rows (as an initial load or a snapshot would leave them): a Delta table
(``canal_client.spark.delta``'s layout: 32 MiB files) and the parquet mirror's first version
(``examples/spark_mirror.py``). Then ``--delta-batches`` rounds of ``--delta-changes``
row changes go through the binlog: half updates, a quarter inserts of new ids, a
quarter deletes, the updates and deletes among the 100,000 newest rows (an OLTP table's
hot end; changes spread evenly over a table touch every file of it, see docs/spark.md).
A node per table and mirror reads them; ``benchmarks/delta_job.py`` (its own SparkSession)
runs a typed stream of each table twice, available-now with ``maxRowsPerTrigger`` = the changes per
round: into ``DeltaMirror`` and into the parquet ``Mirror``. The figure is each
micro-batch's ``addBatch`` time (the ``foreachBatch`` call: the sink's whole work); the
first micro-batch of each query also starts Python workers and is reported apart. At the
end each mirror is checked against the table: row count and sum of ``qty``.
``CANAL_BENCH_DELTA_LOG=FILE`` keeps the job's output.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.bench_cluster import DEST, start_nodes, stop_all, wait_leader
from benchmarks.bench_common import REPO, Context

__all__ = ["COLUMNS", "HOT", "delta_mirror", "initial_rows"]

JOB = REPO / "benchmarks" / "delta_job.py"
TIMEOUT_S = 7200.0
COLUMNS = "id INT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(12,2), note VARCHAR(40)," \
    " created DATETIME(6)"  # fmt: skip
HOT = 100_000  # updates and deletes fall among this many newest ids
CHUNK = 1_000_000  # rows per INSERT ... SELECT of the prefill
BASE = datetime(2024, 1, 1)


def initial_rows(first: int, last: int) -> Any:
    """Rows ``first..last`` as the prefill's SQL makes them, as an Arrow table."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = np.arange(first, last + 1, dtype=np.int64)
    base = int((BASE - datetime(1970, 1, 1)) / timedelta(microseconds=1))
    return pa.table({
        "id": pa.array(ids.astype(np.int32)),
        "qty": pa.array((ids % 97).astype(np.int32)),
        "price": pa.array((ids % 1000) + 0.5).cast(pa.decimal128(12, 2)),
        "note": pc.binary_join_element_wise("n", pa.array(ids).cast(pa.string()), ""),
        "created": pa.array(base + ids * 1_000_001).cast(pa.timestamp("us")),
    })  # fmt: skip


def _prefill(ctx: Context, db: str, rows: int) -> None:
    with ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")  # the mirrors get them straight
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        cur.execute(f"CREATE DATABASE {db}")
        cur.execute(f"CREATE TABLE {db}.t ({COLUMNS})")
        for lo in range(1, rows + 1, CHUNK):
            hi = min(rows, lo + CHUNK - 1)
            cur.execute(
                f"INSERT INTO {db}.t SELECT seq, seq % 97, seq % 1000 + 0.5,"
                f" CONCAT('n', seq), TIMESTAMPADD(MICROSECOND, seq * 1000001, '{BASE}')"
                f" FROM {db}.seq_{lo}_to_{hi}"
            )
            conn.commit()


def _initial_mirrors(work: Path, table: str, rows: int) -> None:
    """Both mirrors' state before the first change: the table's N rows."""
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from canal_client.spark.delta import TARGET_FILE_SIZE

    delta, parquet = work / "delta" / table, work / "parquet" / table / "v=-1"
    parquet.mkdir(parents=True)
    writer = None
    for lo in range(1, rows + 1, CHUNK):
        part = initial_rows(lo, min(rows, lo + CHUNK - 1))
        write_deltalake(
            str(delta), part, mode="append",
            configuration={"delta.targetFileSize": str(TARGET_FILE_SIZE)},
        )  # fmt: skip
        if writer is None:
            writer = pq.ParquetWriter(str(parquet / "part-0.parquet"), part.schema)
        writer.write_table(part)
    assert writer is not None
    writer.close()
    (work / "parquet" / table / "_current").write_text("v=-1\n")


def _changes(ctx: Context, db: str, rows: int, rounds: int, per_round: int, seed: int) -> None:
    """``rounds`` × ``per_round`` row changes in statements of up to 1,000 rows."""
    rnd = random.Random(seed)
    live = list(range(max(1, rows - HOT + 1), rows + 1))
    next_id = rows + 1
    with ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
        for _ in range(rounds):
            updates, inserts = per_round // 2, per_round // 4
            deletes = per_round - updates - inserts
            rnd.shuffle(live)
            changed, gone, live = live[:updates], live[updates : updates + deletes], live[
                updates + deletes :
            ]  # fmt: skip
            new = list(range(next_id, next_id + inserts))
            next_id += inserts
            for i in range(0, len(changed), 1000):
                ids = ",".join(map(str, changed[i : i + 1000]))
                cur.execute(f"UPDATE {db}.t SET qty = qty + 1, note = 'u' WHERE id IN ({ids})")
            for i in range(0, len(gone), 1000):
                cur.execute(
                    f"DELETE FROM {db}.t WHERE id IN ({','.join(map(str, gone[i : i + 1000]))})"
                )
            for i in range(0, len(new), 1000):
                values = ",".join(
                    f"({j}, {j % 97}, {j % 1000}.5, 'new', '2025-01-01 00:00:00.{j % 1000000:06d}')"
                    for j in new[i : i + 1000]
                )
                cur.execute(f"INSERT INTO {db}.t VALUES {values}")
            conn.commit()
            live = changed + live + new


def _totals(ctx: Context, db: str) -> dict[str, int]:
    with ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*), COALESCE(SUM(qty), 0) FROM {db}.t")
        count, qty = cur.fetchone()
    return {"rows": int(count), "sum_qty": int(qty)}


def delta_mirror(ctx: Context) -> dict[str, Any]:
    opts = ctx.options
    sizes = [int(s) for s in str(opts.get("delta_sizes", "100000,1000000,10000000")).split(",")]
    per_round = int(opts.get("delta_changes", 10_000))
    rounds = int(opts.get("delta_batches", 3))
    work = ctx.workdir / "delta-mirror"
    tables: list[dict[str, Any]] = []
    prepare_s: dict[str, float] = {}
    with ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        journal, position = cur.fetchone()[:2]
    for n, rows in enumerate(sizes):
        db, t0 = f"bench_delta_{rows}", time.monotonic()
        _prefill(ctx, db, rows)
        _initial_mirrors(work, f"{db}.t", rows)
        prepare_s[str(rows)] = round(time.monotonic() - t0, 1)
        _changes(ctx, db, rows, rounds, per_round, seed=n)
        tables.append({"table": f"{db}.t", "rows": rows, "expect": _totals(ctx, db)})
    master = {"journal_name": journal, "position": int(position)}
    # a node for each table and mirror: a client id that subscribes after another one
    # acked starts at what the destination still holds
    nodes = []
    try:
        for spec in tables:
            for kind in ("delta", "parquet"):
                dest = {"master": master, "filter": {"regex": spec["table"].replace(".", "\\.")}}
                node = start_nodes(ctx, 1, f"{kind}-{spec['rows']}", destination=dest)[0]
                nodes.append(node)
                spec[f"{kind}_server"] = node.url
        spec_file = work / "tables.json"
        spec_file.write_text(json.dumps(tables))
        argv = [
            sys.executable, str(JOB), "--destination", DEST, "--workdir", str(work),
            "--tables", str(spec_file), "--changes", str(per_round),
        ]  # fmt: skip
        for node in nodes:
            wait_leader([node])
        result = _run(argv, Path(os.environ.get("CANAL_BENCH_DELTA_LOG", work / "job.log")))
    finally:
        stop_all(nodes)
    return {
        "changes_per_batch": per_round, "rounds": rounds, "hot_rows": HOT,
        "sizes": result["sizes"], "prepare_s": prepare_s,
        "session_start_s": result["session_start_s"],
        "command": " ".join(argv[1:]).replace(str(ctx.workdir), "$WORK"),
        "includes": "addBatch of each micro-batch (the foreachBatch call); the first "
        "micro-batch of each query apart (Python workers start)",
    }  # fmt: skip


def _run(argv: list[str], log: Path) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = job.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        job.kill()
        job.communicate()
        raise RuntimeError(f"delta_job.py did not finish within {TIMEOUT_S:g} s") from exc
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(stdout + stderr)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if job.returncode != 0 or not lines:
        errors = [line for line in stderr.splitlines() if " WARN " not in line]
        tail = "\n".join(errors)[-1500:]
        raise RuntimeError(f"delta_job.py exit {job.returncode} (log {log}): {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
