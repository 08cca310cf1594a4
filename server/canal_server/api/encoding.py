"""JSON by default, msgpack with ``Accept: application/msgpack``: bytes stay bytes in
msgpack and are base64 in JSON."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgpack
from fastapi import Request
from fastapi.responses import Response

__all__ = ["MSGPACK", "MSGPACK_TYPES", "encode", "is_msgpack", "wants_msgpack"]

MSGPACK = "application/msgpack"
MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")


def is_msgpack(media_type: str) -> bool:
    return any(t in media_type for t in MSGPACK_TYPES)


def wants_msgpack(request: Request) -> bool:
    return is_msgpack(request.headers.get("accept", ""))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def encode(
    request: Request, data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``data`` as msgpack when the request accepts it, else as JSON."""
    if wants_msgpack(request):
        body = msgpack.packb(data, use_bin_type=True, default=str)
        return Response(body, status, headers, media_type=MSGPACK)
    text = json.dumps(data, default=_json_default, separators=(",", ":"))
    return Response(text, status, headers, media_type="application/json")
