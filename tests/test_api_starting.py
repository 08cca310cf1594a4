"""A request that reaches a node which has just won the election, while it still loads
its term, waits for the term instead of getting 503 ``no_leader`` (Retry-After 1, a
whole second lost by a client that followed etcd's watch to it).

A fast unit test: ``LeaderLookup`` on a FastAPI app of its own, over a node stand-in
whose view of the destination (``Node.view``: the one answer to "is this node serving
it") turns from "starting" (won, loading) into "serving" after a moment.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from fastapi import FastAPI
from fastapi.responses import Response

from canal_server.api import errors
from canal_server.api.deps import Lead
from canal_server.instance import Role
from canal_server.node import DestinationView


@dataclass
class _Monitor:
    epoch: int

    def leader_epoch(self) -> int | None:
        return self.epoch


@dataclass
class _Instance:
    """Won at once; serving once ``ready`` is set (the term loaded)."""

    monitor: _Monitor = field(default_factory=lambda: _Monitor(7))
    ready: threading.Event = field(default_factory=threading.Event)

    def serving(self) -> tuple[str, int] | None:
        return ("server", 7) if self.ready.is_set() else None

    def role(self) -> tuple[Role, int | None]:
        return (Role.LEADER, 7) if self.ready.is_set() else (Role.STANDBY, None)


@dataclass
class _Node:
    inst: _Instance = field(default_factory=_Instance)
    id: str = "n1"

    def instance(self, destination: str) -> _Instance:
        return self.inst

    def view(self, destination: str) -> DestinationView:
        serving = self.inst.serving()
        if serving is not None:
            return DestinationView(Role.LEADER, 7, None, serving=serving)  # type: ignore[arg-type]
        # Node.view: won (the monitor holds epoch 7) but not serving yet; etcd still names
        # no one usable
        return DestinationView(Role.STARTING, 7, None)


def app_of(node: _Node) -> FastAPI:
    app = FastAPI()
    app.state.node = node
    errors.install(app)

    @app.get("/v1/destinations/{destination}/clients/{client_id}/probe")
    async def probe(lead: Lead) -> Response:
        _, epoch = await lead.call(lambda server: None)
        return Response(str(epoch))

    return app


def get(app: FastAPI) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://n") as http:
            return await http.get("/v1/destinations/d/clients/c/probe")

    return anyio.run(send)


def test_a_request_to_a_node_that_just_won_waits_for_its_term() -> None:
    node = _Node()
    timer = threading.Timer(0.3, node.inst.ready.set)
    timer.start()
    try:
        started = time.monotonic()
        r = get(app_of(node))
    finally:
        timer.cancel()
    assert (r.status_code, r.text) == (200, "7"), r.text
    assert time.monotonic() - started >= 0.3


def test_a_node_that_never_gets_ready_answers_starting_with_retry_after_0(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr("canal_server.api.deps.STARTING_WAIT_S", 0.2)
    r = get(app_of(_Node()))
    assert r.status_code == 503 and r.json()["error"] == "starting", r.text
    assert r.headers["Retry-After"] == "0"
