"""A mirror of typed streams in Delta Lake tables, exactly once, at the cost of the changes.

::

    from canal_client.spark.delta import DeltaMirror

    df = spark.readStream.format("canal").option("table", "shop.orders")...load()
    df.writeStream.foreachBatch(DeltaMirror("/lake/mirror", tables=["shop.orders"])) \\
        .option("checkpointLocation", "/lake/ckpt/shop.orders").start()

Each micro-batch of a typed stream (``canal_client.spark``, option ``table``) is MERGEd
into one Delta table per source table, ``<root>/<schema>.<table>``, by ``deltalake``
(delta-rs) on the driver: the latest change per primary key (``plan_changes``: INSERT,
UPDATE and snapshot READ rows upsert the after image, DELETE deletes, an UPDATE of the
key moves the row; TRUNCATE, DROP TABLE and a rename of the table empty it), in one
Delta commit per table and micro-batch. The MERGE reads and rewrites only the files
whose key range holds a changed key (the predicate carries the batch's key bounds, so
Delta's file statistics skip the others): its cost follows the changes, not the table.

**Exactly once.** Each commit records a Delta application transaction: the app id
``canal-ha-mirror:<query id>`` (Spark's query id, kept in the checkpoint; or
``app_id``) at version ``<batch id>``. A table whose log holds the app id at the
batch id or later has that micro-batch already: it is skipped. A micro-batch replayed
after a driver restart or a leader change (the source replays the same rows) changes
nothing; a micro-batch of several tables commits each table on its own, and a crash
between two commits leaves the others to the replay.

**Columns.** ``canal_client.spark.delta_schema``: the types (TIME as microseconds) and the
evolution rules (ADD COLUMN, DROP COLUMN and widening MODIFY; anything else is
``IncompatibleChange`` before anything is written). docs/spark.md "Delta Lake mirror" has
the details.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake

from canal_client.spark.delta_plan import NEEDED, TablePlan, plan_changes
from canal_client.spark.delta_schema import (
    Evolution,
    delta_array,
    delta_schema,
    evolution,
    table_columns,
)
from canal_protocol.errors import ConfigError

__all__ = [
    "APP_ID_PREFIX",
    "Applied",
    "DeltaMirror",
    "TablePlan",
    "plan_changes",
    "query_app_id",
]

log = logging.getLogger("canal_client.spark.delta")

APP_ID_PREFIX = "canal-ha-mirror:"
TARGET_FILE_SIZE = 32 * 1024 * 1024  # bytes: a MERGE rewrites whole files; keep them small
_OP = "__canal_op"  # the merge source's column: 'U' upsert, 'D' delete
_BOUNDED = (pa.types.is_integer, pa.types.is_string, pa.types.is_decimal)


def query_app_id(batch: Any) -> str:
    """The Delta app id of the streaming query running ``batch`` (a ``foreachBatch``
    DataFrame): ``canal-ha-mirror:<query id>``; the query id is kept in the checkpoint,
    so a restarted query has the same one."""
    try:
        query_id = batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception as exc:  # Spark Connect has no SparkContext
        raise ConfigError(
            "app_id", f"cannot read the streaming query's id here ({exc}): pass app_id"
        ) from None
    if not query_id:
        raise ConfigError("app_id", "not called by a streaming query's foreachBatch: pass app_id")
    return f"{APP_ID_PREFIX}{query_id}"


@dataclass(frozen=True)
class Applied:
    """What a micro-batch did to one Delta table."""

    table: str
    path: str
    batch_id: int
    skipped: bool = False  # the table's log held the batch already
    version: int | None = None  # the table's Delta version after the batch
    rows: int = 0  # row changes of the table in the micro-batch
    upserts: int = 0
    deletes: int = 0
    emptied: str | None = None  # TRUNCATE, ERASE or RENAME
    evolved: str = ""  # the column change applied first, if any
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.table} batch {self.batch_id}: already in the Delta table, skipped"
        what = f"{self.upserts} upserts, {self.deletes} deletes"
        if self.emptied:
            what = f"emptied by {self.emptied}, then {what}"
        if self.evolved:
            what = f"columns: {self.evolved}; {what}"
        return (
            f"{self.table} batch {self.batch_id}: {self.rows} changes -> {what} "
            f"(Delta version {self.version})"
        )


def _quote(name: str, alias: str | None = None) -> str:
    quoted = "`" + name.replace("`", "``") + "`"
    return f"{alias}.{quoted}" if alias else quoted


def _literal(value: Any, t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return str(int(value))
    if pa.types.is_decimal(t):
        return f"CAST('{value:f}' AS DECIMAL({t.precision},{t.scale}))"  # never 0E-10
    return "'" + str(value).replace("'", "''") + "'"


def _predicate(plan: TablePlan, source: pa.Table) -> str:
    """The MERGE's join on the key columns, with the batch's bounds of each key column
    (integers, decimals, strings): Delta's file statistics then skip the files outside
    them. Every source row lies within its bounds, so they select the same matches."""
    parts = [f"{_quote(k, 't')} = {_quote(k, 's')}" for k in plan.keys]
    for k in plan.keys:
        column = source.column(k)
        if not any(is_type(column.type) for is_type in _BOUNDED):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None:
            continue
        parts.append(f"{_quote(k, 't')} >= {_literal(low, column.type)}")
        parts.append(f"{_quote(k, 't')} <= {_literal(high, column.type)}")
    return " AND ".join(parts)


def _columns(plan: TablePlan) -> dict[str, str]:
    try:
        return delta_schema(plan.image)
    except ValueError as exc:
        raise ConfigError("table", f"{plan.name}: {exc}") from None


def _holds(dt: DeltaTable | None, app_id: str, batch_id: int) -> bool:
    """Whether the table's log records the app id at ``batch_id`` or later."""
    if dt is None:
        return False
    version = dt.transaction_version(app_id)
    return version is not None and version >= batch_id


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` in the mirror's columns and types (TIME as microseconds)."""
    arrays = [
        delta_array(t.column(f.name).combine_chunks()).cast(f.type)
        if f.name in t.column_names
        else pa.nulls(len(t), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


class DeltaMirror:
    """The ``foreachBatch`` function that mirrors typed streams into Delta tables under
    ``root`` (see the module docstring).

    ``tables``: the ``schema.table`` names the query streams (typed mode: its option
    ``table``); with them a replayed micro-batch already in every table is skipped
    before its rows are read. ``keys``: the primary key columns (default: named by the
    rows' ``primary_key``). ``app_id``: the Delta app id (default: from the streaming
    query's id). ``table_path(schema, table)``: where a table's Delta table is (default
    ``<root>/<schema>.<table>``). ``target_file_size``: the Delta tables' file size
    (``delta.targetFileSize``, set when the sink creates a table). ``report``: called with
    each ``Applied`` (default: logged at INFO)."""

    def __init__(
        self,
        root: str | Path,
        *,
        tables: Sequence[str] = (),
        keys: Sequence[str] | None = None,
        app_id: str | None = None,
        table_path: Callable[[str, str], str] | None = None,
        target_file_size: int = TARGET_FILE_SIZE,
        storage_options: dict[str, str] | None = None,
        report: Callable[[Applied], None] | None = None,
    ) -> None:
        self.root = str(root)
        self.tables = tuple(tables)
        self.keys = tuple(keys) if keys is not None else None
        self.app_id = app_id
        self._table_path = table_path
        self.target_file_size = target_file_size
        self.storage_options = storage_options
        self.report = report or (lambda applied: log.info("%s", applied))
        self._open: dict[str, DeltaTable] = {}

    def path(self, schema: str, table: str) -> str:
        if self._table_path is not None:
            return self._table_path(schema, table)
        return str(Path(self.root) / f"{schema}.{table}")

    # -- foreachBatch

    def __call__(self, batch: Any, batch_id: int) -> None:
        app_id = self.app_id or query_app_id(batch)
        if self.tables and all(self._has(name, app_id, batch_id) for name in self.tables):
            for name in self.tables:
                self.report(Applied(name, self._path_of(name), batch_id, skipped=True))
            return
        columns = [c for c in (*NEEDED, "raw") if c in batch.columns]
        self.apply(batch.select(*columns).toArrow(), batch_id, app_id)

    def apply(self, rows: pa.Table, batch_id: int, app_id: str) -> list[Applied]:
        """Apply a micro-batch (the typed stream's rows in binlog order, as Arrow) to the
        Delta tables; what it did to each."""
        plans = plan_changes(rows, self.keys)
        todo: list[tuple[TablePlan, DeltaTable | None, Evolution | None]] = []
        done: list[Applied] = []
        for plan in plans:  # every check first: an incompatible change writes nothing
            path = self.path(plan.schema, plan.table)
            dt = self._table(path)
            if _holds(dt, app_id, batch_id):
                done.append(Applied(plan.name, path, batch_id, skipped=True))
                continue
            todo.append((plan, dt, self._evolution(plan, dt)))
        for plan, dt, change in todo:
            done.append(self._apply(plan, dt, change, batch_id, app_id))
        for applied in done:
            self.report(applied)
        return done

    # -- per table

    def _path_of(self, name: str) -> str:
        schema, _, table = name.partition(".")
        return self.path(schema, table)

    def _table(self, path: str) -> DeltaTable | None:
        dt = self._open.get(path)
        if dt is not None:
            dt.update_incremental()
            return dt
        if not DeltaTable.is_deltatable(path, self.storage_options):
            return None
        dt = self._open[path] = DeltaTable(path, storage_options=self.storage_options)
        return dt

    def _has(self, name: str, app_id: str, batch_id: int) -> bool:
        return _holds(self._table(self._path_of(name)), app_id, batch_id)

    def _evolution(self, plan: TablePlan, dt: DeltaTable | None) -> Evolution | None:
        """How the table's columns must change for the plan's images (None: not at all,
        or a new table)."""
        want = _columns(plan)
        if dt is None:
            return None
        have = table_columns(dt.schema().to_json())
        if have == want:
            return None
        return evolution(plan.name, have, want, plan.keys, empty=dt.count() == 0)

    def _apply(
        self,
        plan: TablePlan,
        dt: DeltaTable | None,
        change: Evolution | None,
        batch_id: int,
        app_id: str,
    ) -> Applied:
        t0 = time.monotonic()
        path = self.path(plan.schema, plan.table)
        commit = CommitProperties(
            app_transactions=[Transaction(app_id, batch_id)],
            custom_metadata={"canal.batch": str(batch_id), "canal.table": plan.name},
        )
        metrics: dict[str, Any] = {}
        evolved = ""
        if dt is None:  # a new mirror: its first commit holds the batch
            upserts = _conform(plan.upserts, Evolution(_columns(plan)).arrow_schema())
            write_deltalake(
                path, upserts, mode="append", commit_properties=commit,
                configuration={"delta.targetFileSize": str(self.target_file_size)},
                storage_options=self.storage_options,
            )  # fmt: skip
            dt = self._table(path)
            assert dt is not None
        else:
            if change is not None and change.needed:
                evolved = change.describe()
                self._evolve(dt, change, plan.name)
            target = Evolution(table_columns(dt.schema().to_json())).arrow_schema()
            upserts = _conform(plan.upserts, target)
            if plan.emptied is not None:
                write_deltalake(dt, upserts, mode="overwrite", commit_properties=commit)
            elif len(upserts) or len(plan.deletes):
                metrics = self._merge(dt, plan, upserts, target, commit)
            dt.update_incremental()
        if plan.raw:
            log.warning(
                "%s batch %d: %d row changes held values Delta (like Spark) cannot hold "
                "(zero dates): null in the mirror", plan.name, batch_id, plan.raw,
            )  # fmt: skip
        return Applied(
            plan.name, path, batch_id, version=dt.version(), rows=plan.rows,
            upserts=len(upserts), deletes=len(plan.deletes), emptied=plan.emptied,
            evolved=evolved, seconds=round(time.monotonic() - t0, 3), metrics=metrics,
        )  # fmt: skip

    def _merge(
        self,
        dt: DeltaTable,
        plan: TablePlan,
        upserts: pa.Table,
        target: pa.Schema,
        commit: CommitProperties,
    ) -> dict[str, Any]:
        deletes = _conform(plan.deletes, target)
        source = pa.concat_tables([upserts, deletes])
        ops = ["U"] * len(upserts) + ["D"] * len(deletes)
        source = source.append_column(_OP, pa.array(ops, pa.string()))
        columns = {_quote(f.name): _quote(f.name, "s") for f in target}
        merger = dt.merge(
            source, _predicate(plan, source), source_alias="s", target_alias="t",
            commit_properties=commit,
        )  # fmt: skip
        if len(deletes):
            merger = merger.when_matched_delete(f"s.{_OP} = 'D'")
        if len(upserts):
            merger = merger.when_matched_update(columns, f"s.{_OP} = 'U'")
            merger = merger.when_not_matched_insert(columns, f"s.{_OP} = 'U'")
        return merger.execute()

    def _evolve(self, dt: DeltaTable, change: Evolution, name: str) -> None:
        """Give the table the stream's columns: adding is a metadata commit; dropping or
        converting rewrites the table's files in one commit. Either reaches the same
        columns when done again (a replay after a crash in between)."""
        log.warning("%s: the mirror's columns change: %s", name, change.describe())
        target = change.arrow_schema()
        if not change.rewrites:
            added = [Field.from_arrow(target.field(n)) for n in change.added]
            dt.alter.add_columns(added)
            return

        old = dt.to_pyarrow_dataset().to_batches()  # opened here, read while writing

        def batches() -> Any:
            for b in old:
                yield pa.RecordBatch.from_arrays(
                    [
                        b.column(f.name).cast(f.type) if f.name in b.schema.names
                        else pa.nulls(len(b), f.type)
                        for f in target
                    ],
                    schema=target,
                )  # fmt: skip

        reader = pa.RecordBatchReader.from_batches(target, batches())
        write_deltalake(dt, reader, mode="overwrite", schema_mode="overwrite")
        dt.update_incremental()
