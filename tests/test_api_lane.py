"""The get's express lane (``canal_server.api.lane.BatchLane``) in process: which gets it
serves itself and which it hands to the app unchanged (body replayed byte for byte).

A fake leader stands in for the node here (this is the lane's logic); the real routes
behind it, auth, bad bodies, redirects and every answer's shape, are tested against real
nodes in test_api.py, test_access.py and test_ack_on_get.py, where every get goes
through the lane.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import msgpack
import pytest

from canal_cluster.retry import wait_until
from canal_protocol import Batch
from canal_protocol.entry import Entry, EntryType, Header
from canal_protocol.errors import NotSubscribed
from canal_protocol.positions import LogIdentity
from canal_server.api.access import Access
from canal_server.api.lane import BatchLane
from canal_server.api.openapi import MAX_BODY
from canal_server.api.poll import Polls
from canal_server.config import AdminToken, AuthSection, ConsumerToken
from canal_server.instance import Role
from canal_server.store import EventStore

PATH = "/v1/destinations/d1/clients/c1/batches"
IDENTITY = LogIdentity("127.0.0.1:3306", 1)
ADMIN, LIMITED = "admin-token", "consumer-token"


class _Meta:
    def __init__(self, filter: str) -> None:
        self.filter = filter

    def subscription(self, client: str) -> str:
        return self.filter


class _Server:
    """The leader's ``EmbeddedServer``: records the gets it is asked, and the thread each
    ran in. ``ready``: the batch there already (else every get answers an empty one);
    ``filter``: the client's filter (its gets run in a worker thread)."""

    def __init__(
        self, fail: Exception | None = None, ready: Batch | None = None, filter: str = ""
    ) -> None:
        self.gets: list[tuple[Any, ...]] = []
        self.threads: list[threading.Thread] = []
        self.fail = fail
        self.ready = ready
        self.store = EventStore("d1")
        self.meta = _Meta(filter)

    def get_without_ack(self, *args: Any) -> Batch:
        self.gets.append(("get_without_ack", *args))
        self.threads.append(threading.current_thread())
        if self.fail is not None:
            raise self.fail
        return self.ready or Batch(7)

    def get(self, *args: Any) -> Batch:
        self.gets.append(("get", *args))
        return Batch(8)


class _Node:
    def __init__(self, server: _Server | None) -> None:
        self.server = server
        self.config = SimpleNamespace(node=SimpleNamespace(body_timeout_s=30.0))

    def view(self, destination: str) -> Any:
        serving = (self.server, 3) if self.server is not None else None
        role = Role.LEADER if serving is not None else Role.STANDBY
        return SimpleNamespace(handing_to=None, role=role, leader=None, epoch=3, serving=serving)


class _Harness:
    """The lane in front of an app that records what reaches it."""

    def __init__(self, server: _Server | None, auth: AuthSection | None = None) -> None:
        self.reached: list[tuple[str, str, bytes]] = []
        self.lane = BatchLane(self._app, Access(auth or AuthSection()))
        self.state = SimpleNamespace(node=_Node(server), polls=Polls(100))

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.reached.append((scope["method"], scope["path"], body))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})

    async def _asgi(self, scope: Any, receive: Any, send: Any) -> None:
        scope["app"] = self  # as Starlette sets it: request.app.state.node
        await self.lane(scope, receive, send)

    def call(self, method: str, path: str = PATH, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self._asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://n") as client:
                return await client.request(method, path, **kw)

        return anyio.run(go)


def _msgpack(body: dict[str, Any]) -> dict[str, Any]:
    return {"content": msgpack.packb(body), "headers": {"Content-Type": "application/msgpack"}}


def test_a_usual_get_is_served_by_the_lane() -> None:
    server = _Server()
    h = _Harness(server)
    body = {"size": 5, "timeout_ms": 250, "request_id": "r-1", "ack": 4, "layout": "compact"}
    packed = _msgpack(body)
    packed["headers"]["Accept"] = "application/msgpack"
    r = h.call("POST", **packed)
    assert h.reached == []
    assert r.status_code == 200
    assert r.headers["x-canal-epoch"] == "3"
    assert msgpack.unpackb(r.content) == {"id": -1, "entries": []}
    # nothing there: a try without waiting, on the event loop (no thread), then a wait on
    # the loop for the store; nothing stored meanwhile: the empty batch, without a try
    assert server.gets == [("get_without_ack", "c1", 5, 0.0, "r-1", 4)]
    assert server.threads == [threading.main_thread()]  # anyio.run's loop: this thread
    r = h.call("POST", json={"auto_ack": True})  # JSON, Canal's get
    assert r.json() == {"id": 8, "entries": []}
    assert server.gets[-1] == ("get", "c1", 1000, 0.0, None, None)


def test_a_client_with_a_filter_is_served_in_worker_threads() -> None:
    """A client filter never runs on the event loop."""
    server = _Server(filter="db\\..*")
    h = _Harness(server)
    r = h.call("POST", json={"size": 5, "timeout_ms": 100})
    assert r.status_code == 200 and r.json() == {"id": -1, "entries": []}
    assert len(server.threads) == 1
    assert threading.main_thread() not in server.threads


def test_a_long_poll_tries_again_when_the_store_gets_an_event() -> None:
    """The wait ends at the store's next event: the poll tries again at once."""
    server = _Server()
    h = _Harness(server)
    entry = Entry(EntryType.TRANSACTIONBEGIN, Header("bin.000001", 4, 50, 1, 0, "0-1-1"))

    def arrive() -> None:
        wait_until(lambda: bool(server.gets), "the poll's first try", 60)
        server.ready = Batch(9, [entry])
        server.store.put([entry], IDENTITY)

    timer = threading.Timer(0.2, arrive)
    timer.start()
    try:
        r = h.call("POST", json={"size": 5, "timeout_ms": 120_000})
    finally:
        timer.cancel()
    assert r.status_code == 200 and r.json()["id"] == 9
    assert len(server.gets) == 2  # the first try, and the one after the event


def test_a_batch_that_is_there_is_taken_on_the_event_loop() -> None:
    """No hop to a worker thread and back when the first try (no wait) has a batch."""
    entry = Entry(EntryType.TRANSACTIONBEGIN, Header("bin.000001", 4, 50, 1, 0, "0-1-1"))
    server = _Server(ready=Batch(9, [entry]))
    h = _Harness(server)
    r = h.call("POST", json={"size": 5, "timeout_ms": 250, "request_id": "r-2"})
    assert r.status_code == 200 and r.json()["id"] == 9, r.text
    assert server.gets == [("get_without_ack", "c1", 5, 0.0, "r-2", None)]
    assert server.threads == [threading.main_thread()]


def test_an_error_of_the_get_is_answered_as_the_app_answers_it() -> None:
    h = _Harness(_Server(fail=NotSubscribed("c1 is not subscribed")))
    r = h.call("POST", json={})
    assert h.reached == []
    assert r.status_code == 409
    assert r.json() == {"error": "not_subscribed", "message": "c1 is not subscribed"}


@pytest.mark.parametrize(
    ("method", "path", "kw"),
    [
        ("GET", PATH, {}),
        ("POST", "/v1/destinations/d1/clients/c1/batches/5/ack", {}),
        ("POST", "/v1/destinations/d1/clients/c1/batches/", {}),
        ("POST", PATH, {"content": b"{not json", "headers": {"Content-Type": "text/json"}}),
        ("POST", PATH, {"json": {"size": 0}}),
        ("POST", PATH, {"json": {"size": 5, "surprise": 1}}),
        ("POST", PATH, {"json": [1, 2]}),
        ("POST", PATH, {"content": b'{"size": 5, "pad": "' + b"x" * MAX_BODY + b'"}'}),
        ("POST", "/v1/destinations/d$1/clients/c1/batches", {"json": {}}),
    ],
    ids=["get", "ack", "slash", "bad-json", "size-0", "extra-field", "array", "too-big", "bad-id"],
)
def test_what_the_lane_does_not_take_reaches_the_app_unchanged(
    method: str, path: str, kw: dict[str, Any]
) -> None:
    server = _Server()
    h = _Harness(server)
    sent = httpx.Request(method, f"http://n{path}", **kw).read()
    r = h.call(method, path, **kw)
    assert (r.status_code, r.content) == (299, b"app")
    assert h.reached == [(method, path, sent)]
    assert server.gets == []


def test_a_get_on_a_node_not_serving_the_destination_reaches_the_app() -> None:
    h = _Harness(None)
    r = h.call("POST", json={"size": 3})
    assert r.status_code == 299
    assert h.reached == [("POST", PATH, b'{"size":3}')]


def test_tokens_the_route_would_refuse_reach_the_app() -> None:
    auth = AuthSection(
        admin=[AdminToken(token=ADMIN)],
        consumer=[ConsumerToken(token=LIMITED, destinations=["other"])],
    )
    server = _Server()
    h = _Harness(server, auth)
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {ADMIN}"},
        {"Authorization": f"Bearer {LIMITED}"},  # limited to another destination
    ):
        assert h.call("POST", json={}, headers=headers).status_code == 299, headers
    assert len(h.reached) == 4 and server.gets == []
    r = h.call("POST", json={}, headers={"Authorization": f"bearer  {ADMIN} "})
    assert r.status_code == 200 and len(server.gets) == 1
