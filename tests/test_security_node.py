"""A node in production dress: etcd over TLS with a client certificate and a user whose
role holds only the node's prefix, MariaDB with ``require_secure_transport=ON`` and a
user that must present a client certificate (REQUIRE X509) holding only the grants
docs/security.md lists, every secret from an environment variable or a file.

The node reads the binlog and serves a consumer (``canal-ha consume`` over the same
secured etcd); no secret shows in the node's log, in any route's body, in the
commands' output or in cluster.json. A wrong password, certificate or CA, or a missing
grant stops ``canal-ha server`` at start naming the key.
"""

from __future__ import annotations

import gc
import json
import secrets
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from node_fixtures import NodeProc, start_nodes, wait_leader
from tls_fixtures import Pki, enable_etcd_auth, make_pki, run_cli, server_tls

from canal_cluster.retry import wait_until
from canal_ha.sandbox import STATE_FILE, Sandbox
from canal_ha.sandbox.ports import free_port
from canal_protocol.errors import BinlogConfigError
from canal_server.config import render_toml
from canal_server.parse.binlog_stream import check_server_config

PREFIX = "/secnode"
DEST = "example"
BOUND_S = 120.0
SECURE_ELECTION = {"ttl_s": 10.0, "safety_margin_s": 2.0, "loop_interval_s": 1.0,
                   "switch_delay_s": 1.0}  # fmt: skip
DB_USER, NOREPL_USER, NOMON_USER = "canal_tls", "canal_norepl", "canal_nomon"


@dataclass(frozen=True)
class Secrets:
    db: str
    etcd_node: str
    etcd_client: str
    token: str

    def all(self) -> list[str]:
        return [self.db, self.etcd_node, self.etcd_client, self.token]


@dataclass(frozen=True)
class SecureBox:
    box: Sandbox
    pki: Pki
    secrets: Secrets


def _secret(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def secure_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBox]:
    root = tmp_path_factory.mktemp("secure")
    pki = make_pki(root / "pki")
    s = Secrets(_secret("dbpw"), _secret("etcdnode"), _secret("etcdclient"), _secret("token"))
    with warnings.catch_warnings():  # MariaDB start-up leaks sockets (see coord_fixtures)
        warnings.simplefilter("ignore", ResourceWarning)
        box = Sandbox(root / "box", etcd_members=1, standby=False, tls=server_tls(pki))
        try:
            box.start()
            _db_users(box, s.db)
            enable_etcd_auth(box.etcd_cluster, pki, {
                "canal-node": (s.etcd_node, [("readwrite", f"{PREFIX}/")]),
                "canal-client": (s.etcd_client, [
                    ("read", f"{PREFIX}/"),
                    ("readwrite", f"{PREFIX}/destinations/{DEST}/c1/"),
                ]),
            })  # fmt: skip
        except BaseException:
            box.stop()
            raise
        gc.collect()
    try:
        yield SecureBox(box, pki, s)
    finally:
        box.stop()


def _db_users(box: Sandbox, password: str) -> None:
    """The node's user: client certificate required, exactly the documented grants."""
    host = "'127.0.0.1'"
    box.primary.execute(
        f"CREATE USER '{DB_USER}'@{host} IDENTIFIED BY '{password}' REQUIRE X509",
        f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{DB_USER}'@{host}",
        f"CREATE USER '{NOREPL_USER}'@{host} IDENTIFIED BY '{password}'",
        f"GRANT BINLOG MONITOR ON *.* TO '{NOREPL_USER}'@{host}",
        f"CREATE USER '{NOMON_USER}'@{host} IDENTIFIED BY '{password}'",
        f"GRANT REPLICATION SLAVE ON *.* TO '{NOMON_USER}'@{host}",
    )


def _etcd_section(sb: SecureBox) -> dict[str, Any]:
    pki = sb.pki
    return {
        "prefix": PREFIX, "timeout_s": 2.0, "ca_file": str(pki.ca),
        "cert_file": str(pki.client.cert), "key_file": str(pki.client.key),
        "username": "canal-node", "password": {"env": "CANAL_TEST_ETCD_PASSWORD"},
    }  # fmt: skip


def _db_section(sb: SecureBox, password_file: Path, **tls: Any) -> dict[str, Any]:
    pki = sb.pki
    return {
        "username": DB_USER,
        "password": {"file": str(password_file)},
        "tls": {"enabled": True, "ca_file": str(pki.ca), "cert_file": str(pki.db.cert),
                "key_file": str(pki.db.key), **tls},
    }  # fmt: skip


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(args, env, BOUND_S * 2)


def _client_args(sb: SecureBox) -> list[str]:
    pki = sb.pki
    return [
        "--etcd", ",".join(sb.box.etcd_endpoints), "--prefix", PREFIX,
        "--etcd-cacert", str(pki.ca), "--etcd-cert", str(pki.client.cert),
        "--etcd-key", str(pki.client.key), "--etcd-user", "canal-client",
    ]  # fmt: skip


def _every_route_body(node: NodeProc, token: str) -> list[str]:
    """The body of every operation the node's OpenAPI lists (ids filled in), with the
    right token and with a wrong one, plus /openapi.json itself."""
    fill = {
        "destination": DEST,
        "client_id": "leak-check",
        "batch_id": "1",
        "snapshot_id": "s1",
        "table": "sec.t",
    }
    bodies: list[str] = []
    with node.client(headers={"Authorization": f"Bearer {token}"}) as c:
        spec = c.get("/openapi.json")
        bodies.append(spec.text)
        for path, ops in spec.json()["paths"].items():
            url = path.format(**fill)
            for method in ops:
                for auth in (f"Bearer {token}", "Bearer wrong-token"):
                    r = c.request(method.upper(), url, headers={"Authorization": auth},
                                  json={} if method in ("post", "put") else None)  # fmt: skip
                    bodies.append(f"{method} {url} {r.status_code} {r.text}")
    return bodies


def test_node_over_tls_reads_serves_and_never_shows_a_secret(
    secure_box: SecureBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb, s = secure_box, secure_box.secrets
    db_file, token_file = tmp_path / "db_password", tmp_path / "token"
    db_file.write_text(s.db + "\n")  # as `echo` or Docker secrets write it
    token_file.write_text(s.token)
    monkeypatch.setenv("CANAL_TEST_ETCD_PASSWORD", s.etcd_node)
    nodes = start_nodes(
        sb.box, 1, tmp_path, etcd=_etcd_section(sb), election=SECURE_ELECTION,
        auth={"tokens": [{"file": str(token_file)}]},
        destination={"db": _db_section(sb, db_file), "filter": {"regex": "sec\\..*"}},
    )  # fmt: skip
    node = nodes[0]
    try:
        wait_leader(nodes, timeout_s=BOUND_S)
        health = node.health()
        assert health is not None
        assert health["etcd"] == {"reachable": True, "error": ""}
        assert health["destinations"][DEST]["database"]["reachable"] is True
        sb.box.primary.execute(
            "CREATE DATABASE IF NOT EXISTS sec",
            "CREATE TABLE sec.t (id INT PRIMARY KEY, v VARCHAR(20))",
            "INSERT INTO sec.t VALUES (1, 'first'), (2, 'second')",
        )
        # first (it does not ack): once every client acked them, the store lets rows go
        assert _rows_through_the_spark_connector(sb, tmp_path) == 2
        client_env = {"CANAL_ETCD_PASSWORD": s.etcd_client, "CANAL_TOKEN": s.token}
        consumed = _cli(
            ["consume", *_client_args(sb), "--destination", DEST, "--client-id", "c1",
             "--start", "earliest", "--format", "json", "--idle-exit", "8",
             "--connect-timeout", str(BOUND_S)],
            client_env,
        )  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr
        rows = [json.loads(line) for line in consumed.stdout.splitlines()]
        inserted = [r for r in rows if r["header"]["table"] == "t" and r["rows"]]
        assert [len(r["rows"]) for r in inserted] == [2], consumed.stdout
        status = _cli(["status", *_client_args(sb), "--format", "json"], client_env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["destinations"][DEST]["leader"]["node"] == node.id

        seen = {
            "node log": node.process.log_path.read_text(errors="replace"),
            "consume": consumed.stdout + consumed.stderr,
            "status": status.stdout + status.stderr,
            "cluster.json": (sb.box.workdir / STATE_FILE).read_text(),
            "node config": node.config_path.read_text(),
        }
        for i, body in enumerate(_every_route_body(node, s.token)):
            seen[f"route {i}: {body[:60]}"] = body
        assert len(seen) > 20
        for where, text in seen.items():
            for secret in s.all():
                assert secret not in text, f"a secret shows in {where}"
    finally:
        node.stop()


def _rows_through_the_spark_connector(sb: SecureBox, tmp_path: Path) -> int:
    """The Spark source's connector, built from its options (files for both secrets):
    the rows of sec.t it reads through the secured etcd (its driver side, no JVM)."""
    from canal_client.spark import CanalOptions, make_connector

    pki, s = sb.pki, sb.secrets
    (tmp_path / "spark_etcd_pw").write_text(s.etcd_client + "\n")
    (tmp_path / "spark_token").write_text(s.token + "\n")
    options = CanalOptions.parse({
        "etcd": ",".join(sb.box.etcd_endpoints), "etcdPrefix": PREFIX,
        "destination": DEST, "clientId": "spark1", "etcdCaFile": str(pki.ca),
        "etcdCertFile": str(pki.client.cert), "etcdKeyFile": str(pki.client.key),
        "etcdUser": "canal-client", "etcdPasswordFile": str(tmp_path / "spark_etcd_pw"),
        "tokenFile": str(tmp_path / "spark_token"),
    })  # fmt: skip
    conn = make_connector(options)
    rows = 0
    try:
        conn.connect()
        conn.subscribe("sec\\..*", start="earliest")
        deadline = 10
        while rows < 2 and deadline:
            batch = conn.get_without_ack(100, 2.0)
            rows += sum(len(getattr(e, "rows", ())) for e in batch.entries)
            deadline -= 1
    finally:
        conn.disconnect()
    return rows


def _server_start(
    sb: SecureBox, tmp_path: Path, db: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    config = {
        "node": {"id": "n-refused", "listen": f"127.0.0.1:{free_port()}"},
        "etcd": {"endpoints": sb.box.etcd_endpoints, **_etcd_section(sb)},
        "election": SECURE_ELECTION,
        "destinations": {DEST: {"master": {"address": f"127.0.0.1:{sb.box.primary.port}"},
                                "db": db}},
    }  # fmt: skip
    path = tmp_path / "node.toml"
    path.write_text(render_toml(config))
    return _cli(["server", "--config", str(path)],
                {"CANAL_TEST_ETCD_PASSWORD": sb.secrets.etcd_node})  # fmt: skip


KEY = f"destinations.{DEST}.db"
REFUSALS: dict[str, tuple[dict[str, Any], str, str]] = {
    "wrong password": ({"password": "wrong"}, f"{KEY}.password", "refused user 'canal_tls'"),
    "no client certificate": (
        {"tls": {"cert_file": "", "key_file": ""}}, f"{KEY}.password", "client certificate",
    ),
    "server CA not trusted": (
        {"tls": {"ca_file": "other"}}, f"{KEY}.tls.ca_file", "CERTIFICATE_VERIFY_FAILED",
    ),
    "no REPLICATION SLAVE": (
        {"username": NOREPL_USER}, f"{KEY}.username",
        f"lacks REPLICATION SLAVE (for the binlog dump): run GRANT REPLICATION SLAVE ON *.* "
        f"TO '{NOREPL_USER}'@'127.0.0.1'",
    ),
    "no BINLOG MONITOR": (
        {"username": NOMON_USER}, f"{KEY}.username", "lacks BINLOG MONITOR (for SHOW MASTER STATUS",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSALS))
def test_server_refuses_to_start_naming_the_database_key(
    secure_box: SecureBox, tmp_path: Path, case: str
) -> None:
    change, key, words = REFUSALS[case]
    password_file = tmp_path / "pw"
    password = secure_box.secrets.db if change.get("password") != "wrong" else "wrong-pw-51e0"
    password_file.write_text(password)
    db = _db_section(secure_box, password_file)
    if "username" in change:
        db["username"] = change["username"]
    tls = dict(change.get("tls", {}))
    if tls.get("ca_file") == "other":
        tls["ca_file"] = str(secure_box.pki.other_ca)
    db["tls"] = {**db["tls"], **tls}
    res = _server_start(secure_box, tmp_path, db)
    assert res.returncode == 2, res.stderr
    assert f"canal-ha server: {key}: " in res.stderr and words in res.stderr, res.stderr
    for secret in (*secure_box.secrets.all(), "wrong-pw-51e0"):
        assert secret not in res.stderr + res.stdout


@pytest.mark.parametrize(("user", "grant"), [(NOREPL_USER, "REPLICATION SLAVE"),
                                             (NOMON_USER, "BINLOG MONITOR")])  # fmt: skip
def test_reader_names_a_missing_grant_at_dump_start(
    secure_box: SecureBox, user: str, grant: str
) -> None:
    """A database that was down when the node started is checked when its reader starts:
    the reader fails with the grant named (not a retry loop of access errors)."""
    pki = secure_box.pki
    dsn = {
        "host": "127.0.0.1", "port": secure_box.box.primary.port, "user": user,
        "password": secure_box.secrets.db,
        "tls": {"ca": str(pki.ca), "cert": None, "key": None, "verify_identity": True},
    }  # fmt: skip
    with pytest.raises(BinlogConfigError, match=f"lacks {grant} .*GRANT {grant} ON"):
        check_server_config(dsn)


def test_health_error_names_no_secret_for_a_refused_database_login(
    secure_box: SecureBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that refuses the login later (password changed on the server): the
    node's health says so, without the password."""
    sb = secure_box
    db_file = tmp_path / "db_password"
    db_file.write_text(sb.secrets.db)
    monkeypatch.setenv("CANAL_TEST_ETCD_PASSWORD", sb.secrets.etcd_node)
    nodes = start_nodes(sb.box, 1, tmp_path, etcd={**_etcd_section(sb), "prefix": PREFIX},
                        election=SECURE_ELECTION,
                        destination={"db": _db_section(sb, db_file)})  # fmt: skip
    node = nodes[0]
    new_password = _secret("rotated")
    try:
        wait_leader(nodes, timeout_s=BOUND_S)
        sb.box.primary.execute(f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{new_password}'")

        def refused() -> bool:
            h = httpx.get(f"{node.url}/v1/health", timeout=30).json()
            return "1045" in h["destinations"][DEST]["database"]["error"]

        wait_until(refused, "health names the refused login", BOUND_S)
        text = httpx.get(f"{node.url}/v1/health", timeout=30).text
        for secret in (sb.secrets.db, new_password):
            assert secret not in text
    finally:
        sb.box.primary.execute(
            f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{sb.secrets.db}'"
        )
        node.stop()


def test_snapshot_chunks_are_read_over_the_same_tls(secure_box: SecureBox) -> None:
    """The snapshot's chunk reader (mysqlclient) connects with ``db.tls.*`` too: the
    server requires secure transport and the node's user a client certificate."""
    from canal_server.parse.snapshot import ChunkReader

    sb = secure_box
    sb.box.primary.execute(
        "CREATE DATABASE IF NOT EXISTS sec_snap",
        "CREATE TABLE IF NOT EXISTS sec_snap.t (id INT PRIMARY KEY, v VARCHAR(20))",
        "REPLACE INTO sec_snap.t VALUES (1, 'a'), (2, 'b')",
        f"GRANT SELECT ON sec_snap.* TO '{DB_USER}'@'127.0.0.1'",
    )
    pki = sb.pki
    dsn = {
        "host": "127.0.0.1", "port": sb.box.primary.port, "user": DB_USER,
        "password": sb.secrets.db,
        "tls": {"ca": str(pki.ca), "cert": str(pki.db.cert), "key": str(pki.db.key),
                "verify_identity": False},
    }  # fmt: skip
    with ChunkReader(dsn) as reader:
        chunk = reader.read(reader.shape("sec_snap", "t"), None, 10)
    assert len(chunk.rows) == 2
