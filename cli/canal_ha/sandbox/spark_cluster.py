"""A Spark standalone cluster on loopback ports: a master and workers from the pyspark
package's own ``bin/spark-class``, executors in their own JVMs (and Python workers);
and a Spark Connect server (``sbin/start-connect-server.sh``, ``SparkConnectServer``).

::

    cluster = SparkStandalone(workdir, workers=2).start()   # waits for every worker
    cluster.submit(["examples/spark_to_parquet.py", ...])   # spark-submit, its exit code
    cluster.stop()                                          # by pid, executors included

Every process is started by this code on free 127.0.0.1 ports (master, its web UI, each
worker and its web UI) with its log under ``workdir``, and stopped by pid: the worker
JVMs first (they end their executors), then anything still running in their process
groups (an executor of a killed worker), then the master. Executors run the Python
given as ``python`` (``spark.pyspark.python``): the interpreter that has canal-ha and
pyarrow installed, the same on every worker (here: this machine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canal_cluster.retry import wait_until
from canal_ha.sandbox.ports import free_port, port_open
from canal_ha.sandbox.process import ManagedProcess, pid_alive
from canal_protocol.errors import SandboxStartError

__all__ = ["SparkConnectServer", "SparkStandalone", "spark_home"]

START_TIMEOUT_S = 120.0


def spark_home() -> Path:
    """The pyspark package directory (it ships ``bin/spark-class``, ``bin/spark-submit``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SandboxStartError("spark", "pyspark is not installed (pip install 'canal-ha[spark]')")
    return Path(spec.origin).parent


def _group_members(pgid: int) -> list[int]:
    """Pids of the live processes of process group ``pgid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


class _SparkProcess(ManagedProcess):
    """``spark-class`` execs java: the pid runs another command than ``argv[0]``."""

    def is_running(self) -> bool:
        popen = self._popen
        if popen is not None:
            return popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)


@dataclass
class SparkStandalone:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) under ``workdir``."""

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    python: str = sys.executable
    master_port: int = 0
    ui_port: int = 0
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        env.update(
            SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.workdir / "logs"), PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python, SPARK_NO_DAEMONIZE="1",
        )  # fmt: skip
        return env

    def _spark_class(self, name: str, main: str, *args: str) -> ManagedProcess:
        argv = (str(spark_home() / "bin" / "spark-class"), main, *args)
        proc = _SparkProcess(name, argv, self.workdir / f"{name}.log", env=self.env())
        proc.start()
        self.processes.append(proc)
        return proc

    def start(self) -> SparkStandalone:
        """Start the master, then the workers; wait until all are registered ALIVE."""
        self.workdir = self.workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.master_port, self.ui_port = free_port(), free_port()
        try:
            master = self._spark_class(
                "spark-master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.master_port), "--webui-port", str(self.ui_port),
            )  # fmt: skip
            wait_until(
                lambda: port_open(self.ui_port) or not master.is_running(),
                "the Spark master's web UI", START_TIMEOUT_S,
            )  # fmt: skip
            if not master.is_running():
                raise SandboxStartError("spark-master", "it exited", str(master.log_path))
            for i in range(1, self.workers + 1):
                work = self.workdir / f"worker{i}"
                self._spark_class(
                    f"spark-worker{i}", "org.apache.spark.deploy.worker.Worker",
                    "--host", "127.0.0.1", "--port", str(free_port()),
                    "--webui-port", str(free_port()), "--cores", str(self.cores),
                    "--memory", self.memory, "--work-dir", str(work), self.url,
                )  # fmt: skip
            wait_until(
                lambda: self.alive_workers() >= self.workers, f"{self.workers} Spark workers",
                START_TIMEOUT_S,
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` (workers, applications)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def alive_workers(self) -> int:
        try:
            workers = self.state().get("workers") or []
        except OSError:
            return 0
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def submit_argv(self, app: list[str], conf: dict[str, str] | None = None) -> list[str]:
        """``spark-submit`` of ``app`` (a script and its arguments) to this cluster."""
        settings = {
            "spark.pyspark.python": self.python, "spark.pyspark.driver.python": self.python,
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m", "spark.executor.cores": str(self.cores),
            "spark.ui.enabled": "false", "spark.python.authenticate.socketTimeout": "120s",
            **(conf or {}),
        }  # fmt: skip
        confs = [arg for k, v in settings.items() for arg in ("--conf", f"{k}={v}")]
        submit = str(spark_home() / "bin" / "spark-submit")
        return [submit, "--master", self.url, "--deploy-mode", "client", *confs, *app]

    def submit(
        self, app: list[str], log: Path, timeout_s: float, conf: dict[str, str] | None = None
    ) -> int:
        """Run ``spark-submit`` (its own process group, output to ``log``); its exit code.
        On timeout the whole group is killed and ``TimeoutError`` raised."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.submit_argv(app, conf), stdout=out, stderr=subprocess.STDOUT,
                env=self.env(), start_new_session=True,
            )  # fmt: skip
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise TimeoutError(f"spark-submit did not finish in {timeout_s:g} s: {log}") from None

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers started (children in the workers' groups)."""
        pids = []
        for proc in self.processes[1:]:
            if proc.pid is not None:
                pids += [p for p in _group_members(proc.pid) if p != proc.pid]
        return pids

    def stop(self) -> list[str]:
        """Stop by pid: workers, what remains in their process groups, the master."""
        stopped = []
        for proc in reversed(self.processes):
            groups = _group_members(proc.pid) if proc.pid is not None else []
            if proc.stop(timeout_s=20):
                stopped.append(proc.name)
            for pid in groups:
                if pid != proc.pid and pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        return stopped


@dataclass
class SparkConnectServer:
    """``start-connect-server.sh`` in the foreground on a free loopback port (``master``:
    where its SparkSession runs); its Python workers run ``python`` (it needs canal-ha)."""

    workdir: Path
    master: str = "local[2]"
    python: str = sys.executable
    port: int = 0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> SparkConnectServer:
        self.workdir = self.workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = SparkStandalone(self.workdir, python=self.python).env()
        env.update(SPARK_PID_DIR=str(self.workdir), SPARK_NO_DAEMONIZE="1")
        confs = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
            "spark.python.authenticate.socketTimeout": "120s",
        }  # fmt: skip
        argv = (
            str(spark_home() / "sbin" / "start-connect-server.sh"), "--master", self.master,
            *(arg for k, v in confs.items() for arg in ("--conf", f"{k}={v}")),
        )  # fmt: skip
        self.process = _SparkProcess(
            "spark-connect", argv, self.workdir / "spark-connect.log", env=env
        )
        self.process.start()
        proc = self.process
        try:
            wait_until(
                lambda: port_open(self.port) or not proc.is_running(),
                "the Spark Connect server", START_TIMEOUT_S,
            )  # fmt: skip
            if not proc.is_running():
                raise SandboxStartError("spark-connect", "it exited", str(proc.log_path))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> bool:
        """Stop it by pid (and whatever remains in its process group)."""
        proc = self.process
        if proc is None or proc.pid is None:
            return False
        group = _group_members(proc.pid)
        stopped = proc.stop(timeout_s=20)
        for pid in group:
            if pid != proc.pid and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return stopped
