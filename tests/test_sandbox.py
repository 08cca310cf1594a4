"""The sandbox itself: real MariaDB primary/standby and etcd, and the fault controls."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pymysql
import pytest
from pyetcd import client as etcd_client

from canal_cluster.retry import wait_until
from canal_ha.sandbox import EtcdCluster, Sandbox
from canal_ha.sandbox.mariadb import CANAL_PASSWORD, CANAL_USER, MariaDBServer
from canal_ha.sandbox.ports import free_port
from canal_protocol.errors import SandboxStartError


def etcd_put_get(endpoint: str, key: str, value: str) -> str:
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    c = etcd_client(host=host, port=int(port), timeout=5)
    try:
        c.put(key, value)
        got, _ = c.get(key)
        return bytes(got).decode()
    finally:
        c.close()


def listening_addresses(pid: int) -> set[str]:
    conns = psutil.Process(pid).net_connections(kind="inet")
    return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}


def test_binlog_settings_and_users(sandbox: Sandbox) -> None:
    want = {
        "log_bin": "ON",
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
    }
    for name, value in want.items():
        assert sandbox.primary.scalar(f"SELECT @@{name}") in (value, 1), name
    d = sandbox.primary.dsn()
    with (
        pymysql.connect(
            host="127.0.0.1", port=d["port"], user=CANAL_USER, password=CANAL_PASSWORD
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SHOW MASTER STATUS")
        assert cur.fetchone() is not None


def test_app_user_creates_a_schema_and_writes(sandbox: Sandbox) -> None:
    """The state (cluster.json) names a read-write application user for test data."""
    primary = sandbox.state()["mariadb"]["primary"]
    app = primary["app"]
    assert app["url"] == f"mysql://{app['user']}:{app['password']}@127.0.0.1:{primary['port']}"
    with (
        pymysql.connect(
            host="127.0.0.1", port=primary["port"], user=app["user"], password=app["password"]
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("DROP DATABASE IF EXISTS t_app")
        cur.execute("CREATE DATABASE t_app")
        cur.execute("CREATE TABLE t_app.a (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t_app.a VALUES (1)")
        conn.commit()
        for admin in ("CREATE USER 'intruder'@'%'", "CREATE TABLE mysql.evil (id INT)"):
            with pytest.raises(pymysql.err.MySQLError, match="denied"):
                cur.execute(admin)  # no administration, system schemas read-only
    assert sandbox.primary.execute("SELECT id FROM t_app.a") == [(1,)]
    sandbox.primary.execute("DROP DATABASE t_app")


def test_row_reaches_standby_with_same_gtid(sandbox: Sandbox) -> None:
    p, r = sandbox.primary, sandbox.replica
    p.execute(
        "CREATE DATABASE IF NOT EXISTS t_sandbox",
        "CREATE TABLE IF NOT EXISTS t_sandbox.a (id INT PRIMARY KEY, v VARCHAR(10))",
        "REPLACE INTO t_sandbox.a VALUES (1, 'hello')",
    )
    gtid = r.wait_caught_up(p)
    assert r.execute("SELECT v FROM t_sandbox.a WHERE id = 1") == [("hello",)]
    assert r.scalar("SELECT @@gtid_binlog_pos") == gtid == p.scalar("SELECT @@gtid_binlog_pos")
    assert r.server_id != p.server_id


def test_etcd_answers(sandbox: Sandbox) -> None:
    assert etcd_put_get(sandbox.etcd_endpoints[0], "/sandbox-test", "v1") == "v1"


def test_everything_listens_on_loopback_only(sandbox: Sandbox) -> None:
    for proc in sandbox.processes():
        assert proc.pid is not None
        addrs = listening_addresses(proc.pid)
        assert addrs, proc.name
        assert addrs <= {"127.0.0.1"}, (proc.name, addrs)


def test_etcd_member_kill_and_restart(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(etcd_members=3)
    cluster = box.etcd_cluster
    victim = cluster.member("etcd2")
    victim.process.kill()
    assert not victim.process.is_running()
    survivor = cluster.member("etcd1")
    # If the victim led raft, the two survivors elect a new leader first.
    wait_until(survivor.healthy, "etcd1 healthy with two members", 60)
    assert etcd_put_get(survivor.client_url, "/k", "with two") == "with two"
    cluster.restart_member("etcd2")
    assert victim.process.is_running()
    wait_until(victim.healthy, "restarted member healthy", 60)
    assert etcd_put_get(victim.client_url, "/k2", "back") == "back"


def test_pause_resume_and_restart_mariadb(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox()
    db = box.primary
    db.execute(
        "CREATE DATABASE t_keep",
        "CREATE TABLE t_keep.a (id INT PRIMARY KEY)",
        "INSERT INTO t_keep.a VALUES (7)",
    )
    db.process.pause()
    try:
        with pytest.raises(pymysql.err.OperationalError):
            pymysql.connect(
                host="127.0.0.1",
                port=db.port,
                user=CANAL_USER,
                password=CANAL_PASSWORD,
                connect_timeout=1,
                read_timeout=1,
            )
    finally:
        db.process.resume()
    assert db.scalar("SELECT COUNT(*) FROM t_keep.a") == 1
    old_pid = db.process.pid
    db.kill()
    assert not db.process.is_running()
    db.restart()
    assert db.process.pid != old_pid
    assert db.scalar("SELECT id FROM t_keep.a") == 7


def test_promote_replica_after_primary_dies(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox(standby=True)
    p, r = box.primary, box.replica
    p.execute(
        "CREATE DATABASE t_promote",
        "CREATE TABLE t_promote.a (id INT PRIMARY KEY)",
        "INSERT INTO t_promote.a VALUES (1)",
    )
    r.wait_caught_up(p)
    p.kill()
    r.promote()
    assert r.execute("SHOW SLAVE STATUS") == []
    r.execute("INSERT INTO t_promote.a VALUES (2)")
    assert r.execute("SELECT id FROM t_promote.a ORDER BY id") == [(1,), (2,)]
    assert str(r.scalar("SELECT @@gtid_binlog_pos")).startswith("0-2-")


def test_purge_binary_logs(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    db = make_sandbox().primary
    db.execute("CREATE DATABASE t_purge", "FLUSH BINARY LOGS", "CREATE TABLE t_purge.a (i INT)")
    before = db.binlog_files()
    purged = db.purge_binary_logs()
    assert purged == before
    assert db.binlog_files() == [db.master_status()[0]]
    assert not set(purged) & set(db.binlog_files())


def test_settled_master_status_counts_the_late_checkpoint(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    db = make_sandbox().primary
    db.execute("CREATE DATABASE t_settle", "FLUSH BINARY LOGS")
    journal, offset = db.settled_master_status()
    events = db.execute(f"SHOW BINLOG EVENTS IN '{journal}'")
    assert offset == int(events[-1][4])  # the end of the last event: nothing comes after it
    checkpoints = [str(e[5]) for e in events if e[2] == "Binlog_checkpoint"]
    assert checkpoints[-1] == journal


def test_failed_start_names_the_part_and_its_log(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path / "etcd", 1)
    member = cluster.members[0]
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", member.client_port))
        blocker.listen()
        with pytest.raises(SandboxStartError) as info:
            cluster.start(timeout_s=30)
    cluster.stop()
    assert "etcd etcd1" in str(info.value)
    assert info.value.log_path == str(member.process.log_path)


def test_failed_mariadb_start_names_its_error_log(tmp_path: Path) -> None:
    port = free_port()
    db = MariaDBServer("broken", tmp_path / "db", 1, port)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        with pytest.raises(SandboxStartError) as info:
            db.start(timeout_s=30)
    db.stop()
    assert "mariadb broken" in str(info.value)
    assert str(db.error_log) in str(info.value)


def test_load_rebuilds_handles_from_cluster_json(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    box = make_sandbox()
    again = Sandbox.load(box.workdir)
    assert [p.pid for p in again.processes()] == [p.pid for p in box.processes()]
    assert again.etcd_endpoints == box.etcd_endpoints
    assert again.primary.scalar("SELECT 1") == 1
    assert sorted(again.stop()) == ["etcd-etcd1", "mariadb-primary"]
    assert not any(p.is_running() for p in box.processes())
