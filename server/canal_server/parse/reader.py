"""BinlogReader (Canal's EventParser, data side): binlog events → Entries, with our own
reconnect, a dump-error count, heartbeat detection and a master → standby switch.

Run ``reader.run(start)`` in a thread of your own; entries go to ``sink(entries)``
in binlog order. ``sink`` may block (the EventStore's put when full): the reader
then stops reading, so backpressure reaches the database connection and nothing is
dropped. ``stop()`` (any thread) ends ``run`` promptly: it shuts the dump socket
down and wakes every wait; it cannot interrupt a ``sink`` call that blocks forever,
so the sink should give up when its store is closed.

Entries: see ``canal_server.parse.transaction`` (how events become entries, how a
large transaction is split).

Reconnect: after a lost connection the reader resumes from the end of the last
completed transaction (file/offset, or its GTID state in ``gtid_mode``) with the
RetryPolicy's backoff. If part of the interrupted transaction had already been
handed to the sink, the same number of entries of the replayed transaction (same
GTID) is skipped, so nothing is delivered twice. That holds across runs too (the
sink's store lives on: ``run`` again after SWITCHED, or after an error): a resume on
another database that starts before the same transaction (by its GTID state) skips
them there; one that reads another transaction first ends the open one (see
``canal_server.parse.transaction``). ``dump_error_count`` counts consecutive failed
dumps and is reset by the first event read after a reconnect.

Identity: ``identity.source_server_id`` is the ``@@server_id`` of the database that
sends the dump (the server id of the dump's first, made-up Rotate event; replicated
events keep their origin's). When a reconnect by file and offset reaches another
database at the same address (a moved VIP), the file and offset mean nothing there:
``run`` returns ``RunResult.SWITCHED`` before reading anything (also when that database
refuses the position), so the finder chooses a start position on that database. A
reconnect by GTID reads on (GTIDs are global).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from canal_cluster.retry import RetryPolicy
from canal_protocol.errors import (
    BinlogConfigError,
    BinlogConnectionLost,
    BinlogError,
    PurgedPosition,
)
from canal_protocol.positions import EntryPosition, LogIdentity
from canal_server.parse import binlog_stream
from canal_server.parse.binlog_search import SqlBinlogInspector
from canal_server.parse.event_decoder import AnonymousGtidEvent
from canal_server.parse.finder import DatabaseLink
from canal_server.parse.transaction import NO_SKIP, Sink, Skip, TransactionAssembler

__all__ = ["BinlogReader", "DetectingConfig", "ReaderConfig", "RunResult"]

log = logging.getLogger(__name__)

EVENTS = (
    RotateEvent,
    MariadbGtidEvent,
    GtidEvent,
    AnonymousGtidEvent,
    XidEvent,
    QueryEvent,
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    HeartbeatLogEvent,
)


@dataclass(frozen=True)
class DetectingConfig:
    """Canal's ``detecting.*``: a probe query on a separate connection."""

    enable: bool = False
    interval_s: float = 3.0
    sql: str = "SELECT 1"
    retry_threshold: int = 3
    timeout_s: float = 2.0


@dataclass(frozen=True)
class ReaderConfig:
    """What the reader needs. ``master``/``standby`` are DSN dicts (host, port, user,
    password); ``slave_id`` is our replication server id."""

    master: Mapping[str, Any]
    slave_id: int
    standby: Mapping[str, Any] | None = None
    gtid_mode: bool = False
    transaction_size: int = 1024
    heartbeat_s: float = 5.0
    detecting: DetectingConfig = field(default_factory=DetectingConfig)
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(0.1, 2.0, 3.0))
    destination: str = ""

    def __post_init__(self) -> None:
        if self.transaction_size < 2:
            raise ValueError("transaction_size must be >= 2")


class RunResult:
    """Why ``run`` returned."""

    STOPPED = "stopped"
    SWITCHED = "switched"  # now on the other source: find a start position there


def address_of(dsn: Mapping[str, Any]) -> str:
    return f"{dsn['host']}:{dsn['port']}"


def _elsewhere(skip: Skip) -> Skip:
    """``skip`` for a run that may read another database: a GTID names the same
    transaction there; a file position does not, so its transaction only ends there
    (its key matches none)."""
    return skip if skip.by_gtid or not skip.entries else skip._replace(key="")


# -- the reader ----------------------------------------------------------------------------


class BinlogReader:
    """Reads one source's binlog into Entries; see the module doc."""

    def __init__(
        self,
        config: ReaderConfig,
        sink: Sink,
        on_switch: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self._sink = sink
        self._on_switch = on_switch
        self._source = config.master
        self._stop = threading.Event()
        self._switch = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._dump_errors = 0
        self._start_failures = 0  # the source unreachable before reading began
        self._last: EntryPosition | None = None  # while a dump reads: see last_position
        self._asm: TransactionAssembler | None = None
        self._skip = NO_SKIP  # what the sink has of the transaction open at the last resume point
        self._server_id = 0  # @@server_id of the database read (0: no dump yet)
        self._identity: tuple[Mapping[str, Any], LogIdentity] | None = None

    # -- public state

    @property
    def identity(self) -> LogIdentity:
        """The source read now (made again only when the source or its server id
        changed: the sink asks once per transaction)."""
        source, server_id, cached = self._source, self._server_id, self._identity
        if cached is None or cached[0] is not source or cached[1].source_server_id != server_id:
            made = LogIdentity(address_of(source), self.config.slave_id, server_id)
            cached = self._identity = (source, made)
        return cached[1]

    @property
    def source(self) -> Mapping[str, Any]:
        return self._source

    def prefer_source(self, address: str) -> None:
        """Start on the standby when the destination last read from it (``address``, a
        history position's source): a leader elected after a switch to the standby must
        not go back to the master that failed (it would retry it forever). Call before
        ``run``."""
        standby = self.config.standby
        if standby is None or self._source is standby or address != address_of(standby):
            return
        log.info(
            "%s: the destination last read from the standby %s: starting there",
            self.config.destination, address,
        )  # fmt: skip
        self._source = standby

    def note_start_failure(self) -> bool:
        """The source could not be reached before reading began (finding the start).
        After ``detecting.retry_threshold`` such failures in a row, with a standby
        configured, switch to the other source (True): the probe that switches a
        running reader does not run yet."""
        self._start_failures += 1
        if self.config.standby is None:
            return False
        if self._start_failures < self.config.detecting.retry_threshold:
            return False
        self._start_failures = 0
        new = self.config.standby if self._source is self.config.master else self.config.master
        log.warning(
            "%s: %s unreachable %d times before reading began, switching to %s",
            self.config.destination, address_of(self._source),
            self.config.detecting.retry_threshold, address_of(new),
        )  # fmt: skip
        self._source = new
        return True

    @property
    def dump_error_count(self) -> int:
        return self._dump_errors

    @property
    def dump_thread_id(self) -> int | None:
        """The server's thread id of the current dump connection (SHOW PROCESSLIST)."""
        with self._lock:
            conn = getattr(self._stream, "_stream_connection", None)
        ident = getattr(conn, "server_thread_id", None)
        return int(ident[0]) if ident else None

    @property
    def last_position(self) -> EntryPosition | None:
        """End of the last completed transaction read (a resume point)."""
        asm = self._asm  # while a dump reads: its assembler's (made when asked)
        return asm.committed if asm is not None else self._last

    def link(self) -> DatabaseLink:
        """The finder's view of the source read now."""
        return DatabaseLink.connect(self._source, self.config.slave_id)

    # -- control

    def stop(self) -> None:
        """End ``run`` promptly (from any thread); never blocks."""
        self._stop.set()
        self._interrupt()

    def run(self, start: EntryPosition) -> str:
        """Read from ``start`` until stopped (RunResult.STOPPED) or switched to the
        other source (RunResult.SWITCHED: find a start position there and call again).

        Raises PurgedPosition (errno 1236) and BinlogConfigError; lost connections
        are retried from the last completed transaction.
        """
        if not start.journal and not (self.config.gtid_mode and start.gtid):
            raise ValueError(f"start position needs a journal or a GTID state: {start}")
        self._switch.clear()
        self._start_failures = 0
        self._last = start
        self._server_id = 0  # the finder chose ``start`` on whatever database answers now
        self._skip = _elsewhere(self._skip)
        detector = self._start_detector()
        try:
            return self._dump_loop(start)
        finally:
            if detector is not None:
                detector.stop()

    def _dump_loop(self, start: EntryPosition) -> str:
        delays = self._delays()
        while not self._stop.is_set():
            if self._switch.is_set():
                return RunResult.SWITCHED
            try:
                self._dump(self._last or start)
            except (BinlogConfigError, PurgedPosition):
                if self._stop.is_set():
                    break
                if self._another_database():
                    return RunResult.SWITCHED
                raise
            except (BinlogError, pymysql.err.MySQLError, OSError) as exc:
                if self._stop.is_set() or self._switch.is_set():
                    continue
                if self._dump_errors == 0:
                    delays = self._delays()
                self._dump_errors += 1
                delay = next(delays)
                log.warning(
                    "%s: binlog dump from %s failed (%d in a row), retrying from %s in %.1fs: %s",
                    self.config.destination, self.identity.source_address,
                    self._dump_errors, self._last, delay, exc,
                )  # fmt: skip
                self._stop.wait(delay)
        return RunResult.STOPPED

    def _delays(self) -> Iterator[float]:
        def forever() -> Iterator[float]:
            while True:
                yield from self.config.retry.delays()

        return forever()

    def _open(self, start: EntryPosition) -> Any:
        kw: dict[str, Any] = {"journal": start.journal, "offset": start.offset}
        if self.config.gtid_mode and start.gtid:
            kw = {"gtid": start.gtid}
        return binlog_stream.open_stream(
            self._source, self.config.slave_id, blocking=True, only_events=EVENTS,
            heartbeat_s=self.config.heartbeat_s, gtid_mode=self.config.gtid_mode, **kw,
        )  # fmt: skip

    def _dump(self, start: EntryPosition) -> None:
        """One dump connection: read until stopped or switched, or raise its error."""
        stream = self._open(start)  # the server's settings are checked first
        # a found or committed position carries the GTID state there (the finder asks
        # BINLOG_GTID_POS, or reads a MySQL binlog, when it has none): asking again
        # costs a scan of the binlog file up to the offset, on every new leader's start
        inspector = SqlBinlogInspector(self._source, self.config.slave_id)
        state = start.gtid or inspector.gtid_at(start.journal, start.offset)
        size = self.config.transaction_size
        asm = TransactionAssembler(self._sink, start, state, size, self._skip)
        with self._lock:
            self._stream = stream
        if self._stop.is_set() or self._switch.is_set():
            self._interrupt()
        self._asm = asm
        try:
            self._read(stream, asm, by_gtid=bool(self.config.gtid_mode and start.gtid))
        finally:
            self._skip = asm.resume_skip
            self._last, self._asm = asm.committed, None
            with self._lock:
                self._stream = None
            stream.close()

    def _read(self, stream: Any, asm: TransactionAssembler, by_gtid: bool) -> None:
        while not (self._stop.is_set() or self._switch.is_set()):
            ev = binlog_stream.next_event(stream)
            if ev is None:
                raise BinlogConnectionLost("the server ended the binlog dump")
            span = binlog_stream.event_span(ev)
            if span.artificial and isinstance(ev, RotateEvent):
                if not self._same_database(span.server_id, by_gtid):
                    return
            elif self._dump_errors and not span.artificial:
                self._dump_errors = 0  # a real event: this dump works
            asm.on_event(ev, span)

    def _another_database(self) -> bool:
        """After a refused dump: True when another database answers at the address than
        the one this run read (a moved VIP without our file): the finder must choose."""
        if not self._server_id:
            return False
        try:
            now = SqlBinlogInspector(self._source).server_id()
        except (pymysql.err.MySQLError, OSError):
            return False
        return not self._same_database(now, by_gtid=False)

    def _same_database(self, server_id: int, by_gtid: bool) -> bool:
        """Record the server id of the database that sends this dump; False (and the
        run ends SWITCHED) when another database answers a resume by file and offset."""
        before, self._server_id = self._server_id, server_id
        if not before or before == server_id:
            return True
        address = address_of(self._source)
        if by_gtid:
            log.warning(
                "%s: another database answers at %s (server id %d, was %d); resumed by GTID",
                self.config.destination, address, server_id, before,
            )  # fmt: skip
            return True
        log.warning(
            "%s: another database answers at %s (server id %d, was %d): its binlog offsets "
            "differ, finding a start position there",
            self.config.destination, address, server_id, before,
        )  # fmt: skip
        self._switch.set()
        return False

    def _interrupt(self) -> None:
        with self._lock:
            if self._stream is not None:
                binlog_stream.interrupt(self._stream)

    # -- heartbeat detection and the standby switch

    def _start_detector(self) -> _Detector | None:
        if not self.config.detecting.enable:
            return None
        det = _Detector(self.config.detecting, lambda: self._source, self._on_detect_failure)
        det.start()
        return det

    def _on_detect_failure(self, failures: int) -> bool:
        """Called by the detector after ``retry_threshold`` failures; True = switched."""
        standby = self.config.standby
        if standby is None or self._switch.is_set():
            return False
        new = standby if self._source is self.config.master else self.config.master
        log.warning(
            "%s: %s failed %d heartbeat probes, switching to %s",
            self.config.destination, address_of(self._source), failures, address_of(new),
        )  # fmt: skip
        self._source = new
        self._switch.set()
        self._interrupt()
        if self._on_switch is not None:
            self._on_switch(address_of(new))
        return True


class _Detector:
    """Canal's heartbeat detection: ``sql`` every ``interval_s`` on its own connection."""

    def __init__(
        self,
        config: DetectingConfig,
        source: Callable[[], Mapping[str, Any]],
        on_threshold: Callable[[int], bool],
    ) -> None:
        self._config = config
        self._source = source
        self._on_threshold = on_threshold
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="binlog-detecting", daemon=True)
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._config.timeout_s * 3 + 5)

    def _probe(self) -> None:
        dsn = dict(self._source())
        dsn["connect_timeout"] = dsn["read_timeout"] = self._config.timeout_s
        with binlog_stream.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(self._config.sql)
            cur.fetchall()

    def _loop(self) -> None:
        while not self._stop.wait(self._config.interval_s):
            try:
                self._probe()
                self.failures = 0
            except Exception as exc:  # any failure counts: that is what a probe is for
                self.failures += 1
                log.info("heartbeat probe %d failed: %s", self.failures, exc)
                if self.failures >= self._config.retry_threshold and self._on_threshold(
                    self.failures
                ):
                    self.failures = 0
