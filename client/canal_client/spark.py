"""The ``canal`` Spark Structured Streaming source (PySpark Python Data Source API).

::

    from canal_client.spark import CanalDataSource
    spark.dataSource.register(CanalDataSource)
    df = (spark.readStream.format("canal").option("etcd", "http://127.0.0.1:2379")
          .option("destination", "example").option("clientId", "1001").load())

Rows: see ``canal_client.spark_rows`` (one row per changed row; map mode: ``before``/
``after`` as ``map<string,string>``) and, with ``.option("table", "schema.table")``, the
typed mode of ``canal_client.spark_schema`` (structs of the table's columns, asked of
the leader when the query starts; a table map of another shape stops the query with
``SchemaChanged`` before its rows are planned). Options (README.md "Spark"): ``etcd``
(comma-separated endpoints) or ``server`` (comma-separated node URLs), ``destination``,
``clientId``, ``batchSize`` (entries per server batch, 1000), ``filter`` (table regex),
``token``, ``etcdPrefix`` (``/canal``), ``pollTimeoutMs`` (1000),
``maxBatchesPerTrigger`` (100), ``maxRowsPerTrigger`` (500000), ``replayTimeoutS`` (120),
``rowsPerPartition`` (250000), ``rowsPerArrowBatch`` (250000),
``exclusive`` (false: one active consumer per client id), ``availableNowStallS`` (120),
``startingOffsets`` (``earliest``; see README), ``table`` (typed mode), ``prefetch`` (true),
``connectorFactory`` (tests: ``module:function`` building the connector); a secured etcd
(``https://`` endpoints): ``etcdCaFile``, ``etcdCertFile``, ``etcdKeyFile``, ``etcdUser``
and ``etcdPassword`` or ``etcdPasswordFile``; ``tokenFile`` instead of ``token`` (files
read on the driver; Spark redacts option values whose name holds "password" or "token"
in its UI and plans).

How batches become micro-batches, exactly once with a checkpointed sink:

* The driver-side reader (one long-lived object per query) holds one ClusterConnector
  (it follows leader changes; a change shows as a log line). ``latestOffset`` takes
  server batches **without ack** into an in-memory ledger and returns an offset (see
  ``spark_rows.Offset``): entries so far, the key of the last one, the batch ids.
* The ledger holds each batch as the leader's **bytes** (``canal_client.packed``: the
  entries indexed, their rows not decoded). ``partitions(start, end)`` gives each
  partition the bytes of whole entries of ``(start, end]`` that yield rows; ``read``
  on the executor decodes them into one Arrow RecordBatch (``canal_client.spark_arrow``).
  Executors open no connection (a second connection of the same client id would roll
  the driver's batches back), and a task retry reads the very same bytes.
* Spark plans a micro-batch only after the previous one is committed, so the
  ``start`` of ``latestOffset`` is committed: it acks the newest server batch lying
  entirely at or before ``start`` and forgets those entries, as ``commit(end)`` does
  (which comes one micro-batch late, and never for the last batch of an availableNow
  run). Server batches stay outstanding until then; the last micro-batch of an
  availableNow run is acked by the run's final ``latestOffset`` (the one that finds
  nothing more).
* ``prefetch``: while the executors run a micro-batch (from the end of
  ``partitions``), a thread takes the next server batches without ack into the ledger:
  up to maxBatchesPerTrigger batches, until the entries after the planned end hold
  maxRowsPerTrigger rows, a poll finds nothing (the leader's store holds nothing more
  for the client: the planned micro-batch is in it too, unacked) or the availableNow
  target is served. Every other call of the reader first stops the thread (after the
  fetch under way), so the ledger and the connector serve one thread at a time; the
  next ``latestOffset`` plans what it took, topped up with what the leader has ready
  (no wait) while the trigger holds fewer than maxBatchesPerTrigger batches and
  maxRowsPerTrigger rows. A prefetched batch is an outstanding batch
  like any other: a leader change or a restarted driver rolls it back, the entries come
  again from the cursor and those held already are dropped.
* A ``start`` (or replay start) the ledger does not hold (driver restarted from its
  checkpoint, a new run, a range the ledger no longer holds): roll back, then move the
  client's cursor through ``start``'s entry (``POST .../cursor``: committed by Spark,
  whatever this process acked; after a leader change too, as far as the new leader's
  store reaches). A replayed micro-batch first tries ``get_batch`` of the batch ids in
  the offset; when the server no longer has them (a reconnect rolls outstanding
  batches back), it reads from the cursor again, dropping entries at or before
  ``start``. Since only committed ranges are acked, the cursor is never past
  ``start``; the rebuilt range is checked against the planned entry count
  (``ReplayMismatch`` when it differs, never a silent difference). Entries a server
  delivers twice (after a failover or reconnect) are recognised by their binlog key and
  dropped. An older node without ``POST .../cursor``: a warning, and the entries up to
  ``start`` are read again and skipped.

availableNow: ``prepareForTriggerAvailableNow`` records the **target**, the leader's
``binlog_end`` from ``/v1/health`` (where the source's binlog ended when the run
started). The run plans only entries that start before it (and an incremental
snapshot's READ entries put at it) and ends once the server has served up to it (a
batch's ``end``) and a poll found nothing more at it, or once the leader's
``reader_position`` was seen at or past it (binlog position or GTID state) and a later
poll came back empty. Until
then ``latestOffset`` waits for the leader's reader to catch up, and while it does it
plans all but the last server batch it holds: the next trigger then always has
something to plan, so Spark commits (and the source acks) the previous micro-batch even
when the leader's store is full of this client's unacked batches. Without progress of
the server or its reader for ``availableNowStallS`` (database down, no leader, a store
smaller than one server batch) the run ends early with a warning; the next run goes
on. A leader without ``binlog_end`` (an older node, or its database does not answer):
the run ends at entries committed after it started (database clock) or when a poll of
``pollTimeoutMs`` brings nothing, with a warning. Processing-time triggers are not
affected.

Keys (``spark_rows.EntryKey``) are binlog file/offset of the database an entry was read
from, with its GTID and place in its transaction: after a database switch (primary →
standby, other binlog names) keys of the two databases compare by GTID, and the cursor
is moved through a checkpointed key only while the leader reads that key's database
(``HttpProgress``: ``reader_position.source_address``); otherwise the entries up to it
are read again and dropped as duplicates. An availableNow run across a switch may end
by ``availableNowStallS``; the next run goes on.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from canal_client.packed import PackedBatch, PackedEntry
from canal_client.spark_arrow import record_batches
from canal_client.spark_rows import (
    MIN_KEY,
    READ_PLACE,
    UNKNOWN_SUB,
    EntryKey,
    Offset,
    entry_key,
    entry_timestamp_ms,
    gtid_of,
    gtid_order,
)
from canal_client.spark_schema import (
    TypedTable,
    describe_change,
    generic_ddl,
    generic_struct,
    shape_of,
    typed_struct,
)
from canal_cluster.retry import RetryPolicy
from canal_protocol import Batch
from canal_protocol.errors import (
    CanalError,
    ConfigError,
    ReplayMismatch,
    RetryExhausted,
    SchemaChanged,
    UnknownTable,
)

__all__ = [
    "BinlogPoint",
    "CanalDataSource",
    "CanalOptions",
    "CanalPartition",
    "CanalStreamReader",
    "HttpProgress",
    "LeaderProgress",
    "Ledger",
    "ProgressProbe",
    "batch_end",
    "batch_source",
    "fetch_table",
    "gtid_covers",
    "local_session",
    "parse_progress",
    "point_key",
    "schema_ddl",
    "table_filter",
]

log = logging.getLogger("canal_client.spark")


def schema_ddl() -> str:
    """The map mode's schema as a Spark DDL string."""
    return generic_ddl()


def local_session(
    master: str = "local[2]", app: str = "canal", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A SparkSession for jobs on this machine or a loopback cluster, with the source
    registered: no UI, UTC, driver bound to 127.0.0.1, two shuffle partitions, Python
    workers of this interpreter (unless ``PYSPARK_PYTHON`` says otherwise) that may take
    120 s to start on a busy machine (Spark's default wait is 15 s); ``conf``: more
    settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.python.authenticate.socketTimeout": "120s",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(CanalDataSource)
    return spark


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


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = str(opts.get(name, default)).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(name, f"must be true or false, got {raw!r}")
    return raw == "true"


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
    max_batches_per_trigger: int = 100
    max_rows_per_trigger: int = 500_000
    replay_timeout_s: float = 120.0
    rows_per_partition: int = 250_000
    rows_per_arrow_batch: int = 250_000
    exclusive: bool = False
    connector_factory: str = ""
    available_now_stall_s: float = 120.0
    starting_offsets: str = "earliest"
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password: str = field(default="", repr=False)
    table: str = ""  # typed mode: "schema.table"
    prefetch: bool = True

    @property
    def table_parts(self) -> tuple[str, str]:
        schema, _, table = self.table.partition(".")
        return schema, table

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> CanalOptions:
        etcd, servers = _list(opts.get("etcd")), _list(opts.get("server"))
        factory = str(opts.get("connectorFactory", ""))
        if bool(etcd) == bool(servers) and not factory:
            raise ConfigError("etcd", "give exactly one of the options 'etcd' and 'server'")
        for name in ("destination", "clientId"):
            if not str(opts.get(name, "")).strip():
                raise ConfigError(name, "is required")
        exclusive, prefetch = _bool(opts, "exclusive", False), _bool(opts, "prefetch", True)
        starting = str(opts.get("startingOffsets", "earliest")).strip().lower()
        if starting not in ("earliest", "latest"):
            raise ConfigError("startingOffsets", f"must be earliest or latest, got {starting!r}")
        table = str(opts.get("table", "")).strip()
        if table and not re.fullmatch(r"[^.\s]+\.[^\s]+", table):
            raise ConfigError("table", f"must be schema.table, got {table!r}")
        if table and str(opts.get("filter", "")).strip():
            raise ConfigError("filter", "not with 'table': a typed query reads its one table")
        return cls(
            destination=str(opts["destination"]).strip(),
            client_id=str(opts["clientId"]).strip(),
            etcd=etcd,
            servers=servers,
            batch_size=_int(opts, "batchSize", 1000, 1, 65_536),  # the server's limit
            filter=str(opts.get("filter", "")),
            token=_secret_option(opts, "token", "tokenFile") or None,
            etcd_prefix=str(opts.get("etcdPrefix", "/canal")),
            poll_timeout_s=_int(opts, "pollTimeoutMs", 1000, 0, 600_000) / 1000,
            max_batches_per_trigger=_int(opts, "maxBatchesPerTrigger", 100, 1, 100_000),
            max_rows_per_trigger=_int(opts, "maxRowsPerTrigger", 500_000, 1, 1_000_000_000),
            replay_timeout_s=float(_int(opts, "replayTimeoutS", 120, 1, 86_400)),
            rows_per_partition=_int(opts, "rowsPerPartition", 250_000, 1, 10_000_000),
            rows_per_arrow_batch=_int(opts, "rowsPerArrowBatch", 250_000, 1, 10_000_000),
            exclusive=exclusive,
            connector_factory=factory,
            available_now_stall_s=float(_int(opts, "availableNowStallS", 120, 1, 86_400)),
            starting_offsets=starting,
            etcd_ca_file=str(opts.get("etcdCaFile", "")),
            etcd_cert_file=str(opts.get("etcdCertFile", "")),
            etcd_key_file=str(opts.get("etcdKeyFile", "")),
            etcd_user=str(opts.get("etcdUser", "")),
            etcd_password=_secret_option(opts, "etcdPassword", "etcdPasswordFile"),
            table=table,
            prefetch=prefetch,
        )

    def etcd_security(self) -> Any:
        """The ``EtcdSecurity`` of the ``etcd*`` options (None when none is given)."""
        if not (self.etcd_ca_file or self.etcd_cert_file or self.etcd_user):
            return None
        from canal_cluster.etcd_security import EtcdSecurity

        return EtcdSecurity(
            self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file, self.etcd_user,
            self.etcd_password, labels=_ETCD_LABELS,
        )  # fmt: skip


_ETCD_LABELS = {
    "endpoints": "etcd",
    "ca_file": "etcdCaFile",
    "cert_file": "etcdCertFile",
    "key_file": "etcdKeyFile",
    "username": "etcdUser",
    "password": "etcdPassword",
}


def _secret_option(opts: Mapping[str, str], name: str, file_name: str) -> str:
    """Option ``name``, or the content of the file ``file_name`` names (one trailing
    newline off): a secret that stays out of the job's code and command line."""
    path = str(opts.get(file_name, ""))
    if path and opts.get(name):
        raise ConfigError(file_name, f"give {name} or {file_name}, not both")
    if not path:
        return str(opts.get(name, ""))
    try:
        return Path(path).read_text().removesuffix("\n")
    except OSError as exc:
        raise ConfigError(file_name, f"cannot read {path!r}: {exc.strerror}") from None


# -- the connector the reader needs (canal_client.connector's contract) ---------------------


class ConnectorLike(Protocol):
    @property
    def epoch(self) -> int: ...
    @property
    def leader_url(self) -> str | None: ...
    def connect(self) -> None: ...
    def disconnect(self) -> None: ...
    def subscribe(self, filter: str = "", start: str | None = None) -> None: ...
    def get_without_ack(self, size: int, timeout_s: float) -> Batch: ...
    def get_batch(self, batch_id: int) -> Batch: ...
    def ack(self, batch_id: int) -> object: ...
    def rollback(self, batch_id: int | None = None) -> None: ...
    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None: ...


def make_connector(options: CanalOptions, lookup: bool = False) -> ConnectorLike:
    """A ClusterConnector for the options, or the ``connectorFactory`` ("module:function").
    ``lookup``: for read-only calls (``table``): no rollback on connect, bounded retries."""
    if options.connector_factory:
        module, _, name = options.connector_factory.partition(":")
        factory: Callable[[CanalOptions], ConnectorLike] = getattr(
            importlib.import_module(module), name
        )
        return factory(options)
    from canal_client.connector import ClusterConnector

    extra: dict[str, Any] = {}
    if lookup:
        extra = {"rollback_on_connect": False, "retry": LOOKUP_RETRY}
    return ClusterConnector(
        options.destination,
        options.client_id,
        etcd=list(options.etcd) or None,
        servers=list(options.servers) or None,
        token=options.token,
        prefix=options.etcd_prefix,
        exclusive=options.exclusive and not lookup,
        etcd_security=options.etcd_security(),
        **extra,
    )


LOOKUP_RETRY = RetryPolicy(initial_s=0.2, multiplier=2.0, max_delay_s=2.0, attempts=30)


def table_filter(options: CanalOptions) -> str:
    """The client filter of a query: ``filter``, or exactly the typed mode's table."""
    if not options.table:
        return options.filter
    schema, table = options.table_parts
    return re.escape(schema) + "\\." + re.escape(table)


def fetch_table(options: CanalOptions) -> TypedTable:
    """The typed mode's table as the leader answers it now (``GET .../tables/{t}``);
    ``ConfigError`` naming ``table`` when it does not exist or no leader answers."""
    conn = make_connector(options, lookup=True)
    lookup = getattr(conn, "table", None)
    if not callable(lookup):
        raise ConfigError("table", f"{type(conn).__name__} cannot look tables up")
    try:
        conn.connect()
        answer = lookup(options.table)
    except UnknownTable as exc:
        raise ConfigError("table", f"{options.table}: no such table ({exc})") from None
    except (RetryExhausted, CanalError) as exc:
        raise ConfigError(
            "table", f"{options.table}: the destination's leader did not answer its columns: {exc}"
        ) from None
    finally:
        conn.disconnect()
    return TypedTable.from_wire(answer)


# -- availableNow: where the source's binlog ends, how far the leader read ----------------


_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def _gtid_seqs(state: str) -> dict[int, int]:
    """``"0-1-42,1-2-7"`` → {domain: sequence number}."""
    out: dict[int, int] = {}
    for part in state.split(","):
        m = _GTID.match(part.strip())
        if m:
            out[int(m.group(1))] = int(m.group(3))
    return out


def gtid_covers(have: str, want: str) -> bool:
    """True when GTID state ``have`` includes every transaction of ``want`` (not empty)."""
    wanted = _gtid_seqs(want)
    seqs = _gtid_seqs(have)
    return bool(wanted) and all(seqs.get(d, -1) >= n for d, n in wanted.items())


AFTER_SNAPSHOTS = 1 << 62  # a snapshot ordinal after every real one


@dataclass(frozen=True)
class BinlogPoint:
    """A point of the source's binlog as ``/v1/health`` reports it."""

    key: EntryKey  # (journal, offset): the next event starts there
    gtid: str = ""
    source: str = ""  # host:port of the database

    @classmethod
    def parse(cls, d: Any) -> BinlogPoint | None:
        if not isinstance(d, Mapping):
            return None
        gtid, source = str(d.get("gtid") or ""), str(d.get("source_address") or "")
        try:
            key = point_key(str(d.get("journal") or ""), int(d.get("offset") or 0), source, gtid)
        except (TypeError, ValueError):
            return None
        if not key.file and not gtid:
            return None
        return cls(key, gtid, source)

    def reaches(self, target: BinlogPoint) -> bool:
        """At or after ``target``, by binlog file and offset or by GTID state (the GTID
        state also covers a binlog that ends with a rotation and no transaction)."""
        if self.source and target.source and self.source != target.source:
            return False
        if self.key.file and target.key.file and self.key >= target.key:
            return True
        return gtid_covers(self.gtid, target.gtid)

    @property
    def last_key(self) -> EntryKey:
        """After the point and the incremental snapshot entries put at it (they lie
        between it and the next binlog event)."""
        return replace(self.key, snap=AFTER_SNAPSHOTS)

    def __str__(self) -> str:
        return f"{self.key} gtid={self.gtid or '-'}"


@dataclass(frozen=True)
class LeaderProgress:
    """The leader's view of a destination: its epoch, reader position and binlog end."""

    epoch: int
    reader: BinlogPoint | None = None
    binlog_end: BinlogPoint | None = None


def parse_progress(health: Any, destination: str) -> LeaderProgress | None:
    """``destination``'s progress from a ``/v1/health`` body; None unless the node leads it."""
    dests = health.get("destinations") if isinstance(health, Mapping) else None
    d = dests.get(destination) if isinstance(dests, Mapping) else None
    if not isinstance(d, Mapping) or d.get("role") != "leader":
        return None
    return LeaderProgress(
        int(d.get("epoch") or 0),
        BinlogPoint.parse(d.get("reader_position")),
        BinlogPoint.parse(d.get("binlog_end")),
    )


ProgressProbe = Callable[[ConnectorLike], LeaderProgress | None]


class HttpProgress:
    """A ``ProgressProbe``: ``GET /v1/health`` of the connector's current leader."""

    def __init__(self, options: CanalOptions) -> None:
        self.options = options
        self._channel: Any = None

    def __call__(self, conn: ConnectorLike) -> LeaderProgress | None:
        url = conn.leader_url
        if not url or not url.startswith(("http://", "https://")):
            return None
        if self._channel is None:
            from canal_client.wire import HttpChannel

            self._channel = HttpChannel(wire="json", token=self.options.token, timeout_s=10.0)
        try:
            body = self._channel.request("GET", url, "/v1/health").body
        except Exception as exc:  # any failure only means "no answer": never fail the query
            log.info("%s: /v1/health of %s: %s", self.options.destination, url, exc)
            return None
        return parse_progress(body, self.options.destination)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def point_key(
    journal: str, offset: int, source: str = "", state: str = "", snap: int = 0
) -> EntryKey:
    """The key of a position (where the next event starts): after every entry of the
    transactions a one-domain GTID ``state`` includes, across databases too; ``snap``:
    after the incremental snapshot's entry of that ordinal at this binlog position."""
    gtid = state.strip() if gtid_of(state.strip()) is not None else ""
    return EntryKey.of(journal, offset, source=source, gtid=gtid, sub=UNKNOWN_SUB + 1, snap=snap)


def batch_source(batch: Any) -> str:
    """The database a batch was read from (its ``end``'s identity), "" if not known."""
    for pos in (getattr(batch, "end", None), getattr(batch, "start", None)):
        address = str(getattr(pos, "source_address", "") or "")
        if address:
            return address
    return ""


def batch_end(batch: Any) -> EntryKey:
    """How far a batch reaches in the binlog: its ``end`` (the last raw event, ones the
    client filter dropped included), else where its last entry ends."""
    best, source = MIN_KEY, batch_source(batch)
    end: Any = getattr(batch, "end", None)
    journal = str(getattr(end, "journal", "") or "")
    if journal:
        snap = int(getattr(getattr(end, "position", None), "snapshot", 0) or 0)
        best = point_key(
            journal, int(end.offset), source, str(getattr(end, "gtid", "") or ""), snap
        )
        best = replace(best, part=int(getattr(getattr(end, "position", None), "part", 0) or 0))
    for entry in list(batch.entries)[-1:]:
        header = entry.header
        get = header.get if isinstance(header, Mapping) else partial(getattr, header)
        stop = int(get("end_offset", 0) or get("offset", 0))
        snap, part = int(get("snapshot", 0) or 0), int(get("part", 0) or 0)
        if part and entry.type != "TRANSACTIONEND":  # inside a compressed transaction
            stop = int(get("offset", 0))
        else:
            part = 0
        last = EntryKey.of(str(get("logfile", "")), stop, source=source, snap=snap, part=part)
        best = max(best, last)
    return best


# -- the ledger: entries taken but not committed -----------------------------------------


@dataclass(frozen=True)
class _Item:
    key: EntryKey
    timestamp_ms: int
    rows: int = 0  # Spark rows the entry gives in this query's mode
    data: memoryview | None = None  # its msgpack bytes, when it gives rows
    change: str = ""  # typed mode: how its table map differs from the query's schema
    loose: bool = False  # a snapshot entry or a BEGIN (``Offset.loose``)


Classify = Callable[[PackedEntry], tuple[int, str]]  # (Spark rows, schema change or "")


def _all_rows(entry: PackedEntry) -> tuple[int, str]:
    """Map mode: every ROWDATA entry (a DDL is one row)."""
    if entry.type != "ROWDATA":
        return 0, ""
    return (1 if entry.is_ddl else entry.rows if entry.columns else 0), ""


def _event(key: EntryKey) -> tuple[str, str, int, int, int]:
    """What ``EntryKey.same_event`` compares: the database, binlog place, snapshot ordinal."""
    return key.source, key.file, key.pos, key.part, key.snap


@dataclass
class Ledger:
    """Entries after ``floor`` in binlog order, and the server batches they came in.

    Each entry's key gets the database of its batch (``source``) and its place in its
    transaction (``sub``): 0 for a BEGIN, the previous entry's + 1 when that one came
    just before it from the same database in the same transaction, the known place of
    an event seen before (an entry still held, or the floor), else unknown (-1)."""

    floor: EntryKey = MIN_KEY
    items: list[_Item] = field(default_factory=list)
    batches: list[tuple[int, EntryKey]] = field(default_factory=list)  # fetch order
    prev: EntryKey | None = None  # the entry that arrived last (kept or not)
    _places: dict[tuple[str, str, int, int, int], int] | None = field(default=None, repr=False)

    @property
    def top(self) -> EntryKey:
        return self.items[-1].key if self.items else self.floor

    def covers(self, lo: EntryKey, hi: EntryKey) -> bool:
        return self.floor <= lo and hi <= self.top

    def _place(self, entry: PackedEntry, source: str) -> EntryKey:
        key = entry_key(entry, source)
        prev, sub = self.prev, -1
        if key.same_event(self.floor):
            sub = self.floor.sub
        elif (known := self._held(key)) is not None:
            sub = known
        elif key.snap:
            sub = self._read_place(key, source)
        elif entry.type == "TRANSACTIONBEGIN":
            sub = 0
        elif prev is not None and prev.sub >= 0 and key.gtid and prev.gtid == key.gtid:
            sub = prev.sub + 1 if prev.source == source and not prev.snap else -1
        if sub != key.sub:  # as ``replace(key, sub=sub)``, cheaper
            k = key
            key = EntryKey(
                k.base, k.number, k.pos, k.file, k.source, k.gtid, sub, k.end, k.snap, k.part
            )
        self.prev = key
        return key

    def _read_place(self, key: EntryKey, source: str) -> int:
        """A snapshot entry's place (across databases it sorts by its GTID state, then
        this, then its ordinal): after every entry of its state's transactions, as the
        entry before it when that one is of its chunk; one further than a snapshot entry
        of another database at the same state that it follows (a chunk read again after
        a switch: the ordinals of two databases' positions say nothing of each other, so
        it is kept, READ rows twice rather than lost)."""
        prev, top = self.prev, self.top
        if prev is not None and prev.snap and prev.source == source and prev.gtid == key.gtid:
            return prev.sub
        if top.snap and top.source and source and top.source != source:
            seqs = gtid_order(top.gtid, key.gtid)
            if seqs is not None and seqs[0] == seqs[1]:
                return max(top.sub, READ_PLACE) + 1
        return READ_PLACE

    def _held(self, key: EntryKey) -> int | None:
        """The place of the same event among the entries held (a delivery again)."""
        if not self.items or not key.source or key > self.top:
            return None
        if self._places is None:  # after a release or a reset
            self._places = {_event(i.key): i.key.sub for i in self.items}
        return self._places.get(_event(key))

    def add(
        self,
        batch_id: int,
        entries: Sequence[PackedEntry],
        classify: Classify = _all_rows,
        source: str = "",
    ) -> int:
        """Append the entries after ``top`` (others were delivered before); count them.
        ``source``: the database the batch was read from (its ``end``'s identity)."""
        added, last = 0, MIN_KEY
        for entry in entries:
            key = self._place(entry, source)
            last = max(last, key)
            if key > self.top:
                rows, change = classify(entry)
                data = entry.data if rows else None
                loose = key.snap > 0 or entry.type == "TRANSACTIONBEGIN"
                self.items.append(_Item(key, entry_timestamp_ms(entry), rows, data, change, loose))
                if self._places is not None:
                    self._places[_event(key)] = key.sub
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
        self._places = None
        self.floor = max(self.floor, upto)
        return done[-1] if done else None

    def reset(self, floor: EntryKey, exact: bool = False) -> None:
        """Forget everything; ``floor`` is committed. ``exact``: the next entry delivered
        is the one right after ``floor`` (the cursor was moved to it)."""
        self.floor, self.items, self.batches, self._places = floor, [], [], None
        self.prev = floor if exact else None


# -- the prefetch: the next server batches while the executors run a micro-batch ----------


class _Prefetch:
    """A thread calling ``step`` until it returns False (a trigger's worth held, or a
    poll found nothing) or ``finish`` is called. ``step`` is the reader's own fetch: the
    reader calls ``finish`` (which waits for the fetch under way) before it touches its
    ledger or its connector again, so the two never run at the same time."""

    def __init__(self, step: Callable[[], bool], what: str) -> None:
        self._step, self._what = step, what
        self._stop = threading.Event()
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="canal-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self._step():
                self.batches += 1
        except Exception as exc:  # the reader's next fetch meets it again, if it lasts
            level = logging.INFO if self._stop.is_set() else logging.WARNING
            log.log(level, "%s: prefetch stopped: %s", self._what, exc)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end by itself; True when it has."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def finish(self, timeout_s: float | None = None) -> bool:
        """Stop after the fetch under way; True when the thread has ended."""
        self._stop.set()
        return self.wait(timeout_s)


PREFETCH_STOP_S = 30.0  # ``stop()``: how long the prefetch thread may take to end


# -- Spark classes ---------------------------------------------------------------------


class CanalPartition(InputPartition):
    """Entries of (part of) one micro-batch as the leader's msgpack bytes, joined:
    decoded into Arrow by the executor (``read``)."""

    def __init__(self, index: int, data: bytes, count: int, rows: int) -> None:
        super().__init__(index)
        self.data = data
        self.count = count  # entries
        self.rows = rows  # Spark rows they give


class CanalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver-side streaming reader; see the module docstring."""

    def __init__(
        self,
        options: CanalOptions,
        connector_factory: Callable[[CanalOptions], ConnectorLike] = make_connector,
        progress: ProgressProbe | None = None,
        typed: TypedTable | None = None,
        schema: StructType | None = None,
    ) -> None:
        self.options = options
        self.typed = typed  # typed mode: the table as the leader answered it at query start
        self.schema = schema or (typed_struct(typed) if typed is not None else generic_struct())
        self._arrow: pa.Schema | None = None
        self._shapes: dict[tuple[Any, Any], str] = {}  # typed mode: table map -> change
        self._last_ddl = ""  # typed mode: the last DDL of the table seen (for the error)
        self.ledger = Ledger()
        self._factory = connector_factory
        self._connector: ConnectorLike | None = None
        self._epoch = 0
        self._until_ms: int | None = None
        self._probe: ProgressProbe = progress or HttpProgress(options)
        self._target: BinlogPoint | None = None  # availableNow: the binlog end at its start
        self._served = MIN_KEY  # how far the batches of this ledger reached
        self._reader_past: int | None = None  # epoch whose reader was seen past the target
        self._last_reader: BinlogPoint | None = None
        self._prefetch: _Prefetch | None = None

    # -- connection

    def _conn(self) -> ConnectorLike:
        if self._connector is None:
            conn = self._factory(self.options)
            conn.connect()
            conn.subscribe(table_filter(self.options), start=self.options.starting_offsets)
            self._connector, self._epoch = conn, conn.epoch
            log.info("%s: canal source connected to %s", self._what(), conn.leader_url)
        return self._connector

    def _what(self) -> str:
        return f"{self.options.destination}/{self.options.client_id} (epoch {self._epoch})"

    def _take(self, conn: ConnectorLike, timeout_s: float) -> PackedBatch:
        """get_without_ack as the leader's bytes (a connector returning models: packed)."""
        packed = getattr(conn, "get_without_ack_packed", None)
        if callable(packed):
            batch: PackedBatch = packed(self.options.batch_size, timeout_s)
            return batch
        return PackedBatch.of(conn.get_without_ack(self.options.batch_size, timeout_s))

    def _again(self, conn: ConnectorLike, batch_id: int) -> PackedBatch:
        packed = getattr(conn, "get_batch_packed", None)
        if callable(packed):
            batch: PackedBatch = packed(batch_id)
            return batch
        return PackedBatch.of(conn.get_batch(batch_id))

    def classify(self, entry: PackedEntry) -> tuple[int, str]:
        """(Spark rows the entry gives, schema change or ""); see ``_Item``."""
        table = self.typed
        if table is None:
            return _all_rows(entry)
        h = entry.header
        if entry.type != "ROWDATA" or (h.get("schema"), h.get("table")) != (
            table.schema,
            table.table,
        ):
            return 0, ""
        if entry.is_ddl:
            self._last_ddl = f"{entry.sql!r} at {h.get('logfile')}:{h.get('offset')}"
            return 1, ""
        if entry.columns is None or not entry.rows:
            return 0, ""
        names, types, _ = entry.columns
        change = self._shapes.get((names, types))
        if change is None:
            shape = shape_of(names, types)
            change = "" if shape == table.shape else describe_change(table.shape, shape, types)
            self._shapes[(names, types)] = change
        return entry.rows, change

    def _fetch(self, timeout_s: float) -> int | None:
        """One get_without_ack into the ledger: how many new entries; None when none came."""
        conn = self._conn()
        batch = self._take(conn, timeout_s)
        if conn.epoch != self._epoch:
            log.warning(
                "%s: leader changed to %s (epoch %d)", self._what(), conn.leader_url, conn.epoch
            )
            self._epoch = conn.epoch
        if batch.id < 0 or not batch.entries:
            return None
        added = self.ledger.add(batch.id, batch.entries, self.classify, batch_source(batch))
        self._served = max(self._served, batch_end(batch))
        log.debug("%s: batch %d, %d new entries", self._what(), batch.id, added)
        return added

    # -- prefetch (see the module docstring)

    def _start_prefetch(self, end: EntryKey) -> None:
        """Fetch on in a thread, while the executors run the micro-batch up to ``end``:
        up to maxBatchesPerTrigger batches, until the entries after ``end`` hold
        maxRowsPerTrigger rows, a poll finds nothing, or the availableNow target is
        served."""
        if not self.options.prefetch or self._connector is None:
            return
        rows = sum(it.rows for it in self.ledger.items if it.key > end)
        budget = [self.options.max_rows_per_trigger - rows, self.options.max_batches_per_trigger]

        def step() -> bool:
            if budget[0] <= 0 or budget[1] <= 0:
                return False
            if self._target is not None and self._served >= self._target.last_key:
                return False
            added = self._fetch(0.0)
            if added is None:
                return False
            items = self.ledger.items
            budget[0] -= sum(it.rows for it in items[len(items) - added :])
            budget[1] -= added > 0
            return True

        self._prefetch = _Prefetch(step, self._what())

    def _end_prefetch(self, timeout_s: float | None = None) -> None:
        """Stop the prefetch (after the fetch under way): the ledger holds what it took."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is None:
            return
        if not prefetch.finish(timeout_s):
            log.warning("%s: the prefetch did not end within %g s", self._what(), timeout_s)
        elif prefetch.batches:
            log.debug("%s: %d batches prefetched", self._what(), prefetch.batches)

    def wait_prefetch(self, timeout_s: float | None = None) -> bool:
        """Wait until the prefetch ended by itself (tests); True when none is running."""
        return self._prefetch is None or self._prefetch.wait(timeout_s)

    # -- DataSourceStreamReader

    def initialOffset(self) -> dict[str, Any]:
        return Offset().to_dict()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._end_prefetch()
        begin = Offset.from_dict(start)
        if not (self.ledger.floor <= begin.last <= self.ledger.top):
            self._restart_at(begin.last, "planning after")
        self._settle(begin.last)  # Spark plans after a committed micro-batch only
        if self._target is not None:
            pending = self._limit(self._until_target(begin, self._target), limit)
        else:
            if not self.ledger.between(begin.last, self.ledger.top):
                self._fill()
            elif self.options.prefetch:  # what the prefetch took, topped up with what is ready
                self._fill(0.0, len(self.ledger.batches))
            pending = self._admit(self.ledger.between(begin.last, self.ledger.top), limit)
        pending = self._same_shape(pending)
        if not pending:
            return start
        last = pending[-1].key
        ids = self.ledger.batch_ids(begin.last, last)
        if self.ledger.top > last:  # the batch holding ``last`` may end after it
            ids += [b for b, end in self.ledger.batches if end > last][:1]
        loose = (begin.loose or 0) + sum(it.loose for it in pending)
        return Offset(begin.total + len(pending), last, tuple(ids), loose).to_dict()

    def _same_shape(self, pending: list[_Item]) -> list[_Item]:
        """The entries before the first one of another shape (typed mode); when that one
        is next, everything before it is committed: stop the query (``SchemaChanged``)."""
        changed = [i for i, it in enumerate(pending) if it.change]
        if not changed:
            return pending
        if changed[0] > 0:
            return pending[: changed[0]]
        item, table = pending[0], self.typed
        assert table is not None
        ddl = f" after {self._last_ddl}" if self._last_ddl else ""
        raise SchemaChanged(
            f"{table.full_name} changed its columns{ddl}: {item.change}. The rows from "
            f"{item.key} on have the new shape; the query stopped before them, everything "
            f"before is committed. What to do: restart the query from its checkpoint; it "
            f"reads the table's columns again (this query had schema version "
            f"{table.version or '?'}) and continues with those rows, exactly once. Write it "
            f"where the new "
            f"columns fit (or read the table in map mode, without the option 'table')."
        )

    def _fill(self, timeout_s: float | None = None, taken: int = 0) -> bool:
        """Up to maxBatchesPerTrigger batches with new entries (repeats do not count;
        ``taken`` of them held already) while the ledger holds fewer than
        maxRowsPerTrigger rows, the first poll waiting ``timeout_s`` (pollTimeoutMs); True
        when a poll brought nothing."""
        useful, held = taken, sum(it.rows for it in self.ledger.items)
        timeout_s = self.options.poll_timeout_s if timeout_s is None else timeout_s
        while useful < self.options.max_batches_per_trigger:
            if self._target is not None and self._served >= self._target.last_key:
                return False  # availableNow: the rest is not for this run
            if held >= self.options.max_rows_per_trigger:
                return False
            added = self._fetch(timeout_s)
            if added is None:
                return True
            held += sum(it.rows for it in self.ledger.items[len(self.ledger.items) - added :])
            useful, timeout_s = useful + (added > 0), 0.0
        return False

    def _admit(self, pending: list[_Item], limit: ReadLimit) -> list[_Item]:
        if self._until_ms is not None:
            late = [i for i, it in enumerate(pending) if it.timestamp_ms > self._until_ms]
            pending = pending[: late[0]] if late else pending
        return self._limit(pending, limit)

    def _limit(self, pending: list[_Item], limit: ReadLimit) -> list[_Item]:
        """Spark's ``ReadMaxRows`` (entries), then maxRowsPerTrigger: whole entries, at
        least one that gives rows (cut only before an entry that gives rows)."""
        if isinstance(limit, ReadMaxRows):
            pending = pending[: max(1, limit.max_rows)]
        rows = 0
        for i, it in enumerate(pending):
            if it.rows and rows and rows + it.rows > self.options.max_rows_per_trigger:
                return pending[:i]
            rows += it.rows
        return pending

    # -- availableNow with a target (see the module docstring)

    def _until_target(self, begin: Offset, target: BinlogPoint) -> list[_Item]:
        """The entries after ``begin`` and before the target, waiting while the leader's
        reader catches up; [] once the run is done (or stalled)."""
        wait_s = self.options.poll_timeout_s or 1.0
        last_progress = time.monotonic()
        while True:
            held = self._before(begin, target)
            past = self._reader_past  # seen before the poll below
            empty = self._fill(0.0 if held else wait_s)
            pending = self._before(begin, target)
            # served up to the target: done once past it, or once a poll found nothing
            # more (no snapshot entries at its position left in the store)
            served = self._served >= target.key and (empty or self._served >= target.last_key)
            if served or (empty and past == self._conn().epoch):
                log.info("%s: availableNow: everything before %s taken", self._what(), target)
                return pending
            if pending:
                return self._hold_back(begin, pending)
            if self._observe(target):
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.options.available_now_stall_s:
                log.warning(
                    "%s: availableNow: no progress for %g s (served up to %s, leader's reader "
                    "at %s, target %s): ending the run early, the next run goes on",
                    self._what(), self.options.available_now_stall_s, self._served,
                    self._last_reader, target,
                )  # fmt: skip
                return []

    def _before(self, begin: Offset, target: BinlogPoint) -> list[_Item]:
        """The entries before the target, and an incremental snapshot's entries at its
        position (put once the binlog reached it, before any later binlog event)."""
        limit = target.last_key
        return [it for it in self.ledger.between(begin.last, self.ledger.top) if it.key < limit]

    def _hold_back(self, begin: Offset, pending: list[_Item]) -> list[_Item]:
        """All but the entries of the last server batch when they came in several."""
        ends = [last for _, last in self.ledger.batches if last > begin.last]
        if len(ends) < 2:
            return pending
        return [it for it in pending if it.key <= ends[-2]] or pending

    def _observe(self, target: BinlogPoint) -> bool:
        """Ask the leader how far its reader is; True when that moved since last asked."""
        conn = self._conn()
        progress = self._probe(conn)
        if progress is None or progress.epoch != conn.epoch:
            return False
        reader, previous = progress.reader, self._last_reader
        self._last_reader = reader
        if reader is not None and reader.reaches(target) and self._reader_past != conn.epoch:
            log.info("%s: availableNow: the leader's reader is at %s", self._what(), reader)
            self._reader_past = conn.epoch
        return reader != previous

    def _restart_at(self, key: EntryKey, why: str) -> None:
        """Roll back and read from the cursor again, keeping only entries after ``key``;
        ``key`` ends a micro-batch Spark committed, so the cursor moves there first."""
        log.info("%s: %s %s: reading again from the cursor", self._what(), why, key)
        conn = self._conn()
        conn.rollback()
        self._served, self._reader_past = MIN_KEY, None
        exact = key > MIN_KEY and self._commit_through(conn, key)
        self.ledger.reset(key, exact)

    def _commit_through(self, conn: ConnectorLike, key: EntryKey) -> bool:
        """Move the client's cursor through ``key`` (a committed entry this ledger did not
        take: a restarted driver, a replay); True when it is right after ``key`` now. Not
        when the leader reads another database than ``key``'s (a database switch: its
        file and offset mean nothing there; the entries up to it are read again and
        recognised by GTID); an older node only logs it."""
        if key.source:
            progress = self._probe(conn)
            reader = progress.reader if progress is not None else None
            if reader is None or reader.source != key.source:
                log.info(
                    "%s: the leader reads %s, %s came from %s: the cursor stays, the entries "
                    "up to it are read again and skipped", self._what(),
                    reader.source if reader is not None else "(unknown)", key, key.source,
                )  # fmt: skip
                return False
        try:
            cursor = conn.move_cursor(key.file, key.pos)
        except CanalError as exc:
            log.warning(
                "%s: the leader cannot move the cursor through %s (%s): the entries up to "
                "it are read again and skipped", self._what(), key, exc,
            )  # fmt: skip
            return False
        pos = (cursor or {}).get("position") or {}
        at = f"{pos.get('journal')}:{pos.get('offset')}" if pos else "unset"
        log.info("%s: committed through %s, the cursor is at %s", self._what(), key, at)
        if key.snap or key.part:  # the cursor stops before the entries at its offset
            return False
        return key.end >= 0 and (pos.get("journal"), pos.get("offset")) == (key.file, key.end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[CanalPartition]:
        self._end_prefetch()
        begin, stop = Offset.from_dict(start), Offset.from_dict(end)
        if stop.total <= begin.total:
            return []
        items = [it for it in self._range(begin, stop) if it.data is not None]
        parts = self._split(items)
        self._start_prefetch(stop.last)
        return parts

    def _split(self, items: list[_Item]) -> list[CanalPartition]:
        """Partitions of about rowsPerPartition rows, of whole entries."""
        parts: list[CanalPartition] = []
        group: list[_Item] = []
        total = sum(it.rows for it in items)
        count = -(-total // self.options.rows_per_partition)  # partitions of even size
        rows, size = 0, -(-total // max(1, count))
        for it in items:
            group.append(it)
            rows += it.rows
            if rows >= size or it is items[-1]:
                data = b"".join(g.data for g in group if g.data is not None)
                parts.append(CanalPartition(len(parts), data, len(group), rows))
                group, rows = [], 0
        return parts

    def _range(self, begin: Offset, stop: Offset) -> list[_Item]:
        if not self.ledger.covers(begin.last, stop.last) and not self._refetch(begin, stop):
            self._reread(begin, stop)
        items = self.ledger.between(begin.last, stop.last)
        if len(items) != stop.total - begin.total and not self._moved_only(begin, stop, items):
            raise ReplayMismatch(
                f"{self._what()}: ({begin.last}, {stop.last}] was planned with "
                f"{stop.total - begin.total} entries, the server delivered {len(items)} "
                "(filter changed or binlog purged?)"
            )
        return items

    def _moved_only(self, begin: Offset, stop: Offset, items: list[_Item]) -> bool:
        """The range read again differs from the plan in its loose entries only: a new
        leader put the snapshot chunks after the last mark every client passed again,
        at other positions (docs/snapshot.md, "Failover"), so those planned are gone for
        good (and a BEGIN at a chunk's offset sorts before it). Every other entry is
        there: the replay takes what the range holds now; the chunks' rows come where
        the new leader put them (the table's state there, as any emission)."""
        if begin.loose is None or stop.loose is None:
            return False
        firm = sum(1 for it in items if not it.loose)
        if firm != (stop.total - stop.loose) - (begin.total - begin.loose):
            return False
        log.warning(
            "%s: replay of (%s, %s]: snapshot entries or BEGINs planned %d, there now %d "
            "(a new leader put the snapshot chunks again elsewhere); the other %d entries "
            "are the planned ones: replaying with what is there",
            self._what(), begin.last, stop.last, stop.loose - begin.loose,
            len(items) - firm, firm,
        )  # fmt: skip
        return True

    def _refetch(self, begin: Offset, stop: Offset) -> bool:
        """The planned batches by id, if the server still has them outstanding."""
        if not stop.batches:
            return False
        conn, trial = self._conn(), Ledger(floor=begin.last)
        try:
            for batch_id in stop.batches:
                again = self._again(conn, batch_id)
                trial.add(batch_id, again.entries, self.classify, batch_source(again))
        except CanalError as exc:
            log.info("%s: planned batches not outstanding any more (%s)", self._what(), exc)
            return False
        if len(trial.between(begin.last, stop.last)) != stop.total - begin.total:
            return False
        self.ledger = trial
        self._served, self._reader_past = MIN_KEY, None
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

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """On the executor: the partition's entries decoded into one Arrow RecordBatch."""
        assert isinstance(partition, CanalPartition)
        if self._arrow is None:
            self._arrow = to_arrow_schema(self.schema, timezone="UTC")  # as PySpark checks
        yield from record_batches(
            partition.data, partition.count, self._arrow, self.typed,
            self.options.rows_per_arrow_batch,
        )  # fmt: skip

    def commit(self, end: dict[str, Any]) -> None:
        self._end_prefetch()
        self._settle(Offset.from_dict(end).last)

    def _settle(self, upto: EntryKey) -> None:
        """Spark committed everything up to ``upto``: forget it, ack its server batches."""
        batch_id = self.ledger.release(upto)
        if batch_id is None or self._connector is None:
            return
        try:
            self._connector.ack(batch_id)
            log.debug("%s: acked batch %d (up to %s)", self._what(), batch_id, upto)
        except CanalError as exc:  # the cursor moves with the next ack
            log.warning("%s: ack of batch %d failed: %s", self._what(), batch_id, exc)

    def stop(self) -> None:
        prefetch = self._prefetch
        if prefetch is not None:
            prefetch.finish(0.0)  # asks it to stop; the disconnect ends a retry under way
        if self._connector is not None:
            self._connector.disconnect()
        self._end_prefetch(PREFETCH_STOP_S)
        self._connector = None
        close = getattr(self._probe, "close", None)
        if callable(close):
            close()

    # -- SupportsTriggerAvailableNow

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the target: the leader's binlog end now (see the module docstring)."""
        self._end_prefetch()
        self._until_ms = int(time.time() * 1000)
        progress = self._probe(self._conn())
        target = progress.binlog_end if progress is not None else None
        if target is None:
            log.warning(
                "%s: availableNow: the leader reports no binlog_end (an older node, or its "
                "database does not answer): the run ends at entries committed after %d ms or "
                "at the first empty poll, and may end before the leader caught up",
                self._what(), self._until_ms,
            )  # fmt: skip
            return
        self._target, self._until_ms = target, None
        log.info("%s: availableNow: reading up to the binlog end %s", self._what(), target)


class CanalDataSource(DataSource):
    """``spark.readStream.format("canal")``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = CanalOptions.parse(options)
        self.typed: TypedTable | None = None

    @classmethod
    def name(cls) -> str:
        return "canal"

    def schema(self) -> StructType:
        """Map mode: ``generic_struct()``; typed mode: the table's columns, asked of the
        destination's leader now (kept: this object is pickled after this call)."""
        if not self.parsed.table:
            return generic_struct()
        self.typed = fetch_table(self.parsed)
        log.info(
            "%s: typed stream of %s, schema version %s: %s",
            self.parsed.destination, self.typed.full_name, self.typed.version,
            ", ".join(f"{n} {k}" for n, k in self.typed.shape),
        )  # fmt: skip
        return typed_struct(self.typed)

    def streamReader(self, schema: StructType) -> CanalStreamReader:
        if self.parsed.table and self.typed is None:  # a schema given by the user
            self.typed = fetch_table(self.parsed)
        return CanalStreamReader(self.parsed, typed=self.typed, schema=schema)
