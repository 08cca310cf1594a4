"""The driver-side streaming reader of the ``canal`` source (``CanalStreamReader``).

How batches become micro-batches, exactly once with a checkpointed sink:

* The driver-side reader (one long-lived object per query) holds one ClusterConnector
  (it follows leader changes; a change shows as a log line). ``latestOffset`` takes
  server batches **without ack** into an in-memory ledger and returns an offset (see
  ``canal_client.spark.rows.Offset``): entries so far, the key of the last one, the batch ids.
* The ledger holds each batch as the leader's **bytes** (``canal_client.packed``: the
  entries indexed, their rows not decoded). ``partitions(start, end)`` gives each
  partition the bytes of whole entries of ``(start, end]`` that yield rows; ``read``
  on the executor decodes them into one Arrow RecordBatch (``canal_client.spark.arrow``).
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

Keys (``canal_protocol.ordering.EntryKey``) are binlog file/offset of the database an entry was read
from, with its GTID and place in its transaction: after a database switch (primary →
standby, other binlog names) keys of the two databases compare by GTID, and the cursor
is moved through a checkpointed key only while the leader reads that key's database
(``HttpProgress``: ``reader_position.source_address``); otherwise the entries up to it
are read again and dropped as duplicates. An availableNow run across a switch may end
by ``availableNowStallS``; the next run goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from canal_client.packed import PackedBatch, PackedEntry
from canal_client.spark.arrow import record_batches
from canal_client.spark.connection import ConnectorLike, make_connector
from canal_client.spark.ledger import Item, Ledger, all_rows
from canal_client.spark.options import CanalOptions, table_filter
from canal_client.spark.prefetch import PREFETCH_STOP_S, Prefetch
from canal_client.spark.progress import BinlogPoint, HttpProgress, ProgressProbe
from canal_client.spark.rows import Offset
from canal_client.spark.schema import (
    TypedTable,
    describe_change,
    generic_struct,
    shape_of,
    typed_struct,
)
from canal_protocol.errors import CanalError, ReplayMismatch, SchemaChanged
from canal_protocol.ordering import MIN_KEY, EntryKey, batch_end, batch_source

__all__ = ["CanalPartition", "CanalStreamReader"]

log = logging.getLogger("canal_client.spark")


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
        self._prefetch: Prefetch | None = None

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
        """(Spark rows the entry gives, schema change or ""); see ``Item``."""
        table = self.typed
        if table is None:
            return all_rows(entry)
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

        self._prefetch = Prefetch(step, self._what())

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

    def _same_shape(self, pending: list[Item]) -> list[Item]:
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

    def _admit(self, pending: list[Item], limit: ReadLimit) -> list[Item]:
        if self._until_ms is not None:
            late = [i for i, it in enumerate(pending) if it.timestamp_ms > self._until_ms]
            pending = pending[: late[0]] if late else pending
        return self._limit(pending, limit)

    def _limit(self, pending: list[Item], limit: ReadLimit) -> list[Item]:
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

    def _until_target(self, begin: Offset, target: BinlogPoint) -> list[Item]:
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

    def _before(self, begin: Offset, target: BinlogPoint) -> list[Item]:
        """The entries before the target, and an incremental snapshot's entries at its
        position (put once the binlog reached it, before any later binlog event)."""
        limit = target.last_key
        return [it for it in self.ledger.between(begin.last, self.ledger.top) if it.key < limit]

    def _hold_back(self, begin: Offset, pending: list[Item]) -> list[Item]:
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

    def _split(self, items: list[Item]) -> list[CanalPartition]:
        """Partitions of about rowsPerPartition rows, of whole entries."""
        parts: list[CanalPartition] = []
        group: list[Item] = []
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

    def _range(self, begin: Offset, stop: Offset) -> list[Item]:
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

    def _moved_only(self, begin: Offset, stop: Offset, items: list[Item]) -> bool:
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
