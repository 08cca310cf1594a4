"""The incremental snapshot part: one generated table of ``--snapshot-rows`` rows (1M by
default, the binlog tables' shape), three readers of it in the same run:

* ``mariadb-dump --quick --single-transaction`` to /dev/null (the C tool, the limit);
* a plain pymysql keyset-chunk loop (``WHERE id > last ORDER BY id LIMIT 10000``);
* canal-ha end to end: a fresh node, ``POST /v1/destinations/{d}/snapshots``, the READ
  entries through REST msgpack to a ``SimpleConnector`` that reads every value and acks
  each batch; the clock runs from the POST to the ack of the last row; the leader's RSS
  before and its maximum (sampled every 50 batches) are recorded.

Each is run ``--repeat`` times (median); the record has the three rates and the ratios
of the end to end to the other two.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.bench_cluster import DEST, start_nodes, stop_all, wait_leader
from benchmarks.bench_common import Context, Unavailable
from benchmarks.bench_data import COLUMNS, SCHEMA
from benchmarks.bench_node import BATCH_SIZE, _require
from benchmarks.e2e_consumer import touch as _touch

__all__ = ["TABLE", "make_table", "snapshot", "snapshot_rss"]

TABLE = "snap"
CHUNK = 10_000
TIMEOUT_S = 1800.0


def make_table(ctx: Context, rows: int) -> float:
    """``bench.snap`` with ``rows`` rows (made once per sandbox); seconds it took."""
    primary = ctx.sandbox.primary
    have = primary.scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES "
        f"WHERE TABLE_SCHEMA = '{SCHEMA}' AND TABLE_NAME = '{TABLE}'"
    )
    if have and int(primary.scalar(f"SELECT COUNT(*) FROM {SCHEMA}.{TABLE}")) == rows:
        return 0.0
    t0 = time.perf_counter()
    primary.execute(
        f"CREATE DATABASE IF NOT EXISTS {SCHEMA}",
        f"DROP TABLE IF EXISTS {SCHEMA}.{TABLE}",
        f"CREATE TABLE {SCHEMA}.{TABLE} ({COLUMNS})",
    )
    step = 100_000
    for first in range(1, rows + 1, step):
        last = min(rows, first + step - 1)
        primary.execute(
            f"INSERT INTO {SCHEMA}.{TABLE} SELECT seq, seq % 1000, seq * 1000003, seq / 100, "
            f"CONCAT('name-', seq, '-', REPEAT('x', seq % 20)), TIMESTAMP'2024-01-01 00:00:00'"
            f" + INTERVAL seq SECOND + INTERVAL seq % 1000000 MICROSECOND, UNHEX(SHA2(seq, 256))"
            f" FROM {SCHEMA}.seq_{first}_to_{last}"
        )
    return time.perf_counter() - t0


def _median(ctx: Context, once: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The median run's record (``rows_per_s`` the median of all) with every rate."""
    runs = [once() for _ in range(ctx.repeat)]
    rates = [r["rows_per_s"] for r in runs]
    middle = sorted(runs, key=lambda r: float(r["rows_per_s"]))[(len(runs) - 1) // 2]
    return {**middle, "rows_per_s": statistics.median(rates), "runs": rates}


def _dump_once(ctx: Context, rows: int) -> dict[str, Any]:
    binary = shutil.which("mariadb-dump") or shutil.which("mysqldump")
    if binary is None:
        raise Unavailable("mariadb-dump is not installed")
    dsn = ctx.sandbox.primary.dsn()
    t0 = time.perf_counter()
    subprocess.run(
        [binary, "--host=127.0.0.1", f"--port={dsn['port']}", f"--user={dsn['user']}",
         f"--password={dsn['password']}", "--quick", "--single-transaction", SCHEMA, TABLE],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    return {"rows": rows, "seconds": round(elapsed, 3), "rows_per_s": rows / elapsed}


def _pymysql_once(ctx: Context) -> dict[str, Any]:
    import pymysql

    dsn = ctx.sandbox.primary.dsn()
    conn = pymysql.connect(
        host=dsn["host"], port=dsn["port"], user=dsn["user"], password=dsn["password"]
    )
    t0 = time.perf_counter()
    n, last = 0, 0
    with conn, conn.cursor() as cur:
        while True:
            cur.execute(
                f"SELECT * FROM {SCHEMA}.{TABLE} WHERE id > %s ORDER BY id LIMIT {CHUNK}", (last,)
            )
            rows = cur.fetchall()
            if not rows:
                break
            n += len(rows)
            last = rows[-1][0]
    elapsed = time.perf_counter() - t0
    return {"rows": n, "seconds": round(elapsed, 3), "rows_per_s": n / elapsed}


def _e2e_once(ctx: Context, rows: int, run: int) -> dict[str, Any]:
    connector = _require()
    nodes = start_nodes(ctx, 1, f"snapshot-{run}")
    try:
        leader = wait_leader(nodes)
        with connector.SimpleConnector(leader.url, DEST, f"snap-{run}", wire="msgpack") as conn:
            conn.subscribe()
            t0 = time.perf_counter()
            r = httpx.post(
                f"{leader.url}/v1/destinations/{DEST}/snapshots",
                json={"tables": [f"{SCHEMA}\\.{TABLE}"], "chunk_rows": CHUNK}, timeout=60,
            )  # fmt: skip
            r.raise_for_status()
            got = batches = 0
            rss_before = rss_max = leader.rss()
            samples: list[tuple[int, int]] = []
            while got < rows:
                if time.perf_counter() - t0 > TIMEOUT_S:
                    raise TimeoutError(f"{got} of {rows} rows after {TIMEOUT_S}s")
                batch = conn.get_without_ack(BATCH_SIZE, 1.0)
                if batch.is_empty:
                    continue
                _touch(batch)
                got += sum(e.row_count for e in batch.entries if e.header.table == TABLE)
                batches += 1
                conn.ack(batch.id)
                if batches % 50 == 0:
                    rss = leader.rss()
                    rss_max = max(rss_max, rss)
                    samples.append((got, rss))
            elapsed = time.perf_counter() - t0
    finally:
        stop_all(nodes)
    return {
        "rows": got, "seconds": round(elapsed, 3), "rows_per_s": got / elapsed,
        "batches": batches, "chunk_rows": CHUNK, "batch_size_entries": BATCH_SIZE,
        "node_rss_before_bytes": rss_before, "node_rss_max_bytes": rss_max,
        "node_rss_samples": samples,
    }  # fmt: skip


def snapshot(ctx: Context) -> dict[str, Any]:
    rows = int(ctx.options.get("snapshot_rows", 1_000_000))
    load_s = make_table(ctx, rows)
    dump = _median(ctx, lambda: _dump_once(ctx, rows))
    loop = _median(ctx, lambda: _pymysql_once(ctx))
    runs = iter(range(ctx.repeat))
    e2e = _median(ctx, lambda: _e2e_once(ctx, rows, next(runs)))
    if e2e["rows"] != rows:
        raise RuntimeError(f"the client got {e2e['rows']} READ rows, the table has {rows}")
    return {
        **e2e,
        "table_rows": rows, "table_load_s": round(load_s, 1),
        "mariadb_dump_rows_per_s": dump["rows_per_s"], "mariadb_dump_runs": dump["runs"],
        "pymysql_loop_rows_per_s": loop["rows_per_s"], "pymysql_loop_runs": loop["runs"],
        "vs_mariadb_dump": round(e2e["rows_per_s"] / dump["rows_per_s"], 3),
        "vs_pymysql_loop": round(e2e["rows_per_s"] / loop["rows_per_s"], 3),
        "path": "POST snapshots -> leader node -> REST msgpack -> SimpleConnector, "
        "every value read, each batch acked",
    }  # fmt: skip


def snapshot_rss(ctx: Context) -> dict[str, Any]:
    """One snapshot of a ``--snapshot-rss-rows`` table (10M by default), end to end as in
    ``snapshot``: the node's RSS sampled every 50 batches. Bounded means the second half
    of the rows needs no more memory than the first half."""
    rows = int(ctx.options.get("snapshot_rss_rows", 10_000_000))
    load_s = make_table(ctx, rows)
    run = _e2e_once(ctx, rows, 0)
    if run["rows"] != rows:
        raise RuntimeError(f"the client got {run['rows']} READ rows, the table has {rows}")
    samples = run.pop("node_rss_samples")
    first = [rss for got, rss in samples if got <= rows // 2] or [run["node_rss_before_bytes"]]
    second = [rss for got, rss in samples if got > rows // 2] or [run["node_rss_max_bytes"]]
    return {
        **run,
        "table_rows": rows, "table_load_s": round(load_s, 1),
        "node_rss_first_half_max_bytes": max(first),
        "node_rss_second_half_max_bytes": max(second),
        "node_rss_by_rows": [[got, rss] for got, rss in samples],
    }  # fmt: skip
