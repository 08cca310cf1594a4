"""Run every chaos scenario and print one line per result.

    .venv/bin/python tests/chaos/run_all.py [extra pytest args]

is ``pytest tests/chaos -m chaos`` (every scenario and the 1-minute nemesis) followed by
a summary of ``tests/chaos/results/*.json`` (rows written, delivered, lost, duplicates and their
bound, order violations, split-brain epochs, the longest failover stall). The exit code
is pytest's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"


def summary(since: float) -> list[str]:
    lines = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.stat().st_mtime < since:
            continue
        d = json.loads(path.read_text())
        fo = d.get("max_failover_s")
        lines.append(
            f"{'OK  ' if d['ok'] else 'FAIL'} {path.stem:<48} written {d['rows_written']:>6} "
            f"delivered {d['delivered']:>6} lost {d['lost']:>4} dups {d['duplicates']:>4}"
            f"/{d['dup_bound']:<4} order {d['order_violations']} split {len(d['split_brain'])} "
            f"failover {'-' if fo is None else f'{fo:.2f}s'}"
        )
    return lines


def main(argv: list[str]) -> int:
    since = time.time()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE),
           "-m", "chaos", *argv]  # fmt: skip
    code = subprocess.call(cmd, cwd=ROOT)
    print("\n".join(["", "chaos results:", *summary(since)]))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
