"""ManagedProcess: a child we started is ours for as long as it runs, whatever its
command line says; an adopted pid is checked against the recorded command."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from canal_cluster.retry import wait_until
from canal_ha.sandbox.process import ManagedProcess, pid_alive


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [p.decode() for p in raw.split(b"\0") if p]


def test_own_child_is_running_after_its_command_line_changed(tmp_path: Path) -> None:
    """The child execs another program (as a wrapper script or a re-exec does; and
    /proc/PID/cmdline can read empty while a busy child execs): it is still our child,
    so it is running, and stop() stops it instead of leaving it behind."""
    proc = ManagedProcess("wrapper", ("/bin/sh", "-c", "exec sleep 60"), tmp_path / "w.log")
    proc.start()
    assert proc.pid is not None
    pid = proc.pid
    try:
        wait_until(lambda: _cmdline(pid)[:1] == ["sleep"], "the child exec'd sleep", 30)
        assert proc.is_running()
        assert proc.stop(timeout_s=10)
        assert not pid_alive(pid)
        assert not proc.is_running()
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_adopted_pid_running_another_command_is_not_ours(tmp_path: Path) -> None:
    """A record read back by another process (``canal-ha down``): a pid that runs
    something else now (recycled) is neither running for us nor signalled."""
    child = ManagedProcess("sleeper", ("/bin/sleep", "60"), tmp_path / "s.log")
    child.start()
    assert child.pid is not None
    try:
        record = child.record()
        other = ManagedProcess.adopt(
            record.__class__(record.name, record.pid, ("/bin/other",), record.log)
        )
        assert not other.is_running()
        assert not other.signal(signal.SIGTERM)
        assert pid_alive(child.pid)
        assert ManagedProcess.adopt(record).is_running()
    finally:
        child.stop(timeout_s=10)
    assert not pid_alive(record.pid)
