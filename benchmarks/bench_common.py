"""Shared pieces of the benchmark harness: the run context, part results, machine facts.

Every measurement is a *part*: a function ``(ctx) -> dict`` of numbers. ``run_part``
turns its outcome into one JSON record with a ``status``: ``ok``, ``error`` (it raised;
the message is kept and the run goes on), ``unavailable`` (a peer tool is missing) or
``not yet`` (the canal-ha piece it needs does not exist yet).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canal_ha.sandbox import Sandbox

__all__ = [
    "REPO",
    "Context",
    "Dataset",
    "NotYet",
    "Part",
    "Unavailable",
    "machine_info",
    "median_runs",
    "percentile",
    "run_part",
    "warnings_of",
    "write_result",
]

log = logging.getLogger("bench")
REPO = Path(__file__).resolve().parent.parent


class Unavailable(Exception):
    """A peer tool (node/npm, the C decoder) cannot be used here; the reason is kept."""


class NotYet(Exception):
    """The canal-ha piece a part needs does not exist (yet); the message names it."""


@dataclass(frozen=True)
class Dataset:
    """The generated binlog: where it starts and ends and how many row changes it holds."""

    rows: int
    transactions: int
    journal: str
    offset: int
    files: tuple[str, ...]
    end_journal: str
    end_offset: int
    tables: tuple[str, ...]
    kinds: dict[str, int]
    bytes: int
    load_s: float


@dataclass
class Context:
    """What every part gets: the sandbox, the dataset, the options and a work dir."""

    sandbox: Sandbox
    dataset: Dataset
    workdir: Path
    repeat: int = 3
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    fn: Callable[[Context], dict[str, Any]]


def run_part(part: Part, ctx: Context) -> dict[str, Any]:
    """Run one part; its record (never raises except KeyboardInterrupt)."""
    t0 = time.monotonic()
    log.info("part %s: start", part.name)
    try:
        record: dict[str, Any] = {"status": "ok", **part.fn(ctx)}
    except Unavailable as exc:
        record = {"status": "unavailable", "reason": str(exc)}
    except NotYet as exc:
        record = {"status": "not yet", "reason": str(exc)}
    except Exception as exc:  # one failing part must not stop the run
        log.error("part %s failed:\n%s", part.name, traceback.format_exc())
        record = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    record["title"] = part.title
    record["wall_s"] = round(time.monotonic() - t0, 3)
    log.info("part %s: %s in %.1fs", part.name, record["status"], record["wall_s"])
    return record


def median_runs(runs: Sequence[dict[str, Any]], key: str = "rows_per_s") -> dict[str, Any]:
    """The run with the median ``key`` plus every run's value (odd or even counts)."""
    ordered = sorted(runs, key=lambda r: float(r[key]))
    mid = ordered[(len(ordered) - 1) // 2]
    return {
        **mid,
        key: statistics.median(float(r[key]) for r in runs),
        "runs": [round(float(r[key]), 1) for r in runs],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextlib.contextmanager
def warnings_of(logger: str) -> Iterator[list[str]]:
    """Collect the WARNING+ messages of ``logger`` (e.g. the client's retries) meanwhile."""
    into: list[str] = []
    handler, target = _Collect(into), logging.getLogger(logger)
    level, propagate = target.level, target.propagate
    target.propagate = propagate and target.getEffectiveLevel() <= logging.WARNING
    target.setLevel(logging.WARNING)  # collected even when the run is quiet
    target.addHandler(handler)
    try:
        yield into
    finally:
        target.removeHandler(handler)
        target.setLevel(level)
        target.propagate = propagate


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory, Python and the load when the run started."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "nproc": os.cpu_count() or 0,
        "cpu_model": _cpu_model(),
        "memory_bytes": _mem_total_bytes(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The result document as JSON at ``path`` (directories made); says where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"written: {path}")
