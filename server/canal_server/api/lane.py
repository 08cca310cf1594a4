"""The express lane of the route a node serves most: ``POST
/v1/destinations/{d}/clients/{c}/batches`` (a get).

FastAPI's layers in front of a route (matching the path against every route, solving
its dependencies, the exception and exit-stack middleware) cost a get more CPU than
taking its batch from the store (docs/benchmarks.md). The lane, an ASGI middleware
inside ``EpochHeader``, serves a get without them, through the same parts the route
uses: the token's ``Access`` grant, the ``BatchRequest`` model, ``LeaderLookup`` (its
``call`` runs the get and maps errors) and ``respond``. The get is first tried on the
event loop without waiting: a batch that is there already is answered without the hop
to a worker thread and back (two cross-thread wake-ups, each of which waited for a
core at 5,000 tx/s, measured on tree 3ffb6a6); a long poll that found nothing
then waits in a worker thread.

It takes a get only when nothing about it is unusual: a known token allowed on the
path (or a node without tokens), a body that validates, a leader serving on this node.
Anything else (401, 403, a bad body, a body over ``MAX_BODY``, a standby's 307, a node
starting or fenced) goes to the app as it came, the body read so far replayed, so
every refusal is the route's own. An error of the get itself is answered as the app's
handlers answer it.
"""

from __future__ import annotations

import re

from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from canal_protocol.batch import Batch
from canal_protocol.errors import CanalError
from canal_server.api import models as m
from canal_server.api.access import Access
from canal_server.api.deps import LeaderLookup, decode_body
from canal_server.api.encoding import encode
from canal_server.api.errors import ApiError
from canal_server.api.openapi import MAX_BODY
from canal_server.api.responses import respond
from canal_server.api.routes_destinations import taker

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
        messages, body = await _read(receive)
        replay = _replay(messages, receive)
        request = Request(scope, replay)
        get = _valid(request, body)
        lead = LeaderLookup(request, match[1], match[2])
        if get is None or not _leads(lead):
            await self.app(scope, replay, send)
            return
        try:
            batch, epoch = await _take(lead, get)
        except ApiError as err:
            await encode(request, err.body(), err.status, err.headers)(scope, replay, send)
            return
        await respond(request, batch, epoch=epoch, layout=get.layout)(scope, replay, send)

    def _allowed(self, scope: Scope, destination: str, client_id: str) -> bool:
        """``check_token``'s yes (the app answers its no), read the way it reads it."""
        access = self.access
        if not access.enabled:
            return True
        header = Headers(scope=scope).get("authorization")
        scheme, credentials = get_authorization_scheme_param(header)
        if scheme.lower() != "bearer" or not credentials:
            return False
        grant = access.grant_of(credentials.encode())
        return grant is not None and grant.refusal(destination, client_id) is None


async def _read(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The body's messages, and the body (None: over ``MAX_BODY``, or the client left)."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > MAX_BODY:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(x.get("body", b"") for x in messages)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives the messages already read."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _valid(request: Request, body: bytes | None) -> m.BatchRequest | None:
    """The body as the route would take it, else None (the route answers it)."""
    if body is None:
        return None
    try:
        data = decode_body(request, body)
        return m.BatchRequest.model_validate(data) if isinstance(data, dict) else None
    except (ApiError, ValidationError):
        return None


async def _take(lead: LeaderLookup, get: m.BatchRequest) -> tuple[Batch, int]:
    """The get: first on the event loop without waiting (a batch that is there already
    costs no hop to a worker thread and back: two cross-thread wake-ups, each waiting
    for a core on a busy machine); else, for a long poll, in a worker thread. The first
    try's ack is done, so the second's is a no-op; a request id is remembered only with
    a batch taken."""
    if get.timeout_ms > 0:
        now = get.model_copy(update={"timeout_ms": 0})
        batch, epoch = await lead.call(taker(lead.client_id, now), here=True)
        if not batch.is_empty:
            return batch, epoch
    result: tuple[Batch, int] = await lead.call(taker(lead.client_id, get))
    return result


def _leads(lead: LeaderLookup) -> bool:
    """This node serves the destination now (else the route's 400 for a bad id, its
    307 / 503, or its wait while this node starts to lead)."""
    try:
        lead.leader()
    except (ApiError, CanalError):
        return False
    return True
