"""The REST surface against bad input and abuse (issue 37), on a real leader and standby:
redirects built from the raw path, ids checked before any leader lookup, `.`/`..` in
console actions, an impossible table name, filters outside the linear-time engine,
what a bad request writes to the log, slow clients (slowloris), hundreds of concurrent
long polls, and the OpenAPI document.

Figures (health latency under a pathological filter, long-poll answer times) are
measured by ``benchmarks/bench_api.py``, not asserted here."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from node_fixtures import DEST, NodeProc, start_nodes, wait_leader
from reader_fixtures import collect_leaked_sockets

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

DB = "t_harden"
LIMITS = {"header_timeout_s": 2.0, "body_timeout_s": 2.0, "max_long_polls": 120}
CUT_S = 30.0  # a bound on waiting for the node to cut a slow client (it does in ~2 s)


@pytest.fixture(scope="module")
def nodes(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    collect_leaked_sockets()
    sandbox.primary.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY)",
    )
    started = start_nodes(
        sandbox,
        2,
        tmp_path_factory.mktemp("harden"),
        node=LIMITS,
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


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def raw(node: NodeProc, method: str, target: str, body: Any = None) -> Answer:
    """One request with ``target`` sent byte for byte (no client normalises it); the
    answer as it came (no redirect followed)."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, target, body=data, headers=headers)
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


SNAP = f"/v1/destinations/{DEST}/snapshots"
CLIENT = f"/v1/destinations/{DEST}/clients"
TABLES = f"/v1/destinations/{DEST}/tables"

# (method, target, the field named): ids outside the id rule, refused on any node
# before the leader is looked up (each of these was a 500, a dropped connection or a
# redirect to another path on a standby)
BAD_IDS = [
    ("GET", f"{SNAP}/%F0%9F%98%80", "snapshot_id"),
    ("DELETE", f"{SNAP}/%F0%9F%98%80", "snapshot_id"),
    ("GET", f"{SNAP}/%C3%A9", "snapshot_id"),
    ("GET", f"{SNAP}/a%04b", "snapshot_id"),
    ("GET", f"{SNAP}/a%0D%0Ab", "snapshot_id"),
    ("DELETE", f"{SNAP}/%2E", "snapshot_id"),
    ("GET", f"{SNAP}/{'s' * 65}", "snapshot_id"),
    ("GET", f"{CLIENT}/%F0%9F%98%80/cursor", "client_id"),
    ("POST", f"{CLIENT}/a%0D%0Ab/rollback", "client_id"),
    ("GET", f"{CLIENT}/%2E%2E/cursor", "client_id"),
    ("GET", "/v1/destinations/%C3%A9/snapshots", "destination"),
    ("POST", "/v1/destinations/%2E/step-down", "destination"),
    ("GET", "/v1/destinations/a%04b/tables/d.t", "destination"),
]


@pytest.mark.parametrize("role", ["leader", "standby"])
def test_bad_ids_are_400_naming_the_field_on_any_node(
    leader: NodeProc, standby: NodeProc, role: str
) -> None:
    node = leader if role == "leader" else standby
    for method, target, field in BAD_IDS:
        r = raw(node, method, target)
        assert r.status == 400, (method, target, r.status, r.body)
        assert r.json()["error"] == "invalid_argument", (target, r.body)
        assert r.json()["field"] == field, (target, r.body)


def test_a_standby_redirects_to_the_path_as_sent(leader: NodeProc, standby: NodeProc) -> None:
    """`Location` is the request's raw path and query on the leader: `%25` stays `%25`,
    nothing decoded reaches a header."""
    for method, target in [
        ("GET", f"{TABLES}/%25.%25"),
        ("GET", f"{TABLES}/%C3%A9.x?q=%2F%0A&r=%E2%82%AC"),
        ("PUT", f"{CLIENT}/c%2Dx/subscription"),
        ("GET", f"{SNAP}/s1"),
        ("POST", "/v1/destinations/example/step-down"),
    ]:
        r = raw(standby, method, target, {} if method in ("PUT", "POST") else None)
        assert r.status == 307, (target, r.status, r.body)
        assert r.headers["location"] == leader.url + target
        assert r.headers["location"].isascii()
        assert r.json()["error"] == "not_leader" and r.json()["leader"] == leader.url


def test_console_actions_refuse_dot_ids_naming_the_field(leader: NodeProc) -> None:
    actions = [
        ({"action": "rollback", "destination": DEST, "client_id": ".."}, "client_id"),
        ({"action": "rollback", "destination": DEST, "client_id": "."}, "client_id"),
        ({"action": "cancel_snapshot", "destination": DEST, "snapshot_id": "."}, "snapshot_id"),
        ({"action": "step_down", "destination": ".."}, "destination"),
        ({"action": "step_down", "destination": DEST, "to": ".."}, "to"),
    ]
    for body, field in actions:
        r = raw(leader, "POST", "/v1/console/actions", body)
        assert r.status == 400, (body, r.status, r.body)
        assert r.json()["error"] == "invalid_argument" and r.json()["field"] == field, r.body


def test_an_impossible_table_name_is_404_unknown_table(leader: NodeProc) -> None:
    """Not a 503 (no outage is happening) and no SQL error text: the name cannot be a
    MySQL table's, so the database is not asked."""
    for name in ("%F0%9F%98%80.x", "x.%F0%9F%98%80", f"{'a' * 65}.t", "a%00.t"):
        r = raw(leader, "GET", f"{TABLES}/{name}")
        assert r.status == 404, (name, r.status, r.body)
        assert r.json()["error"] == "unknown_table" and r.json()["field"] == "table"
        assert "collation" not in r.body.decode().lower() and "1267" not in r.body.decode()
    r = raw(leader, "GET", f"{TABLES}/{DB}.t")
    assert r.status == 200 and r.json()["primary_key"] == ["id"]


@pytest.mark.parametrize(
    "pattern", ["(a)\\1", "(?=t)t\\..*", "t\\.x\\Z", "(.*){1000}(.*){1000}(.*){1000}!"]
)
def test_a_filter_outside_the_linear_engine_is_400_naming_it(
    leader: NodeProc, pattern: str
) -> None:
    r = raw(leader, "PUT", f"{CLIENT}/redos/subscription", {"filter": pattern})
    assert r.status == 400, (pattern, r.status, r.body)
    assert r.json()["error"] == "invalid_argument" and r.json()["field"] == "filter"


def test_a_pathological_filter_is_served(sandbox: Sandbox, leader: NodeProc) -> None:
    """`(.*){50}!` (seconds per name on a backtracking engine) runs on RE2: the get
    answers, with the rows the filter lets through (none), and health answers."""
    with leader.client() as http:
        r = http.put(f"{CLIENT}/redos50/subscription", json={"filter": "(.*){50}!"})
        assert r.status_code == 200, r.text
        sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(1, 11)))
        got = http.post(f"{CLIENT}/redos50/batches", json={"size": 100, "timeout_ms": 2000})
        assert got.status_code == 200, got.text
        rows = [e for e in got.json()["entries"] if e["type"] == "ROWDATA"]
        assert rows == []
        assert http.get("/v1/health").status_code == 200


def _log_size(node: NodeProc) -> int:
    return node.config_path.with_suffix(".log").stat().st_size


def _log_since(node: NodeProc, offset: int) -> str:
    with node.config_path.with_suffix(".log").open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def test_bad_requests_write_no_traceback_and_a_few_lines(
    leader: NodeProc, standby: NodeProc
) -> None:
    """Each of the issue's bad requests, 30 times on each node: no traceback, a bounded
    number of lines (a client cannot fill the disk)."""
    marks = {n.id: _log_size(n) for n in (leader, standby)}
    for node in (leader, standby):
        for _ in range(30):
            for method, target, _field in BAD_IDS:
                raw(node, method, target)
            raw(node, "GET", f"{TABLES}/%F0%9F%98%80.x")
            raw(node, "GET", f"{TABLES}/%25.%25")
            with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
                s.sendall(b"GARBAGE / HTTP/9.9\r\n\r\n")  # uvicorn: "Invalid HTTP request"
                s.recv(1000)
    for node in (leader, standby):
        text = _log_since(node, marks[node.id])
        assert "Traceback" not in text, text[-3000:]
        assert len(text.splitlines()) <= 20, text[-3000:]


def _cut(sock: socket.socket, trickle: bytes | None) -> bool:
    """Whether the node closed ``sock`` within ``CUT_S`` (sending ``trickle`` a byte at a
    time, as a slowloris client does, or nothing)."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + CUT_S
    i = 0
    while time.monotonic() < deadline:
        try:
            if trickle is not None:
                sock.send(trickle[i % len(trickle) : i % len(trickle) + 1])
                i += 1
            data = sock.recv(4096)
            if data == b"" or data.startswith(b"HTTP/1.1 408"):
                return True
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe
            return True
    return False


def test_slow_clients_are_cut(leader: NodeProc) -> None:
    """A head sent a byte at a time, a connection that sends nothing and a body that
    stalls are all cut at `node.header_timeout_s` / `node.body_timeout_s` (2 s here),
    while the node keeps answering others."""
    socks: list[tuple[socket.socket, bytes | None]] = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", leader.port), timeout=30)
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            socks.append((s, b"X-Slow: abcdefghij\r\n"))
        for _ in range(5):
            socks.append((socket.create_connection(("127.0.0.1", leader.port), timeout=30), None))
        s = socket.create_connection(("127.0.0.1", leader.port), timeout=30)
        s.sendall(
            f"PUT {CLIENT}/slow/subscription HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{}".encode()
        )
        socks.append((s, None))
        assert httpx.get(f"{leader.url}/v1/health", timeout=30).status_code == 200
        assert all(_cut(s, trickle) for s, trickle in socks)
    finally:
        for s, _ in socks:
            s.close()
    # the stalled body was answered before the close: 408 naming the body
    s = socket.create_connection(("127.0.0.1", leader.port), timeout=30)
    with s:
        s.sendall(
            f"PUT {CLIENT}/slow/subscription HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
        )
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b'"request_timeout"' in answer and b'"field":"body"' in answer


def test_hundreds_of_long_polls_wait_without_threads_and_each_is_answered(
    leader: NodeProc,
) -> None:
    """200 polls at once (limit 120): none holds a thread while it waits; each is
    answered, with an empty batch at its timeout or, past the limit, 503 `overloaded`
    with `Retry-After` at once; health answers meanwhile."""
    n, timeout_ms = 200, 15_000
    with leader.client() as http:
        assert http.put(f"{CLIENT}/polls/subscription", json={}).status_code == 200
    process = psutil.Process(leader.pid)
    idle_threads = process.num_threads()
    body = {"size": 10, "timeout_ms": timeout_ms}
    url = f"{leader.url}{CLIENT}/polls/batches"

    async def polls() -> tuple[list[Any], int]:
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=timeout_ms / 1000 + 60, limits=limits) as c:
            tasks = [asyncio.create_task(c.post(url, json=body)) for _ in range(n)]
            most = 0
            while not all(t.done() for t in tasks):
                most = max(most, process.num_threads())
                await asyncio.sleep(0.2)
                health = await c.get(f"{leader.url}/v1/health")
                assert health.status_code == 200
            return await asyncio.gather(*tasks, return_exceptions=True), most

    answers, most_threads = asyncio.run(polls())
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert not errors, errors[:3]
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= LIMITS["max_long_polls"]
    for a in answers:
        if a.status_code == 200:
            assert a.json() == {"id": -1, "entries": []}
        else:
            assert a.json()["error"] == "overloaded" and a.headers["retry-after"] == "1"
    assert statuses.count(503) >= 1  # the polls past the limit were refused, not queued
    # a waiting poll holds no thread (before: one of 256 workers each)
    assert most_threads < idle_threads + 40, (idle_threads, most_threads)
    wait_until(lambda: leader.is_running(), "leader still running", 5)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_the_openapi_document_says_what_the_routes_answer(leader: NodeProc) -> None:
    doc = httpx.get(f"{leader.url}/openapi.json", timeout=30).json()
    text = json.dumps(doc)
    assert '"422"' not in text and "HTTPValidationError" not in text
    schemas = doc["components"]["schemas"]
    for ref in set(_refs(doc)):  # every reference resolves from the document's root
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in schemas, ref
    paths = doc["paths"]
    snap = paths["/v1/destinations/{destination}/snapshots"]
    one = paths["/v1/destinations/{destination}/snapshots/{snapshot_id}"]
    assert {"201", "307", "400", "404", "409", "413", "503"} <= set(snap["post"]["responses"])
    assert {"200", "307", "400", "404", "503"} <= set(snap["get"]["responses"])
    assert {"200", "307", "400", "404", "409", "503"} <= set(one["delete"]["responses"])
    for path, item in paths.items():
        for op in item.values():
            for p in op.get("parameters", []):
                if p["name"] in ("destination", "client_id", "snapshot_id"):
                    schema = p["schema"]
                    assert schema["maxLength"] == 64 and schema["minLength"] == 1, path
                    assert schema["pattern"] == r"^(?!\.\.?$)[A-Za-z0-9_.-]{1,64}$", path
    actions = paths["/v1/console/actions"]["post"]["responses"]
    assert actions["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ConsoleActionOut"
    }
    assert set(paths["/v1/health"]["get"]["responses"]) == {"200"}
