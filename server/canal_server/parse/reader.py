"""BinlogReader (Canal's EventParser, data side): binlog events → Entries, with our own
reconnect, a dump-error count, heartbeat detection and a master → standby switch.

Run ``reader.run(start)`` in a thread of your own; entries go to ``sink(entries)``
in binlog order. ``sink`` may block (the EventStore's put when full): the reader
then stops reading, so backpressure reaches the database connection and nothing is
dropped. ``stop()`` (any thread) ends ``run`` promptly: it shuts the dump socket
down and wakes every wait; it cannot interrupt a ``sink`` call that blocks forever,
so the sink should give up when its store is closed.

Entries (Canal style): a transaction is TRANSACTIONBEGIN (its MariadbGtidEvent), one
ROWDATA per rows event (INSERT/UPDATE/DELETE), TRANSACTIONEND (its XidEvent, or a
``COMMIT`` query of a non-transactional engine). A standalone GTID event (flag 1,
DDL and other statements) gives one ROWDATA entry with ``is_ddl=True`` and no
BEGIN/END, as Canal does; like a TRANSACTIONEND, its ``position()`` is a transaction
boundary. ``gtid_state`` of every entry is the GTID state including its transaction.

Transaction splitting: entries are buffered per transaction and handed to ``sink``
when the transaction ends, or, for a transaction of more than ``transaction_size``
entries, in pieces of ``transaction_size`` entries as they fill (BEGIN in the first
piece, END in the last), so neither the reader nor the consumer holds an unbounded
transaction. Only TRANSACTIONEND / DDL positions are resume points.

Reconnect: after a lost connection the reader resumes from the end of the last
completed transaction (file/offset, or its GTID state in ``gtid_mode``) with the
RetryPolicy's backoff. If part of the interrupted transaction had already been
handed to the sink, the same number of entries of the replayed transaction (same
GTID) is skipped, so nothing is delivered twice. ``dump_error_count`` counts
consecutive failed dumps and is reset by the first event read after a reconnect.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pymysqlreplication.event import (
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from canal_cluster.retry import RetryPolicy
from canal_protocol.entry import Entry, EntryType, EventType, Header
from canal_protocol.errors import (
    BinlogConfigError,
    BinlogConnectionLost,
    BinlogError,
    PurgedPosition,
)
from canal_protocol.positions import EntryPosition, LogIdentity
from canal_server.parse import binlog_stream
from canal_server.parse.rows import RowsDecoder

__all__ = [
    "BinlogReader",
    "DetectingConfig",
    "ReaderConfig",
    "RunResult",
    "TransactionAssembler",
    "classify_ddl",
    "gtid_state_at",
]

log = logging.getLogger(__name__)

Sink = Callable[[Sequence[Entry]], None]
EVENTS = (
    RotateEvent,
    MariadbGtidEvent,
    XidEvent,
    QueryEvent,
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    HeartbeatLogEvent,
)
_ROW_KINDS = {WriteRowsEvent: "INSERT", UpdateRowsEvent: "UPDATE", DeleteRowsEvent: "DELETE"}
_GTID_STANDALONE = 0x01


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


# -- DDL -------------------------------------------------------------------------------

_NAME = r"(?:`(?P<q{n}>[^`]+)`|(?P<u{n}>[\w$]+))"
_QUALIFIED = rf"{_NAME.format(n=1)}(?:\s*\.\s*{_NAME.format(n=2)})?"
_DDL_PATTERNS = [
    (EventType.CREATE, rf"^create\s+(?:or\s+replace\s+)?(?:temporary\s+)?table\s+"
     rf"(?:if\s+not\s+exists\s+)?{_QUALIFIED}"),
    (EventType.ALTER, rf"^alter\s+(?:online\s+|ignore\s+)*table\s+{_QUALIFIED}"),
    (EventType.ERASE, rf"^drop\s+(?:temporary\s+)?table\s+(?:if\s+exists\s+)?{_QUALIFIED}"),
    (EventType.TRUNCATE, rf"^truncate\s+(?:table\s+)?{_QUALIFIED}"),
    (EventType.RENAME, rf"^rename\s+tables?\s+{_QUALIFIED}"),
    (EventType.CINDEX, rf"^create\s+(?:or\s+replace\s+)?(?:unique\s+|fulltext\s+|spatial\s+)?"
     rf"index\s+(?:if\s+not\s+exists\s+)?\S+\s+on\s+{_QUALIFIED}"),
    (EventType.DINDEX, rf"^drop\s+index\s+(?:if\s+exists\s+)?\S+\s+on\s+{_QUALIFIED}"),
]  # fmt: skip
_DDL_RES = [(kind, re.compile(p, re.IGNORECASE | re.DOTALL)) for kind, p in _DDL_PATTERNS]
_COMMENTS = re.compile(r"/\*.*?\*/|^\s*(?:--|#)[^\n]*\n", re.DOTALL)


def classify_ddl(sql: str, default_schema: str) -> tuple[EventType, str, str]:
    """(event type, schema, table) of a DDL statement; QUERY when not a table DDL."""
    text = _COMMENTS.sub(" ", sql).strip()
    for kind, pattern in _DDL_RES:
        m = pattern.match(text)
        if m:
            first = m.group("q1") or m.group("u1")
            second = m.group("q2") or m.group("u2")
            if second:
                return kind, first, second
            return kind, default_schema, first
    return EventType.QUERY, default_schema, ""


# -- GTID state --------------------------------------------------------------------------


def parse_gtid_state(state: str) -> dict[int, str]:
    """``"0-1-42,1-2-7"`` → {domain: gtid}."""
    out: dict[int, str] = {}
    for part in (p.strip() for p in state.split(",")):
        if part:
            out[int(part.split("-", 1)[0])] = part
    return out


def format_gtid_state(state: Mapping[int, str]) -> str:
    return ",".join(state[d] for d in sorted(state))


def gtid_state_at(dsn: Mapping[str, Any], journal: str, offset: int) -> str:
    """The server's GTID state at a binlog position (``BINLOG_GTID_POS``)."""
    with binlog_stream.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (journal, offset))
        row = cur.fetchone()
    return str(row[0] or "") if row else ""


# -- events → entries --------------------------------------------------------------------


class TransactionAssembler:
    """Turns one dump's events into Entries and hands them to ``sink`` in pieces.

    ``committed`` is the position after the last completed transaction (a resume
    point). ``skip`` = (gtid, n): drop the first n entries of that transaction (they
    were delivered before a reconnect).
    """

    def __init__(
        self,
        sink: Sink,
        start: EntryPosition,
        gtid_state: str,
        transaction_size: int,
        skip: tuple[str, int] = ("", 0),
    ) -> None:
        self._sink = sink
        self._size = transaction_size
        self.journal = start.journal
        self.committed = start
        self._state = parse_gtid_state(gtid_state)
        self._buffer: list[Entry] = []
        self._gtid = ""
        self._in_tx = False
        self.delivered_upto = 0  # entries of the open transaction the sink has (or had)
        self._index = 0  # entries produced in the open transaction
        self._standalone = False
        self._skip = skip
        self._decoder = RowsDecoder()

    @property
    def resume_skip(self) -> tuple[str, int]:
        """What to skip after resuming from ``committed``: the open transaction's
        delivered entries, or the skip not yet reached."""
        if self._in_tx and self.delivered_upto:
            return (self._gtid, self.delivered_upto)
        return self._skip

    def on_event(self, ev: Any) -> None:
        span = binlog_stream.event_span(ev)
        if isinstance(ev, RotateEvent):
            self.journal = str(ev.next_binlog)
        elif span.artificial or isinstance(ev, HeartbeatLogEvent):
            return
        elif isinstance(ev, MariadbGtidEvent):
            self._begin(ev, span)
        elif isinstance(ev, XidEvent):
            self._end(span)
        elif isinstance(ev, QueryEvent):
            self._query(ev, span)
        elif type(ev) in _ROW_KINDS:
            self._rows(ev, span)

    # -- pieces

    def _header(self, span: Any, **kw: Any) -> Header:
        return Header(
            logfile=self.journal,
            offset=span.start,
            end_offset=span.end,
            server_id=span.server_id,
            timestamp_ms=span.timestamp * 1000,
            gtid=self._gtid,
            **kw,
        )

    def _emit(self, entry: Entry) -> None:
        self._index += 1
        gtid, skip_n = self._skip
        if gtid and gtid == self._gtid and self._index <= skip_n:
            self.delivered_upto = self._index
            return  # delivered before the reconnect
        self._buffer.append(entry)
        if len(self._buffer) >= self._size:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            pieces, self._buffer = self._buffer, []
            self._sink(pieces)
            self.delivered_upto = self._index

    def _begin(self, ev: Any, span: Any) -> None:
        if self._in_tx:
            log.warning("transaction %s has no commit; %s begins", self._gtid, ev.gtid)
        self._gtid = str(ev.gtid)
        self._state[int(ev.domain_id)] = self._gtid
        self._in_tx = True
        self._index = 0
        self.delivered_upto = 0
        self._standalone = bool(ev.flags & _GTID_STANDALONE)
        if not self._standalone:
            header = self._header(span, event_type=EventType.GTID)
            self._emit(self._entry(EntryType.TRANSACTIONBEGIN, header))

    def _end(self, span: Any) -> None:
        if not self._in_tx:
            return
        header = self._header(span, event_type=EventType.QUERY)
        end = self._entry(EntryType.TRANSACTIONEND, header)
        self._emit(end)
        self._complete(end)

    def _complete(self, last: Entry) -> None:
        self._flush()
        self.committed = last.position()
        self._in_tx = False
        self.delivered_upto = 0
        self._skip = ("", 0)

    def _query(self, ev: Any, span: Any) -> None:
        sql = ev.query if isinstance(ev.query, str) else bytes(ev.query).decode("utf-8", "replace")
        word = sql.strip().upper()
        if word == "BEGIN" or not self._in_tx:
            return
        if word == "COMMIT":
            self._end(span)
            return
        schema = ev.schema.decode("utf-8") if isinstance(ev.schema, bytes) else str(ev.schema)
        kind, schema, table = classify_ddl(sql, schema)
        header = self._header(span, schema=schema, table=table, event_type=kind)
        entry = self._entry(EntryType.ROWDATA, header, is_ddl=True, sql=sql)
        self._emit(entry)
        if self._standalone:
            self._complete(entry)

    def _rows(self, ev: Any, span: Any) -> None:
        kind = _ROW_KINDS[type(ev)]
        header = self._header(span, schema=ev.schema, table=ev.table, event_type=EventType(kind))
        entry = self._entry(EntryType.ROWDATA, header, images=self._decoder.decode(ev, kind))
        self._emit(entry)

    def _entry(self, kind: EntryType, header: Header, **kw: Any) -> Entry:
        return Entry(kind, header, gtid_state=format_gtid_state(self._state), **kw)


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
        self._last: EntryPosition | None = None
        self._skip: tuple[str, int] = ("", 0)

    # -- public state

    @property
    def identity(self) -> LogIdentity:
        return LogIdentity(address_of(self._source), self.config.slave_id)

    @property
    def source(self) -> Mapping[str, Any]:
        return self._source

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
        return self._last

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
        self._last = start
        detector = self._start_detector()
        try:
            return self._dump_loop(start)
        finally:
            if detector is not None:
                detector.stop()

    def _dump_loop(self, start: EntryPosition) -> str:
        self._skip = ("", 0)
        delays = self._delays()
        while not self._stop.is_set():
            if self._switch.is_set():
                return RunResult.SWITCHED
            try:
                self._dump(self._last or start)
            except (BinlogConfigError, PurgedPosition):
                if self._stop.is_set():
                    break
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
            heartbeat_s=self.config.heartbeat_s, **kw,
        )  # fmt: skip

    def _dump(self, start: EntryPosition) -> None:
        """One dump connection: read until stopped or switched, or raise its error."""
        state = start.gtid if self.config.gtid_mode and start.gtid else ""
        if not state:
            state = gtid_state_at(self._source, start.journal, start.offset)
        size = self.config.transaction_size
        asm = TransactionAssembler(self._sink, start, state, size, self._skip)
        stream = self._open(start)
        with self._lock:
            self._stream = stream
        if self._stop.is_set() or self._switch.is_set():
            self._interrupt()
        try:
            self._read(stream, asm)
        finally:
            self._skip = asm.resume_skip
            with self._lock:
                self._stream = None
            stream.close()

    def _read(self, stream: Any, asm: TransactionAssembler) -> None:
        while not (self._stop.is_set() or self._switch.is_set()):
            ev = binlog_stream.next_event(stream)
            if ev is None:
                raise BinlogConnectionLost("the server ended the binlog dump")
            if self._dump_errors and not binlog_stream.event_span(ev).artificial:
                self._dump_errors = 0  # a real event: this dump works
            asm.on_event(ev)
            self._last = asm.committed

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
