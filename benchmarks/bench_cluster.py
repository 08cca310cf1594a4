"""Real `canal-ha server` nodes for the benchmark parts, started on the private sandbox.

Each call of ``start_nodes`` gets its own etcd prefix and replication slave id; the
config is rendered with ``canal_server.config.render_toml`` and the node runs as
``python -m canal_ha.cli server --config FILE`` (what the ``canal-ha`` script
runs). Every process is also registered with the sandbox, so ``Sandbox.stop()`` ends it
by pid if a part forgets.
"""

from __future__ import annotations

import re
import sys
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from benchmarks.bench_common import Context
from canal_client.wire import tls_context
from canal_cluster.retry import wait_until
from canal_ha.sandbox.ports import free_port
from canal_ha.sandbox.process import ManagedProcess
from canal_server.config import render_toml

__all__ = ["DEST", "FAST_ELECTION", "BenchNode", "start_nodes", "stop_all", "wait_leader"]

DEST = "bench"
WAIT_S = 120.0
FAST_ELECTION = {
    "ttl_s": 3.0,
    "switch_delay_s": 1.0,
    "safety_margin_s": 1.0,
    "loop_interval_s": 0.5,
}


@dataclass
class BenchNode:
    """One node process with its URL, Canal listener and etcd prefix."""

    id: str
    url: str
    prefix: str
    process: ManagedProcess
    canal: str = ""

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def health(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{self.url}/v1/health", timeout=2, verify=tls_context())
            return dict(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def destination(self) -> dict[str, Any] | None:
        h = self.health()
        return dict(h["destinations"][DEST]) if h else None

    def metric(self, name: str) -> float:
        """One sample of this node's /metrics for the destination (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5, verify=tls_context()).text
        m = re.search(rf'^{name}\{{destination="{DEST}"\}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def is_running(self) -> bool:
        return self.process.is_running()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop(timeout_s=20)

    def restart(self) -> None:
        self.process.start()
        wait_until(lambda: self.health() is not None, f"{self.id} answers", WAIT_S)


def _config(
    ctx: Context,
    node_id: str,
    port: int,
    prefix: str,
    slave_id: int,
    names: tuple[str, ...] = (DEST,),
    **extra: dict[str, Any],
) -> dict[str, Any]:
    dsn = ctx.sandbox.primary.dsn()
    dest: dict[str, Any] = {
        "master": {"address": f"{dsn['host']}:{dsn['port']}"},
        "db": {"username": dsn["user"], "password": dsn["password"]},
        "slave_id": slave_id,
        "heartbeat_s": 1.0,
    }
    for key, value in extra.pop("destination", {}).items():
        dest[key] = {**dest[key], **value} if isinstance(value, dict) and key in dest else value
    config: dict[str, Any] = {
        "node": {"id": node_id, "listen": f"127.0.0.1:{port}",
                 "advertise_url": f"http://127.0.0.1:{port}"},
        "etcd": {"endpoints": ctx.sandbox.etcd_endpoints, "prefix": prefix, "timeout_s": 0.5},
        "election": dict(FAST_ELECTION),
        "meta": {"flush_period_ms": 200},
        "canal": {"listen": f"127.0.0.1:{free_port()}"},
    }  # fmt: skip
    for section, values in extra.items():
        config[section] = {**config.get(section, {}), **values}
    config["destinations"] = {n: {**dest, "slave_id": slave_id + i} for i, n in enumerate(names)}
    return config


def start_nodes(
    ctx: Context, n: int, label: str, names: tuple[str, ...] = (DEST,), **extra: dict[str, Any]
) -> list[BenchNode]:
    """Start ``n`` nodes of one cluster and wait until each answers /v1/health.

    ``names``: the destinations (the same settings, each its own slave id); ``extra``
    merges into config sections (``election=``, ``destination=`` with
    ``master``/``memory``/...)."""
    prefix = f"/bench-{label}-{uuid.uuid4().hex[:8]}"
    slave_id = 100_000 + zlib.crc32(prefix.encode()) % 3_000_000 * 16  # room for 16 names
    nodes: list[BenchNode] = []
    for i in range(1, n + 1):
        port = free_port()
        cfg = _config(ctx, f"node{i}", port, prefix, slave_id, names, **extra)
        path = ctx.workdir / "nodes" / label / f"node{i}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_toml(cfg))
        argv = (sys.executable, "-m", "canal_ha.cli", "server", "--config", str(path))
        proc = ManagedProcess(f"bench-{label}-node{i}", argv, path.with_suffix(".log"))
        proc.start()
        ctx.sandbox.add_process(proc)
        url, canal = cfg["node"]["advertise_url"], cfg["canal"]["listen"]
        nodes.append(BenchNode(f"node{i}", url, prefix, proc, canal))
    for node in nodes:
        wait_until(
            lambda node=node: node.health() is not None or not node.is_running(),  # type: ignore[misc]
            f"{node.id} answers /v1/health",
            WAIT_S,
        )
        if not node.is_running():
            tail = [line for line in node.process.log_tail(30).splitlines() if line.strip()]
            raise RuntimeError(f"{node.id} exited: {tail[-1] if tail else '(no output)'}")
    return nodes


def wait_leader(nodes: list[BenchNode], exclude: tuple[BenchNode, ...] = ()) -> BenchNode:
    """The node leading DEST with its reader running (waits for it)."""
    found: list[BenchNode] = []

    def ready() -> bool:
        for node in nodes:
            if node in exclude or not node.is_running():
                continue
            d = node.destination()
            if d and d["role"] == "leader" and d["reader"]["state"] == "running":
                found[:] = [node]
                return True
        return False

    wait_until(ready, f"a leader of {DEST}", WAIT_S, interval_s=0.02, max_interval_s=0.05)
    return found[0]


def stop_all(nodes: list[BenchNode]) -> None:
    for node in nodes:
        node.process.resume()
        node.stop()
