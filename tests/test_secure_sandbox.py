"""``canal-ha up --secure`` through the walkthrough docs/operations.md shows ("A secure
sandbox"), run as it stands there.

Each ``$`` line of the section's console blocks runs in bash, in order, with the
section's workdir, etcd endpoint, MariaDB port and node URLs replaced by this run's
(shell variables set by an earlier line carry over); the Spark example's line runs its
functions (``examples/spark_to_parquet.py``: ``parse_args``, ``start_query``,
``follow``, ``summary``) with its expanded arguments on the tests' SparkSession. Every
output line the page shows must appear in the command's output (digits compared as
digits, not values; log lines and a snapshot's intermediate progress are not
compared), and a command the page shows failing must fail. Then: every key, password
and token is a 0600 file, cluster.json names each, Canal's TCP listener takes the
password of its file and no other, and no secret value shows in any command's output,
cluster.json, a node config or any log of the sandbox. After
``down``: a plain ``up`` is refused on that workdir, and ``up --secure`` starts it again
(etcd with auth already on, the same passwords).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from canal_java_client import CanalClientError, SimpleConnector
from spark_fixtures import spark  # noqa: F401  (fixture)

from canal_ha.sandbox.secure import CANAL_TCP_USER, SecureSetup

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations.md"
SECTION = "## A secure sandbox"
DOC_WORKDIR = "/tmp/secure-run"
BOUND_S = 300.0
NOT_COMPARED = re.compile(r" INFO |^s\d+ (pending|running)")
FAILS = re.compile(r"^(ERROR \d+|canal-ha [a-z-]+: )")


@dataclass(frozen=True)
class Step:
    command: str
    output: tuple[str, ...]

    @property
    def assignment(self) -> bool:
        """``NAME=value`` alone: a shell variable later lines use."""
        words = shlex.split(self.command)
        return len(words) == 1 and re.match(r"^[A-Z_]+=", words[0]) is not None

    @property
    def should_fail(self) -> bool:
        return any(FAILS.match(line) for line in self.output)


def walkthrough() -> list[Step]:
    text = DOC.read_text()
    start = text.index(SECTION)
    section = text[start : text.index("\n## ", start + 1)]
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```", section, re.M | re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return [Step(command, tuple(output)) for command, output in steps]


def normal(line: str) -> str:
    return re.sub(r"\d+", "0", line).rstrip()


def shown_lines_missing(step: Step, actual: str, workdir: Path) -> list[str]:
    got = {normal(line.replace(str(workdir), DOC_WORKDIR)) for line in actual.splitlines()}
    return [
        line for line in step.output if not NOT_COMPARED.search(line) and normal(line) not in got
    ]


class Shell:
    """Runs the page's lines: its values replaced by this run's, its variables kept."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.replace: dict[str, str] = {DOC_WORKDIR: str(workdir)}
        self.variables: list[str] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD", "CANAL_"))}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"

    def learn(self, shown_up: Step) -> None:
        """The page's endpoint, port and node URLs (its ``up`` output) → this run's."""
        state = json.loads((self.workdir / "cluster.json").read_text())
        shown = "\n".join(shown_up.output)
        etcd = re.search(r"etcd\s+(https://127\.0\.0\.1:\d+)", shown)
        port = re.search(r"primary\s+mysql://canal@127\.0\.0\.1:(\d+)", shown)
        assert etcd and port, "the page shows up's etcd and primary lines"
        self.replace[etcd.group(1)] = state["etcd"]["endpoints"][0]
        self.replace[f"-P{port.group(1)}"] = f"-P{state['mariadb']['primary']['port']}"
        for name, url in re.findall(r"^\s+(node\d+)\s+(http://\S+)", shown, re.M):
            self.replace[url] = next(n["url"] for n in state["nodes"] if n["name"] == name)

    def line(self, command: str) -> str:
        for shown, ours in self.replace.items():
            command = command.replace(shown, ours)
        return command

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        script = "\n".join([*self.variables, self.line(command)])
        return subprocess.run(
            ["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=BOUND_S, env=self.env, cwd=ROOT,
        )  # fmt: skip

    def words(self, command: str) -> list[str]:
        """The command's words as bash expands them (its redirections left out)."""
        bare = re.sub(r"\s*2>\S+", "", self.line(command))
        res = self.run(f"printf '%s\\0' {bare.removeprefix('python ')}")
        assert res.returncode == 0, res.stdout
        return res.stdout.split("\0")[:-1]


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "spark_to_parquet", ROOT / "examples" / "spark_to_parquet.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_spark_example(session: Any, argv: list[str]) -> str:
    """What the example prints, run on ``session`` (its own session costs a JVM)."""
    assert argv[0] == "examples/spark_to_parquet.py", argv
    ex = example()
    args = ex.parse_args(argv[1:])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ex.follow(ex.start_query(session, args))
        ex.summary(session, args.output)
    return out.getvalue()


def secret_values(setup: SecureSetup) -> dict[str, str]:
    return {p.name: p.read_text() for p in setup.secret_files() if not p.name.endswith(".key")}


def test_the_page_shows_every_command_and_the_comparison_sees_a_change() -> None:
    """What the walkthrough covers, read from the page; the check of a shown line fails
    on a changed word and passes on changed numbers."""
    steps = walkthrough()
    ran = {s.command.split()[1] for s in steps if s.command.startswith("canal-ha ")}
    assert {"up", "status", "consume", "step-down", "snapshot", "down"} <= ran
    assert any("/v1/console/actions" in s.command and "admin.token" in s.command for s in steps)
    spark_line = [s.command for s in steps if s.command.startswith("python examples/")]
    assert len(spark_line) == 1 and "tokenFile=" in spark_line[0]
    failing = [s.command for s in steps if s.should_fail]
    assert len(failing) == 3, failing  # no TLS, a client id not granted, a consumer token
    handover = next(s for s in steps if s.command.startswith("canal-ha step-down") and s.output
                    and not s.should_fail)  # fmt: skip
    shown = handover.output[0]
    assert not shown_lines_missing(handover, re.sub(r"\d+", "7", shown), Path("/w"))
    assert shown_lines_missing(handover, shown.replace("->", "=>"), Path("/w")) == [shown]


@pytest.mark.timeout(900)  # a sandbox, a Spark query and a second start on a loaded machine
def test_the_secure_sandbox_walkthrough_runs_as_the_page_shows(
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    workdir = tmp_path / "secure-run"
    sh = Shell(workdir)
    steps = walkthrough()
    assert steps[0].command.startswith("canal-ha up --secure ")
    assert steps[-1].command.startswith("canal-ha down ")
    outputs: dict[str, str] = {}
    setup: SecureSetup | None = None
    try:
        for step in steps:
            if step.assignment:
                sh.variables.append(sh.line(step.command))
                continue
            if step.command.startswith("python examples/spark_to_parquet.py"):
                actual, failed = run_spark_example(spark, sh.words(step.command)), False
            else:
                res = sh.run(step.command)
                actual, failed = res.stdout, res.returncode != 0
            outputs[step.command] = actual
            assert failed == step.should_fail, f"$ {step.command}\n{actual}"
            missing = shown_lines_missing(step, actual, workdir)
            assert not missing, f"$ {step.command}\nnot in its output: {missing}\n{actual}"
            if step is steps[0]:
                sh.learn(step)
                setup = SecureSetup.from_json(
                    json.loads((workdir / "cluster.json").read_text())["secure"]
                )
                assert setup is not None
                _check_files(setup, workdir)
                _check_canal_login(setup, workdir)
    finally:
        subprocess.run([sys.executable, "-m", "canal_ha.cli", "down", "--workdir", str(workdir)],
                       capture_output=True, timeout=BOUND_S, env=sh.env)  # fmt: skip
    assert len(outputs) >= 12 and setup is not None
    _check_no_secret_shows(setup, workdir, outputs)
    _check_start_again(sh, workdir)


def _check_files(setup: SecureSetup, workdir: Path) -> None:
    """0700 directories, 0600 secrets, each named in cluster.json."""
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
    assert stat.S_IMODE(setup.root.stat().st_mode) == 0o700
    state = (workdir / "cluster.json").read_text()
    assert len(setup.secret_files()) == 15  # 5 keys, 7 passwords, Canal's hash, 2 tokens
    for path in setup.secret_files():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert json.dumps(str(path)) in state, f"cluster.json does not name {path}"


def _check_canal_login(setup: SecureSetup, workdir: Path) -> None:
    """Canal's TCP listener takes its user's password from the file (a Canal client's
    scrambled login), and refuses another (connect only: a subscription would pin rows)."""
    node = json.loads((workdir / "cluster.json").read_text())["nodes"][0]
    host, port = node["canal"].rsplit(":", 1)
    password = setup.password_file("canal").read_text()
    good = SimpleConnector((host, int(port)), CANAL_TCP_USER, password, "example", so_timeout_s=30)
    good.connect()
    good.disconnect()
    bad = SimpleConnector((host, int(port)), CANAL_TCP_USER, "wrong", "example", so_timeout_s=30)
    with pytest.raises(CanalClientError, match=f"auth failed for user:{CANAL_TCP_USER}$"):
        bad.connect()
    bad.disconnect()


def _check_no_secret_shows(setup: SecureSetup, workdir: Path, outputs: dict[str, str]) -> None:
    texts = {f"$ {c}": out for c, out in outputs.items()}
    for path in workdir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".toml", ".log", ".cnf", ".err"):
            texts[str(path)] = path.read_text(errors="replace")
    assert any(name.endswith("node1.log") for name in texts)
    for name, value in secret_values(setup).items():
        assert len(value) >= 32, name
        for where, text in texts.items():
            assert value not in text, f"the secret of {name} shows in {where}"


def _check_start_again(sh: Shell, workdir: Path) -> None:
    """A plain up is refused; up --secure starts it again with the same secrets (etcd
    with auth on since the first start); the clients' user still gets in."""
    plain = sh.run(f"canal-ha up --detach --workdir {workdir} --nodes 0")
    assert plain.returncode == 2, plain.stdout
    assert "--secure: " in plain.stdout and "was set up with --secure" in plain.stdout
    again = sh.run(f"canal-ha up --secure --detach --workdir {workdir} --nodes 0")
    try:
        assert again.returncode == 0, again.stdout
        state = json.loads((workdir / "cluster.json").read_text())
        clients = re.search(r"^  clients  (.*)$", again.stdout, re.M)
        assert clients is not None, again.stdout
        status = sh.run(f"canal-ha status {clients.group(1)} --format json")
        assert status.returncode == 0, status.stdout
        clients_now = json.loads(status.stdout)["destinations"]["example"]["clients"]
        assert {"c1", "spark1"} <= set(clients_now), status.stdout  # the same etcd data
        assert state["secure"]["dir"] == str(workdir / "secrets")
    finally:
        down = sh.run(f"canal-ha down --workdir {workdir}")
    assert down.returncode == 0, down.stdout
