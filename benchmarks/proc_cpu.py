"""CPU seconds per process of a benchmark, sampled from /proc (psutil) in a thread.

``CpuSampler(roots, node_pids)`` samples every ``interval_s`` the user + system CPU
time of each root process and all its descendants, each with a class from its command
line (``classify``): ``node``, ``driver`` (the Python process that runs the
SparkSession), ``jvm``, ``source_runner`` (the Python process of the streaming
source's driver side: fetch, index, partitions), ``executors`` (the Python workers that
run the tasks), ``other``. ``cpu_between(t0, t1)`` gives the CPU seconds of each class
between two wall-clock times (per pid: the last sample at or before ``t1`` minus the
last at or before ``t0``, 0 for a pid not yet born at ``t0``); a process that ends
inside the window counts up to its last sample.
"""

from __future__ import annotations

import bisect
import threading
import time

import psutil

__all__ = ["CpuSampler", "classify"]


def classify(cmdline: list[str], node_pids: frozenset[int], pid: int) -> str:
    """The class of a process (see the module docstring)."""
    text = " ".join(cmdline)
    if pid in node_pids or "canal_ha.cli server" in text:
        return "node"
    if cmdline and cmdline[0].endswith("java"):
        return "jvm"
    if "spark_job.py" in text:
        return "driver"
    if "streaming_source_runner" in text:
        return "source_runner"
    if "pyspark.worker" in text or "pyspark.daemon" in text:
        return "executors"
    return "other"


class CpuSampler:
    """Samples the CPU time of process trees (see the module docstring)."""

    def __init__(self, roots: list[int], node_pids: list[int], interval_s: float = 0.25) -> None:
        self.roots, self.node_pids = list(roots), frozenset(node_pids)
        self.interval_s = interval_s
        self.samples: dict[int, tuple[str, list[float], list[float]]] = {}  # pid: class, t, cpu
        self.commands: dict[int, str] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def add_root(self, pid: int) -> None:
        self.roots.append(pid)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _tree(self) -> list[psutil.Process]:
        out: list[psutil.Process] = []
        for pid in list(self.roots):
            try:
                root = self._procs.get(pid) or psutil.Process(pid)
                out += [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        return out

    def _sample(self) -> None:
        now = time.time()
        for proc in self._tree():
            proc = self._procs.setdefault(proc.pid, proc)
            try:
                t = proc.cpu_times()
                cmdline = proc.cmdline()  # read again: a script may exec another program
            except psutil.Error:
                continue
            kind, ts, cpu = self.samples.get(proc.pid, ("other", [], []))
            if cmdline:  # empty while a process ends: keep what it was
                kind = classify(cmdline, self.node_pids, proc.pid)
                self.commands[proc.pid] = " ".join(cmdline)[-120:]
            self.samples[proc.pid] = (kind, ts, cpu)
            ts.append(now)
            cpu.append(t.user + t.system)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def per_pid(self, t0: float, t1: float) -> list[tuple[int, str, str, float]]:
        """(pid, class, command, CPU seconds) of each process between ``t0`` and ``t1``."""
        out = []
        for pid, (kind, ts, cpu) in list(self.samples.items()):
            i1 = bisect.bisect_right(ts, t1) - 1
            if i1 < 0:
                continue
            i0 = bisect.bisect_right(ts, t0) - 1
            used = max(0.0, cpu[i1] - (cpu[i0] if i0 >= 0 else 0.0))
            if used > 0:
                out.append((pid, kind, self.commands.get(pid, ""), round(used, 3)))
        return out

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds per class between the wall-clock times ``t0`` and ``t1``."""
        out: dict[str, float] = {}
        for _, kind, _, used in self.per_pid(t0, t1):
            out[kind] = out.get(kind, 0.0) + used
        return out
