"""The REST API of API.md against 3 real `canal-ha server` processes (with a token),
driven by a plain httpx client: JSON and msgpack, redirects, auth, bad inputs (the
schemathesis run over the OpenAPI schema is test_api_fuzz.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
from node_fixtures import DEST, NodeProc, start_nodes, wait_leader
from reader_fixtures import collect_leaked_sockets

from canal_ha.sandbox import Sandbox
from canal_protocol import Batch
from canal_protocol.batch import PIECE_BYTES

TOKEN = "s3cret-token"
DB = "t_api"
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def nodes(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    collect_leaked_sockets()
    sandbox.primary.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, b VARBINARY(16), d DECIMAL(10,2))",
    )
    started = start_nodes(
        sandbox,
        3,
        tmp_path_factory.mktemp("api"),
        auth={"tokens": [TOKEN, "other"]},
        destination={"filter": {"regex": f"{DB}\\..*"}},
    )
    try:
        wait_leader(started)
        yield started
    finally:
        for n in started:
            n.stop()
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {DB}")


@pytest.fixture
def leader(nodes: list[NodeProc]) -> NodeProc:
    return wait_leader(nodes)


@pytest.fixture
def standby(nodes: list[NodeProc], leader: NodeProc) -> NodeProc:
    return next(n for n in nodes if n is not leader)


def base(client: str) -> str:
    return f"/v1/destinations/{DEST}/clients/{client}"


def rows_of(batch: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {c["name"]: c["value"] for c in r["after"]}
        for e in batch["entries"]
        for r in e["rows"]
        if e["type"] == "ROWDATA"
    ]


def pull_rows(http: httpx.Client, client: str, want: int, **kw: Any) -> tuple[list[Any], list[int]]:
    """Get batches without ack until ``want`` rows arrived; (rows, batch ids)."""
    rows: list[Any] = []
    ids: list[int] = []
    while len(rows) < want:
        r = http.post(f"{base(client)}/batches", json={"size": 3, "timeout_ms": 5000}, **kw)
        assert r.status_code == 200, r.text
        batch = r.json()
        assert batch["id"] != -1, f"only {len(rows)} of {want} rows arrived"
        rows += rows_of(batch)
        ids.append(batch["id"])
    return rows, ids


def test_json_flow_subscribe_pull_ack_rollback_refetch(sandbox: Sandbox, leader: NodeProc) -> None:
    with leader.client() as http:
        r = http.put(f"{base('j1')}/subscription", json={"filter": f"{DB}\\.t"})
        assert r.status_code == 200 and r.json()["filter"] == f"{DB}\\.t"
        assert int(r.headers["X-Canal-Epoch"]) > 0
        start = r.json()["cursor"]  # a new client starts at the destination's current end
        assert start is not None and r.json()["created"] is True
        assert http.get(f"{base('j1')}/cursor").json() == {"cursor": start}
        sandbox.primary.execute(
            f"INSERT INTO {DB}.t VALUES (1, x'00ff', 1.50)",
            f"INSERT INTO {DB}.t VALUES (2, 'ab', 2)",
        )
        rows, ids = pull_rows(http, "j1", 2)
        assert rows == [
            {"id": 1, "b": base64.b64encode(b"\x00\xff").decode(), "d": "1.50"},
            {"id": 2, "b": base64.b64encode(b"ab").decode(), "d": "2.00"},
        ]
        # re-fetch an outstanding batch: same content
        again = http.get(f"{base('j1')}/batches/{ids[0]}")
        assert again.status_code == 200 and again.json()["id"] == ids[0]
        # roll back everything: the same rows come again
        assert http.post(f"{base('j1')}/rollback").json() == {"rolled_back": None}
        assert http.get(f"{base('j1')}/batches/{ids[0]}").status_code == 404
        rows2, ids2 = pull_rows(http, "j1", 2)
        assert rows2 == rows and ids2[0] > ids[-1]
        # roll back the last batch only, then cumulative ack of the others
        if len(ids2) > 1:
            assert http.post(f"{base('j1')}/batches/{ids2[-1]}/rollback").status_code == 200
            ids2 = ids2[:-1]
        assert http.post(f"{base('j1')}/batches/{ids2[-1]}/ack").json() == {"acked": ids2[-1]}
        cursor = http.get(f"{base('j1')}/cursor").json()["cursor"]
        assert cursor is not None and cursor["position"]["journal"]
        assert http.post(f"{base('j1')}/batches/{ids2[-1]}/ack").status_code == 409
        # auto_ack: Canal's get
        sandbox.primary.execute(f"INSERT INTO {DB}.t VALUES (3, NULL, NULL)")
        got: list[Any] = []
        while not any(r.get("id") == 3 for r in got):
            b = http.post(
                f"{base('j1')}/batches", json={"size": 50, "timeout_ms": 5000, "auto_ack": True}
            )
            assert b.status_code == 200 and b.json()["id"] != -1
            got += rows_of(b.json())
        assert http.post(f"{base('j1')}/rollback").status_code == 200
        empty = http.post(f"{base('j1')}/batches", json={"size": 5, "timeout_ms": 200}).json()
        assert empty == {"id": -1, "entries": []}
        r = http.delete(f"{base('j1')}/subscription")
        assert r.status_code == 200 and r.json()["subscribed"] is False
        assert http.get(f"{base('j1')}/cursor").status_code == 409


def test_msgpack_requests_and_responses_keep_bytes(sandbox: Sandbox, leader: NodeProc) -> None:
    headers = {"Accept": MSGPACK, "Content-Type": MSGPACK}
    with leader.client(headers=headers) as http:
        body = msgpack.packb({"filter": ""})
        r = http.put(f"{base('m1')}/subscription", content=body)
        assert r.status_code == 200 and r.headers["content-type"] == MSGPACK
        assert msgpack.unpackb(r.content)["client_id"] == "m1"
        sandbox.primary.execute(f"INSERT INTO {DB}.t VALUES (10, x'0001ff', 3.25)")
        rows: list[Any] = []
        batch: dict[str, Any] = {}
        while not any(x["id"] == 10 for x in rows):
            req = msgpack.packb({"size": 10, "timeout_ms": 5000})
            r = http.post(f"{base('m1')}/batches", content=req)
            assert r.status_code == 200, r.content
            batch = msgpack.unpackb(r.content)
            assert batch["id"] != -1
            rows += rows_of(batch)
        assert {"id": 10, "b": b"\x00\x01\xff", "d": "3.25"} in rows
        assert msgpack.unpackb(http.post(f"{base('m1')}/batches/{batch['id']}/ack").content) == {
            "acked": batch["id"]
        }
        bad = http.post(f"{base('m1')}/batches", content=b"\xc1\xc1")
        assert bad.status_code == 400 and msgpack.unpackb(bad.content)["field"] == "body"


def _one_batch(http: httpx.Client, client: str, layout: str, decode: Any, **kw: Any) -> Any:
    r = http.post(f"{base(client)}/batches", **kw)
    assert r.status_code == 200, r.content
    batch = decode(r.content)
    assert batch["id"] != -1
    again = http.get(f"{base(client)}/batches/{batch['id']}", params={"layout": layout})
    assert decode(again.content) == batch  # a re-fetch gives the same batch, same layout
    return batch


def _ours(entry: Any, key: int) -> bool:
    """An entry with rows of ``key`` or ``key + 1`` (other tests write the same table)."""
    images = entry.images
    return images is not None and any(i[0] in (key, key + 1) for i in images.after + images.before)


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_compact_layout_carries_the_same_rows(
    sandbox: Sandbox, leader: NodeProc, wire: str
) -> None:
    """The compact layout gives the client exactly the entries of API.md's layout."""
    mime = MSGPACK if wire == "msgpack" else "application/json"
    packb, decode = (msgpack.packb, msgpack.unpackb) if wire == "msgpack" else (
        lambda o: json.dumps(o).encode(), json.loads)  # fmt: skip
    headers = {"Accept": mime, "Content-Type": mime}
    key = 200 if wire == "json" else 300
    with leader.client(headers=headers) as http:
        for c in (f"rows-{wire}", f"compact-{wire}"):
            http.put(f"{base(c)}/subscription", content=packb({"filter": f"{DB}\\.t"}))
        sandbox.primary.execute(
            f"INSERT INTO {DB}.t VALUES ({key}, x'00ff', 1.50), ({key + 1}, NULL, NULL)",
            f"UPDATE {DB}.t SET b = x'01', d = NULL WHERE id = {key}",
            f"DELETE FROM {DB}.t WHERE id = {key + 1}",
        )
        got: dict[str, list[Any]] = {}
        for layout in ("rows", "compact"):
            client, entries = f"{layout}-{wire}", list[Any]()
            while sum(e.row_count for e in entries) < 4:
                body = packb({"size": 50, "timeout_ms": 5000, "layout": layout})
                raw = _one_batch(http, client, layout, decode, content=body)
                assert all(("rows" in e) == (layout == "rows") for e in raw["entries"])
                entries += [
                    e for e in Batch.from_wire(raw, wire == "json").entries if _ours(e, key)
                ]
                http.post(f"{base(client)}/batches/{raw['id']}/ack")
            got[layout] = [(e.header, e.rows) for e in entries]
    assert got["rows"] == got["compact"]
    changes = [r for _, rows in got["compact"] for r in rows]
    update = changes[2]
    assert [(c.name, c.value, c.updated, c.is_null) for c in update.after] == [
        ("id", key, False, False), ("b", b"\x01", True, False), ("d", None, True, True),
    ]  # fmt: skip
    assert [c.value for c in changes[3].before] == [key + 1, None, None]


def test_a_batch_of_megabytes_arrives_whole_in_pieces(sandbox: Sandbox, leader: NodeProc) -> None:
    """A compact msgpack batch larger than ``PIECE_BYTES`` is sent in pieces of whole
    entries under one Content-Length: the body is complete and decodes to every row."""
    rows, size = 24, 200_000  # 4.8 MB: several pieces, several entries each
    sandbox.primary.execute(f"CREATE TABLE IF NOT EXISTS {DB}.big (id INT PRIMARY KEY, p LONGBLOB)")
    headers = {"Accept": MSGPACK, "Content-Type": MSGPACK}
    got: dict[Any, Any] = {}
    with leader.client(headers=headers) as http:
        c = "pieces"
        sub = http.put(f"{base(c)}/subscription", content=msgpack.packb({"filter": f"{DB}\\.big"}))
        assert sub.status_code == 200, sub.content
        sandbox.primary.execute(
            *(
                f"INSERT INTO {DB}.big VALUES ({i}, REPEAT(CHAR(65 + {i}), {size}))"
                for i in range(rows)
            )
        )
        attempts, largest = 0, 0
        while len(got) < rows and attempts < 20:
            attempts += 1
            body = msgpack.packb({"size": 1000, "timeout_ms": 2000, "layout": "compact"})
            r = http.post(f"{base(c)}/batches", content=body)
            assert r.status_code == 200, r.content
            assert int(r.headers["content-length"]) == len(r.content)
            largest = max(largest, len(r.content))
            batch = Batch.from_wire(msgpack.unpackb(r.content))
            for entry in batch.entries:
                if entry.images is not None and entry.header.table == "big":
                    got.update({row[0]: row[1] for row in entry.images.after})
            if batch.id != -1:
                http.post(f"{base(c)}/batches/{batch.id}/ack")
    assert sorted(got) == list(range(rows)), sorted(got)
    assert all(got[i] == bytes([65 + i]) * size for i in range(rows))
    assert largest > PIECE_BYTES  # the pieces' path was taken


def test_standby_redirects_to_the_leader(leader: NodeProc, standby: NodeProc) -> None:
    with standby.client() as http:
        r = http.put(f"{base('r1')}/subscription?x=1", json={"filter": ""})
        assert r.status_code == 307
        assert r.headers["X-Canal-Leader"] == leader.url
        assert r.headers["Location"] == f"{leader.url}{base('r1')}/subscription?x=1"
        assert r.json()["error"] == "not_leader" and r.json()["leader"] == leader.url
        assert int(r.headers["X-Canal-Epoch"]) > 0
    # httpx drops Authorization on a cross-origin redirect: follow it with the token
    with standby.client() as http:
        r = http.put(f"{base('r1')}/subscription", json={"filter": ""})
        assert r.status_code == 307
        r = http.put(r.headers["Location"], json={"filter": ""})
        assert r.status_code == 200 and str(r.url).startswith(leader.url)
    with httpx.Client(follow_redirects=True, timeout=30) as anonymous:
        r = anonymous.post(f"{standby.url}{base('r1')}/batches", json={"size": 1})
        assert r.status_code == 401  # auth before redirect: nothing leaks to a stranger
    health = standby.health()
    assert health is not None
    d = health["destinations"][DEST]
    assert d["role"] == "standby" and d["leader_url"] == leader.url


def test_tokens_health_metrics_and_cluster(nodes: list[NodeProc], leader: NodeProc) -> None:
    url = leader.url
    assert httpx.get(f"{url}{base('a1')}/cursor").status_code == 401
    wrong = httpx.get(f"{url}{base('a1')}/cursor", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"] == "unauthorized"
    assert "X-Canal-Epoch" in wrong.headers
    other = httpx.put(
        f"{url}{base('a1')}/subscription", headers={"Authorization": "Bearer other"}, json={}
    )
    assert other.status_code == 200
    assert httpx.get(f"{url}/v1/health").status_code == 200
    metrics = httpx.get(f"{url}/metrics")
    assert metrics.status_code == 200
    assert f'canal_leader{{destination="{DEST}"}} 1.0' in metrics.text
    assert "canal_entries_parsed_total" in metrics.text
    assert httpx.get(f"{url}/v1/cluster").status_code == 401
    with leader.client() as http:
        cluster = http.get("/v1/cluster").json()
    assert sorted(n["node"] for n in cluster["nodes"]) == ["node1", "node2", "node3"]
    assert cluster["destinations"][DEST]["leader"]["node"] == leader.id
    assert sorted(cluster["destinations"][DEST]["nodes"]) == ["node1", "node2", "node3"]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", base("b1") + "/batches", {"size": 0}, "size"),
        ("post", base("b1") + "/batches", {"size": 70000}, "size"),
        ("post", base("b1") + "/batches", {"size": "5"}, "size"),
        ("post", base("b1") + "/batches", {"timeout_ms": -1}, "timeout_ms"),
        ("post", base("b1") + "/batches", {"timeout_ms": 10**9}, "timeout_ms"),
        ("post", base("b1") + "/batches", {"bogus": 1}, "bogus"),
        ("post", base("b1") + "/batches", [1, 2], "body"),
        ("put", base("b1") + "/subscription", {"filter": "(unclosed"}, "filter"),
        ("put", base("bad$id") + "/subscription", {}, "client_id"),
        ("put", base("x" * 65) + "/subscription", {}, "client_id"),
        ("put", "/v1/destinations/bad$d/clients/c/subscription", {}, "destination"),
        ("post", base("b1") + "/batches/abc/ack", None, "batch_id"),
        ("post", base("b1") + "/batches/-1/ack", None, "batch_id"),
        ("get", base("b1") + "/batches/1?timeout_ms=-5", None, "timeout_ms"),
    ],
)
def test_bad_inputs_get_400_naming_the_field(
    leader: NodeProc, method: str, path: str, body: Any, field: str
) -> None:
    with leader.client() as http:
        r = http.request(method.upper(), path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"] in ("invalid_argument", "bad_body")
    assert r.json()["field"] == field


def test_unknown_destination_batch_and_not_subscribed(leader: NodeProc) -> None:
    with leader.client() as http:
        r = http.get("/v1/destinations/nowhere/clients/c/cursor")
        assert r.status_code == 404 and r.json()["error"] == "unknown_destination"
        assert http.get(f"{base('u1')}/cursor").status_code == 409
        assert http.post(f"{base('u1')}/batches", json={}).json()["error"] == "not_subscribed"
        assert http.put(f"{base('u1')}/subscription", json={}).status_code == 200
        r = http.get(f"{base('u1')}/batches/77")
        assert r.status_code == 404 and r.json()["error"] == "unknown_batch"
        assert http.post(f"{base('u1')}/batches/77/ack").status_code == 409
        assert http.post(f"{base('u1')}/batches/77/rollback").status_code == 409
        r = http.get("/v1/nothing-here")
        assert r.status_code == 404 and r.json()["error"] == "not_found"


def test_openapi_schema_is_complete(leader: NodeProc) -> None:
    schema = httpx.get(f"{leader.url}/openapi.json").json()
    paths = schema["paths"]
    expected = {
        "/v1/health",
        "/v1/cluster",
        "/metrics",
        "/v1/destinations/{destination}/clients/{client_id}/subscription",
        "/v1/destinations/{destination}/clients/{client_id}/batches",
        "/v1/destinations/{destination}/clients/{client_id}/batches/{batch_id}",
        "/v1/destinations/{destination}/clients/{client_id}/batches/{batch_id}/ack",
        "/v1/destinations/{destination}/clients/{client_id}/batches/{batch_id}/rollback",
        "/v1/destinations/{destination}/clients/{client_id}/rollback",
        "/v1/destinations/{destination}/clients/{client_id}/cursor",
    }
    assert expected <= set(paths)
    post = paths["/v1/destinations/{destination}/clients/{client_id}/batches"]["post"]
    assert set(post["requestBody"]["content"]) == {"application/json", MSGPACK}
    assert MSGPACK in post["responses"]["200"]["content"]
    assert {"200", "307", "400", "401", "404", "409", "503"} <= set(post["responses"])
    assert "BatchOut" in schema["components"]["schemas"]
