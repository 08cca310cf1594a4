"""Node processes: failover after SIGKILL, SIGTERM and restart, etcd registration,
config refused at start, TLS."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, WAIT_S, NodeProc, fresh_database, node_cluster, wait_leader  # noqa: F401
from node_fixtures import client_path as base
from node_fixtures import json_row_ids as ids_of

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.meta import ClientMeta, MetaSnapshot
from canal_server.meta.periodic import encode_meta

DB = "t_node"
Cluster = Callable[..., list[NodeProc]]


@pytest.fixture
def table(sandbox: Sandbox) -> Iterator[Any]:
    with fresh_database(sandbox.primary, DB) as p:
        yield p


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


def _seed_meta(
    coord: EtcdCoordinator,
    prefix: str,
    origin: LogPosition | None,
    cursors: dict[str, LogPosition | None],
) -> None:
    """Write a destination's meta into etcd as an earlier leader would have left it."""
    clients = {c: ClientMeta(cursor=cursor) for c, cursor in cursors.items()}
    snapshot = MetaSnapshot(DEST, MappingProxyType(clients), origin=origin)
    for key, value in encode_meta(Keys(prefix), snapshot).items():
        coord.put(key, value)


def _db_clock_ms(sandbox: Sandbox) -> int:
    return int(sandbox.primary.scalar("SELECT UNIX_TIMESTAMP()")) * 1000


def _stored_origin(coord: EtcdCoordinator, prefix: str) -> LogPosition | None:
    kv = coord.get(Keys(prefix).origin(DEST))
    return LogPosition.from_dict(json.loads(kv.value)) if kv is not None else None


def _reader_of(node: NodeProc) -> dict[str, Any]:
    health = node.health()
    return dict(health["destinations"][DEST]["reader"]) if health else {}


def test_origin_is_recorded_with_the_database_time(
    node_cluster: Cluster,  # noqa: F811
    coord: EtcdCoordinator,
    sandbox: Sandbox,
) -> None:
    """Time fallback (another source) needs the origin's time; 0 would pin it for good."""
    before = _db_clock_ms(sandbox)
    leader = wait_leader(node_cluster(1))
    wait_until(lambda: _stored_origin(coord, leader.prefix) is not None, "origin", WAIT_S)
    origin = _stored_origin(coord, leader.prefix)
    assert origin is not None
    assert origin.identity.source_address == f"127.0.0.1:{sandbox.primary.port}"
    assert before <= origin.position.timestamp_ms <= _db_clock_ms(sandbox), origin


def test_origin_without_time_on_another_source_starts_anew_and_says_so(
    node_cluster: Cluster,  # noqa: F811
    coord: EtcdCoordinator,
    sandbox: Sandbox,
    table: Any,
) -> None:
    """An origin recorded without a time (older versions) on a source that is gone, held
    by a client that never acked: the leader starts anew instead of failing for good,
    and says so in /v1/health and its log."""
    prefix = f"/t{uuid.uuid4().hex[:12]}"
    gone = LogPosition(LogIdentity("127.0.0.1:1"), EntryPosition("mariadb-bin.000001", 4, 1))
    _seed_meta(coord, prefix, gone, {"early": None})
    regex = {"filter": {"regex": f"{DB}\\..*"}}
    nodes = node_cluster(1, etcd={"prefix": prefix}, destination=regex)
    leader = wait_leader(nodes)
    warning = _reader_of(leader)["warning"]
    assert "127.0.0.1:1" in warning and "early" in warning, warning
    origin = _stored_origin(coord, prefix)
    assert origin is not None and origin != gone
    assert origin.identity.source_address == f"127.0.0.1:{sandbox.primary.port}"
    assert origin.position.timestamp_ms > 0
    assert "ERROR" in leader.log_tail(200) and "127.0.0.1:1" in leader.log_tail(200)
    for i in (1, 2):
        table.execute(f"INSERT INTO {DB}.t VALUES ({i})")
    seen: list[int] = []
    with leader.client() as http:
        while len(seen) < 2:
            batch = get_rows(http, "early", size=10)
            seen += ids_of(batch)
            assert http.post(f"{base('early')}/batches/{batch['id']}/ack").status_code == 200
    assert seen == [1, 2]


def test_cursor_that_cannot_be_found_names_its_client_until_unsubscribed(
    node_cluster: Cluster,  # noqa: F811
    coord: EtcdCoordinator,
    sandbox: Sandbox,
) -> None:
    """An acked cursor whose binlog is gone: no silent skip; /v1/health names the client
    and the way forward, and unsubscribing it lets the leader read again."""
    prefix = f"/t{uuid.uuid4().hex[:12]}"
    here = LogIdentity(f"127.0.0.1:{sandbox.primary.port}")
    purged = LogPosition(here, EntryPosition("mariadb-bin.000000", 4, 1, "", 1000))
    _seed_meta(coord, prefix, None, {"stuck": purged})
    nodes = node_cluster(1, etcd={"prefix": prefix})
    node = nodes[0]

    def failed() -> bool:
        return bool(_reader_of(node).get("state") == "failed")

    wait_until(failed, "the reader reports the lost cursor", WAIT_S)
    reader = _reader_of(node)
    assert reader["error_type"] == "PurgedPosition"
    assert "'stuck'" in reader["error"], reader
    assert f"DELETE /v1/destinations/{DEST}/clients/stuck/subscription" in reader["error"]
    with node.client() as http:
        assert http.delete(f"{base('stuck')}/subscription").status_code == 200
    assert wait_leader(nodes) is node


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


def test_the_unsubscribe_hint_names_every_client_and_where_it_starts_again() -> None:
    from canal_server.instance import _unsubscribe_hint

    one = _unsubscribe_hint("d", ["a"])
    assert "acked cursor of client 'a'" in one and "unsubscribe it " in one
    two = _unsubscribe_hint("d", ["a", "b"])
    assert "acked cursors of clients 'a', 'b'" in two and "unsubscribe them " in two
    assert "DELETE /v1/destinations/d/clients/b/subscription" in two
    for hint in (one, two):  # a new subscription starts where its `start` says
        assert "origin" not in hint and "latest" in hint, hint
