"""Prometheus metrics of one node process (its own registry, no global state).

Counters are updated where things happen (``InstanceMetrics`` for one destination);
gauges that describe current state (store fill, outstanding batches, cursor lag,
epoch) are computed at scrape time from a ``StateSource`` by a custom collector.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from canal_protocol.entry import Entry

__all__ = [
    "CONTENT_TYPE",
    "ClientGauge",
    "DestinationGauges",
    "InstanceMetrics",
    "NodeMetrics",
    "SnapshotGauge",
    "StateSource",
    "lag_of",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class ClientGauge:
    client: str
    outstanding_batches: int
    cursor_lag_s: float | None  # seconds behind the newest binlog event, None if unknown


@dataclass(frozen=True)
class SnapshotGauge:
    """One incremental snapshot's progress (the leader's ``Snapshots``)."""

    snapshot: str
    state: str
    tables_done: int
    tables_total: int
    rows: int
    chunks: int
    rows_per_s: float


@dataclass(frozen=True)
class DestinationGauges:
    destination: str
    epoch: int
    leader: bool
    store_entries: int = 0
    store_bytes: int = 0
    clients: Sequence[ClientGauge] = field(default_factory=tuple)
    snapshots: Sequence[SnapshotGauge] = field(default_factory=tuple)
    store_capacity_bytes: int = 0  # memory.buffer_bytes (0: unknown)
    reader_lag_bytes: int | None = None  # binlog end minus reader position (leader, same file)
    reader_lag_s: float | None = None  # 0 at the end, else now minus the last commit read


def lag_of(
    position: Mapping[str, Any] | None, end: Mapping[str, Any] | None, now_ms: int
) -> tuple[int | None, float | None]:
    """(bytes, seconds) the reader is behind the binlog end; None when not known (no
    end, or another binlog file: the bytes of the files between are not known)."""
    if position is None or end is None:
        return None, None
    if position.get("journal") != end.get("journal"):
        ts = int(position.get("timestamp_ms") or 0)
        return None, (max(0.0, (now_ms - ts) / 1000) if ts else None)
    behind = max(0, int(end["offset"]) - int(position["offset"]))
    if behind == 0:
        return 0, 0.0
    ts = int(position.get("timestamp_ms") or 0)
    return behind, (max(0.0, (now_ms - ts) / 1000) if ts else None)


class StateSource(Protocol):
    def gauges(self) -> Iterable[DestinationGauges]: ...


class InstanceMetrics:
    """The counters of one destination."""

    def __init__(self, node: NodeMetrics, destination: str) -> None:
        self._entries = node.entries.labels(destination)
        self._rows = node.rows.labels(destination)
        self._won = node.elections_won.labels(destination)
        self._lost = node.elections_lost.labels(destination)
        self._errors = node.reader_errors.labels(destination)
        self.newest_event_ms = 0

    def parsed(self, entries: Sequence[Entry]) -> None:
        self._entries.inc(len(entries))
        self._rows.inc(sum(e.row_count for e in entries))
        if entries:
            self.newest_event_ms = max(self.newest_event_ms, entries[-1].header.timestamp_ms)

    def won(self) -> None:
        self._won.inc()

    def lost(self) -> None:
        self._lost.inc()

    def reader_error(self) -> None:
        self._errors.inc()


class _StateCollector(Collector):
    def __init__(self, source: StateSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        epoch = GaugeMetricFamily(
            "canal_epoch", "Epoch of the destination's leader", labels=["destination"]
        )
        leader = GaugeMetricFamily(
            "canal_leader", "1 when this node leads the destination", labels=["destination"]
        )
        entries = GaugeMetricFamily(
            "canal_store_entries", "Entries in the event store", labels=["destination"]
        )
        size = GaugeMetricFamily(
            "canal_store_bytes", "Estimated bytes in the event store", labels=["destination"]
        )
        capacity = GaugeMetricFamily(
            "canal_store_capacity_bytes", "Bytes the event store may hold (memory.buffer_bytes)",
            labels=["destination"],
        )  # fmt: skip
        lag_bytes = GaugeMetricFamily(
            "canal_reader_lag_bytes",
            "Binlog end minus the reader's position, in bytes (leader; same binlog file)",
            labels=["destination"],
        )
        lag_s = GaugeMetricFamily(
            "canal_reader_lag_seconds",
            "0 when the reader is at the binlog end, else seconds since the last commit it read",
            labels=["destination"],
        )
        outstanding = GaugeMetricFamily(
            "canal_outstanding_batches",
            "Outstanding batches per client",
            labels=["destination", "client"],
        )
        lag = GaugeMetricFamily(
            "canal_cursor_lag_seconds",
            "Client cursor behind the newest binlog event read, in seconds",
            labels=["destination", "client"],
        )  # fmt: skip
        for g in self._source.gauges():
            d = g.destination
            epoch.add_metric([d], g.epoch)
            leader.add_metric([d], 1.0 if g.leader else 0.0)
            entries.add_metric([d], g.store_entries)
            size.add_metric([d], g.store_bytes)
            if g.store_capacity_bytes:
                capacity.add_metric([d], g.store_capacity_bytes)
            if g.reader_lag_bytes is not None:
                lag_bytes.add_metric([d], g.reader_lag_bytes)
            if g.reader_lag_s is not None:
                lag_s.add_metric([d], g.reader_lag_s)
            for c in g.clients:
                outstanding.add_metric([d, c.client], c.outstanding_batches)
                if c.cursor_lag_s is not None:
                    lag.add_metric([d, c.client], c.cursor_lag_s)
        yield from (epoch, leader, entries, size, capacity, lag_bytes, lag_s, outstanding, lag)
        yield from _snapshot_metrics(self._source.gauges())


_SNAPSHOT_METRICS = (
    ("tables_done", "canal_snapshot_tables_done", "Tables an incremental snapshot has read"),
    ("tables_total", "canal_snapshot_tables_total", "Tables of an incremental snapshot"),
    ("rows", "canal_snapshot_rows", "Rows an incremental snapshot has put into the stream"),
    ("chunks", "canal_snapshot_chunks", "Chunks an incremental snapshot has put"),
    ("rows_per_s", "canal_snapshot_rows_per_second", "Rows per second since this leader began"),
)


def _snapshot_metrics(gauges: Iterable[DestinationGauges]) -> Iterator[Metric]:
    """Per snapshot (labels destination, snapshot, state), on the leader only."""
    labels = ["destination", "snapshot", "state"]
    families = [(attr, GaugeMetricFamily(n, h, labels=labels)) for attr, n, h in _SNAPSHOT_METRICS]
    for g in gauges:
        for s in g.snapshots:
            for attr, family in families:
                family.add_metric([g.destination, s.snapshot, s.state], getattr(s, attr))
    yield from (family for _, family in families)


class NodeMetrics:
    """Every metric of one node, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.entries = Counter(
            "canal_entries_parsed", "Entries parsed from the binlog", ["destination"], registry=r
        )
        self.rows = Counter(
            "canal_rows", "Row changes parsed from the binlog", ["destination"], registry=r
        )
        self.elections_won = Counter(
            "canal_elections_won",
            "Times this node gained a destination",
            ["destination"],
            registry=r,
        )
        self.elections_lost = Counter(
            "canal_elections_lost",
            "Times this node lost or released a destination",
            ["destination"],
            registry=r,
        )
        self.reader_errors = Counter(
            "canal_reader_errors", "Binlog reader failures", ["destination"], registry=r
        )
        self.etcd_errors = Counter(
            "canal_etcd_errors", "Failed calls to etcd made by the node", registry=r
        )

    def instance(self, destination: str) -> InstanceMetrics:
        return InstanceMetrics(self, destination)

    def watch_state(self, source: StateSource) -> None:
        self.registry.register(_StateCollector(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)
