"""Row decoding's one entry point: rows events → ``PackedRows`` / ``RowImages``: the C
decoder writing msgpack, the fast specialised decoder, or the generic path (the
reference decoder, ``decoding``, a leaf).

One ``RowsDecoder`` per binlog dump keeps, per table id, what the table map says
(the mysql-replication column list it was built from) and the decoder made for it:
a ``rowcodec.TableCodec`` (per-table specialised, C or generated Python) when every
column type has one, else ``decoding``'s generic path over the library's row dicts.
A table map of another shape under the same id (ALTER TABLE) makes a new decoder.

With the C extension a rows event's images are written straight as msgpack
(``PackedRows``: no Python object per value, the GIL released while it works);
``decode`` tuples are made where that cannot be (a charset needing Python, a value
only the reference decodes). Events the fast path does not take
(``rowcodec.rows_body`` says None: a partial JSON update, an image without every
column) go the generic way too, so nothing is dropped; ``fast_events`` (of them
``packed_events`` as msgpack) and ``generic_events`` count which way events went.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from canal_protocol.entry import RowImages, TableColumns
from canal_server.packed import PackedRows, pack_columns
from canal_server.parse import rowcodec
from canal_server.parse.decoding import ColumnSpec, column_specs, row_images, table_columns

__all__ = ["RowsDecoder"]

_SIDE: dict[str, rowcodec.Side] = {"INSERT": "after", "DELETE": "before"}


@dataclass
class _Table:
    columns: Any  # the table map's column list this entry was built from
    codec: rowcodec.TableCodec | None
    meta: TableColumns
    specs: tuple[ColumnSpec, ...] | None  # the generic path's, made when first needed


class RowsDecoder:
    """Decodes the rows of rows events; see the module doc."""

    def __init__(self, fast: bool = True, pack: bool = True) -> None:
        self._fast = fast
        self._pack = pack
        self._tables: dict[int, _Table] = {}
        self.fast_events = 0
        self.packed_events = 0
        self.generic_events = 0

    def decode(self, ev: Any, kind: str) -> RowImages | PackedRows:
        """The rows of ``ev`` (a rows event of ``kind`` INSERT, UPDATE or DELETE)."""
        table = self._table(ev)
        body = rowcodec.rows_body(ev) if table.codec is not None else None
        if body is None or table.codec is None:
            self.generic_events += 1
            if table.specs is None:
                table.specs = column_specs(ev.columns)
            return row_images(kind, table.specs, table.meta, ev.rows)
        self.fast_events += 1
        data, pos, end = body
        packed = self._packed(table, body, kind)
        if packed is not None:
            return packed
        if kind == "UPDATE":
            pairs = table.codec.decode(data, pos, end, 2)
            return RowImages(table.meta, tuple(pairs[0::2]), tuple(pairs[1::2]))
        images = tuple(table.codec.decode(data, pos, end, 1))
        if kind == "INSERT":
            return RowImages(table.meta, after=images)
        return RowImages(table.meta, images)

    def _packed(self, table: _Table, body: tuple[bytes, int, int], kind: str) -> PackedRows | None:
        """The rows as the C decoder writes them (msgpack, no Python objects), or None."""
        codec = table.codec
        if not self._pack or codec is None or not codec.packable:
            return None
        data, pos, end = body
        per_row: int = 2 if kind == "UPDATE" else 1
        side: rowcodec.Side = _SIDE.get(kind, "after")
        out = codec.decode_packed(data, pos, end, per_row, side)
        if out is None:
            return None
        rows, before, after = out
        self.packed_events += 1
        return PackedRows(table.meta, rows, before, after, pack_columns(table.meta))

    def _table(self, ev: Any) -> _Table:
        """What we know of ev's table. The library makes new column objects at every
        table map (every transaction); ``table_codec`` gives the same codec for the
        same columns, so the metadata is kept then."""
        cached = self._tables.get(ev.table_id)
        if cached is not None and cached.columns is ev.columns:
            return cached
        codec = rowcodec.table_codec(ev.columns) if self._fast else None
        if cached is not None and codec is not None and cached.codec is codec:
            cached.columns = ev.columns
            return cached
        if codec is not None:
            meta, specs = TableColumns(codec.names, codec.mysql_types, codec.keys), None
        else:
            specs = column_specs(ev.columns)
            meta = table_columns(specs)
        table = _Table(ev.columns, codec, meta, specs)
        self._tables[ev.table_id] = table
        return table
