"""What one HTTP connection may take: a request's head must arrive in time.

uvicorn (0.54) bounds an idle keep-alive connection (``timeout_keep_alive``) but not a
slow request head: its keep-alive timer stops at the first byte, so a client sending a
header a byte at a time (slowloris), or nothing at all after connecting, holds a socket
for ever. ``protocol_class(http, header_timeout_s)`` is uvicorn's HTTP protocol (h11 or
httptools, as ``node.http`` picks) with a deadline: a connection whose request head is
not complete ``header_timeout_s`` after it opened, or after its previous answer, is
closed. The body's own deadline (``node.body_timeout_s``, a 408) is the app's
(``deps.read_raw``).
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["protocol_class"]


class _HeadDeadline:
    """Mixed into a uvicorn HTTP protocol: closes a connection whose request head does
    not arrive within ``header_timeout_s``."""

    header_timeout_s: float = 10.0
    # uvicorn's protocol attributes this uses
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a request's head is complete: it is being answered

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # no pipelined one began
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(http: str, header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's protocol for ``http`` ("auto": httptools when installed, "h11",
    "httptools") with the head deadline."""
    base: type[asyncio.Protocol] = H11Protocol
    if http == "httptools" or (http == "auto" and importlib.util.find_spec("httptools")):
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    name = f"{base.__name__}WithHeadDeadline"
    cls: type[asyncio.Protocol] = type(
        name, (_HeadDeadline, base), {"header_timeout_s": header_timeout_s}
    )
    return cls
