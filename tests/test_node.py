"""Node processes: failover after SIGKILL, SIGTERM and restart, etcd registration,
config refused at start, TLS."""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, WAIT_S, NodeProc, node_cluster, wait_leader  # noqa: F401

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

DB = "t_node"
Cluster = Callable[..., list[NodeProc]]


@pytest.fixture
def table(sandbox: Sandbox) -> Iterator[Any]:
    p = sandbox.primary
    p.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY)",
    )
    yield p
    p.execute(f"DROP DATABASE IF EXISTS {DB}")


@pytest.fixture
def coord(sandbox: Sandbox) -> Iterator[EtcdCoordinator]:
    c = EtcdCoordinator(sandbox.etcd_endpoints, timeout_s=2.0)
    yield c
    c.close()


def base(client: str) -> str:
    return f"/v1/destinations/{DEST}/clients/{client}"


def ids_of(batch: dict[str, Any]) -> list[int]:
    return [
        next(c["value"] for c in r["after"] if c["name"] == "id")
        for e in batch["entries"]
        for r in e["rows"]
        if e["type"] == "ROWDATA"
    ]


def get_rows(http: httpx.Client, client: str, size: int = 3) -> dict[str, Any]:
    r = http.post(f"{base(client)}/batches", json={"size": size, "timeout_ms": 10_000})
    assert r.status_code == 200, r.text
    batch = dict(r.json())
    assert batch["id"] != -1
    return batch


def until_serving(node: NodeProc, path: str, body: Any) -> httpx.Response:
    """PUT ``path`` on ``node`` until it answers 200 (503 while it starts)."""
    out: list[httpx.Response] = []

    def ok() -> bool:
        with node.client() as http:
            r = http.put(path, json=body)
        out[:] = [r]
        return bool(r.status_code == 200)

    wait_until(ok, f"{node.id} serves", WAIT_S)
    return out[0]


def test_sigkill_leader_another_serves_and_clients_continue(
    node_cluster: Cluster,  # noqa: F811
    table: Any,
    coord: EtcdCoordinator,
) -> None:
    nodes = node_cluster(3, destination={"filter": {"regex": f"{DB}\\..*"}})
    old = wait_leader(nodes)
    keys = Keys(old.prefix)
    with old.client() as http:
        r = http.put(f"{base('c1')}/subscription", json={"filter": ""})
        old_epoch = int(r.headers["X-Canal-Epoch"])
        for i in range(1, 5):
            table.execute(f"INSERT INTO {DB}.t VALUES ({i})")
        seen: list[int] = []
        first = get_rows(http, "c1", size=3)  # BEGIN, row 1, END
        seen += ids_of(first)
        assert http.post(f"{base('c1')}/batches/{first['id']}/ack").status_code == 200
        pending = get_rows(http, "c1", size=3)  # kept outstanding across the failover
        assert ids_of(pending)
    mark = keys.mark(DEST, "c1", pending["id"])
    cursor_key = keys.cursor(DEST, "c1")
    wait_until(
        lambda: coord.get(mark) is not None and coord.get(cursor_key) is not None,
        "mark and cursor flushed",
        WAIT_S,
    )

    old.kill()
    new = wait_leader(nodes, exclude=[old])
    assert new is not old
    r = until_serving(new, f"{base('c1')}/subscription", {"filter": ""})
    assert int(r.headers["X-Canal-Epoch"]) > old_epoch
    with new.client() as http:
        again = http.get(f"{base('c1')}/batches/{pending['id']}", params={"timeout_ms": 20_000})
        assert again.status_code == 200, again.text
        assert ids_of(again.json()) == ids_of(pending)
        assert http.post(f"{base('c1')}/batches/{pending['id']}/ack").status_code == 200
        seen += ids_of(pending)
        while len(set(seen)) < 4:
            batch = get_rows(http, "c1", size=10)
            seen += ids_of(batch)
            assert http.post(f"{base('c1')}/batches/{batch['id']}/ack").status_code == 200
    assert seen == [1, 2, 3, 4]  # continued from the cursor: nothing lost, nothing twice
    health = new.health()
    assert health is not None and health["destinations"][DEST]["role"] == "leader"


def test_leader_killed_before_any_ack_loses_nothing(
    node_cluster: Cluster,  # noqa: F811
    table: Any,
    coord: EtcdCoordinator,
) -> None:
    """No cursor in etcd yet: the new leader starts at the destination's origin, not at
    the end of the binlog, so rows written while nobody had acked are delivered."""
    nodes = node_cluster(3, destination={"filter": {"regex": f"{DB}\\..*"}})
    old = wait_leader(nodes)
    origin_key = Keys(old.prefix).origin(DEST)
    wait_until(lambda: coord.get(origin_key) is not None, "origin recorded", WAIT_S)
    with old.client() as http:
        assert http.put(f"{base('c2')}/subscription", json={"filter": ""}).status_code == 200
    for i in range(1, 4):
        table.execute(f"INSERT INTO {DB}.t VALUES ({i})")
    old.kill()
    for i in range(4, 7):  # written while there is no leader
        table.execute(f"INSERT INTO {DB}.t VALUES ({i})")
    new = wait_leader(nodes, exclude=[old])
    until_serving(new, f"{base('c2')}/subscription", {"filter": ""})
    seen: list[int] = []
    with new.client() as http:
        while len(set(seen)) < 6:
            batch = get_rows(http, "c2", size=10)
            seen += ids_of(batch)
            assert http.post(f"{base('c2')}/batches/{batch['id']}/ack").status_code == 200
    assert seen == [1, 2, 3, 4, 5, 6]


def test_sigterm_exits_0_releases_and_restarts_cleanly(
    node_cluster: Cluster,  # noqa: F811
    coord: EtcdCoordinator,
) -> None:
    nodes = node_cluster(2)
    leader = wait_leader(nodes)
    keys = Keys(leader.prefix)
    with leader.client() as http:
        assert http.put(f"{base('s1')}/subscription", json={"filter": "x\\.y"}).status_code == 200
    assert leader.stop() == 0
    assert coord.get(keys.node(leader.id)) is None  # node lease revoked
    sub = coord.get(keys.subscription(DEST, "s1"))
    assert sub is not None and b"x\\\\.y" in sub.value  # final flush landed
    other = wait_leader(nodes, exclude=[leader])
    leader.restart()
    wait_until(lambda: coord.get(keys.node(leader.id)) is not None, "re-registered", WAIT_S)
    assert leader.role() == "standby"
    assert wait_leader(nodes) is other


def test_node_registers_and_re_registers_after_its_lease_is_lost(
    node_cluster: Cluster,  # noqa: F811
    coord: EtcdCoordinator,
) -> None:
    nodes = node_cluster(1)
    node = nodes[0]
    keys = Keys(node.prefix)
    kv = coord.get(keys.node(node.id))
    assert kv is not None and kv.lease
    assert coord.get(keys.destination_node(DEST, node.id)) is not None
    from canal_cluster.coordinator import Lease

    coord.revoke(Lease(kv.lease, 3))  # like an etcd outage longer than the TTL
    assert coord.get(keys.node(node.id)) is None

    def back() -> bool:
        again = coord.get(keys.node(node.id))
        return again is not None and again.lease != kv.lease

    wait_until(back, "node registered again", WAIT_S)
    assert coord.get(keys.destination_node(DEST, node.id)) is not None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[node]\nid = "n1"\n', "destinations"),
        ('[node]\nid = "bad id"\n[destinations.d]\nmaster.address = "h:1"\n', "node.id"),
        ('[node]\nid = "n"\n[destinations.d]\nmaster.address = "nohost"\n', "master.address"),
        ("not toml [", "--config"),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "canal_ha.cli", "server", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr


def test_tls_node_serves_https(node_cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    nodes = node_cluster(1, tls={"cert_file": str(cert), "key_file": str(key)})
    node = nodes[0]
    assert node.url.startswith("https://")
    r = httpx.get(f"{node.url}/v1/health", verify=ssl.create_default_context(cafile=cert))
    assert r.status_code == 200 and r.json()["url"] == node.url
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{node.port}/v1/health", timeout=5)
