"""Batches kept as the leader's msgpack bytes (compact layout), indexed without their rows.

``PackedBatch.parse(data)`` reads a compact msgpack batch (docs/api.md, layout
``compact``) the way ``msgpack.Unpacker`` can without making a Python object per row
value: per entry it decodes ``type``, ``header``, ``is_ddl``, ``sql`` and ``columns``
(a few small values), counts the row images from the arrays' headers and skips them
(in C), and keeps where the entry's bytes are (``PackedEntry.data``, a view into the
batch's bytes). The Spark source plans with that index and forwards the entries'
bytes untouched to the executors, which decode them (``canal_client.spark.arrow``).

``PackedBatch.of(batch)`` packs a ``Batch`` model (``Batch.pack_compact``) the same
way: the form of connectors that return models (test fakes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from canal_protocol import Batch
from canal_protocol.errors import UnexpectedResponse
from canal_protocol.positions import LogPosition

__all__ = ["Columns", "PackedBatch", "PackedEntry", "array_length", "iter_entries"]

Columns = tuple[tuple[str, ...], tuple[str, ...], tuple[bool, ...]]  # names, types, keys
_IMAGES = ("before", "after")
_MAX_BUFFER = 1 << 31


def array_length(data: bytes | memoryview, pos: int) -> int:
    """The element count of the msgpack array (or nil: 0) starting at ``data[pos]``."""
    tag = data[pos]
    if 0x90 <= tag <= 0x9F:
        return tag & 0x0F
    if tag == 0xDC:
        return int.from_bytes(data[pos + 1 : pos + 3], "big")
    if tag == 0xDD:
        return int.from_bytes(data[pos + 1 : pos + 5], "big")
    if tag == 0xC0:
        return 0
    raise UnexpectedResponse(f"a row image list is not a msgpack array (tag {tag:#x})")


@dataclass(frozen=True)
class PackedEntry:
    """One entry of a packed batch: its small fields decoded, its bytes as they came."""

    type: str
    header: Mapping[str, Any]
    is_ddl: bool
    sql: str
    columns: Columns | None
    rows: int  # row images per side (an UPDATE has as many before as after images)
    data: memoryview  # the entry's msgpack (a map)

    @property
    def full_name(self) -> str:
        return f"{self.header.get('schema', '')}.{self.header.get('table', '')}"


def _columns(raw: Any) -> Columns | None:
    if not isinstance(raw, Mapping):
        return None
    return (
        tuple(str(n) for n in raw.get("names") or ()),
        tuple(str(t) for t in raw.get("mysql_types") or ()),
        tuple(bool(k) for k in raw.get("keys") or ()),
    )


def _entry(up: msgpack.Unpacker, view: memoryview, known: dict[bytes, Any]) -> PackedEntry:
    """One entry; ``known``: the values of the batch's ``columns`` so far, by their bytes
    (the same table map comes again and again: decoded once)."""
    tell, unpack = up.tell, up.unpack
    begin = tell()
    fields: dict[str, Any] = {}
    rows = 0
    for _ in range(up.read_map_header()):
        key = unpack()
        if key in _IMAGES:
            rows = max(rows, array_length(view, tell()))
            up.skip()
        elif key == "columns":
            at = tell()
            up.skip()
            raw = bytes(view[at : tell()])
            if raw not in known:
                known[raw] = _columns(msgpack.unpackb(raw, raw=False, strict_map_key=False))
            fields[key] = known[raw]
        elif key == "rows":  # the verbose layout: not what the source asks for
            raise UnexpectedResponse("a batch in the `rows` layout; the source needs `compact`")
        else:
            fields[key] = unpack()
    header = fields.get("header")
    return PackedEntry(
        type=str(fields.get("type", "")),
        header=header if isinstance(header, Mapping) else {},
        is_ddl=bool(fields.get("is_ddl", False)),
        sql=str(fields.get("sql") or ""),
        columns=fields.get("columns"),
        rows=rows,
        data=view[begin : up.tell()],
    )


@dataclass(frozen=True)
class PackedBatch:
    """A batch as the leader's bytes, with the index of its entries."""

    id: int
    entries: tuple[PackedEntry, ...] = ()
    start: LogPosition | None = None
    end: LogPosition | None = None

    @classmethod
    def parse(cls, data: bytes) -> PackedBatch:
        """Index a compact msgpack batch (``UnexpectedResponse`` when it is not one)."""
        view = memoryview(data)
        up = msgpack.Unpacker(
            raw=False, strict_map_key=False, use_list=False,
            max_buffer_size=max(len(data), _MAX_BUFFER),
        )  # fmt: skip
        up.feed(data)
        try:
            found: dict[str, Any] = {}
            known: dict[bytes, Any] = {}
            for _ in range(up.read_map_header()):
                key = up.unpack()
                if key == "entries":
                    count = up.read_array_header()
                    found[key] = tuple(_entry(up, view, known) for _ in range(count))
                else:
                    found[key] = up.unpack()
        except (ValueError, msgpack.UnpackException, msgpack.OutOfData) as exc:
            raise UnexpectedResponse(f"undecodable batch: {exc}") from exc
        start, end = found.get("start"), found.get("end")
        return cls(
            int(found.get("id", -1)),
            found.get("entries", ()),
            LogPosition.from_dict(start) if isinstance(start, dict) else None,
            LogPosition.from_dict(end) if isinstance(end, dict) else None,
        )

    @classmethod
    def of(cls, batch: Batch) -> PackedBatch:
        """A ``Batch`` model packed and indexed (connectors that return models)."""
        if batch.id < 0 or not batch.entries:
            return cls(batch.id)
        return cls.parse(batch.pack_compact())


def iter_entries(data: bytes, count: int) -> Iterator[dict[str, Any]]:
    """The ``count`` entries (dicts, arrays as tuples) of joined entry bytes."""
    up = msgpack.Unpacker(
        raw=False, strict_map_key=False, use_list=False,
        max_buffer_size=max(len(data), _MAX_BUFFER),
    )  # fmt: skip
    up.feed(data)
    for _ in range(count):
        yield up.unpack()
