"""A micro-batch of the typed stream as what it does to each table: the latest change
per primary key (``plan_changes``), computed with Arrow on the rows in binlog order.

Per table (``schema``, ``table``), in the order of the rows:

* INSERT, UPDATE and READ (an incremental snapshot's row) upsert the ``after`` image;
  DELETE deletes the ``before`` image's key. An UPDATE that changes the key deletes the
  old key and upserts the new one (as Debezium emits a delete and a create).
* The latest change of a key wins: delete-then-insert upserts, insert-then-delete
  deletes (a key the mirror never had: nothing to do).
* DDL rows: TRUNCATE empties the table, and so do DROP TABLE (ERASE) and a rename of
  the table (RENAME TABLE, ALTER TABLE ... RENAME TO): the table of that name no longer
  holds those rows. Only the changes after the last of them count, applied to an empty
  table. Other DDL (CREATE, ALTER, indexes) changes no row: column changes reach the
  mirror as the images' new columns, when the query restarts after ``SchemaChanged``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from canal_protocol.errors import ConfigError

__all__ = ["EMPTYING", "TablePlan", "key_columns", "plan_changes"]

EMPTYING = ("TRUNCATE", "ERASE", "RENAME")  # DDL after which the table holds no row
_UPSERTS = ("INSERT", "UPDATE", "READ")
# ALTER TABLE t RENAME [TO|AS] u (not RENAME COLUMN/INDEX/KEY): the table moves away
_ALTER_RENAME = re.compile(r"\brename\s+(?!(?:column|index|key)\b)", re.IGNORECASE)
_KEY_VALUE = re.compile(r':(?:"(?:[^"\\]|\\.)*"|null)')
NEEDED = ("schema", "table", "event_type", "is_ddl", "sql", "before", "after", "primary_key")


@dataclass(frozen=True)
class TablePlan:
    """What one micro-batch does to one table: ``emptied`` (the DDL that emptied it
    last, else None) and then ``upserts`` (the latest ``after`` image of each key whose
    latest change is not a delete, flattened into the image's columns) and ``deletes``
    (the key columns of each key whose latest change is a delete). ``rows`` counts the
    row changes of the table in the micro-batch, ``raw`` those with a value Spark could
    not hold (the typed stream's ``raw``: a zero date, null in the image)."""

    schema: str
    table: str
    keys: tuple[str, ...]
    image: pa.StructType
    upserts: pa.Table
    deletes: pa.Table
    emptied: str | None = None
    rows: int = 0
    raw: int = 0

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def _emptying(event_type: str, sql: str | None) -> bool:
    if event_type in EMPTYING:
        return True
    return event_type == "ALTER" and bool(sql) and _ALTER_RENAME.search(sql or "") is not None


def key_columns(primary_keys: pa.Array, table: str) -> tuple[str, ...]:
    """The key columns named by the typed stream's ``primary_key`` (compact JSON of the
    key columns, e.g. ``{"id":"42"}``): the same in every row that has one, else
    ``ConfigError``; () when no row has one (DDL only)."""
    layouts = pc.unique(
        pc.replace_substring_regex(primary_keys.drop_null(), _KEY_VALUE.pattern, ":0")
    )
    if len(layouts) > 1:
        raise ConfigError(
            "keys", f"{table}: the rows of one micro-batch have different primary keys "
            f"({', '.join(str(v) for v in layouts.to_pylist())}); pass the key columns"
        )  # fmt: skip
    if not len(layouts):
        return ()
    return tuple(json.loads(layouts[0].as_py()))


def _flat(images: pa.StructArray, names: Sequence[str]) -> pa.Table:
    return pa.Table.from_arrays(images.flatten(), names=list(names))


def _one_table(rows: pa.Table, schema: str, table: str, keys: Sequence[str] | None) -> TablePlan:
    image = rows.schema.field("after").type
    names = [image.field(i).name for i in range(image.num_fields)]
    cut, emptied = -1, None
    for i in pc.indices_nonzero(rows.column("is_ddl").combine_chunks()).to_pylist():
        kind, sql = rows.column("event_type")[i].as_py(), rows.column("sql")[i].as_py()
        if _emptying(kind, sql):
            cut, emptied = i, kind
    data = rows.slice(cut + 1).filter(pc.invert(rows.column("is_ddl").slice(cut + 1)))
    if keys is None:
        keys = key_columns(data.column("primary_key"), f"{schema}.{table}")
    raw = 0
    if "raw" in rows.column_names:
        raw = len(rows.column("raw").drop_null())
    empty_plan = TablePlan(
        schema, table, tuple(keys), image, _flat(pa.array([], image), names),
        _flat(pa.array([], image), names).select(list(keys)), emptied, len(data), raw,
    )  # fmt: skip
    if not len(data):
        return empty_plan
    if not keys:
        raise ConfigError("keys", f"{schema}.{table} has no primary key: a mirror needs one")
    missing = [k for k in keys if k not in names]
    if missing:
        raise ConfigError("keys", f"{schema}.{table}: key column {missing[0]} is not a column")
    before = data.column("before").combine_chunks()
    after = data.column("after").combine_chunks()
    kind = data.column("event_type").combine_chunks()
    is_delete = pc.equal(kind, "DELETE")
    unknown = pc.invert(pc.or_(is_delete, pc.is_in(kind, pa.array(_UPSERTS))))
    if pc.any(unknown).as_py():
        bad = pc.filter(kind, unknown)[0]
        raise ConfigError("event_type", f"{schema}.{table}: a row change of type {bad}")
    n = len(data)
    seq = pc.multiply(pa.array(range(n), pa.int64()), 2)
    # one op per row: its key (the before image's for a DELETE), 'D' or 'U'
    ops = {k: pc.if_else(is_delete, before.field(k), after.field(k)) for k in keys}
    table_ops = pa.table({
        **ops, "_seq": pc.add(seq, 1), "_row": pa.array(range(n), pa.int64()),
        "_delete": is_delete,
    })  # fmt: skip
    # an UPDATE that changes the key first deletes the old key
    moved = pc.and_(
        pc.equal(kind, "UPDATE"),
        _any([pc.not_equal(before.field(k), after.field(k)) for k in keys]),
    )
    moved = pc.fill_null(moved, False)
    if pc.any(moved).as_py():
        old = pa.table({
            **{k: pc.filter(before.field(k), moved) for k in keys},
            "_seq": pc.filter(seq, moved), "_row": pc.filter(table_ops.column("_row"), moved),
            "_delete": pa.array([True] * pc.sum(moved).as_py(), pa.bool_()),
        })  # fmt: skip
        table_ops = pa.concat_tables([table_ops, old])
    newest = table_ops.group_by(list(keys), use_threads=False).aggregate([("_seq", "max")])
    latest = table_ops.filter(pc.is_in(table_ops.column("_seq"), newest.column("_seq_max")))
    deleted = latest.column("_delete")
    upsert_rows = pc.filter(latest.column("_row"), pc.invert(deleted))
    upserts = _flat(pc.take(after, pc.take(upsert_rows, pc.sort_indices(upsert_rows))), names)
    deletes = latest.filter(deleted).select(list(keys))
    return TablePlan(schema, table, tuple(keys), image, upserts, deletes, emptied, n, raw)


def _any(masks: Sequence[pa.Array]) -> pa.Array:
    out = masks[0]
    for m in masks[1:]:
        out = pc.or_(out, m)
    return out


def plan_changes(batch: pa.Table, keys: Sequence[str] | None = None) -> list[TablePlan]:
    """Each table's plan of a micro-batch of the typed stream (its rows in binlog order,
    at least the columns ``NEEDED``); ``keys``: the key columns, else those of the rows'
    ``primary_key``."""
    missing = [c for c in NEEDED if c not in batch.column_names]
    if missing:
        raise ConfigError(
            "batch", f"not a typed stream's micro-batch: no column {missing[0]} "
            "(the Delta mirror needs the typed mode, option 'table')"
        )  # fmt: skip
    after = batch.schema.field("after").type
    if not pa.types.is_struct(after):
        raise ConfigError(
            "batch", "the images are maps: the Delta mirror needs the typed mode (option 'table')"
        )
    plans = []
    pairs = pa.table([batch.column("schema"), batch.column("table")], names=["s", "t"])
    for pair in pairs.group_by(["s", "t"], use_threads=False).aggregate([]).to_pylist():
        s, t = pair["s"], pair["t"]
        mask = pc.and_(pc.equal(batch.column("schema"), s), pc.equal(batch.column("table"), t))
        plans.append(_one_table(batch.filter(mask), str(s), str(t), keys))
    return plans
