"""Canal's framing and packets: a 4-byte big-endian length, then a ``Packet``.

Both ways every packet is ``len(body)`` as a signed 32-bit big-endian int followed by
the serialized ``Packet`` (Canal's ``NettyUtils.write`` / ``FixedHeaderFrameDecoder``).
A frame from a client is at most ``MAX_FRAME_BYTES`` (Canal has no bound; a client's
packets are small: a login, a filter, a get): a longer or negative length closes the
connection before anything is read or allocated.

The server's packets carry ``version = 1`` (Canal's Java client refuses any other) and
no compression. Error ACKs are Canal's: ``Ack{error_code, error_message}`` in a packet
of type ACK.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

from canal_protocol.canal import packet_pb2 as pb

__all__ = [
    "HEADER",
    "MAX_FRAME_BYTES",
    "VERSION",
    "FrameError",
    "ack_frame",
    "error_frame",
    "frame",
    "handshake_frame",
    "messages_frame",
    "read_frame",
    "type_name",
]

HEADER = struct.Struct(">i")
VERSION = 1
MAX_FRAME_BYTES = 1 << 20  # 1 MiB: a client's packet (a filter of thousands of tables fits)


class FrameError(Exception):
    """A frame that cannot be one of Canal's: the connection is closed."""


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES
) -> bytes | None:
    """The next frame's body; None when the peer closed between frames. ``FrameError``
    for a length out of ``0..max_bytes``; ``asyncio.IncompleteReadError`` when the
    stream ends inside a frame."""
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (size,) = HEADER.unpack(head)
    if not 0 <= size <= max_bytes:
        raise FrameError(f"frame length {size} outside 0..{max_bytes}")
    return await reader.readexactly(size)


def frame(body: bytes) -> bytes:
    """``body`` behind its length."""
    return HEADER.pack(len(body)) + body


def _packet(kind: int, body: bytes) -> bytes:
    return frame(pb.Packet(version=VERSION, type=kind, body=body).SerializeToString())  # type: ignore[arg-type]


def handshake_frame(seeds: bytes) -> bytes:
    return _packet(pb.HANDSHAKE, pb.Handshake(seeds=seeds).SerializeToString())


_ACK = _packet(pb.ACK, pb.Ack().SerializeToString())


def ack_frame() -> bytes:
    """An ACK without error (Canal's ``NettyUtils.ackPacket``)."""
    return _ACK


def error_frame(code: int, message: str) -> bytes:
    """An error ACK (Canal's ``NettyUtils.errorPacket``)."""
    return _packet(pb.ACK, pb.Ack(error_code=code, error_message=message).SerializeToString())


def _varint(n: int) -> bytes:
    """protobuf's varint of ``n`` (a negative int64 as its 64-bit two's complement)."""
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_MESSAGES_HEAD = b"\x10\x01\x18\x07\x2a"  # Packet: version = 1, type = MESSAGES, body's tag
_BATCH_ID_TAG = b"\x08"  # Messages.batch_id
_ITEM_TAG = b"\x12"  # Messages.messages


def messages_frame(batch_id: int, items: Sequence[bytes]) -> bytes:
    """MESSAGES: ``batch_id`` (-1 when empty) and one serialized Entry per item, framed.

    Written as protobuf writes the ``Packet{version, type, body: Messages{batch_id,
    messages}}`` (field order, varints), in one join: the messages objects would copy a
    batch of megabytes four times more (as Canal's SessionHandler writes raw entries
    with a CodedOutputStream of its own)."""
    parts = [_BATCH_ID_TAG, _varint(batch_id)] if batch_id else []  # proto3 omits a 0
    for item in items:
        parts += (_ITEM_TAG, _varint(len(item)), item)
    size = sum(len(p) for p in parts)
    head = _MESSAGES_HEAD + _varint(size) if size else _MESSAGES_HEAD[:-1]
    return b"".join((HEADER.pack(len(head) + size), head, *parts))


def type_name(kind: int) -> str:
    """A packet type's name as Canal logs it (the number when not one of Canal's)."""
    try:
        return pb.PacketType.Name(kind)
    except ValueError:
        return str(kind)
