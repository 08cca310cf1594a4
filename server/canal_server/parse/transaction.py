"""Events of one binlog dump → Entries, handed to the sink per transaction.

Entries (Canal style): a transaction is TRANSACTIONBEGIN (MariaDB: its MariadbGtidEvent;
MySQL: its ``BEGIN`` query, after a GTID or anonymous GTID event), one ROWDATA per rows
event (INSERT/UPDATE/DELETE), TRANSACTIONEND (its XidEvent, or a ``COMMIT`` query of a
non-transactional engine). A statement outside BEGIN..COMMIT (MariaDB: a standalone GTID
event, flag 1; MySQL: a GTID event followed by the statement; DDL and other statements)
gives one ROWDATA entry with ``is_ddl=True`` and no BEGIN/END, as Canal does; like a
TRANSACTIONEND, its ``position()`` is a transaction boundary. ``gtid_state`` of an
entry is the GTID state to resume from after it: including its transaction for a
TRANSACTIONEND or a statement of its own, the state *before* its transaction for the
TRANSACTIONBEGIN and the rows inside one (a cursor there lies inside the transaction: a
resume by GTID must read it again, the store skips what the client acked). MariaDB's
``domain-server-seq`` list, or MySQL's GTID set (``uuid:1-42``, ``canal_protocol.gtid``).

Transaction splitting: entries are buffered per transaction and handed to ``sink``
when the transaction ends, or, for a transaction of more than ``transaction_size``
entries, in pieces of ``transaction_size`` entries as they fill (BEGIN in the first
piece, END in the last), so neither the reader nor the consumer holds an unbounded
transaction. Only TRANSACTIONEND / DDL positions are resume points.

Resuming inside a split transaction: a resume reads the open transaction again from its
start, and ``Skip`` names the entries of it the sink already has. The first transaction
the resume reads is the one it names (its GTID, or its file position on the same
database): those entries are dropped again. Any other transaction first (the database
read now does not go on with it: a switch to a standby that never got it, a resume by
time) ends the open one with a TRANSACTIONEND at the boundary before that transaction,
in the coordinates of the database read now, so no BEGIN is put inside it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from canal_protocol.entry import Entry, EntryType, EventType, Header
from canal_protocol.gtid import GtidSet, MariadbGtid, MariadbGtidState, is_mysql_gtid_set
from canal_protocol.positions import EntryPosition
from canal_server.parse import binlog_stream
from canal_server.parse.event_decoder import AnonymousGtidEvent
from canal_server.parse.rows import RowsDecoder

__all__ = [
    "NO_SKIP",
    "Sink",
    "Skip",
    "TransactionAssembler",
    "classify_ddl",
    "gtid_state_at",
]

log = logging.getLogger(__name__)

Sink = Callable[[Sequence[Entry]], None]
_ROW_KINDS = {  # StrEnum members: the decoder takes them as its "INSERT"/"UPDATE"/"DELETE"
    WriteRowsEvent: EventType.INSERT,
    UpdateRowsEvent: EventType.UPDATE,
    PartialUpdateRowsEvent: EventType.UPDATE,
    DeleteRowsEvent: EventType.DELETE,
}
_GTID_STANDALONE = 0x01


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


def gtid_state_at(dsn: Mapping[str, Any], journal: str, offset: int) -> str:
    """The server's GTID state at a binlog position (``BINLOG_GTID_POS``)."""
    with binlog_stream.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (journal, offset))
        row = cur.fetchone()
    return str(row[0] or "") if row else ""


# -- events → entries --------------------------------------------------------------------


class Skip(NamedTuple):
    """The first ``entries`` entries of transaction ``key`` are in the sink already (put
    before the dump was lost, or the reader switched sources). ``key`` is the
    transaction's GTID (``by_gtid``: the same transaction on every database that has
    it), else ``journal:offset`` of its start (on the database it was read from only)."""

    key: str = ""
    entries: int = 0
    by_gtid: bool = False


NO_SKIP = Skip()


class TransactionAssembler:
    """Turns one dump's events into Entries and hands them to ``sink`` in pieces.

    ``committed`` is the position after the last completed transaction (a resume
    point). ``skip``: what the sink has of the transaction open before this resume (see
    the module doc: dropped again, or that transaction ended first).
    """

    def __init__(
        self,
        sink: Sink,
        start: EntryPosition,
        gtid_state: str,
        transaction_size: int,
        skip: Skip = NO_SKIP,
    ) -> None:
        self._sink = sink
        self._size = transaction_size
        self.journal = start.journal
        self._committed: EntryPosition | Entry = start  # an Entry until asked (lazily)
        mysql = is_mysql_gtid_set(gtid_state)
        self._state = MariadbGtidState() if mysql else MariadbGtidState.parse(gtid_state)
        self._gtid_set = GtidSet.parse(gtid_state) if is_mysql_gtid_set(gtid_state) else None
        self._before = gtid_state  # the state before the open (or next) transaction
        self._text: str | None = None  # _state_text() until the state changes
        self._tx_key = ""  # identifies the open transaction across a reconnect (for skip)
        self._buffer: list[Entry] = []
        self._gtid = ""
        self._in_tx = False
        self.delivered_upto = 0  # entries of the open transaction the sink has (or had)
        self._index = 0  # entries produced in the open transaction
        self._standalone = False
        self._skip = skip  # until the first transaction opens
        self._skip_n = 0  # entries of the open transaction to drop (the sink has them)
        self._group_at = -1  # MySQL: where the group of the next BEGIN began (its GTID event)
        self._decoder = RowsDecoder()

    @property
    def committed(self) -> EntryPosition:
        """The position after the last completed transaction (made when first asked: the
        reader asks after a lost connection, not per transaction)."""
        last = self._committed
        if isinstance(last, Entry):
            last = self._committed = last.position()
        return last

    @property
    def in_transaction(self) -> bool:
        """A transaction is open (its END not read yet)."""
        return self._in_tx

    @property
    def resume_skip(self) -> Skip:
        """What to skip after resuming from ``committed``: the open transaction's
        delivered entries (those the sink had before this resume included), or the skip
        not yet reached."""
        if self._in_tx and self.delivered_upto:
            return Skip(self._tx_key, self.delivered_upto, bool(self._gtid))
        return self._skip

    def on_event(self, ev: Any, span: binlog_stream.EventSpan | None = None) -> None:
        """Take the next event (``span``: its ``event_span`` when the caller has it)."""
        if span is None:
            span = binlog_stream.event_span(ev)
        if isinstance(ev, RotateEvent):
            self.journal = str(ev.next_binlog)
        elif span.artificial or isinstance(ev, HeartbeatLogEvent):
            return
        elif isinstance(ev, MariadbGtidEvent):
            self._begin(ev, span)
        elif isinstance(ev, GtidEvent | AnonymousGtidEvent):
            self._mysql_gtid(ev, span)
        elif isinstance(ev, XidEvent):
            self._end(span, int(ev.xid))
        elif isinstance(ev, QueryEvent):
            self._query(ev, span)
        elif type(ev) in _ROW_KINDS:
            self._rows(ev, span)

    # -- pieces

    def _header(
        self, span: Any, event_type: EventType, schema: str = "", table: str = ""
    ) -> Header:
        # positional: a third cheaper than keywords, three times per small transaction
        return Header(
            self.journal, span.start, span.end, span.server_id, span.timestamp * 1000,
            self._gtid, schema, table, event_type, 0, span.part,
        )  # fmt: skip

    def _emit(self, entry: Entry) -> None:
        self._index += 1
        if self._index <= self._skip_n:
            return  # put before this resume
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
        self._before = self._state_text()
        self._state = self._state.with_gtid(MariadbGtid.parse(self._gtid))
        self._text = None
        self._open(span, standalone=bool(ev.flags & _GTID_STANDALONE))

    def _open(self, span: Any, standalone: bool, thread_id: int = 0) -> None:
        self._in_tx = True
        self._tx_key = self._gtid or f"{self.journal}:{span.start}"
        self._index = 0
        self._skip_n = self.delivered_upto = 0
        self._standalone = standalone
        if self._skip.entries:
            self._resume(span)
        if not standalone:
            header = self._header(span, EventType.GTID)
            self._emit(self._entry(EntryType.TRANSACTIONBEGIN, header, thread_id=thread_id))

    def _resume(self, span: Any) -> None:
        """The first transaction after a resume inside one: the same one (drop what the
        sink has of it again), or another: end the sink's open transaction first, at the
        boundary before this one (a resume point on the database read now)."""
        skip, self._skip = self._skip, NO_SKIP
        if skip.key == self._tx_key:
            self._skip_n = self.delivered_upto = skip.entries
            return
        at = self._group_at if self._group_at >= 0 else span.start
        log.warning(
            "transaction %s ends after its first %d entries: the resume reads %s at %s:%d "
            "first, not the rest of it",
            skip.key, skip.entries, self._tx_key, self.journal, at,
        )  # fmt: skip
        header = Header(
            self.journal, at, at, span.server_id, span.timestamp * 1000,
            skip.key if skip.by_gtid else "", "", "", EventType.QUERY,
        )  # fmt: skip
        self._sink([Entry(EntryType.TRANSACTIONEND, header, gtid_state=self._before)])

    def _mysql_gtid(self, ev: Any, span: Any) -> None:
        """MySQL: a GTID (or anonymous GTID) event announces the next transaction; it
        opens at its BEGIN query, or is one statement (DDL) without BEGIN."""
        if self._in_tx:
            log.warning("transaction %s has no commit; a GTID event follows", self._tx_key)
            self._in_tx = False
        self._gtid = ""
        self._before = self._state_text()
        self._group_at = span.start
        if isinstance(ev, GtidEvent):
            self._gtid = str(ev.gtid)
            uuid, _, number = self._gtid.rpartition(":")
            self._gtid_set = (self._gtid_set or GtidSet()).add(uuid, int(number))
            self._text = None

    def _end(self, span: Any, xid: int = 0) -> None:
        if not self._in_tx:
            return
        header = self._header(span, EventType.QUERY)
        end = self._entry(EntryType.TRANSACTIONEND, header, xid=xid)
        self._skip_n = 0  # never skipped (the same GTID in fewer events on another database)
        self._emit(end)
        self._complete(end)

    def _complete(self, last: Entry) -> None:
        self._flush()
        self._committed = last
        self._in_tx = False
        self._before = self._state_text()
        self.delivered_upto = 0

    def _query(self, ev: Any, span: Any) -> None:
        sql = ev.query if isinstance(ev.query, str) else bytes(ev.query).decode("utf-8", "replace")
        word = sql.strip().upper()
        if word == "BEGIN":
            if not self._in_tx:  # MySQL (MariaDB's transactions open at their GTID event)
                self._open(span, standalone=False, thread_id=int(ev.slave_proxy_id or 0))
            return
        if not self._in_tx:  # a statement of its own (MySQL DDL)
            if word == "COMMIT":
                return
            self._open(span, standalone=True)
        if word == "COMMIT":
            self._end(span)
            return
        schema = ev.schema.decode("utf-8") if isinstance(ev.schema, bytes) else str(ev.schema)
        kind, schema, table = classify_ddl(sql, schema)
        header = self._header(span, kind, schema, table)
        entry = self._entry(EntryType.ROWDATA, header, is_ddl=True, sql=sql)
        self._emit(entry)
        if self._standalone:
            self._complete(entry)

    def _rows(self, ev: Any, span: Any) -> None:
        kind = _ROW_KINDS[type(ev)]
        header = self._header(span, kind, ev.schema, ev.table)
        entry = self._entry(EntryType.ROWDATA, header, images=self._decoder.decode(ev, kind))
        self._emit(entry)

    def _state_text(self) -> str:
        """The GTID state as text (made once per change: three times per transaction)."""
        if self._text is None:
            state = self._gtid_set
            self._text = str(state) if state is not None else str(self._state)
        return self._text

    def _entry(self, kind: EntryType, header: Header, **kw: Any) -> Entry:
        inside = self._in_tx and not self._standalone and kind is not EntryType.TRANSACTIONEND
        state = self._before if inside else self._state_text()
        return Entry(kind, header, gtid_state=state, **kw)
