"""What the web console shows (``/console``), gathered on one node, and the cluster view
made of every node's part.

* ``Throughput``: rows/s of each destination this node reads, one sample every
  ``SAMPLE_S`` seconds (wall-clock aligned, the last ``KEEP`` samples): summed over the
  nodes, the history of a destination survives a failover.
* ``node_state(node, throughput)``: this node's part (``/v1/console/node``): its
  health, per destination the reader position, the binlog end, the lag in bytes and
  seconds, the rows/s history, the leadership changes this node saw (gained / ended,
  with epoch and reason) and, on the leader, the clients (cursor, lag, outstanding
  batches, active consumer) and the snapshots.
* ``merge(answering, cluster, parts)``: the whole cluster (``/v1/console/state``): the
  nodes etcd knows, each destination's leader from etcd with the detail its leader
  node gave, the leadership changes of every node in time order.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from canal_cluster.running import Reason, read_running
from canal_protocol.errors import CoordinationError
from canal_server.instance import Instance, Role
from canal_server.metrics import lag_of
from canal_server.node import Node

__all__ = [
    "EVENTS_KEPT",
    "KEEP",
    "SAMPLE_S",
    "Throughput",
    "lag_of",
    "merge",
    "node_state",
    "version",
]

log = logging.getLogger(__name__)

SAMPLE_S = 5.0
KEEP = 120  # 10 minutes of samples
EVENTS_KEPT = 20  # leadership changes shown per destination
_GAINED = frozenset({Reason.WON, Reason.RECAMPAIGN_AS_PREVIOUS_OWNER, Reason.TOOK_OVER})
_ENDED = frozenset(
    {
        Reason.LOST, Reason.FENCED, Reason.STALE_EPOCH, Reason.HANDED_OVER, Reason.REBALANCED,
        Reason.HANDOVER_FAILED, Reason.RELEASED, Reason.ACTIVATION_FAILED,
    }
)  # fmt: skip


def version() -> str:
    try:
        return importlib.metadata.version("canal-ha")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Throughput:
    """rows/s per destination read by this node, sampled by a daemon thread."""

    def __init__(
        self,
        rows_of: Callable[[str], float],
        destinations: Iterable[str],
        period_s: float = SAMPLE_S,
        keep: int = KEEP,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._rows_of, self._period_s, self._clock = rows_of, period_s, clock
        self._samples: dict[str, deque[tuple[int, float]]] = {
            d: deque(maxlen=keep) for d in destinations
        }
        self._last: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, node: Node) -> Throughput:
        registry = node.metrics.registry

        def rows_of(d: str) -> float:
            return registry.get_sample_value("canal_rows_total", {"destination": d}) or 0.0

        return cls(rows_of, node.instances)

    def start(self) -> Throughput:
        with self._start_lock:
            if self._thread is None:
                self.sample()
                self._thread = threading.Thread(
                    target=self._run, name="console-throughput", daemon=True
                )
                self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s - self._clock() % self._period_s):
            self.sample()

    def sample(self) -> None:
        """Record rows/s since the last sample (the first sample only sets the base)."""
        now = self._clock()
        bucket_ms = int(round(now / self._period_s) * self._period_s * 1000)
        with self._lock:
            for d, samples in self._samples.items():
                rows = self._rows_of(d)
                last = self._last.get(d)
                self._last[d] = (now, rows)
                if last is not None and now > last[0]:
                    samples.append((bucket_ms, max(0.0, rows - last[1]) / (now - last[0])))

    def history(self, destination: str) -> list[list[float]]:
        with self._lock:
            return [[t, round(r, 1)] for t, r in self._samples.get(destination, ())]


def _events(node: Node, destination: str) -> list[dict[str, Any]]:
    """The leadership changes this node's monitor recorded, wall-clock stamped."""
    monitor = node.monitors[destination]
    offset = time.time() - time.monotonic()
    out = []
    for e in monitor.history():
        if e.reason in _GAINED or e.reason in _ENDED:
            out.append({
                "at_ms": int((e.at + offset) * 1000), "node": node.id,
                "change": "gained" if e.reason in _GAINED else "ended",
                "epoch": e.epoch, "reason": e.reason.value, "detail": e.detail,
            })  # fmt: skip
    return out[-EVENTS_KEPT:]


def _clients(node: Node, name: str, inst: Instance, etcd_ok: bool) -> list[dict[str, Any]]:
    """The clients of a led destination: cursor, lag, outstanding batches, the active
    consumer (its running key in etcd; null when none or etcd does not answer: not
    asked when the node's etcd probe failed, each read would wait its timeout)."""
    newest = inst.metrics.newest_event_ms if inst.metrics is not None else 0
    out = []
    for c in inst.meta.clients():
        cursor = inst.meta.cursor(c)
        lag = None
        if cursor is not None and newest:
            lag = round(max(0.0, (newest - cursor.position.timestamp_ms) / 1000), 3)
        active = None
        if etcd_ok:
            try:
                active = read_running(node.coord, node.keys.client_running(name, c))
            except CoordinationError:
                etcd_ok = False
        out.append({
            "client_id": c,
            "cursor": cursor.to_dict() if cursor is not None else None,
            "lag_s": lag,
            "outstanding_batches": len(inst.meta.batches(c)),
            "active_consumer": active.node if active is not None else None,
        })  # fmt: skip
    return out


def node_state(node: Node, throughput: Throughput) -> dict[str, Any]:
    """This node's part of the console (``/v1/console/node``); blocking (etcd, DBs)."""
    health = node.health()
    now_ms = int(time.time() * 1000)
    etcd_ok = bool(health["etcd"]["reachable"])
    dests: dict[str, Any] = {}
    for name, d in health["destinations"].items():
        inst = node.instance(name)
        leads = d["role"] == Role.LEADER.value
        entries, size = inst.store_stats()
        lag_bytes, lag_s = lag_of(d["reader_position"], d["binlog_end"], now_ms)
        dests[name] = {
            **d,
            "lag_bytes": lag_bytes,
            "lag_s": lag_s,
            "store_entries": entries,
            "store_bytes": size,
            "store_capacity_bytes": inst.config.memory.buffer_bytes,
            "rows_per_s": throughput.history(name),
            "leadership": _events(node, name),
            "clients": _clients(node, name, inst, etcd_ok) if leads else [],
            "snapshots": inst.snapshots.runs() if leads else [],
        }
    return {
        "node": health["node"],
        "url": health["url"],
        "version": version(),
        "row_decoder": health["row_decoder"],
        "etcd": health["etcd"],
        "destinations": dests,
    }


def _sum_history(parts: Iterable[Mapping[str, Any]], destination: str) -> list[list[float]]:
    total: dict[int, float] = {}
    for part in parts:
        for t, r in part.get("destinations", {}).get(destination, {}).get("rows_per_s", []):
            total[int(t)] = total.get(int(t), 0.0) + float(r)
    return [[t, round(total[t], 1)] for t in sorted(total)]


def _node_row(
    record: Mapping[str, Any] | None, part: Mapping[str, Any], etcd_known: bool
) -> dict[str, Any]:
    node_id = str(part.get("node") or (record or {}).get("node"))
    led = [d for d, v in part.get("destinations", {}).items() if v.get("role") == "leader"]
    configured = (record or {}).get("destinations") or list(part.get("destinations", {}))
    return {
        "node": node_id,
        "url": str(part.get("url") or (record or {}).get("url", "")),
        "alive": record is not None if etcd_known else None,
        "reachable": "error" not in part,
        "leaving": bool((record or {}).get("leaving", False)),
        "version": part.get("version"),
        "row_decoder": part.get("row_decoder"),
        "destinations": sorted(configured),
        "leads": sorted(led),
        "etcd_reachable": (part.get("etcd") or {}).get("reachable"),
        "error": str(part.get("error", "")),
    }


def _destination(
    name: str, entry: Mapping[str, Any] | None, parts: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """One destination: the leader as etcd has it (else as the answering nodes see it),
    the detail of its leader node's part."""
    leader = dict(entry["leader"]) if entry and entry.get("leader") else None
    detail: Mapping[str, Any] = {}
    for node_id, part in parts.items():
        d = part.get("destinations", {}).get(name)
        if d is None:
            continue
        if d.get("role") == "leader" and (leader is None or leader["node"] == node_id):
            detail = d
            if leader is None:
                leader = {"node": node_id, "url": part.get("url", ""), "epoch": d["epoch"]}
    events = [e for p in parts.values() for e in p.get("destinations", {}).get(name, {}).get(
        "leadership", [])]  # fmt: skip
    events.sort(key=lambda e: (e["at_ms"], e["change"] == "gained"), reverse=True)
    nodes = list(entry["nodes"]) if entry else [n for n, p in parts.items()
                                                if name in p.get("destinations", {})]  # fmt: skip
    keys = ("reader", "reader_position", "binlog_end", "lag_bytes", "lag_s", "store_entries",
            "store_bytes", "store_capacity_bytes", "clients", "snapshots", "database")  # fmt: skip
    return {
        "leader": leader,
        "nodes": sorted(nodes),
        **{k: detail.get(k) for k in keys},
        "clients": detail.get("clients") or [],
        "snapshots": detail.get("snapshots") or [],
        "rows_per_s": _sum_history(parts.values(), name),
        "leadership": events[:EVENTS_KEPT],
    }


def merge(
    answering: Mapping[str, Any],
    cluster: Mapping[str, Any] | None,
    parts: Mapping[str, Mapping[str, Any]],
    etcd_error: str = "",
) -> dict[str, Any]:
    """The whole cluster (``/v1/console/state``) from etcd's ``cluster`` (None when etcd
    did not answer: then only what this node knows) and each node's part (by node id;
    an unreachable node's part is ``{"node", "url", "error"}``)."""
    records = {str(r["node"]): r for r in (cluster or {}).get("nodes", [])}
    ids = sorted(set(records) | set(parts))
    nodes = [_node_row(records.get(i), parts.get(i, {"node": i, "error": "no answer"}),
                       cluster is not None) for i in ids]  # fmt: skip
    entries: Mapping[str, Any] = (cluster or {}).get("destinations", {})
    names = sorted(set(entries) | {d for p in parts.values() for d in p.get("destinations", {})})
    etcd = dict(answering.get("etcd") or {"reachable": True, "error": ""})
    if etcd_error:
        etcd = {"reachable": False, "error": etcd_error}
    return {
        "node": answering["node"],
        "url": answering["url"],
        "at_ms": int(time.time() * 1000),
        "etcd": etcd,
        "nodes": nodes,
        "destinations": {n: _destination(n, entries.get(n), parts) for n in names},
    }
