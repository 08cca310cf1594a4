"""`canal-ha up/down/demo` as a user runs them: real subprocesses, real processes left or not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.process import pid_alive

CLI = [sys.executable, "-m", "canal_ha.cli"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def recorded_pids(workdir: Path) -> list[int]:
    state = json.loads((workdir / "cluster.json").read_text())
    return [int(p["pid"]) for p in state["processes"]]


def test_up_detach_three_members_standby_then_down(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    up = run_cli("up", "--detach", "--workdir", str(workdir), "--etcd-members", "3", "--standby")
    assert up.returncode == 0, up.stderr
    pids = recorded_pids(workdir)
    try:
        state = json.loads((workdir / "cluster.json").read_text())
        assert len(state["etcd"]["endpoints"]) == 3
        assert state["mariadb"]["primary"]["url"].startswith("mysql://canal:")
        assert state["mariadb"]["standby"]["port"] != state["mariadb"]["primary"]["port"]
        assert all(pid_alive(p) for p in pids) and len(pids) == 8  # 3 etcd, 2 db, 3 nodes
        assert [n["name"] for n in state["nodes"]] == ["node1", "node2", "node3"]
        leader = state["destinations"]["example"]["leader"]
        assert leader["url"] in [n["url"] for n in state["nodes"]]
        assert f"leader   {leader['node']} {leader['url']}" in up.stdout
        health = httpx.get(f"{leader['url']}/v1/health").json()
        assert health["destinations"]["example"]["role"] == "leader"
        box = Sandbox.load(workdir)
        box.primary.execute(
            "CREATE DATABASE t_cli",
            "CREATE TABLE t_cli.a (id INT PRIMARY KEY)",
            "INSERT INTO t_cli.a VALUES (42)",
        )
        gtid = box.replica.wait_caught_up(box.primary)
        assert box.replica.execute("SELECT id FROM t_cli.a") == [(42,)]
        assert box.replica.scalar("SELECT @@gtid_binlog_pos") == gtid

        again = run_cli("up", "--detach", "--workdir", str(workdir))
        assert again.returncode == 2
        assert "already runs" in again.stderr and "--workdir" in again.stderr
    finally:
        down = run_cli("down", "--workdir", str(workdir))
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("stopped ") == 8
    assert not any(pid_alive(p) for p in pids)
    twice = run_cli("down", "--workdir", str(workdir))
    assert twice.returncode == 0
    assert "nothing was running" in twice.stdout


def test_down_without_state_is_a_usage_error(tmp_path: Path) -> None:
    res = run_cli("down", "--workdir", str(tmp_path / "nothing"))
    assert res.returncode == 2
    assert "cluster.json" in res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["up", "--etcd-members", "2"], "--etcd-members"), (["up", "--nodes", "-1"], "--nodes")],
)
def test_bad_arguments_exit_2_naming_the_option(args: list[str], needle: str) -> None:
    res = run_cli(*args)
    assert res.returncode == 2
    assert needle in res.stderr


def test_demo_writes_reads_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    out = tmp_path / "demo.out"
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [*CLI, "demo", "--workdir", str(workdir), "--rate", "500"],
            stdout=f,
            stderr=subprocess.STDOUT,
        )

    def read_rows_seen() -> bool:
        return "read from binlog" in out.read_text() and " 0 rows (" not in out.read_text()

    try:
        wait_until(read_rows_seen, "demo reads rows from the binlog", timeout_s=120)
        pids = recorded_pids(workdir)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            run_cli("down", "--workdir", str(workdir))
    text = out.read_text()
    assert rc == 0, text
    assert "stopped mariadb-primary, etcd-etcd1" in text
    assert "demo: wrote" in text
    assert not any(pid_alive(p) for p in pids)


def test_sigterm_on_up_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "up"
    proc = subprocess.Popen(
        [*CLI, "up", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: (workdir / "cluster.json").exists(), "cluster.json", 120)
        pids = recorded_pids(workdir)
        os.kill(proc.pid, signal.SIGTERM)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            run_cli("down", "--workdir", str(workdir))
    assert proc.returncode == 0, text
    assert "stopped" in text
    assert not any(pid_alive(p) for p in pids)
