"""One destination of a node (Canal's CanalInstance), wired in plain code.

``build_instance(config, coordinator, keys, ...)`` returns an ``Instance`` whose
``on_gained(epoch)`` / ``on_lost(epoch)`` are the destination's RunningMonitor
callbacks. Per leadership term (a ``_Term``) it owns::

    BinlogReader (own thread) → EventSink (instance filter) → EventStore → EmbeddedServer
                      ↑ PositionFinder ← Failback(Memory → Meta min cursor)

* gained: activate the PeriodicMetaManager (loads subscriptions, cursors and marks
  from etcd), build the store and the EmbeddedServer (it registers the restored
  clients), then the reader thread finds the start position and reads; when the
  latest position cannot be found on the source and only the destination's origin
  pins it, the destination starts anew (new origin, ``warning`` in the reader status);
  an acked cursor that pins it fails naming the client and how to unsubscribe it;
* lost / fenced: stop serving and parsing at once (store closed → waiting long polls
  end, reader stopped, the sink refuses anything once the monitor names another
  epoch), forget the memory position of the thrown-away store, final meta flush
  (fenced: only lands while the epoch is still valid);
* unconfirmed (``leader_epoch()`` None, the same epoch may come back: a keepalive sent
  before the fencing deadline and answered after it): the sink pauses, putting
  nothing, reader state ``paused``, until confirmed again (reading on) or the term
  ends; after ``election.ttl_s`` it reports the epoch fenced and ends.

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
from dataclasses import dataclass, replace
from typing import Any

import pymysql

from canal_cluster.coordinator import Coordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy
from canal_cluster.running import RunningMonitor
from canal_protocol.entry import Entry
from canal_protocol.errors import (
    BinlogConfigError,
    BinlogError,
    CoordinatorUnavailable,
    InvalidArgument,
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
from canal_server.parse.binlog_search import OPERATOR_HINT
from canal_server.parse.finder import (
    ConfiguredPosition,
    DatabaseLink,
    FinderConfig,
    FoundPosition,
    PositionFinder,
)
from canal_server.parse.local_reader import (
    LOCAL_PREFIX,
    LocalBinlogDir,
    LocalBinlogInspector,
    LocalBinlogReader,
    LocalReaderConfig,
)
from canal_server.parse.logposition import (
    FailbackLogPositionManager,
    Holders,
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
from canal_server.snapshot import Snapshots, SnapshotTerm
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
PAUSE_STEP_S = 0.05  # how often a reader paused on an unconfirmed epoch asks again
BINLOG_END_TTL_S = 1.0
BINLOG_END_TIMEOUT_S = 1  # connect/read timeout of the SHOW MASTER STATUS query


class Role(enum.StrEnum):
    LEADER = "leader"
    STANDBY = "standby"
    FENCED = "fenced"
    STARTING = "starting"


@dataclass(frozen=True)
class ReaderStatus:
    """What the reader of the current term is doing; ``error`` is for operators, and so
    is ``warning`` (the term went on in a way that may have skipped changes)."""

    state: str = "idle"  # idle | finding | running | paused | retrying | failed
    error: str = ""
    error_type: str = ""
    start: dict[str, Any] | None = None
    warning: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "error_type": self.error_type,
            "start": self.start,
            "warning": self.warning,
        }


def query_master_status(dsn: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{journal, offset, gtid, source_address}`` of the binlog end of ``dsn`` (the
    position first, then ``@@gtid_binlog_pos``, so the GTID is never older); None when
    the database has no binlog. Raises ``pymysql.err.MySQLError`` or ``OSError`` when
    it does not answer within ``BINLOG_END_TIMEOUT_S``."""
    conn = {**dsn, "connect_timeout": BINLOG_END_TIMEOUT_S, "read_timeout": BINLOG_END_TIMEOUT_S}
    with binlog_stream.connect(conn) as c, c.cursor() as cur:
        row = binlog_stream.binary_log_status(cur)
        gtid: Any = row[4:5] if row and len(row) > 4 else None  # MySQL: Executed_Gtid_Set
        if gtid is None:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
            gtid = cur.fetchone()
    if not row:
        return None
    return {
        "journal": str(row[0]),
        "offset": int(row[1]),
        "gtid": str(gtid[0] or "").replace("\n", "") if gtid else "",
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


def local_check(directory: str) -> SourceCheck:
    """A local destination's directory: readable, with its newest binlog file's end."""
    local = LocalBinlogDir(directory)
    try:
        journal, offset = LocalBinlogInspector(local).master_status()
    except (BinlogError, OSError) as exc:
        return SourceCheck(local.address, None, f"{type(exc).__name__}: {exc}")
    return SourceCheck(local.address, {"journal": journal, "offset": offset})


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


class _NoHistory:
    """``LatestPositions`` of a destination that starts anew."""

    def get_latest(self, destination: str) -> LogPosition | None:
        return None


def _unsubscribe_hint(destination: str, clients: Sequence[str]) -> str:
    """The way forward when acked cursors cannot be found on the source."""
    routes = ", ".join(
        f"DELETE /v1/destinations/{destination}/clients/{c}/subscription" for c in clients
    )
    names = ", ".join(repr(c) for c in clients)
    several = len(clients) > 1
    whose = f"cursors of clients {names}" if several else f"cursor of client {names}"
    return (
        f"; it is the acked {whose}: to go on without the changes not read yet, "
        f"unsubscribe {'them' if several else 'it'} ({routes}); subscribed again, a client "
        f"starts where its subscription's `start` says (latest by default)"
    )


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
        self.warning = ""  # kept in every status of this term once set
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
        self.reader = inst.make_reader(self._sink_guard(inst))
        self.finder = PositionFinder(inst.finder_config(), self.positions)
        self.thread: threading.Thread | None = None
        self.started: LogPosition | None = None  # where the reader began (last found)
        self.base: LogPosition | None = None  # where it began first: the store's start

    def set_status(
        self, state: str, error: str = "", error_type: str = "", start: Any = None
    ) -> None:
        self.status = ReaderStatus(state, error, error_type, start, self.warning)

    def _sink_guard(self, inst: Instance) -> Any:
        def sink(entries: Sequence[Entry]) -> None:
            if not self._vouched(inst):
                self._paused(inst)
            self.sink.sink(entries, self.reader.identity)
            if inst.metrics is not None:
                inst.metrics.parsed(entries)

        return sink

    def _vouched(self, inst: Instance) -> bool:
        """The monitor confirms this term's epoch now; False: not right now (no epoch);
        StoreClosed once the term is stopped or the monitor names another epoch."""
        monitor = inst.monitor
        epoch = self.epoch if monitor is None else monitor.leader_epoch()
        if self.stop.is_set() or (epoch is not None and epoch != self.epoch):
            raise StoreClosed(f"{inst.config.name}: epoch {self.epoch} ended")
        return epoch is not None

    def _paused(self, inst: Instance) -> None:
        """Wait, putting nothing, until the epoch is confirmed again: a keepalive sent
        before the fencing deadline and answered after it extends the same epoch, with
        no ``on_lost`` (``reader.state`` is ``paused`` meanwhile). Past
        ``election.ttl_s`` that keepalive has ended long ago: report the epoch fenced
        (the monitor steps down) and end with StoreClosed; also when the term ends."""
        assert inst.monitor is not None
        ttl_s = inst.monitor.config.ttl_s
        running, since = self.status, time.monotonic()
        self.set_status("paused", _unconfirmed(self.epoch, ttl_s), start=running.start)
        log.warning("%s: %s", inst.name, self.status.error)
        try:
            while not self._vouched(inst):
                if time.monotonic() - since >= ttl_s:
                    self._give_up(inst, ttl_s)
                self.stop.wait(PAUSE_STEP_S)
        except StoreClosed:
            if self.status.state == "paused":  # the term ended: the reader had no fault
                self.status = running
            raise
        self.status = running
        log.info("%s: epoch %d confirmed again, reading on", inst.name, self.epoch)

    def _give_up(self, inst: Instance, ttl_s: float) -> None:
        error = f"epoch {self.epoch} was not confirmed again within election.ttl_s ({ttl_s:g}s)"
        self.set_status("failed", f"{error}: stepped down", start=self.status.start)
        log.error("%s: %s, stepping down", inst.name, error)
        assert inst.monitor is not None
        inst.monitor.report_fenced(self.epoch)
        raise StoreClosed(f"{inst.name}: {error}")


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
        flt = config.filter
        self.snapshots = Snapshots(
            config.name, config.snapshot, self.meta,
            EventFilter(flt.regex, flt.black_regex, flt.heartbeat_table), flush=self.meta.flush,
        )  # fmt: skip

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

    def make_reader(self, sink: Any) -> BinlogReader | LocalBinlogReader:
        """The network reader, or the local one for a ``local.dir`` destination."""
        c, local = self.config, self.config.local
        if local is None:
            return BinlogReader(self.reader_config(), sink)
        config = LocalReaderConfig(
            local.dir, local.schema_file, local.poll_ms / 1000, c.effective_slave_id,
            c.transaction_size, c.name,
        )  # fmt: skip
        return LocalBinlogReader(config, sink)

    def finder_config(self) -> FinderConfig:
        c = self.config
        master = _configured(c.master) or ConfiguredPosition()
        if c.local is not None:  # configured positions name files of the directory
            master = replace(master, address=f"{LOCAL_PREFIX}{c.local.dir}")
        return FinderConfig(
            destination=c.name,
            master=master,
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
        if isinstance(term.reader, LocalBinlogReader):
            return term.reader.binlog_end()
        return self._binlog_end.get(term.reader.source)

    def database(self) -> dict[str, Any]:
        """``{reachable, address, error}`` of the database: the one the current term
        reads, else the configured master; asked with the binlog end (same cache). A
        ``local.dir`` destination's "database" is its directory of binlog files."""
        term = self._term
        if self.config.local is not None:
            checked = local_check(self.config.local.dir)
        else:
            dsn = (
                term.reader.source if term is not None else dsn_of(self.config, self.config.master)
            )
            checked = self._binlog_end.check(dsn)
        return {"reachable": checked.reachable, "address": checked.address, "error": checked.error}

    def table_schema(self, schema: str, table: str) -> TableSchema:
        """A table's columns from ``information_schema`` of the database the current term
        reads (the configured master off term); see ``canal_server.table_schema``.
        ``InvalidArgument("table")`` for a ``local.dir`` destination: it has no database."""
        if self.config.local is not None:
            raise InvalidArgument(
                "table",
                f"{self.config.name} reads binlog files from {self.config.local.dir} "
                "(local.dir): there is no database whose information_schema could give a "
                "table's columns; read it in map mode (without the Spark option 'table')",
            )
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
        new_destination = self.meta.origin() is None
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
        self.snapshots.start_term(self._snapshot_term(term), initial=new_destination)
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

    def _snapshot_term(self, term: _Term) -> SnapshotTerm:
        def vouched() -> bool:
            monitor = self.monitor
            return monitor is None or monitor.leader_epoch() == term.epoch

        return SnapshotTerm(
            epoch=term.epoch, sink=term.sink, source=lambda: term.reader.source,
            identity=lambda: term.reader.identity, vouched=vouched, stop=term.stop,
            min_cursor=lambda: MetaLogPositionManager(lambda d: self.meta).get_latest(self.name),
        )  # fmt: skip

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
        self.snapshots.stop_term()
        term.memory.forget(self.name)
        if term.thread is not None:
            term.thread.join(5.0)
            if term.thread.is_alive():
                log.warning("%s: reader of epoch %d still stopping", self.name, term.epoch)

    # -- the reader thread ---------------------------------------------------------------

    def _read_loop(self, term: _Term) -> None:
        history = term.positions.get_latest(self.name)
        if history is not None and isinstance(term.reader, BinlogReader):
            term.reader.prefer_source(history.identity.source_address)
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
                if _switched_after(term.reader, exc):
                    wait = 0.0  # try the other source at once
                term.set_status("failed" if fatal else "retrying", str(exc), type(exc).__name__)
                if self.metrics is not None:
                    self.metrics.reader_error()
                log.error(
                    "%s: binlog reader failed (epoch %d), retrying in %.1fs: %s: %s",
                    self.name, term.epoch, wait, type(exc).__name__, exc,
                )  # fmt: skip
                term.stop.wait(wait)
        term.set_status("idle", term.status.error, term.status.error_type, term.status.start)

    def _record_origin(self, origin: LogPosition, term: _Term, anew: bool = False) -> None:
        """The first leader of a destination records where its history starts, at once:
        a client that has not acked yet counts as being there (MetaLogPositionManager).
        An origin recorded without a time gets it once a leader finds it; ``anew``
        replaces the origin (it cannot be found any more)."""
        current = self.meta.origin()
        if current is not None and not anew and not _gains_time(current, origin):
            return
        self.meta.set_origin(origin)
        try:
            self.meta.flush()
        except CoordinatorUnavailable as exc:  # the periodic flush retries it
            log.warning("%s: origin not flushed yet (epoch %d): %s", self.name, term.epoch, exc)
        log.info("%s: origin of the destination is %s (epoch %d)", self.name, origin, term.epoch)

    def _read_once(self, term: _Term) -> str:
        reader = term.reader
        term.set_status("finding")
        link = reader.link()
        found = self._find(term, link, reader.dump_error_count)
        if term.stop.is_set():
            return RunResult.STOPPED
        start = found.position
        self._record_origin(LogPosition(found.identity, start), term)
        term.started = LogPosition(found.identity, start)
        if term.base is None:
            term.base = term.started
        term.sink.reached(term.started, start.gtid)
        term.set_status(
            "running", start={**start.to_dict(), "reasons": [str(r) for r in found.reasons]}
        )
        log.info("%s: reading from %s (epoch %d)", self.name, start, term.epoch)
        return reader.run(start)

    def _find(self, term: _Term, link: DatabaseLink, dump_errors: int) -> FoundPosition:
        """The finder's start position. When the latest position cannot be found on this
        source (purged, or another source and no time to fall back by): if only the
        origin pins it, start the destination anew (``_start_anew``); if acked cursors
        do, fail naming those clients and how to unsubscribe them."""
        anew = False
        while True:
            try:
                return term.finder.find(link, dump_errors=dump_errors)
            except (PositionNotFound, PurgedPosition) as exc:
                history = term.positions.get_latest(self.name)
                if history is None or term.memory.get_latest(self.name) is not None:
                    raise
                holders = term.meta_positions.holders(self.name, history)
                if anew or not holders.origin_only:
                    hint = _unsubscribe_hint(self.name, holders.cursors) if holders.cursors else ""
                    raise type(exc)(f"{exc}{hint}") from exc
                self._start_anew(term, link, history, holders, exc)
                anew = True

    def _start_anew(
        self,
        term: _Term,
        link: DatabaseLink,
        lost: LogPosition,
        holders: Holders,
        exc: Exception,
    ) -> None:
        """The origin cannot be found: find a start as a new destination would (the
        configured position, else the binlog end), record it as the origin, and say so
        loudly: clients that never acked may miss changes made before it."""
        found = PositionFinder(self.finder_config(), _NoHistory()).find(link)
        self._record_origin(found.log_position, term, anew=True)
        clients = ", ".join(repr(c) for c in holders.without_cursor) or "none yet"
        cause = str(exc).removesuffix(f"; {OPERATOR_HINT}")
        term.warning = (
            f"the origin {lost.position} of {lost.identity.source_address} cannot be found "
            f"on {link.address} ({type(exc).__name__}: {cause}); the destination started "
            f"anew at {found.position} ({found.reason}): clients that never acked "
            f"({clients}) miss the changes before it"
        )
        log.error("%s: %s (epoch %d)", self.name, term.warning, term.epoch)


def _unconfirmed(epoch: int, ttl_s: float) -> str:
    return (
        f"epoch {epoch} is not confirmed by the election right now (its fencing deadline "
        f"passed; a keepalive to etcd still under way may extend it): nothing is read into "
        f"the store until it is confirmed again; stepping down if it is not within "
        f"election.ttl_s ({ttl_s:g}s)"
    )


def _switched_after(reader: BinlogReader | LocalBinlogReader, exc: Exception) -> bool:
    """The reader could not reach its source before reading: after enough of those it
    switches to the other configured source (``BinlogReader.note_start_failure``)."""
    unreachable = isinstance(exc, pymysql.err.OperationalError | OSError)
    return unreachable and isinstance(reader, BinlogReader) and reader.note_start_failure()


def _gains_time(current: LogPosition, found: LogPosition) -> bool:
    """``found`` is ``current`` (recorded without a time) with its time now known."""
    a, b = current.position, found.position
    same = current.identity == found.identity and (a.journal, a.offset) == (b.journal, b.offset)
    return same and a.timestamp_ms <= 0 < b.timestamp_ms


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
