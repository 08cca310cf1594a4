"""The nemesis timeline: ``draw_timeline(history, path)`` writes a PNG of three panels
over time (seconds from the first commit), faults shaded and named:

1. throughput: row changes committed per second, and delivered per second to each
   consumer stream (destination/client);
2. lag: per second, how old the oldest change committed but not yet delivered to a
   stream is (0 when it has everything committed so far);
3. leader term of each destination: the n-th distinct epoch (etcd revision of its
   running key) the /v1/health pollers saw, destinations drawn slightly apart.

``history`` is the dict ``nemesis.py`` writes to ``history.json``; the function needs
only its ``writes``, ``streams``, ``leader_samples`` and ``faults``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

__all__ = ["draw_timeline", "series"]

Series = dict[str, list[tuple[float, float]]]


def series(history: dict[str, Any]) -> tuple[float, Series, Series, Series]:
    """(t0, throughput, lag, epochs): each a dict of label → [(seconds, value)]."""
    writes = history.get("writes", [])
    commit = {(w[0], w[1], w[2], w[3]): float(w[5]) for w in writes}
    times = [t for t in commit.values() if t > 0]
    t0 = min(times) if times else min((f["start"] for f in history.get("faults", [])), default=0)
    throughput: Series = {}
    per_s: dict[int, set[int]] = defaultdict(set)
    for w in writes:
        if w[6] and w[5] > 0:
            per_s[int(w[5] - t0)].add(int(w[4]))
    throughput["committed"] = _per_second({s: len(txns) for s, txns in per_s.items()})
    lag: Series = {}
    for name, events in history.get("streams", {}).items():
        counts: dict[int, float] = defaultdict(float)
        first: dict[tuple[Any, ...], float] = {}
        for e in events:
            if "batch" in e:
                counts[int(e["t"] - t0)] += len(e["changes"])
                for c in e["changes"]:
                    first.setdefault(tuple(c), e["t"])
        throughput[name] = _per_second(counts)
        lag[name] = _lag(commit, first, t0)
    epochs: Series = defaultdict(list)
    for t, dest, _url, epoch in sorted(history.get("leader_samples", [])):
        epochs[str(dest)].append((t - t0, float(epoch)))
    return t0, throughput, lag, dict(epochs)


def _terms(points: list[tuple[float, float]], offset: float) -> list[tuple[float, float]]:
    """(t, epoch) → (t, n-th distinct epoch seen, from 1) + ``offset``."""
    order = {e: i + 1 for i, e in enumerate(sorted({e for _, e in points}))}
    return [(t, order[e] + offset) for t, e in points]


def _lag(
    commit: dict[tuple[Any, ...], float], first: dict[tuple[Any, ...], float], t0: float
) -> list[tuple[float, float]]:
    """Per second s: s minus the commit time of the oldest change committed by then and
    not delivered yet (0 when none waits): how far behind the stream is."""
    oldest: dict[int, float] = {}
    end = max(first.values(), default=t0)
    for key, committed in commit.items():
        if committed <= 0:
            continue
        delivered = first.get(key, end)
        for second in range(int(committed - t0) + 1, int(delivered - t0) + 1):
            oldest[second] = min(oldest.get(second, committed), committed)
    last = int(end - t0)
    return [(float(s), max(0.0, s + t0 - oldest[s]) if s in oldest else 0.0)
            for s in range(0, last + 1)]  # fmt: skip


def _per_second(counts: dict[int, float]) -> list[tuple[float, float]]:
    if not counts:
        return []
    lo, hi = min(counts), max(counts)
    return [(float(s), float(counts.get(s, 0))) for s in range(lo, hi + 1)]


def _mark_faults(axes: list[Axes], faults: list[dict[str, Any]], t0: float) -> None:
    colors = plt.get_cmap("Dark2")
    kinds = sorted({f["kind"] for f in faults})
    for f in faults:
        start = f["start"] - t0
        end = max(f.get("end") or f["start"], f["start"] + 0.5) - t0
        color = colors(kinds.index(f["kind"]) % 8)
        for ax in axes:
            ax.axvspan(start, end, color=color, alpha=0.18, lw=0)
            ax.axvline(start, color=color, lw=0.8)
        axes[0].annotate(
            f["kind"], (start, 1.0), xycoords=("data", "axes fraction"), rotation=90,
            fontsize=6, va="top", ha="right", color=color,
        )  # fmt: skip


def draw_timeline(history: dict[str, Any], path: Path) -> Path:
    """Write the PNG; returns ``path``."""
    t0, throughput, lag, epochs = series(history)
    fig, axes = plt.subplots(3, 1, figsize=(14, 9), sharex=True)
    top, middle, bottom = axes
    palette = plt.get_cmap("tab10")
    color: dict[str, Any] = {name: palette((i + 1) % 10) for i, name in enumerate(lag)}
    color["committed"] = "black"
    for label, points in throughput.items():
        if points:
            width = 2.0 if label == "committed" else 0.9
            top.plot(*zip(*points, strict=True), lw=width, label=label, color=color[label])
    top.set_ylabel("changes / s\n(committed: tx / s)")
    top.legend(fontsize=7, ncol=5, loc="upper left")
    for label, points in lag.items():
        if points:
            middle.plot(*zip(*points, strict=True), lw=0.9, label=label, color=color[label])
    middle.set_ylabel("lag: oldest change\nnot delivered (s)")
    for i, (label, points) in enumerate(sorted(epochs.items())):
        if points:
            terms = _terms(points, 0.08 * i)
            bottom.step(*zip(*terms, strict=True), where="post", label=label)
    bottom.set_ylabel("leader term\n(n-th epoch)")
    bottom.legend(fontsize=7, loc="upper left")
    bottom.set_xlabel("seconds since the first commit")
    _mark_faults(list(axes), history.get("faults", []), t0)
    check = history.get("check") or {}
    verdict = "OK" if check.get("ok") else "FAIL"
    title = (
        f"nemesis seed {history.get('seed')}, {history.get('minutes')} min, "
        f"{len(history.get('faults', []))} faults: {verdict}; lost {check.get('lost', '-')}, "
        f"duplicates {check.get('duplicates', '-')} (bound {check.get('dup_bound', '-')}), "
        f"order violations {check.get('order_violations', '-')}, "
        f"split brain {len(check.get('split_brain', {}) or {})}"
    )
    if history.get("error"):
        title += f"\naborted: {str(history['error'])[:150]}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
