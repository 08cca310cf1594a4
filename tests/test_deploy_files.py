"""docker/: the compose file validates, its node configs are valid canal-ha configs, and
the image builds the C row decoder (and refuses to build without it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from canal_server.config import load_config

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
    for package in ("canal_cluster", "canal_server", "canal_client"):
        assert f"ok  {package} " in done.stdout


def test_extension_check_fails_naming_a_decoder_that_was_not_built(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "lib" / "pkgx" / "sub").mkdir(parents=True)
    (src / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {pkgx = "lib/pkgx"}\n')
    (src / "lib" / "pkgx" / "__init__.py").write_text("")
    (src / "lib" / "pkgx" / "sub" / "__init__.py").write_text("")
    (src / "lib" / "pkgx" / "sub" / "_fast.c").write_text("/* never compiled */\n")
    env = {**os.environ, "PYTHONPATH": str(src / "lib")}
    done = _check(src, tmp_path, env)
    assert done.returncode == 1
    assert "ok  pkgx " in done.stdout
    assert "C extension pkgx.sub._fast (from lib/pkgx/sub/_fast.c) was not built" in done.stderr

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
