"""Helpers for the Delta mirror's tests: typed-stream micro-batches made by hand, and
reading a Delta table back two ways: with ``deltalake``, and with DuckDB alone (it reads
the Delta log's JSON commits and the parquet files they leave active, without
deltalake), so the two readers check each other."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

TOP = pa.schema([
    ("schema", pa.string()), ("table", pa.string()), ("event_type", pa.string()),
    ("is_ddl", pa.bool_()), ("sql", pa.string()),
])  # fmt: skip


def typed_batch(
    image: pa.StructType,
    changes: Sequence[tuple[Any, ...]],
    keys: Sequence[str] = ("id",),
    table: tuple[str, str] = ("shop", "orders"),
) -> pa.Table:
    """A micro-batch as the typed stream gives it (the columns the mirror reads): each
    change is ``(event_type, before, after)`` (dicts or None), ``("TRUNCATE", sql)`` and
    the like for a DDL row, or ``(schema, table, event_type, before, after)``."""
    cols: dict[str, list[Any]] = {n: [] for n in (*TOP.names, "before", "after", "primary_key")}
    for change in changes:
        if len(change) == 5:
            schema, name, kind, before, after = change
        elif len(change) == 2:
            (schema, name), kind, before, after = table, change[0], None, None
        else:
            (schema, name), (kind, before, after) = table, change
        ddl = len(change) == 2
        cols["schema"].append(schema)
        cols["table"].append(name)
        cols["event_type"].append(kind)
        cols["is_ddl"].append(ddl)
        cols["sql"].append(change[1] if ddl else None)
        cols["before"].append(before)
        cols["after"].append(after)
        key_image = before if kind == "DELETE" else after
        cols["primary_key"].append(
            None if ddl else json.dumps({k: str(key_image[k]) for k in keys}, separators=(",", ":"))
        )
    schema = TOP.append(pa.field("before", image)).append(pa.field("after", image))
    schema = schema.append(pa.field("primary_key", pa.string()))
    return pa.table(cols, schema=schema)


def delta_rows(path: str | Path) -> list[dict[str, Any]]:
    """The table's rows as ``deltalake`` reads them."""
    rows: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return rows


def duckdb_rows(path: str | Path) -> list[dict[str, Any]]:
    """The table's rows as DuckDB reads them without deltalake: the active files are
    those the JSON commits of ``_delta_log`` add and do not remove (delta-rs writes no
    deletion vectors: checked), read with ``read_parquet`` by column name."""
    log = Path(path) / "_delta_log"
    active: dict[str, None] = {}
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                assert action["add"].get("deletionVector") is None, action
                active[action["add"]["path"]] = None
            elif "remove" in action:
                active.pop(action["remove"]["path"], None)
    schema = _last_schema(log)
    if not active:
        return []
    files = [str(Path(path) / p) for p in active]
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        rel = con.read_parquet(files, union_by_name=True)
        have = set(rel.columns)
        select = ", ".join(
            (f'"{n}"' if n in have else f'NULL AS "{n}"') for n in schema
        )  # a column added after a file was written: null in its rows
        rows = con.sql(f"SELECT {select} FROM rel").fetchall()
        return [dict(zip(schema, r, strict=True)) for r in rows]
    finally:
        con.close()


def _last_schema(log: Path) -> list[str]:
    names: list[str] = []
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text().splitlines():
            meta = json.loads(line).get("metaData")
            if meta:
                names = [f["name"] for f in json.loads(meta["schemaString"])["fields"]]
    return names


def by_key(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[tuple[Any, ...], Any]:
    out = {tuple(r[k] for k in keys): r for r in rows}
    assert len(out) == len(rows), "a key is in the table twice"
    return out
