"""docker/: the compose file validates and its node configs are valid canal-ha configs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from canal_server.config import load_config

DOCKER = Path(__file__).resolve().parent.parent / "docker"


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
        "etcd1", "etcd2", "etcd3", "mariadb-primary", "mariadb-standby",
        "canal-node1", "canal-node2", "canal-node3", "spark-job",
    ):  # fmt: skip
        assert f"  {service}:" in out, service
    assert out.count("healthcheck:") >= 8
    assert "--binlog-row-metadata=FULL" in out


def test_compose_validation_catches_a_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text('version: "2.4"\nservices:\n  x:\n    image: a\n    not_a_key: 1\n')
    res = subprocess.run(
        ["docker-compose", "-f", str(bad), "config"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode != 0
    assert "not_a_key" in res.stderr


@pytest.mark.parametrize("name", ["node1", "node2", "node3"])
def test_node_configs_load(name: str) -> None:
    config = load_config(DOCKER / "config" / f"{name}.toml")
    assert config.node.id == name
    assert "example" in config.destinations
