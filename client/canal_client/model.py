"""Compatibility: the wire model moved to ``canal_protocol`` (one definition, shared with
the server). ``Position`` is ``canal_protocol.LogPosition`` (its fields read flat too:
``batch.end.offset``)."""

from canal_protocol import (
    EMPTY_BATCH_ID,
    Batch,
    Column,
    Entry,
    EntryType,
    Header,
    Image,
    RowChange,
    RowImages,
    TableColumns,
    Value,
    images_from_wire,
)
from canal_protocol import LogPosition as Position

__all__ = [
    "EMPTY_BATCH_ID",
    "Batch",
    "Column",
    "Entry",
    "EntryType",
    "Header",
    "Image",
    "Position",
    "RowChange",
    "RowImages",
    "TableColumns",
    "Value",
    "images_from_wire",
]
