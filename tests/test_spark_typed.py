"""The typed mode of the Spark source, without a SparkSession: the leader's table route,
and every MariaDB type decoded by the source's executor code into Arrow, compared value
by value with ``SELECT`` (a real node reading the sandbox primary)."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, NodeProc, node_cluster, wait_leader  # noqa: F401  (fixture)
from pyspark.sql.streaming.datasource import ReadAllAvailable

from canal_client.spark import CanalOptions, CanalStreamReader, fetch_table
from canal_client.spark.schema import TypedTable, column_kind, describe_change, shape_of
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.errors import ConfigError

COLUMNS = """
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT(11), iu INT UNSIGNED ZEROFILL,
  bi BIGINT, biu BIGINT UNSIGNED, bo BOOLEAN,
  d DECIMAL(30,10), dw DECIMAL(65,30), f FLOAT, dbl DOUBLE,
  dt DATE, tm TIME(6), tm0 TIME, dtm DATETIME(6), dtm3 DATETIME(3), ts TIMESTAMP(6) NULL,
  y YEAR, c CHAR(10), vc VARCHAR(40), tx TEXT, mt MEDIUMTEXT,
  b BINARY(4), vb VARBINARY(16), bl BLOB, lb LONGBLOB,
  e ENUM('a','b','c'), s SET('x','y','z'), bt BIT(12), b64 BIT(64), j JSON
"""
ROWS = [
    "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, 0,"
    " -12345678901234567890.0123456789,"
    " -99999999999999999999999999999999999.999999999999999999999999999999,"
    " -3.4e38, -1.7976931348623157e308, '0000-00-00', '-838:59:59.000000', '00:00:00',"
    " '0000-00-00 00:00:00', '1000-01-01 00:00:00.001', '1970-01-01 00:00:01.000001',"
    " 0, '', '', '', '', x'00', x'', x'', x'', 'a', '', b'0', b'0', '{}')",
    "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295,"
    " 9223372036854775807, 18446744073709551615, 1,"
    " 99999999999999999999.9999999999, 0.000000000000000000000000000001,"
    " 1.1, 2.2, '9999-12-31', '838:59:59.999999', '-00:00:01',"
    " '9999-12-31 23:59:59.999999', '2024-02-29 12:34:56.789', '2038-01-19 03:14:07.999999',"
    " 2155, 'chars', 'héllo 😀', 'text 😀', 'medium', x'00010000', x'00ff00', x'000102',"
    " x'ff00', 'c', 'x,z', b'100000000001', 18446744073709551615,"
    " '{\"a\": [1, 2.5], \"b\": null}')",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(4, 0, 1, -1, 1, 0, 1, 0, 1, 0, 1, 1, 0, -0.5, 0, -0.0001, '2020-00-00', '00:00:00.5', "
    " '12:34:56', '2020-02-03 04:05:06.000100', '2020-02-03 04:05:06.100',"
    " '2001-02-03 04:05:06.5', 1901, 'a b', 'x', 'y', 'z', x'41', x'42', x'43', x'44',"
    " 'b', 'y', b'1', 1, '[1, \"two\"]')",
]  # fmt: skip
ZERO_DATES = {1: {"dt": "0000-00-00", "dtm": "0000-00-00T00:00:00.000000"}, 4: {"dt": "2020-00-00"}}


def _prepare(box: Sandbox, db: str) -> None:
    box.primary.execute(
        f"CREATE DATABASE {db}",
        "SET SESSION sql_mode = ''",
        f"CREATE TABLE {db}.t ({COLUMNS}) DEFAULT CHARSET=utf8mb4",
    )
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"INSERT INTO {db}.t VALUES {', '.join(ROWS)}")
        cur.execute(f"UPDATE {db}.t SET vc = 'changed', tiu = tiu + 1 WHERE id IN (1, 4)")
        cur.execute(f"DELETE FROM {db}.t WHERE id = 3")


def _select(box: Sandbox, db: str) -> dict[int, dict[str, Any]]:
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT * FROM {db}.t ORDER BY id")
        names = [d[0] for d in cur.description]
        return {int(r[0]): dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def _expected(name: str, kind: str, v: Any) -> Any:
    """What the typed stream must hold for a SELECT value (zero dates: None)."""
    if v is None:
        return None
    if kind in ("date", "datetime") and isinstance(v, str):  # pymysql: an invalid date
        return None
    if kind == "u64":
        return Decimal(int.from_bytes(v, "big")) if isinstance(v, bytes) else Decimal(v)
    if kind == "int64" and isinstance(v, bytes):  # BIT
        return int.from_bytes(v, "big")
    if kind == "text":  # DECIMAL(65,30): the exact text
        return Decimal(v)
    if kind == "float":
        return struct.unpack("<f", struct.pack("<f", v))[0]
    if kind == "timestamp":
        return v.replace(tzinfo=UTC)
    if kind == "set":
        return sorted(v) if isinstance(v, set) else sorted(v.split(",") if v else [])
    return v


def _got(kind: str, v: Any) -> Any:
    if kind == "text" and v is not None:
        return Decimal(v)
    if kind == "set" and v is not None:
        return sorted(v)
    return v


def _reader(box: Sandbox, nodes: list[NodeProc], table: str) -> CanalStreamReader:
    opts = CanalOptions(
        destination=DEST, client_id=f"typed-{uuid.uuid4().hex[:6]}",
        etcd=tuple(box.etcd_endpoints), etcd_prefix=nodes[0].prefix, poll_timeout_s=2.0,
        table=table, rows_per_partition=3,
    )  # fmt: skip
    return CanalStreamReader(opts, typed=fetch_table(opts))


def _drain(reader: CanalStreamReader, want: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    start = reader.initialOffset()

    def more() -> bool:
        nonlocal start
        end = reader.latestOffset(start, ReadAllAvailable())
        for part in reader.partitions(start, end):
            rows.extend(r for b in reader.read(part) for r in b.to_pylist())
        start = end
        return len(rows) >= want

    wait_until(more, f"{want} typed rows", 60)
    reader.stop()
    return rows


def test_every_type_arrives_typed_and_equal_to_select(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
) -> None:
    db = f"t_typed_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1)
    leader = wait_leader(nodes)
    _prepare(sandbox, db)
    reader = _reader(sandbox, nodes, f"{db}.t")
    table = reader.typed
    assert table is not None and table.primary_key == ("id",)
    kinds = dict(table.shape)
    assert kinds["biu"] == "u64" and kinds["dw"] == "text" and kinds["tm"] == "time"
    assert kinds["d"] == "decimal(30,10)" and kinds["s"] == "set" and kinds["b64"] == "u64"
    everything = _drain(reader, 8)
    assert [r["event_type"] for r in everything if r["is_ddl"]] == ["CREATE"]
    rows = [r for r in everything if not r["is_ddl"]]
    assert [(r["event_type"], (r["after"] or r["before"])["id"]) for r in rows] == [
        ("INSERT", 1), ("INSERT", 2), ("INSERT", 3), ("INSERT", 4),
        ("UPDATE", 1), ("UPDATE", 4), ("DELETE", 3),
    ]  # fmt: skip
    final = {r["after"]["id"]: r for r in rows if r["event_type"] == "UPDATE"}
    final[2] = rows[1]
    selected = _select(sandbox, db)
    assert sorted(final) == sorted(selected) == [1, 2, 4]
    for key, want in selected.items():
        got = final[key]["after"]
        for name, kind in table.shape:
            assert _got(kind, got[name]) == _expected(name, kind, want[name]), (key, name)
        raw = dict(final[key]["raw"] or [])
        sides = ("before", "after") if final[key]["before"] else ("after",)
        zeros = ZERO_DATES.get(key, {}).items()
        assert raw == {f"{side}.{c}": text for side in sides for c, text in zeros}
        image = final[key]["after"]
        assert all(image[c] is None for c, _ in zeros)
    deleted = rows[6]["before"]
    assert rows[6]["after"] is None and deleted["id"] == 3
    assert all(v is None for k, v in deleted.items() if k != "id")
    assert rows[6]["primary_key"] == '{"id":"3"}' and rows[6]["raw"] is None
    assert rows[0]["after"]["tm"] == -timedelta(hours=838, minutes=59, seconds=59)
    assert rows[1]["after"]["dt"] == date(9999, 12, 31)
    assert rows[1]["after"]["dtm"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert rows[1]["after"]["s"] == ["x", "z"] and rows[4]["primary_key"] == '{"id":"1"}'
    assert rows[4]["before"]["tiu"] == 0 and rows[4]["after"]["tiu"] == 1
    _check_route(leader, db, sandbox)


def _check_route(leader: NodeProc, db: str, box: Sandbox) -> None:
    """The route's mysql_types are the entries' notation, value for value."""
    with httpx.Client(base_url=leader.url, timeout=10) as http:
        r = http.get(f"/v1/destinations/{DEST}/tables/{db}.t")
        assert r.status_code == 200, r.text
        answer = r.json()
        cid = f"/v1/destinations/{DEST}/clients/route-check"
        assert http.put(f"{cid}/subscription", json={"start": "earliest"}).status_code == 200
        body = {"size": 1000, "timeout_ms": 5000, "layout": "compact"}
        entries = http.post(f"{cid}/batches", json=body).json()["entries"]
        mine = [e for e in entries if e.get("columns") and e["header"]["schema"] == db]
        assert mine, entries[:3]
        assert [c["mysql_type"] for c in answer["columns"]] == mine[0]["columns"]["mysql_types"]
        assert [c["name"] for c in answer["columns"]] == mine[0]["columns"]["names"]
        assert answer["primary_key"] == ["id"] and len(answer["version"]) == 16
        nullable = {c["name"]: c["nullable"] for c in answer["columns"]}
        assert nullable["id"] is False and nullable["ti"] is True
        r = http.get(f"/v1/destinations/{DEST}/tables/{db}.nothing")
        assert r.status_code == 404 and r.json()["error"] == "unknown_table"
        r = http.get(f"/v1/destinations/{DEST}/tables/nodot")
        assert r.status_code == 400 and r.json()["field"] == "table"
        schema = http.get("/openapi.json").json()
        get = schema["paths"]["/v1/destinations/{destination}/tables/{table}"]["get"]
        assert "TableOut" in str(get["responses"]["200"]) and "404" in get["responses"]


def test_an_unknown_table_fails_at_load_naming_the_option(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
) -> None:
    nodes = node_cluster(2)
    leader = wait_leader(nodes)
    standby = next(n for n in nodes if n is not leader)
    opts = CanalOptions(
        destination=DEST, client_id="x", servers=(standby.url,), table="nope.nothing"
    )
    with pytest.raises(ConfigError, match=r"nope\.nothing: no such table") as info:
        fetch_table(opts)  # through the standby's 307
    assert info.value.key == "table"


def test_kinds_shapes_and_changes() -> None:
    assert column_kind("int unsigned") == "int64"
    assert column_kind("decimal(38,2)") == "decimal(38,2)"
    assert column_kind("decimal(39,2)") == "text" and column_kind("bit(63)") == "int64"
    assert column_kind("varchar(20)") == column_kind("varchar(40)") == "string"
    with pytest.raises(ValueError, match="uuid"):
        column_kind("uuid")
    old = shape_of(["id", "qty", "price"], ["int", "int", "decimal(10,2)"])
    new = shape_of(["id", "price", "note"], ["int", "decimal(12,2)", "varchar(9)"])
    assert describe_change(old, new, ["int", "decimal(12,2)", "varchar(9)"]) == (
        "added note (varchar(9)), dropped qty, changed price: decimal(10,2) -> decimal(12,2)"
    )
    wire = {"schema": "s", "table": "t", "columns": [{"name": "u", "mysql_type": "uuid",
                                                      "is_key": False}]}  # fmt: skip
    with pytest.raises(ConfigError, match=r"s\.t\.u: .*map mode"):
        TypedTable.from_wire(wire)
