"""docker/: the compose file validates, its node configs are valid canal-ha configs, and
the image builds the C row decoder (and refuses to build without it).

The deployment is secured: etcd over TLS with client certificates and users, every
secret from a file under /run/secrets. ``docker/make-secrets.sh`` is run here (openssl)
and ``docker/etcd_auth.py`` against a real etcd started with those certificates, so the
node configs are checked with the very files and roles the deployment would have."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_ha.sandbox import EtcdCluster, ServerTls
from canal_protocol.errors import CoordinatorAccessDenied
from canal_server.canal.auth import passwd_of
from canal_server.config import NodeConfig, load_config

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
CHECK = DOCKER / "check_c_extensions.py"


def compose_config() -> str:
    exe = shutil.which("docker-compose")
    assert exe is not None, "docker-compose is installed by scripts/setup.sh"
    res = subprocess.run(
        [exe, "-f", str(DOCKER / "compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_compose_file_validates_with_every_service() -> None:
    out = compose_config()
    for service in (
        "etcd1", "etcd2", "etcd3", "etcd-auth", "mariadb-primary", "mariadb-standby",
        "canal-node1", "canal-node2", "canal-node3", "spark-job",
    ):  # fmt: skip
        assert f"  {service}:" in out, service
    assert out.count("healthcheck:") >= 8
    assert "--binlog-row-metadata=FULL" in out


def test_compose_uses_tls_to_etcd_and_secrets_from_files() -> None:
    out = compose_config()
    assert "http://etcd" not in out, "every etcd URL (clients and peers) is https"
    assert out.count("https://etcd1:2379") >= 3  # members, etcd-auth, the Spark job
    assert out.count("--client-cert-auth") == 3 and out.count("--peer-client-cert-auth") == 3
    assert "service_completed_successfully" in out  # nodes start once etcd's auth is on
    assert "MARIADB_ROOT_PASSWORD_FILE: /run/secrets/mariadb_root_password" in out
    assert "etcdPasswordFile=/run/secrets/etcd_spark_password" in out
    assert "tokenFile=/run/secrets/rest_token" in out
    for needle in ("PASSWORD:", "password=", "root-secret", "canal-secret"):  # none inline
        assert needle not in out, needle
    assert not [line for line in out.splitlines() if "/secrets/" in line and ":ro" not in line
                and "/run/secrets/" not in line]  # fmt: skip


def test_compose_validation_catches_a_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text('version: "2.4"\nservices:\n  x:\n    image: a\n    not_a_key: 1\n')
    res = subprocess.run(
        ["docker-compose", "-f", str(bad), "config"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode != 0
    assert "not_a_key" in res.stderr


@pytest.fixture(scope="module")
def compose_secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``docker/make-secrets.sh`` makes (run twice: the second run keeps the files)."""
    out = tmp_path_factory.mktemp("compose") / "secrets"
    for _ in range(2):
        res = subprocess.run(["sh", str(DOCKER / "make-secrets.sh"), str(out)],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr
    return out


def _node_config(name: str, secrets: Path, tmp_path: Path) -> NodeConfig:
    """docker/config/NAME.toml with /run/secrets/ where the test made them."""
    text = (DOCKER / "config" / f"{name}.toml").read_text()
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace("/run/secrets/", f"{secrets}/"))
    return load_config(path)


@pytest.mark.parametrize("name", ["node1", "node2", "node3"])
def test_node_configs_load(name: str, compose_secrets: Path, tmp_path: Path) -> None:
    config = _node_config(name, compose_secrets, tmp_path)
    assert config.node.id == name
    dest = config.destinations["example"]
    assert (
        dest.db.password.get_secret_value() == (compose_secrets / "canal_db_password").read_text()
    )
    assert config.auth.tokens == [(compose_secrets / "rest_token").read_text()]
    password = (compose_secrets / "canal_password").read_text()
    assert config.canal.passwd_hash.hex().upper() == passwd_of(password)
    assert config.canal.advertised == f"canal-{name}:11111"
    security = config.etcd.security()
    assert security.username == "canal-node" and security.ca_file.startswith(str(compose_secrets))
    assert all(e.startswith("https://") for e in config.etcd.endpoints)


def test_mariadb_init_scripts_read_the_secret_files(compose_secrets: Path, tmp_path: Path) -> None:
    """Sourced by the mariadb image's entrypoint: the SQL they hand to
    ``docker_process_sql`` carries the passwords of the files and the documented grants."""
    sql = tmp_path / "sql"
    for script in ("10-users.sh", "20-standby.sh"):
        capture = f'docker_process_sql() {{ cat >> "{sql}"; }}'
        res = subprocess.run(
            ["sh", "-c", f'{capture}; . "{DOCKER}/mariadb/{script}"'],
            capture_output=True, text=True, timeout=60,
            env={"PATH": os.environ["PATH"], "SECRETS_DIR": str(compose_secrets)},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    text = sql.read_text()
    canal_pw = (compose_secrets / "canal_db_password").read_text()
    repl_pw = (compose_secrets / "repl_password").read_text()
    assert f"CREATE USER IF NOT EXISTS 'canal'@'%' IDENTIFIED BY '{canal_pw}';" in text
    assert "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'canal'@'%';" in text
    assert text.count(f"'{repl_pw}'") == 2  # the repl user, the standby's CHANGE MASTER


def test_etcd_auth_gives_the_nodes_and_spark_their_roles(
    compose_secrets: Path, tmp_path: Path
) -> None:
    """A real etcd with the deployment's certificates and --client-cert-auth; the
    etcd-auth service's script (twice: it may run again); then the node config's user
    reads and writes under /canal, Spark's only reads, and a certificate whose CN names
    no etcd user (etcd's own) gets nothing."""
    s = compose_secrets
    tls = ServerTls(s / "ca.crt", s / "etcd-server.crt", s / "etcd-server.key",
                    s / "etcd-root.crt", s / "etcd-root.key", require_client_cert=True)  # fmt: skip
    cluster = EtcdCluster(tmp_path / "etcd", 1, tls=tls)
    try:
        cluster.start()
        for _ in range(2):
            res = subprocess.run(
                [sys.executable, str(DOCKER / "etcd_auth.py"), "--endpoint", cluster.endpoints[0],
                 "--cacert", str(s / "ca.crt"), "--cert", str(s / "etcd-root.crt"),
                 "--key", str(s / "etcd-root.key"), "--secrets", str(s)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert res.returncode == 0, res.stderr
        config = _node_config("node1", s, tmp_path)
        node_security = config.etcd.security()
        node = EtcdCoordinator(cluster.endpoints, timeout_s=10.0, security=node_security)
        spark = EtcdCoordinator(cluster.endpoints, timeout_s=10.0, security=replace(
            node_security, cert_file=str(s / "spark.crt"), key_file=str(s / "spark.key"),
            username="spark", password=(s / "etcd_spark_password").read_text(),
        ))  # fmt: skip
        no_user = replace(node_security, username="", password="",
                          cert_file=str(s / "etcd-server.crt"),
                          key_file=str(s / "etcd-server.key"))  # fmt: skip
        anonymous = EtcdCoordinator(cluster.endpoints, timeout_s=10.0, security=no_user)
        try:
            node.check_access("/canal")
            spark.check_access("/canal", write=False)
            with pytest.raises(CoordinatorAccessDenied, match=r"^etcd\.username: "):
                spark.check_access("/canal", write=True)
            with pytest.raises(CoordinatorAccessDenied, match=r"^etcd\.username: "):
                anonymous.check_access("/canal", write=False)
        finally:
            for coord in (node, spark, anonymous):
                coord.close()
    finally:
        cluster.stop()


# -- the image: the C row decoder is built and checked ------------------------------------


def _stages(dockerfile: str) -> dict[str, list[str]]:
    """Instructions of each named stage (continuation lines joined)."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            current = stages.setdefault(m.group(1), [])
        current.append(line)
    return stages


def _ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore patterns as (exception?, regex) in order (Go filepath.Match + ``**``)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern, out, i = line.lstrip("!").strip("/"), "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        rules.append((negate, re.compile(out)))
    return rules


def _ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves ``path`` (or a directory above it) out of the context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    ignored = False
    for negate, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def build_context() -> set[str]:
    """The files `docker build` with the repository as context sends (compose: ``..``)."""
    ignore = REPO / ".dockerignore"
    rules = _ignore_rules(ignore.read_text()) if ignore.exists() else []
    files: set[str] = set()
    for top, dirs, names in os.walk(REPO):
        rel_top = Path(top).relative_to(REPO).as_posix()
        prefix = "" if rel_top == "." else rel_top + "/"
        dirs[:] = [d for d in dirs if d != ".git" and not _ignored(prefix + d, rules)]
        files.update(prefix + n for n in names if not _ignored(prefix + n, rules))
    return files


def test_image_context_holds_the_c_sources_and_no_local_builds() -> None:
    context = build_context()
    c_sources = subprocess.run(
        ["git", "ls-files", "*.c"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert c_sources, "the C row decoder's source is in git"
    for needed in ("setup.py", "pyproject.toml", "docker/check_c_extensions.py", *c_sources):
        assert needed in context, f"{needed} is not sent to docker build"
    assert not [f for f in context if f.endswith(".so")], "a local build must not slip in"
    assert not [f for f in context if f.startswith((".venv/", ".git/")) or "node_modules/" in f]


def test_dockerfile_builds_the_c_row_decoder_and_fails_without_it() -> None:
    stages = _stages((DOCKER / "Dockerfile").read_text())
    build = " ".join(stages["build"])
    assert re.search(r"COPY \. /src\b", build), "the whole tree (setup.py, C sources) is copied"
    assert "gcc" in build
    install = build.index('pip install "/src[server]"')  # a node needs the server extra
    check = build.index("check_c_extensions.py /src")
    assert install < check, "the installed packages are checked, in the build stage"
    node = " ".join(stages["node"])
    assert "COPY --from=build /opt/venv /opt/venv" in node and "PATH=/opt/venv/bin" in node
    assert "gcc" not in node, "no compiler in the runtime image"
    spark = " ".join(stages["spark"])
    assert "PYSPARK_PYTHON=/opt/venv/bin/python" in spark


def _check(
    src: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), str(src)],
        cwd=cwd, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def test_extension_check_passes_for_the_installed_decoder(tmp_path: Path) -> None:
    done = _check(REPO, tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^ok  canal_server(\.\w+)*\._rowcodec ", done.stdout, re.MULTILINE)
    assert re.search(r"^ok  canal_server\.canal\._canalcodec ", done.stdout, re.MULTILINE)
    for package in ("canal_cluster", "canal_server", "canal_client"):
        assert f"ok  {package} " in done.stdout


def test_extension_check_fails_naming_a_decoder_that_was_not_built(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "lib" / "pkgx" / "sub").mkdir(parents=True)
    (src / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {pkgx = "lib/pkgx"}\n')
    (src / "lib" / "pkgx" / "__init__.py").write_text("")
    (src / "lib" / "pkgx" / "sub" / "__init__.py").write_text("")
    (src / "lib" / "pkgx" / "sub" / "_fast.c").write_text("PyMODINIT_FUNC PyInit__fast(void);\n")
    (src / "lib" / "pkgx" / "sub" / "_part.c").write_text("/* a part of _fast: no module */\n")
    env = {**os.environ, "PYTHONPATH": str(src / "lib")}
    done = _check(src, tmp_path, env)
    assert done.returncode == 1
    assert "ok  pkgx " in done.stdout
    assert "C extension pkgx.sub._fast (from lib/pkgx/sub/_fast.c) was not built" in done.stderr

    assert "_part" not in done.stdout + done.stderr
    (src / "lib" / "pkgx" / "sub" / "_fast.c").unlink()
    done = _check(src, tmp_path, env)
    assert done.returncode == 1 and "no C sources" in done.stderr


def test_mysql_compose_variant_validates(tmp_path: Path) -> None:
    """docker/compose.mysql.yml: MySQL 8.4 with the binlog settings canal needs, and a node
    whose destination reads MySQL's binlog files (local.dir) from the data volume."""
    exe = shutil.which("docker-compose")
    assert exe is not None, "docker-compose is installed by scripts/setup.sh"
    res = subprocess.run(
        [exe, "-f", str(DOCKER / "compose.mysql.yml"), "config"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for needle in ("image: mysql:8.4", "--binlog-row-metadata=FULL", "--binlog-format=ROW",
                   "--binlog-row-image=FULL", "mysql:/mysql:ro", "canal-node1"):  # fmt: skip
        assert needle in res.stdout
    # the node's config is valid once its local.dir exists (the mounted volume)
    text = (DOCKER / "config" / "mysql-node1.toml").read_text()
    (tmp_path / "mysql").mkdir()
    path = tmp_path / "node.toml"
    path.write_text(text.replace('local.dir = "/mysql"', f'local.dir = "{tmp_path / "mysql"}"'))
    config = load_config(path)
    local = config.destinations["example"].local
    assert local is not None and local.dir == str(tmp_path / "mysql")


# -- metrics: Prometheus and the Grafana dashboard -------------------------------------------

GRAFANA = DOCKER / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "canal-ha.json"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_compose_runs_prometheus_and_grafana_provisioned_from_files() -> None:
    compose = _yaml(DOCKER / "compose.yml")
    services = compose["services"]
    prom, graf = services["prometheus"], services["grafana"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prom["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in graf["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in graf["volumes"]
    for svc in (prom, graf):  # published on the host's loopback only
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"])
    env = graf["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert env["GF_ANALYTICS_CHECK_FOR_UPDATES"] == "false"  # nothing fetched at run time
    assert "password grafana_admin_password" in (DOCKER / "make-secrets.sh").read_text()
    out = compose_config()  # docker-compose accepts it
    assert "  prometheus:" in out and "  grafana:" in out


def test_prometheus_scrapes_every_node() -> None:
    compose = _yaml(DOCKER / "compose.yml")
    nodes = sorted(s for s in compose["services"] if s.startswith("canal-node"))
    listen = {load_config_listen(DOCKER / "config" / f"node{n[-1]}.toml") for n in nodes}
    assert listen == {"0.0.0.0:11112"}
    (job,) = _yaml(DOCKER / "prometheus" / "prometheus.yml")["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"{n}:11112" for n in nodes]


def load_config_listen(path: Path) -> str:
    return str(tomllib.loads(path.read_text())["node"]["listen"])


def _exported_metric_names() -> set[str]:
    """Every sample name a node's /metrics has (a leader with a client and a snapshot)."""
    from canal_server.metrics import ClientGauge, DestinationGauges, NodeMetrics, SnapshotGauge

    class Leader:
        def gauges(self) -> list[DestinationGauges]:
            return [
                DestinationGauges(
                    "d", 7, True, 10, 2048, [ClientGauge("c", 1, 0.5)],
                    [SnapshotGauge("s1", "running", 0, 1, 10, 1, 5.0)], 4096, 100, 0.2,
                )
            ]  # fmt: skip

    metrics = NodeMetrics()
    metrics.instance("d")
    metrics.etcd_errors.inc()
    metrics.watch_state(Leader())
    text = metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_grafana_dashboard_plots_what_the_nodes_export() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ds = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    (provider,) = _yaml(GRAFANA / "provisioning" / "dashboards" / "canal-ha.yml")["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("throughput", "lag", "store fill", "leader epoch", "failovers", "etcd errors"):
        assert topic in titles, topic
    exported = _exported_metric_names()
    used: set[str] = set()
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == ds["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == ds["uid"]
            used |= set(re.findall(r"\bcanal_[a-z_]+", target["expr"]))
    assert used and used <= exported, sorted(used - exported)
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)
