"""Exactly once into parquet through a leader SIGKILL and a driver SIGKILL + restart.

Real nodes (node_fixtures) read the sandbox primary; the Spark query is
``examples/spark_to_parquet.py`` in its own process group, so the driver (Python, JVM and
Python workers) can be SIGKILLed. The parquet rows the file sink committed
(``_spark_metadata``) must equal the 20,000 row changes written, plus the CREATE TABLE.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from node_fixtures import DEST, db_destination, node_cluster, wait_leader  # noqa: F401  (fixture)

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

log_ = logging.getLogger("test_spark_e2e")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "spark_to_parquet.py"
TX_ROWS = 100


class Driver:
    """The example job in its own process group (SIGKILL takes the JVM and workers too)."""

    def __init__(self, args: list[str], log: Path, script: Path = EXAMPLE) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        env["PYSPARK_PYTHON"] = sys.executable
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the job did not finish:\n{self.log.read_text()[-3000:]}"
            ) from None


def committed_batches(ckpt: Path) -> int:
    commits = ckpt / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def sink_rows(out: Path) -> list[dict[str, Any]]:
    """Rows of the parquet files the file sink committed (its _spark_metadata log)."""
    paths: set[str] = set()
    for log in (out / "_spark_metadata").iterdir():
        if log.name.startswith("."):
            continue
        for line in log.read_text().splitlines()[1:]:
            rec = json.loads(line)
            if rec["action"] == "add":
                paths.add(rec["path"])
            else:
                paths.discard(rec["path"])
    rows: list[dict[str, Any]] = []
    for path in paths:
        local = Path(path.removeprefix("file:"))
        parts = dict(p.split("=", 1) for p in local.parts if "=" in p)
        for row in pq.read_table(local).to_pylist():
            rows.append({**row, **parts})
    return rows


def change(row: dict[str, Any]) -> tuple[Any, ...]:
    def image(m: Any) -> str | None:
        return None if m is None else json.dumps(dict(m), sort_keys=True)

    return (row["event_type"], row["primary_key"], image(row["before"]), image(row["after"]))


def pk(i: int) -> str:
    return json.dumps({"id": str(i)}, separators=(",", ":"))


def expected_changes() -> Counter[tuple[Any, ...]]:
    def img(i: int, val: str) -> str:
        return json.dumps({"id": str(i), "val": val}, sort_keys=True)

    out: Counter[tuple[Any, ...]] = Counter()
    out.update(("INSERT", pk(i), None, img(i, f"v{i}")) for i in range(1, 16_001))
    out.update(("UPDATE", pk(i), img(i, f"v{i}"), img(i, f"u{i}")) for i in range(1, 2_001))
    out.update(("DELETE", pk(i), img(i, f"v{i}"), None) for i in range(2_001, 4_001))
    return out


def insert(sandbox: Sandbox, db: str, first: int, last: int) -> None:
    for lo in range(first, last + 1, TX_ROWS):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, min(lo + TX_ROWS, last + 1)))
        sandbox.primary.execute(f"INSERT INTO {db}.items (id, val) VALUES {values}")


def update_and_delete(sandbox: Sandbox, db: str) -> None:
    for lo in range(1, 2_001, TX_ROWS):
        hi = lo + TX_ROWS - 1
        sandbox.primary.execute(
            f"UPDATE {db}.items SET val = CONCAT('u', id) WHERE id BETWEEN {lo} AND {hi}"
        )
        sandbox.primary.execute(
            f"DELETE FROM {db}.items WHERE id BETWEEN {lo + 2000} AND {hi + 2000}"
        )


def test_exactly_once_through_leader_and_driver_kills(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_spark_{uuid.uuid4().hex[:8]}"
    # A client that never acked has no cursor: a new leader would start from the configured
    # position, so configure the test's start (else it is the binlog end at takeover).
    nodes = node_cluster(2, destination=db_destination(sandbox.primary, db))
    leader = wait_leader(nodes)
    log_.info("nodes up, %s leads", leader.id)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))",
    )
    insert(sandbox, db, 1, 8_000)

    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "driver.log"
    args = [
        "--etcd", ",".join(sandbox.etcd_endpoints), "--destination", DEST,
        "--client-id", "spark", "--output", str(out), "--checkpoint", str(ckpt),
        "--option", f"etcdPrefix={nodes[0].prefix}", "--option", "batchSize=40",
        "--option", "maxBatchesPerTrigger=2",
    ]  # fmt: skip
    driver = Driver([*args, "--trigger", "1s"], log)
    try:
        wait_until(lambda: committed_batches(ckpt) >= 1, "a micro-batch", 120)
        log_.info("first micro-batch committed; SIGKILL %s", leader.id)
        leader.kill()
        writer = threading.Thread(target=insert, args=(sandbox, db, 8_001, 16_000))
        writer.start()
        wait_leader(nodes, exclude=[leader])
        writer.join()
        done = committed_batches(ckpt)
        log_.info("new leader, phase 2 written, %d micro-batches committed", done)
        wait_until(lambda: committed_batches(ckpt) > done, "progress after failover", 120)
    finally:
        driver.kill()  # mid-stream: the rest of phase 2 is still to come
    log_.info("driver killed after %d micro-batches", committed_batches(ckpt))
    update_and_delete(sandbox, db)

    more = ["--option", "pollTimeoutMs=5000", "--option", "maxBatchesPerTrigger=10"]
    final = Driver([*args, "--trigger", "available-now", *more], log)
    assert final.wait(180) == 0, log.read_text()[-3000:]

    log_.info("final run done: %d micro-batches", committed_batches(ckpt))
    rows = sink_rows(out)
    positions = Counter((r["logfile"], r["offset"], r["row_index"]) for r in rows)
    assert positions.most_common(1)[0][1] == 1, "a change was written twice"
    ddl = sorted(r["sql"].split("(")[0].strip() for r in rows if r["is_ddl"])
    assert ddl == [f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items"]
    assert Counter(change(r) for r in rows if not r["is_ddl"]) == expected_changes()
    assert "wrote 20002 rows" in log.read_text()


def test_an_empty_run_of_the_example_ends_with_a_summary_of_nothing(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The README's case: a run that finds nothing to write (here a filter no table
    matches) ends normally and says so, instead of Spark's UNABLE_TO_INFER_SCHEMA when
    it reads its empty output back."""
    nodes = node_cluster(1)
    wait_leader(nodes)
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "driver.log"
    args = [
        "--etcd", ",".join(sandbox.etcd_endpoints), "--destination", DEST,
        "--client-id", "empty", "--output", str(out), "--checkpoint", str(ckpt),
        "--option", f"etcdPrefix={nodes[0].prefix}", "--option", "filter=nothing\\.here",
        "--trigger", "available-now",
    ]  # fmt: skip
    assert Driver(args, log).wait(300) == 0, log.read_text()[-3000:]
    assert f"wrote 0 rows to {out}" in log.read_text()
