"""The compact row model: RowImages → Canal's Column view, and both wire layouts."""

from __future__ import annotations

import base64
import json

import msgpack

from canal_protocol.batch import Batch, pack_compact_entry
from canal_protocol.batch import Batch as ClientBatch
from canal_protocol.entry import (
    Column,
    Entry,
    EntryType,
    EventType,
    Header,
    RowChange,
    RowImages,
    TableColumns,
)
from canal_protocol.positions import LogPosition
from canal_server.packed import PackedRows

COLS = TableColumns(("id", "b", "s"), ("int", "varbinary(4)", "varchar(8)"), (True, False, False))


def _entry(kind: EventType, images: RowImages | PackedRows, offset: int = 4) -> Entry:
    header = Header("bin.000001", offset, offset + 50, 1, 1000, "0-1-1", "db", "t", kind)
    return Entry(EntryType.ROWDATA, header, images=images)


def test_changes_follow_canal_updated_and_null_rules() -> None:
    insert = RowImages(COLS, after=((1, b"\x00", None),))
    delete = RowImages(COLS, before=((1, b"\x00", "x"),))
    update = RowImages(COLS, before=((1, b"\x00", None),), after=((1, b"\x01", None),))
    (ins,) = insert.changes()
    assert ins.before == () and [c.updated for c in ins.after] == [True, True, True]
    assert ins.after[2] == Column("s", None, False, True, "varchar(8)", True)
    (dele,) = delete.changes()
    assert dele.after == () and not any(c.updated for c in dele.before)
    (upd,) = update.changes()
    assert [c.updated for c in upd.before] == [False, False, False]
    assert [c.updated for c in upd.after] == [False, True, False]
    assert [c.is_key for c in upd.after] == [True, False, False]
    assert len(update) == 1 and _entry(EventType.UPDATE, update).row_count == 1


def test_from_changes_is_the_inverse_of_changes() -> None:
    update = RowImages(
        COLS, before=((1, b"a", "x"), (2, b"b", None)), after=((1, b"c", "x"), (2, b"b", "y"))
    )
    again = RowImages.from_changes(update.changes())
    assert again == update
    assert RowImages.from_changes([]) is None
    assert RowImages.from_changes([RowChange((), ())]) is not None


def test_both_layouts_give_the_client_the_same_entries() -> None:
    update = RowImages(COLS, before=((7, b"\xff\x00", None),), after=((7, b"\x01", "z"),))
    entries = (
        _entry(EventType.INSERT, RowImages(COLS, after=((7, b"\xff\x00", None),))),
        _entry(EventType.UPDATE, update, 100),
        Entry(EntryType.TRANSACTIONEND, Header("bin.000001", 200, 231, 1, 1000)),
    )
    batch = Batch(3, entries)
    views = []
    for compact in (False, True):
        packed = msgpack.unpackb(msgpack.packb(batch.to_wire(compact=compact), use_bin_type=True))
        views.append(ClientBatch.from_wire(packed))
        text = json.dumps(batch.to_wire(True, compact=compact), default=_b64)
        views.append(ClientBatch.from_wire(json.loads(text), binary_as_base64=True))
    rows = [[(e.header, e.rows) for e in v.entries] for v in views]
    assert rows[0] == rows[1] == rows[2] == rows[3]
    assert rows[0][1][1][0].after[1].value == b"\x01"
    server_side = [Entry.from_wire(e.to_wire()) for e in views[3].entries]
    assert [e.rows for e in server_side] == [e.rows for e in entries]


def _b64(value: object) -> str:
    assert isinstance(value, bytes)
    return base64.b64encode(value).decode("ascii")


def _packed(images: RowImages) -> PackedRows:
    def pack(rows: tuple[tuple[object, ...], ...]) -> bytes:
        return bytes(msgpack.packb(rows, use_bin_type=True))

    return PackedRows(images.columns, len(images), pack(images.before), pack(images.after))


def test_packed_rows_read_and_encode_like_their_images() -> None:
    images = RowImages(COLS, before=((1, b"\x00", None),), after=((1, b"\x01", "\u00e9"),))
    plain, packed = _entry(EventType.UPDATE, images), _entry(EventType.UPDATE, _packed(images))
    assert pack_compact_entry(packed) == pack_compact_entry(plain)
    assert packed.row_count == 1 and packed.rows == plain.rows
    assert packed.to_wire() == plain.to_wire()
    insert = RowImages(COLS, after=((2, b"", "x"), (3, None, None)))
    assert pack_compact_entry(_entry(EventType.INSERT, _packed(insert))) == (
        pack_compact_entry(_entry(EventType.INSERT, insert))
    )
    batch = Batch(9, (plain, _entry(EventType.INSERT, _packed(insert), 80)))
    assert msgpack.unpackb(batch.pack_compact()) == msgpack.unpackb(
        msgpack.packb(batch.to_wire(compact=True), use_bin_type=True)
    )


def test_compact_pieces_join_to_the_whole_and_split_between_entries() -> None:
    """``pack_compact_pieces``: whole entries per piece, each piece at most the size
    asked (an entry alone may exceed it), joined byte for byte ``pack_compact``."""
    entries = [
        _entry(EventType.INSERT, _packed(RowImages(COLS, after=((i, b"x" * i, "s"),))), 4 + i)
        for i in range(40)
    ]
    start = LogPosition.from_dict({"position": {"journal": "bin.000001", "offset": 4}})
    for batch in (Batch(3, entries, start, start), Batch(4, entries[:1]), Batch.empty()):
        whole = batch.pack_compact()
        sizes = [len(pack_compact_entry(e)) for e in batch.entries]
        limit = max(sizes, default=1) * 3
        pieces = batch.pack_compact_pieces(piece_bytes=limit)
        assert b"".join(pieces) == whole
        assert len(pieces) >= max(1, len(batch.entries) // 3)
        assert all(len(p) <= limit + 64 for p in pieces)  # 64: the map's head and tail
    one = Batch(5, entries[:3]).pack_compact_pieces(piece_bytes=1)
    assert len(one) == 3 and b"".join(one) == Batch(5, entries[:3]).pack_compact()
