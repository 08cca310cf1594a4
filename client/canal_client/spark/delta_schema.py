"""The Delta mirror's columns: the typed stream's Arrow types as Delta types, and which
changes of a table's columns the mirror follows (``evolution``).

A typed stream's ``after`` struct (``canal_client.spark.schema``) becomes the Delta
table's columns, every one nullable, with the same values:

=============================================  ===========================================
typed stream (Spark / Arrow)                   Delta
=============================================  ===========================================
tinyint, smallint, int, bigint                 byte, short, integer, long
decimal(p,s) (BIGINT UNSIGNED: decimal(20,0))  decimal(p,s)
float, double                                  float, double
string (CHAR, VARCHAR, TEXT, ENUM, JSON,       string
DECIMAL over 38 digits)
binary                                         binary
date                                           date
timestamp_ntz (DATETIME)                       timestamp_ntz (microseconds)
timestamp (TIMESTAMP, the UTC instant)         timestamp
interval day to second (TIME)                  long: signed microseconds (Delta has no
                                               interval type; Debezium's MicroTime)
array<string> (SET)                            array<string>
=============================================  ===========================================

**Evolution.** A column that is new is added (null in the rows the mirror has); a column
that is gone is dropped; a column whose type changed is converted only when every value
of the old type has one exact value of the new one (``widens``): a wider integer, an
integer into a decimal with room for its digits, a decimal with no fewer integer and
fraction digits, float into double, date into timestamp_ntz (midnight), an integer or
a decimal into string (its decimal text, as MariaDB converts it). Any other change of a
column's type is ``IncompatibleChange``, unless the mirror holds no row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from canal_protocol.errors import IncompatibleChange

__all__ = ["Evolution", "delta_array", "delta_schema", "delta_type", "evolution", "widens"]

_INTS = {"byte": 3, "short": 5, "integer": 10, "long": 19}  # digits of each integer type
_ARROW_INTS = {pa.int8(): "byte", pa.int16(): "short", pa.int32(): "integer", pa.int64(): "long"}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")


def delta_type(t: pa.DataType) -> str:
    """The Delta type of a typed stream's Arrow type (``ValueError`` for another)."""
    if t in _ARROW_INTS:
        return _ARROW_INTS[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_duration(t):
        return "long"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    simple = {
        pa.float32(): "float", pa.float64(): "double", pa.string(): "string",
        pa.large_string(): "string", pa.binary(): "binary", pa.large_binary(): "binary",
        pa.date32(): "date", pa.bool_(): "boolean",
    }  # fmt: skip
    if t in simple:
        return simple[t]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{delta_type(t.value_type)}>"
    raise ValueError(f"no Delta type for {t}")


def delta_array(a: pa.Array) -> pa.Array:
    """A column of the stream as the mirror stores it (TIME: microseconds)."""
    if pa.types.is_duration(a.type):
        return a.cast(pa.int64())
    return a


def _arrow_of(delta: str) -> pa.DataType:
    """The Arrow type the mirror writes for a Delta type (the inverse of ``delta_type``)."""
    m = _DECIMAL.match(delta)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if delta.startswith("array<"):
        return pa.list_(_arrow_of(delta[6:-1]))
    by_name = {v: k for k, v in _ARROW_INTS.items()}
    simple = {
        "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
        "binary": pa.binary(), "date": pa.date32(), "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
    }  # fmt: skip
    return by_name.get(delta) or simple[delta]


def delta_schema(image: pa.StructType | pa.Schema) -> dict[str, str]:
    """Column → Delta type of a typed stream's image struct, in its order."""
    fields = [image.field(i) for i in range(image.num_fields)]
    out: dict[str, str] = {}
    for f in fields:
        try:
            out[f.name] = delta_type(f.type)
        except ValueError as exc:
            raise ValueError(f"column {f.name}: {exc}") from None
    return out


def table_columns(schema_json: str) -> dict[str, str]:
    """Column → Delta type of a Delta table's schema (``Schema.to_json()``)."""

    def name(t: Any) -> str:
        if isinstance(t, str):
            return t
        if t.get("type") == "array":
            return f"array<{name(t['elementType'])}>"
        return json.dumps(t, sort_keys=True)  # a struct or map: compared as it is

    return {f["name"]: name(f["type"]) for f in json.loads(schema_json)["fields"]}


def _digits(t: str) -> tuple[int, int] | None:
    """(integer digits, fraction digits) of an integer or decimal type."""
    if t in _INTS:
        return _INTS[t], 0
    m = _DECIMAL.match(t)
    return (int(m.group(1)) - int(m.group(2)), int(m.group(2))) if m else None


def widens(old: str, new: str) -> bool:
    """Whether every value of Delta type ``old`` has one exact value of type ``new``, the
    one MariaDB gives it when it converts the column."""
    if old == new:
        return True
    a, b = _digits(old), _digits(new)
    if a is not None and b is not None:
        if old in _INTS and new in _INTS:
            return _INTS[old] <= _INTS[new]
        return new not in _INTS and b[0] >= a[0] and b[1] >= a[1]
    if a is not None and new == "string":
        return True
    return (old, new) in {("float", "double"), ("date", "timestamp_ntz")}


@dataclass(frozen=True)
class Evolution:
    """How a mirror's columns become the stream's: ``columns`` (name → Delta type, in the
    stream's order) of which ``added`` are new, ``dropped`` are gone, ``changed`` are
    converted (old type, new type)."""

    columns: Mapping[str, str]
    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    changed: Mapping[str, tuple[str, str]] | None = None

    @property
    def needed(self) -> bool:
        return bool(self.added or self.dropped or self.changed)

    @property
    def rewrites(self) -> bool:
        """Dropping or converting a column rewrites the table's files (adding does not)."""
        return bool(self.dropped or self.changed)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, _arrow_of(t), True) for n, t in self.columns.items()])

    def describe(self) -> str:
        parts = [f"added {n} ({self.columns[n]})" for n in self.added]
        parts += [f"dropped {n}" for n in self.dropped]
        parts += [f"converted {n}: {a} -> {b}" for n, (a, b) in (self.changed or {}).items()]
        return ", ".join(parts) or "no change"


def evolution(
    table: str, have: Mapping[str, str], want: Mapping[str, str], keys: Sequence[str], empty: bool
) -> Evolution:
    """The change from a mirror's columns ``have`` to the stream's ``want``;
    ``IncompatibleChange`` naming ``table`` and the column for a change no rule allows
    (a key column that is gone, a type that does not widen while the mirror holds
    rows)."""
    changed = {n: (have[n], t) for n, t in want.items() if n in have and have[n] != t}
    for name, (old, new) in changed.items():
        if not empty and not widens(old, new):
            raise IncompatibleChange(
                f"{table}: column {name} changed type {old} -> {new}, which the Delta mirror "
                f"cannot convert exactly (its rows hold {old} values). Nothing of this "
                "micro-batch was written. What to do: mirror the table anew (remove the Delta "
                "table and the query's checkpoint, then run an incremental snapshot), or "
                "change the column to a type that widens (docs/spark.md, Delta mirror: "
                "schema changes)"
            )
    missing = [k for k in keys if k not in want]
    if missing:
        raise IncompatibleChange(f"{table}: key column {missing[0]} is not in the stream")
    return Evolution(
        dict(want),
        tuple(n for n in want if n not in have),
        tuple(n for n in have if n not in want),
        changed or None,
    )
