"""The project's Canal .proto files: generated code current, Canal's field numbers kept."""

from __future__ import annotations

import subprocess
from pathlib import Path

from canal_protocol.canal import entry_pb2, packet_pb2

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ["packet_pb2.py", "packet_pb2.pyi", "entry_pb2.py", "entry_pb2.pyi"]


def test_generated_code_matches_the_proto_files(tmp_path: Path) -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True)
    here = ROOT / "protocol" / "canal_protocol" / "canal"
    for name in GENERATED:
        fresh = (tmp_path / "canal_protocol" / "canal" / name).read_text()
        assert fresh == (here / name).read_text(), f"{name} is stale: run scripts/gen_proto.sh"


def _numbers(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_canal_field_numbers() -> None:
    # Canal 1.1.x's CanalProtocol.proto and EntryProtocol.proto: the wire is these numbers.
    assert _numbers(packet_pb2.Packet) == {
        "magic_number": 1,
        "version": 2,
        "type": 3,
        "compression": 4,
        "body": 5,
    }
    assert _numbers(packet_pb2.Get) == {
        "destination": 1,
        "client_id": 2,
        "fetch_size": 3,
        "timeout": 4,
        "unit": 5,
        "auto_ack": 6,
    }
    assert _numbers(packet_pb2.Sub)["filter"] == 7
    assert _numbers(packet_pb2.ClientAuth)["start_timestamp"] == 8
    assert _numbers(entry_pb2.Header)["gtid"] == 13
    assert _numbers(entry_pb2.Column)["mysqlType"] == 10
    assert _numbers(entry_pb2.RowChange)["ddlSchemaName"] == 14
    assert packet_pb2.PacketType.Value("CLIENTROLLBACK") == 12
    assert entry_pb2.EventType.Value("MHEARTBEAT") == 15


def test_a_version_set_to_one_is_on_the_wire() -> None:
    # Canal's Java client rejects a handshake whose version is not 1; proto3 drops a plain
    # field equal to its default, the oneof keeps it.
    packet = packet_pb2.Packet(type=packet_pb2.HANDSHAKE, version=1)
    assert packet.SerializeToString() == b"\x10\x01\x18\x01"
