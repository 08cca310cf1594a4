"""The ``canal`` Spark Structured Streaming source (PySpark Python Data Source API).

::

    from canal_client.spark import CanalDataSource
    spark.dataSource.register(CanalDataSource)
    df = (spark.readStream.format("canal").option("etcd", "http://127.0.0.1:2379")
          .option("destination", "example").option("clientId", "1001").load())

Rows: see ``canal_client.spark_rows`` (one row per changed row; ``before``/``after`` as
``map<string,string>``). Options: ``etcd`` (comma-separated endpoints) or ``server``
(comma-separated node URLs), ``destination``, ``clientId``, ``batchSize`` (entries per
server batch, 1000), ``filter`` (table regex), ``token``, ``etcdPrefix`` (``/canal``),
``pollTimeoutMs`` (1000), ``maxBatchesPerTrigger`` (10), ``replayTimeoutS`` (120),
``rowsPerPartition`` (10000), ``exclusive`` (false: one active consumer per client id).

How batches become micro-batches, exactly once with a checkpointed sink:

* The driver-side reader (one long-lived object per query) holds one ClusterConnector
  (it follows leader changes; a change shows as a log line). ``latestOffset`` takes
  server batches **without ack** into an in-memory ledger and returns an offset (see
  ``spark_rows.Offset``): entries so far, the key of the last one, the batch ids.
* ``partitions(start, end)`` ships the **rows** of the entries in ``(start, end]`` inside
  the partition objects, so ``read`` in the Python worker only yields them: workers
  open no connection (a second connection of the same client id would roll the
  driver's batches back), and a task retry reads the very same rows.
* ``commit(end)`` (one micro-batch late; never for the last batch of an availableNow
  run) acks the newest server batch lying entirely at or before ``end`` and forgets
  those entries. Server batches stay outstanding until then.
* A replay (driver restarted from its checkpoint, or a range the ledger no longer
  holds): first ``get_batch`` of the batch ids in the offset; when the server no longer
  has them (a reconnect rolls outstanding batches back), roll back and read from the
  client's cursor again, dropping entries at or before ``start``. Since only committed
  ranges are acked, the cursor is never past ``start``; the rebuilt range is checked
  against the planned entry count (``ReplayMismatch`` when it differs, never a silent
  difference). Entries a server delivers twice (after a failover or reconnect) are
  recognised by their binlog key and dropped.

Limits: keys are binlog file/offset of the database the destination reads, so a switch
of the database itself (primary → standby with other binlog names) is not handled
here; availableNow stops at entries committed after the query started (database clock)
or when a poll of ``pollTimeoutMs`` brings nothing.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from canal_client.spark_rows import (
    FIELDS,
    MIN_KEY,
    EntryKey,
    Offset,
    Row,
    entry_key,
    entry_rows,
    entry_timestamp_ms,
)
from canal_cluster.errors import CanalError, ConfigError, ReplayMismatch

__all__ = [
    "CanalDataSource",
    "CanalOptions",
    "CanalPartition",
    "CanalStreamReader",
    "Ledger",
    "schema_ddl",
]

log = logging.getLogger("canal_client.spark")


def schema_ddl() -> str:
    """The source's schema as a Spark DDL string."""
    return ", ".join(f"`{name}` {kind}" for name, kind in FIELDS)


# -- options ----------------------------------------------------------------------------


def _int(opts: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(name, f"must be within {low}..{high}, got {value}")
    return value


def _list(raw: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (raw or "").split(",") if p.strip())


@dataclass(frozen=True)
class CanalOptions:
    """The reader's options, validated (``ConfigError`` names the option)."""

    destination: str
    client_id: str
    etcd: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    batch_size: int = 1000
    filter: str = ""
    token: str | None = None
    etcd_prefix: str = "/canal"
    poll_timeout_s: float = 1.0
    max_batches_per_trigger: int = 10
    replay_timeout_s: float = 120.0
    rows_per_partition: int = 10_000
    exclusive: bool = False
    connector_factory: str = ""

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> CanalOptions:
        etcd, servers = _list(opts.get("etcd")), _list(opts.get("server"))
        factory = str(opts.get("connectorFactory", ""))
        if bool(etcd) == bool(servers) and not factory:
            raise ConfigError("etcd", "give exactly one of the options 'etcd' and 'server'")
        for name in ("destination", "clientId"):
            if not str(opts.get(name, "")).strip():
                raise ConfigError(name, "is required")
        exclusive = str(opts.get("exclusive", "false")).strip().lower()
        if exclusive not in ("true", "false"):
            raise ConfigError("exclusive", f"must be true or false, got {exclusive!r}")
        return cls(
            destination=str(opts["destination"]).strip(),
            client_id=str(opts["clientId"]).strip(),
            etcd=etcd,
            servers=servers,
            batch_size=_int(opts, "batchSize", 1000, 1, 1_000_000),
            filter=str(opts.get("filter", "")),
            token=opts.get("token") or None,
            etcd_prefix=str(opts.get("etcdPrefix", "/canal")),
            poll_timeout_s=_int(opts, "pollTimeoutMs", 1000, 0, 600_000) / 1000,
            max_batches_per_trigger=_int(opts, "maxBatchesPerTrigger", 10, 1, 100_000),
            replay_timeout_s=float(_int(opts, "replayTimeoutS", 120, 1, 86_400)),
            rows_per_partition=_int(opts, "rowsPerPartition", 10_000, 1, 10_000_000),
            exclusive=exclusive == "true",
            connector_factory=factory,
        )


# -- the connector the reader needs (canal_client.connector's contract) ---------------------


class BatchLike(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def entries(self) -> Sequence[Any]: ...


class ConnectorLike(Protocol):
    @property
    def epoch(self) -> int: ...
    @property
    def leader_url(self) -> str | None: ...
    def connect(self) -> None: ...
    def disconnect(self) -> None: ...
    def subscribe(self, filter: str = "") -> None: ...
    def get_without_ack(self, size: int, timeout_s: float) -> BatchLike: ...
    def get_batch(self, batch_id: int) -> BatchLike: ...
    def ack(self, batch_id: int) -> None: ...
    def rollback(self, batch_id: int | None = None) -> None: ...


def make_connector(options: CanalOptions) -> ConnectorLike:
    """A ClusterConnector for the options, or the ``connectorFactory`` ("module:function")."""
    if options.connector_factory:
        module, _, name = options.connector_factory.partition(":")
        factory: Callable[[CanalOptions], ConnectorLike] = getattr(
            importlib.import_module(module), name
        )
        return factory(options)
    from canal_client.connector import ClusterConnector

    return ClusterConnector(
        options.destination,
        options.client_id,
        etcd=list(options.etcd) or None,
        servers=list(options.servers) or None,
        token=options.token,
        prefix=options.etcd_prefix,
        exclusive=options.exclusive,
    )


# -- the ledger: entries taken but not committed -----------------------------------------


@dataclass(frozen=True)
class _Item:
    key: EntryKey
    timestamp_ms: int
    rows: list[Row]


@dataclass
class Ledger:
    """Entries after ``floor`` in binlog order, and the server batches they came in."""

    floor: EntryKey = MIN_KEY
    items: list[_Item] = field(default_factory=list)
    batches: list[tuple[int, EntryKey]] = field(default_factory=list)  # fetch order

    @property
    def top(self) -> EntryKey:
        return self.items[-1].key if self.items else self.floor

    def covers(self, lo: EntryKey, hi: EntryKey) -> bool:
        return self.floor <= lo and hi <= self.top

    def add(self, batch_id: int, entries: Sequence[Any]) -> int:
        """Append the entries after ``top`` (others were delivered before); count them."""
        added, last = 0, MIN_KEY
        for entry in entries:
            key = entry_key(entry)
            last = max(last, key)
            if key > self.top:
                self.items.append(_Item(key, entry_timestamp_ms(entry), entry_rows(entry)))
                added += 1
        self.batches = [b for b in self.batches if b[0] != batch_id] + [(batch_id, last)]
        return added

    def between(self, lo: EntryKey, hi: EntryKey) -> list[_Item]:
        return [it for it in self.items if lo < it.key <= hi]

    def batch_ids(self, lo: EntryKey, hi: EntryKey) -> list[int]:
        """Ids of the tracked batches ending in ``(lo, hi]``, fetch order."""
        return [bid for bid, last in self.batches if lo < last <= hi]

    def release(self, upto: EntryKey) -> int | None:
        """Forget everything at or before ``upto``; the batch id to ack, if any."""
        done = [bid for bid, last in self.batches if last <= upto]
        self.batches = [b for b in self.batches if b[1] > upto]
        self.items = [it for it in self.items if it.key > upto]
        self.floor = max(self.floor, upto)
        return done[-1] if done else None

    def reset(self, floor: EntryKey) -> None:
        self.floor, self.items, self.batches = floor, [], []


# -- Spark classes ---------------------------------------------------------------------


class CanalPartition(InputPartition):
    """The rows of (part of) one micro-batch, shipped to the Python worker."""

    def __init__(self, index: int, rows: list[Row]) -> None:
        super().__init__(index)
        self.rows = rows


class CanalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver-side streaming reader; see the module docstring."""

    def __init__(
        self,
        options: CanalOptions,
        connector_factory: Callable[[CanalOptions], ConnectorLike] = make_connector,
    ) -> None:
        self.options = options
        self.ledger = Ledger()
        self._factory = connector_factory
        self._connector: ConnectorLike | None = None
        self._epoch = 0
        self._until_ms: int | None = None

    # -- connection

    def _conn(self) -> ConnectorLike:
        if self._connector is None:
            conn = self._factory(self.options)
            conn.connect()
            conn.subscribe(self.options.filter)
            self._connector, self._epoch = conn, conn.epoch
            log.info("%s: canal source connected to %s", self._what(), conn.leader_url)
        return self._connector

    def _what(self) -> str:
        return f"{self.options.destination}/{self.options.client_id} (epoch {self._epoch})"

    def _fetch(self, timeout_s: float) -> int | None:
        """One get_without_ack into the ledger: how many new entries; None when none came."""
        conn = self._conn()
        batch = conn.get_without_ack(self.options.batch_size, timeout_s)
        if conn.epoch != self._epoch:
            log.warning(
                "%s: leader changed to %s (epoch %d)", self._what(), conn.leader_url, conn.epoch
            )
            self._epoch = conn.epoch
        if batch.id < 0 or not batch.entries:
            return None
        added = self.ledger.add(batch.id, batch.entries)
        log.debug("%s: batch %d, %d new entries", self._what(), batch.id, added)
        return added

    # -- DataSourceStreamReader

    def initialOffset(self) -> dict[str, Any]:
        return Offset().to_dict()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = Offset.from_dict(start)
        if not (self.ledger.floor <= begin.last <= self.ledger.top):
            self._restart_at(begin.last, "planning after")
        pending = self.ledger.between(begin.last, self.ledger.top)
        if not pending:
            self._fill()
            pending = self.ledger.between(begin.last, self.ledger.top)
        pending = self._admit(pending, limit)
        if not pending:
            return start
        last = pending[-1].key
        ids = self.ledger.batch_ids(begin.last, last)
        if self.ledger.top > last:  # the batch holding ``last`` may end after it
            ids += [b for b, end in self.ledger.batches if end > last][:1]
        return Offset(begin.total + len(pending), last, tuple(ids)).to_dict()

    def _fill(self) -> None:
        """Up to maxBatchesPerTrigger batches with new entries (repeats do not count)."""
        useful, timeout_s = 0, self.options.poll_timeout_s
        while useful < self.options.max_batches_per_trigger:
            added = self._fetch(timeout_s)
            if added is None:
                return
            useful, timeout_s = useful + (added > 0), 0.0

    def _admit(self, pending: list[_Item], limit: ReadLimit) -> list[_Item]:
        if self._until_ms is not None:
            late = [i for i, it in enumerate(pending) if it.timestamp_ms > self._until_ms]
            pending = pending[: late[0]] if late else pending
        if isinstance(limit, ReadMaxRows):
            pending = pending[: max(1, limit.max_rows)]
        return pending

    def _restart_at(self, key: EntryKey, why: str) -> None:
        """Roll back and read from the cursor again, keeping only entries after ``key``."""
        log.info("%s: %s %s: reading again from the cursor", self._what(), why, key)
        conn = self._conn()
        conn.rollback()
        self.ledger.reset(key)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[CanalPartition]:
        begin, stop = Offset.from_dict(start), Offset.from_dict(end)
        if stop.total <= begin.total:
            return []
        items = self._range(begin, stop)
        rows = [row for it in items for row in it.rows]
        size = self.options.rows_per_partition
        return [
            CanalPartition(i, rows[at : at + size])
            for i, at in enumerate(range(0, len(rows), size))
        ]

    def _range(self, begin: Offset, stop: Offset) -> list[_Item]:
        if not self.ledger.covers(begin.last, stop.last) and not self._refetch(begin, stop):
            self._reread(begin, stop)
        items = self.ledger.between(begin.last, stop.last)
        if len(items) != stop.total - begin.total:
            raise ReplayMismatch(
                f"{self._what()}: ({begin.last}, {stop.last}] was planned with "
                f"{stop.total - begin.total} entries, the server delivered {len(items)} "
                "(filter changed or binlog purged?)"
            )
        return items

    def _refetch(self, begin: Offset, stop: Offset) -> bool:
        """The planned batches by id, if the server still has them outstanding."""
        if not stop.batches:
            return False
        conn, trial = self._conn(), Ledger(floor=begin.last)
        try:
            for batch_id in stop.batches:
                trial.add(batch_id, conn.get_batch(batch_id).entries)
        except CanalError as exc:
            log.info("%s: planned batches not outstanding any more (%s)", self._what(), exc)
            return False
        if len(trial.between(begin.last, stop.last)) != stop.total - begin.total:
            return False
        self.ledger = trial
        return True

    def _reread(self, begin: Offset, stop: Offset) -> None:
        self._restart_at(begin.last, "replaying the micro-batch after")
        deadline = time.monotonic() + self.options.replay_timeout_s
        while self.ledger.top < stop.last:
            if time.monotonic() > deadline:
                raise ReplayMismatch(
                    f"{self._what()}: replay of ({begin.last}, {stop.last}] reached only "
                    f"{self.ledger.top} within {self.options.replay_timeout_s:g} s"
                )
            self._fetch(self.options.poll_timeout_s or 1.0)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, CanalPartition)
        yield from partition.rows

    def commit(self, end: dict[str, Any]) -> None:
        upto = Offset.from_dict(end).last
        batch_id = self.ledger.release(upto)
        if batch_id is None or self._connector is None:
            return
        try:
            self._connector.ack(batch_id)
            log.debug("%s: acked batch %d (up to %s)", self._what(), batch_id, upto)
        except CanalError as exc:  # the cursor moves with the next ack
            log.warning("%s: ack of batch %d failed: %s", self._what(), batch_id, exc)

    def stop(self) -> None:
        if self._connector is not None:
            self._connector.disconnect()
            self._connector = None

    # -- SupportsTriggerAvailableNow

    def prepareForTriggerAvailableNow(self) -> None:
        self._until_ms = int(time.time() * 1000)
        log.info("%s: availableNow: entries committed up to %d ms", self._what(), self._until_ms)


class CanalDataSource(DataSource):
    """``spark.readStream.format("canal")``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = CanalOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "canal"

    def schema(self) -> str:
        return schema_ddl()

    def streamReader(self, schema: StructType) -> CanalStreamReader:
        return CanalStreamReader(self.parsed)
