"""Incremental snapshots of one destination: the rows tables already have, through the
same stream as the changes, lock-free, resumed at chunk granularity after a failover.

The argument is in docs/snapshot.md. In short, per chunk of ``chunk_rows`` rows in key
order (``canal_server.parse.snapshot.ChunkReader``):

1. the ``SnapshotTap`` starts recording the keys of the table that any row change the
   reader puts from now on touches (and any DDL on the table);
2. the chunk is read in a consistent snapshot whose binlog position P is exact: the
   SELECT sees precisely the transactions committed at or before P;
3. under the sink's lock (no binlog put in between), once the reader's last
   transaction boundary R is at or past P and no transaction is half put (one larger
   than ``transaction_size`` comes in pieces), the rows whose key a change in the binlog
   touched since step 1 are dropped (that change carried the full row: the consumer
   already has a newer state) and the rest are put as READ entries positioned after R
   (``EntryPosition.snapshot`` = 1, 2, ..., after any ordinal already used at R),
   wrapped in TRANSACTIONBEGIN/END.

A consumer that applies the stream in order ends with the table as it is at R, and
from then on follows the changes. Progress (per table: the last key emitted, rows,
chunks; and "marks": which chunk ended at which stream position) is part of the
destination's fenced meta (``snapshots/{id}``); a new leader resumes after the last
mark at or before the minimum client cursor (where its reader resumes; every earlier
mark too), so every chunk emitted after that position is read again: also those of a
done snapshot, which runs again while a mark of it lies after that cursor (and is kept
past ``KEEP_FINISHED`` meanwhile). ``Snapshots`` is the destination's manager (API
calls, the term's runner thread).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from canal_protocol.entry import Entry, EntryType, EventType, Header, TableColumns, Value
from canal_protocol.errors import (
    BinlogError,
    CoordinatorUnavailable,
    InvalidArgument,
    SnapshotConflict,
    StoreClosed,
    UnknownSnapshot,
    UnknownTable,
)
from canal_protocol.gtid import gtid_state_covers
from canal_protocol.positions import LogIdentity, LogPosition, journal_seq
from canal_server.config import SnapshotSection
from canal_server.filter import EventFilter, NameRegex
from canal_server.meta.memory import MemoryMetaManager
from canal_server.packed import PackedRows, pack_columns
from canal_server.parse.snapshot import (
    Chunk,
    ChunkReader,
    ShapeChanged,
    TableShape,
    key_from_json,
    key_to_json,
    pack_rows,
)
from canal_server.sink import EventSink
from canal_server.store import is_after

__all__ = [
    "MAX_MARKS",
    "ROWS_PER_ENTRY",
    "SnapshotRun",
    "SnapshotTap",
    "SnapshotTerm",
    "Snapshots",
]

log = logging.getLogger(__name__)

Key = tuple[Value, ...]
Point = tuple[str, int]  # a binlog position: (journal, offset)
ROWS_PER_ENTRY = 256  # rows of one READ entry (a binlog rows event holds ~8 KB)
PREFIX = "snapshots/"
KEEP_FINISHED = 20  # finished snapshots kept in the meta (the oldest go first)
MAX_MARKS = 256  # resume marks kept per snapshot (thinned beyond)
_STALL_S = 1.0  # the reader has not reached P for this long: ask the GTID state at P
_PAUSE_S = 0.05  # how often a runner paused on an unconfirmed epoch asks again
ACTIVE = ("pending", "running")


# -- the tap on the sink -----------------------------------------------------------------


@dataclass
class _Track:
    key: tuple[str, ...]
    touched: set[Key] = field(default_factory=set)
    invalid: str = ""


class SnapshotTap:
    """Records, per table being read, the keys row changes touch and DDL on the table.

    Called by the sink under its lock with every raw entry it puts (``__call__``);
    ``begin``/``take`` are called under the same lock by the snapshot runner.
    """

    def __init__(self) -> None:
        self._tables: dict[str, _Track] = {}

    def begin(self, full_name: str, key: Sequence[str]) -> None:
        self._tables[full_name] = _Track(tuple(key))

    def take(self, full_name: str) -> tuple[set[Key], str]:
        """(keys touched since ``begin``, why the chunk is void or "")."""
        track = self._tables.pop(full_name, None)
        if track is None:
            return set(), "not tracked"
        return track.touched, track.invalid

    def __call__(self, entries: Sequence[Entry]) -> None:
        if not self._tables:
            return
        for e in entries:
            if e.type is not EntryType.ROWDATA:
                continue
            if e.is_ddl:
                self._ddl(e)
                continue
            track = self._tables.get(e.full_name)
            if track is not None and e.images is not None:
                self._keys(track, e)

    def _ddl(self, e: Entry) -> None:
        sql = e.sql.lower()
        for name, track in self._tables.items():
            table = name.split(".", 1)[1].lower()
            if e.full_name.lower() == name.lower() or table in sql:
                track.invalid = f"DDL on the table: {e.sql[:200]}"

    @staticmethod
    def _keys(track: _Track, e: Entry) -> None:
        images = e.images
        assert images is not None
        names = images.columns.names
        try:
            index = [names.index(k) for k in track.key]
        except ValueError:
            track.invalid = f"key {track.key} not among the columns {names}"
            return
        for image in (*images.before, *images.after):
            track.touched.add(tuple(image[i] for i in index))


# -- progress ------------------------------------------------------------------------------


@dataclass
class TableProgress:
    name: str
    rows: int = 0
    chunks: int = 0
    done: bool = False
    after: Key | None = None
    note: str = ""


@dataclass
class Mark:
    """After a chunk: where its last entry is, and the table's progress then."""

    position: LogPosition
    table: int
    after: Key | None
    done: bool
    rows: int
    chunks: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position.to_dict(), "table": self.table,
            "after": key_to_json(self.after), "done": self.done, "rows": self.rows,
            "chunks": self.chunks,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Mark:
        return cls(
            LogPosition.from_dict(d["position"]), int(d["table"]), key_from_json(d["after"]),
            bool(d["done"]), int(d["rows"]), int(d["chunks"]),
        )  # fmt: skip


@dataclass
class SnapshotRun:
    """One snapshot: its tables in order, their progress and its resume marks."""

    id: str
    tables: list[str]
    chunk_rows: int
    state: str = "pending"  # pending | running | done | cancelled | failed
    created_ms: int = 0
    finished_ms: int = 0
    error: str = ""
    current: int = 0
    started_ms: int = 0
    progress: list[TableProgress] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    rate_start: tuple[float, int] | None = None  # (monotonic, rows) of this term's start

    def __post_init__(self) -> None:
        if not self.progress:
            self.progress = [TableProgress(t) for t in self.tables]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.progress)

    @property
    def chunks(self) -> int:
        return sum(p.chunks for p in self.progress)

    def to_json(self) -> bytes:
        data = {
            "id": self.id, "tables": self.tables, "chunk_rows": self.chunk_rows,
            "state": self.state, "created_ms": self.created_ms,
            "finished_ms": self.finished_ms, "error": self.error, "current": self.current,
            "started_ms": self.started_ms,
            "progress": [{**asdict(p), "after": key_to_json(p.after)} for p in self.progress],
            "marks": [m.to_dict() for m in self.marks],
        }  # fmt: skip
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SnapshotRun:
        d = json.loads(raw)
        progress = [
            TableProgress(
                str(p["name"]), int(p["rows"]), int(p["chunks"]), bool(p["done"]),
                key_from_json(p.get("after")), str(p.get("note", "")),
            )
            for p in d["progress"]
        ]  # fmt: skip
        return cls(
            str(d["id"]), [str(t) for t in d["tables"]], int(d["chunk_rows"]), str(d["state"]),
            int(d["created_ms"]), int(d.get("finished_ms", 0)), str(d.get("error", "")),
            int(d.get("current", 0)), int(d.get("started_ms", 0)), progress,
            [Mark.from_dict(m) for m in d.get("marks", [])],
        )  # fmt: skip

    def public(self) -> dict[str, Any]:
        """The API's view (``SnapshotOut``)."""
        rate = 0.0
        if self.rate_start is not None and self.state == "running":
            since, rows = self.rate_start
            elapsed = time.monotonic() - since
            rate = (self.rows - rows) / elapsed if elapsed > 0 else 0.0
        elif self.state == "done" and self.finished_ms > self.started_ms > 0:
            rate = self.rows * 1000 / (self.finished_ms - self.started_ms)
        return {
            "id": self.id,
            "state": self.state,
            "tables": [
                {"table": p.name, "done": p.done, "rows": p.rows, "chunks": p.chunks,
                 "last_key": key_to_json(p.after), "note": p.note}
                for p in self.progress
            ],
            "tables_done": sum(1 for p in self.progress if p.done),
            "tables_total": len(self.progress),
            "rows": self.rows,
            "chunks": self.chunks,
            "rows_per_s": round(rate, 1),
            "chunk_rows": self.chunk_rows,
            "created_ms": self.created_ms,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "error": self.error,
        }  # fmt: skip

    def resume(self, cursor: LogPosition | None) -> None:
        """A new term: go back to the newest mark at or before ``cursor`` (where the
        reader resumes); every chunk after it is read again."""
        newest = _newest_acked(self.marks, cursor)
        keep = self.marks[newest] if newest >= 0 else None
        self.marks = [keep] if keep is not None else []
        self.progress = [TableProgress(t) for t in self.tables]
        self.current = 0
        if keep is None:
            return
        for p in self.progress[: keep.table]:
            p.done = True
        p = self.progress[keep.table]
        p.after, p.done, p.rows, p.chunks = keep.after, keep.done, keep.rows, keep.chunks
        self.current = keep.table + 1 if keep.done else keep.table

    def acked(self, cursor: LogPosition | None) -> bool:
        """Every chunk it put is acked: all its marks lie at or before ``cursor``."""
        return _newest_acked(self.marks, cursor) == len(self.marks) - 1

    def add_mark(self, mark: Mark, cursor: LogPosition | None) -> None:
        """Record a chunk; drop marks older than the newest one at or before ``cursor``.
        Past ``MAX_MARKS`` every second mark after that one goes (the etcd value stays
        small): a resume then goes back further, which only reads more again."""
        self.marks.append(mark)
        newest = _newest_acked(self.marks, cursor)
        if newest > 0:
            del self.marks[:newest]
        if len(self.marks) > MAX_MARKS:
            self.marks = [self.marks[0], *self.marks[1:-1:2], self.marks[-1]]


def _newest_acked(marks: Sequence[Mark], cursor: LogPosition | None) -> int:
    """The index of the newest mark that, with every mark before it, lies at or before
    ``cursor`` (every client acked all chunks up to it); -1: none. A mark after the
    cursor ends the search, also if later ones (out of order) look acked."""
    newest = -1
    for i, mark in enumerate(marks):
        if cursor is None or is_after(mark.position, cursor):
            break
        newest = i
    return newest


def _ordinals_used(meta: MemoryMetaManager, runs: Iterable[SnapshotRun]) -> dict[Point, int]:
    """The highest snapshot ordinal per binlog point among the clients' cursors and the
    snapshots' marks: a new term numbers the entries it puts there after it, so no
    client's cursor lies past them (it would skip them)."""
    positions = [meta.cursor(c) for c in meta.clients()]
    positions += [m.position for run in runs for m in run.marks]
    used: dict[Point, int] = {}
    for p in positions:
        if p is not None and p.position.snapshot:
            point = (p.journal, p.offset)
            used[point] = max(used.get(point, 0), p.position.snapshot)
    return used


# -- one term's view -------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotTerm:
    """What a leadership term gives the snapshots: its sink (and store), the source its
    reader reads, whether the epoch is still ours, its stop event and the minimum
    client cursor (where a next leader would resume)."""

    epoch: int
    sink: EventSink
    source: Callable[[], Mapping[str, Any]]
    identity: Callable[[], LogIdentity]
    vouched: Callable[[], bool]
    stop: threading.Event
    min_cursor: Callable[[], LogPosition | None]


def _split(full_name: str) -> tuple[str, str]:
    schema, _, table = full_name.partition(".")
    return schema, table


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- the destination's manager --------------------------------------------------------------


class Snapshots:
    """The incremental snapshots of one destination (see the module doc).

    API side (any thread): ``create``, ``runs``, ``get``, ``cancel``. Term side (the
    instance): ``start_term`` when a term is ready, ``stop_term`` when it ends.
    """

    def __init__(
        self,
        destination: str,
        config: SnapshotSection,
        meta: MemoryMetaManager,
        instance_filter: EventFilter,
        flush: Callable[[], object] | None = None,
    ) -> None:
        self.destination = destination
        self.config = config
        self._meta = meta
        self._filter = instance_filter
        self._flush = flush
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._runs: dict[str, SnapshotRun] = {}
        self._term: SnapshotTerm | None = None
        self._thread: threading.Thread | None = None

    # -- API -------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.public() for r in self._ordered()]

    def get(self, snapshot_id: str) -> dict[str, Any]:
        with self._lock:
            return self._find(snapshot_id).public()

    def create(self, tables: Sequence[str], chunk_rows: int | None = None) -> dict[str, Any]:
        """Start a snapshot of the tables matching ``tables`` (regexes of ``schema.table``);
        raises InvalidArgument / UnknownTable / SnapshotConflict naming the field."""
        term = self._need_term()
        patterns = self._patterns(tables)
        with ChunkReader(term.source()) as reader:
            names = self._resolve(reader, patterns)
        with self._lock:
            busy = sorted({t for r in self._runs.values() if r.state in ACTIVE for t in r.tables})
            clash = [t for t in names if t in busy]
            if clash:
                raise SnapshotConflict(
                    "tables", f"{', '.join(clash)} already in a snapshot that has not ended"
                )
            run = SnapshotRun(
                self._next_id(), names, chunk_rows or self.config.chunk_rows,
                created_ms=_now_ms(),
            )  # fmt: skip
            self._runs[run.id] = run
            self._save(run)
            self._prune(term.min_cursor())
        self._flush_now()
        self._wake.set()
        log.info("%s: snapshot %s of %s started", self.destination, run.id, ", ".join(names))
        return self.get(run.id)

    def cancel(self, snapshot_id: str) -> dict[str, Any]:
        with self._lock:
            run = self._find(snapshot_id)
            if run.state not in ACTIVE:
                raise SnapshotConflict("snapshot_id", f"snapshot {snapshot_id} is {run.state}")
            run.state, run.finished_ms = "cancelled", _now_ms()
            self._save(run)
        self._flush_now()
        log.info("%s: snapshot %s cancelled", self.destination, snapshot_id)
        return self.get(snapshot_id)

    def create_initial(self) -> None:
        """``mode = "initial"``: the destination has no history yet: snapshot its tables."""
        if self.config.mode != "initial" or "initial" in self._runs:
            return
        try:
            self._create_named("initial", self.config.tables)
        except (InvalidArgument, SnapshotConflict, BinlogError, OSError) as exc:
            log.error("%s: the initial snapshot could not start: %s", self.destination, exc)
        except Exception as exc:  # a database error: reported, the destination still runs
            log.error("%s: the initial snapshot could not start: %r", self.destination, exc)

    def _create_named(self, snapshot_id: str, tables: Sequence[str]) -> None:
        term = self._need_term()
        with ChunkReader(term.source()) as reader:
            names = self._resolve(reader, self._patterns(tables))
        with self._lock:
            run = SnapshotRun(snapshot_id, names, self.config.chunk_rows, created_ms=_now_ms())
            self._runs[run.id] = run
            self._save(run)
        self._flush_now()
        self._wake.set()
        log.info("%s: initial snapshot of %s", self.destination, ", ".join(names))

    # -- validation ----------------------------------------------------------------------

    @staticmethod
    def _patterns(tables: Sequence[str]) -> list[NameRegex]:
        """The filters' engine (RE2: linear time, whatever the regex)."""
        if not isinstance(tables, list | tuple) or not tables:
            raise InvalidArgument("tables", "must be a non-empty list of schema.table regexes")
        out = []
        for i, pattern in enumerate(tables):
            if not isinstance(pattern, str) or not pattern:
                raise InvalidArgument(f"tables[{i}]", "must be a non-empty string")
            out.append(NameRegex(pattern, f"tables[{i}]"))
        return out

    def _resolve(self, reader: ChunkReader, patterns: Sequence[NameRegex]) -> list[str]:
        tables = reader.tables()
        names: list[str] = []
        for i, pattern in enumerate(patterns):
            found = [(s, t, e) for s, t, e in tables if pattern.fullmatch(f"{s}.{t}")]
            if not found:
                raise UnknownTable(
                    f"tables[{i}]",
                    f"no table matches {pattern.pattern!r} (the database lists only the "
                    "tables its user has a privilege on: a snapshot needs SELECT on them)",
                )
            for schema, table, engine in found:
                name = f"{schema}.{table}"
                if not self._filter.accepts_name(name):
                    raise InvalidArgument(
                        f"tables[{i}]", f"{name} is outside the destination's filter.regex"
                    )
                if engine.lower() != "innodb":
                    raise InvalidArgument(
                        f"tables[{i}]",
                        f"{name} uses the {engine} engine: only InnoDB tables can be read "
                        "in a consistent snapshot",
                    )
                denied = reader.select_denied(schema, table)
                if denied is not None:
                    raise InvalidArgument(
                        f"tables[{i}]",
                        f"the database user cannot read {name}: {denied}; a snapshot needs "
                        f"GRANT SELECT ON {name} (or on {schema}.*) for that user",
                    )
                reader.shape(schema, table)  # NoSnapshotKey names it
                if name not in names:
                    names.append(name)
        return names

    # -- state ---------------------------------------------------------------------------

    def _need_term(self) -> SnapshotTerm:
        term = self._term
        if term is None:
            raise StoreClosed(f"{self.destination}: not leading")
        return term

    def _find(self, snapshot_id: str) -> SnapshotRun:
        run = self._runs.get(snapshot_id)
        if run is None:
            raise UnknownSnapshot(f"{self.destination}: no snapshot {snapshot_id!r}")
        return run

    def _ordered(self) -> list[SnapshotRun]:
        return sorted(self._runs.values(), key=lambda r: (r.created_ms, r.id))

    def _next_id(self) -> str:
        numbers = [int(i[1:]) for i in self._runs if re.fullmatch(r"s\d+", i)]
        return f"s{max(numbers, default=0) + 1}"

    def _save(self, run: SnapshotRun) -> None:
        self._meta.set_extra(PREFIX + run.id, run.to_json())

    def _prune(self, cursor: LogPosition | None) -> None:
        """Drop the oldest ended runs beyond ``KEEP_FINISHED``; a done one whose chunks a
        client has not acked stays (a next term puts them again: ``start_term``)."""
        finished = [
            r for r in self._ordered()
            if r.state not in ACTIVE and (r.state != "done" or r.acked(cursor))
        ]  # fmt: skip
        for run in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._runs[run.id]
            self._meta.set_extra(PREFIX + run.id, None)

    def _flush_now(self) -> None:
        if self._flush is None:
            return
        try:
            self._flush()
        except CoordinatorUnavailable as exc:  # the periodic flush retries it
            log.warning("%s: snapshot state not flushed yet: %s", self.destination, exc)

    def _load(self) -> None:
        runs: dict[str, SnapshotRun] = {}
        for key, raw in self._meta.extras().items():
            if key.startswith(PREFIX):
                try:
                    run = SnapshotRun.from_json(raw)
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("%s: unreadable snapshot state %s: %s", self.destination, key, exc)
                    continue
                runs[run.id] = run
        self._runs = runs

    # -- term ----------------------------------------------------------------------------

    def start_term(self, term: SnapshotTerm, initial: bool = False) -> None:
        """A term is ready: load the progress from the meta, resume, start the runner
        (``initial``: the destination is new; with ``mode = "initial"`` it snapshots)."""
        with self._lock:
            self._load()
            cursor = term.min_cursor()
            used = _ordinals_used(self._meta, self._runs.values())
            for run in self._runs.values():
                if run.state == "done" and not run.acked(cursor):
                    self._reopen(run, cursor, term.epoch)
                if run.state in ACTIVE:
                    run.resume(cursor)
                    self._save(run)
                    log.info(
                        "%s: snapshot %s resumes at %s after %s (epoch %d, min cursor %s)",
                        self.destination, run.id, run.tables[min(run.current, len(run.tables) - 1)],
                        key_to_json(run.progress[min(run.current, len(run.tables) - 1)].after),
                        term.epoch, cursor,
                    )  # fmt: skip
            self._term = term
        tap = SnapshotTap()
        with term.sink.cond:
            term.sink.tap = tap
        self._thread = threading.Thread(
            target=self._loop, args=(term, _Runner(self, term, tap, used), initial),
            name=f"snapshot {self.destination}",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def _reopen(self, run: SnapshotRun, cursor: LogPosition | None, epoch: int) -> None:
        last = run.marks[-1].position
        log.warning(
            "%s: snapshot %s was done, but a client has not acked its chunks up to %s (min "
            "cursor %s), where this term's reader resumes: it is running again and puts "
            "those chunks again (epoch %d)", self.destination, run.id, last, cursor, epoch,
        )  # fmt: skip
        run.state, run.finished_ms = "running", 0

    def stop_term(self) -> None:
        """The term ended (its stop event is set and its store closed): wait for the runner."""
        self._term = None
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0)
            if thread.is_alive():
                log.warning("%s: snapshot runner still stopping", self.destination)

    def _next_run(self) -> SnapshotRun | None:
        with self._lock:
            for run in self._ordered():
                if run.state in ACTIVE:
                    return run
        return None

    def _loop(self, term: SnapshotTerm, runner: _Runner, initial: bool) -> None:
        if initial:
            self.create_initial()
        delay = 0.5
        while not term.stop.is_set():
            run = self._next_run()
            if run is None:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                runner.run(run)
                delay = 0.5
            except StoreClosed:
                break
            except Exception as exc:  # a database or etcd hiccup: try the chunk again
                if term.stop.is_set():
                    break
                log.warning(
                    "%s: snapshot %s (epoch %d) failed, retrying in %.1fs: %r",
                    self.destination, run.id, term.epoch, delay, exc,
                )  # fmt: skip
                term.stop.wait(delay)
                delay = min(delay * 2, 10.0)
            finally:
                runner.close()
        log.info("%s: snapshot runner of epoch %d stopped", self.destination, term.epoch)

    # -- what the runner records -------------------------------------------------------

    def still_active(self, run: SnapshotRun) -> bool:
        with self._lock:
            return self._runs.get(run.id) is run and run.state in ACTIVE

    def record(self, run: SnapshotRun, update: Callable[[SnapshotRun], None]) -> None:
        with self._lock:
            if self._runs.get(run.id) is not run:
                return
            update(run)
            self._save(run)


# -- the runner of one term ------------------------------------------------------------------


class _Runner:
    """Reads and emits the chunks of snapshots, one after the other, for one term."""

    def __init__(
        self, owner: Snapshots, term: SnapshotTerm, tap: SnapshotTap, used: dict[Point, int]
    ) -> None:
        self.owner = owner
        self.term = term
        self.tap = tap
        self.reader: ChunkReader | None = None
        self._used = used  # the highest snapshot ordinal put (or held by a client) per point

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def run(self, run: SnapshotRun) -> None:
        term = self.term
        if run.state == "pending" or run.rate_start is None:

            def started(r: SnapshotRun) -> None:
                r.state = "running"
                r.rate_start = (time.monotonic(), r.rows)
                r.started_ms = r.started_ms or _now_ms()

            self.owner.record(run, started)
        while run.current < len(run.tables):
            if term.stop.is_set():
                raise StoreClosed("term ended")
            if not self.owner.still_active(run):
                return
            self._chunk(run)
        self.owner.record(run, _finish)
        log.info(
            "%s: snapshot %s done: %d rows in %d chunks (epoch %d)",
            self.owner.destination, run.id, run.rows, run.chunks, term.epoch,
        )  # fmt: skip

    def _source(self) -> ChunkReader:
        if self.reader is None:
            self.reader = ChunkReader(self.term.source())
        return self.reader

    def _chunk(self, run: SnapshotRun) -> None:
        index = run.current
        name = run.tables[index]
        progress = run.progress[index]
        reader = self._source()
        identity = self.term.identity()
        if reader.source_address != identity.source_address:  # the reader switched
            self.close()
            reader = self._source()
        try:
            shape = self._tracked_shape(reader, name)
            chunk = reader.read(shape, progress.after, run.chunk_rows)
        except ShapeChanged as exc:
            self._untrack(name)
            if "does not exist" in str(exc):
                self.owner.record(run, lambda r: _skip_table(r, index, "dropped"))
            return
        except InvalidArgument as exc:  # an ALTER took the table's key away
            self._untrack(name)
            reason = str(exc)
            self.owner.record(run, lambda r: _fail(r, reason))
            return
        if chunk.keys and progress.after is not None and chunk.keys[0] == progress.after:
            self._untrack(name)
            why = f"{name}: the key order does not advance after {progress.after!r}"
            self.owner.record(run, lambda r: _fail(r, why))
            return
        end = self._emit(run, shape, chunk, identity)
        if end is None:
            return  # void (DDL, reader switched): read the chunk again
        done = len(chunk) < run.chunk_rows

        def advance(r: SnapshotRun) -> None:
            p = r.progress[index]
            p.rows += len(chunk)
            p.chunks += 1 if len(chunk) else 0  # the empty read that ends a table is no chunk
            p.after = chunk.last_key or p.after
            p.done = done
            if done:
                r.current = index + 1
            mark = Mark(end, index, p.after, done, p.rows, p.chunks)
            r.add_mark(mark, self.term.min_cursor())

        self.owner.record(run, advance)

    def _tracked_shape(self, reader: ChunkReader, name: str) -> TableShape:
        """The table's shape, read again after its keys are tracked (an ALTER between the
        two reads is seen by the tap, or changes the shape: then again)."""
        schema, table = _split(name)
        for _ in range(10):
            shape = reader.shape(schema, table)
            with self.term.sink.cond:
                self.tap.begin(name, shape.key)
            if reader.shape(schema, table) == shape:
                return shape
        raise ShapeChanged(f"{name} keeps changing")

    def _untrack(self, name: str) -> None:
        with self.term.sink.cond:
            self.tap.take(name)

    def _emit(
        self, run: SnapshotRun, shape: TableShape, chunk: Chunk, identity: LogIdentity
    ) -> LogPosition | None:
        """Wait until the reader passed the chunk's position and is between two
        transactions, then put it (see the module doc); the position of its last entry
        (or where it would have gone, if every row was dropped), None when it is void."""
        term, sink = self.term, self.term.sink
        target = (journal_seq(chunk.journal), chunk.offset, 0, 0)
        since = time.monotonic()
        gtid_at: str | None = None
        while True:
            self._confirmed(run)
            with sink.cond:
                if term.stop.is_set():
                    raise StoreClosed("term ended")
                if not self.owner.still_active(run) or self._switched(identity):
                    self.tap.take(shape.full_name)
                    return None  # cancelled, or the reader switched: read from the new one
                if term.vouched() and self._passed(identity, target, gtid_at):
                    assert sink.last is not None
                    return self._put(shape, chunk, sink.last, sink)
                sink.cond.wait(0.2)
            if gtid_at is None and time.monotonic() - since > _STALL_S:
                # nothing but non-transaction events (a rotation) may lie before P
                gtid_at = self._source().gtid_state_at(chunk.journal, chunk.offset)

    def _switched(self, identity: LogIdentity) -> bool:
        """Under the sink's lock: the reader reads another source than the chunk's."""
        last = self.term.sink.last
        if last is None or last.identity.same_source(identity):
            return False
        return not self.term.identity().same_source(identity)

    def _passed(self, identity: LogIdentity, target: tuple[Any, ...], gtid_at: str | None) -> bool:
        """Under the sink's lock: the reader's last transaction boundary is at or after
        the chunk's P (``target``), and no transaction is half put (a transaction larger
        than ``transaction_size`` comes in pieces: the chunk goes after its END)."""
        sink = self.term.sink
        last = sink.last
        if last is None or sink.in_transaction or not last.identity.same_source(identity):
            return False
        covered = gtid_at is not None and gtid_state_covers(sink.last_gtid, gtid_at)
        return last.position.sort_key >= target or covered

    def _confirmed(self, run: SnapshotRun) -> None:
        """Pause while the term's epoch is not confirmed: a keepalive sent before the
        fencing deadline and answered after it leaves the monitor without an epoch for a
        moment and then extends the same one, with no ``on_lost``. Nothing is put
        meanwhile; StoreClosed when the term ends (another epoch: ``on_lost`` ends it)."""
        term = self.term
        if term.vouched():
            return
        log.warning(
            "%s: snapshot %s paused: epoch %d is not confirmed by the election right now; "
            "waiting until it is again (or the term ends)", self.owner.destination, run.id,
            term.epoch,
        )  # fmt: skip
        while not term.vouched() and self.owner.still_active(run):
            if term.stop.wait(_PAUSE_S):
                raise StoreClosed("term ended")
        log.info("%s: snapshot %s goes on (epoch %d)", self.owner.destination, run.id, term.epoch)

    def _put(
        self, shape: TableShape, chunk: Chunk, at: LogPosition, sink: EventSink
    ) -> LogPosition | None:
        """Under the sink's lock: drop touched keys, put the rest after ``at``, numbered
        after every ordinal already used there (by this term, an earlier one's clients or
        marks). With no row left, the position of the last entry there (a mark is never
        placed before the chunk it follows)."""
        touched, invalid = self.tap.take(shape.full_name)
        if invalid:
            log.info("%s: chunk of %s read again: %s", self.owner.destination, shape.full_name,
                     invalid)  # fmt: skip
            return None
        rows = [r for r, k in zip(chunk.rows, chunk.keys, strict=True) if k not in touched]
        point = (at.journal, at.offset)
        ordinal = max(self._used.get(point, 0), at.position.snapshot)
        if not rows:
            return LogPosition(at.identity, replace(at.position, snapshot=ordinal))
        entries = _chunk_entries(shape, rows, at, ordinal, sink.last_gtid)
        sink.store.put(entries, at.identity)
        self._used[point] = ordinal + len(entries)
        here = (journal_seq(at.journal), at.offset)  # ``at`` only moves on: forget before it
        self._used = {p: n for p, n in self._used.items() if (journal_seq(p[0]), p[1]) >= here}
        return LogPosition(at.identity, entries[-1].position())


def _finish(run: SnapshotRun) -> None:
    run.state, run.finished_ms = "done", _now_ms()


def _fail(run: SnapshotRun, error: str) -> None:
    run.state, run.finished_ms, run.error = "failed", _now_ms(), error
    log.error("snapshot %s failed: %s", run.id, error)


def _skip_table(run: SnapshotRun, index: int, note: str) -> None:
    p = run.progress[index]
    p.done, p.note = True, note
    run.current = index + 1


def _chunk_entries(
    shape: TableShape, rows: Sequence[tuple[Value, ...]], at: LogPosition, ordinal: int,
    gtid_state: str,
) -> list[Entry]:  # fmt: skip
    """BEGIN, READ entries of up to ``ROWS_PER_ENTRY`` rows, END, positioned after ``at``.
    Their ``header.gtid`` is the GTID state at ``at`` (``gtid_state``): what orders them
    among a database switch's entries, which compare by GTID (docs/snapshot.md)."""
    p = at.position
    columns: TableColumns = shape.columns
    packed_columns = pack_columns(columns)

    def header(n: int, kind: EventType) -> Header:
        return Header(
            p.journal, p.offset, p.offset, p.server_id, p.timestamp_ms, gtid_state,
            shape.schema, shape.table, kind, n,
        )  # fmt: skip

    out = [Entry(EntryType.TRANSACTIONBEGIN, header(ordinal + 1, EventType.READ),
                 gtid_state=gtid_state)]  # fmt: skip
    for start in range(0, len(rows), ROWS_PER_ENTRY):
        part = rows[start : start + ROWS_PER_ENTRY]
        images = PackedRows(columns, len(part), b"\x90", pack_rows(part), packed_columns)
        n = ordinal + len(out) + 1
        out.append(Entry(EntryType.ROWDATA, header(n, EventType.READ), images=images,
                         gtid_state=gtid_state))  # fmt: skip
    n = ordinal + len(out) + 1
    out.append(Entry(EntryType.TRANSACTIONEND, header(n, EventType.READ), gtid_state=gtid_state))
    return out
