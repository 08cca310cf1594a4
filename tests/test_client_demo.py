"""`canal-ha demo --kill-leader`: a writer, three nodes and `canal-ha consume`; the leader
is SIGKILLed mid-stream and every written row is still consumed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "canal_ha.cli"]


def test_demo_kill_leader_loses_no_row(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    try:
        res = subprocess.run(
            [*CLI, "demo", "--workdir", str(workdir), "--rate", "300", "--duration", "35",
             "--kill-leader", "5"],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        subprocess.run([*CLI, "down", "--workdir", str(workdir)], capture_output=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "demo: SIGKILL the leader" in out
    assert "following leader change" in out  # the consumer's log, forwarded
    m = re.search(r"wrote ([\d,]+) rows; canal-ha consume got ([\d,]+) distinct rows, "
                  r"([\d,]+) duplicates, 0 missing", out)  # fmt: skip
    assert m is not None, out[-3000:]
    written, got = (int(m.group(i).replace(",", "")) for i in (1, 2))
    assert written == got > 0
