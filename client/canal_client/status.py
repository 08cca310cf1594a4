"""What `canal-ha status` shows: nodes, leaders and epochs, each client's cursor and lag.

Two sources, one shape (``status_from_etcd`` / ``status_from_server``)::

    {"source": "etcd" | URL, "nodes": [{"node", "url", ...}],
     "destinations": {d: {"leader": {"node", "url", "epoch"} | None, "nodes": [...],
                          "clients": {c: {"active", "filter", "cursor", "lag_s",
                                          "outstanding_batches"}},
                          "snapshots": [{"id", "state", "tables_done", "tables_total",
                                         "rows", "chunks", "rows_per_s"}]}}}

From etcd (the Keys layout) ``lag_s`` is the age of the cursor's commit timestamp
(now - timestamp of the last acked change); from a server it is the leader's
``canal_cursor_lag_seconds`` metric (cursor behind the newest event read). Incremental
snapshots come from ``{d}/snapshots/{id}`` (etcd; ``rows_per_s`` None: only the leader
knows it) or the leader's ``GET /v1/destinations/{d}/snapshots``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from canal_client.wire import HttpChannel
from canal_cluster.coordinator import Coordinator, KeyValue
from canal_cluster.keys import Keys
from canal_cluster.running import RunningInfo
from canal_protocol.errors import CanalError

__all__ = ["format_table", "snapshot_summary", "status_from_etcd", "status_from_server"]


def _json(value: bytes) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def _lag_s(cursor: Any, now_ms: int) -> float | None:
    try:
        ts = int(cursor["position"]["timestamp_ms"])
    except (TypeError, KeyError, ValueError):
        return None
    return round(max(0, now_ms - ts) / 1000, 3) if ts > 0 else None


def _client(d: dict[str, Any], client: str) -> dict[str, Any]:
    clients: dict[str, dict[str, Any]] = d.setdefault("clients", {})
    empty = {"active": None, "filter": None, "cursor": None, "lag_s": None}
    return clients.setdefault(client, {**empty, "outstanding_batches": 0})


def _destination(out: dict[str, Any], name: str) -> dict[str, Any]:
    dests: dict[str, dict[str, Any]] = out["destinations"]
    return dests.setdefault(name, {"leader": None, "nodes": [], "clients": {}, "snapshots": []})


def status_from_etcd(coord: Coordinator, keys: Keys, now_ms: int | None = None) -> dict[str, Any]:
    """Everything from etcd's keys (see module docstring)."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    nodes = []
    for kv in coord.get_prefix(keys.nodes_prefix()).items:
        rec = _json(kv.value)
        nodes.append(rec if isinstance(rec, dict) else {"node": kv.key.rsplit("/", 1)[-1]})
    out: dict[str, Any] = {"source": "etcd", "nodes": nodes, "destinations": {}}
    base = f"{keys.prefix}/destinations/"
    for kv in coord.get_prefix(base).items:
        parts = kv.key[len(base) :].split("/")
        _etcd_key(_destination(out, parts[0]), parts[1:], kv, now_ms)
    return out


def snapshot_summary(data: Any) -> dict[str, Any] | None:
    """A snapshot's progress in the status shape, from the API's form or from etcd's."""
    if not isinstance(data, dict) or "id" not in data:
        return None
    if "tables_done" in data:
        keys = ("id", "state", "tables_done", "tables_total", "rows", "chunks", "rows_per_s")
        return {k: data.get(k) for k in keys}
    progress = [p for p in data.get("progress") or [] if isinstance(p, dict)]
    return {
        "id": data["id"], "state": data.get("state"),
        "tables_done": sum(1 for p in progress if p.get("done")),
        "tables_total": len(progress), "rows": sum(int(p.get("rows", 0)) for p in progress),
        "chunks": sum(int(p.get("chunks", 0)) for p in progress), "rows_per_s": None,
    }  # fmt: skip


def _etcd_key(d: dict[str, Any], parts: list[str], kv: KeyValue, now_ms: int) -> None:
    if len(parts) == 2 and parts[0] == "snapshots":
        summary = snapshot_summary(_json(kv.value))
        if summary is not None:
            d.setdefault("snapshots", []).append(summary)
    elif parts == ["running"]:
        info = RunningInfo.from_kv(kv)
        d["leader"] = {"node": info.node, "url": info.url, "epoch": info.epoch}
    elif len(parts) == 2 and parts[0] == "cluster":
        d["nodes"].append(parts[1])
    elif len(parts) >= 2:
        c = _client(d, parts[0])
        if parts[1] == "running":
            c["active"] = RunningInfo.from_kv(kv).node
        elif parts[1] == "subscription":
            sub = _json(kv.value)
            c["filter"] = sub.get("filter") if isinstance(sub, dict) else None
        elif parts[1] == "cursor":
            c["cursor"] = _json(kv.value)
            c["lag_s"] = _lag_s(c["cursor"], now_ms)
        elif parts[1] == "mark":
            c["outstanding_batches"] += 1


def status_from_server(channel: HttpChannel, url: str) -> dict[str, Any]:
    """From a server's routes: /v1/cluster, the leaders' /metrics and cursor routes."""
    cluster = channel.request("GET", url, "/v1/cluster").body or {}
    out: dict[str, Any] = {"source": url, "nodes": cluster.get("nodes", []), "destinations": {}}
    for name, info in sorted((cluster.get("destinations") or {}).items()):
        d = _destination(out, name)
        d["leader"], d["nodes"] = info.get("leader"), sorted(info.get("nodes") or [])
        leader_url = (d["leader"] or {}).get("url")
        if leader_url:
            _server_clients(channel, leader_url, name, d)
            _server_snapshots(channel, leader_url, name, d)
    return out


def _server_snapshots(channel: HttpChannel, leader: str, name: str, d: dict[str, Any]) -> None:
    try:
        body = channel.request("GET", leader, f"/v1/destinations/{name}/snapshots").body
    except CanalError:
        return
    for s in (body or {}).get("snapshots", []) if isinstance(body, dict) else []:
        summary = snapshot_summary(s)
        if summary is not None:
            d["snapshots"].append(summary)


def _server_clients(channel: HttpChannel, leader: str, name: str, d: dict[str, Any]) -> None:
    try:
        text = channel.get_text(leader, "/metrics")
    except CanalError:
        return
    metrics = _parse_metrics(text)
    for (metric, labels), value in metrics.items():
        labels_d = dict(labels)
        if labels_d.get("destination") != name or "client" not in labels_d:
            continue
        c = _client(d, labels_d["client"])
        if metric == "canal_outstanding_batches":
            c["outstanding_batches"] = int(value)
        elif metric == "canal_cursor_lag_seconds":
            c["lag_s"] = round(value, 3)
    for client, c in d["clients"].items():
        path = f"/v1/destinations/{name}/clients/{client}/cursor"
        try:
            body = channel.request("GET", leader, path, follow_redirects=True).body
        except CanalError:
            continue
        c["cursor"] = body.get("cursor") if isinstance(body, dict) else None


def _parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → {(name, labels): value} (simple labels, no escapes)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = []
        for pair in rest.rstrip("}").split(","):
            if "=" in pair:
                k, _, v = pair.partition("=")
                labels.append((k.strip(), v.strip().strip('"')))
        try:
            out[(name.strip(), tuple(labels))] = float(value)
        except ValueError:
            continue
    return out


def _position_text(cursor: Any) -> str:
    try:
        p = cursor["position"]
        gtid = f" gtid={p['gtid']}" if p.get("gtid") else ""
        return f"{p['journal']}:{p['offset']}{gtid}"
    except (TypeError, KeyError):
        return "-"


def format_table(status: dict[str, Any], write: Callable[[str], object] = print) -> None:
    """A readable table of ``status``."""
    write(f"source: {status['source']}")
    write("NODES")
    for n in status["nodes"]:
        dests = ",".join(n.get("destinations") or [])
        write(f"  {n.get('node', '?'):<20} {n.get('url', ''):<28} {dests}")
    for name, d in sorted(status["destinations"].items()):
        leader = d["leader"]
        lead = f"{leader['node']} {leader['url']} epoch {leader['epoch']}" if leader else "none"
        write(f"DESTINATION {name}  leader: {lead}  nodes: {','.join(d['nodes']) or '-'}")
        if d["clients"]:
            write(f"  {'CLIENT':<16} {'ACTIVE':<28} {'LAG_S':>9} {'OUT':>4}  CURSOR")
        for client, c in sorted(d["clients"].items()):
            lag = "-" if c["lag_s"] is None else f"{c['lag_s']:.3f}"
            active = c["active"] or "-"
            write(
                f"  {client:<16} {active:<28} {lag:>9} {c['outstanding_batches']:>4}  "
                f"{_position_text(c['cursor'])}"
            )
        for s in d.get("snapshots") or []:
            rate = "-" if s["rows_per_s"] is None else f"{s['rows_per_s']:,.0f}"
            write(
                f"  SNAPSHOT {s['id']:<10} {s['state']:<10} tables {s['tables_done']}/"
                f"{s['tables_total']}  rows {s['rows']:,}  chunks {s['chunks']:,}  rows/s {rate}"
            )
