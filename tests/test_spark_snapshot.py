"""An incremental snapshot read through typed Spark streams (issue 15 with issue 16).

A table filled before the destination started (its rows are in no binlog the node
reads) is snapshotted with ``POST /v1/destinations/{d}/snapshots`` while a writer
updates and deletes those rows and inserts new ones. Two typed queries of one
SparkSession read the destination: one writes every row into parquet, the other is the
mirror example (``examples/spark_mirror.py``). Both are stopped and restarted from
their checkpoints (``availableNow``) for the rest. At the end: every prefilled row the
writer left alone arrived exactly once as READ with its values, no key more than once
as READ, every change of the writer exactly once as a binlog row, and the mirror
equals ``SELECT *`` value by value.
"""

from __future__ import annotations

import importlib.util
import random
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from node_fixtures import (  # noqa: F401  (fixture)
    DEST,
    NodeProc,
    db_destination,
    node_cluster,
    wait_leader,
)
from spark_fixtures import spark  # noqa: F401  (fixture)
from test_spark_mirror import by_key, mirror_rows, select_all
from test_spark_typed_stream import committed, to_parquet, typed_query

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "spark_mirror.py"
PREFILLED = 3000
NEW_IDS = 100_000  # the writer's inserts start here
COLUMNS = "id INT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(10,2), note VARCHAR(40) NULL," \
    " created DATETIME(6)"  # fmt: skip


class Writer:
    """Single-row changes in autocommit: updates and deletes of prefilled rows, inserts
    (and their updates) of new ones. Counts what the binlog gets; ``touched`` keys."""

    def __init__(self, box: Sandbox, table: str) -> None:
        self.box, self.table, self.rnd = box, table, random.Random(15)
        self.live = set(range(1, PREFILLED + 1))
        self.touched: set[int] = set()
        self.counts: Counter[str] = Counter()
        self.next_id = NEW_IDS
        self.errors: list[BaseException] = []

    def _one(self, cur: Any) -> None:
        rnd, t = self.rnd, self.table
        op = rnd.random()
        if op < 0.3:
            i, kind = self.next_id, "INSERT"
            self.next_id += 1
            sql = f"INSERT INTO {t} VALUES ({i}, {i % 7}, 1.50, 'new', '2025-01-02 03:04:05.6')"
            self.live.add(i)
        else:
            i = rnd.choice(sorted(self.live))
            if op < 0.8:
                kind, sql = "UPDATE", f"UPDATE {t} SET qty = qty + 1, note = 'u' WHERE id = {i}"
            else:
                kind, sql = "DELETE", f"DELETE FROM {t} WHERE id = {i}"
                self.live.discard(i)
        assert cur.execute(sql) == 1, sql
        self.touched.add(i)
        self.counts[kind] += 1

    def run(self, changes: int, pause_s: float) -> None:
        try:
            with self.box.primary.admin() as conn, conn.cursor() as cur:
                cur.execute("SET autocommit = 1")
                for _ in range(changes):
                    self._one(cur)
                    if pause_s:
                        threading.Event().wait(pause_s)
        except BaseException as exc:
            self.errors.append(exc)


def prefill(box: Sandbox, db: str) -> None:
    box.primary.execute(
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.orders ({COLUMNS})",
        f"INSERT INTO {db}.orders SELECT seq, seq % 97, seq * 1.25,"
        f" IF(seq % 5 = 0, NULL, CONCAT('n', seq)),"
        f" TIMESTAMPADD(MICROSECOND, seq * 1000001, '2024-01-01 00:00:00')"
        f" FROM {db}.seq_1_to_{PREFILLED}",
    )


def prefilled_row(i: int) -> dict[str, Any]:
    created = datetime(2024, 1, 1) + timedelta(microseconds=i * 1_000_001)
    note = None if i % 5 == 0 else f"n{i}"
    return {"id": i, "qty": i % 97, "price": Decimal(i * 125) / 100, "note": note,
            "created": created}  # fmt: skip


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("spark_mirror", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def start_snapshot(node: NodeProc, table: str) -> str:
    path = f"/v1/destinations/{DEST}/snapshots"
    with httpx.Client(base_url=node.url, timeout=30) as h:
        r = h.post(path, json={"tables": [table.replace(".", "\\.")], "chunk_rows": 400})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def snapshot_state(node: NodeProc, snapshot_id: str) -> dict[str, Any]:
    path = f"/v1/destinations/{DEST}/snapshots/{snapshot_id}"
    with httpx.Client(base_url=node.url, timeout=30) as h:
        state: dict[str, Any] = h.get(path).json()
        return state


@pytest.mark.timeout(900)
def test_snapshot_rows_arrive_once_through_typed_streams_and_the_mirror(
    spark: Any,  # noqa: F811
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_ssnap_{uuid.uuid4().hex[:8]}"
    table = f"{db}.orders"
    prefill(sandbox, db)
    # the prefill is before it
    nodes = node_cluster(1, destination=db_destination(sandbox.primary, db))
    leader = wait_leader(nodes)
    out, ckpt = tmp_path / "rows", tmp_path / "rows-ckpt"
    mirror_out, mirror_ckpt = tmp_path / "mirror", tmp_path / "mirror-ckpt"
    example = load_example()
    mirror_args = [
        "--etcd", ",".join(sandbox.etcd_endpoints), "--destination", DEST,
        "--client-id", "mirror", "--table", table, "--output", str(mirror_out),
        "--checkpoint", str(mirror_ckpt), "--option", f"etcdPrefix={nodes[0].prefix}",
        "--option", "pollTimeoutMs=2000",
    ]  # fmt: skip

    def start(available_now: bool) -> list[Any]:
        rows = typed_query(spark, sandbox, nodes, table, "rows", batchSize="300")
        trigger = ["--trigger", "available-now" if available_now else "1s"]
        mirror = example.start_query(spark, example.parse_args([*mirror_args, *trigger]), table)
        return [to_parquet(rows, out, ckpt, available_now), mirror]

    writer = Writer(sandbox, table)
    queries = start(available_now=False)
    try:
        writer.run(5, 0.0)  # both queries subscribed and committed before the snapshot
        wait_until(
            lambda: committed(ckpt) >= 1 and committed(mirror_ckpt / table) >= 1,
            "a micro-batch of each query", 240,
        )  # fmt: skip
        snapshot_id = start_snapshot(leader, table)
        writing = threading.Thread(target=writer.run, args=(300, 0.01))
        writing.start()
        wait_until(
            lambda: snapshot_state(leader, snapshot_id)["state"] == "done", "the snapshot", 300
        )
        writing.join(120)
        assert not writing.is_alive() and not writer.errors, writer.errors
        for q in queries:
            assert q.exception() is None, q.exception()
    finally:
        for q in queries:
            q.stop()
    writer.run(20, 0.0)
    queries = start(available_now=True)  # restarted from the checkpoints
    for q in queries:
        assert q.awaitTermination(300), f"the availableNow query {q.id} ran past 300 s"
        assert q.exception() is None, q.exception()
    assert snapshot_state(leader, snapshot_id)["rows"] > 0

    rows = [r.asDict(recursive=True) for r in spark.read.parquet(str(out)).collect()]
    reads = Counter(r["after"]["id"] for r in rows if r["event_type"] == "READ")
    assert reads and max(reads.values()) == 1, reads.most_common(3)
    assert set(reads) <= set(range(1, PREFILLED + 1)) | set(range(NEW_IDS, writer.next_id))
    untouched = set(range(1, PREFILLED + 1)) - writer.touched
    assert untouched <= set(reads), sorted(untouched - set(reads))[:10]
    by_id = {r["after"]["id"]: r["after"] for r in rows if r["event_type"] == "READ"}
    for i in sorted(untouched):
        assert by_id[i] == prefilled_row(i), i
    changes = Counter(r["event_type"] for r in rows if r["event_type"] != "READ")
    assert changes == writer.counts, (changes, writer.counts)
    want = by_key(select_all(sandbox, db, "orders"), ("id",))
    got = by_key(mirror_rows(mirror_out, table), ("id",))
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        assert got[key] == row, key
