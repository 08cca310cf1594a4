"""The C encoder of Canal's entries (``_canalcodec``, built by setup.py) and its plans.

``convert.encode_entries`` uses the C encoder when the extension is importable (unless
``CANAL_CANALCODEC=python``); the Python encoder (``convert.encode_entries_python``,
``_wire``) is the reference it matches byte for byte, and the C encoder hands it any
entry it does not handle itself (a statement, a value whose text it does not make, ...).

A table's plan for the C encoder (``native_plan``) is ``_wire``'s plan of the table,
told column by column: how the C code makes the value's text (a kind below, chosen by
the column's text function in ``values``; ``K_CALL``: the C code calls that function),
and the column's constant bytes for the three ways it appears (before image, after
image not updated, after image updated): its fields before the value (for the
column's sqlType, and for the widened one of an unsigned integer) and a NULL's whole
message.
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable
from typing import Any

from canal_protocol.entry import TableColumns
from canal_server.canal import _wire, values
from canal_server.canal.types import CanalForm, CanalType

try:
    from canal_server.canal import _canalcodec
    from canal_server.canal._canalcodec import Encoder

    HAVE_NATIVE = True
except ImportError:  # the C extension is not built: the Python encoder is used
    HAVE_NATIVE = False

__all__ = ["ENV", "HAVE_NATIVE", "Encoder", "native_plan", "plan_of", "plan_spec", "use_native"]

ENV = "CANAL_CANALCODEC"  # "python": the Python encoder even where the C one is built

# Column kinds; the same numbers are in _canalcodec.c.
(K_STR, K_DECIMAL, K_DATETIME, K_TIMESTAMP, K_YEAR, K_BIT, K_STRING, K_BINARY,
 K_FIXED_BINARY, K_ENUM, K_SET, K_JSON, K_CALL, K_FLOAT, K_DOUBLE) = range(1, 16)  # fmt: skip
ZONE_LOCAL, ZONE_FIXED, ZONE_CALL = range(3)

_KINDS: dict[Callable[[Any], str], int] = {
    str: K_STR,
    values.decimal_text: K_DECIMAL,
    values.datetime_text: K_DATETIME,
    values.year_text: K_YEAR,
    values.bit_text: K_BIT,
    values.string_text: K_STRING,
    values.binary_text: K_BINARY,
    values.fixed_binary_text: K_FIXED_BINARY,
    values.json_text: K_JSON,
    values.java_float: K_FLOAT,
    values.java_double: K_DOUBLE,
}


def use_native() -> bool:
    """Whether ``encode_entries`` runs the C encoder."""
    return HAVE_NATIVE and os.environ.get(ENV, "").lower() != "python"


def _zone(zone: datetime.tzinfo | None) -> tuple[int, int]:
    """(zone mode, offset in seconds) of a TIMESTAMP column's zone for the C code: the
    local zone (the C library's, as datetime's), a fixed offset, or the text function."""
    if zone is None:
        return ZONE_LOCAL, 0
    if type(zone) is datetime.timezone:
        offset = zone.utcoffset(None)
        if offset.microseconds == 0:
            return ZONE_FIXED, offset.days * 86_400 + offset.seconds
    return ZONE_CALL, 0


def _kind(kind: CanalType) -> tuple[int, tuple[str, ...], int, int]:
    """(C kind, ENUM/SET members, zone mode, zone offset) of a column."""
    text = kind.text
    if isinstance(text, values.EnumIndex):
        return K_ENUM, text.names, 0, 0
    if isinstance(text, values.SetBits):
        return K_SET, text.names, 0, 0
    if (
        isinstance(text, functools.partial) and text.func is values.timestamp_text
        and not text.args and set(text.keywords) <= {"zone"}
    ):  # fmt: skip
        return (K_TIMESTAMP, (), *_zone(text.keywords.get("zone")))
    return _KINDS.get(text, K_CALL), (), 0, 0


def plan_spec(plan: _wire.Plan) -> tuple[tuple[Any, ...], ...]:
    """The C encoder's description of ``_wire``'s plan of a table (see the module doc)."""
    spec: list[tuple[Any, ...]] = []
    for head, kind in zip(plan.heads, plan.kinds, strict=True):
        code, members, zone_mode, zone_offset = _kind(kind)
        if kind.wide_above and code != K_STR:
            raise ValueError(f"{kind.mysql_type}: a widened sqlType needs the str text")
        sides = (_wire.BEFORE, _wire.SAME, _wire.UPDATED)
        fields = tuple(_wire.column_fields(s, head, kind.sql_type, False) for s in sides)
        wide = tuple(_wire.column_fields(s, head, kind.wide_sql_type, False) for s in sides)
        nulls = tuple(plan.nulls[s][len(spec)] for s in sides)
        spec.append((code, kind.wide_above, kind.text, members, zone_mode, zone_offset,
                     fields, wide, nulls))  # fmt: skip
    return tuple(spec)


def native_plan(columns: TableColumns, form: CanalForm) -> _canalcodec.Plan:
    """The C encoder's plan of a table's columns (made once per ``_wire`` plan)."""
    plan = _wire.plan(columns, form)
    if plan.native is None:
        plan.native = _canalcodec.Plan(plan_spec(plan))
    native: _canalcodec.Plan = plan.native
    return native


def plan_of(form: CanalForm) -> Callable[[TableColumns], _canalcodec.Plan]:
    """``native_plan`` for one form (what the C encoder calls with a table's columns)."""
    return functools.partial(_native_plan_of, form=form)


def _native_plan_of(columns: TableColumns, form: CanalForm) -> _canalcodec.Plan:
    return native_plan(columns, form)
