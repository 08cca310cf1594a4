"""Canal's framing and packets (``canal_server.canal.wire``), without a node."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canal_protocol.canal import packet_pb2 as pb
from canal_server.canal import wire


@given(
    batch_id=st.one_of(st.just(-1), st.integers(0, 2**63 - 1), st.integers(-(2**63), -1)),
    items=st.lists(st.binary(max_size=300), max_size=5),
)
def test_messages_frame_is_the_bytes_protobuf_writes(batch_id: int, items: list[bytes]) -> None:
    body = pb.Messages(batch_id=batch_id, messages=items).SerializeToString()
    packet = pb.Packet(version=1, type=pb.MESSAGES, body=body).SerializeToString()
    assert wire.messages_frame(batch_id, items) == wire.frame(packet)


def test_server_packets_carry_version_1_and_no_compression() -> None:
    for framed in (wire.handshake_frame(b"12345678"), wire.ack_frame(), wire.error_frame(400, "x")):
        (size,) = wire.HEADER.unpack(framed[:4])
        assert size == len(framed) - 4
        packet = pb.Packet.FromString(framed[4:])
        assert packet.HasField("version") and packet.version == 1
        assert not packet.HasField("compression")
    err = pb.Ack.FromString(pb.Packet.FromString(wire.error_frame(402, "no")[4:]).body)
    assert (err.error_code, err.error_message) == (402, "no")
    assert wire.type_name(pb.HEARTBEAT) == "HEARTBEAT" and wire.type_name(99) == "99"


def _read(data: bytes, max_bytes: int = wire.MAX_FRAME_BYTES) -> bytes | None:
    async def run() -> bytes | None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await wire.read_frame(reader, max_bytes)

    return asyncio.run(run())


def test_read_frame_bounds_the_length_before_reading() -> None:
    assert _read(wire.frame(b"abc")) == b"abc"
    assert _read(b"") is None  # closed between frames
    with pytest.raises(wire.FrameError, match=r"outside 0\.\.16"):
        _read(wire.HEADER.pack(17) + b"x" * 17, max_bytes=16)
    with pytest.raises(wire.FrameError):
        _read(wire.HEADER.pack(-1))
    with pytest.raises(asyncio.IncompleteReadError):  # closed inside a frame
        _read(wire.HEADER.pack(10) + b"abc")
