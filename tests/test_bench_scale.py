"""The scale-out benchmark parts on a tiny run: the fair share settles and stays, handovers
and the cost curve write the documented JSON, lose nothing, and every consumer gets every
row. No timing asserts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROWS = 2000
PARTS = ("settle", "handover", "scale_clients", "scale_destinations", "idle_cost")


def test_scale_parts_write_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--out", str(out),
            "--rows", str(ROWS), "--only", ",".join(PARTS), "--handovers", "1",
            "--scale-clients", "1,2", "--scale-destinations", "1,2",
            "--idle-seconds", "1"]  # fmt: skip
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

    phases = parts["settle"]["phases"]
    assert [sorted(p["leaders"].values()) for p in phases] == [[3, 3, 3], [4, 5], [3, 3, 3]]
    assert parts["settle"]["moves_in_quiet_window"] == 0 and phases[1]["moves"] == 0
    ho = parts["handover"]
    assert ho["handovers"] == 2 and ho["lost_rows"] == 0 and ho["rows_written"] > 0
    for series in (ho["sigterm"], ho["step_down"]):
        assert len(series["stalls_ms"]) == 1 and series["max_ms"] > 0
    for name, key in (("scale_clients", "rows_per_client"), ("scale_destinations", None)):
        runs = parts[name]["runs"]
        assert [r["consumers"] for r in runs] == [1, 2]
        for r in runs:  # every consumer read every row of the generated binlog
            assert r["rows_total"] == r["consumers"] * ROWS
            assert r["aggregate_rows_per_s"] > 0 and r["node_cpu_cores"] >= 0
        assert key is None or parts[name][key] == ROWS
    idle = parts["idle_cost"]
    assert [r["destinations"] for r in idle["runs"]] == [1, 2]
    assert all(r["rss_bytes"] > 0 for r in idle["runs"])
    for title in ("graceful handover", "cost curve: clients", "per destination:"):
        assert title in stdout
