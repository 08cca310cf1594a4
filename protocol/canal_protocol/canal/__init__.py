"""Canal's own wire: the protobuf messages of Canal 1.1.x's TCP protocol.

``packet.proto`` (Canal's CanalProtocol.proto: Packet, Handshake, ClientAuth, Ack, Sub,
Get, Messages, ClientAck, ClientRollback) and ``entry.proto`` (EntryProtocol.proto:
Entry, Header, RowChange, RowData, Column) keep Canal's message names and field
numbers (Apache-2.0, see NOTICE). ``packet_pb2`` and ``entry_pb2`` are generated from
them by ``scripts/gen_proto.sh`` (checked by tests/test_canal_proto.py).
"""
