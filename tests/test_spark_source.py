"""The ``canal`` source in a real SparkSession (local[2]) through a fake connector."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from spark_fixtures import ddl_entry, make_entries, spark  # noqa: F401  (fixture)

from canal_client.spark.rows import FIELDS


def run_available_now(
    session: Any, data: Path, out: Path, ckpt: Path, batch_size: int = 12, **extra: str
) -> None:
    query = (
        session.readStream.format("canal")
        .option("server", f"file://{data}")
        .option("connectorFactory", "spark_fixtures:file_connector")
        .option("destination", "example")
        .option("clientId", "spark")
        .option("batchSize", str(batch_size))
        .option("maxBatchesPerTrigger", "1")
        .option("pollTimeoutMs", "0")
        .options(**extra)
        .load()
        .writeStream.format("parquet")
        .partitionBy("schema", "table")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None


def written(session: Any, out: Path) -> list[tuple[Any, ...]]:
    rows = session.read.parquet(str(out)).collect()
    return sorted(
        (r["event_type"], r["is_ddl"], r["primary_key"], json.dumps(r["after"], sort_keys=True),
         r["logfile"], r["offset"], r["row_index"])
        for r in rows
    )  # fmt: skip


def test_stream_into_parquet_twice_from_one_checkpoint(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    data, out, ckpt = tmp_path / "data.json", tmp_path / "out", tmp_path / "ckpt"
    first = make_entries(10, 3)  # 30 inserts in 30 entries
    data.write_text(json.dumps(first))
    run_available_now(spark, data, out, ckpt)
    assert len(list((ckpt / "offsets").iterdir())) >= 3  # several micro-batches
    rows = written(spark, out)
    assert len(rows) == 30 and len(set(rows)) == 30
    assert {r[2] for r in rows} == {
        json.dumps({"id": str(i)}, separators=(",", ":")) for i in range(1, 31)
    }

    more = make_entries(5, 2, first_id=31, start=10_000)
    data.write_text(
        json.dumps([*first, *more, ddl_entry("CREATE TABLE t.items2 (id int)", 20_000)])
    )
    run_available_now(spark, data, out, ckpt)
    rows = written(spark, out)
    assert len(rows) == 41 and len(set(rows)) == 41  # nothing twice
    assert [r for r in rows if r[1]] == [
        ("CREATE", True, None, "null", "mariadb-bin.000001", 20_000, 0)
    ]


def test_a_partition_read_in_several_arrow_batches_writes_every_row_once(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``rowsPerArrowBatch`` below a partition's rows: its rows reach Spark in several
    Arrow batches, each row exactly once."""
    data, out, ckpt = tmp_path / "data.json", tmp_path / "out", tmp_path / "ckpt"
    data.write_text(json.dumps(make_entries(10, 3)))
    run_available_now(spark, data, out, ckpt, batch_size=100, rowsPerArrowBatch="4")
    # 30 rows in at most two micro-batches of one partition each: 15 rows or more
    assert len(list((ckpt / "offsets").iterdir())) <= 2
    rows = written(spark, out)
    assert len(rows) == 30 and len(set(rows)) == 30
    assert {r[2] for r in rows} == {
        json.dumps({"id": str(i)}, separators=(",", ":")) for i in range(1, 31)
    }


def test_schema_and_types(spark: Any) -> None:  # noqa: F811
    df = (
        spark.readStream.format("canal")
        .option("server", "http://127.0.0.1:1")
        .option("destination", "example")
        .option("clientId", "c")
        .load()
    )
    assert df.isStreaming
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types == {name: kind.replace("bigint", "bigint") for name, kind in FIELDS}


def test_bad_option_fails_at_load(spark: Any) -> None:  # noqa: F811
    reader = spark.readStream.format("canal").option("destination", "example")
    with pytest.raises(Exception, match="clientId"):
        reader.option("etcd", "http://127.0.0.1:2379").load()
