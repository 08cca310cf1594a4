"""A private etcd cluster of 1 or 3 members on loopback ports (``https://`` with
``tls``: see ``canal_ha.sandbox.tls``; the peers talk plain HTTP on loopback)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from canal_cluster.retry import wait_until
from canal_ha.sandbox.ports import free_port
from canal_ha.sandbox.process import ManagedProcess
from canal_ha.sandbox.tls import ServerTls
from canal_protocol.errors import RetryExhausted, SandboxStartError

__all__ = ["EtcdCluster", "EtcdMember"]


def _etcd_env() -> dict[str, str]:
    """Our environment without ETCD_* variables (etcd reads them as flags)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}


@dataclass
class EtcdMember:
    name: str
    root: Path
    client_port: int
    peer_port: int
    metrics_port: int
    initial_cluster: str = ""
    tls: ServerTls | None = None
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.process = ManagedProcess(
            f"etcd-{self.name}", self._argv(), self.root / "etcd.log", env=_etcd_env()
        )

    @property
    def client_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def _argv(self) -> tuple[str, ...]:
        binary = shutil.which("etcd")
        if binary is None:
            raise SandboxStartError("etcd", "not installed (run scripts/setup.sh)")
        return (
            binary,
            "--name", self.name,
            "--data-dir", str(self.root / "data"),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "canal-ha-sandbox",
            "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--logger", "zap",
            "--log-outputs", "stderr",
            *self._tls_flags(),
        )  # fmt: skip

    def _tls_flags(self) -> tuple[str, ...]:
        tls = self.tls
        if tls is None:
            return ()
        flags = (
            "--cert-file", str(tls.cert_file), "--key-file", str(tls.key_file),
            "--trusted-ca-file", str(tls.ca_file),
        )  # fmt: skip
        return (*flags, "--client-cert-auth") if tls.require_client_cert else flags

    def healthy(self) -> bool:
        """etcd's own /health: true when the member has a leader and answers reads."""
        ctx = self.tls.client_context() if self.tls is not None else None
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=1.0, context=ctx
            ) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        def ok() -> bool:
            if not self.process.is_running():
                raise SandboxStartError(
                    f"etcd {self.name}", "process exited", str(self.process.log_path)
                )
            return self.healthy()

        try:
            wait_until(ok, f"etcd {self.name} healthy", timeout_s)
        except RetryExhausted as exc:
            if isinstance(exc.last_error, SandboxStartError):
                raise exc.last_error from None
            raise SandboxStartError(
                f"etcd {self.name}", "not healthy in time", str(self.process.log_path)
            ) from exc


@dataclass
class EtcdCluster:
    """1 or 3 members; members can be killed, paused and restarted one by one."""

    root: Path
    size: int = 1
    members: list[EtcdMember] = field(default_factory=list)
    tls: ServerTls | None = None

    def __post_init__(self) -> None:
        if self.size not in (1, 3):
            raise ValueError(f"etcd members must be 1 or 3, not {self.size}")
        if not self.members:
            ports = {
                f"etcd{i + 1}": (free_port(), free_port(), free_port()) for i in range(self.size)
            }
            initial = ",".join(f"{n}=http://127.0.0.1:{p[1]}" for n, p in ports.items())
            self.members = [
                EtcdMember(name, self.root / name, *p, initial_cluster=initial, tls=self.tls)
                for name, p in ports.items()
            ]

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def member(self, name: str) -> EtcdMember:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(f"no etcd member {name!r} (have {[m.name for m in self.members]})")

    def start(self, timeout_s: float = 60.0) -> None:
        for m in self.members:
            m.process.start()
        for m in self.members:
            m.wait_healthy(timeout_s)

    def restart_member(self, name: str, timeout_s: float = 60.0) -> None:
        """Start a stopped or killed member again on its data dir and wait for health."""
        m = self.member(name)
        m.process.stop()
        m.process.start()
        m.wait_healthy(timeout_s)

    def stop(self) -> list[str]:
        return [m.process.name for m in self.members if m.process.stop()]
