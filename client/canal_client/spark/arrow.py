"""Entries → ``pyarrow.RecordBatch`` on the executors (the Spark source's ``read``).

A partition carries the entries' msgpack bytes as the leader sent them
(``canal_client.packed``); ``record_batch(data, count, schema, table)`` decodes them
and builds one RecordBatch in the source's Arrow schema (``to_arrow_schema`` of the
Spark schema, exactly what PySpark checks), column by column: the values of a column
are gathered over every row of the batch and converted once by Arrow (integers,
DECIMAL text → decimal128, ISO text → timestamps and dates in C). ``record_batches``
(what ``read`` uses) gives a partition as batches of about ``rowsPerArrowBatch`` rows.

Map mode gives the rows of ``canal_client.spark.rows.entry_rows`` (same values, same
text). Typed mode (``table``): see ``canal_client.spark.schema``; only the table's rows
and DDL entries give rows; a zero date is null and its text goes to ``raw``.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from canal_client.packed import iter_entries
from canal_client.spark.rows import value_text
from canal_client.spark.schema import TypedTable, describe_change, shape_of
from canal_client.wire import gc_paused
from canal_protocol.entry import is_binary_type
from canal_protocol.errors import SchemaChanged, UnexpectedResponse

__all__ = ["RowsBuilder", "record_batch", "record_batches", "time_micros"]

_TOP = (
    "schema", "table", "event_type", "is_ddl", "sql", "gtid", "logfile", "offset",
    "row_index", "server_id", "commit_ts", "part", "snapshot",
)  # fmt: skip
_TIME = re.compile(r"^(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")
_ZERO_DATE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)")


def time_micros(text: str) -> int:
    """``[-]HHH:MM:SS[.ffffff]`` (MariaDB TIME) as signed microseconds."""
    m = _TIME.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a TIME value")
    sign, h, mi, s, frac = m.groups()
    micros = ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1_000_000 + int((frac or "0").ljust(6, "0"))
    return -micros if sign else micros


def _is_zero_date(text: str) -> bool:
    m = _ZERO_DATE.match(text)
    return m is not None and (m.group(1) == "0000" or m.group(2) == "00" or m.group(3) == "00")


def _castable(text: str, to: pa.DataType) -> bool:
    try:
        pa.array([text], pa.string()).cast(to)
    except pa.ArrowInvalid:
        return False
    return True


class _Images:
    """The ``before``/``after`` columns of a partition (map or struct)."""

    def add(self, cols: Any, before: Sequence[Any], after: Sequence[Any], n: int) -> None:
        raise NotImplementedError

    def add_null(self, n: int) -> None:
        raise NotImplementedError

    def arrays(self, types: tuple[pa.DataType, pa.DataType]) -> tuple[pa.Array, pa.Array]:
        raise NotImplementedError


_INT_TYPES = re.compile(r"^(tiny|small|medium|big)?int( unsigned)?$|^year$|^bit\((\d+)\)$")
_STR_TYPES = re.compile(
    r"^(var)?char\(|^(tiny|medium|long)?text$|^enum\(|^set\(|^decimal\(|^date$|^(date)?time"
    r"|^timestamp"
)


def _text_way(mysql_type: str) -> pa.DataType | str:
    """How a column's values become map text: an Arrow type to cast from, or ``b64``/
    ``py`` (Python, ``value_text``)."""
    m = _INT_TYPES.match(mysql_type)
    if m:
        wide = "unsigned" in mysql_type or (m.group(3) is not None and int(m.group(3)) == 64)
        return pa.uint64() if wide else pa.int64()
    if _STR_TYPES.match(mysql_type):
        return pa.string()
    return "b64" if is_binary_type(mysql_type) else "py"


def _b64_column(values: Sequence[Any]) -> pa.Array:
    """Base64 text of binary values (``TypeError`` for a value of another type)."""
    b2a = binascii.b2a_base64
    try:  # no NULL: one C call a value, the newline it adds cut off by Arrow
        lines = pa.array(list(map(b2a, values)), pa.binary())
        return pc.binary_slice(lines, 0, -1).cast(pa.string())
    except TypeError:
        encoded = [None if v is None else b2a(v, newline=False) for v in values]
        return pa.array(encoded, pa.binary()).cast(pa.string())


def _column_text(values: Sequence[Any], way: pa.DataType | str) -> pa.Array:
    """One column's values as text (``value_text``'s), computed by Arrow where it can."""
    try:
        if isinstance(way, pa.DataType):
            array = pa.array(values, way)
            return array if way == pa.string() else array.cast(pa.string())
        if way == "b64":  # base64 as bytes, made text by Arrow (ASCII: valid UTF-8)
            return _b64_column(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass  # not of the declared type: value by value
    return pa.array([value_text(v) for v in values], pa.string())


_ARANGE: list[pa.Array] = [pa.array([], pa.int64())]


def _arange(n: int) -> pa.Array:
    """0, 1, …, n - 1 (int64), a slice of one cached array."""
    if len(_ARANGE[0]) < n:
        _ARANGE[0] = pa.array(range(max(n, 2 * len(_ARANGE[0]))), pa.int64())
    return _ARANGE[0].slice(0, n)


def _row_major(rows: int, width: int) -> tuple[pa.Array, pa.Array]:
    """The row and the column of each value of ``rows`` rows of ``width`` values, row
    after row."""
    i = _arange(rows * width)
    row = pc.divide(i, width)  # integer division
    return row, pc.subtract(i, pc.multiply(row, width))


def _concat(chunks: list[pa.Array], type: pa.DataType) -> pa.Array:
    return pa.concat_arrays(chunks) if chunks else pa.array([], type)


_JSON_ESCAPE = r'[\x00-\x1f"\\]'  # what json.dumps(ensure_ascii=False) escapes


def _json_texts(texts: pa.Array) -> pa.Array:
    """Each text as a JSON string (``json.dumps``), null as ``null``."""
    if pc.any(pc.match_substring_regex(texts, _JSON_ESCAPE)).as_py():
        quoted = [json.dumps(t, ensure_ascii=False) for t in texts.fill_null("").to_pylist()]
        return pc.if_else(pc.is_null(texts), "null", pa.array(quoted, pa.string()))
    return pc.if_else(pc.is_null(texts), "null", pc.binary_join_element_wise('"', texts, '"', ""))


class _Layout:
    """The row images of one side with one table map (names, types), gathered over a
    partition column by column and converted once."""

    def __init__(self, names: tuple[str, ...], types: tuple[str, ...], keys: Any) -> None:
        self.names, self.keys = names, tuple(bool(k) for k in keys)
        self.ways = [_text_way(t) for t in types]
        self.columns: list[list[Any]] = [[] for _ in names]
        self.rows = 0

    def add(self, images: Sequence[Sequence[Any]]) -> int:
        """Gather ``images``; the layout row of the first one."""
        for column, values in zip(self.columns, zip(*images, strict=True), strict=True):
            column.extend(values)
        first, self.rows = self.rows, self.rows + len(images)
        return first

    def texts(self) -> list[pa.Array]:
        return [_column_text(c, w) for c, w in zip(self.columns, self.ways, strict=True)]

    def key_texts(self, texts: list[pa.Array]) -> pa.Array:
        """``primary_key`` of every row: compact JSON of the key columns' map text."""
        idx = [i for i, k in enumerate(self.keys) if k]
        return _key_json([self.names[i] for i in idx], [texts[i] for i in idx], self.rows)


def _key_json(names: Sequence[str], texts: Sequence[pa.Array], rows: int) -> pa.Array:
    """``{"name":"text",...}`` of the key columns' texts (null text: ``null``); null
    rows without key columns."""
    if not names:
        return pa.nulls(rows, pa.string())
    parts: list[Any] = ["{"]
    for n, (name, text) in enumerate(zip(names, texts, strict=True)):
        parts += [("," if n else "") + json.dumps(name, ensure_ascii=False) + ":"]
        parts.append(_json_texts(text))
    return pc.binary_join_element_wise(*parts, "}", "")


class _MapImages(_Images):
    """Map mode: each image a map of column name → text. Values are gathered per side
    and table map (``_Layout``) over the whole partition, converted to text by Arrow
    once per column, then put in row order by one ``take``."""

    def __init__(self) -> None:
        self.layouts: dict[tuple[int, Any, Any, Any], _Layout] = {}
        # per side: (layout, first layout row, images) of each non-null image run
        self.runs: tuple[list[tuple[_Layout, int, int]], list[tuple[_Layout, int, int]]] = (
            [],
            [],
        )
        self.offsets: tuple[list[int], list[int]] = ([0], [0])
        self.nulls: tuple[list[bool], list[bool]] = ([], [])
        self.primary: list[tuple[_Layout, int, int] | int] = []  # a run, or n nulls

    def add(self, cols: Any, before: Sequence[Any], after: Sequence[Any], n: int) -> None:
        names, types, keys = cols["names"], cols["mysql_types"], cols["keys"]
        for side, images in enumerate((before, after)):
            offsets, nulls = self.offsets[side], self.nulls[side]
            if not images:
                offsets.extend([offsets[-1]] * n)
                nulls.extend([True] * n)
                continue
            layout = self.layouts.get((side, names, types, keys))
            if layout is None:
                layout = self.layouts[(side, names, types, keys)] = _Layout(names, types, keys)
            run = (layout, layout.add(images), len(images))
            runs = self.runs[side]
            if runs and runs[-1][0] is layout:  # the run goes on (rows are contiguous)
                runs[-1] = (layout, runs[-1][1], runs[-1][2] + run[2])
            else:
                runs.append(run)
            if side == 1 or not after:  # a DELETE's key: its before image
                self.primary.append(run)
            last, width = offsets[-1], len(names)
            offsets.extend(range(last + width, last + width * (len(images) + 1), width))
            nulls.extend([False] * n)

    def add_null(self, n: int) -> None:
        for side in (0, 1):
            self.offsets[side].extend([self.offsets[side][-1]] * n)
            self.nulls[side].extend([True] * n)
        self.primary.append(n)

    def _converted(self) -> dict[int, tuple[int, list[pa.Array]]]:
        """Each layout's column texts, and where they start in the concatenation of all."""
        out, base = {}, 0
        for layout in self.layouts.values():
            out[id(layout)] = (base, layout.texts())
            base += layout.rows * len(layout.names)
        return out

    def arrays(self, types: tuple[pa.DataType, pa.DataType]) -> tuple[pa.Array, pa.Array]:
        converted = self._converted()
        chunks = [c for _, texts in converted.values() for c in texts]
        every = pa.concat_arrays(chunks) if chunks else pa.array([], pa.string())
        self._keys = self._primary_keys(converted)
        out = []
        for side in (0, 1):
            keys: list[pa.Array] = []
            take: list[pa.Array] = []
            for layout, first, count in self.runs[side]:
                base, _ = converted[id(layout)]
                rows, column = _row_major(count, len(layout.names))
                # layout row first + r, column c: base + c * layout.rows + first + r
                start = pc.add(rows, base + first)
                take.append(pc.add(pc.multiply(column, layout.rows), start))
                keys.append(pa.array(layout.names, pa.string()).take(column))
            out.append(
                pa.MapArray.from_arrays(
                    pa.array(self.offsets[side], pa.int32()),
                    _concat(keys, pa.string()),
                    every.take(_concat(take, pa.int64())),
                    type=types[side],
                    mask=pa.array(self.nulls[side], pa.bool_()),
                )
            )
        return out[0], out[1]

    def _primary_keys(self, converted: dict[int, tuple[int, list[pa.Array]]]) -> pa.Array:
        texts: dict[int, pa.Array] = {}
        chunks: list[pa.Array] = []
        for run in self.primary:
            if isinstance(run, int):
                chunks.append(pa.nulls(run, pa.string()))
                continue
            layout, first, count = run
            if id(layout) not in texts:
                texts[id(layout)] = layout.key_texts(converted[id(layout)][1])
            chunks.append(texts[id(layout)].slice(first, count))
        return pa.concat_arrays(chunks) if chunks else pa.array([], pa.string())

    def primary_keys(self) -> pa.Array:
        return self._keys


class _StructImages(_Images):
    def __init__(self, table: TypedTable) -> None:
        self.table = table
        width = len(table.columns)
        self.values: tuple[list[list[Any]], list[list[Any]]] = (
            [[] for _ in range(width)],
            [[] for _ in range(width)],
        )
        self.nulls: tuple[list[bool], list[bool]] = ([], [])
        self.raw: dict[int, list[tuple[str, str]]] = {}  # row -> (side.column, text)
        self._shapes: dict[tuple[Any, Any], bool] = {}

    def _check(self, cols: Any, where: str) -> None:
        names, types = tuple(cols["names"]), tuple(cols["mysql_types"])
        ok = self._shapes.get((names, types))
        if ok is None:
            ok = self._shapes[(names, types)] = shape_of(names, types) == self.table.shape
        if not ok:
            change = describe_change(self.table.shape, shape_of(names, types), types)
            raise SchemaChanged(
                f"{self.table.full_name} at {where}: {change}; restart the query from its "
                "checkpoint to read the table's new columns"
            )

    def add(self, cols: Any, before: Sequence[Any], after: Sequence[Any], n: int) -> None:
        for side, images in enumerate((before, after)):
            columns, nulls = self.values[side], self.nulls[side]
            if images:
                for column, values in zip(columns, zip(*images, strict=True), strict=True):
                    column.extend(values)
                nulls.extend([False] * n)
            else:
                empty = [None] * n
                for column in columns:
                    column.extend(empty)
                nulls.extend([True] * n)

    def add_null(self, n: int) -> None:
        self.add({}, (), (), n)

    def arrays(self, types: tuple[pa.DataType, pa.DataType]) -> tuple[pa.Array, pa.Array]:
        out = []
        for side, label in ((0, "before"), (1, "after")):
            struct: pa.StructType = types[side]
            pairs = enumerate(zip(self.table.columns, self.values[side], strict=True))
            children = [
                self._convert(values, c.kind, struct.field(i).type, f"{label}.{c.name}")
                for i, (c, values) in pairs
            ]
            fields = [struct.field(i) for i in range(struct.num_fields)]
            mask = pa.array(self.nulls[side], pa.bool_())
            out.append(pa.StructArray.from_arrays(children, fields=fields, mask=mask))
        return out[0], out[1]

    def _convert(self, values: list[Any], kind: str, to: pa.DataType, label: str) -> pa.Array:
        try:
            if kind in ("date", "datetime", "timestamp"):
                return self._temporal(values, to, label)
            if kind == "u64":
                return pa.array(values, pa.uint64()).cast(to)
            if kind.startswith("decimal("):
                return pa.array(values, pa.string()).cast(to)
            if kind == "time":
                micros = [None if v is None else time_micros(v) for v in values]
                return pa.array(micros, to)
            if kind == "set":
                members = [None if v is None else (v.split(",") if v else []) for v in values]
                return pa.array(members, to)
            return pa.array(values, to)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError) as exc:
            raise UnexpectedResponse(
                f"{self.table.full_name} {label}: a value does not fit {to} ({exc})"
            ) from None

    def _temporal(self, values: list[Any], to: pa.DataType, label: str) -> pa.Array:
        texts = pa.array(values, pa.string())
        try:
            return texts.cast(to)
        except pa.ArrowInvalid:
            pass
        kept: list[Any] = []
        for row, v in enumerate(values):
            if v is not None and (_is_zero_date(v) or not _castable(v, to)):
                self.raw.setdefault(row, []).append((label, v))
                kept.append(None)
            else:
                kept.append(v)
        return pa.array(kept, pa.string()).cast(to)

    def key_texts(self, runs: list[tuple[Any, int, int]]) -> pa.Array:
        """``primary_key`` of every row (``RowsBuilder.key_runs``: per run of rows the
        table map of its key image, or None for DDL, and that image's side): compact
        JSON of the key columns' text (as map mode's ``_Layout.key_texts``), by Arrow."""
        layouts = {layout for layout, _, _ in runs if layout is not None}
        if len(layouts) > 1:  # the key changed inside the partition: run by run
            return pa.concat_arrays([self._run_keys(runs, i) for i in range(len(runs))])
        rows = sum(n for _, _, n in runs)
        if not layouts:
            return pa.nulls(rows, pa.string())
        names, types, keys = layouts.pop()
        before: list[bool] = []
        for _, side, n in runs:
            before.extend([side == 0] * n)
        mask = pa.array(before, pa.bool_())
        idx = [i for i, k in enumerate(keys) if k]
        texts = [
            pc.if_else(
                mask, *(_column_text(self.values[s][i], _text_way(types[i])) for s in (0, 1))
            )
            for i in idx
        ]
        out = _key_json([names[i] for i in idx], texts, rows)
        if all(layout is not None for layout, _, _ in runs):
            return out
        ddl: list[bool] = []
        for layout, _, n in runs:
            ddl.extend([layout is None] * n)
        return pc.if_else(pa.array(ddl, pa.bool_()), pa.scalar(None, pa.string()), out)

    def _run_keys(self, runs: list[tuple[Any, int, int]], k: int) -> pa.Array:
        layout, side, n = runs[k]
        if layout is None:
            return pa.nulls(n, pa.string())
        row, (names, types, keys) = sum(r[2] for r in runs[:k]), layout
        idx = [i for i, key in enumerate(keys) if key]
        texts = [
            _column_text(self.values[side][i][row : row + n], _text_way(types[i])) for i in idx
        ]
        return _key_json([names[i] for i in idx], texts, n)

    def raw_array(self, rows: int, to: pa.DataType) -> pa.Array:
        if not self.raw:  # the common case: every value fit
            return pa.nulls(rows, to)
        return pa.array([self.raw.get(i) for i in range(rows)], to)


class RowsBuilder:
    """The rows of a partition, gathered column by column (see the module docstring)."""

    def __init__(self, schema: pa.Schema, table: TypedTable | None = None) -> None:
        self.schema = schema
        self.table = table
        self.top: dict[str, list[Any]] = {name: [] for name in _TOP if name != "row_index"}
        self.row_index: list[int] = []
        self.entry_of_row: list[int] = []  # the entry (index into ``top``) of each row
        # typed mode, per run of rows: (names, types, keys) of the key image, or None
        # (DDL), the side of the key image (a DELETE's: its before image), rows
        self.key_runs: list[tuple[Any, int, int]] = []
        self.images: _Images = _StructImages(table) if table is not None else _MapImages()
        self.rows = 0

    def _wants(self, header: Any) -> bool:
        t = self.table
        return t is None or (header.get("schema") == t.schema and header.get("table") == t.table)

    def _top(self, h: Any, n: int, is_ddl: bool, sql: str | None) -> None:
        """The entry's header fields, once per entry (``finish`` repeats them per row)."""
        top, entry = self.top, len(self.top["offset"])
        for name in ("schema", "table", "event_type", "gtid", "logfile"):
            top[name].append(str(h.get(name, "")))
        top["is_ddl"].append(is_ddl)
        top["sql"].append(sql)
        top["offset"].append(int(h.get("offset", 0)))
        top["part"].append(int(h.get("part", 0) or 0))
        top["snapshot"].append(int(h.get("snapshot", 0) or 0))
        top["server_id"].append(int(h.get("server_id", 0)))
        top["commit_ts"].append(int(h.get("timestamp_ms", 0)) * 1000)
        self.row_index.extend(range(n))
        self.entry_of_row.extend([entry] * n)
        self.rows += n

    def add(self, entry: Any) -> None:
        if entry.get("type") != "ROWDATA":
            return
        h = entry.get("header") or {}
        if not self._wants(h):
            return
        if entry.get("is_ddl"):
            self._top(h, 1, True, str(entry.get("sql") or ""))
            if isinstance(self.images, _StructImages):
                self.key_runs.append((None, 0, 1))
            self.images.add_null(1)
            return
        cols = entry.get("columns")
        before, after = entry.get("before") or (), entry.get("after") or ()
        n = max(len(before), len(after))
        if n == 0 or cols is None:
            return
        if isinstance(self.images, _StructImages):
            self.images._check(cols, f"{h.get('logfile')}:{h.get('offset')}")
            side = 0 if h.get("event_type") == "DELETE" or not after else 1
            layout = (cols["names"], cols["mysql_types"], cols["keys"])
            runs = self.key_runs
            if runs and runs[-1][0] == layout and runs[-1][1] == side:
                runs[-1] = (layout, side, runs[-1][2] + n)
            else:
                runs.append((layout, side, n))
        self._top(h, n, False, None)
        self.images.add(cols, before, after, n)

    def finish(self) -> pa.RecordBatch:
        schema = self.schema
        rows = pa.array(self.entry_of_row, pa.int32())
        named = {
            name: pa.array(self.row_index, schema.field(name).type)
            if name == "row_index"
            else pa.array(self.top[name], schema.field(name).type).take(rows)
            for name in _TOP
        }
        named["before"], named["after"] = self.images.arrays(
            (schema.field("before").type, schema.field("after").type)
        )
        if isinstance(self.images, _MapImages):
            named["primary_key"] = self.images.primary_keys()
        else:
            assert isinstance(self.images, _StructImages)
            named["primary_key"] = self.images.key_texts(self.key_runs)
            named["raw"] = self.images.raw_array(self.rows, schema.field("raw").type)
        return pa.RecordBatch.from_arrays([named[n] for n in schema.names], schema=schema)


def record_batch(
    data: bytes, count: int, schema: pa.Schema, table: TypedTable | None = None
) -> pa.RecordBatch:
    """The rows of ``count`` joined entries (``PackedEntry.data``) as one RecordBatch."""
    builder = RowsBuilder(schema, table)
    for entry in iter_entries(data, count):
        builder.add(entry)
    return builder.finish()


def record_batches(
    data: bytes,
    count: int,
    schema: pa.Schema,
    table: TypedTable | None = None,
    max_rows: int = 250_000,
) -> Iterator[pa.RecordBatch]:
    """The rows of ``count`` joined entries as RecordBatches of whole entries, each ending
    once it holds ``max_rows`` rows or more (none without rows): a large partition decoded
    piece by piece holds fewer Python objects at a time. The cyclic GC is off while a
    piece is decoded (``gc_paused``: its objects hold no cycles; 5-10% faster)."""
    entries = iter_entries(data, count)
    while True:
        with gc_paused():
            builder = RowsBuilder(schema, table)
            for entry in entries:
                builder.add(entry)
                if builder.rows >= max_rows:
                    break
            batch = builder.finish() if builder.rows else None
        if batch is None:
            return
        yield batch
