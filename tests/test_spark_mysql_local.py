"""MySQL's binlog bytes through the Spark source (issue 17 with issue 16): a destination
whose ``local.dir`` holds copies of the MySQL fixture files (tests/fixtures/mysql) is
read by the ``canal`` source in map mode into parquet (an availableNow run). Every row
of the files arrives once, equal to the rows of the entries the local reader gives
directly (whose values tests/test_mysql_local.py checks against what MySQL wrote), and
a few of those values are checked here as the map mode's text. The typed mode needs
the leader's table route, which asks the database's ``information_schema``: a local
destination has no database, so the route refuses (400 naming ``table``) and a typed
query fails at load."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from mysql_fixtures import FIXTURES, SCHEMA, Run
from node_fixtures import NodeProc, node_cluster, wait_leader  # noqa: F401  (fixture)
from spark_fixtures import spark  # noqa: F401  (fixture)

from canal_client.spark import CanalOptions, fetch_table
from canal_client.spark.rows import FIELDS, entry_rows
from canal_protocol.errors import ConfigError

Cluster = Callable[..., list[NodeProc]]
# test_mysql_local_rest's files. The MySQL 8 compressed transaction's BEGIN, rows and
# XID all start at its TRANSACTION_PAYLOAD (274): their ``part`` tells them apart
FILES = [
    "ape__mysql-bin.000080",  # 5.7.40: GTIDs, names from schema.sql and the binlog DDL
    "canal__tsdb_mysql-bin.000003",  # 5.7.19: anonymous, ALTER TABLEs between rows
    "rmc__binlog-invisible-columns.000001",  # 8.0: invisible columns, unsigned; ends: STOP
    "rmc__mysql-enum-string-set.000001",  # 8.0.28: FULL metadata, ENUM/SET
    "rmc__mysql_type_bit.000001",  # 8.0: BIT(3), BIT(6)
    "rmc__transaction_compression.000001",  # 8.0.32: a zstd TRANSACTION_PAYLOAD
]
LAST = ("rmc__transaction_compression.000001", 431)
COMPARED = [n for n, _ in FIELDS if n != "commit_ts"]  # a timestamp: compared apart


def local_destination(node_cluster: Cluster, node_dir: Path) -> NodeProc:  # noqa: F811
    node_dir.mkdir()
    for name in FILES:
        shutil.copy(FIXTURES / name, node_dir / name)
    (node,) = node_cluster(
        1,
        destination={
            "local": {"dir": str(node_dir), "schema_file": str(SCHEMA), "poll_ms": 100},
            "master": {"address": "127.0.0.1:1", "journal_name": FILES[0], "position": 4},
        },
    )
    wait_leader([node])
    return node


def canal_stream(session: Any, node: NodeProc, client: str, **opts: str) -> Any:
    reader = (
        session.readStream.format("canal")
        .option("server", node.url)
        .option("destination", node.destination)
        .option("clientId", client)
        .option("pollTimeoutMs", "2000")
    )
    for key, value in opts.items():
        reader = reader.option(key, value)
    return reader.load()


def as_compared(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[n] for n in COMPARED)


@pytest.mark.timeout(600)
def test_mysql_fixture_files_through_the_spark_source_into_parquet(
    spark: Any,  # noqa: F811
    node_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    (tmp_path / "direct").mkdir()
    expected_entries = Run(tmp_path / "direct", FILES).until(LAST)
    node = local_destination(node_cluster, tmp_path / "node")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    names = [n for n, _ in FIELDS]
    want = [dict(zip(names, row, strict=True)) for e in expected_entries for row in entry_rows(e)]
    # the last file ends with a ROTATE: the run ends once everything before it is
    # taken (the binlog end is the reader's position then), not after a stall
    client = f"spark-mysql-{uuid.uuid4().hex[:6]}"
    df = canal_stream(spark, node, client, availableNowStallS="3600")
    writer = df.writeStream.format("parquet").option("path", str(out))
    query = writer.option("checkpointLocation", str(ckpt)).trigger(availableNow=True)
    running = query.start()
    try:
        assert running.awaitTermination(300), "the availableNow run did not end"
    finally:
        running.stop()
    assert running.exception() is None, running.exception()
    got = sorted(
        (r.asDict(recursive=True) for r in spark.read.parquet(str(out)).collect()),
        key=lambda r: (FILES.index(r["logfile"]), r["offset"], r["part"], r["row_index"]),
    )
    identity = {(r["logfile"], r["offset"], r["part"], r["snapshot"], r["row_index"]) for r in got}
    assert len(identity) == len(got)  # what names a change is unique
    assert len([r for r in want if not r["is_ddl"]]) == 7 + 21 + 3 + 3 + 1 + 1
    assert [as_compared(r) for r in got] == [as_compared(r) for r in want]
    assert [r["commit_ts"].timestamp() for r in got] == [r["commit_ts"].timestamp() for r in want]
    by_table: dict[str, list[dict[str, Any]]] = {}
    for r in got:
        if not r["is_ddl"]:
            by_table.setdefault(r["table"], []).append(r)
    a = "0123456789" * 12 + "012345678"  # test_mysql_local's values, as map text
    enum_set = by_table["t"][0]["after"]
    assert enum_set["f3"] == "var1" and enum_set["f4"] == "one,three"
    assert enum_set["f2"] == a * 2 + "0123456789" * 4
    assert [r["event_type"] for r in by_table["t"]] == ["INSERT", "UPDATE", "DELETE"]
    assert by_table["emoji"][0]["after"] == {"id": "2", "value": ""}
    wanshao = [r["after"] for r in by_table["wanshao_test"]]
    assert wanshao[2] == {"id": "37", "name": "more2", "age": "123", "col2": "123",
                          "col1": "555", "col3": "666"}  # fmt: skip
    assert [int(w["id"]) for w in wanshao] == list(range(35, 53))
    assert by_table["t1"][0]["after"] == {"f1": "1", "f2": "2", "f3": "-3", "f4": "4",
                                         "f5": "BQ==", "f6": "6000000000"}  # fmt: skip
    assert by_table["foo"][0]["after"] == {"a": "4", "b": "foo", "c": "32"}  # BIT(3) b'100'
    compressed = [r for r in got if r["logfile"] == FILES[-1]]
    assert [
        (r["table"], r["event_type"], r["after"], r["offset"], r["part"]) for r in compressed
    ] == [
        ("tb1", "INSERT", {"id": "1"}, 274, 3)  # the payload event's offset, its 3rd event
    ]
    assert {r["part"] for r in got if r["logfile"] != FILES[-1]} == {0}


def test_typed_mode_on_a_local_destination_is_refused_naming_the_table(
    node_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The table route asks the database's information_schema; a local destination has
    none: an immediate 400 naming ``table`` and the way out (map mode), not a retried
    503 about an unreachable database."""
    node = local_destination(node_cluster, tmp_path / "node")
    answer = httpx.get(f"{node.url}/v1/destinations/{node.destination}/tables/a.b", timeout=30)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["field"] == "table" and "local.dir" in body["message"]
    assert "map mode" in body["message"]
    opts = CanalOptions(
        destination=node.destination, client_id="typed-local", servers=(node.url,), table="a.b"
    )
    with pytest.raises(ConfigError, match=r"local\.dir") as info:
        fetch_table(opts)
    assert info.value.key == "table"
