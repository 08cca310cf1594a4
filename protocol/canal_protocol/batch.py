"""A batch (Canal's Message) and its msgpack/JSON forms.

``{"id", "entries", "start", "end"}``; when nothing arrived, ``{"id": -1, "entries": []}``.
``start``/``end`` are ``LogPosition`` dicts (``{"identity", "position"}``). The entries are
in the default layout (``rows``) or, with ``compact``, the compact one (see
``canal_protocol.entry``).

``pack_compact`` is the msgpack of the compact layout made by joining each entry's own
bytes: rows that already exist as msgpack (``PrePacked``: the server keeps the C
decoder's output) are joined in as they are, without a Python object per value.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgpack

from canal_protocol.entry import Entry, EntryType
from canal_protocol.positions import LogPosition

__all__ = ["EMPTY_BATCH_ID", "PIECE_BYTES", "Batch", "PrePacked", "pack_compact_entry"]

EMPTY_BATCH_ID = -1
# ``pack_compact_pieces``: about this many bytes a piece. A batch of thousands of rows is
# megabytes; one buffer of that size is a fresh mmap on each get whose batch outgrows the
# last one freed (~2,000 page faults, ~3.5 ms for 8 MiB). Pieces this size are reused.
PIECE_BYTES = 1 << 20


@runtime_checkable
class PrePacked(Protocol):
    """Rows whose compact form exists as msgpack: ``columns``, ``before``, ``after``."""

    def packed_parts(self) -> tuple[bytes, bytes, bytes]: ...


_PACKER = msgpack.Packer(use_bin_type=True)
_KEYS = {
    k: _PACKER.pack(k) for k in ("type", "header", "is_ddl", "sql", "columns", "before", "after")
}
_TYPES = {t: _PACKER.pack(t.value) for t in EntryType}  # ``type`` and its value, packed once


class _Packers(threading.local):
    """A msgpack Packer per thread (``msgpack.packb`` makes one per call)."""

    def __init__(self) -> None:
        self.pack = msgpack.Packer(use_bin_type=True).pack


_PACKERS = _Packers()


def pack_compact_entry(entry: Entry) -> bytes:
    """msgpack of ``entry.to_compact_wire()`` (byte for byte), pre-packed rows joined in."""
    # duck-typed on purpose: isinstance() against a runtime_checkable Protocol walks the
    # protocol's members on every call (a third of the event loop's time at 1,000 tx/s)
    pack = _PACKERS.pack
    packed_parts = getattr(entry.images, "packed_parts", None)
    if packed_parts is None:
        return bytes(pack(entry.to_compact_wire()))
    columns, before, after = packed_parts()
    keys = _KEYS
    return b"".join((
        b"\x87", keys["type"], _TYPES[entry.type],
        keys["header"], pack(entry.header.to_wire()),
        keys["is_ddl"], pack(entry.is_ddl), keys["sql"], pack(entry.sql),
        keys["columns"], columns, keys["before"], before, keys["after"], after,
    ))  # fmt: skip


@dataclass(frozen=True)
class Batch:
    """A batch (Canal's Message): id, entries and the position range it covers;
    ``id == -1`` and no entries when nothing arrived."""

    id: int
    entries: Sequence[Entry] = field(default_factory=list)
    start: LogPosition | None = None
    end: LogPosition | None = None

    @classmethod
    def empty(cls) -> Batch:
        return cls(EMPTY_BATCH_ID)

    @property
    def is_empty(self) -> bool:
        return self.id == EMPTY_BATCH_ID or not self.entries

    def _ranged(self) -> dict[str, Any]:
        if self.start is None or self.end is None:
            return {}
        return {"start": self.start.to_dict(), "end": self.end.to_dict()}

    def to_wire(self, binary_as_base64: bool = False, compact: bool = False) -> dict[str, Any]:
        """The wire dict; ``compact``: entries in the compact layout (bytes stay bytes:
        a JSON encoder base64s them)."""
        entries = (
            [e.to_compact_wire() for e in self.entries]
            if compact
            else [e.to_wire(binary_as_base64) for e in self.entries]
        )
        return {"id": self.id, "entries": entries, **self._ranged()}

    def to_json_wire(self) -> dict[str, Any]:
        return self.to_wire(binary_as_base64=True)

    def pack_compact(self, pack_entry: Callable[[Entry], bytes] = pack_compact_entry) -> bytes:
        """msgpack of ``to_wire(compact=True)``, joined from each entry's bytes (one
        piece without a size bound: joined once, not joined again)."""
        (whole,) = self.pack_compact_pieces(pack_entry, piece_bytes=sys.maxsize)
        return whole

    def pack_compact_pieces(
        self,
        pack_entry: Callable[[Entry], bytes] = pack_compact_entry,
        piece_bytes: int = PIECE_BYTES,
    ) -> list[bytes]:
        """``pack_compact``'s bytes in pieces of whole entries, each about ``piece_bytes``
        or less (one entry larger than that is a piece of its own): a sender writes them
        one after the other, with no copy of the whole batch in one buffer."""
        ranged = self._ranged()
        packer = msgpack.Packer(use_bin_type=True)
        head = [
            packer.pack_map_header(2 + len(ranged)),
            packer.pack("id"),
            packer.pack(self.id),
            packer.pack("entries"),
            packer.pack_array_header(len(self.entries)),
        ]
        tail = []
        for key, value in ranged.items():
            tail += [packer.pack(key), packer.pack(value)]
        pieces: list[bytes] = []
        piece, size = head, 0
        for entry in self.entries:
            packed = pack_entry(entry)
            if size and size + len(packed) > piece_bytes:
                pieces.append(b"".join(piece))
                piece, size = [], 0
            piece.append(packed)
            size += len(packed)
        pieces.append(b"".join(piece + tail))
        return pieces

    @classmethod
    def from_wire(cls, d: dict[str, Any], binary_as_base64: bool = False) -> Batch:
        """Either layout; ``binary_as_base64``: a JSON body."""
        start, end = d.get("start"), d.get("end")
        return cls(
            int(d["id"]),
            [Entry.from_wire(e, binary_as_base64) for e in d.get("entries") or ()],
            LogPosition.from_dict(start) if start else None,
            LogPosition.from_dict(end) if end else None,
        )
