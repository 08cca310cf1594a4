"""Looking into a server's binlogs: files, end, server id, GTID state, search by time.

Two small interfaces keep the search logic testable without a server:

* ``BinlogInspector``: the SQL side (``SHOW BINARY LOGS``, ``SHOW MASTER STATUS``,
  ``@@server_id``, ``UNIX_TIMESTAMP()``, ``BINLOG_GTID_POS``); ``SqlBinlogInspector``
  is the real one.
* ``EventSource``: "the events of file F from offset O" as ``BinlogEvent`` records
  (start, end, timestamp, kind, server id); ``StreamEventSource`` reads them through
  ``binlog_stream.open_stream``.

``BinlogSearch`` builds on both: the first event time of a file, the time at an
offset, the latest transaction boundary at or before a time inside one file or across
all files (bisect the files by first event time, then scan one), and the BEGIN of the
transaction that contains an offset. A *boundary* is an offset between two transactions (a group, on
MariaDB, starts at its GTID event and ends after its XID, COMMIT or, for DDL, its one
statement; on MySQL it starts at its GTID or anonymous GTID event, then either
BEGIN..XID/COMMIT or one statement); the start of a file (offset 4) is a boundary too.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Generator, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Protocol

from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)

from canal_protocol.errors import PositionNotFound, PurgedPosition
from canal_protocol.gtid import GtidSet, is_mysql_gtid_set
from canal_protocol.positions import journal_seq
from canal_server.parse import binlog_stream
from canal_server.parse.event_decoder import AnonymousGtidEvent, PreviousGtidsEvent

__all__ = [
    "BINLOG_START_OFFSET",
    "OPERATOR_HINT",
    "BinlogEvent",
    "BinlogFile",
    "BinlogInspector",
    "BinlogSearch",
    "Boundary",
    "EventKind",
    "EventSource",
    "SqlBinlogInspector",
    "StreamEventSource",
    "boundaries",
    "classify",
    "locate_gtid_state",
    "locate_mysql_gtid_set",
    "mysql_gtid_at",
    "open_group_start",
]

log = logging.getLogger(__name__)

OPERATOR_HINT = (
    "set master.timestamp (or master.journal_name + master.position) to a position the "
    "server still has, or reset the client cursor"
)
BINLOG_START_OFFSET = 4  # after the 4-byte magic number: the first event of every file
FL_STANDALONE = 1  # MariaDB GTID event flag: a group of one statement (DDL), no XID


class EventKind(enum.StrEnum):
    """What an event means for transaction boundaries."""

    BEGIN = "begin"  # a transaction's first event (MariaDB GTID event, MySQL BEGIN)
    STANDALONE = "standalone"  # a GTID event whose group is one statement (DDL)
    GTID = "gtid"  # MySQL GTID / anonymous GTID event: a group starts, BEGIN or a statement follows
    COMMIT = "commit"  # a transaction's last event (XID, COMMIT query)
    QUERY = "query"  # any other statement (DDL; ends a standalone group)
    OTHER = "other"  # rows, table maps, format description, GTID lists, ...


@dataclass(frozen=True)
class BinlogEvent:
    """One event of a file: ``start`` (Pos), ``end`` (End_log_pos), ``timestamp`` (s)."""

    start: int
    end: int
    timestamp: int
    kind: EventKind
    server_id: int


@dataclass(frozen=True)
class BinlogFile:
    name: str
    size: int


@dataclass(frozen=True)
class Boundary:
    """An offset between transactions; ``timestamp`` (s) of the event that marks it."""

    offset: int
    timestamp: int
    server_id: int

    @property
    def timestamp_ms(self) -> int:
        return self.timestamp * 1000


class EventSource(Protocol):
    def read(self, journal: str, offset: int) -> Generator[BinlogEvent, None, None]:
        """Events of ``journal`` from ``offset`` to its current end (not into the next file)."""
        ...


class BinlogInspector(Protocol):
    def binary_logs(self) -> list[BinlogFile]:
        """SHOW BINARY LOGS, oldest first."""
        ...

    def master_status(self) -> tuple[str, int]:
        """SHOW MASTER STATUS: the current file and its end offset."""
        ...

    def server_id(self) -> int: ...

    def clock(self) -> int:
        """The server's clock, s since the epoch (the clock its binlog events carry)."""
        ...

    def gtid_at(self, journal: str, offset: int) -> str:
        """The GTID state at a position (BINLOG_GTID_POS), "" when it has none."""
        ...


# -- the real inspector and event source ------------------------------------------------


class SqlBinlogInspector:
    """``BinlogInspector`` over one pymysql connection per call (the canal user).

    On MySQL (its ``VERSION()``, asked once) the GTID state at a position is read from
    the binlog (``mysql_gtid_at``, a dump as replica ``slave_id``): MySQL has no
    ``BINLOG_GTID_POS``."""

    def __init__(self, conn: Mapping[str, Any], slave_id: int = 0) -> None:
        self._conn = conn
        self._slave_id = slave_id
        self._version: str | None = None

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with binlog_stream.connect(self._conn) as c, c.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def binary_logs(self) -> list[BinlogFile]:
        files = [BinlogFile(str(r[0]), int(r[1])) for r in self._rows("SHOW BINARY LOGS")]
        return sorted(files, key=lambda f: journal_seq(f.name))

    def master_status(self) -> tuple[str, int]:
        with binlog_stream.connect(self._conn) as c, c.cursor() as cur:
            row = binlog_stream.binary_log_status(cur)
        if not row:
            raise PositionNotFound("SHOW BINARY LOG STATUS is empty: is log_bin on?")
        return str(row[0]), int(row[1])

    def mysql(self) -> bool:
        if self._version is None:
            self._version = binlog_stream.server_version(self._conn)
        return binlog_stream.is_mysql(self._version)

    def server_id(self) -> int:
        return int(self._rows("SELECT @@server_id")[0][0])

    def clock(self) -> int:
        return int(self._rows("SELECT UNIX_TIMESTAMP()")[0][0])

    def gtid_at(self, journal: str, offset: int) -> str:
        if self.mysql():
            return mysql_gtid_at(self._conn, self._slave_id, journal, offset)
        value = self._rows("SELECT BINLOG_GTID_POS(%s, %s)", (journal, offset))[0][0]
        return "" if value is None else str(value)


def mysql_gtid_at(conn: Mapping[str, Any], slave_id: int, journal: str, offset: int) -> str:
    """A MySQL server's GTID state at a binlog position: the file's PREVIOUS_GTIDS plus
    the GTIDs of the transactions that start before ``offset`` ("" without GTIDs)."""
    state: GtidSet | None = None
    only = (RotateEvent, PreviousGtidsEvent, GtidEvent)
    with binlog_stream.peek_stream(
        conn, slave_id, journal=journal, offset=BINLOG_START_OFFSET, only_events=only
    ) as stream:
        while (ev := _next(stream, journal, BINLOG_START_OFFSET)) is not None:
            span = binlog_stream.event_span(ev)
            if isinstance(ev, RotateEvent) and ev.next_binlog != journal:
                break
            if span.artificial or isinstance(ev, RotateEvent):
                continue
            if span.start >= offset and not isinstance(ev, PreviousGtidsEvent):
                break  # the file's PREVIOUS_GTIDS is the state before all of it
            if isinstance(ev, PreviousGtidsEvent):
                state = (state or GtidSet()) | ev.gtids
            elif isinstance(ev, GtidEvent):
                uuid, _, number = str(ev.gtid).rpartition(":")
                state = (state or GtidSet()).add(uuid, int(number))
    return "" if state is None else str(state)


def classify(ev: Any) -> EventKind:
    """The boundary meaning of a mysql-replication event."""
    if isinstance(ev, MariadbGtidEvent):
        return EventKind.STANDALONE if ev.flags & FL_STANDALONE else EventKind.BEGIN
    if isinstance(ev, GtidEvent | AnonymousGtidEvent):
        return EventKind.GTID
    if isinstance(ev, XidEvent):
        return EventKind.COMMIT
    if isinstance(ev, QueryEvent):
        query = ev.query.strip().upper() if isinstance(ev.query, str) else ""
        if query == "BEGIN":
            return EventKind.BEGIN
        if query in ("COMMIT", "XA COMMIT") or query.startswith("XA COMMIT"):
            return EventKind.COMMIT
        return EventKind.QUERY
    return EventKind.OTHER


_SEARCH_EVENTS = (
    FormatDescriptionEvent, GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent,
    AnonymousGtidEvent,
)  # fmt: skip


class StreamEventSource:
    """``EventSource`` over non-blocking binlog dumps (``binlog_stream.peek_stream``)."""

    def __init__(self, conn: Mapping[str, Any], slave_id: int) -> None:
        self._conn = conn
        self._slave_id = slave_id

    def read(self, journal: str, offset: int) -> Generator[BinlogEvent, None, None]:
        with binlog_stream.peek_stream(
            self._conn, self._slave_id, journal=journal, offset=offset, only_events=_SEARCH_EVENTS
        ) as stream:
            while (ev := _next(stream, journal, offset)) is not None:
                if isinstance(ev, RotateEvent) and ev.next_binlog != journal:
                    return  # end of this file (or the server switched files)
                span = binlog_stream.event_span(ev)
                if span.artificial:
                    continue
                yield BinlogEvent(
                    span.start, span.end, span.timestamp, classify(ev), span.server_id
                )


def locate_gtid_state(conn: Mapping[str, Any], slave_id: int, state: str) -> tuple[str, int]:
    """The file and offset in the binlog of the server at ``conn`` (its own coordinates,
    whatever server wrote ``state``) from which a read misses nothing that a GTID dump
    from the MariaDB GTID state ``state`` (or the MySQL GTID set,
    ``locate_mysql_gtid_set``) sends.

    A GTID dump skips every group ``state`` holds, per domain. Its first group is where
    reading must start: a fake Gtid_list event comes when the *first* domain reaches its
    GTID, so with several domains a group of another one (a domain MariaDB dropped at the
    file's start because its Gtid_list holds the state's GTID) can come before it. With no
    group sent, the last position the dump reached (nothing after it but groups
    ``state`` holds). PurgedPosition when the binlog does not hold ``state`` (purged, or
    ahead).
    """
    if is_mysql_gtid_set(state):
        return locate_mysql_gtid_set(conn, slave_id, state)
    journal, reached = "", None
    with binlog_stream.peek_stream(conn, slave_id, gtid=state) as stream:
        while (ev := binlog_stream.next_event(stream)) is not None:
            span = binlog_stream.event_span(ev)
            if isinstance(ev, RotateEvent):  # the fake one: the start file; a real one: the next
                journal, reached = ev.next_binlog, (ev.next_binlog, int(ev.position))
            elif isinstance(ev, MariadbGtidEvent):
                return journal, span.start  # the first group the dump sends
            elif span.end > 0:  # also the fake Gtid_list: its end is where the server is
                reached = (journal, span.end)
    if reached is None:
        raise PositionNotFound(f"the GTID dump from {state} sent no start point")
    return reached


def locate_mysql_gtid_set(conn: Mapping[str, Any], slave_id: int, state: str) -> tuple[str, int]:
    """Where a read of a MySQL server's binlog by file and offset misses nothing that a
    GTID dump from the set ``state`` sends, in the server's own file and offset: the
    start of the first transaction ``state`` lacks (a gap: the old server committed in
    another order), else the end of the transaction that completes ``state`` (or of a
    file's PREVIOUS_GTIDS that holds it all).

    As MySQL's dump thread picks its file: the newest binlog whose PREVIOUS_GTIDS is a
    subset of ``state``, read from there on (its PREVIOUS_GTIDS, then its GTID events).
    PurgedPosition when even the oldest file's PREVIOUS_GTIDS holds transactions
    ``state`` lacks (what follows ``state`` was purged); PositionNotFound when the
    binlog never holds all of ``state`` (it is ahead of this server).
    """
    want = GtidSet.parse(state)
    files = SqlBinlogInspector(conn, slave_id).binary_logs()
    start = None
    for i in reversed(range(len(files))):
        before = mysql_gtid_at(conn, slave_id, files[i].name, BINLOG_START_OFFSET)
        if GtidSet.parse(before) <= want:
            start = i
            break
    if start is None:
        oldest = files[0].name if files else "(none)"
        raise PurgedPosition(
            f"the oldest binlog {oldest} starts after transactions the GTID set {state} "
            "lacks (they were purged)"
        )
    scan = _SetScan(want)
    for f in files[start:]:
        found = scan.file(conn, slave_id, f.name)
        if found is not None:
            return found
    raise PositionNotFound(f"the binlog does not hold every transaction of {state}")


_GTID_SCAN_EVENTS = (
    RotateEvent, PreviousGtidsEvent, GtidEvent, AnonymousGtidEvent, QueryEvent, XidEvent,
)  # fmt: skip


@dataclass
class _SetScan:
    """``locate_mysql_gtid_set``'s read of the binlog files, in order: ``first`` is the
    first group ``want`` lacks (another GTID, or an anonymous one) seen so far."""

    want: GtidSet
    first: tuple[str, int] | None = None

    def file(self, conn: Mapping[str, Any], slave_id: int, journal: str) -> tuple[str, int] | None:
        """Once the PREVIOUS_GTIDS and GTIDs of ``journal`` so far hold ``want``: ``first``,
        else the end of the group (or PREVIOUS_GTIDS) that completed it; None if never."""
        have, group = GtidSet(), None
        with binlog_stream.peek_stream(
            conn,
            slave_id,
            journal=journal,
            offset=BINLOG_START_OFFSET,
            only_events=_GTID_SCAN_EVENTS,
        ) as stream:
            while (ev := _next(stream, journal, BINLOG_START_OFFSET)) is not None:
                if isinstance(ev, RotateEvent) and ev.next_binlog != journal:
                    break
                span = binlog_stream.event_span(ev)
                if span.artificial or isinstance(ev, RotateEvent):
                    continue
                kind = classify(ev)
                if isinstance(ev, PreviousGtidsEvent):
                    have = have | ev.gtids
                elif kind is EventKind.GTID:
                    have = self._opens(ev, have, journal, span.start)
                if kind in _GROUP_STARTS:
                    group = kind
                    continue
                event = BinlogEvent(span.start, span.end, span.timestamp, kind, span.server_id)
                ends = _ends_group(event, group)
                if ends:
                    group = None
                if (ends or isinstance(ev, PreviousGtidsEvent)) and self.want <= have:
                    return self.first or (journal, span.end)
        return None

    def _opens(self, ev: Any, have: GtidSet, journal: str, start: int) -> GtidSet:
        """A group starts at ``start`` (a GTID or anonymous GTID event): ``have`` with it."""
        gtid = str(ev.gtid) if isinstance(ev, GtidEvent) else None
        if self.first is None and (gtid is None or gtid not in self.want):
            self.first = (journal, start)
        if gtid is None:
            return have
        uuid, _, number = gtid.rpartition(":")
        return have.add(uuid, int(number))


def _next(stream: Any, journal: str, offset: int) -> Any:
    """``binlog_stream.next_event`` with the position named in a 1236 error."""
    try:
        return binlog_stream.next_event(stream)
    except PurgedPosition as exc:
        raise PurgedPosition(
            f"cannot read binlog {journal} from offset {offset} (purged, or not an event "
            f"start): {exc}; {OPERATOR_HINT}"
        ) from exc


# -- boundaries ---------------------------------------------------------------------------


_GROUP_STARTS = (EventKind.BEGIN, EventKind.STANDALONE, EventKind.GTID)


def _after_gtid(ev: BinlogEvent, group: EventKind | None) -> bool:
    """MySQL's BEGIN belongs to the GTID event before it (the group started there)."""
    return ev.kind is EventKind.BEGIN and group is EventKind.GTID


def _ends_group(ev: BinlogEvent, group: EventKind | None) -> bool:
    """A COMMIT ends any group; another statement ends all but a BEGIN..COMMIT group."""
    return ev.kind is EventKind.COMMIT or (
        ev.kind is EventKind.QUERY and group is not EventKind.BEGIN
    )


def boundaries(events: Iterator[BinlogEvent]) -> Iterator[Boundary]:
    """The transaction boundaries among ``events``, in order.

    The start of the file (when the events begin there), a boundary at each group's
    first event (its start offset) and one after its last event (its end offset); a
    statement outside any group is a group of its own.
    """
    group: EventKind | None = None  # BEGIN, STANDALONE or GTID while inside a group
    for ev in events:
        if ev.start == BINLOG_START_OFFSET:
            yield Boundary(BINLOG_START_OFFSET, ev.timestamp, ev.server_id)
        if ev.kind in (EventKind.BEGIN, EventKind.STANDALONE, EventKind.GTID):
            if not _after_gtid(ev, group):
                yield Boundary(ev.start, ev.timestamp, ev.server_id)
            group = ev.kind
        elif _ends_group(ev, group):
            yield Boundary(ev.end, ev.timestamp, ev.server_id)
            group = None


def open_group_start(events: Iterator[BinlogEvent], offset: int) -> int | None:
    """Start of the group that ``offset`` falls inside (after its first event and
    before the end of its last), else None. ``events`` start before ``offset``."""
    group_start: int | None = None
    group: EventKind | None = None
    for ev in events:
        if ev.start >= offset:
            break
        if ev.kind in (EventKind.BEGIN, EventKind.STANDALONE, EventKind.GTID):
            if not _after_gtid(ev, group) or group_start is None:
                group_start = ev.start
            group = ev.kind
        elif _ends_group(ev, group) and ev.end <= offset:
            group_start, group = None, None
    return group_start


# -- the search -----------------------------------------------------------------------------


class BinlogSearch:
    """Time and transaction searches over one server's binlogs."""

    def __init__(self, inspector: BinlogInspector, source: EventSource) -> None:
        self.inspector = inspector
        self.source = source
        self.first_time_reads = 0  # how many files' first event time were read
        self.scanned: list[str] = []  # files scanned for boundaries, in order

    def first_event_time(self, journal: str) -> int:
        """Timestamp (s) of the first real event of ``journal`` (its creation)."""
        self.first_time_reads += 1
        with closing(self.source.read(journal, BINLOG_START_OFFSET)) as events:
            for ev in events:
                if ev.timestamp > 0:
                    return ev.timestamp
        raise PositionNotFound(f"binlog {journal} has no event with a timestamp")

    def search_file(self, journal: str, target_ms: int) -> Boundary | None:
        """The latest boundary of ``journal`` with time ≤ ``target_ms``, stopping at the
        first boundary after it (times in a binlog are not strictly ordered)."""
        self.scanned.append(journal)
        found: Boundary | None = None
        with closing(self.source.read(journal, BINLOG_START_OFFSET)) as events:
            for b in boundaries(events):
                if b.timestamp_ms > target_ms:
                    break
                found = b
        return found

    def search_all(self, target_ms: int) -> tuple[str, Boundary]:
        """The latest boundary with time ≤ ``target_ms`` over every binlog.

        Bisects the files by first event time, scans the newest file that starts at
        or before the target, and steps back a file while a scan finds nothing.
        """
        files = [f.name for f in self.inspector.binary_logs()]
        if not files:
            raise PositionNotFound("the server has no binary logs")
        index = self._last_file_starting_by(files, target_ms)
        while index >= 0:
            found = self.search_file(files[index], target_ms)
            if found is not None:
                return files[index], found
            index -= 1
        return self._before_oldest(files[0], target_ms)

    def _last_file_starting_by(self, files: list[str], target_ms: int) -> int:
        """Largest index whose first event time ≤ target (-1 if none): a bisection."""
        lo, hi = 0, len(files) - 1
        best = -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.first_event_time(files[mid]) * 1000 <= target_ms:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    def _before_oldest(self, oldest: str, target_ms: int) -> tuple[str, Boundary]:
        """The target precedes every binlog: safe only if nothing came before the oldest.

        A GTID state at its start says older binlogs held transactions. An empty one
        does not say the opposite (MySQL with gtid_mode OFF writes an empty
        PREVIOUS_GTIDS in every file): only the server's first binlog (number 1) does.
        """
        state = self.inspector.gtid_at(oldest, BINLOG_START_OFFSET)
        if state:
            why = f"with GTID state {state} (older binlogs were purged)"
        elif journal_seq(oldest)[1] != 1:
            why = (
                "and is not the server's first binlog (number 1): without a GTID state "
                "nothing says that no older binlog was purged"
            )
        else:
            first = self.first_event_time(oldest)
            return oldest, Boundary(BINLOG_START_OFFSET, first, 0)
        raise PurgedPosition(
            f"no binlog reaches back to timestamp {target_ms} ms: the oldest, {oldest}, "
            f"starts after it {why}; {OPERATOR_HINT}"
        )

    def time_at(self, journal: str, offset: int) -> int:
        """Time (s) of the last event of ``journal`` that ends at or before ``offset``; the
        file's first event time when none does (``offset`` is its start)."""
        found = 0
        with closing(self.source.read(journal, BINLOG_START_OFFSET)) as events:
            for ev in events:
                if ev.end > offset:
                    break
                found = ev.timestamp or found
        return found or self.first_event_time(journal)

    def transaction_begin(self, journal: str, offset: int, inside: bool = False) -> int:
        """Start of the transaction that ``offset`` falls inside, else ``offset``.

        Cheap when ``offset`` is a boundary: the events from there are read up to the
        first that opens or closes a group; only when a group closes first (``offset``
        lies inside it) is the file scanned from its start for the group's first event.
        ``inside``: ``offset`` is known to lie inside a group (a position with a part:
        the start of a compressed transaction's payload, after its GTID event).
        """
        if offset <= BINLOG_START_OFFSET:
            return offset
        if not inside and self._opens_group(journal, offset):
            return offset
        with closing(self.source.read(journal, BINLOG_START_OFFSET)) as events:
            start = open_group_start(events, offset)
        return offset if start is None else start

    def _opens_group(self, journal: str, offset: int) -> bool:
        """The first event at ``offset`` that marks a boundary starts a group (a GTID
        event, BEGIN), or there is none: ``offset`` is a boundary. False when a COMMIT or
        another statement comes first (``offset`` may lie inside a group)."""
        with closing(self.source.read(journal, offset)) as events:
            for ev in events:
                if ev.kind is not EventKind.OTHER:
                    return ev.kind in _GROUP_STARTS
        return True
