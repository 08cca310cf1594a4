"""The client against real `canal-ha server` nodes on the sandbox (node_fixtures).

- `canal-ha consume --format json` output parses and matches the database;
- a consumer reads 10k changed rows while the leader is SIGKILLed twice and ends with
  every row, in order per key, duplicates within the documented bound, and its log
  names the leader changes it followed;
- two `canal-ha consume` processes with one client id: one consumes, the other waits;
  SIGKILL the active one and the other takes over from the cursor.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from node_fixtures import DEST, WAIT_S, NodeProc, wait_leader
from node_fixtures import node_cluster as _node_cluster  # noqa: F401 - the fixture

from canal_client.connector import ClusterConnector
from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol import Batch, EntryType

CLI = [sys.executable, "-m", "canal_ha.cli"]
TOKEN = "client-test-token"
NodeCluster = Callable[..., list[NodeProc]]


def fresh_db(sandbox: Sandbox, db: str, ddl: str) -> None:
    sandbox.primary.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}", ddl)


@pytest.fixture
def nodes_up(_node_cluster: NodeCluster) -> NodeCluster:  # noqa: F811
    """node_fixtures' ``node_cluster`` factory (nodes stopped after the test)."""
    return _node_cluster


@pytest.fixture
def cleanup_dbs(sandbox: Sandbox) -> Iterator[list[str]]:
    dbs: list[str] = []
    yield dbs
    for db in dbs:
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {db}")


def consume_cmd(sandbox: Sandbox, nodes: list[NodeProc], client: str, *extra: str) -> list[str]:
    etcd = ",".join(sandbox.etcd_endpoints)
    return [*CLI, "consume", "--etcd", etcd, "--prefix", nodes[0].prefix,
            "--destination", DEST, "--client-id", client, *extra]  # fmt: skip


def row_changes(lines: list[str]) -> list[dict[str, Any]]:
    """ROWDATA rows of JSON Lines output: {after values} per row."""
    out = []
    for line in lines:
        entry = json.loads(line)
        assert entry["type"] in ("TRANSACTIONBEGIN", "ROWDATA", "TRANSACTIONEND")
        if entry["type"] == "ROWDATA":
            for row in entry["rows"]:
                out.append({c["name"]: c["value"] for c in row["after"]})
    return out


# -- canal-ha consume --format json ------------------------------------------------------


def test_consume_cli_json_output_matches_the_database(
    sandbox: Sandbox, nodes_up: NodeCluster, cleanup_dbs: list[str]
) -> None:
    db = "t_client_cli"
    cleanup_dbs.append(db)
    fresh_db(sandbox, db, f"CREATE TABLE {db}.t (id INT PRIMARY KEY, name VARCHAR(20), "
                          "amount DECIMAL(10,2), raw VARBINARY(8), at DATETIME(3))")  # fmt: skip
    nodes = nodes_up(2, auth={"tokens": [TOKEN]}, destination={"filter": {"regex": f"{db}\\..*"}})
    wait_leader(nodes)
    denied = subprocess.run(consume_cmd(sandbox, nodes, "cli1", "--max-entries", "1"),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert denied.returncode == 1 and "bearer token" in denied.stderr, denied.stderr
    for i in range(1, 41):
        sandbox.primary.execute(
            f"INSERT INTO {db}.t VALUES ({i}, 'n{i}', {i}.25, 0x00ff{i:02x}, "
            f"'2024-01-02 03:04:05.{i:03d}')"
        )
    first = subprocess.run(  # written before it subscribed: --start earliest gets them
        consume_cmd(sandbox, nodes, "cli1", "--token", TOKEN, "--format", "json",
                    "--start", "earliest", "--max-entries", "10"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert len(lines) == 10
    rest = subprocess.run(
        consume_cmd(sandbox, nodes, "cli1", "--token", TOKEN, "--format", "json",
                    "--idle-exit", "3"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rest.returncode == 0, rest.stderr
    rows = row_changes(lines + rest.stdout.splitlines())
    db_rows = sandbox.primary.execute(
        f"SELECT id, name, CAST(amount AS CHAR), TO_BASE64(raw), "
        f"DATE_FORMAT(at, '%Y-%m-%dT%H:%i:%s.%f') FROM {db}.t ORDER BY id"
    )
    assert [r["id"] for r in rows] == list(range(1, 41))  # each row once, in order
    for got, (i, name, amount, raw, at) in zip(rows, db_rows, strict=True):
        assert (got["id"], got["name"], got["amount"], got["raw"]) == (i, name, amount, raw)
        assert str(got["at"]).startswith(at[:23])
    # a new client starts at the store's current end: write after it is connected
    leader = wait_leader(nodes)
    standby = next(n for n in nodes if n is not leader)
    cmd = consume_cmd(
        sandbox, nodes, "cli_text", "--token", TOKEN, "--format", "text", "--max-entries", "3"
    )
    lines = run_then_write(cmd, lambda: sandbox.primary.execute(
        f"UPDATE {db}.t SET name = 'changed' WHERE id = 7"))  # fmt: skip
    assert len(lines) == 3 and "BEGIN" in lines[0] and "COMMIT" in lines[2]
    assert f"UPDATE {db}.t [id=7, name='n7'" in lines[1] and "name='changed'" in lines[1]
    # --server on a standby: follows the 307 to the leader
    cmd = [*CLI, "consume", "--server", standby.url, "--destination", DEST, "--client-id", "cli1",
           "--format", "json", "--max-entries", "6"]  # fmt: skip
    lines = run_then_write(cmd, lambda: sandbox.primary.execute(
        f"UPDATE {db}.t SET name = 'again' WHERE id = 8"), env={"CANAL_TOKEN": TOKEN})  # fmt: skip
    assert [r["name"] for r in row_changes(lines)] == ["changed", "again"]  # from its cursor
    check_status(sandbox, nodes, leader, standby)


def run_then_write(
    cmd: list[str], write: Callable[[], object], env: dict[str, str] | None = None
) -> list[str]:
    """Start a consumer, write once it is connected, return its stdout lines (exit 0)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "connected to leader" in line:
                break
        write()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == 0, err
    return out.splitlines()


def check_status(
    sandbox: Sandbox, nodes: list[NodeProc], leader: NodeProc, standby: NodeProc
) -> None:
    etcd = ",".join(sandbox.etcd_endpoints)
    sources = (
        ["--etcd", etcd, "--prefix", nodes[0].prefix],
        ["--server", standby.url, "--token", TOKEN],
    )
    for source in sources:
        res = subprocess.run([*CLI, "status", *source, "--format", "json"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 0, res.stderr
        status = json.loads(res.stdout)
        d = status["destinations"][DEST]
        assert d["leader"]["url"] == leader.url and d["leader"]["epoch"] > 0
        assert sorted(d["nodes"]) == sorted(n.id for n in nodes)
        assert {n["node"] for n in status["nodes"]} == {n.id for n in nodes}
        client = d["clients"]["cli1"]
        assert client["cursor"]["position"]["journal"], client
    table = subprocess.run([*CLI, "status", "--etcd", etcd, "--prefix", nodes[0].prefix],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert table.returncode == 0 and f"leader: {leader.id} {leader.url}" in table.stdout


# -- failover under load ----------------------------------------------------------------

KEYS_N, VERSIONS = 200, 50  # 10k row changes: 200 inserts, then 49 updates of each key
BATCH = 100


@dataclass
class Seen:
    rows: list[tuple[int, int]] = field(default_factory=list)  # (key, version) as received
    batch_ids: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, batch: Batch) -> None:
        with self.lock:
            self.batch_ids.append(batch.id)
            for e in batch.entries:
                if e.type is EntryType.ROWDATA:
                    for r in e.rows:
                        v = r.after_values()
                        self.rows.append((int(v["k"]), int(v["ver"])))  # type: ignore[arg-type]

    def count(self) -> int:
        with self.lock:
            return len(self.rows)


def write_changes(sandbox: Sandbox, db: str, stop: threading.Event) -> None:
    """10k row changes, 20 per transaction, about 400 rows/s."""
    with sandbox.primary.admin() as conn, conn.cursor() as cur:
        changes = [(k, ver) for ver in range(VERSIONS) for k in range(KEYS_N)]
        for i in range(0, len(changes), 20):
            if stop.is_set():
                return
            chunk = changes[i : i + 20]
            cur.execute("BEGIN")
            if chunk[0][1] == 0:
                cur.executemany(f"INSERT INTO {db}.t (k, ver) VALUES (%s, %s)", chunk)
            else:
                cur.executemany(
                    f"UPDATE {db}.t SET ver = %s WHERE k = %s", [(v, k) for k, v in chunk]
                )
            cur.execute("COMMIT")
            stop.wait(0.05)


def progress(seen: Seen, errors: list[Exception], threshold: int) -> Callable[[], bool]:
    return lambda: seen.count() >= threshold or bool(errors)


def test_consumer_survives_two_leader_kills_with_every_row_in_order(
    sandbox: Sandbox,
    nodes_up: NodeCluster,
    cleanup_dbs: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="canal_client")
    db = "t_client_failover"
    cleanup_dbs.append(db)
    fresh_db(sandbox, db, f"CREATE TABLE {db}.t (k INT PRIMARY KEY, ver INT NOT NULL)")
    nodes = nodes_up(3, destination={"filter": {"regex": f"{db}\\..*"}})
    wait_leader(nodes)
    conn = ClusterConnector(
        DEST, "fo1", etcd=sandbox.etcd_endpoints, prefix=nodes[0].prefix,
        retry=RetryPolicy(initial_s=0.05, max_delay_s=0.5, deadline_s=WAIT_S),
    )  # fmt: skip
    seen, stop, errors = Seen(), threading.Event(), list[Exception]()
    conn.connect()
    conn.subscribe(f"{db}\\..*")

    def consume() -> None:
        try:
            while not stop.is_set():
                batch = conn.get_without_ack(BATCH, 0.5)
                if not batch.is_empty:
                    seen.add(batch)
                    conn.ack(batch.id)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    consumer = threading.Thread(target=consume, name="consumer")
    writer = threading.Thread(target=write_changes, args=(sandbox, db, stop), name="writer")
    consumer.start()
    writer.start()
    killed: list[NodeProc] = []
    try:
        for threshold in (2500, 6000):
            wait_until(progress(seen, errors, threshold), "consumer progress", WAIT_S)
            victim = wait_leader(nodes, exclude=killed)
            victim.kill()
            killed.append(victim)
            wait_leader(nodes, exclude=killed)
        writer.join(WAIT_S * 2)
        total = KEYS_N * VERSIONS
        wait_until(
            lambda: len(set(seen.rows)) >= total or bool(errors), "all rows consumed", WAIT_S
        )
    finally:
        stop.set()
        consumer.join(30)
        writer.join(30)
        conn.disconnect()
    assert not errors, errors
    assert set(seen.rows) == {(k, v) for k in range(KEYS_N) for v in range(VERSIONS)}
    first_seen: dict[int, list[int]] = {}
    done: set[tuple[int, int]] = set()
    for k, v in seen.rows:
        if (k, v) not in done:
            done.add((k, v))
            first_seen.setdefault(k, []).append(v)
    assert all(vs == list(range(VERSIONS)) for vs in first_seen.values())  # in order per key
    dups = len(seen.rows) - len(done)
    # bound: per kill, the unacked batch (<= BATCH entries) + acks not flushed within one
    # flush period (200 ms at ~400 rows/s, counted generously as 1 s of rows)
    assert dups <= len(killed) * (BATCH + 400), dups
    changes = [
        r.getMessage() for r in caplog.records if "following leader change" in r.getMessage()
    ]
    assert len(changes) >= 2, changes
    for victim in killed:
        assert any(victim.url in m for m in changes), (victim.url, changes)
    print(f"duplicates after {len(killed)} leader kills: {dups} rows; changes: {changes}")


# -- two consumers, one client id ----------------------------------------------------------

_BATCH_LOG = re.compile(r"^(\S+ \S+) DEBUG canal_client: \S+: batch (\d+) \((\d+) entries\)")


def batch_times(log_path: Path) -> list[tuple[datetime.datetime, int]]:
    out = []
    for line in log_path.read_text().splitlines():
        m = _BATCH_LOG.match(line)
        if m:
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            out.append((when, int(m.group(2))))
    return out


def test_two_consumers_one_client_id_one_active_then_takeover(
    sandbox: Sandbox, nodes_up: NodeCluster, cleanup_dbs: list[str], tmp_path: Path
) -> None:
    db = "t_client_excl"
    cleanup_dbs.append(db)
    fresh_db(sandbox, db, f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    nodes = nodes_up(2, destination={"filter": {"regex": f"{db}\\..*"}})
    wait_leader(nodes)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    outs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    cmd = consume_cmd(sandbox, nodes, "excl", "--format", "json", "--batch-size", "10",
                      "--client-ttl", "3", "--switch-delay", "1")  # fmt: skip
    try:
        for name in ("a", "b"):
            with outs[name].open("wb") as out, logs[name].open("wb") as err:
                procs[name] = subprocess.Popen([*CLI, "-v", *cmd[len(CLI) :]], stdout=out,
                                               stderr=err, env={**os.environ})  # fmt: skip
            if name == "a":  # a takes the client running key first
                wait_until(lambda: "is now active" in logs["a"].read_text(), "a active", WAIT_S)
        for i in range(1, 201):
            sandbox.primary.execute(f"INSERT INTO {db}.t VALUES ({i})")
        wait_until(lambda: len(row_changes(outs["a"].read_text().splitlines())) >= 100,
                   "a consumes", WAIT_S)  # fmt: skip
        assert outs["b"].read_text() == ""  # b waits
        procs["a"].kill()
        procs["a"].wait(30)
        for i in range(201, 301):
            sandbox.primary.execute(f"INSERT INTO {db}.t VALUES ({i})")

        def all_rows() -> bool:
            rows = {
                r["id"] for n in ("a", "b") for r in row_changes(outs[n].read_text().splitlines())
            }
            return rows == set(range(1, 301))

        wait_until(all_rows, "b takes over and consumes the rest", WAIT_S)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(30)
    a_batches, b_batches = batch_times(logs["a"]), batch_times(logs["b"])
    assert a_batches and b_batches
    assert max(t for t, _ in a_batches) < min(t for t, _ in b_batches)  # never both
    assert "is now active" in logs["b"].read_text()
    a_ids = [r["id"] for r in row_changes(outs["a"].read_text().splitlines())]
    b_ids = [r["id"] for r in row_changes(outs["b"].read_text().splitlines())]
    # b starts from the cursor: at most a's last (unacked) batch comes again
    assert b_ids[0] >= a_ids[-1] - 10 and sorted(set(a_ids) | set(b_ids)) == list(range(1, 301))


# -- bounded, clear failures and status lag (issue 13) ------------------------------------


def test_a_wrong_destination_fails_clearly_via_etcd_and_via_server(
    sandbox: Sandbox, nodes_up: NodeCluster
) -> None:
    nodes = nodes_up(1)
    leader = wait_leader(nodes)
    etcd = ",".join(sandbox.etcd_endpoints)
    long_wait = ["--connect-timeout", "600"]  # the answer must not wait for the timeout
    for extra in ([], ["--no-exclusive"]):
        res = subprocess.run(
            [*CLI, "consume", "--etcd", etcd, "--prefix", nodes[0].prefix, "--destination",
             "nope", "--client-id", "c1", *long_wait, *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert res.returncode == 1, res.stderr
        assert "'nope'" in res.stderr and "node1" in res.stderr and "configures" in res.stderr
    res = subprocess.run(
        [*CLI, "consume", "--server", leader.url, "--destination", "nope", "--client-id", "c1",
         *long_wait],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "'nope'" in res.stderr and "not served" in res.stderr


def status_json(*source: str) -> dict[str, Any]:
    res = subprocess.run([*CLI, "status", *source, "--format", "json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout)["destinations"][DEST])


def test_status_lag_is_the_same_from_etcd_and_server_and_stays_0_when_idle(
    sandbox: Sandbox, nodes_up: NodeCluster, cleanup_dbs: list[str]
) -> None:
    db = "t_client_status"
    cleanup_dbs.append(db)
    nodes = nodes_up(1)
    leader = wait_leader(nodes)
    fresh_db(sandbox, db, f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    for i in range(1, 6):
        sandbox.primary.execute(f"INSERT INTO {db}.t VALUES ({i})")
    # written before they subscribe: both start at the earliest held change
    behind = subprocess.run(consume_cmd(sandbox, nodes, "behind", "--max-entries", "2",
                                        "--start", "earliest"),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert behind.returncode == 0, behind.stderr
    caught = subprocess.run(consume_cmd(sandbox, nodes, "caught", "--idle-exit", "3",
                                        "--start", "earliest"),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert caught.returncode == 0 and caught.stdout, caught.stderr
    assert "WARNING" not in caught.stderr, caught.stderr  # a normal exit
    with leader.client() as http:  # subscribed, then unsubscribed: not listed
        path = f"/v1/destinations/{DEST}/clients/gone/subscription"
        assert http.put(path, json={"filter": ""}).status_code == 200
        assert http.delete(path).status_code == 200
    journal, offset = sandbox.primary.master_status()
    etcd = ["--etcd", ",".join(sandbox.etcd_endpoints), "--prefix", nodes[0].prefix]
    server = ["--server", leader.url]

    def lags(d: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        return {c: (v["lag_bytes"], v["lag_s"]) for c, v in d["clients"].items()}

    seen: list[dict[str, Any]] = []

    def same_and_caught_up() -> bool:
        seen[:] = [status_json(*etcd), status_json(*server)]
        return lags(seen[0]) == lags(seen[1]) and lags(seen[0]).get("caught") == (0, 0.0)

    wait_until(same_and_caught_up, "status from etcd and server agree", WAIT_S)
    from_etcd, from_server = seen
    assert set(from_etcd["clients"]) == set(from_server["clients"]) == {"behind", "caught"}
    cursor = from_etcd["clients"]["behind"]["cursor"]["position"]
    assert cursor["journal"] == journal
    assert from_etcd["clients"]["behind"]["lag_bytes"] == offset - cursor["offset"] > 0
    for d in seen:
        assert (d["binlog_end"]["journal"], d["binlog_end"]["offset"]) == (journal, offset)
    # an idle database: the figures do not grow with time (several readings over 3 s)
    until = time.monotonic() + 3
    while time.monotonic() < until:
        again = [lags(status_json(*etcd)), lags(status_json(*server))]
        assert again == [lags(from_etcd), lags(from_etcd)]
    table = subprocess.run([*CLI, "status", *etcd], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "LAG_BYTES" in table.stdout, table.stderr
