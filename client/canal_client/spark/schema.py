"""The Spark source's schemas: the generic map mode and the typed mode of one table.

Typed mode (``.option("table", "schema.table")``): ``before`` and ``after`` are structs
with one field per column of the table, typed from the column's ``mysql_type`` (the
leader answers the table's columns at query start, ``GET .../tables/{schema.table}``):

=================================  ======================================================
MariaDB                            Spark
=================================  ======================================================
TINYINT                            TINYINT (ByteType)
TINYINT UNSIGNED, SMALLINT         SMALLINT
SMALLINT UNSIGNED, MEDIUMINT (U)   INT
INT                                INT
INT UNSIGNED, BIGINT               BIGINT
BIGINT UNSIGNED                    DECIMAL(20,0) (never overflows)
DECIMAL(p,s), p <= 38              DECIMAL(p,s)
DECIMAL(p,s), p > 38               STRING: the exact decimal text (Spark holds 38 digits)
FLOAT / DOUBLE                     FLOAT / DOUBLE
DATE                               DATE
DATETIME(n)                        TIMESTAMP_NTZ (microseconds)
TIMESTAMP(n)                       TIMESTAMP (the UTC instant)
TIME(n)                            INTERVAL DAY TO SECOND (-838:59:59 .. 838:59:59 exact)
YEAR                               INT (0 for 0000)
CHAR, VARCHAR, TEXT, ENUM, JSON    STRING
BINARY, VARBINARY, BLOB, GEOMETRY  BINARY
SET                                ARRAY<STRING> (members in definition order)
BIT(n)                             BIGINT; BIT(64): DECIMAL(20,0)
=================================  ======================================================

Values Spark cannot hold are never silently wrong: a zero or partly zero date
(``0000-00-00``, ``2020-00-00``, zero DATETIME/TIMESTAMP) is null in the struct and its
text is in the row's ``raw`` map under ``before.<column>`` / ``after.<column>``. A
column type not in the table (e.g. MariaDB's UUID, INET6) fails the query at ``load()``.

A table's **shape** is its column names with their Spark types: rows whose table map
has another shape (an ALTER TABLE that adds, drops, renames, reorders or retypes a
column; widening a VARCHAR does not change it) are not planned; the query stops with
``SchemaChanged`` (``describe_change`` says what changed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from canal_client.spark.rows import ADDED_FIELDS, FIELDS
from canal_protocol.errors import ConfigError

__all__ = [
    "RAW_FIELD",
    "TypedColumn",
    "TypedTable",
    "column_kind",
    "describe_change",
    "generic_ddl",
    "generic_struct",
    "kind_ddl",
    "kind_type",
    "shape_of",
    "typed_ddl",
    "typed_struct",
]

RAW_FIELD = ("raw", "map<string,string>")
_INT_KINDS = {
    "tinyint": "int8", "tinyint unsigned": "int16", "smallint": "int16",
    "smallint unsigned": "int32", "mediumint": "int32", "mediumint unsigned": "int32",
    "int": "int32", "int unsigned": "int64", "bigint": "int64", "bigint unsigned": "u64",
    "year": "int32",
}  # fmt: skip
_STRING = re.compile(r"^(char|varchar)\(\d+\)$|^(tiny|medium|long)?text$|^enum\(")
_BINARY = re.compile(r"^(binary|varbinary)\(\d+\)$|^(tiny|medium|long)?blob$|^geometry$")
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_TEMPORAL = re.compile(r"^(date|datetime|timestamp|time)(\(\d\))?$")
_BIT = re.compile(r"^bit\((\d+)\)$")
_KIND_DDL = {
    "int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint",
    "u64": "decimal(20,0)", "text": "string", "float": "float", "double": "double",
    "date": "date", "datetime": "timestamp_ntz", "timestamp": "timestamp",
    "time": "interval day to second", "string": "string", "binary": "binary",
    "set": "array<string>",
}  # fmt: skip


def column_kind(mysql_type: str) -> str:
    """How a column of ``mysql_type`` (the entries' notation) is converted: a kind such as
    ``int32``, ``u64``, ``decimal(10,2)``, ``text`` (DECIMAL over 38 digits), ``date``;
    ``ValueError`` for a type the typed mode does not know."""
    t = mysql_type.strip().lower()
    if t in _INT_KINDS:
        return _INT_KINDS[t]
    if t in ("float", "double"):
        return t
    m = _DECIMAL.match(t)
    if m:
        return f"decimal({m.group(1)},{m.group(2)})" if int(m.group(1)) <= 38 else "text"
    m = _TEMPORAL.match(t)
    if m:
        return m.group(1)
    if _STRING.match(t):
        return "string"
    if _BINARY.match(t):
        return "binary"
    if t.startswith("set("):
        return "set"
    m = _BIT.match(t)
    if m:
        return "int64" if int(m.group(1)) < 64 else "u64"
    raise ValueError(f"no Spark type for the MariaDB type {mysql_type!r}")


def kind_ddl(kind: str) -> str:
    """The Spark DDL type of a kind."""
    return kind if kind.startswith("decimal(") else _KIND_DDL[kind]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class TypedColumn:
    name: str
    mysql_type: str
    kind: str
    is_key: bool = False


@dataclass(frozen=True)
class TypedTable:
    """The table of a typed stream, as the leader answered it when the query started."""

    schema: str
    table: str
    columns: tuple[TypedColumn, ...]
    version: str = ""
    primary_key: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> TypedTable:
        """From the answer of ``GET .../tables/{schema.table}``; ``ConfigError`` naming
        the option ``table`` for a column type without a Spark type."""
        name = f"{d.get('schema')}.{d.get('table')}"
        cols = []
        for c in d.get("columns") or ():
            try:
                kind = column_kind(str(c["mysql_type"]))
            except ValueError as exc:
                raise ConfigError(
                    "table", f"{name}.{c['name']}: {exc}; read this table in map mode"
                ) from None
            cols.append(TypedColumn(str(c["name"]), str(c["mysql_type"]), kind, bool(c["is_key"])))
        if not cols:
            raise ConfigError("table", f"{name} has no columns")
        return cls(
            str(d["schema"]), str(d["table"]), tuple(cols), str(d.get("version") or ""),
            tuple(str(k) for k in d.get("primary_key") or ()),
        )  # fmt: skip

    @property
    def full_name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def shape(self) -> tuple[tuple[str, str], ...]:
        return tuple((c.name, c.kind) for c in self.columns)

    def struct_ddl(self) -> str:
        fields = ",".join(f"{_quote(c.name)}:{kind_ddl(c.kind)}" for c in self.columns)
        return f"struct<{fields}>"


def shape_of(names: Sequence[str], mysql_types: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The shape of a table map's columns (an unknown type counts as its own kind)."""
    out = []
    for name, t in zip(names, mysql_types, strict=True):
        try:
            kind = column_kind(t)
        except ValueError:
            kind = f"unknown {t}"
        out.append((name, kind))
    return tuple(out)


def describe_change(
    old: Sequence[tuple[str, str]], new: Sequence[tuple[str, str]], new_types: Sequence[str]
) -> str:
    """``added c (int), dropped d, changed e: decimal(10,2) -> decimal(12,2)``."""
    before, after = dict(old), dict(new)
    mysql = dict(zip((n for n, _ in new), new_types, strict=True))
    parts = [f"added {n} ({mysql[n]})" for n in after if n not in before]
    parts += [f"dropped {n}" for n in before if n not in after]
    parts += [
        f"changed {n}: {kind_ddl(before[n]) if not before[n].startswith('unknown') else before[n]}"
        f" -> {mysql[n]}"
        for n in after
        if n in before and before[n] != after[n]
    ]
    if not parts and [n for n, _ in old] != [n for n, _ in new]:
        parts.append("columns reordered: " + ", ".join(n for n, _ in new))
    return ", ".join(parts) or "no column change"


def generic_ddl() -> str:
    """The map mode's schema as a Spark DDL string."""
    return ", ".join(f"`{name}` {kind}" for name, kind in FIELDS)


def _typed_fields(struct: Any) -> list[tuple[str, Any]]:
    """The typed mode's fields in order: the map mode's with ``struct`` images, ``raw``
    after ``primary_key``, the added fields last."""
    base = [(n, struct if n in ("before", "after") else k) for n, k in FIELDS]
    return [*base[: len(base) - len(ADDED_FIELDS)], RAW_FIELD, *ADDED_FIELDS]


def typed_ddl(table: TypedTable) -> str:
    """The typed mode's schema: the map mode's fields with struct images, and ``raw``."""
    return ", ".join(f"`{name}` {kind}" for name, kind in _typed_fields(table.struct_ddl()))


_SIMPLE_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(), "boolean": T.BooleanType(), "bigint": T.LongType(),
    "int": T.IntegerType(), "timestamp": T.TimestampType(),
    "map<string,string>": T.MapType(T.StringType(), T.StringType(), True),
}  # fmt: skip
_KIND_TYPES: dict[str, T.DataType] = {
    "int8": T.ByteType(), "int16": T.ShortType(), "int32": T.IntegerType(),
    "int64": T.LongType(), "u64": T.DecimalType(20, 0), "text": T.StringType(),
    "float": T.FloatType(), "double": T.DoubleType(), "date": T.DateType(),
    "datetime": T.TimestampNTZType(), "timestamp": T.TimestampType(),
    "time": T.DayTimeIntervalType(), "string": T.StringType(), "binary": T.BinaryType(),
    "set": T.ArrayType(T.StringType(), True),
}  # fmt: skip


def kind_type(kind: str) -> T.DataType:
    """The Spark type of a kind."""
    m = re.match(r"^decimal\((\d+),(\d+)\)$", kind)
    if m:
        return T.DecimalType(int(m.group(1)), int(m.group(2)))
    return _KIND_TYPES[kind]


def generic_struct() -> T.StructType:
    """The map mode's schema."""
    return T.StructType([T.StructField(n, _SIMPLE_TYPES[k], True) for n, k in FIELDS])


def typed_struct(table: TypedTable) -> T.StructType:
    """The typed mode's schema (``typed_ddl`` as a StructType)."""
    image = T.StructType([T.StructField(c.name, kind_type(c.kind), True) for c in table.columns])
    return T.StructType([
        T.StructField(n, k if isinstance(k, T.StructType) else _SIMPLE_TYPES[k], True)
        for n, k in _typed_fields(image)
    ])  # fmt: skip
