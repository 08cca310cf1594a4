"""What `canal-ha status` shows: nodes, leaders and epochs, each client's cursor and lag.

Two sources, one shape (``status_from_etcd`` / ``status_from_server``)::

    {"source": "etcd" | URL, "nodes": [{"node", "url", ...}],
     "destinations": {d: {"leader": {"node", "url", "epoch"} | None, "nodes": [...],
                          "reader_position": {...} | None, "binlog_end": {...} | None,
                          "clients": {c: {"active", "filter", "cursor", "lag_bytes",
                                          "lag_s", "outstanding_batches"}},
                          "snapshots": [{"id", "state", "tables_done", "tables_total",
                                         "rows", "chunks", "rows_per_s"}]}}}

Only subscribed clients are listed. ``reader_position`` and ``binlog_end`` are the
leader's ``/v1/health`` figures of the destination, asked from the leader in both
cases, so both sources compute the same lag (``lag_of``) from the same inputs:

* ``lag_bytes`` = ``binlog_end.offset - cursor.offset`` when the cursor is in the same
  binlog file of the same source as the binlog end; None when the binlog has moved on
  to a later file (the sizes of the files in between are not known) or the source
  changed (offsets of two servers do not compare);
* ``lag_s`` = 0 when the cursor is at the binlog end (``lag_bytes == 0``); else how
  much older the cursor's commit is than the newest event the leader has read
  (``reader_position.timestamp_ms - cursor timestamp_ms``, at least 0).

Both are None before the client's first ack or when the leader does not answer. An idle
database keeps them still: nothing is written, so a caught-up client stays at 0 and 0
(the old "now - commit time" grew forever).
Incremental snapshots come from ``{d}/snapshots/{id}`` (etcd; ``rows_per_s`` None: only
the leader knows it) or the leader's ``GET /v1/destinations/{d}/snapshots``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from canal_client.wire import HttpChannel
from canal_cluster.coordinator import Coordinator, KeyValue
from canal_cluster.keys import Keys
from canal_cluster.running import RunningInfo
from canal_protocol.errors import CanalError

__all__ = [
    "Health",
    "fetch_health",
    "format_table",
    "lag_of",
    "snapshot_summary",
    "status_from_etcd",
    "status_from_server",
]  # fmt: skip

Health = Callable[[str], dict[str, Any] | None]  # leader URL -> its /v1/health body


def _json(value: bytes) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def fetch_health(channel: HttpChannel) -> Health:
    """``/v1/health`` of a node through ``channel`` (None when it does not answer)."""

    def health(url: str) -> dict[str, Any] | None:
        try:
            body = channel.request("GET", url.rstrip("/"), "/v1/health").body
        except CanalError:
            return None
        return body if isinstance(body, dict) else None

    return health


def lag_of(
    cursor: Any, reader_position: dict[str, Any] | None, binlog_end: dict[str, Any] | None
) -> tuple[int | None, float | None]:
    """``(lag_bytes, lag_s)`` of a cursor (LogPosition dict); see the module docstring."""
    try:
        pos = cursor["position"]
        offset, ts = int(pos["offset"]), int(pos.get("timestamp_ms") or 0)
        source = (cursor.get("identity") or {}).get("source_address")
    except (TypeError, KeyError, ValueError):
        return None, None
    lag_bytes: int | None = None
    if binlog_end and binlog_end.get("journal") == pos.get("journal"):
        end_source = binlog_end.get("source_address")
        if not source or not end_source or source == end_source:
            lag_bytes = max(0, int(binlog_end["offset"]) - offset)
    if lag_bytes == 0:
        return 0, 0.0
    newest = int((reader_position or {}).get("timestamp_ms") or 0)
    lag_s = round(max(0, newest - ts) / 1000, 3) if newest > 0 and ts > 0 else None
    return lag_bytes, lag_s


def _destination(out: dict[str, Any], name: str) -> dict[str, Any]:
    dests: dict[str, dict[str, Any]] = out["destinations"]
    empty: dict[str, Any] = {"reader_position": None, "binlog_end": None, "clients": {}}
    return dests.setdefault(name, {"leader": None, "nodes": [], **empty, "snapshots": []})


def _new_client() -> dict[str, Any]:
    return {"active": None, "filter": None, "cursor": None, "lag_bytes": None, "lag_s": None,
            "outstanding_batches": 0}  # fmt: skip


def _add_lag(d: dict[str, Any], name: str, health: Health | None) -> None:
    """The leader's positions of destination ``name`` and each client's lag."""
    url = (d["leader"] or {}).get("url")
    body = health(url) if health is not None and url else None
    figures = ((body or {}).get("destinations") or {}).get(name) or {}
    d["reader_position"] = figures.get("reader_position")
    d["binlog_end"] = figures.get("binlog_end")
    for c in d["clients"].values():
        c["lag_bytes"], c["lag_s"] = lag_of(c["cursor"], d["reader_position"], d["binlog_end"])


def status_from_etcd(
    coord: Coordinator, keys: Keys, health: Health | None = None
) -> dict[str, Any]:
    """Everything from etcd's keys, lag with the leaders' ``health`` (module docstring)."""
    nodes = []
    for kv in coord.get_prefix(keys.nodes_prefix()).items:
        rec = _json(kv.value)
        nodes.append(rec if isinstance(rec, dict) else {"node": kv.key.rsplit("/", 1)[-1]})
    out: dict[str, Any] = {"source": "etcd", "nodes": nodes, "destinations": {}}
    base = f"{keys.prefix}/destinations/"
    clients: dict[str, dict[str, dict[str, Any]]] = {}
    for kv in coord.get_prefix(base).items:
        parts = kv.key[len(base) :].split("/")
        d = _destination(out, parts[0])
        _etcd_key(d, clients.setdefault(parts[0], {}), parts[1:], kv)
    for name, d in out["destinations"].items():
        found = clients.get(name, {})
        d["clients"] = {c: v for c, v in found.items() if v.pop("subscribed", False)}
        _add_lag(d, name, health)
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


def _etcd_key(
    d: dict[str, Any], clients: dict[str, dict[str, Any]], parts: list[str], kv: KeyValue
) -> None:
    if len(parts) == 2 and parts[0] == "snapshots":
        summary = snapshot_summary(_json(kv.value))
        if summary is not None:
            d["snapshots"].append(summary)
    elif parts == ["running"]:
        info = RunningInfo.from_kv(kv)
        d["leader"] = {"node": info.node, "url": info.url, "epoch": info.epoch}
    elif len(parts) == 2 and parts[0] == "cluster":
        d["nodes"].append(parts[1])
    elif len(parts) >= 2:
        c = clients.setdefault(parts[0], _new_client())
        if parts[1] == "running":
            c["active"] = RunningInfo.from_kv(kv).node
        elif parts[1] == "subscription":  # stays with subscribed: false after unsubscribe
            sub = _json(kv.value)
            sub = sub if isinstance(sub, dict) else {}
            c["filter"], c["subscribed"] = sub.get("filter"), sub.get("subscribed", True)
        elif parts[1] == "cursor":
            c["cursor"] = _json(kv.value)
        elif parts[1] == "mark":
            c["outstanding_batches"] += 1


def status_from_server(channel: HttpChannel, url: str) -> dict[str, Any]:
    """From a server's routes: /v1/cluster, the leaders' /metrics, /v1/health and cursor
    routes."""
    cluster = channel.request("GET", url, "/v1/cluster").body or {}
    out: dict[str, Any] = {"source": url, "nodes": cluster.get("nodes", []), "destinations": {}}
    for name, info in sorted((cluster.get("destinations") or {}).items()):
        d = _destination(out, name)
        d["leader"], d["nodes"] = info.get("leader"), sorted(info.get("nodes") or [])
        leader_url = (d["leader"] or {}).get("url")
        if leader_url:
            _server_clients(channel, leader_url, name, d)
            _server_snapshots(channel, leader_url, name, d)
        _add_lag(d, name, fetch_health(channel))
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
    """The leader's subscribed clients (its metrics), their batches and cursors."""
    try:
        text = channel.get_text(leader, "/metrics")
    except CanalError:
        return
    for (metric, labels), value in _parse_metrics(text).items():
        labels_d = dict(labels)
        if labels_d.get("destination") != name or "client" not in labels_d:
            continue
        c = d["clients"].setdefault(labels_d["client"], _new_client())
        if metric == "canal_outstanding_batches":
            c["outstanding_batches"] = int(value)
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
        end = d.get("binlog_end")
        if end:
            write(f"  binlog end: {end.get('journal')}:{end.get('offset')}")
        if d["clients"]:
            write(
                f"  {'CLIENT':<16} {'ACTIVE':<28} {'LAG_BYTES':>10} {'LAG_S':>9} {'OUT':>4}  CURSOR"
            )
        for client, c in sorted(d["clients"].items()):
            lag_b = "-" if c["lag_bytes"] is None else str(c["lag_bytes"])
            lag_s = "-" if c["lag_s"] is None else f"{c['lag_s']:.3f}"
            active = c["active"] or "-"
            write(
                f"  {client:<16} {active:<28} {lag_b:>10} {lag_s:>9} "
                f"{c['outstanding_batches']:>4}  {_position_text(c['cursor'])}"
            )
        for s in d.get("snapshots") or []:
            rate = "-" if s["rows_per_s"] is None else f"{s['rows_per_s']:,.0f}"
            write(
                f"  SNAPSHOT {s['id']:<10} {s['state']:<10} tables {s['tables_done']}/"
                f"{s['tables_total']}  rows {s['rows']:,}  chunks {s['chunks']:,}  rows/s {rate}"
            )
