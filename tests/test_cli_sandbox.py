"""`canal-ha up/down/demo` as a user runs them: real subprocesses, real processes left or not."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from canal_java_client import SimpleConnector
from node_fixtures import json_row_ids

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
        for n in state["nodes"]:  # each node's Canal TCP listener, printed and recorded
            assert f"{n['url']}  canal {n['canal']}  pid {n['pid']}" in up.stdout
            host, port = n["canal"].rsplit(":", 1)
            canal = SimpleConnector((host, int(port)), "", "", "example", so_timeout_s=30)
            canal.connect()  # handshake (version 1) and login
            canal.disconnect()
        leader = state["destinations"]["example"]["leader"]
        assert leader["url"] in [n["url"] for n in state["nodes"]]
        assert f"leader   {leader['node']} {leader['url']}" in up.stdout
        assert "standby/error.log" in up.stdout
        assert f"console  {leader['url']}/console" in up.stdout
        page = httpx.get(f"{leader['url']}/console")
        assert page.status_code == 200 and "canal-ha console" in page.text
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
    [
        (["up", "--etcd-members", "2"], "--etcd-members"),
        (["up", "--nodes", "-1"], "--nodes"),
        (["up", "--secure", "--client-ids", "c1,running"], "--client-ids"),
        (["up", "--client-ids", "c2"], "--client-ids: needs --secure"),
        (["up", "--secure", "--workdir", "/tmp/" + "w" * 90], "--workdir: "),  # its socket
    ],
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
        # the live line's latest count: a consumer that connects late shows 0 rows first
        counts = re.findall(r"read from binlog[^\r\n]*? ([\d,]+) rows \(", out.read_text())
        return bool(counts) and counts[-1] != "0"

    try:
        wait_until(read_rows_seen, "demo reads rows from the binlog", timeout_s=120)
        pids = recorded_pids(workdir)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed early: let the demo stop its consumer
            proc.send_signal(signal.SIGINT)  # (its own session: a SIGKILL would leave it)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
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


README = Path(__file__).resolve().parents[1] / "README.md"


def leader_url(workdir: Path) -> str:
    state = json.loads((workdir / "cluster.json").read_text())
    return str(state["destinations"]["example"]["leader"]["url"])


def take_rows(url: str, client: str, want: set[int]) -> list[int]:
    """Get and ack batches of ``client`` until every id in ``want`` was seen."""
    seen: list[int] = []
    base = f"{url}/v1/destinations/example/clients/{client}"
    with httpx.Client(timeout=30) as http:
        while not want <= set(seen):
            r = http.post(f"{base}/batches", json={"size": 50, "timeout_ms": 20_000})
            assert r.status_code == 200, r.text
            batch = r.json()
            assert batch["id"] != -1, f"no more rows; got {seen}, want {sorted(want)}"
            seen += json_row_ids(batch)
            assert http.post(f"{base}/batches/{batch['id']}/ack").status_code == 200
    return seen


def test_up_gives_a_writable_app_user_and_the_readme_example_runs(tmp_path: Path) -> None:
    """cluster.json and `up` give the app user's DSN; the README's `mariadb` and
    `canal-ha consume` commands run as written (with this sandbox's ports)."""
    workdir = tmp_path / "app"
    up = run_cli("up", "--detach", "--workdir", str(workdir), "--nodes", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert "primary/error.log" in up.stdout and "standby/error.log" not in up.stdout
        state = json.loads((workdir / "cluster.json").read_text())
        primary = state["mariadb"]["primary"]
        app = primary["app"]
        assert app["url"] == f"mysql://{app['user']}:{app['password']}@127.0.0.1:{primary['port']}"
        assert f"  app      {app['url']}" in up.stdout
        text = README.read_text()
        commands = re.findall(r"^\$ (mariadb -h127\.0\.0\.1 -P(\d+) -uapp .*)$", text, re.M)
        assert commands, "the README shows how to write data with the app user"
        for command, port in commands:
            assert f"app      mysql://app:{app['password']}@127.0.0.1:{port}" in text
            argv = shlex.split(command.replace(f"-P{port}", f"-P{primary['port']}"))
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
        box = Sandbox.load(workdir)
        rows = box.primary.execute("SELECT id, customer, amount FROM shop.orders")
        assert rows == [(1, "ann", Decimal("13.00"))]
        consume = re.search(r"^\$ (canal-ha consume --etcd (\S+) .*)$", text, re.M)
        assert consume is not None
        argv = shlex.split(consume[1].replace(consume[2], state["etcd"]["endpoints"][0]))
        res = run_cli(*argv[1:])
        assert res.returncode == 0, res.stderr
        assert "INSERT shop.orders [id=1, customer='ann'" in res.stdout, res.stdout
        assert "DELETE shop.orders [id=2, customer='bob'" in res.stdout, res.stdout
        _readme_canal_python_runs(text, state, box)
    finally:
        run_cli("down", "--workdir", str(workdir))


def _readme_canal_python_runs(text: str, state: dict[str, Any], box: Sandbox) -> None:
    """The README's canal-python run, as written, against this sandbox's node."""
    found = re.search(
        r"^\$ (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python .*?^EOF)$", text, re.M | re.S
    )
    assert found, "the README shows a canal-python run"
    script = found[1].split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    port = re.search(r"port=(\d+)", script)
    assert port is not None
    script = script.replace(port[0], f"port={state['nodes'][0]['canal'].rsplit(':', 1)[1]}")
    box.primary.execute(
        "INSERT INTO shop.orders VALUES (3, 'cy', 7.25, 'hi')",
        "UPDATE shop.orders SET amount = 8.00 WHERE id = 3",
    )
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    res = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    shown = text[found.end() :].split("```", 1)[0].strip().splitlines()
    assert shown and shown[0].startswith("connected to 127.0.0.1:")  # this run's port differs
    got = res.stdout.strip().splitlines()
    assert got[1:] == shown[1:], res.stdout


def test_up_again_after_down_leads_for_a_client_that_never_acked(tmp_path: Path) -> None:
    """`down` and `up` again restart MariaDB on a new port (a new source address): the
    client that never acked pinned the origin there; a leader must still come and
    deliver what that client has not acked."""
    workdir = tmp_path / "again"
    first = run_cli("up", "--detach", "--workdir", str(workdir), "--nodes", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    try:
        old_port = json.loads((workdir / "cluster.json").read_text())["mariadb"]["primary"]
        sub = f"{leader_url(workdir)}/v1/destinations/example/clients/late/subscription"
        assert httpx.put(sub, json={"filter": "t_again\\..*"}).status_code == 200
        Sandbox.load(workdir).primary.execute(
            "CREATE DATABASE t_again",
            "CREATE TABLE t_again.t (id INT PRIMARY KEY)",
            "INSERT INTO t_again.t VALUES (1), (2)",
        )
    finally:
        assert run_cli("down", "--workdir", str(workdir)).returncode == 0
    again = run_cli("up", "--detach", "--workdir", str(workdir), "--nodes", "1", timeout=240)
    try:
        assert again.returncode == 0, again.stdout + again.stderr
        state = json.loads((workdir / "cluster.json").read_text())
        assert state["mariadb"]["primary"]["port"] != old_port["port"]
        url = leader_url(workdir)
        assert set(take_rows(url, "late", {1, 2})) == {1, 2}
        Sandbox.load(workdir).primary.execute("INSERT INTO t_again.t VALUES (3)")
        assert 3 in take_rows(url, "late", {3})
    finally:
        run_cli("down", "--workdir", str(workdir))


def test_up_prints_the_cause_when_no_node_can_lead(tmp_path: Path) -> None:
    """A client's acked cursor lies in purged binlogs, and `up` again restarts MariaDB on
    another port: no node can find where to read. `up` must say why (the node's health
    and log), stop everything and exit 1, not wait 90 s and say only 'no node leads'."""
    workdir = tmp_path / "stuck"
    first = run_cli("up", "--detach", "--workdir", str(workdir), "--nodes", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    try:
        sub = f"{leader_url(workdir)}/v1/destinations/example/clients/stuck/subscription"
        assert httpx.put(sub, json={"filter": "t_stuck\\..*"}).status_code == 200
        primary = Sandbox.load(workdir).primary
        primary.execute(
            "CREATE DATABASE t_stuck",
            "CREATE TABLE t_stuck.t (id INT PRIMARY KEY)",
            "INSERT INTO t_stuck.t VALUES (1)",
        )
        assert take_rows(leader_url(workdir), "stuck", {1}) == [1]  # acked: a cursor
        # a change the client has not read: purged with the binlog of the cursor, no start
        # (without it the cursor's GTID state is where the new binlog begins: nothing lost)
        primary.execute("INSERT INTO t_stuck.t VALUES (2)")
        primary.purge_binary_logs()
    finally:
        assert run_cli("down", "--workdir", str(workdir)).returncode == 0
    again = run_cli("up", "--detach", "--workdir", str(workdir), "--nodes", "1", timeout=240)
    if again.returncode == 0:
        run_cli("down", "--workdir", str(workdir))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "no node leads 'example'" in again.stderr
    assert "PurgedPosition" in again.stderr and "'stuck'" in again.stderr, again.stderr
    assert "node1" in again.stderr
    assert not any(pid_alive(p) for p in recorded_pids(workdir))
