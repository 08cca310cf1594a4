"""canal-ha's wire model (Canal's protocol module), shared by server and client.

Positions, entries, row images, table columns and batches, with their msgpack/JSON
forms, defined once; and the one exception tree. Depends on msgpack only. The layouts
are described in docs/api.md.
"""

from canal_protocol.batch import EMPTY_BATCH_ID, Batch, PrePacked, pack_compact_entry
from canal_protocol.entry import (
    Column,
    Entry,
    EntryType,
    EventType,
    Header,
    Image,
    RowChange,
    RowImages,
    Rows,
    TableColumns,
    Value,
    images_from_wire,
)
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition, min_position

__all__ = [
    "EMPTY_BATCH_ID",
    "Batch",
    "Column",
    "Entry",
    "EntryPosition",
    "EntryType",
    "EventType",
    "Header",
    "Image",
    "LogIdentity",
    "LogPosition",
    "PrePacked",
    "RowChange",
    "RowImages",
    "Rows",
    "TableColumns",
    "Value",
    "images_from_wire",
    "min_position",
    "pack_compact_entry",
]
