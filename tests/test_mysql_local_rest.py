"""MySQL's binlog bytes through a whole node: a destination whose ``local.dir`` holds the
fixture files delivers every row over REST, with the entries and positions the local
reader gives directly (tests/test_mysql_local.py checks those values)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from mysql_fixtures import FIXTURES, SCHEMA, Run, rest_entries, rows, spans
from node_fixtures import WAIT_S, NodeProc, node_cluster, wait_leader  # noqa: F401

from canal_cluster.retry import wait_until

Cluster = Callable[..., list[NodeProc]]
FILES = [
    "ape__mysql-bin.000080",  # 5.7.40: GTIDs, names from schema.sql and the binlog DDL
    "canal__tsdb_mysql-bin.000003",  # 5.7.19: anonymous, ALTER TABLEs between rows
    "rmc__binlog-invisible-columns.000001",  # 8.0: invisible columns, unsigned; ends: STOP
    "rmc__mysql-enum-string-set.000001",  # 8.0.28: FULL metadata, ENUM/SET
    "rmc__mysql_type_bit.000001",  # 8.0: BIT(3), BIT(6)
    "rmc__transaction_compression.000001",  # 8.0.32: a zstd TRANSACTION_PAYLOAD
]
LAST = ("rmc__transaction_compression.000001", 431)


def test_local_destination_serves_every_row_over_rest(
    node_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    direct_dir, node_dir = tmp_path / "direct", tmp_path / "node"
    direct_dir.mkdir()
    node_dir.mkdir()
    expected = Run(direct_dir, FILES).until(LAST)
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
    got = rest_entries(node.url, node.destination, "mysql-fixtures", LAST[1])
    assert list(rows(got)) == list(rows(expected))
    assert len(list(rows(got))) == 7 + 21 + 3 + 3 + 1 + 1
    assert spans(got) == spans(expected)
    health = node.health()
    assert health is not None
    reader = health["destinations"][node.destination]["reader"]
    assert reader["state"] == "running"


def test_health_of_a_local_destination_checks_its_directory(
    node_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A ``local.dir`` destination has no database to ask: /v1/health's ``database`` says
    whether its directory is readable, on the leader and on a standby alike."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    shutil.copy(FIXTURES / FILES[0], node_dir / FILES[0])
    destination = {
        "local": {"dir": str(node_dir), "schema_file": str(SCHEMA), "poll_ms": 100},
        "master": {"address": "127.0.0.1:1", "journal_name": FILES[0], "position": 4},
    }
    nodes = node_cluster(2, destination=destination)
    wait_leader(nodes)
    for node in nodes:
        health = node.health()
        assert health is not None
        db = health["destinations"][node.destination]["database"]
        assert db == {"reachable": True, "address": f"local:{node_dir}", "error": ""}, db
    shutil.rmtree(node_dir)
    deadline = time.monotonic() + 30
    while True:  # the check is cached for about a second
        health = nodes[0].health()
        assert health is not None
        db = health["destinations"][nodes[0].destination]["database"]
        if not db["reachable"]:
            break
        assert time.monotonic() < deadline, db
        time.sleep(0.5)
    assert str(node_dir) in db["error"] and "not a directory" in db["error"]


COMPRESSED = "rmc__transaction_compression.000001"  # BEGIN, rows (tb1 id 1), END in one payload


def _kinds(batch: dict[str, Any]) -> list[str]:
    return [e["type"] for e in batch["entries"]]


def _take(http: httpx.Client, base: str, size: int) -> dict[str, Any]:
    r = http.post(f"{base}/batches", json={"size": size, "timeout_ms": 2_000})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _subscribe(node: NodeProc, base: str) -> None:
    def ok() -> bool:
        with node.client() as http:
            r = http.put(f"{base}/subscription", json={"start": "earliest"})
            return bool(r.status_code == 200)

    wait_until(ok, f"{node.id} serves the subscription", WAIT_S)


def _rest(node: NodeProc, base: str, want: int, wait_s: float = 30) -> list[dict[str, Any]]:
    """Every entry the client gets (acking each batch) until ``want`` came or ``wait_s``
    passed (then the test fails on what came)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait_s
    with node.client() as http:
        while len(got) < want and time.monotonic() < deadline:
            batch = _take(http, base, 10)
            if batch["id"] != -1:
                got += batch["entries"]
                assert http.post(f"{base}/batches/{batch['id']}/ack").status_code == 200
    return got


def _ack_begin(node: NodeProc, base: str) -> dict[str, Any]:
    """Take the BEGIN alone and ack it; the batch."""
    with node.client() as http:
        first = _take(http, base, 1)
        assert _kinds(first) == ["TRANSACTIONBEGIN"]
        assert first["entries"][0]["header"]["part"] == 1
        assert http.post(f"{base}/batches/{first['id']}/ack").status_code == 200
    return first


def _rows_and_end(entries: list[dict[str, Any]]) -> None:
    assert [e["type"] for e in entries] == ["ROWDATA", "TRANSACTIONEND"], entries
    assert entries[0]["rows"][0]["after"][0]["value"] == 1  # tb1 id 1


def test_a_cursor_inside_a_compressed_transaction_gets_exactly_the_rest(
    node_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Every entry of a MySQL 8 compressed transaction used to carry the payload's one
    position: a client that acked its BEGIN had a cursor after the whole transaction.
    Now each entry has its place (``part``). Client a acks the BEGIN, takes the rows and
    rolls back: it gets the rows and END again. Client b acks the BEGIN only, then the
    node restarts (cursors read back from etcd, the reader moved back to the
    transaction's GTID event): b gets exactly the rows and END, a nothing twice."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    shutil.copy(FIXTURES / COMPRESSED, node_dir / COMPRESSED)
    (node,) = node_cluster(
        1,
        destination={
            "local": {"dir": str(node_dir), "schema_file": str(SCHEMA), "poll_ms": 100},
            "master": {"address": "127.0.0.1:1", "journal_name": COMPRESSED, "position": 4},
        },
    )
    wait_leader([node])
    a, b = (f"/v1/destinations/{node.destination}/clients/{c}" for c in "ab")
    for base in (a, b):
        _subscribe(node, base)
    for base in (a, b):
        assert _ack_begin(node, base)["end"]["position"]["part"] == 1  # inside the payload
    with node.client() as http:
        assert _kinds(_take(http, a, 1)) == ["ROWDATA"]
        assert http.post(f"{a}/rollback").status_code == 200
    _rows_and_end(_rest(node, a, 2))
    node.stop()
    node.restart()
    wait_leader([node])
    for base in (a, b):
        _subscribe(node, base)
    _rows_and_end(_rest(node, b, 2))
    assert _rest(node, a, 1, wait_s=5) == []  # nothing twice
