"""A destination that reads binlog files from a directory (Canal's LocalBinlogEventParser).

``local.dir`` names a directory of binlog files (a backup, a copied relay log, files
written by MySQL or MariaDB): every file there that starts with the binlog magic
``\\xfebin`` is a journal, ordered by name (``mysql-bin.000002`` after ``.000001``).
``LocalBinlogReader`` plays ``BinlogReader``'s part for such a destination: it reads
the files from a start position, through ``EventDecoder`` (the library's event classes,
made from the file's bytes; MySQL 8 compressed transactions included) and the same
``TransactionAssembler`` and ``RowsDecoder`` as the network reader, so the entries and
positions are the same: ``journal`` is the file name, offsets are the file offsets
(for a binlog, what the server's ``End_log_pos`` says). At the end of the newest file
it waits for more (``poll_s``): a file that grows, or a new file, is read on.

For the position finder the directory is a ``DatabaseLink`` (``LocalBinlogInspector``
+ ``LocalEventSource``): ``SHOW BINARY LOGS`` is the file list, the end is the newest
file's size, the GTID state at a position is the file's PREVIOUS_GTIDS (MySQL) or GTID
list (MariaDB) plus the GTIDs read up to it, and the search by time reads the files.

Tables whose table maps carry no column names (MySQL 5.7, ``binlog_row_metadata`` not
FULL) get them from ``schema.SchemaTracker``: ``local.schema_file`` (CREATE TABLE
statements) and the DDL of the files, replayed from the oldest file; a table it does
not know is refused (``BinlogConfigError``), never delivered with guessed names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    QueryEvent,
    RotateEvent,
)

from canal_protocol.errors import BinlogConfigError, BinlogError, PositionNotFound, PurgedPosition
from canal_protocol.gtid import GtidSet, MariadbGtid, MariadbGtidState
from canal_protocol.positions import EntryPosition, LogIdentity, journal_seq
from canal_server.parse import binlog_stream
from canal_server.parse.binlog_search import (
    BINLOG_START_OFFSET,
    OPERATOR_HINT,
    BinlogEvent,
    BinlogFile,
    classify,
)
from canal_server.parse.event_decoder import (
    HEADER_LEN,
    EventDecoder,
    PreviousGtidsEvent,
    read_header,
)
from canal_server.parse.finder import DatabaseLink
from canal_server.parse.reader import RunResult
from canal_server.parse.schema import SchemaTracker
from canal_server.parse.transaction import Sink, TransactionAssembler

__all__ = [
    "LOCAL_PREFIX",
    "LocalBinlogDir",
    "LocalBinlogInspector",
    "LocalBinlogReader",
    "LocalEventSource",
    "LocalReaderConfig",
]

log = logging.getLogger(__name__)

MAGIC = b"\xfebin"
LOCAL_PREFIX = "local:"  # a local destination's source address: local:<directory>


# -- the directory -------------------------------------------------------------------------


class LocalBinlogDir:
    """The binlog files of one directory, read with one decoder per pass."""

    def __init__(self, path: str | Path, schema: SchemaTracker | None = None) -> None:
        self.path = Path(path)
        self.schema = schema or SchemaTracker()

    @property
    def address(self) -> str:
        return f"{LOCAL_PREFIX}{self.path}"

    def files(self) -> list[BinlogFile]:
        """The binlog files, oldest first (BinlogConfigError if the directory is gone)."""
        if not self.path.is_dir():
            raise BinlogConfigError(f"local.dir {self.path} is not a directory")
        found = []
        for p in self.path.iterdir():
            if p.is_file() and _has_magic(p):
                found.append(BinlogFile(p.name, p.stat().st_size))
        return sorted(found, key=lambda f: journal_seq(f.name))

    def decoder(self) -> EventDecoder:
        return EventDecoder(on_table=self.schema.fill)

    def events(
        self, journal: str, offset: int, decoder: EventDecoder
    ) -> Generator[tuple[int, Any], None, None]:
        """(start offset, event) of ``journal`` from ``offset`` to its current end. The
        format description is read first when starting later in the file."""
        path = self.path / journal
        try:
            f = path.open("rb")
        except OSError as exc:
            raise PurgedPosition(f"binlog {journal} is not in {self.path}: {exc.strerror}") from exc
        with f:
            if f.read(4) != MAGIC:
                raise BinlogError(f"{path} is not a binlog file (no \\xfebin magic)")
            if offset > BINLOG_START_OFFSET and not decoder.described:
                first = _read_event(f, BINLOG_START_OFFSET, path)
                if first is not None:
                    decoder.decode(first, f"{journal}:4", BINLOG_START_OFFSET + len(first))
            at = max(offset, BINLOG_START_OFFSET)
            while (raw := _read_event(f, at, path)) is not None:
                for ev in decoder.decode(raw, f"{journal}:{at}", at + len(raw)):
                    yield at, ev
                at += len(raw)

    def replay_ddl(self, upto: EntryPosition) -> None:
        """Follow the DDL of every file before ``upto`` (the schema at the start)."""
        for file in self.files():
            if journal_seq(file.name) > journal_seq(upto.journal):
                return
            decoder = EventDecoder()  # names are not needed here: rows are not read
            for at, ev in self.events(file.name, BINLOG_START_OFFSET, decoder):
                if file.name == upto.journal and at >= upto.offset:
                    return
                if isinstance(ev, QueryEvent):
                    self.schema.apply(_text(ev.schema), _text(ev.query))


def _has_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def _read_event(f: BinaryIO, at: int, path: Path) -> bytes | None:
    """The whole event at ``at``; None at the end (or a part still being written)."""
    f.seek(at)
    head = f.read(HEADER_LEN)
    if len(head) < HEADER_LEN:
        return None
    size = read_header(head).size
    if size < HEADER_LEN:
        raise BinlogError(f"{path}:{at}: bad event size {size} (not an event start?)")
    body = f.read(size - HEADER_LEN)
    return head + body if len(body) == size - HEADER_LEN else None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# -- the finder's view -----------------------------------------------------------------------


class LocalEventSource:
    """``EventSource`` over the files (for the search by time)."""

    def __init__(self, directory: LocalBinlogDir) -> None:
        self._dir = directory

    def read(self, journal: str, offset: int) -> Generator[BinlogEvent, None, None]:
        decoder = EventDecoder()
        for at, ev in self._dir.events(journal, offset, decoder):
            span = binlog_stream.event_span(ev)
            if span.start != at and not isinstance(ev, FormatDescriptionEvent):
                continue  # inside a transaction payload: the payload is one event here
            yield BinlogEvent(at, span.end, span.timestamp, classify(ev), span.server_id)


class LocalBinlogInspector:
    """``BinlogInspector`` over the files."""

    def __init__(self, directory: LocalBinlogDir) -> None:
        self._dir = directory

    def binary_logs(self) -> list[BinlogFile]:
        return self._dir.files()

    def master_status(self) -> tuple[str, int]:
        files = self._dir.files()
        if not files:
            raise PositionNotFound(f"local.dir {self._dir.path} holds no binlog file")
        return files[-1].name, files[-1].size

    def server_id(self) -> int:
        files = self._dir.files()
        if not files:
            return 0
        for _, ev in self._dir.events(files[-1].name, BINLOG_START_OFFSET, EventDecoder()):
            return int(ev.packet.server_id)
        return 0

    def clock(self) -> int:
        """The time of the newest event: the newest file's last write (s since the epoch)."""
        files = self._dir.files()
        if not files:
            return int(time.time())
        return int((Path(self._dir.path) / files[-1].name).stat().st_mtime)

    def gtid_at(self, journal: str, offset: int) -> str:
        """The file's PREVIOUS_GTIDS / GTID list plus the GTIDs before ``offset``."""
        mysql: GtidSet | None = None
        mariadb = MariadbGtidState()
        for at, ev in self._dir.events(journal, BINLOG_START_OFFSET, EventDecoder()):
            if at >= offset and not isinstance(ev, _HEADER_EVENTS):
                break  # the file's header events give the state before all of it
            if isinstance(ev, PreviousGtidsEvent):
                mysql = (mysql or GtidSet()) | ev.gtids
            elif isinstance(ev, GtidEvent):
                uuid, _, n = str(ev.gtid).rpartition(":")
                mysql = (mysql or GtidSet()).add(uuid, int(n))
            elif isinstance(ev, MariadbGtidListEvent):
                mariadb = mariadb.with_state(_gtid_list(ev))
            elif isinstance(ev, MariadbGtidEvent):
                mariadb = mariadb.with_gtid(MariadbGtid.parse(str(ev.gtid)))
        if mysql is not None:
            return str(mysql)
        return str(mariadb)


_HEADER_EVENTS = (FormatDescriptionEvent, PreviousGtidsEvent, MariadbGtidListEvent)


def _gtid_list(ev: Any) -> MariadbGtidState:
    return MariadbGtidState.of(
        MariadbGtid(int(g.domain_id), int(g.server_id), int(g.gtid_seq_no)) for g in ev.gtid_list
    )


# -- the reader ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalReaderConfig:
    """``local.*`` of a destination, and what the reader shares with the network one."""

    directory: str
    schema_file: str = ""
    poll_s: float = 0.5
    slave_id: int = 0
    transaction_size: int = 1024
    destination: str = ""


class LocalBinlogReader:
    """Reads a directory's binlog files into Entries; ``BinlogReader``'s interface."""

    def __init__(self, config: LocalReaderConfig, sink: Sink) -> None:
        self.config = config
        self._sink = sink
        self._stop = threading.Event()
        self._last: EntryPosition | None = None
        self._cursor: _FileCursor | None = None  # where the reading is (the thread's)
        self._asm: TransactionAssembler | None = None
        self._dir = LocalBinlogDir(config.directory)
        self._source: Mapping[str, Any] = {"host": LOCAL_PREFIX.rstrip(":"), "port": 0}

    # -- what the instance reads

    @property
    def identity(self) -> LogIdentity:
        return LogIdentity(self._dir.address, self.config.slave_id)

    @property
    def source(self) -> Mapping[str, Any]:
        return self._source

    @property
    def dump_error_count(self) -> int:
        return 0

    @property
    def dump_thread_id(self) -> int | None:
        return None

    @property
    def last_position(self) -> EntryPosition | None:
        return self._last

    def link(self) -> DatabaseLink:
        """The finder's view of the directory."""
        return DatabaseLink(
            self._dir.address,
            LocalBinlogInspector(self._dir),
            LocalEventSource(self._dir),
            identifies_server=False,
        )

    def binlog_end(self) -> dict[str, Any] | None:
        """``/v1/health``'s binlog end: the newest file and its size; once the reader has
        read all of it outside a transaction, its position (after the last transaction:
        what follows carries no data, e.g. a ROTATE or STOP ending the file, which no
        entry's position would ever reach)."""
        try:
            journal, offset = LocalBinlogInspector(self._dir).master_status()
        except (BinlogError, OSError):
            return None
        gtid, read = "", self._read_all(journal, offset)
        if read is not None:
            journal, offset, gtid = read.journal, read.offset, read.gtid
        return {
            "journal": journal,
            "offset": offset,
            "gtid": gtid,
            "source_address": self._dir.address,
        }

    def _read_all(self, journal: str, size: int) -> EntryPosition | None:
        """The reader's position when it has read ``journal`` to ``size`` (the offset
        moves on after an event is handled) and is not inside a transaction."""
        cursor, asm, last = self._cursor, self._asm, self._last
        if cursor is None or asm is None or last is None or asm.in_transaction:
            return None
        return last if (cursor.journal, cursor.offset) == (journal, size) else None

    # -- control

    def stop(self) -> None:
        self._stop.set()

    def run(self, start: EntryPosition) -> str:
        """Read from ``start`` until stopped; BinlogConfigError / PurgedPosition /
        BinlogError end it (a damaged file, a table without names)."""
        if not start.journal:
            raise ValueError(f"a local destination starts at a file position, not {start}")
        self._last = start
        self._dir.schema = self._load_schema()
        self._dir.replay_ddl(start)
        inspector = LocalBinlogInspector(self._dir)
        state = start.gtid or inspector.gtid_at(start.journal, start.offset)
        asm = TransactionAssembler(self._sink, start, state, self.config.transaction_size)
        self._asm = asm
        for journal, events in self._journals(start):
            asm.journal = journal
            for ev in events:
                if self._stop.is_set():
                    return RunResult.STOPPED
                self._follow_ddl(ev)
                if not isinstance(ev, RotateEvent | FormatDescriptionEvent):
                    asm.on_event(ev)
                self._last = asm.committed
        return RunResult.STOPPED

    def _load_schema(self) -> SchemaTracker:
        tracker = SchemaTracker()
        path = self.config.schema_file
        if path:
            try:
                tracker.load(Path(path).read_text())
            except OSError as exc:
                raise BinlogConfigError(
                    f"local.schema_file {path}: cannot read it: {exc.strerror}"
                ) from exc
        return tracker

    def _follow_ddl(self, ev: Any) -> None:
        if isinstance(ev, QueryEvent):
            self._dir.schema.apply(_text(ev.schema), _text(ev.query))

    def _journals(self, start: EntryPosition) -> Iterator[tuple[str, Iterator[Any]]]:
        """(journal, its events) from ``start``, following new data until stopped."""
        names = [f.name for f in self._dir.files()]
        if start.journal not in names:
            raise PurgedPosition(
                f"{self.config.destination}: binlog {start.journal} is not in "
                f"{self._dir.path} (its files: {', '.join(names) or 'none'}); {OPERATOR_HINT}"
            )
        cursor = self._cursor = _FileCursor(self._dir, start.journal, start.offset)
        while not self._stop.is_set():
            yield cursor.journal, cursor.events()
            seq = journal_seq(cursor.journal)
            later = [f.name for f in self._dir.files() if journal_seq(f.name) > seq]
            if later and cursor.at_end():
                cursor = self._cursor = _FileCursor(self._dir, later[0], BINLOG_START_OFFSET)
            else:
                self._stop.wait(self.config.poll_s)  # the newest file: wait for more


class _FileCursor:
    """One pass over a file from ``offset``; remembers where it stopped."""

    def __init__(self, directory: LocalBinlogDir, journal: str, offset: int) -> None:
        self._dir = directory
        self.journal = journal
        self.offset = offset
        self._decoder = directory.decoder()  # kept across passes: its table maps too

    def events(self) -> Iterator[Any]:
        for at, ev in self._dir.events(self.journal, self.offset, self._decoder):
            yield ev
            end = binlog_stream.event_span(ev).end
            if end > at:
                self.offset = max(self.offset, end)

    def at_end(self) -> bool:
        """True when the file has nothing left after ``offset`` (a newer file follows)."""
        size = (self._dir.path / self.journal).stat().st_size
        return self.offset >= size
