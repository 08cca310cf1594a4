"""The mirror example (``examples/spark_mirror.py``): two tables kept in parquet through
writes, a leader SIGKILL and a driver SIGKILL + restart; at the end each mirror equals
``SELECT *`` of its table, value by value. And ``apply_changes`` on hand-made rows:
READ (snapshot) rows upsert like INSERT, TRUNCATE empties the table."""

from __future__ import annotations

import importlib.util
import random
import threading
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from node_fixtures import DEST, db_destination, node_cluster, wait_leader  # noqa: F401  (fixture)
from spark_fixtures import spark  # noqa: F401  (fixture)
from test_spark_e2e import ROOT, Driver, committed_batches

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

EXAMPLE = ROOT / "examples" / "spark_mirror.py"
TABLES = {
    "orders": "id INT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(10,2), note VARCHAR(40) NULL,"
    " created DATETIME(6), payload BLOB",
    "customers": "cid VARCHAR(20), region SMALLINT UNSIGNED, name VARCHAR(40),"
    " balance BIGINT UNSIGNED, PRIMARY KEY (cid, region)",
}


class Writer:
    """Random inserts, updates and deletes on both tables, in small transactions."""

    def __init__(self, box: Sandbox, db: str, seed: int) -> None:
        self.box, self.db, self.rnd = box, db, random.Random(seed)
        self.orders: set[int] = set()
        self.customers: set[tuple[str, int]] = set()
        self.next_id = 1

    def _order(self) -> str:
        rnd, i = self.rnd, self.next_id
        self.next_id += 1
        self.orders.add(i)
        note = "NULL" if rnd.random() < 0.3 else f"'n{rnd.randint(0, 999)}'"
        created = datetime(2024, 1, 1) + timedelta(microseconds=rnd.randint(0, 10**13))
        return (
            f"INSERT INTO {self.db}.orders VALUES ({i}, {rnd.randint(0, 99)},"
            f" {rnd.randint(0, 10**6)}.{rnd.randint(0, 99):02d}, {note}, '{created}',"
            f" x'{rnd.randbytes(rnd.randint(0, 12)).hex()}')"
        )

    def statements(self) -> list[str]:
        rnd, db, out = self.rnd, self.db, []
        for _ in range(rnd.randint(1, 4)):
            op = rnd.random()
            if op < 0.45 or not self.orders:
                out.append(self._order())
            elif op < 0.6:
                i = rnd.choice(sorted(self.orders))
                out.append(f"UPDATE {db}.orders SET qty = qty + 1, note = 'u' WHERE id = {i}")
            elif op < 0.7:
                i = rnd.choice(sorted(self.orders))
                self.orders.discard(i)
                out.append(f"DELETE FROM {db}.orders WHERE id = {i}")
            elif op < 0.9 or not self.customers:
                key = (f"c'{rnd.randint(0, 40)}", rnd.randint(0, 3))
                self.customers.add(key)
                out.append(
                    f"REPLACE INTO {db}.customers VALUES ('{key[0].replace(chr(39), chr(39) * 2)}',"
                    f" {key[1]}, 'name {rnd.randint(0, 9)}', {rnd.randint(0, 2**64 - 1)})"
                )
            else:
                key = rnd.choice(sorted(self.customers))
                cid, where = key[0].replace("'", "''"), f"region = {key[1]}"
                if op < 0.95:
                    self.customers.discard(key)
                    out.append(f"DELETE FROM {db}.customers WHERE cid = '{cid}' AND {where}")
                else:
                    out.append(f"UPDATE {db}.customers SET name = 'renamed' WHERE cid = '{cid}'"
                               f" AND {where}")  # fmt: skip
        return out

    def run(self, transactions: int) -> None:
        with self.box.primary.admin() as conn, conn.cursor() as cur:
            for _ in range(transactions):
                cur.execute("BEGIN")
                for sql in self.statements():
                    cur.execute(sql)
                cur.execute("COMMIT")


def select_all(box: Sandbox, db: str, table: str) -> list[dict[str, Any]]:
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {db}.{table}")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def mirror_rows(output: Path, table: str) -> list[dict[str, Any]]:
    version = (output / table / "_current").read_text().strip()
    rows: list[dict[str, Any]] = pq.read_table(output / table / version).to_pylist()
    for row in rows:  # BIGINT UNSIGNED is DECIMAL(20,0), SMALLINT UNSIGNED an int
        if isinstance(row.get("balance"), Decimal):
            row["balance"] = int(row["balance"])
    return rows


def by_key(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[Any, ...], Any]:
    return {tuple(r[k] for k in keys): r for r in rows}


@pytest.mark.timeout(900)
def test_mirror_equals_the_tables_through_leader_and_driver_kills(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_mir_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(2, destination=db_destination(sandbox.primary, db))
    leader = wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", *(f"CREATE TABLE {db}.{t} ({c})" for t, c in TABLES.items())
    )
    writer = Writer(sandbox, db, seed=16)
    writer.run(80)
    out, ckpt, log = tmp_path / "mirror", tmp_path / "ckpt", tmp_path / "driver.log"
    args = [
        "--etcd", ",".join(sandbox.etcd_endpoints), "--destination", DEST,
        "--client-id", "mirror", "--output", str(out), "--checkpoint", str(ckpt),
        *(a for t in TABLES for a in ("--table", f"{db}.{t}")),
        "--option", f"etcdPrefix={nodes[0].prefix}", "--option", "batchSize=60",
        "--option", "maxBatchesPerTrigger=3",
    ]  # fmt: skip
    driver = Driver([*args, "--trigger", "1s"], log, EXAMPLE)

    def progress() -> int:
        return min(committed_batches(ckpt / f"{db}.{t}") for t in TABLES)

    try:
        wait_until(lambda: progress() >= 1, "a micro-batch of each table", 180)
        leader.kill()
        more = threading.Thread(target=writer.run, args=(80,))
        more.start()
        wait_leader(nodes, exclude=[leader])
        more.join()
        done = progress()
        wait_until(lambda: progress() > done, "progress after the failover", 180)
    finally:
        driver.kill()
    writer.run(60)
    more_opts = ["--option", "batchSize=1000", "--option", "maxBatchesPerTrigger=10"]
    final = Driver([*args, "--trigger", "available-now", *more_opts], log, EXAMPLE)
    assert final.wait(300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    for table, keys in (("orders", ("id",)), ("customers", ("cid", "region"))):
        want = by_key(select_all(sandbox, db, table), keys)
        got = by_key(mirror_rows(out, f"{db}.{table}"), keys)
        assert sorted(got) == sorted(want), f"{table}: keys differ"
        for key, row in want.items():
            assert got[key] == row, (table, key)
        assert f"mirror {db}.{table}: {len(want)} rows" in text and len(want) > 10
    assert "changes applied" in text


def test_apply_changes_reads_snapshot_rows_as_upserts_and_truncate_empties(
    spark: Any,  # noqa: F811
) -> None:
    spec = importlib.util.spec_from_file_location("spark_mirror", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    apply_changes = example.apply_changes

    image = "struct<id:int,v:string>"
    schema = f"_seq bigint, is_ddl boolean, event_type string, before {image}, after {image}"

    def rows(*changes: tuple[Any, ...]) -> Any:
        return spark.createDataFrame(list(changes), schema)

    state = spark.createDataFrame([(1, "old"), (2, "two")], "id int, v string")
    batch = rows(
        (0, False, "READ", None, (1, "snap")), (1, False, "READ", None, (3, "three")),
        (2, False, "DELETE", (2, "two"), None), (3, False, "UPDATE", (3, "three"), (3, "3")),
    )  # fmt: skip
    struct = batch.schema["after"].dataType
    got = apply_changes(batch, state, ["id"], struct).orderBy("id").collect()
    assert [tuple(r) for r in got] == [(1, "snap"), (3, "3")]
    truncated = rows(
        (0, False, "INSERT", None, (5, "x")), (1, True, "TRUNCATE", None, None),
        (2, False, "INSERT", None, (6, "y")),
    )  # fmt: skip
    got = apply_changes(truncated, state, ["id"], struct).collect()
    assert [tuple(r) for r in got] == [(6, "y")]


def test_apply_changes_moves_a_row_whose_key_changed(
    spark: Any,  # noqa: F811
) -> None:
    spec = importlib.util.spec_from_file_location("spark_mirror", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    image = "struct<id:int,v:string>"
    schema = f"_seq bigint, is_ddl boolean, event_type string, before {image}, after {image}"
    state = spark.createDataFrame([(1, "a"), (2, "b")], "id int, v string")
    batch = spark.createDataFrame(
        [(0, False, "UPDATE", (1, "a"), (5, "a")), (1, False, "UPDATE", (2, "b"), (1, "b"))],
        schema,
    )  # id 1 moves to 5, then id 2 moves onto the freed 1
    struct = batch.schema["after"].dataType
    got = example.apply_changes(batch, state, ["id"], struct).orderBy("id").collect()
    assert [tuple(r) for r in got] == [(1, "b"), (5, "a")]
