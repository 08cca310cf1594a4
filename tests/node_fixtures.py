"""Real `canal-ha server` processes on the sandbox, for integration tests.

Usage (any test module)::

    from node_fixtures import NodeProc, node_cluster, start_nodes, wait_leader  # noqa: F401

    def test_x(node_cluster):                       # a factory fixture; stops everything after
        nodes = node_cluster(3)                     # 3 nodes, destination "example"
        leader = wait_leader(nodes)                 # the NodeProc leading "example"
        httpx.post(f"{leader.url}/v1/destinations/example/clients/c/batches", json={...})

or without the fixture: ``nodes = start_nodes(sandbox, 3, tmp_path)`` and stop them
yourself (``for n in nodes: n.stop()``).

Every cluster gets its own etcd prefix (``nodes[0].prefix``) and replication slave id,
so clusters of different tests never see each other. Election timing is small
(ttl 3 s, switch delay 1 s, flush 200 ms) so failovers are quick; override with
``start_nodes(..., election={"ttl_s": 6}, meta={...}, auth={"tokens": [...]},
tls={"cert_file": ..., "key_file": ...}, destination={"filter": {"regex": ...}})``;
several destinations (the same settings, each its own slave id): ``names=["d1", "d2"]``.

Each node reads the sandbox primary from its current end: write rows only after
``wait_leader`` returned (it waits until the leader's reader runs).
"""

from __future__ import annotations

import itertools
import os
import random
import ssl
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from reader_fixtures import collect_leaked_sockets

from canal_client.wire import tls_context
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_ha.sandbox.ports import free_port
from canal_ha.sandbox.process import ManagedProcess
from canal_protocol import Batch, EntryType
from canal_server.config import render_toml

__all__ = [
    "DEST",
    "FAST_ELECTION",
    "WAIT_S",
    "NodeProc",
    "batch_row_ids",
    "client_path",
    "fresh_database",
    "json_row_ids",
    "node_cluster",
    "node_config",
    "start_nodes",
    "wait_leader",
]

DEST = "example"
WAIT_S = 60.0
FAST_ELECTION = {
    "ttl_s": 3.0,
    "switch_delay_s": 1.0,
    "safety_margin_s": 1.0,
    "loop_interval_s": 0.5,
}
_counter = itertools.count(1)


@dataclass
class NodeProc:
    """One node process: ``url``, ``canal`` (its Canal listener's ``host:port``), ``pid``,
    ``kill()`` (SIGKILL), ``stop()`` (SIGTERM), ``pause()``/``resume()``
    (SIGSTOP/SIGCONT), ``restart()``, ``health()``."""

    id: str
    port: int
    url: str
    config_path: Path
    process: ManagedProcess
    prefix: str
    destination: str = DEST
    token: str | None = None
    verify: ssl.SSLContext | bool = True
    exit_codes: list[int | None] = field(default_factory=list)
    canal: str = ""

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def client(self, **kw: Any) -> httpx.Client:
        """An httpx client for this node (token and TLS trust preset)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(kw.pop("headers", {}))
        return httpx.Client(
            base_url=self.url, headers=headers, verify=self._verify(), timeout=30, **kw
        )

    def _verify(self) -> ssl.SSLContext:
        """The node's TLS trust, or the shared default context (a new one per call
        costs 20-160 ms of CPU: the health pollers would burn a core)."""
        return self.verify if isinstance(self.verify, ssl.SSLContext) else tls_context()

    def health(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{self.url}/v1/health", verify=self._verify(), timeout=2)
            return dict(r.json()) if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def role(self, destination: str | None = None) -> str | None:
        h = self.health()
        return h["destinations"][destination or self.destination]["role"] if h else None

    def is_running(self) -> bool:
        return self.process.is_running()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code (None when it was not running)."""
        popen = self.process._popen
        self.process.stop(timeout_s=30)
        code = popen.returncode if popen is not None else None
        self.exit_codes.append(code)
        return code

    def pause(self) -> None:
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    def restart(self) -> None:
        """Start the same node again (same config, same port) and wait for /v1/health."""
        self.process.start()
        wait_until(lambda: self.health() is not None, f"{self.id} answers", WAIT_S)

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)


def node_config(
    sandbox: Sandbox,
    node_id: str,
    port: int,
    prefix: str,
    slave_id: int,
    destination_name: str = DEST,
    names: Sequence[str] = (),
    **overrides: dict[str, Any],
) -> dict[str, Any]:
    """The config dict of one node (render with ``canal_server.config.render_toml``);
    ``names``: several destinations instead of ``destination_name``. The Canal listener
    is on a free port."""
    dsn = sandbox.primary.dsn()
    dest: dict[str, Any] = {
        "master": {"address": f"{dsn['host']}:{dsn['port']}"},
        "db": {"username": dsn["user"], "password": dsn["password"]},
        "slave_id": slave_id,
        "heartbeat_s": 1.0,
    }
    dest.update(overrides.pop("destination", {}))
    tls = overrides.get("tls") or {}
    scheme = "https" if tls.get("cert_file") else "http"
    config: dict[str, Any] = {
        "node": {"id": node_id, "listen": f"127.0.0.1:{port}",
                 "advertise_url": f"{scheme}://127.0.0.1:{port}"},
        "etcd": {"endpoints": sandbox.etcd_endpoints, "prefix": prefix, "timeout_s": 0.5},
        "election": dict(FAST_ELECTION),
        "meta": {"flush_period_ms": 200},
        "canal": {"listen": f"127.0.0.1:{free_port()}"},
    }  # fmt: skip
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    config["destinations"] = {destination_name: dest}
    if names:
        config["destinations"] = {
            n: {**dest, "slave_id": slave_id + i} for i, n in enumerate(names)
        }
    return config


def start_nodes(
    sandbox: Sandbox,
    n: int,
    tmp_path: Path,
    *,
    destination_name: str = DEST,
    wait: bool = True,
    names: Sequence[str] = (),
    **overrides: dict[str, Any],
) -> list[NodeProc]:
    """Start ``n`` nodes (one destination, or ``names``) and wait until each answers
    /v1/health."""
    run = next(_counter)
    prefix = f"/t{uuid.uuid4().hex[:12]}"
    slave_id = random.randint(100_000, 4_000_000)
    tokens = overrides.get("auth", {}).get("tokens") or [None]
    cert = overrides.get("tls", {}).get("cert_file")
    verify = ssl.create_default_context(cafile=cert) if cert else True
    nodes: list[NodeProc] = []
    for i in range(1, n + 1):
        node_id = f"node{i}"
        port = free_port()
        cfg = node_config(
            sandbox, node_id, port, prefix, slave_id, destination_name, names, **overrides
        )
        path = tmp_path / f"cluster{run}" / f"{node_id}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_toml(cfg))
        argv = (sys.executable, "-m", "canal_ha.cli", "server", "--config", str(path))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        proc = ManagedProcess(f"node-{run}-{node_id}", argv, path.with_suffix(".log"), env=env)
        url = cfg["node"]["advertise_url"]
        first = names[0] if names else destination_name
        canal = cfg["canal"]["listen"] if cfg["canal"].get("enable", True) else ""
        nodes.append(
            NodeProc(node_id, port, url, path, proc, prefix, first, tokens[0], verify, canal=canal)
        )
        proc.start()
    try:
        for node in nodes if wait else ():
            wait_until(
                lambda node=node: node.health() is not None or not node.is_running(),  # type: ignore[misc]
                f"{node.id} answers /v1/health",
                WAIT_S,
            )
            assert node.is_running(), f"{node.id} exited:\n{node.log_tail()}"
    except BaseException:
        for node in nodes:
            node.process.stop(timeout_s=20)
        raise
    return nodes


def wait_leader(
    nodes: Sequence[NodeProc],
    destination: str | None = None,
    timeout_s: float = WAIT_S,
    exclude: Sequence[NodeProc] = (),
) -> NodeProc:
    """The node that leads ``destination`` with its reader running (waits for it)."""
    found: list[NodeProc] = []

    def leader_ready() -> bool:
        for node in nodes:
            if node in exclude or not node.is_running():
                continue
            h = node.health()
            d = h["destinations"][destination or node.destination] if h else None
            if d and d["role"] == "leader" and d["reader"]["state"] == "running":
                found[:] = [node]
                return True
        return False

    wait_until(leader_ready, f"a leader of {destination or DEST}", timeout_s)
    return found[0]


@pytest.fixture
def node_cluster(sandbox: Sandbox, tmp_path: Path) -> Iterator[Callable[..., list[NodeProc]]]:
    """``node_cluster(n, **overrides)`` starts nodes like ``start_nodes``; all are stopped
    (SIGTERM, then SIGKILL) at the end of the test."""
    collect_leaked_sockets()
    started: list[NodeProc] = []

    def make(n: int = 3, **kw: Any) -> list[NodeProc]:
        nodes = start_nodes(sandbox, n, tmp_path, **kw)
        started.extend(nodes)
        return nodes

    try:
        yield make
    finally:
        for node in started:
            node.process.resume()
            node.process.stop(timeout_s=20)


@contextmanager
def fresh_database(server: MariaDBServer, db: str, *tables: str) -> Iterator[MariaDBServer]:
    """``db`` created anew on ``server`` with ``tables`` (``name (columns)``; default one
    table ``t (id INT PRIMARY KEY)``), dropped at the end."""
    create = [f"CREATE TABLE {db}.{t}" for t in tables or ("t (id INT PRIMARY KEY)",)]
    server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}", *create)
    try:
        yield server
    finally:
        server.execute(f"DROP DATABASE IF EXISTS {db}")


def db_destination(
    server: MariaDBServer, db: str, start: tuple[str, int] | None = None
) -> dict[str, Any]:
    """A destination reading only ``db`` from ``server``, from ``start`` (journal, offset) or
    else the server's binlog end now: a client that never acked has no cursor, so a new
    leader starts at the configured position (else at the binlog end at its takeover)."""
    journal, position = start if start is not None else server.master_status()
    master = {"address": f"127.0.0.1:{server.port}", "journal_name": journal, "position": position}
    return {"filter": {"regex": f"{db}\\..*"}, "master": master}


def client_path(client: str) -> str:
    """The REST path of ``client`` on the test destination."""
    return f"/v1/destinations/{DEST}/clients/{client}"


def json_row_ids(batch: dict[str, Any]) -> list[int]:
    """The ``id`` column of every row of a batch as the REST API's JSON has it."""
    return [
        next(c["value"] for c in r["after"] if c["name"] == "id")
        for e in batch["entries"]
        if e["type"] == "ROWDATA"
        for r in e["rows"]
    ]


def batch_row_ids(batch: Batch) -> list[int]:
    """The ``id`` column of every row of a client ``Batch``."""
    return [
        int(str(row.after_values()["id"]))
        for e in batch.entries
        if e.type is EntryType.ROWDATA
        for row in e.rows
    ]
