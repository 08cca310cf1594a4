"""One destination of a node (Canal's CanalInstance), wired in plain code.

``build_instance(config, coordinator, keys, ...)`` returns an ``Instance`` whose
``on_gained(epoch)`` / ``on_lost(epoch)`` are the destination's RunningMonitor
callbacks. Per leadership term (a ``_Term``) it owns::

    BinlogReader (own thread) → EventSink (instance filter) → EventStore → EmbeddedServer
                      ↑ PositionFinder ← Failback(Memory → Meta min cursor)

* gained: activate the PeriodicMetaManager (loads subscriptions, cursors and marks
  from etcd), build the store and the EmbeddedServer (it registers the restored
  clients), then the reader thread finds the start position and reads;
* lost / fenced: stop serving and parsing at once (store closed → waiting long polls
  end, reader stopped, the sink refuses anything once the monitor no longer vouches
  for the epoch), forget the memory position of the thrown-away store, final meta
  flush (fenced: only lands while the epoch is still valid).

``serving()`` gives the EmbeddedServer only while the term is ready AND the monitor
still confirms its epoch, so a leader that fenced itself answers 503 at once.

For ``/v1/health``: ``reader_position()`` is the newest position the reader of the
current term has put into the store (its start before the first one), and
``binlog_end()`` is ``SHOW MASTER STATUS`` (+ ``@@gtid_binlog_pos``) of the source
the reader reads, queried when asked and cached for ``BINLOG_END_TTL_S``.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from canal_cluster.coordinator import Coordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy
from canal_cluster.running import RunningMonitor
from canal_protocol.entry import Entry
from canal_protocol.errors import (
    BinlogConfigError,
    CoordinatorUnavailable,
    PositionNotFound,
    PurgedPosition,
    StartUnavailable,
    StoreClosed,
)
from canal_protocol.positions import LogPosition
from canal_server.config import DestinationConfig, SourceSection, dsn_of
from canal_server.embedded import EmbeddedServer, StartBounds
from canal_server.filter import EventFilter
from canal_server.meta.periodic import PeriodicMetaManager
from canal_server.metrics import InstanceMetrics
from canal_server.parse import binlog_stream
from canal_server.parse.finder import ConfiguredPosition, DatabaseLink, FinderConfig, PositionFinder
from canal_server.parse.logposition import (
    FailbackLogPositionManager,
    MemoryLogPositionManager,
    MetaLogPositionManager,
)
from canal_server.parse.reader import (
    BinlogReader,
    DetectingConfig,
    ReaderConfig,
    RunResult,
    address_of,
)
from canal_server.sink import EventSink
from canal_server.store import EventStore
from canal_server.table_schema import TableSchema, query_table

__all__ = [
    "BINLOG_END_TTL_S",
    "BinlogEndProbe",
    "Instance",
    "ReaderStatus",
    "Role",
    "SourceCheck",
    "build_instance",
    "master_status",
    "query_master_status",
]

log = logging.getLogger(__name__)
FATAL_RETRY_S = 10.0  # purged / misconfigured binlog: retry slowly, the operator must act
BINLOG_END_TTL_S = 1.0
BINLOG_END_TIMEOUT_S = 1  # connect/read timeout of the SHOW MASTER STATUS query


class Role(enum.StrEnum):
    LEADER = "leader"
    STANDBY = "standby"
    FENCED = "fenced"
    STARTING = "starting"


@dataclass(frozen=True)
class ReaderStatus:
    """What the reader of the current term is doing; ``error`` is for operators."""

    state: str = "idle"  # idle | finding | running | retrying | failed
    error: str = ""
    error_type: str = ""
    start: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "error_type": self.error_type,
            "start": self.start,
        }


def query_master_status(dsn: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{journal, offset, gtid, source_address}`` of the binlog end of ``dsn`` (the
    position first, then ``@@gtid_binlog_pos``, so the GTID is never older); None when
    the database has no binlog. Raises ``pymysql.err.MySQLError`` or ``OSError`` when
    it does not answer within ``BINLOG_END_TIMEOUT_S``."""
    conn = {**dsn, "connect_timeout": BINLOG_END_TIMEOUT_S, "read_timeout": BINLOG_END_TIMEOUT_S}
    with binlog_stream.connect(conn) as c, c.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        gtid = cur.fetchone()
    if not row:
        return None
    return {
        "journal": str(row[0]),
        "offset": int(row[1]),
        "gtid": str(gtid[0] or "") if gtid else "",
        "source_address": address_of(dsn),
    }


def master_status(dsn: Mapping[str, Any]) -> dict[str, Any] | None:
    """``query_master_status``, None when the database does not answer."""
    try:
        return query_master_status(dsn)
    except (pymysql.err.MySQLError, OSError) as exc:
        log.debug("SHOW MASTER STATUS on %s failed: %s", address_of(dsn), exc)
        return None


@dataclass(frozen=True)
class SourceCheck:
    """One probe of a source: its binlog end (None: unknown) and the error, if any."""

    address: str
    end: dict[str, Any] | None
    error: str = ""

    @property
    def reachable(self) -> bool:
        return not self.error


class BinlogEndProbe:
    """The binlog end of a source, asked at most once per ``ttl_s`` (a failure too).

    ``query`` returns the end (None: none) or raises ``MySQLError``/``OSError`` when
    the database does not answer: ``check`` then reports it unreachable."""

    def __init__(
        self,
        query: Callable[[Mapping[str, Any]], dict[str, Any] | None] = query_master_status,
        ttl_s: float = BINLOG_END_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._query, self._ttl_s, self._clock = query, ttl_s, clock
        self._lock = threading.Lock()
        self._cached: tuple[float, SourceCheck] | None = None

    def get(self, dsn: Mapping[str, Any]) -> dict[str, Any] | None:
        return self.check(dsn).end

    def check(self, dsn: Mapping[str, Any]) -> SourceCheck:
        address = address_of(dsn)
        with self._lock:  # concurrent callers wait for one query instead of each asking
            cached = self._cached
            fresh = cached is not None and self._clock() - cached[0] < self._ttl_s
            if cached is not None and fresh and cached[1].address == address:
                return cached[1]
            try:
                result = SourceCheck(address, self._query(dsn))
            except (pymysql.err.MySQLError, OSError) as exc:
                log.debug("SHOW MASTER STATUS on %s failed: %s", address, exc)
                result = SourceCheck(address, None, f"{type(exc).__name__}: {exc}")
            self._cached = (self._clock(), result)
            return result


def _point(position: LogPosition) -> dict[str, Any]:
    p = position.position
    return {
        "journal": p.journal,
        "offset": p.offset,
        "gtid": p.gtid,
        "timestamp_ms": p.timestamp_ms,
        "source_address": position.identity.source_address,
    }


def _configured(source: SourceSection | None) -> ConfiguredPosition | None:
    if source is None:
        return None
    return ConfiguredPosition(
        source.address, source.journal_name, source.position, source.timestamp, source.gtid
    )


class _Term:
    """Everything one leadership term builds; thrown away when it ends."""

    def __init__(self, inst: Instance, epoch: int) -> None:
        cfg = inst.config
        self.epoch = epoch
        self.stop = threading.Event()
        self.ready = False
        self.status = ReaderStatus()
        self.store = EventStore(cfg.name, cfg.memory.buffer_size, cfg.memory.buffer_bytes)
        self.memory = MemoryLogPositionManager()
        self.meta_positions = MetaLogPositionManager(lambda d: inst.meta)
        self.positions = FailbackLogPositionManager(self.memory, self.meta_positions)
        flt = cfg.filter
        self.sink = EventSink(
            cfg.name,
            EventFilter(flt.regex, flt.black_regex, flt.heartbeat_table),
            self.store,
            self.positions,
        )
        self.server: EmbeddedServer | None = None
        self.reader = BinlogReader(inst.reader_config(), self._sink_guard(inst))
        self.finder = PositionFinder(inst.finder_config(), self.positions)
        self.thread: threading.Thread | None = None
        self.started: LogPosition | None = None  # where the reader began (last found)
        self.base: LogPosition | None = None  # where it began first: the store's start

    def _sink_guard(self, inst: Instance) -> Any:
        def sink(entries: Sequence[Entry]) -> None:
            monitor = inst.monitor
            if self.stop.is_set() or (monitor is not None and monitor.leader_epoch() != self.epoch):
                raise StoreClosed(f"{inst.config.name}: epoch {self.epoch} ended")
            self.sink.sink(entries, self.reader.identity)
            if inst.metrics is not None:
                inst.metrics.parsed(entries)

        return sink


class Instance:
    """A destination on this node; see the module docstring."""

    def __init__(
        self,
        config: DestinationConfig,
        coordinator: Coordinator,
        keys: Keys,
        flush_period_ms: int = 1000,
        metrics: InstanceMetrics | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.metrics = metrics
        self.monitor: RunningMonitor | None = None
        self.meta = PeriodicMetaManager(
            coordinator, keys, config.name, flush_period_ms, on_fenced=self._on_fenced
        )
        self._lock = threading.Lock()
        self._term: _Term | None = None
        self._closing = False
        self.last_status = ReaderStatus()
        self._binlog_end = BinlogEndProbe()

    # -- wiring ---------------------------------------------------------------------

    def attach(self, monitor: RunningMonitor) -> None:
        self.monitor = monitor

    def reader_config(self) -> ReaderConfig:
        c = self.config
        d = c.detecting
        return ReaderConfig(
            master=dsn_of(c, c.master),
            slave_id=c.effective_slave_id,
            standby=dsn_of(c, c.standby) if c.standby is not None else None,
            gtid_mode=c.gtid_mode,
            transaction_size=c.transaction_size,
            heartbeat_s=c.heartbeat_s,
            detecting=DetectingConfig(
                d.enable, d.interval_s, d.sql, d.retry_threshold, d.timeout_s
            ),
            destination=c.name,
        )

    def finder_config(self) -> FinderConfig:
        c = self.config
        return FinderConfig(
            destination=c.name,
            master=_configured(c.master) or ConfiguredPosition(),
            standby=_configured(c.standby),
            gtid_mode=c.gtid_mode,
            fallback_interval_s=c.fallback_interval_s,
            dump_error_threshold=c.dump_error_threshold,
            slave_id=c.effective_slave_id,
        )

    # -- what the API asks -------------------------------------------------------------

    def serving(self) -> tuple[EmbeddedServer, int] | None:
        """(server, epoch) while this node may serve the destination, else None."""
        term = self._term
        monitor = self.monitor
        if term is None or not term.ready or term.server is None or self._closing:
            return None
        if monitor is None or monitor.leader_epoch() != term.epoch:
            return None
        return term.server, term.epoch

    def role(self) -> tuple[Role, int | None]:
        term = self._term
        if term is None:
            return Role.STANDBY, None
        if self.serving() is not None:
            return Role.LEADER, term.epoch
        monitor = self.monitor
        starting = not term.ready and not self._closing
        if starting and monitor is not None and monitor.leader_epoch() == term.epoch:
            return Role.STARTING, term.epoch
        return Role.FENCED, term.epoch

    def reader_status(self) -> ReaderStatus:
        term = self._term
        return term.status if term is not None else self.last_status

    def reader_position(self) -> dict[str, Any] | None:
        """The newest position the current term's reader put into the store (everything
        before it is stored or filtered out), else where it started; None off term."""
        term = self._term
        if term is None:
            return None
        latest = term.memory.get_latest(self.name) or term.started
        return _point(latest) if latest is not None else None

    def _start_bounds(self, term: _Term) -> StartBounds:
        """Where a new subscription of this term can start (``EmbeddedServer``): the
        store begins where the term's reader first began, the end is the reader's
        position (``reader_position``); before the reader found its start, both are
        where it will begin: the clients' minimum cursor or the origin."""
        planned = term.meta_positions.get_latest(self.name)
        base = term.base or planned
        latest = term.memory.get_latest(self.name) or term.started or planned
        if base is None or latest is None:
            raise StartUnavailable(
                f"{self.name}: where the destination ends is not known yet (the reader of "
                f"epoch {term.epoch} is finding its start); retry"
            )
        return StartBounds(base, latest)

    def binlog_end(self) -> dict[str, Any] | None:
        """The binlog end of the source the current term reads (cached for
        ``BINLOG_END_TTL_S``); None off term or when the database does not answer."""
        term = self._term
        if term is None:
            return None
        return self._binlog_end.get(term.reader.source)

    def database(self) -> dict[str, Any]:
        """``{reachable, address, error}`` of the database: the one the current term
        reads, else the configured master; asked with the binlog end (same cache)."""
        term = self._term
        dsn = term.reader.source if term is not None else dsn_of(self.config, self.config.master)
        checked = self._binlog_end.check(dsn)
        return {"reachable": checked.reachable, "address": checked.address, "error": checked.error}

    def table_schema(self, schema: str, table: str) -> TableSchema:
        """A table's columns from ``information_schema`` of the database the current term
        reads (the configured master off term); see ``canal_server.table_schema``."""
        term = self._term
        dsn = term.reader.source if term is not None else dsn_of(self.config, self.config.master)
        return query_table(dsn, schema, table)

    def store_stats(self) -> tuple[int, int]:
        term = self._term
        return term.store.stats() if term is not None else (0, 0)

    # -- monitor callbacks ---------------------------------------------------------------

    def on_gained(self, epoch: int) -> None:
        log.info("%s: gained (epoch %d): loading meta", self.name, epoch)
        self.meta.activate(epoch)
        term = _Term(self, epoch)
        with self._lock:
            self._term = term
        term.server = EmbeddedServer(
            self.name, term.store, self.meta, start_bounds=lambda: self._start_bounds(term)
        )
        term.thread = threading.Thread(
            target=self._read_loop, args=(term,), name=f"reader {self.name}", daemon=True
        )
        term.thread.start()
        term.ready = True
        if self.metrics is not None:
            self.metrics.won()
        log.info("%s: serving (epoch %d)", self.name, epoch)

    def on_lost(self, epoch: int) -> None:
        with self._lock:
            term, self._term = self._term, None
        if term is not None:
            self._stop_term(term)
            self.last_status = term.status
        self.meta.deactivate(final_flush=True)
        if self.metrics is not None:
            self.metrics.lost()
        log.info("%s: stopped serving (epoch %d)", self.name, epoch)

    def _on_fenced(self, epoch: int) -> None:
        if self.monitor is not None:
            self.monitor.report_fenced(epoch)

    def close_serving(self) -> None:
        """Stop answering and parsing now (SIGTERM); leases are released later."""
        self._closing = True
        term = self._term
        if term is not None:
            term.ready = False
            term.stop.set()
            term.store.stop()
            term.reader.stop()

    def _stop_term(self, term: _Term) -> None:
        term.ready = False
        term.stop.set()
        term.store.stop()  # wakes waiting long polls and a blocked put
        term.reader.stop()
        term.memory.forget(self.name)
        if term.thread is not None:
            term.thread.join(5.0)
            if term.thread.is_alive():
                log.warning("%s: reader of epoch %d still stopping", self.name, term.epoch)

    # -- the reader thread ---------------------------------------------------------------

    def _read_loop(self, term: _Term) -> None:
        delays = RetryPolicy(0.2, 2.0, 5.0).delays()
        while not term.stop.is_set():
            try:
                if self._read_once(term) == RunResult.STOPPED:
                    break
                delays = RetryPolicy(0.2, 2.0, 5.0).delays()
            except StoreClosed:
                break
            except Exception as exc:
                if term.stop.is_set():
                    break
                fatal = isinstance(exc, PurgedPosition | BinlogConfigError | PositionNotFound)
                wait = FATAL_RETRY_S if fatal else next(delays)
                term.status = ReaderStatus(
                    "failed" if fatal else "retrying", str(exc), type(exc).__name__
                )
                if self.metrics is not None:
                    self.metrics.reader_error()
                log.error(
                    "%s: binlog reader failed (epoch %d), retrying in %.1fs: %s: %s",
                    self.name, term.epoch, wait, type(exc).__name__, exc,
                )  # fmt: skip
                term.stop.wait(wait)
        term.status = ReaderStatus(
            "idle", term.status.error, term.status.error_type, term.status.start
        )

    def _record_origin(self, origin: LogPosition, term: _Term) -> None:
        """The first leader of a destination records where its history starts, at once:
        a client that has not acked yet counts as being there (MetaLogPositionManager)."""
        if self.meta.origin() is not None:
            return
        self.meta.set_origin(origin)
        try:
            self.meta.flush()
        except CoordinatorUnavailable as exc:  # the periodic flush retries it
            log.warning("%s: origin not flushed yet (epoch %d): %s", self.name, term.epoch, exc)
        log.info("%s: origin of the destination is %s (epoch %d)", self.name, origin, term.epoch)

    def _read_once(self, term: _Term) -> str:
        reader = term.reader
        term.status = ReaderStatus("finding")
        link = DatabaseLink.connect(reader.source, self.config.effective_slave_id)
        found = term.finder.find(link, dump_errors=reader.dump_error_count)
        if term.stop.is_set():
            return RunResult.STOPPED
        start = found.position
        self._record_origin(LogPosition(found.identity, start), term)
        term.started = LogPosition(found.identity, start)
        if term.base is None:
            term.base = term.started
        term.status = ReaderStatus(
            "running", start={**start.to_dict(), "reasons": [str(r) for r in found.reasons]}
        )
        log.info("%s: reading from %s (epoch %d)", self.name, start, term.epoch)
        return reader.run(start)


def build_instance(
    config: DestinationConfig,
    coordinator: Coordinator,
    keys: Keys,
    *,
    flush_period_ms: int = 1000,
    metrics: InstanceMetrics | None = None,
) -> Instance:
    """The wired destination; attach its RunningMonitor with ``attach`` before starting it."""
    return Instance(config, coordinator, keys, flush_period_ms, metrics)
