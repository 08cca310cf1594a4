"""``PackedRows``: a rows event's rows as the C decoder wrote them (the server's form).

The wire model (``canal_protocol``) knows rows as ``RowImages``; the server keeps what
the C decoder wrote, msgpack bytes with no Python object per value, and makes the value
tuples only when something asks for them (a JSON or ``rows`` layout client, a filter on
values). A compact msgpack batch joins these bytes as they are
(``canal_protocol.batch.pack_compact_entry``). The table's column metadata is packed
once per table map by the parser (``packed_columns``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack

from canal_protocol.entry import Image, RowChange, RowImages, TableColumns

__all__ = ["PackedRows", "pack_columns"]


@functools.lru_cache(maxsize=1024)
def pack_columns(columns: TableColumns) -> bytes:
    """``columns.to_wire()`` as msgpack (made once per table map)."""
    return bytes(msgpack.packb(columns.to_wire(), use_bin_type=True))


@dataclass(frozen=True)
class PackedRows:
    """``packed_before`` / ``packed_after`` are each one msgpack array of value arrays
    (``b"\\x90"`` when empty), byte-identical to packing ``RowImages.before`` /
    ``after``. Reads like a ``RowImages``."""

    columns: TableColumns
    count: int
    packed_before: bytes
    packed_after: bytes
    packed_columns: bytes = b""

    def __len__(self) -> int:
        return self.count

    @cached_property
    def images(self) -> RowImages:
        before = msgpack.unpackb(self.packed_before, raw=False, use_list=False)
        after = msgpack.unpackb(self.packed_after, raw=False, use_list=False)
        return RowImages(self.columns, before, after)

    def decoded(self) -> tuple[tuple[Image, ...], tuple[Image, ...]]:
        """``before`` and ``after``; decoded now and not kept when ``images`` was not
        made (a reader that passes once, the Canal encoder, leaves the store's entries as
        small as they were)."""
        made = self.__dict__.get("images")
        if made is not None:
            return made.before, made.after
        return (
            msgpack.unpackb(self.packed_before, raw=False, use_list=False),
            msgpack.unpackb(self.packed_after, raw=False, use_list=False),
        )

    @property
    def before(self) -> tuple[Image, ...]:
        return self.images.before

    @property
    def after(self) -> tuple[Image, ...]:
        return self.images.after

    def changes(self) -> tuple[RowChange, ...]:
        return self.images.changes()

    def to_compact_wire(self) -> dict[str, Any]:
        return self.images.to_compact_wire()

    def packed_parts(self) -> tuple[bytes, bytes, bytes]:
        """The compact layout's ``columns``, ``before`` and ``after`` as msgpack."""
        columns = self.packed_columns or pack_columns(self.columns)
        return columns, self.packed_before, self.packed_after
