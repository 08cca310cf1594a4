"""The Delta mirror (``canal_client.spark.delta``) in real Spark streams from real nodes.

* Every column type through a typed stream into Delta and back (deltalake and DuckDB
  alone), with a micro-batch whose Delta commit is done when the driver "dies" before
  Spark commits it: the restarted query replays it and the mirror skips it.
* ALTER TABLE ADD / DROP / widening MODIFY: the next run (its stream has the new
  columns) evolves the Delta table; a narrowing MODIFY stops it with
  ``IncompatibleChange`` naming the table and column, and nothing is written.
* ``examples/spark_mirror.py --format delta`` on three nodes: random inserts, updates,
  key moves and deletes on two tables (one with a composite key) and an incremental
  snapshot of the one prefilled before the nodes started (its rows reach the stream
  only through the snapshot, and the writer changes them meanwhile), while the leader
  is SIGKILLed and then the driver;
  a restart from the checkpoints finishes, and each Delta table equals ``SELECT *``
  value by value, read with deltalake and with DuckDB.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from delta_fixtures import by_key, delta_rows, duckdb_rows
from deltalake import DeltaTable
from node_fixtures import DEST, db_destination, node_cluster, wait_leader  # noqa: F401
from spark_fixtures import spark  # noqa: F401  (fixture)
from test_spark_e2e import ROOT, Driver, committed_batches
from test_spark_mirror import Writer, select_all
from test_spark_snapshot import snapshot_state, start_snapshot
from test_spark_typed import _expected, _got, _prepare, _select
from test_spark_typed_stream import _mysql_types, typed_query

from canal_client.spark.delta import Applied, DeltaMirror
from canal_client.spark.schema import column_kind
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

EXAMPLE = ROOT / "examples" / "spark_mirror.py"


def run_mirror(
    session: Any, box: Sandbox, nodes: list[Any], table: str, client: str, root: Path,
    ckpt: Path, sink: Any, **opts: str,
) -> Any:  # fmt: skip
    df = typed_query(session, box, nodes, table, client, **opts)
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt))
    return writer.trigger(availableNow=True).start()


def both_readers(path: Path) -> list[dict[str, Any]]:
    """The rows by deltalake, checked equal to DuckDB's (timestamps compared as instants)."""
    a, b = delta_rows(path), duckdb_rows(path)

    def norm(rows: list[dict[str, Any]]) -> list[str]:
        def v(x: Any) -> Any:
            return x.astimezone(UTC) if isinstance(x, datetime) and x.tzinfo else x

        return sorted(repr(sorted((k, v(x)) for k, x in r.items())) for r in rows)

    assert norm(a) == norm(b), "deltalake and DuckDB read different rows"
    return a


class CrashAfterCommit:
    """A ``foreachBatch`` that fails right after the first micro-batch the mirror
    committed into Delta, as a driver dying before Spark records the batch as done."""

    def __init__(self, sink: DeltaMirror, reports: list[Applied]) -> None:
        self.sink, self.reports, self.crashed_at = sink, reports, -1

    def __call__(self, df: Any, batch_id: int) -> None:
        before = len(self.reports)
        self.sink(df, batch_id)
        if self.crashed_at < 0 and len(self.reports) > before:
            self.crashed_at = batch_id
            raise RuntimeError(f"the driver dies after batch {batch_id}'s Delta commit")


def batches_in_log(path: Path) -> list[int]:
    """The batch ids of the Delta table's commits, oldest first."""
    history = DeltaTable(str(path)).history()
    return [int(h["canal.batch"]) for h in reversed(history) if "canal.batch" in h]


@pytest.mark.timeout(600)
def test_every_type_into_delta_exactly_once_across_a_replay(
    spark: Any,  # noqa: F811
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_dtyp_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1)
    wait_leader(nodes)
    _prepare(sandbox, db)  # 4 inserts, 2 updates, 1 delete, in small batches below
    table, root, ckpt = f"{db}.t", tmp_path / "lake", tmp_path / "ckpt"
    reports: list[Applied] = []
    sink = DeltaMirror(root, tables=[table], report=reports.append)
    opts = {"batchSize": "3", "maxBatchesPerTrigger": "1"}
    crash = CrashAfterCommit(sink, reports)
    query = run_mirror(spark, sandbox, nodes, table, "dtyp", root, ckpt, crash, **opts)
    with pytest.raises(Exception, match="the driver dies after batch"):
        query.awaitTermination(240)
    assert [a.batch_id for a in reports] == [crash.crashed_at] and not reports[0].skipped
    query = run_mirror(spark, sandbox, nodes, table, "dtyp", root, ckpt, sink, **opts)
    assert query.awaitTermination(240), "the availableNow query ran past 240 s"
    assert query.exception() is None
    replayed = reports[1]
    assert (replayed.batch_id, replayed.skipped) == (crash.crashed_at, True), reports
    assert all(not a.skipped for a in reports[2:]) and len(reports) > 3
    logged = batches_in_log(root / table)
    assert logged == sorted(set(logged)) and crash.crashed_at in logged, logged

    kinds = {c: column_kind(t) for c, t in _mysql_types(sandbox, db).items()}
    got = by_key(both_readers(root / table), ["id"])
    selected = _select(sandbox, db)
    assert sorted(k for (k,) in got) == sorted(selected) == [1, 2, 4]
    for key, want in selected.items():
        row = got[(key,)]
        assert list(row) == list(want), "the mirror's columns are the table's, in order"
        for name, kind in kinds.items():
            expected = _expected(name, kind, want[name])
            if kind == "time" and expected is not None:  # Delta: microseconds
                expected = expected // timedelta(microseconds=1)
            assert _got(kind, row[name]) == expected, (key, name)
    assert got[(2,)]["biu"] == Decimal(18446744073709551615)


@pytest.mark.timeout(600)
def test_alter_table_evolves_the_mirror_and_a_narrowing_stops_it(
    spark: Any,  # noqa: F811
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_devo_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1)
    wait_leader(nodes)
    table, root, ckpt = f"{db}.orders", tmp_path / "lake", tmp_path / "ckpt"
    sandbox.primary.execute(
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, qty SMALLINT, price DECIMAL(10,2),"
        " gone VARCHAR(10))",
        f"INSERT INTO {db}.orders VALUES " + ",".join(f"({i},{i},{i}.5,'g')" for i in range(1, 21)),
    )
    reports: list[Applied] = []

    def run() -> Any:
        sink = DeltaMirror(root, tables=[table], report=reports.append)
        query = run_mirror(spark, sandbox, nodes, table, "devo", root, ckpt, sink)
        try:
            query.awaitTermination(240)
        except Exception as exc:  # the query failed
            return exc
        finally:
            query.stop()
        return query.exception()

    assert run() is None
    sandbox.primary.execute(
        f"ALTER TABLE {db}.orders ADD COLUMN note VARCHAR(20), MODIFY qty BIGINT,"
        " MODIFY price DECIMAL(14,3), DROP COLUMN gone",
        f"UPDATE {db}.orders SET qty = 40000, note = 'big' WHERE id = 1",
        f"DELETE FROM {db}.orders WHERE id = 2",
        f"INSERT INTO {db}.orders VALUES (21, 21, 21.125, 'new')",
    )
    assert run() is None  # a new run reads the new columns: the mirror evolves
    evolved = [a.evolved for a in reports if a.evolved]
    assert evolved == ["added note (string), dropped gone, converted qty: short -> long, "
                       "converted price: decimal(10,2) -> decimal(14,3)"]  # fmt: skip
    path = root / table
    want = by_key(select_all(sandbox, db, "orders"), ["id"])
    got = by_key(both_readers(path), ["id"])
    assert got == want and got[(1,)]["note"] == "big" and got[(3,)]["note"] is None
    assert got[(21,)]["price"] == Decimal("21.125")

    version = DeltaTable(str(path)).version()
    sandbox.primary.execute(
        f"ALTER TABLE {db}.orders MODIFY qty INT",
        f"INSERT INTO {db}.orders VALUES (22, 22, 22, 'x')",
    )
    error = str(run())
    assert "IncompatibleChange" in error, error
    assert f"{table}: column qty changed type long -> integer" in error
    assert DeltaTable(str(path)).version() == version
    assert by_key(both_readers(path), ["id"]) == want


class KeyMovingWriter(Writer):
    """The mirror test's writer on ``orders`` prefilled with ids ``1..prefilled`` (its
    updates and deletes also hit those rows, during their snapshot), plus UPDATEs that
    change a key (orders' id, customers' cid)."""

    def __init__(self, box: Sandbox, db: str, seed: int, prefilled: int) -> None:
        super().__init__(box, db, seed)
        self.orders = set(range(1, prefilled + 1))
        self.next_id = prefilled + 1
        self.moved = 0

    def statements(self) -> list[str]:
        out, rnd, db = super().statements(), self.rnd, self.db
        op = rnd.random()
        if op < 0.1 and self.orders:
            old, new = rnd.choice(sorted(self.orders)), self.next_id
            self.next_id += 1
            self.orders.discard(old)
            self.orders.add(new)
            self.moved += 1
            out.append(f"UPDATE {db}.orders SET id = {new}, qty = qty + 1 WHERE id = {old}")
        elif op < 0.15 and self.customers:
            cid, region = rnd.choice(sorted(self.customers))
            new_cid = f"moved{self.moved}"
            self.moved += 1
            self.customers.discard((cid, region))
            self.customers.add((new_cid, region))
            cid = cid.replace("'", "''")
            out.append(f"UPDATE {db}.customers SET cid = '{new_cid}'"
                       f" WHERE cid = '{cid}' AND region = {region}")  # fmt: skip
        return out


PREFILLED = 3000


def _decimal_to_int(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # BIGINT UNSIGNED is decimal(20,0) in the mirror, an int in SELECT *
    return [{k: int(v) if k == "balance" and v is not None else v for k, v in r.items()}
            for r in rows]  # fmt: skip


@pytest.mark.timeout(1500)
def test_delta_mirror_equals_the_tables_through_leader_and_driver_kills(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_dmir_{uuid.uuid4().hex[:8]}"
    sandbox.primary.execute(
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(10,2),"
        " note VARCHAR(40) NULL, created DATETIME(6), payload BLOB)",
        f"CREATE TABLE {db}.customers (cid VARCHAR(20), region SMALLINT UNSIGNED,"
        " name VARCHAR(40), balance BIGINT UNSIGNED, PRIMARY KEY (cid, region))",
        f"INSERT INTO {db}.orders SELECT seq, seq % 50, seq * 1.25, CONCAT('n', seq),"
        f" TIMESTAMPADD(MICROSECOND, seq * 1000001, '2024-01-01'), NULL"
        f" FROM {db}.seq_1_to_{PREFILLED}",
    )  # the prefilled orders are before the nodes' start: only their snapshot brings them
    nodes = node_cluster(3, destination=db_destination(sandbox.primary, db))
    leader = wait_leader(nodes)
    writer = KeyMovingWriter(sandbox, db, seed=35, prefilled=PREFILLED)
    writer.run(60)
    tables = {"orders": ("id",), "customers": ("cid", "region")}
    out, ckpt, log = tmp_path / "lake", tmp_path / "ckpt", tmp_path / "driver.log"
    args = [
        "--etcd", ",".join(sandbox.etcd_endpoints), "--destination", DEST,
        "--client-id", "dmirror", "--output", str(out), "--checkpoint", str(ckpt),
        "--format", "delta", *(a for t in tables for a in ("--table", f"{db}.{t}")),
        "--option", f"etcdPrefix={nodes[0].prefix}", "--option", "batchSize=60",
        "--option", "maxBatchesPerTrigger=3",
    ]  # fmt: skip
    driver = Driver([*args, "--trigger", "1s"], log, EXAMPLE)

    def progress() -> int:
        return min(committed_batches(ckpt / f"{db}.{t}") for t in tables)

    try:
        wait_until(lambda: progress() >= 1, "a micro-batch of each table", 480)
        snapshot_id = start_snapshot(leader, f"{db}.orders")
        more = threading.Thread(target=writer.run, args=(80,))
        more.start()
        leader.kill()
        leader = wait_leader(nodes, exclude=[leader])
        more.join()
        done = progress()
        wait_until(lambda: progress() > done + 1, "progress after the failover", 240)
    finally:
        driver.kill()  # SIGKILL, mid-run
    writer.run(60)
    wait_until(lambda: snapshot_state(leader, snapshot_id)["state"] == "done", "the snapshot", 300)
    more_opts = ["--option", "batchSize=1000", "--option", "maxBatchesPerTrigger=10"]
    final = Driver([*args, "--trigger", "available-now", *more_opts], log, EXAMPLE)
    assert final.wait(480) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert writer.moved > 3 and "Delta version" in text
    for table, keys in tables.items():
        path = out / f"{db}.{table}"
        want = by_key(select_all(sandbox, db, table), keys)
        got = by_key(_decimal_to_int(both_readers(path)), keys)
        assert sorted(got) == sorted(want), f"{table}: keys differ"
        for key, row in want.items():
            assert got[key] == row, (table, key)
        assert f"mirror {db}.{table}: {len(want)} rows" in text and len(want) > 10
        assert DeltaTable(str(path)).transaction_version("x") is None
    prefilled = {k for (k,) in by_key(select_all(sandbox, db, "orders"), ["id"]) if k <= PREFILLED}
    assert len(prefilled) > PREFILLED // 2  # rows only the snapshot brought, most untouched
