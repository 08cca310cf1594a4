"""A fake canal-ha cluster behind ``httpx.MockTransport`` for the client's unit tests.

``FakeCluster`` plays docs/api.md for several node URLs: the leader serves the destination
routes (a small in-memory embedded server: entries, batches, cursor, rollback), the
others answer 307 to it, 503 + Retry-After while no leader is set; URLs in ``down``
refuse connections. Every call is recorded in ``calls``. Replies carry
``X-Canal-Epoch``; ``reply_epoch`` overrides it (stale-leader tests).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgpack

__all__ = ["FakeCluster", "entry_wire"]

BASE = "/v1/destinations/"


def entry_wire(n: int, *, blob: bytes | None = None) -> dict[str, Any]:
    """A ROWDATA entry with id = n (and a binary column when ``blob`` is given)."""
    cols: list[dict[str, Any]] = [
        {"name": "id", "value": n, "is_key": True, "updated": True, "mysql_type": "int",
         "is_null": False},
    ]  # fmt: skip
    if blob is not None:
        cols.append({"name": "b", "value": blob, "is_key": False, "updated": True,
                     "mysql_type": "varbinary(16)", "is_null": False})  # fmt: skip
    return {
        "type": "ROWDATA",
        "header": {"logfile": "bin.000001", "offset": 100 * n, "end_offset": 100 * n + 100,
                   "server_id": 1, "timestamp_ms": 1_700_000_000_000 + n, "gtid": f"0-1-{n}",
                   "schema": "db", "table": "t", "event_type": "INSERT"},
        "is_ddl": False,
        "sql": "",
        "rows": [{"before": [], "after": cols}],
    }  # fmt: skip


def _position(n: int) -> dict[str, Any]:
    return {
        "identity": {"source_address": "127.0.0.1:3306", "slave_id": 1},
        "position": {"journal": "bin.000001", "offset": 100 * n + 100, "server_id": 1,
                     "gtid": f"0-1-{n}", "timestamp_ms": 1_700_000_000_000 + n,
                     "included": True},
    }  # fmt: skip


@dataclass
class FakeCluster:
    urls: list[str]
    leader: str | None = None
    epoch: int = 5
    destination: str = "example"
    entries: list[dict[str, Any]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    reply_epoch: dict[str, int] = field(default_factory=dict)  # url -> epoch it claims
    retry_after: str = "0"
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)
    # embedded-server state of the leader
    cursor: int = 0  # entries[:cursor] acked
    read: int = 0  # next entry to hand out
    outstanding: dict[int, tuple[int, int]] = field(default_factory=dict)
    next_batch: int = 1
    subscribed: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.leader is None and self.urls:
            self.leader = self.urls[0]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def new_leader(self, url: str | None, epoch: int | None = None) -> None:
        """Failover: the new leader restores the cursor, outstanding batches stay marked."""
        with self.lock:
            self.leader = url
            if epoch is not None:
                self.epoch = epoch

    def paths(self, method: str | None = None) -> list[str]:
        return [p for (_, m, p) in self.calls if method is None or m == method]

    # -- HTTP --------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        path = request.url.path
        with self.lock:
            self.calls.append((base, request.method, path))
            self.headers.append(request.headers)
            if base in self.down:
                raise httpx.ConnectError("connection refused", request=request)
            body = self._body(request)
            self.bodies.append(body)
            if self.leader is None:
                return self._reply(request, 503, {"error": "no_leader", "message": "none"},
                                   {"Retry-After": self.retry_after}, epoch=0)  # fmt: skip
            if base != self.leader:
                headers = {"Location": self.leader + path, "X-Canal-Leader": self.leader}
                return self._reply(request, 307, {"error": "not_leader", "message": ""}, headers)
            status, out = self._route(request.method, path, body)
            return self._reply(request, status, out, epoch=self.reply_epoch.get(base))

    @staticmethod
    def _body(request: httpx.Request) -> Any:
        if not request.content:
            return None
        if "msgpack" in request.headers.get("content-type", ""):
            return msgpack.unpackb(request.content, raw=False)
        return json.loads(request.content)

    def _reply(
        self,
        request: httpx.Request,
        status: int,
        data: Any,
        headers: dict[str, str] | None = None,
        epoch: int | None = None,
    ) -> httpx.Response:
        h = {"X-Canal-Epoch": str(self.epoch if epoch is None else epoch), **(headers or {})}
        if "msgpack" in request.headers.get("accept", ""):
            return httpx.Response(status, headers={**h, "Content-Type": "application/msgpack"},
                                  content=msgpack.packb(data, use_bin_type=True))  # fmt: skip
        text = json.dumps(data, default=lambda b: __import__("base64").b64encode(b).decode())
        return httpx.Response(status, headers={**h, "Content-Type": "application/json"},
                              content=text.encode())  # fmt: skip

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path[len(BASE) :].split("/")  # d, clients, c, rest...
        if not path.startswith(BASE) or parts[0] != self.destination:
            return 404, {"error": "unknown_destination", "message": path}
        client, rest = parts[2], parts[3:]
        if rest == ["subscription"] and method == "PUT":
            self.subscribed[client] = body.get("filter", "") if body else ""
            return 200, {"filter": self.subscribed[client]}
        if client not in self.subscribed:
            return 409, {"error": "not_subscribed", "message": client}
        if rest == ["rollback"]:
            self.outstanding.clear()
            self.read = self.cursor
            return 200, {"rolled_back": None}
        if rest == ["cursor"]:
            return 200, {"cursor": _position(self.cursor - 1) if self.cursor else None}
        if rest == ["batches"]:
            acked = body.get("ack")
            if acked is not None and acked in self.outstanding:
                self._ack(acked)
            elif acked is not None and not 1 <= acked < self.next_batch:
                return 409, {"error": "batch_not_outstanding", "message": str(acked)}
            return self._take(int(body["size"]), bool(body.get("auto_ack")))
        batch_id = int(rest[1])
        if len(rest) == 2:
            if batch_id not in self.outstanding:
                return 404, {"error": "unknown_batch", "message": str(batch_id)}
            lo, hi = self.outstanding[batch_id]
            return 200, {"id": batch_id, "entries": self.entries[lo:hi]}
        if batch_id not in self.outstanding:
            return 409, {"error": "batch_not_outstanding", "message": str(batch_id)}
        if rest[2] == "ack":
            self._ack(batch_id)
            return 200, {"acked": batch_id}
        for bid in [b for b in self.outstanding if b >= batch_id]:
            del self.outstanding[bid]
        self.read = max([self.cursor, *(hi for _, hi in self.outstanding.values())])
        return 200, {"rolled_back": batch_id}

    def _ack(self, batch_id: int) -> None:
        for bid in [b for b in self.outstanding if b <= batch_id]:
            self.cursor = max(self.cursor, self.outstanding.pop(bid)[1])

    def _take(self, size: int, auto_ack: bool) -> tuple[int, Any]:
        lo, hi = self.read, min(self.read + size, len(self.entries))
        if lo >= hi:
            return 200, {"id": -1, "entries": []}
        batch_id, self.next_batch = self.next_batch, self.next_batch + 1
        self.read = hi
        if auto_ack:
            self.cursor = hi
        else:
            self.outstanding[batch_id] = (lo, hi)
        return 200, {"id": batch_id, "entries": self.entries[lo:hi],
                     "start": _position(lo), "end": _position(hi - 1)}  # fmt: skip
