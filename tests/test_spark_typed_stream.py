"""Typed streams in a real SparkSession (local[2]) from a real node: every type into
parquet and back, and an ALTER TABLE that stops the query before the first row of the
new shape; restarted from its checkpoint the query reads the new columns and goes on,
exactly once."""

from __future__ import annotations

import uuid
from datetime import UTC
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from node_fixtures import DEST, NodeProc, node_cluster, wait_leader  # noqa: F401  (fixture)
from spark_fixtures import spark  # noqa: F401  (fixture)
from test_spark_typed import _expected, _got, _prepare, _select

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox


def typed_query(
    session: Any, box: Sandbox, nodes: list[NodeProc], table: str, client: str, **opts: str
) -> Any:
    reader = (
        session.readStream.format("canal")
        .option("etcd", ",".join(box.etcd_endpoints))
        .option("etcdPrefix", nodes[0].prefix)
        .option("destination", DEST)
        .option("clientId", client)
        .option("table", table)
        .option("pollTimeoutMs", "2000")
    )
    for key, value in opts.items():
        reader = reader.option(key, value)
    return reader.load()


def to_parquet(df: Any, out: Path, ckpt: Path, available_now: bool = True) -> Any:
    writer = df.writeStream.format("parquet").option("path", str(out))
    writer = writer.option("checkpointLocation", str(ckpt))
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="1 second").start()


def committed(ckpt: Path) -> int:
    commits = ckpt / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def test_every_type_into_parquet_and_back(
    spark: Any,  # noqa: F811
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_typs_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1)
    wait_leader(nodes)
    _prepare(sandbox, db)
    df = typed_query(spark, sandbox, nodes, f"{db}.t", "typed-parquet")
    schema = {f.name: f.dataType.simpleString() for f in df.schema["after"].dataType.fields}
    assert schema["biu"] == "decimal(20,0)" and schema["dw"] == "string"
    assert schema["tm"] == "interval day to second" and schema["dtm"] == "timestamp_ntz"
    assert schema["ts"] == "timestamp" and schema["s"] == "array<string>"
    assert schema["b"] == "binary" and schema["tiu"] == "smallint"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = to_parquet(df, out, ckpt)
    assert query.awaitTermination(180), "the availableNow query ran past 180 s"
    assert query.exception() is None
    back = spark.read.parquet(str(out))
    assert back.schema == df.schema
    rows = [r.asDict(recursive=True) for r in back.where("not is_ddl").collect()]
    latest: dict[int, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["offset"], r["row_index"])):
        image = r["after"] or r["before"]
        if r["event_type"] == "DELETE":
            latest.pop(image["id"], None)
        else:
            latest[image["id"]] = r
    selected = _select(sandbox, db)
    assert sorted(latest) == sorted(selected)
    kinds = dict(zip(schema, [f.dataType for f in df.schema["after"].dataType.fields], strict=True))
    from canal_client.spark.schema import column_kind

    types = {c: column_kind(t) for c, t in _mysql_types(sandbox, db).items()}
    for key, want in selected.items():
        got = latest[key]["after"]
        for name in kinds:
            value = got[name]
            if types[name] == "timestamp" and value is not None:  # collect: naive local time
                value = value.astimezone(UTC)
            assert _got(types[name], value) == _expected(name, types[name], want[name]), name
    assert latest[2]["after"]["biu"] == Decimal(18446744073709551615)


def _mysql_types(box: Sandbox, db: str) -> dict[str, str]:
    from canal_server.table_schema import mysql_type_of

    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE,"
            " DATETIME_PRECISION, CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS"
            f" WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = 't'"
        )
        names = [d[0].upper() for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {str(r["COLUMN_NAME"]): mysql_type_of(r) for r in rows}


def test_alter_table_stops_the_query_and_a_restart_continues_exactly_once(
    spark: Any,  # noqa: F811
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_alter_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1)
    wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.orders (id INT PRIMARY KEY, qty INT, price DECIMAL(10,2))",
        f"INSERT INTO {db}.orders VALUES " + ",".join(f"({i},{i},{i}.5)" for i in range(1, 51)),
    )
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    client = "typed-alter"
    df = typed_query(spark, sandbox, nodes, f"{db}.orders", client, batchSize="5")
    query = to_parquet(df, out, ckpt, available_now=False)
    try:
        wait_until(lambda: _after_ids(spark, out) >= set(range(1, 51)), "the first 50 rows", 120)
        sandbox.primary.execute(
            f"ALTER TABLE {db}.orders ADD COLUMN note VARCHAR(20), MODIFY price DECIMAL(12,2)",
            f"INSERT INTO {db}.orders VALUES "
            + ",".join(f"({i},{i},{i}.5,'n{i}')" for i in range(51, 81)),
        )
        with pytest.raises(Exception) as info:
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(info.value)
    assert "SchemaChanged" in message and f"{db}.orders changed its columns" in message
    assert "added note (varchar(20))" in message and "decimal(10,2) -> decimal(12,2)" in message
    assert "ALTER TABLE" in message and "restart the query from its checkpoint" in message
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r["after"]["id"] for r in rows if not r["is_ddl"]) == list(range(1, 51))
    assert [r["event_type"] for r in rows if r["is_ddl"]] == ["CREATE", "ALTER"]

    df2 = typed_query(spark, sandbox, nodes, f"{db}.orders", client, batchSize="5")
    assert [f.name for f in df2.schema["after"].dataType.fields] == ["id", "qty", "price", "note"]
    query2 = to_parquet(df2, out, ckpt)
    assert query2.awaitTermination(180), "the second availableNow query ran past 180 s"
    assert query2.exception() is None
    merged = spark.read.option("mergeSchema", "true").parquet(str(out))
    rows = [r for r in merged.collect() if not r["is_ddl"]]
    ids = sorted(r["after"]["id"] for r in rows)
    assert ids == list(range(1, 81)), "a row was lost or written twice"
    notes = {r["after"]["id"]: r["after"]["note"] for r in rows}
    assert notes[51] == "n51" and notes[80] == "n80" and notes[1] is None
    prices = {r["after"]["id"]: r["after"]["price"] for r in rows}
    assert prices[80] == Decimal("80.50")


def _after_ids(session: Any, out: Path) -> set[int]:
    if not (out / "_spark_metadata").exists():
        return set()
    try:
        rows = session.read.parquet(str(out)).where("not is_ddl").select("after.id").collect()
    except Exception:  # no file committed yet
        return set()
    return {int(r["id"]) for r in rows}
