"""The one-minute nemesis (random faults from the whole menu, seeded) and its timeline.

``CANAL_NEMESIS_SEED=S`` picks another seed; a failure prints the seed and the command
that replays it (``nemesis.py --minutes 1 --seed S``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SandboxFactory

from canal_ha.sandbox import Sandbox
from chaos.harness import ChaosRun
from chaos.nemesis import run_nemesis
from chaos.timeline import draw_timeline, series

MakeRun = Callable[[Sandbox], ChaosRun]
SEED = int(os.environ.get("CANAL_NEMESIS_SEED", "18"))


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_nemesis_one_minute(
    make_sandbox: SandboxFactory, chaos_run: MakeRun, tmp_path: Path
) -> None:
    box = make_sandbox(etcd_members=3, standby=True)
    outcome = run_nemesis(chaos_run(box), SEED, 1.0, tmp_path / "nemesis")
    assert outcome.ok, outcome.summary()
    assert len(outcome.faults) >= 2, outcome.summary()
    history = json.loads((outcome.out / "history.json").read_text())
    assert history["check"]["ok"] and history["seed"] == SEED
    assert (outcome.out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_series_and_picture(tmp_path: Path) -> None:
    history = {
        "seed": 1, "minutes": 0.1,
        "writes": [["a.t", 1, "I", 1, 1, 100.2, True], ["a.t", 1, "U", 2, 2, 101.5, True]],
        "streams": {"d1/c1": [
            {"batch": 1, "t": 100.3, "id": 1, "epoch": 7, "server": "u",
             "changes": [["a.t", 1, "I", 1]]},
            {"ack": 1, "t": 100.31},
            {"batch": 2, "t": 103.0, "id": 2, "epoch": 9, "server": "v",
             "changes": [["a.t", 1, "U", 2], ["a.t", 1, "I", 1]]},
        ]},
        "leader_samples": [[100.0, "d1", "u", 7], [101.8, "d1", "v", 9]],
        "faults": [{"kind": "leader SIGKILL", "target": "node1", "start": 101.0, "end": 101.7}],
        "check": {"ok": True, "lost": 0, "duplicates": 1, "dup_bound": 1},
    }  # fmt: skip
    t0, throughput, lag, epochs = series(history)
    assert t0 == 100.2
    assert throughput["committed"] == [(0.0, 1.0), (1.0, 1.0)]
    assert throughput["d1/c1"] == [(0.0, 1.0), (1.0, 0.0), (2.0, 2.0)]  # duplicates count
    # at t0 + 2 s the update committed at t0 + 1.3 s had waited 0.7 s
    assert [(s, round(v, 3)) for s, v in lag["d1/c1"]] == [(0.0, 0.0), (1.0, 0.0), (2.0, 0.7)]
    assert {d: [(round(s, 3), e) for s, e in p] for d, p in epochs.items()} == {
        "d1": [(-0.2, 7.0), (1.6, 9.0)]
    }
    png = draw_timeline(history, tmp_path / "t.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
