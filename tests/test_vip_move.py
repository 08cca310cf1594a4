"""A VIP moves to another database: same address, another server behind it.

The destination's ``master.address`` is one host:port; the database answering there is
replaced by its (promoted) replica, whose binlog has other file numbers and offsets for
the same transactions. Positions read before and after the move must not be compared
by offset as if they came from one server: not by the minimum-cursor rule of a new
leader, not by the store deciding what lies after a client's cursor.

Real MariaDB primary + GTID replica (a private sandbox), etcd and node processes; the
move is the replica restarted on the primary's port after the primary was killed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SandboxFactory
from node_fixtures import (
    DEST,
    WAIT_S,
    NodeProc,
    client_path,
    json_row_ids,
    start_nodes,
    wait_leader,
)

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_protocol.positions import LogPosition, journal_seq

DB = "t_vip"
ROTATIONS = 4  # the primary's binlog numbers run ahead of the replica's


@pytest.fixture
def box(make_sandbox: SandboxFactory) -> Sandbox:
    box = make_sandbox(standby=True)
    box.primary.execute(f"CREATE DATABASE {DB}", f"CREATE TABLE {DB}.t (id INT PRIMARY KEY)")
    box.replica.wait_caught_up(box.primary)
    for _ in range(ROTATIONS):  # FLUSH BINARY LOGS is not replicated
        box.primary.execute("FLUSH BINARY LOGS")
    return box


@pytest.fixture
def nodes(box: Sandbox, tmp_path: Path) -> Iterator[list[NodeProc]]:
    dest = {"filter": {"regex": f"{DB}\\..*"}, "fallback_interval_s": 2}
    started = start_nodes(box, 2, tmp_path, destination=dest)
    try:
        yield started
    finally:
        for node in started:
            node.process.stop(timeout_s=20)


def _subscribe(node: NodeProc, client: str) -> None:
    def ok() -> bool:
        with node.client() as http:
            return bool(http.put(f"{client_path(client)}/subscription", json={}).status_code == 200)

    wait_until(ok, f"{node.id} serves {client}", WAIT_S)


def _read_until(node: NodeProc, client: str, want: set[int], timeout_s: float) -> list[int]:
    """Rows the client gets (acking each batch) until it has every id of ``want``;
    gives up after ``timeout_s`` and returns what it got."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    with node.client() as http:
        while not want <= set(got) and time.monotonic() < deadline:
            r = http.post(f"{client_path(client)}/batches", json={"size": 10, "timeout_ms": 2_000})
            if r.status_code != 200:
                time.sleep(0.2)  # 503 while the leader starts
                continue
            batch = r.json()
            if batch["id"] == -1:
                continue
            got += json_row_ids(batch)
            assert http.post(f"{client_path(client)}/batches/{batch['id']}/ack").status_code == 200
    return got


def _cursor(coord: EtcdCoordinator, prefix: str, client: str) -> LogPosition | None:
    kv = coord.get(Keys(prefix).cursor(DEST, client))
    return LogPosition.from_dict(json.loads(kv.value)) if kv is not None else None


def _flushed(coord: EtcdCoordinator, node: NodeProc, client: str) -> LogPosition:
    """The client's cursor once etcd has what the leader has."""
    with node.client() as http:
        want = http.get(f"{client_path(client)}/cursor").json()["cursor"]

    def same() -> bool:
        got = _cursor(coord, node.prefix, client)
        return got is not None and got.to_dict() == want

    wait_until(same, f"cursor of {client} in etcd", WAIT_S)
    cursor = _cursor(coord, node.prefix, client)
    assert cursor is not None
    return cursor


def _move_vip(box: Sandbox) -> MariaDBServer:
    """Kill the primary; promote the replica and restart it on the primary's port."""
    primary, replica = box.primary, box.replica
    primary.kill()
    replica.promote()
    replica.stop()
    moved = MariaDBServer("moved", replica.root, replica.server_id, primary.port)
    moved.start()
    box.add_process(moved.process)
    return moved


def test_vip_moved_to_the_replica_loses_nothing_for_a_lagging_client(
    box: Sandbox, nodes: list[NodeProc]
) -> None:
    """Client x acked everything on the primary, then falls behind; client y reads on
    after the move. A new leader must still give x every row written after the move."""
    coord = EtcdCoordinator(box.etcd_endpoints, timeout_s=2.0)
    try:
        first = wait_leader(nodes)
        for client in ("x", "y"):
            _subscribe(first, client)
        for i in (1, 2, 3):
            box.primary.execute(f"INSERT INTO {DB}.t VALUES ({i})")
        assert _read_until(first, "x", {1, 2, 3}, WAIT_S) == [1, 2, 3]
        x_cursor = _flushed(coord, first, "x")

        moved = _move_vip(box)
        assert journal_seq(moved.master_status()[0]) < journal_seq(x_cursor.journal), (
            "premise: the replica's binlog numbers are behind the primary's"
        )
        for i in (4, 5, 6):
            moved.execute(f"INSERT INTO {DB}.t VALUES ({i})")
        assert {4, 5, 6} <= set(_read_until(first, "y", {4, 5, 6}, WAIT_S))
        y_cursor = _flushed(coord, first, "y")
        assert y_cursor.identity.source_address == x_cursor.identity.source_address

        first.kill()
        second = wait_leader(nodes, exclude=[first])
        moved.execute(f"INSERT INTO {DB}.t VALUES (7)")
        _subscribe(second, "x")
        x_got = _read_until(second, "x", {4, 5, 6, 7}, 30)
        y_got = _read_until(second, "y", {7}, 30)
    finally:
        coord.close()
    assert {4, 5, 6, 7} <= set(x_got), (
        f"x (cursor {x_cursor.position} read on the old server) got {x_got} from the new "
        f"leader; y's cursor is {y_cursor.position}"
    )
    assert y_got == [7], y_got
