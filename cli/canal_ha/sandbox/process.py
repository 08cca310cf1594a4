"""Start, signal and stop one OS process by pid, with its output kept in a log file.

A ``ManagedProcess`` can be rebuilt from a record (pid, argv, log) by a different
Python process (``canal-ha down``), so every operation works by pid. Before
signalling, the pid is checked against the recorded command line so a recycled pid
that now belongs to something else is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from canal_cluster.retry import wait_until

__all__ = ["ManagedProcess", "ProcessRecord", "pid_alive"]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


@dataclass(frozen=True)
class ProcessRecord:
    """What is written to cluster.json for one process."""

    name: str
    pid: int
    argv: tuple[str, ...]
    log: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "argv": list(self.argv), "log": self.log}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessRecord:
        argv = data["argv"]
        assert isinstance(argv, list)
        return cls(
            str(data["name"]), int(str(data["pid"])), tuple(map(str, argv)), str(data["log"])
        )


@dataclass
class ManagedProcess:
    """One process we started (or adopted from a record); controlled by pid."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    env: dict[str, str] | None = None
    pid: int | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start the process in its own session, stdout and stderr appended to the log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- start {time.strftime('%Y-%m-%d %H:%M:%S')}: ".encode())
            log.write((" ".join(self.argv) + "\n").encode())
            log.flush()
            self._popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.pid = self._popen.pid

    def record(self) -> ProcessRecord:
        assert self.pid is not None, f"{self.name} was never started"
        return ProcessRecord(self.name, self.pid, self.argv, str(self.log_path))

    @classmethod
    def adopt(cls, rec: ProcessRecord) -> ManagedProcess:
        return cls(rec.name, rec.argv, Path(rec.log), pid=rec.pid)

    def is_running(self) -> bool:
        """True while our child runs; for an adopted pid: while it is alive and still
        runs the command we recorded."""
        if self.pid is None:
            return False
        if self._popen is not None:
            # our own child: its pid cannot be recycled before we reap it, so poll() is
            # the truth (its command line may change by exec, or read empty meanwhile)
            return self._popen.poll() is None
        if not pid_alive(self.pid):
            return False
        cmd = _cmdline(self.pid)
        return bool(cmd) and cmd[0] == self.argv[0]

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` if the process is still ours; False when it was already gone."""
        if not self.is_running():
            return False
        assert self.pid is not None
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL and wait for the exit (ports are free afterwards)."""
        self.signal(signal.SIGKILL)
        self.wait_exit(10.0)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM (after SIGCONT, in case it is paused), then SIGKILL after the timeout.

        Returns True when a running process was stopped, False when none was running.
        """
        if not self.is_running():
            self._reap()
            return False
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if not self._wait_quietly(timeout_s):
            self.signal(signal.SIGKILL)
            self.wait_exit(10.0)
        return True

    def wait_exit(self, timeout_s: float) -> None:
        wait_until(lambda: not self._alive_raw(), f"exit of {self.name}", timeout_s)
        self._reap()

    def _wait_quietly(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._alive_raw():
                self._reap()
                return True
            time.sleep(0.05)
        return False

    def _alive_raw(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def _reap(self) -> None:
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=0)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
