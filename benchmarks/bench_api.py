"""REST under abuse (issue 37): what a pathological filter and many long polls do to a
node, each beside its anchor from the same run.

* ``api_filter_health``: ``/v1/health`` latency (sampled every 50 ms) while rows flow at
  ``--api-tps`` one-row transactions per second, first with a client whose filter is
  plain (the anchor), then with clients subscribed with ``(.*){50}!`` and a filter of 40
  of them (close to the filters' program limit) polling in a loop.
* ``api_long_polls``: ``--api-polls`` concurrent ``POST .../batches`` long polls of
  ``--api-poll-timeout-ms`` on a quiet destination (nothing arrives), the node's
  ``node.max_long_polls`` above that count: every poll's answer time minus its timeout
  (the margin), how many were answered 200 / 503 / not at all, and ``/v1/health``
  latency meanwhile; the anchor is one poll alone. Then the same with
  ``node.max_long_polls`` at half the count: the refusals' answer times.

No assert on any figure: the numbers go to docs/benchmarks.md ("REST under abuse").
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx

from benchmarks.bench_cluster import DEST, BenchNode, start_nodes, stop_all, wait_leader
from benchmarks.bench_common import Context, percentile
from benchmarks.bench_data import SCHEMA

__all__ = ["api_filter_health", "api_long_polls"]

TABLE = "api_abuse"
PATHOLOGICAL = "(.*){50}!"
NEAR_LIMIT = ",".join(["(.*){50}!"] * 40)  # ~18,000 RE2 instructions (the limit: 20,000)
HEALTH_EVERY_S = 0.05


def _stats(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"samples": 0}
    return {
        "samples": len(ms),
        "p50_ms": round(percentile(ms, 50), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
    }


class _Writer(threading.Thread):
    """One-row transactions into ``SCHEMA.TABLE`` at ``tps`` until stopped."""

    def __init__(self, ctx: Context, tps: float, first: int) -> None:
        super().__init__(name="bench-api-writer", daemon=True)
        self.ctx, self.tps, self.next = ctx, tps, first
        self.halt = threading.Event()

    def run(self) -> None:
        with self.ctx.sandbox.primary.admin() as conn, conn.cursor() as cur:
            while not self.halt.wait(1 / self.tps):
                cur.execute(f"INSERT INTO {SCHEMA}.{TABLE} VALUES (%s, 'x')", (self.next,))
                self.next += 1


class _Poller(threading.Thread):
    """A client polling (get, then ack) in a loop until stopped."""

    def __init__(self, url: str, client: str) -> None:
        super().__init__(name=f"bench-api-{client}", daemon=True)
        self.base = f"{url}/v1/destinations/{DEST}/clients/{client}"
        self.halt = threading.Event()
        self.gets = 0

    def run(self) -> None:
        with httpx.Client(timeout=60) as http:
            while not self.halt.is_set():
                r = http.post(f"{self.base}/batches", json={"size": 100, "timeout_ms": 200})
                self.gets += 1
                batch = r.json() if r.status_code == 200 else {"id": -1}
                if batch.get("id", -1) != -1:
                    http.post(f"{self.base}/batches/{batch['id']}/ack")


def _subscribe(url: str, client: str, flt: str) -> None:
    """Subscribe ``client``, again after a 503 (etcd slow on a loaded machine)."""
    path = f"{url}/v1/destinations/{DEST}/clients/{client}/subscription"
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=30) as http:
        while True:
            r = http.put(path, json={"filter": flt})
            if r.status_code != 503 or time.monotonic() > deadline:
                assert r.status_code == 200, r.text
                return
            time.sleep(float(r.headers.get("retry-after", "1")))


def _health_ms(url: str, seconds: float) -> list[float]:
    out: list[float] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            r = http.get(f"{url}/v1/health")
            out.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
            time.sleep(HEALTH_EVERY_S)
    return out


def _phase(
    ctx: Context, node: BenchNode, filters: dict[str, str], seconds: float
) -> dict[str, Any]:
    for client, flt in filters.items():
        _subscribe(node.url, client, flt)
    pollers = [_Poller(node.url, c) for c in filters]
    for p in pollers:
        p.start()
    try:
        health = _health_ms(node.url, seconds)
    finally:
        for p in pollers:
            p.halt.set()
        for p in pollers:
            p.join(timeout=30)
    return {"filters": list(filters.values()), "gets": sum(p.gets for p in pollers),
            "health": _stats(health)}  # fmt: skip


def api_filter_health(ctx: Context) -> dict[str, Any]:
    seconds = float(ctx.options.get("api_seconds", 10.0))
    tps = float(ctx.options.get("api_tps", 200.0))
    ctx.sandbox.primary.execute(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA}.{TABLE} (id BIGINT PRIMARY KEY, v VARCHAR(8))",
        f"DELETE FROM {SCHEMA}.{TABLE}",
    )
    nodes = start_nodes(ctx, 1, "api-filter")
    try:
        node = wait_leader(nodes)
        writer = _Writer(ctx, tps, 1)
        writer.start()
        try:
            plain = _phase(ctx, node, {"plain": f"{SCHEMA}\\.{TABLE}"}, seconds)
            bad = _phase(ctx, node, {"redos": PATHOLOGICAL, "near": NEAR_LIMIT}, seconds)
        finally:
            writer.halt.set()
            writer.join(timeout=30)
        return {"tps": tps, "seconds": seconds, "rows_written": writer.next - 1,
                "anchor_plain_filter": plain, "pathological_filters": bad}  # fmt: skip
    finally:
        stop_all(nodes)


async def _post(host: str, port: int, path: str, body: bytes) -> tuple[int | None, float]:
    """One POST on a connection of its own, by hand (an HTTP client library costs the
    benchmark more CPU than the node spends on a poll); (status or None, ms)."""
    t0 = time.perf_counter()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(head + body)
            status_line = await reader.readline()
            await reader.read()  # until the node closes (Connection: close)
        finally:
            writer.close()
        status: int | None = int(status_line.split()[1])
    except (OSError, ValueError, IndexError):
        status = None
    return status, (time.perf_counter() - t0) * 1000


class _HealthSampler(threading.Thread):
    """``/v1/health`` every ``HEALTH_EVERY_S`` from a thread of its own, until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="bench-api-health", daemon=True)
        self.url, self.halt, self.ms = url, threading.Event(), list[float]()

    def run(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self.halt.wait(HEALTH_EVERY_S):
                t0 = time.perf_counter()
                if http.get(self.url).status_code == 200:
                    self.ms.append((time.perf_counter() - t0) * 1000)


def _polls(url: str, path: str, n: int, timeout_ms: int) -> dict[str, Any]:
    parsed = httpx.URL(url)
    host, port = parsed.host, int(parsed.port or 80)
    body = json.dumps({"size": 10, "timeout_ms": timeout_ms}).encode()
    sampler = _HealthSampler(f"{url}/v1/health")
    sampler.start()

    async def all_polls() -> list[tuple[int | None, float]]:
        return await asyncio.gather(*(_post(host, port, path, body) for _ in range(n)))

    try:
        done = asyncio.run(all_polls())
    finally:
        sampler.halt.set()
        sampler.join(timeout=120)
    ok = [ms - timeout_ms for s, ms in done if s == 200]
    refused = [ms for s, ms in done if s == 503]
    return {
        "polls": n,
        "timeout_ms": timeout_ms,
        "answered_200": len(ok),
        "answered_503": len(refused),
        "lost": sum(1 for s, _ in done if s not in (200, 503)),
        "margin_over_timeout": _stats(ok),
        "refused_answer": _stats(refused),
        "health": _stats(sampler.ms),
    }


def _poll_run(ctx: Context, n: int, timeout_ms: int, limit: int, label: str) -> dict[str, Any]:
    nodes = start_nodes(ctx, 1, label, node={"max_long_polls": limit})
    try:
        node = wait_leader(nodes)
        base = f"/v1/destinations/{DEST}/clients/polls"
        _subscribe(node.url, "polls", "")
        alone = _polls(node.url, f"{base}/batches", 1, timeout_ms)
        crowd = _polls(node.url, f"{base}/batches", n, timeout_ms)
        return {"max_long_polls": limit, "anchor_one_poll": alone, "concurrent": crowd}
    finally:
        stop_all(nodes)


def api_long_polls(ctx: Context) -> dict[str, Any]:
    n = int(ctx.options.get("api_polls", 1000))
    timeout_ms = int(ctx.options.get("api_poll_timeout_ms", 5000))
    return {
        "within_limit": _poll_run(ctx, n, timeout_ms, n + 100, "api-polls"),
        "over_limit": _poll_run(ctx, n, timeout_ms, max(1, n // 2), "api-polls-over"),
    }
