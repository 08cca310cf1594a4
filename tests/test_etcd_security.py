"""etcd with TLS and users: a real etcd started with ``--client-cert-auth`` and
certificates made here with openssl, auth enabled, roles limited to a key prefix.

Everything canal-ha does with etcd works over it (calls, leases, elections, watches,
the client's connector, ``canal-ha status``); each kind of refusal (wrong password,
a client certificate etcd does not trust, none at all, a server certificate we do not
trust, a role without the prefix) fails at once with ``CoordinatorAccessDenied``
naming the setting, never a hang; a token etcd forgot is fetched again.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tls_fixtures import Pki, enable_etcd_auth, make_pki, run_cli, server_tls

from canal_client.connector import ClusterConnector
from canal_cluster.coordinator import WatchEvent, WatchEventType
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.etcd_security import EtcdSecurity
from canal_cluster.retry import wait_until
from canal_ha.sandbox import EtcdCluster
from canal_ha.sandbox.ports import free_port
from canal_protocol.errors import ConfigError, CoordinatorAccessDenied, RetryExhausted
from canal_server.config import render_toml

PREFIX = "/sec"
NODE_PASSWORD = "etcd-node-pw-5f1c"
OTHER_PASSWORD = "etcd-other-pw-77aa"
READER_PASSWORD = "etcd-reader-pw-93b0"
BOUND_S = 60.0  # generous: a refusal must come long before this (a hang would not)


@dataclass(frozen=True)
class SecureEtcd:
    cluster: EtcdCluster
    pki: Pki

    @property
    def endpoints(self) -> list[str]:
        return self.cluster.endpoints

    def security(self, **changes: Any) -> EtcdSecurity:
        base = EtcdSecurity(
            str(self.pki.ca), str(self.pki.client.cert), str(self.pki.client.key),
            "canal", NODE_PASSWORD,
        )  # fmt: skip
        return replace(base, **changes)

    def coordinator(self, **changes: str) -> EtcdCoordinator:
        return EtcdCoordinator(self.endpoints, timeout_s=5.0, security=self.security(**changes))


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    root = tmp_path_factory.mktemp("etcd-tls")
    pki = make_pki(root / "pki")
    cluster = EtcdCluster(root / "etcd", 1, tls=server_tls(pki))
    try:
        cluster.start()
        enable_etcd_auth(cluster, pki, {
            "canal": (NODE_PASSWORD, [("readwrite", f"{PREFIX}/")]),
            "other": (OTHER_PASSWORD, [("readwrite", "/elsewhere/")]),
            "reader": (READER_PASSWORD, [("read", f"{PREFIX}/")]),
        })  # fmt: skip
        yield SecureEtcd(cluster, pki)
    finally:
        cluster.stop()


def test_every_call_and_watch_works_with_tls_and_a_user(secure_etcd: SecureEtcd) -> None:
    coord = secure_etcd.coordinator()
    events: list[WatchEvent] = []
    try:
        coord.check_access(PREFIX)
        watch = coord.watch(f"{PREFIX}/w/", events.append, prefix=True)
        assert watch.established.wait(BOUND_S)
        coord.put(f"{PREFIX}/w/a", b"1")
        assert coord.get(f"{PREFIX}/w/a") is not None
        assert [kv.key for kv in coord.get_prefix(f"{PREFIX}/w/").items] == [f"{PREFIX}/w/a"]
        lease = coord.grant_lease(5)
        assert coord.keepalive(lease) > 0
        won = coord.campaign(f"{PREFIX}/w/leader", b"me", lease)
        assert won.won and won.epoch is not None
        assert coord.resign(f"{PREFIX}/w/leader", won.epoch)
        coord.revoke(lease)
        assert coord.delete(f"{PREFIX}/w/", prefix=True) == 1
        wait_until(lambda: len(events) >= 4, "the watch saw every change", BOUND_S)
        kinds = [e.type for e in events[:4]]
        assert kinds == [WatchEventType.PUT, WatchEventType.PUT, WatchEventType.DELETE,
                         WatchEventType.DELETE]  # fmt: skip
    finally:
        coord.close()


def test_a_token_etcd_forgot_is_fetched_again_for_calls_and_watches(
    secure_etcd: SecureEtcd,
) -> None:
    """etcd forgets tokens (their TTL, a restart of a member): calls and new watch
    streams authenticate again instead of failing."""
    coord = secure_etcd.coordinator()
    try:
        coord.put(f"{PREFIX}/t/a", b"1")
        coord._client.metadata = (("token", "forgotten.1"),)  # what etcd no longer knows
        assert coord.get(f"{PREFIX}/t/a") is not None
        assert coord._client.metadata != (("token", "forgotten.1"),)
        coord._client.metadata = (("token", "forgotten.2"),)
        events: list[WatchEvent] = []
        watch = coord.watch(f"{PREFIX}/t/a", events.append)
        assert watch.established.wait(BOUND_S)
        coord.put(f"{PREFIX}/t/a", b"2")
        wait_until(lambda: bool(events), "the watch saw the change", BOUND_S)
        coord.delete(f"{PREFIX}/t/", prefix=True)
    finally:
        coord.close()


def _refusal(check: Callable[[], object]) -> BaseException:
    """Run ``check`` in a thread; what it raised (it must end well within BOUND_S)."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            check()
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), "the access check hung"
    assert box, "etcd accepted what it must refuse"
    return box[0]


REFUSALS = {
    "wrong password": ({"password": "not-the-password"}, "etcd.password", "wrong user name"),
    "unknown user": ({"username": "nobody"}, "etcd.password", "wrong user name"),
    "untrusted client certificate": (
        {"cert_file": "rogue.crt", "key_file": "rogue.key"}, "etcd.cert_file", "client cert",
    ),
    "no client certificate": ({"cert_file": "", "key_file": ""}, "etcd.cert_file", "client cert"),
    "server certificate not trusted": ({"ca_file": "other-ca.crt"}, "etcd.ca_file", "handshake"),
    "role without the prefix": (
        {"username": "other", "password": OTHER_PASSWORD}, "etcd.username", "permission denied",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSALS))
def test_each_refusal_fails_at_once_naming_the_setting(secure_etcd: SecureEtcd, case: str) -> None:
    changes, key, words = REFUSALS[case]
    pki_dir = secure_etcd.pki.ca.parent
    changes = {k: str(pki_dir / v) if v.endswith((".crt", ".key")) else v
               for k, v in changes.items()}  # fmt: skip
    coord = secure_etcd.coordinator(**changes)
    try:
        exc = _refusal(lambda: coord.check_access(PREFIX))
    finally:
        coord.close()
    assert isinstance(exc, CoordinatorAccessDenied), repr(exc)
    assert exc.key == key and words in str(exc), str(exc)
    for secret in (NODE_PASSWORD, OTHER_PASSWORD, "not-the-password"):
        assert secret not in str(exc)


def test_a_read_only_role_may_read_but_not_write(secure_etcd: SecureEtcd) -> None:
    coord = secure_etcd.coordinator(username="reader", password=READER_PASSWORD)
    try:
        coord.check_access(PREFIX, write=False)
        exc = _refusal(lambda: coord.check_access(PREFIX, write=True))
    finally:
        coord.close()
    assert isinstance(exc, CoordinatorAccessDenied) and exc.key == "etcd.username", repr(exc)


def test_bad_files_and_plain_endpoints_are_config_errors(
    secure_etcd: SecureEtcd, tmp_path: Path
) -> None:
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"^etcd\.ca_file: .*no PEM"):
        secure_etcd.coordinator(ca_file=str(not_pem))
    with pytest.raises(ConfigError, match=r"^etcd\.cert_file: .*not a PEM certificate and its key"):
        secure_etcd.coordinator(key_file=str(secure_etcd.pki.rogue.key))  # not its key
    with pytest.raises(ConfigError, match=r"^etcd\.ca_file: .*use https://"):
        plain = [e.replace("https://", "http://") for e in secure_etcd.endpoints]
        EtcdCoordinator(plain, security=secure_etcd.security())
    with pytest.raises(ConfigError, match=r"^etcd\.password: "):
        EtcdSecurity(username="canal")


def test_connector_fails_at_connect_naming_the_setting(secure_etcd: SecureEtcd) -> None:
    """Not after the connect timeout: the first contact says etcd refuses us."""
    bad = secure_etcd.security(password="not-the-password")
    conn = ClusterConnector("example", "c1", etcd=secure_etcd.endpoints, prefix=PREFIX,
                            etcd_security=bad, connect_timeout_s=BOUND_S * 10)  # fmt: skip
    exc = _refusal(conn.connect)
    conn.disconnect()
    assert isinstance(exc, CoordinatorAccessDenied) and exc.key == "etcd.password", repr(exc)

    reader = secure_etcd.security(username="reader", password=READER_PASSWORD)
    conn = ClusterConnector("example", "c1", etcd=secure_etcd.endpoints, prefix=PREFIX,
                            etcd_security=reader, exclusive=True,
                            connect_timeout_s=BOUND_S * 10)  # fmt: skip
    exc = _refusal(conn.connect)
    conn.disconnect()
    assert isinstance(exc, CoordinatorAccessDenied) and exc.key == "etcd.username", repr(exc)
    assert not isinstance(exc, RetryExhausted)


def test_spark_connector_fails_at_connect_naming_its_option(secure_etcd: SecureEtcd) -> None:
    from canal_client.spark import CanalOptions, make_connector

    pki = secure_etcd.pki
    options = CanalOptions.parse({
        "etcd": ",".join(secure_etcd.endpoints), "etcdPrefix": PREFIX, "destination": "example",
        "clientId": "s1", "etcdCaFile": str(pki.ca), "etcdCertFile": str(pki.client.cert),
        "etcdKeyFile": str(pki.client.key), "etcdUser": "canal", "etcdPassword": "not-it",
    })  # fmt: skip
    conn = make_connector(options)
    exc = _refusal(conn.connect)
    conn.disconnect()
    assert isinstance(exc, CoordinatorAccessDenied) and exc.key == "etcdPassword", repr(exc)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(args, env, BOUND_S * 2)


def _etcd_args(secure_etcd: SecureEtcd) -> list[str]:
    pki = secure_etcd.pki
    return [
        "--etcd", ",".join(secure_etcd.endpoints), "--prefix", PREFIX,
        "--etcd-cacert", str(pki.ca), "--etcd-cert", str(pki.client.cert),
        "--etcd-key", str(pki.client.key), "--etcd-user", "canal",
    ]  # fmt: skip


def test_status_cli_over_tls_with_a_user(secure_etcd: SecureEtcd, tmp_path: Path) -> None:
    args = ["status", *_etcd_args(secure_etcd), "--format", "json"]
    ok = _cli(args, {"CANAL_ETCD_PASSWORD": NODE_PASSWORD})
    assert ok.returncode == 0, ok.stderr
    assert '"source": "etcd"' in ok.stdout

    secret_file = tmp_path / "etcd-password"
    secret_file.write_text(NODE_PASSWORD + "\n")
    ok = _cli([*args, "--etcd-password-file", str(secret_file)], {})
    assert ok.returncode == 0, ok.stderr

    bad = _cli(args, {"CANAL_ETCD_PASSWORD": "not-the-password"})
    assert bad.returncode == 2
    assert "$CANAL_ETCD_PASSWORD / --etcd-password-file: etcd refused user 'canal'" in bad.stderr
    assert "not-the-password" not in bad.stderr + bad.stdout
    assert NODE_PASSWORD not in ok.stderr + ok.stdout


def test_server_with_a_wrong_etcd_password_exits_naming_the_key(
    secure_etcd: SecureEtcd, tmp_path: Path
) -> None:
    pki = secure_etcd.pki
    config = {
        "node": {"id": "n1", "listen": f"127.0.0.1:{free_port()}"},
        "etcd": {"endpoints": secure_etcd.endpoints, "prefix": PREFIX,
                 "ca_file": str(pki.ca), "cert_file": str(pki.client.cert),
                 "key_file": str(pki.client.key), "username": "canal",
                 "password": {"env": "NODE_ETCD_PASSWORD"}},
        "destinations": {"example": {"master": {"address": f"127.0.0.1:{free_port()}"}}},
    }  # fmt: skip
    path = tmp_path / "node.toml"
    path.write_text(render_toml(config))
    res = _cli(["server", "--config", str(path)], {"NODE_ETCD_PASSWORD": "wrong-pw-3c2d"})
    assert res.returncode == 2, res.stderr
    assert "canal-ha server: etcd.password: etcd refused user 'canal'" in res.stderr
    assert "wrong-pw-3c2d" not in res.stderr + res.stdout

    missing = _cli(["server", "--config", str(path)], {})
    assert missing.returncode == 2
    assert "etcd.password: Value error, environment variable NODE_ETCD_PASSWORD is not set" in (
        missing.stderr
    )


class _FakeLeader(http.server.BaseHTTPRequestHandler):
    """A leader's answers to step-down and to a snapshot's progress, and what was asked."""

    asked: ClassVar[list[str]] = []

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.asked.append(f"POST {self.path}")
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"destination": "example", "from": "n1", "to": "n2", "epoch": 7,
                      "new_epoch": 9, "took_ms": 12.0})  # fmt: skip

    def do_GET(self) -> None:
        self.asked.append(f"GET {self.path}")
        self._answer({"id": "s1", "state": "done", "tables_done": 1, "tables_total": 1,
                      "rows": 5, "chunks": 1, "rows_per_s": 5.0})  # fmt: skip

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_every_command_finds_the_leader_through_a_secured_etcd(secure_etcd: SecureEtcd) -> None:
    """step-down and snapshot look the leader up as consume and status do: with the
    TLS and user options of a secured etcd (one lookup, canal_ha.source)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeLeader)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    coord = secure_etcd.coordinator()
    key = f"{PREFIX}/destinations/example/running"
    try:
        coord.put(key, json.dumps({"node": "n1", "url": url}).encode())
        env = {"CANAL_ETCD_PASSWORD": NODE_PASSWORD}
        down = _cli(["step-down", *_etcd_args(secure_etcd), "--destination", "example"], env)
        assert down.returncode == 0, down.stderr
        assert "example: n1 (epoch 7) -> n2 (epoch 9) in 12 ms" in down.stdout
        show = _cli(
            ["snapshot", *_etcd_args(secure_etcd), "--destination", "example", "--show", "s1"],
            env,
        )
        assert show.returncode == 0, show.stderr
        assert show.stdout.startswith("s1 done: tables 1/1, 5 rows in 1 chunks")
        assert _FakeLeader.asked == [
            "POST /v1/destinations/example/step-down",
            "GET /v1/destinations/example/snapshots/s1",
        ]
        refused = _cli(["step-down", *_etcd_args(secure_etcd), "--destination", "example"],
                       {"CANAL_ETCD_PASSWORD": "not-it"})  # fmt: skip
        assert refused.returncode == 2
        assert "etcd refused user 'canal'" in refused.stderr
    finally:
        coord.delete(key)
        coord.close()
        server.shutdown()
        server.server_close()
