"""Incremental snapshots through real nodes: the REST routes (bad input names the field,
307 on a standby), READ entries through the Python client, and the leader SIGKILLed
mid-snapshot under writers: the consumer's applied state still equals the source."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, NodeProc, node_cluster, wait_leader  # noqa: F401
from snapshot_fixtures import WAIT_S, Applier, Writers, table_rows

from canal_client.connector import ClusterConnector
from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox

DB = "t_snap_api"
KEYS = 4000


@pytest.fixture
def primary(sandbox: Sandbox) -> Iterator[Any]:
    p = sandbox.primary
    p.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(40))",
        f"INSERT INTO {DB}.t SELECT seq, seq, CONCAT('r', seq) FROM {DB}.seq_1_to_{KEYS}",
        f"CREATE TABLE {DB}.nokey (a INT)",
    )
    yield p
    p.execute(f"DROP DATABASE IF EXISTS {DB}")


def _path(snapshot_id: str = "") -> str:
    return f"/v1/destinations/{DEST}/snapshots" + (f"/{snapshot_id}" if snapshot_id else "")


def _error(r: httpx.Response, status: int, code: str, field: str | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error"] == code, body
    if field is not None:
        assert body["field"] == field, body


def test_rest_bad_input_redirect_and_read_entries_through_the_client(
    primary: Any,
    node_cluster: Callable[..., list[NodeProc]],  # noqa: F811
) -> None:
    # a small store: the snapshot waits for the consumer (the conflict below is certain)
    nodes = node_cluster(
        2, destination={"snapshot": {"chunk_rows": 500}, "memory": {"buffer_size": 20}}
    )
    leader = wait_leader(nodes)
    standby = next(n for n in nodes if n is not leader)
    with leader.client() as h, standby.client() as s:
        _error(h.post(_path(), json={"tables": ["(bad"]}), 400, "invalid_argument", "tables[0]")
        _error(h.post(_path(), json={"tables": []}), 400, "invalid_argument", "tables")
        _error(h.post(_path(), json={"tables": "t"}), 400, "invalid_argument", "tables")
        _error(h.post(_path(), json={"tables": [f"{DB}\\.x"]}), 404, "unknown_table", "tables[0]")
        r = h.post(_path(), json={"tables": [f"{DB}\\.nokey"]})
        _error(r, 400, "invalid_argument", "tables")
        assert f"{DB}.nokey" in r.json()["message"]
        _error(h.get(_path("s9")), 404, "unknown_snapshot", "snapshot_id")
        _error(h.delete(_path("s9")), 404, "unknown_snapshot", "snapshot_id")
        redirect = s.post(_path(), json={"tables": [f"{DB}\\.t"]})
        assert redirect.status_code == 307 and redirect.headers["location"].startswith(leader.url)
        conn = ClusterConnector(DEST, "c", servers=[n.url for n in nodes])
        with conn:
            consumer = Applier.over(conn, {f"{DB}.t": ("id",)})
            # paced: unpaced writers on a loaded machine outran the 20-entry store's
            # consumer by tens of thousands of changes before the wait below
            writers = Writers(primary, f"{DB}.t", KEYS + 100, rate=200).start()
            created = h.post(_path(), json={"tables": [f"{DB}\\.t"]})
            assert created.status_code == 201, created.text
            run = created.json()
            assert run["chunk_rows"] == 500 and run["tables_total"] == 1
            _error(h.post(_path(), json={"tables": [f"{DB}\\.T"]}), 409, "snapshot_conflict",
                   "tables")  # fmt: skip
            while h.get(_path(run["id"])).json()["state"] != "done":
                consumer.step(1000, 0.2)
            writers.stop()
            _wait_sunk(h, primary, consumer)
            consumer.drain()
        listed = h.get(_path()).json()["snapshots"]
        assert [x["id"] for x in listed] == [run["id"]] and listed[0]["tables_done"] == 1
        _error(h.delete(_path(run["id"])), 409, "snapshot_conflict", "snapshot_id")
    assert consumer.reads > 0
    assert consumer.tables[f"{DB}.t"] == table_rows(primary, DB, "t")


def _wait_sunk(h: httpx.Client, primary: Any, consumer: Applier) -> None:
    """Until the leader's reader has put the primary's current binlog end (consuming
    meanwhile: a full store would hold the reader back)."""
    journal, offset = primary.master_status()

    def sunk() -> bool:
        consumer.step(1000, 0.1)
        d = h.get("/v1/health").json()["destinations"][DEST]
        pos = d.get("reader_position") or {}
        return (pos.get("journal"), pos.get("offset", 0)) >= (journal, offset)

    wait_until(sunk, "the reader reached the binlog end", WAIT_S)


def test_leader_sigkill_mid_snapshot_under_writers(
    primary: Any,
    node_cluster: Callable[..., list[NodeProc]],  # noqa: F811
) -> None:
    dest = {"snapshot": {"chunk_rows": 20}, "memory": {"buffer_size": 100}}
    nodes = node_cluster(3, destination=dest)
    leader = wait_leader(nodes)
    retry = RetryPolicy(0.05, 1.0, WAIT_S)
    conn = ClusterConnector(DEST, "c", servers=[n.url for n in nodes], retry=retry)
    with conn, leader.client() as h:
        consumer = Applier.over(conn, {f"{DB}.t": ("id",)})
        # a chunk waits for the stream to reach its position: the consumer must keep up
        writers = Writers(primary, f"{DB}.t", KEYS + 100, rate=40).start()
        run = h.post(_path(), json={"tables": [f"{DB}\\.t"]}).json()
        wait_until(lambda: consumer.step(100, 0.2) >= 0 and consumer.reads >= KEYS // 3,
                   "a third of the rows read", WAIT_S)  # fmt: skip
        leader.kill()
        survivor = wait_leader(nodes, exclude=[leader])
        with survivor.client() as h2:
            while True:
                consumer.step(1000, 0.2)
                state = h2.get(_path(run["id"])).json()
                if state["state"] == "done":
                    break
            writers.stop()
            _wait_sunk(h2, primary, consumer)
            consumer.drain()
    assert state["tables_done"] == 1
    assert consumer.tables[f"{DB}.t"] == table_rows(primary, DB, "t")


def primary_etcd(node: NodeProc) -> list[str]:
    """The etcd endpoints of the node's config."""
    import tomllib

    return list(tomllib.loads(node.config_path.read_text())["etcd"]["endpoints"])


def _cli(*argv: str, timeout_s: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "canal_ha.cli", *argv],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def test_cli_snapshot_consume_status_and_metrics(
    primary: Any,
    node_cluster: Callable[..., list[NodeProc]],  # noqa: F811
) -> None:
    (node,) = node_cluster(1, destination={"snapshot": {"chunk_rows": 1000}})
    wait_leader([node])
    with node.client() as h:
        assert h.put(f"/v1/destinations/{DEST}/clients/c/subscription", json={}).is_success
    where = ("--server", node.url, "--destination", DEST)
    bad = _cli("snapshot", *where, "--tables", "(bad")
    assert bad.returncode == 2 and "tables[0]" in bad.stderr, bad
    done = _cli("snapshot", *where, "--tables", f"{DB}\\.t", "--interval", "0.2", "--timeout", "60")
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert lines[0].startswith("s1 ") and lines[-1].startswith("s1 done: tables 1/1, 4,000 rows")
    out = _cli("consume", *where, "--client-id", "c", "--format", "text", "--idle-exit", "3",
               "--no-exclusive")  # fmt: skip
    assert out.returncode == 0, out
    text = out.stdout.splitlines()
    assert any(f"BEGIN snapshot chunk of {DB}.t" in line for line in text), text[:3]
    assert any(f"READ {DB}.t [id=1, v=1, s='r1']" in line for line in text), text[:3]
    assert sum(" READ " in line for line in text) == 4 * 4  # 4 chunks of 1000: 256 rows an entry
    status = _cli("status", "--server", node.url)
    assert status.returncode == 0, status
    assert "SNAPSHOT s1         done       tables 1/1  rows 4,000  chunks 4" in status.stdout
    etcd = _cli("status", "--etcd", ",".join(primary_etcd(node)), "--prefix", node.prefix)
    assert "SNAPSHOT s1         done       tables 1/1  rows 4,000" in etcd.stdout, etcd
    metrics = httpx.get(f"{node.url}/metrics").text
    assert f'canal_snapshot_rows{{destination="{DEST}",snapshot="s1",state="done"}} 4000.0' in (
        metrics
    )
