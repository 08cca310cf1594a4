"""The express lane of the route a node serves most: ``POST
/v1/destinations/{d}/clients/{c}/batches`` (a get).

FastAPI's layers in front of a route (matching the path against every route, solving
its dependencies, the exception and exit-stack middleware) cost a get more CPU than
taking its batch from the store (docs/benchmarks.md). The lane, an ASGI middleware
inside ``EpochHeader``, serves a get without them, through the same parts the route
uses: ``deps.authorize`` (the token), ``deps.read_raw`` and ``deps.parse_body`` (the
body as ``BatchRequest``), ``LeaderLookup`` and ``poll.poll_batch`` (the get: a batch
that is there already is taken on the event loop, without the hop to a worker thread
and back, two cross-thread wake-ups that each waited for a core at 5,000 tx/s, measured
on tree 3ffb6a6; unless the client has a filter; a long poll waits on the event loop),
and ``respond``.

It takes a get only when nothing about it is unusual: a known token allowed on the
path (or a node without tokens), a body that validates, a leader serving on this node.
Anything else (401, 403, a bad body, a body over ``MAX_BODY``, a standby's 307, a node
starting or fenced) goes to the app as it came, the body read so far replayed, so
every refusal is the route's own. An error of the get itself is answered as the app's
handlers answer it.
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canal_protocol.errors import CanalError
from canal_server.api import models as m
from canal_server.api.access import Access
from canal_server.api.deps import LeaderLookup, authorize, parse_body, read_raw
from canal_server.api.encoding import encode
from canal_server.api.errors import ApiError
from canal_server.api.poll import poll_batch
from canal_server.api.responses import respond

__all__ = ["BatchLane"]

_GET = re.compile(r"^/v1/destinations/([^/]+)/clients/([^/]+)/batches$")


class BatchLane:
    """Serves the usual get itself; everything else goes to ``app`` unchanged."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _GET.match(scope["path"])
        if match is None or not self._allowed(scope, match[1], match[2]):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []

        async def recorded() -> Message:
            message = await receive()
            messages.append(message)
            return message

        replay = _replay(messages, receive)
        request = Request(scope, replay)
        try:
            get = await _valid(Request(scope, recorded))
        except ApiError as err:  # a body too slow: answered now, not waited for twice
            await encode(request, err.body(), err.status, err.headers)(scope, replay, send)
            return
        lead = LeaderLookup(request, match[1], match[2])
        if get is None or not _leads(lead):
            await self.app(scope, replay, send)
            return
        try:
            batch, epoch = await poll_batch(scope["app"].state.polls, lead, get)
        except ApiError as err:
            await encode(request, err.body(), err.status, err.headers)(scope, replay, send)
            return
        await respond(request, batch, epoch=epoch, layout=get.layout)(scope, replay, send)

    def _allowed(self, scope: Scope, destination: str, client_id: str) -> bool:
        """``authorize``'s yes (the app answers its no)."""
        header = Headers(scope=scope).get("authorization")
        try:
            authorize(self.access, header, destination, client_id)
        except ApiError:
            return False
        return True


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives the messages already read."""

    async def replayed() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return replayed


async def _valid(request: Request) -> m.BatchRequest | None:
    """The body as the route would take it, else None (the route answers it); a body
    that did not arrive in time raises its 408."""
    try:
        return parse_body(request, await read_raw(request), m.BatchRequest)
    except ApiError as err:
        if err.status == 408:
            raise
        return None


def _leads(lead: LeaderLookup) -> bool:
    """This node serves the destination now (else the route's 400 for a bad id, its
    307 / 503, or its wait while this node starts to lead)."""
    try:
        lead.leader()
    except (ApiError, CanalError):
        return False
    return True
