"""The REST-under-abuse benchmark parts on a tiny run: the documented JSON, every poll
answered (200 within the limit; 200 or 503 past it), none lost. No timing asserts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PARTS = ("api_filter_health", "api_long_polls")


def test_api_parts_write_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "api.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--out", str(out),
            "--rows", "1000", "--only", ",".join(PARTS), "--api-seconds", "1",
            "--api-polls", "40", "--api-poll-timeout-ms", "300"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the harness stops its sandbox on SIGTERM
        stdout, stderr = proc.communicate(timeout=40)
        pytest.fail(f"harness timed out:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    parts = json.loads(out.read_text())["parts"]
    assert list(parts) == list(PARTS)
    for name, part in parts.items():
        assert part["status"] == "ok", (name, part)
    f = parts["api_filter_health"]
    for phase in (f["anchor_plain_filter"], f["pathological_filters"]):
        assert phase["health"]["samples"] > 0 and phase["gets"] > 0
    polls = parts["api_long_polls"]
    within = polls["within_limit"]["concurrent"]
    assert (within["answered_200"], within["answered_503"], within["lost"]) == (40, 0, 0)
    over = polls["over_limit"]["concurrent"]
    assert over["answered_200"] + over["answered_503"] == 40 and over["lost"] == 0
    assert over["answered_200"] >= 20  # the limit (half) is admitted
    assert "REST: concurrent long polls: ok" in stdout
