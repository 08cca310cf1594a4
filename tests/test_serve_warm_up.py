"""A node sends one request through its app before serving (``warm_routes``): FastAPI
builds each router's route state on the first request that walks it (19-27 ms of CPU on
a node, ~1 ms for the next request), which the first client of a new leader paid.

Measured without a clock: the Python calls a request makes (``sys.setprofile``). After
the warm-up, the first request costs what the second does; without it, many times more.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from memory_coordinator import MemoryCoordinator

from canal_server.api import create_app
from canal_server.config import config_from_dict
from canal_server.node import Node
from canal_server.serve import WARM_UP_PATH, warm_routes

CONFIG = {
    "node": {"id": "n1"},
    "destinations": {"d": {"master": {"address": "127.0.0.1:1"}}},
}


@pytest.fixture
def app() -> Iterator[Any]:
    coord = MemoryCoordinator()
    try:
        yield create_app(Node(config_from_dict(CONFIG), coordinator=coord))
    finally:
        coord.close()


def calls_of_request(app: Any, path: str) -> tuple[int, int]:
    """(status, Python function calls) of one GET of ``path`` through ``app``."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"host", b"t")], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2), "state": {},
    }  # fmt: skip
    status: list[int] = []
    calls = [0]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    def count(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls[0] += 1

    async def request() -> None:
        sys.setprofile(count)
        try:
            await app(scope, receive, send)
        finally:
            sys.setprofile(None)

    asyncio.run(request())
    return status[0], calls[0]


def test_after_the_warm_up_the_first_request_costs_what_the_next_does(app: Any) -> None:
    assert warm_routes(app) == 404
    first_status, first = calls_of_request(app, "/v1/no-such-route")
    second_status, second = calls_of_request(app, "/v1/no-such-route")
    assert first_status == second_status == 404
    assert first <= 2 * second, (first, second)


def test_the_warm_up_path_is_no_route(app: Any) -> None:
    """The warm-up must walk every router without running a handler."""
    paths = {getattr(route, "path", None) for route in app.routes}
    assert WARM_UP_PATH not in paths
    assert warm_routes(app) == 404
