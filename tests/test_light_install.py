"""`pip install .` into an empty venv is a consumer's install: `canal-ha consume` works
against real nodes without FastAPI, uvicorn, pydantic or mysql-replication installed,
and `canal-ha server` says which extra to install (exit 2).

The venv is made from this checkout with pip (the base dependencies come from PyPI or
pip's cache, as in setup), once per module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from node_fixtures import (
    DEST,
    NodeProc,
    node_cluster,  # noqa: F401 - the fixture
    wait_leader,
)

from canal_ha.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = ("fastapi", "uvicorn", "pydantic", "pymysql", "pymysqlreplication", "starlette")
NodeCluster = Callable[..., list[NodeProc]]


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(ROOT)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return venv


def run(venv: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=venv,
    )  # fmt: skip


def test_the_base_install_has_none_of_the_servers_dependencies(light_venv: Path) -> None:
    code = (
        "import importlib.util, canal_client, canal_protocol, canal_ha.cli\n"
        f"print([m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)])"
    )
    res = run(light_venv, "python", "-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_server_without_its_extra_names_the_pip_command(light_venv: Path, tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[node]\nid = "n1"\n')
    res = run(light_venv, "canal-ha", "server", "--config", str(config))
    assert res.returncode == 2, res.stderr
    assert "pip install 'canal-ha[server]'" in res.stderr


def test_consume_works_from_the_base_install(
    light_venv: Path,
    sandbox: Sandbox,
    node_cluster: NodeCluster,  # noqa: F811 - the fixture
) -> None:
    db = "t_light_install"
    sandbox.primary.execute(
        f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, note VARCHAR(20))",
    )  # fmt: skip
    try:
        nodes = node_cluster(1, destination={"filter": {"regex": f"{db}\\..*"}})
        leader = wait_leader(nodes)
        # a new subscription starts at the destination's end: subscribe, then write
        sub = run(light_venv, "canal-ha", "consume", "--server", leader.url,
                  "--destination", DEST, "--client-id", "light", "--idle-exit", "2")  # fmt: skip
        assert sub.returncode == 0, sub.stderr
        sandbox.primary.execute(f"INSERT INTO {db}.t VALUES (1, 'a'), (2, 'b')")
        res = run(light_venv, "canal-ha", "consume", "--etcd", sandbox.etcd_endpoints[0],
                  "--prefix", nodes[0].prefix, "--destination", DEST, "--client-id", "light",
                  "--format", "text", "--idle-exit", "3")  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert f"INSERT {db}.t [id=1, note='a'] | [id=2, note='b']" in res.stdout, res.stdout
    finally:
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {db}")
