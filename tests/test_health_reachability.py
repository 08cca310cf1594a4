"""``/v1/health`` says when the node cannot reach etcd or its database, and which row
decoder it runs: a real node on a private sandbox whose etcd is paused and whose
MariaDB is killed, then brought back."""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, NodeProc, start_nodes, wait_leader

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_server.api.models import HealthOut
from canal_server.parse import rowcodec

SandboxFactory = Callable[..., Sandbox]

WAIT_S = 60.0
HEALTH_BOUND_S = 15.0  # a generous bound for one answer while etcd or the database hangs


def _private_box(make_sandbox: SandboxFactory) -> Sandbox:
    with warnings.catch_warnings():  # MariaDB start-up leaks sockets (see coord_fixtures)
        warnings.simplefilter("ignore", ResourceWarning)
        box = make_sandbox()
        gc.collect()
    return box


def _health(node: NodeProc) -> dict[str, Any]:
    r = httpx.get(f"{node.url}/v1/health", timeout=HEALTH_BOUND_S)
    assert r.status_code == 200, r.text
    HealthOut.model_validate(r.json())
    return dict(r.json())


def _etcd(node: NodeProc) -> dict[str, Any]:
    return dict(_health(node)["etcd"])


def _database(node: NodeProc) -> dict[str, Any]:
    return dict(_health(node)["destinations"][DEST]["database"])


def test_health_reports_etcd_and_database_reachability(
    make_sandbox: SandboxFactory, tmp_path: Path
) -> None:
    box = _private_box(make_sandbox)
    nodes = start_nodes(box, 1, tmp_path)
    node = nodes[0]
    try:
        wait_leader(nodes)
        h = _health(node)
        assert h["etcd"] == {"reachable": True, "error": ""}
        db = h["destinations"][DEST]["database"]
        assert db["reachable"] is True and db["error"] == ""
        assert db["address"] == f"127.0.0.1:{box.primary.port}"
        assert h["row_decoder"] == ("c" if rowcodec.HAVE_NATIVE else "python")

        box.primary.kill()
        wait_until(lambda: not _database(node)["reachable"], "database unreachable", WAIT_S)
        assert _database(node)["error"]
        box.primary.restart()
        wait_until(lambda: _database(node)["reachable"], "database reachable", WAIT_S)

        member = box.etcd_cluster.members[0].process
        member.pause()
        try:
            wait_until(lambda: not _etcd(node)["reachable"], "etcd unreachable", WAIT_S)
            started = time.monotonic()
            etcd = _etcd(node)  # answered within HEALTH_BOUND_S (else httpx times out)
            assert etcd["reachable"] is False and etcd["error"], etcd
            assert time.monotonic() - started < HEALTH_BOUND_S
        finally:
            member.resume()
        wait_until(lambda: _etcd(node)["reachable"], "etcd reachable", WAIT_S)
    finally:
        for n in nodes:
            n.process.resume()
            n.stop()


def test_row_decoder_python_is_logged_and_reported(
    make_sandbox: SandboxFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = _private_box(make_sandbox)
    monkeypatch.setenv(rowcodec.ENV, "python")  # the node inherits the environment
    nodes = start_nodes(box, 1, tmp_path)
    try:
        assert _health(nodes[0])["row_decoder"] == "python"
        wait_until(
            lambda: "row decoder: python" in nodes[0].log_tail(200), "the decoder logged", WAIT_S
        )
    finally:
        for n in nodes:
            n.stop()
