"""Canal's ``Entry`` bytes written by hand: the header and the rows of a RowChange.

The generated classes build a Python object per column of every row (``Column`` has 10
fields); these functions write the same messages' bytes directly, with what a table's
columns share encoded once (``Plan``). A message's fields may come in any order
(protobuf's rule: parsers accept any order), so a column puts its value last: all before
it is the same for every value of one length, and a column is one precomputed prefix
(per value length) and the value's bytes. What it writes parses to the message
``convert.to_canal_entry`` builds (tests/test_canal_entries.py compares them); the C
encoder (``_canalcodec``) writes these bytes exactly (tests/test_canal_native.py), with
the constant parts ``Plan`` and ``column_fields`` give it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from canal_protocol.entry import TableColumns
from canal_server.canal import values
from canal_server.canal.types import CanalForm, CanalType, canal_type

__all__ = [
    "BEFORE",
    "SAME",
    "UPDATED",
    "HeaderFields",
    "Plan",
    "begin_bytes",
    "column_fields",
    "end_bytes",
    "entry_bytes",
    "header_bytes",
    "plan",
    "row_datas",
    "varint",
]


_SMALL = tuple(bytes((i,)) for i in range(128))


def varint(n: int) -> bytes:
    """Protobuf varint; a negative int32/int64 as its 64-bit two's complement."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    if 0 < n < 0x4000:  # offsets, lengths: unrolled
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if 0 < n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    if n < 0:
        n += 1 << 64
    out = []
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (tag below 128)."""
    n = len(data)
    return b"".join((_SMALL[tag], _SMALL[n] if n < 128 else varint(n), data))


def _text_field(tag: int, text: str) -> bytes:
    return _field(tag, text.encode()) if text else b""


def _int_field(tag: int, n: int) -> bytes:
    return _SMALL[tag] + varint(n) if n else b""


# -- header -------------------------------------------------------------------------------

# (logfile, offset, server id, execute time ms, schema, table, event length, eventType
#  code or None, props as (key, value) pairs, gtid)
HeaderFields = tuple[str, int, int, int, str, str, int, int | None, Sequence[tuple[str, str]], str]
# version 1, serverenCode UTF-8, sourceType MYSQL (2)
_CONSTANT = b"\x08\x01" + _field(0x2A, b"UTF-8") + b"\x38\x02"


class _Memo(dict[Any, bytes]):
    """Encoded fields by their value: the entries of a batch share files, tables,
    transaction times and GTIDs (bounded: cleared when full)."""

    def __init__(self, encode: Callable[[Any], bytes]) -> None:
        super().__init__()
        self.encode = encode

    def __missing__(self, key: Any) -> bytes:
        if len(self) >= 256:
            self.clear()
        data = self[key] = self.encode(key)
        return data


_FILE = _Memo(lambda k: _CONSTANT + _text_field(0x12, k[0]) + _int_field(0x20, k[1]))
_TABLE = _Memo(lambda k: _text_field(0x42, k[0]) + _text_field(0x4A, k[1]))
_TIME = _Memo(lambda ms: _int_field(0x30, ms))
_GTID = _Memo(lambda gtid: _text_field(0x6A, gtid))
_PROP = _Memo(lambda kv: _field(0x62, _text_field(0x0A, kv[0]) + _text_field(0x12, kv[1])))
_EVENT_TYPE = _Memo(lambda code: b"" if code is None else b"\x58" + varint(code))


def header_bytes(f: HeaderFields) -> bytes:
    """A ``Header`` message (what ``convert`` builds with ``entry_pb2.Header``)."""
    logfile, offset, server_id, time_ms, schema, table, length, event_type, props, gtid = f
    parts = [
        _FILE[logfile, server_id], _int_field(0x18, offset), _TIME[time_ms],
        _TABLE[schema, table], _int_field(0x50, length), _EVENT_TYPE[event_type],
    ]  # fmt: skip
    for prop in props:
        parts.append(_PROP[prop])
    parts.append(_GTID[gtid])
    return b"".join(parts)


def begin_bytes(thread_id: int) -> bytes:
    """A ``TransactionBegin``: ``threadId`` (field 4) only, as Canal."""
    return _int_field(0x20, thread_id)


def end_bytes(xid: int) -> bytes:
    """A ``TransactionEnd``: ``transactionId`` (field 2), the XID as text, only."""
    return _text_field(0x12, str(xid))


def entry_bytes(header: bytes, entry_type: int, store: bytes) -> bytes:
    """An ``Entry``: its header, ``entryType`` (always set, as Canal), ``storeValue``."""
    stored = _field(0x1A, store) if store else b""
    return b"".join((_field(0x0A, header), b"\x10", _SMALL[entry_type], stored))


# -- rows ---------------------------------------------------------------------------------

# The three ways a column appears: in a before image (not updated), in an after image
# not updated, in an after image updated. Tag: beforeColumns (1) or afterColumns (2).
BEFORE, SAME, UPDATED = 0, 1, 2
_TAGS = (0x0A, 0x12, 0x12)
_UPDATED = (b"", b"", b"\x28\x01")  # ``updated`` (field 5)
_NULL = (b"\x30\x00", b"\x30\x01")  # ``isNull`` (field 6): always present, as Canal
_PREFIXED = 64  # value lengths with a precomputed prefix: below this


# A value's text inline in the generated code, by text function (default: ``T{i}(v)``).
_INLINE: dict[Callable[[Any], str], str] = {
    str: "str({v})",
    values.string_text: "({v} if {v}.__class__ is str else T{i}({v}))",
    values.binary_text: "({v}.decode('latin-1') if {v}.__class__ is bytes else T{i}({v}))",
}


def _sql_type(code: int) -> bytes:
    return b"\x10" + varint(code) if code else b""


def column_fields(side: int, head: bytes, sql: int, is_null: bool) -> bytes:
    """A column's fields before its value: ``head`` (index, name, isKey, mysqlType),
    sqlType and the flags (the C encoder gets them too)."""
    return head + _sql_type(sql) + _UPDATED[side] + _NULL[is_null]


def _column(side: int, head: bytes, sql: int, is_null: bool, data: bytes | None) -> bytes:
    """One encoded column: ``head`` (index, name, isKey, mysqlType), then sqlType, the
    flags and the value (``data``; None or empty: no value field)."""
    body = column_fields(side, head, sql, is_null)
    if data:
        body += _field(0x42, data)
    return _field(_TAGS[side], body)


class Plan:
    """One table's columns for the three sides: a NULL column's whole bytes, a value's
    prefix per value length (tag, length, every field but the value's bytes)."""

    __slots__ = ("columns", "encoders", "heads", "kinds", "native", "nulls", "prefixes")

    def __init__(self, columns: TableColumns, form: CanalForm) -> None:
        self.columns = columns
        self.encoders: list[Callable[..., bytes] | None] = [None, None, None, None]
        self.native: Any = None  # the C encoder's plan (_native.native_plan), made once
        self.kinds: tuple[CanalType, ...] = tuple(canal_type(t, form) for t in columns.mysql_types)
        self.heads = tuple(
            _int_field(0x08, i) + _text_field(0x1A, name) + (b"\x20\x01" if key else b"")
            + _text_field(0x52, kind.mysql_type)
            for i, (name, key, kind) in enumerate(
                zip(columns.names, columns.keys, self.kinds, strict=True)
            )
        )  # fmt: skip
        pairs = list(zip(self.heads, self.kinds, strict=True))
        self.nulls = tuple(
            tuple(_column(side, h, k.null_sql_type, True, None) for h, k in pairs)
            for side in (BEFORE, SAME, UPDATED)
        )
        self.prefixes = tuple(
            tuple(self._prefixes(side, h, k.sql_type) for h, k in pairs)
            for side in (BEFORE, SAME, UPDATED)
        )

    @staticmethod
    def _prefixes(side: int, head: bytes, sql: int) -> tuple[bytes, ...]:
        """The column's bytes before a value of each length 0, 1, ... (while short)."""
        out = []
        for n in range(_PREFIXED):
            whole = _column(side, head, sql, False, b"\0" * n)
            out.append(whole[: len(whole) - n])
        return tuple(out)

    def image(self, side: int, image: Sequence[Any]) -> bytes:
        """Every column of an image on one side (an INSERT's after, a DELETE's before)."""
        encode = self.encoders[side]
        if encode is None:
            encode = self.encoders[side] = self._compile(side)
        return encode(image)

    def update(self, before: Sequence[Any], after: Sequence[Any]) -> bytes:
        """An UPDATE's before and after columns; ``updated`` where the text or the
        nullness changed (Canal's ``isUpdate``)."""
        encode = self.encoders[3]
        if encode is None:
            encode = self.encoders[3] = self._compile(None)
        return encode(before, after)

    def _compile(self, side: int | None) -> Callable[..., bytes]:
        """A function for this table's images on ``side`` (None: an UPDATE's pair), one
        block per column: no loop, the common text forms inline (rowcodec's way; about
        twice the speed of a loop over the columns)."""
        n = len(self.kinds)
        names: dict[str, Any] = {"E": b"", "S": self._slow}
        out = ", ".join(f"p{i}, d{i}" for i in range(n))
        if side is None:
            lines = ["def encode(before, after):", f"    {_unpack('b', n)} = before",
                     f"    {_unpack('a', n)} = after"]  # fmt: skip
            out = ", ".join(f"q{i}, e{i}" for i in range(n)) + ", " + out
        else:
            lines = ["def encode(image):", f"    {_unpack('a', n)} = image"]
        for i, kind in enumerate(self.kinds):
            names.update({f"T{i}": kind.text, f"W{i}": kind.wide_above})
            for k, group in enumerate(self.prefixes):
                names[f"P{k}_{i}"], names[f"N{k}_{i}"] = group[i], self.nulls[k][i]
            text = _INLINE.get(kind.text, "T{i}({v})")
            wide = kind.wide_above

            def short(v: str, d: str, i: int = i, wide: int = wide) -> str:
                return f"len({d}) < {_PREFIXED}" + (f" and {v} <= W{i}" if wide else "")

            if side is None:  # the before image, its texts kept for the after image
                lines += [
                    f"    if b{i} is None: t{i} = None; q{i} = N0_{i}; e{i} = E",
                    "    else:",
                    f"        t{i} = {text.format(v=f'b{i}', i=i)}; e{i} = t{i}.encode()",
                    f"        if {short(f'b{i}', f'e{i}')}: q{i} = P0_{i}[len(e{i})]",
                    f"        else: q{i} = S(0, {i}, b{i}, e{i}); e{i} = E",
                    f"    if a{i} is None: p{i} = N1_{i} if t{i} is None else N2_{i}; d{i} = E",
                    "    else:",
                    f"        s{i} = {text.format(v=f'a{i}', i=i)}; d{i} = s{i}.encode()",
                    f"        k{i} = 1 if s{i} == t{i} else 2",
                    f"        if {short(f'a{i}', f'd{i}')}: p{i} = (P1_{i} if k{i} == 1 else"
                    f" P2_{i})[len(d{i})]",
                    f"        else: p{i} = S(k{i}, {i}, a{i}, d{i}); d{i} = E",
                ]  # fmt: skip
            else:
                lines += [
                    f"    if a{i} is None: p{i} = N{side}_{i}; d{i} = E",
                    "    else:",
                    f"        d{i} = {text.format(v=f'a{i}', i=i)}.encode()",
                    f"        if {short(f'a{i}', f'd{i}')}: p{i} = P{side}_{i}[len(d{i})]",
                    f"        else: p{i} = S({side}, {i}, a{i}, d{i}); d{i} = E",
                ]  # fmt: skip
        lines.append(f"    return b''.join(({out},))")
        exec(compile("\n".join(lines), f"<canal columns {side}>", "exec"), names)
        return names["encode"]  # type: ignore[no-any-return]

    def _slow(self, side: int, i: int, value: Any, data: bytes) -> bytes:
        """A column the prefixes do not cover: a long value, a widened unsigned code."""
        kind = self.kinds[i]
        return _column(side, self.heads[i], kind.sql_type_of(value), False, data)


def _unpack(prefix: str, n: int) -> str:
    """``a0, a1, a2,``: the target of unpacking an image of ``n`` values."""
    return "".join(f"{prefix}{i}, " for i in range(n)).rstrip()


_plans: dict[tuple[int, Any], Plan] = {}
_PLANS_MAX = 1024


def plan(columns: TableColumns, form: CanalForm) -> Plan:
    """The plan of a table's columns (made once per ``TableColumns`` object and form)."""
    key = (id(columns), form)
    known = _plans.get(key)
    if known is None or known.columns is not columns:
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        known = _plans[key] = Plan(columns, form)
    return known


def row_datas(
    columns: TableColumns,
    form: CanalForm,
    befores: Sequence[Sequence[Any]],
    afters: Sequence[Sequence[Any]],
) -> bytes:
    """The ``rowDatas`` fields of a RowChange: INSERT ``afters`` only, DELETE ``befores``
    only, UPDATE both (row by row)."""
    p = plan(columns, form)
    if befores and afters:
        rows = [p.update(b, a) for b, a in zip(befores, afters, strict=True)]
    elif afters:
        rows = [p.image(UPDATED, a) for a in afters]
    else:
        rows = [p.image(BEFORE, b) for b in befores]
    return b"".join([_field(0x62, row) for row in rows])
