"""A get that acknowledges the batch before it (``ack`` on ``POST .../batches``): one
round trip less per batch, the same duplicate rules as a separate ack (docs/guarantees.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from client_fixtures import FakeCluster, entry_wire
from node_fixtures import DEST, NodeProc, fresh_database, node_cluster, wait_leader

from canal_client.connector import ClusterConnector, SimpleConnector
from canal_cluster.retry import RetryPolicy
from canal_ha.sandbox import Sandbox
from canal_protocol.errors import UnknownBatch

__all__ = ["node_cluster"]  # the fixture, used by name

DB = "ackget"
A = "http://127.0.0.1:9"


def _path(client: str, rest: str = "") -> str:
    return f"/v1/destinations/{DEST}/clients/{client}{rest}"


def _ids_of(batch: dict[str, Any]) -> list[int]:
    return [
        int(c["value"])
        for e in batch["entries"]
        if e["type"] == "ROWDATA"
        for r in e["rows"]
        for c in r["after"]
        if c["name"] == "id"
    ]


def _one_row_batches(http: httpx.Client, client: str, n: int, **extra: Any) -> list[Any]:
    """``n`` non-empty batches of one entry each (gets of size 1)."""
    out: list[Any] = []
    while len(out) < n:
        body = {"size": 1, "timeout_ms": 5000, **extra}
        r = http.post(_path(client, "/batches"), json=body)
        assert r.status_code == 200, r.text
        assert r.json()["id"] != -1, f"only {len(out)} of {n} batches arrived"
        if _ids_of(r.json()):
            out.append(r.json())
    return out


def test_get_with_ack_acknowledges_first(
    sandbox: Sandbox, node_cluster: Callable[..., list[NodeProc]]
) -> None:
    leader = wait_leader(node_cluster(1, destination={"filter": {"regex": f"{DB}\\..*"}}))
    with fresh_database(sandbox.primary, DB) as db, leader.client() as http:
        assert http.put(_path("a", "/subscription"), json={}).status_code == 200
        db.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(1, 5)))
        (first,) = _one_row_batches(http, "a", 1)
        body = {"size": 1, "timeout_ms": 5000, "ack": first["id"], "request_id": "g2"}
        second = http.post(_path("a", "/batches"), json=body)
        assert second.status_code == 200 and second.json()["id"] > first["id"], second.text
        # the first batch is acknowledged: no longer outstanding, the cursor is past it
        assert http.get(_path("a", f"/batches/{first['id']}")).status_code == 404
        assert http.post(_path("a", f"/batches/{first['id']}/ack")).status_code == 409
        cursor = http.get(_path("a", "/cursor")).json()["cursor"]
        assert cursor == first["end"]
        # a retry of that get (lost answer): the same batch, its ack a no-op
        again = http.post(_path("a", "/batches"), json=body)
        assert again.status_code == 200 and again.json()["id"] == second.json()["id"]
        # a batch never issued: 409 naming it; the outstanding batch stays
        bad = http.post(_path("a", "/batches"), json={"size": 1, "ack": 10**6})
        assert bad.status_code == 409 and bad.json()["error"] == "batch_not_outstanding"
        assert http.get(_path("a", f"/batches/{second.json()['id']}")).status_code == 200
        zero = http.post(_path("a", "/batches"), json={"size": 1, "ack": 0})
        assert zero.status_code == 400 and zero.json()["field"] == "ack"
        # a rolled-back batch: the ack is a no-op, its entries come again
        assert http.post(_path("a", "/rollback")).status_code == 200
        body = {"size": 50, "timeout_ms": 5000, "ack": second.json()["id"]}
        redo = http.post(_path("a", "/batches"), json=body)
        assert redo.status_code == 200 and _ids_of(redo.json()) == [2, 3, 4], redo.text
        assert http.get(_path("a", "/cursor")).json()["cursor"] == first["end"]


class _Counting(httpx.HTTPTransport):
    """A real transport that records each request's method and path."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        return super().handle_request(request)


def test_connector_acks_on_the_next_get_without_an_ack_request(
    sandbox: Sandbox, node_cluster: Callable[..., list[NodeProc]]
) -> None:
    leader = wait_leader(node_cluster(1, destination={"filter": {"regex": f"{DB}\\..*"}}))
    transport = _Counting()
    with (
        fresh_database(sandbox.primary, DB) as db,
        SimpleConnector(leader.url, DEST, "c", transport=transport) as conn,
    ):
        conn.subscribe()
        db.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(1, 21)))
        seen: list[int] = []
        done: int | None = None
        while len(seen) < 20:
            batch = conn.get_without_ack(3, 5.0, ack=done)
            assert not batch.is_empty, f"only {len(seen)} of 20 rows arrived"
            seen += [int(str(r.after[0].value)) for e in batch.entries for r in e.rows]
            done = batch.id
        assert seen == list(range(1, 21))  # in order, each once
        assert not [p for m, p in transport.requests if p.endswith("/ack")]
        assert done is not None
        conn.ack(done)  # the last one on its own
        assert batch.end is not None and conn.cursor() == batch.end.to_dict()
        try:
            conn.ack(done)
        except UnknownBatch:
            pass
        else:
            raise AssertionError("the batch acked twice")
        # nothing outstanding, nothing new: an empty batch; no row is delivered twice
        assert conn.get_without_ack(10, 0.2, ack=done).is_empty


class _OlderServer(FakeCluster):
    """The fake leader as a server before ``ack`` on a get: 400 naming the field."""

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if path.endswith("/batches") and isinstance(body, dict) and "ack" in body:
            return 400, {"error": "invalid_argument", "message": "ack: extra", "field": "ack"}
        return super()._route(method, path, body)


def test_an_older_server_gets_a_separate_ack() -> None:
    fake = _OlderServer([A], entries=[entry_wire(i) for i in range(6)])
    fast = RetryPolicy(initial_s=0.001, max_delay_s=0.01, attempts=50)
    with SimpleConnector(A, "example", "c", transport=fake.transport(), retry=fast) as conn:
        conn.subscribe()
        first = conn.get_without_ack(2, 0)
        second = conn.get_without_ack(2, 0, ack=first.id)
        third = conn.get_without_ack(2, 0, ack=second.id)
    assert [first.id, second.id, third.id] == [1, 2, 3]
    acks = [p for p in fake.paths("POST") if p.endswith("/ack")]
    assert acks == [f"/v1/destinations/example/clients/c/batches/{i}/ack" for i in (1, 2)]
    assert fake.cursor == 4  # entries of batches 1 and 2 acked


def test_an_ack_of_an_earlier_session_is_not_sent_with_the_get(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = "http://127.0.0.1:10"
    fake = FakeCluster([A, b], entries=[entry_wire(i) for i in range(9)])
    fast = RetryPolicy(initial_s=0.001, max_delay_s=0.01, attempts=50)
    caplog.set_level(logging.INFO, logger="canal_client")
    with ClusterConnector(
        "example", "c", servers=[A, b], transport=fake.transport(), retry=fast
    ) as conn:
        conn.subscribe()
        first = conn.get_without_ack(3, 0)
        fake.new_leader(b, 9)  # failover: b restores the cursor (0), first is gone
        fake.down.add(A)
        fake.subscribed.clear()
        assert conn.last_ack_taken is None  # that get carried no ack
        again = conn.get_without_ack(3, 0, ack=first.id)
        assert conn.last_ack_taken is False  # dropped: a consumer must not count it
        assert [e.rows[0].after_values()["id"] for e in again.entries] == [0, 1, 2]
        assert fake.cursor == 0  # first's ack was not applied to the new leader
        conn.get_without_ack(3, 0, ack=again.id)
        assert conn.last_ack_taken is True and fake.cursor == 3
    gets = [body for body in fake.bodies if isinstance(body, dict) and "size" in body]
    assert "ack" not in gets[-2] and gets[-1]["ack"] == again.id  # the stale one, then again's
    assert any("ack of batch" in r.getMessage() and "dropped" in r.getMessage()
               for r in caplog.records)  # fmt: skip
