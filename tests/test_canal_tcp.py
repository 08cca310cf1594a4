"""Canal's TCP protocol on a 3-node cluster (docs/canal-protocol.md).

One cluster for the module (its Canal user has a password; plaintext allowed for
canal-python). Clients: canal-python 0.4 from PyPI in a subprocess
(``canal_python_consumer.py``), and ``canal_java_client`` (ours, behaving as Canal's
Java client). The failover tests come last: each SIGKILLs the leader and starts it again.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from canal_java_client import CanalClientError, ClusterConnector, SimpleConnector, scramble411
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node_fixtures import NodeProc, start_nodes, wait_leader
from test_every_type import COLUMNS, ROWS, TYPES

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.process import ManagedProcess
from canal_protocol.canal import entry_pb2, packet_pb2
from canal_server.canal.auth import passwd_of
from canal_server.canal.relay import RELAY_MAGIC
from canal_server.canal.wire import MAX_FRAME_BYTES

DEST = "example"
USER, PASSWORD = "canal", "canal-pw"
DB = "t_canal_tcp"
FILTER = f"{DB}\\..*"
CONSUMER = Path(__file__).parent / "canal_python_consumer.py"
_HEADER = struct.Struct(">i")


@pytest.fixture(scope="module")
def cluster(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    canal = {"user": USER, "passwd": passwd_of(PASSWORD), "allow_plaintext_password": True}
    nodes = start_nodes(sandbox, 3, tmp_path_factory.mktemp("canal-tcp"), canal=canal)
    sandbox.primary.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    try:
        wait_leader(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.process.resume()
            node.process.stop(timeout_s=20)
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {DB}")


def address(node: NodeProc) -> tuple[str, int]:
    host, port = node.canal.rsplit(":", 1)
    return host, int(port)


def standby_of(nodes: list[NodeProc]) -> NodeProc:
    leader = wait_leader(nodes)
    return next(n for n in nodes if n is not leader and n.is_running())


def connector(node: NodeProc, password: str | None = PASSWORD) -> SimpleConnector:
    c = SimpleConnector(address(node), USER, password, DEST, so_timeout_s=30)
    c.connect()
    return c


def row_ids(entries: list[entry_pb2.Entry], table: str = "t") -> list[int]:
    ids = []
    for e in entries:
        if e.entryType != entry_pb2.ROWDATA or e.header.tableName != table:
            continue
        change = entry_pb2.RowChange.FromString(e.storeValue)
        for row in change.rowDatas:
            cols = row.afterColumns or row.beforeColumns
            ids.append(int(next(c.value for c in cols if c.name == "id")))
    return ids


def drain(c: SimpleConnector, want: int, timeout_s: float = 30.0) -> list[int]:
    """Row ids of table t got (and acked) until ``want`` arrived."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        m = c.get_without_ack(1000, 500)
        got += row_ids(m.entries)
        c.ack(m.id)
    return got


class Raw:
    """A logged-in connection for sending any bytes and reading frames."""

    opened: ClassVar[list[socket.socket]] = []  # closed after each test (``_close_raws``)

    def __init__(self, node: NodeProc, login: bool = True, idle_ms: int = 0) -> None:
        self.sock = socket.create_connection(address(node), timeout=30)
        Raw.opened.append(self.sock)
        self.handshake = packet_pb2.Packet.FromString(self.read())
        if login:
            seeds = packet_pb2.Handshake.FromString(self.handshake.body).seeds
            auth = packet_pb2.ClientAuth(
                username=USER,
                password=scramble411(PASSWORD.encode(), seeds).hex().encode(),
                net_read_timeout=idle_ms,
            )
            self.send(packet_pb2.CLIENTAUTHENTICATION, auth.SerializeToString())
            assert self.ack().error_code == 0

    def send(self, kind: int, body: bytes) -> None:
        self.raw(packet_pb2.Packet(type=kind, body=body).SerializeToString())  # type: ignore[arg-type]

    def raw(self, data: bytes, length: int | None = None) -> None:
        self.sock.sendall(_HEADER.pack(len(data) if length is None else length) + data)

    def read(self) -> bytes:
        (n,) = _HEADER.unpack(self._exactly(4))
        return self._exactly(n)

    def packet(self) -> packet_pb2.Packet:
        return packet_pb2.Packet.FromString(self.read())

    def ack(self) -> packet_pb2.Ack:
        p = self.packet()
        assert p.type == packet_pb2.ACK, p
        return packet_pb2.Ack.FromString(p.body)

    def closed(self, timeout_s: float = 10.0) -> bool:
        """Whether the node closes the connection within ``timeout_s`` (after any
        frames it sent); the socket is closed after."""
        self.sock.settimeout(timeout_s)
        try:
            while self.sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except OSError:  # reset
            return True
        finally:
            self.sock.close()
        return True

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError("closed")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(autouse=True)
def _close_raws() -> Iterator[None]:
    yield
    while Raw.opened:
        Raw.opened.pop().close()


def sub(client: str = "1001", dest: str = DEST, flt: str = FILTER) -> bytes:
    return packet_pb2.Sub(destination=dest, client_id=client, filter=flt).SerializeToString()


def get(client: str = "1001", dest: str = DEST, **kw: Any) -> bytes:
    kw.setdefault("fetch_size", 100)
    return packet_pb2.Get(destination=dest, client_id=client, **kw).SerializeToString()


def client_ack(batch_id: int, client: str = "1001") -> bytes:
    return packet_pb2.ClientAck(
        destination=DEST, client_id=client, batch_id=batch_id
    ).SerializeToString()


# -- login ------------------------------------------------------------------------------------


def test_handshake_is_version_1_with_seeds_and_login_is_checked(cluster: list[NodeProc]) -> None:
    node = standby_of(cluster)
    raw = Raw(node, login=False)
    hs = raw.handshake
    assert hs.type == packet_pb2.HANDSHAKE and hs.HasField("version") and hs.version == 1
    assert not hs.HasField("compression")
    assert len(packet_pb2.Handshake.FromString(hs.body).seeds) == 8
    raw.close()

    c = connector(node)  # the Java client's scrambled login
    c.disconnect()
    for user, password in ((USER, "wrong"), ("other", PASSWORD), (USER, None)):
        bad = SimpleConnector(address(node), user, password, DEST, so_timeout_s=30)
        with pytest.raises(CanalClientError, match=f"auth failed for user:{user}$"):
            bad.connect()
        assert bad.sock is not None and bad.sock.recv(1) == b""  # and the node closed it
        bad.disconnect()


def test_an_idle_session_is_closed_after_its_read_timeout(cluster: list[NodeProc]) -> None:
    raw = Raw(cluster[0], idle_ms=300)  # net_read_timeout in ms, as the Java client sends it
    assert raw.closed(timeout_s=15)


def test_a_packet_before_the_login_is_refused_and_closes(cluster: list[NodeProc]) -> None:
    raw = Raw(cluster[0], login=False)
    raw.send(packet_pb2.SUBSCRIPTION, sub())
    ack = raw.ack()
    assert ack.error_code == 400 and "expected CLIENTAUTHENTICATION" in ack.error_message
    assert raw.closed()


# -- the packets ------------------------------------------------------------------------------


def test_every_packet_on_a_standby_and_canals_error_acks(
    cluster: list[NodeProc], sandbox: Sandbox
) -> None:
    sandbox.primary.execute(f"CREATE TABLE IF NOT EXISTS {DB}.t (id INT PRIMARY KEY, v TEXT)")
    raw = Raw(standby_of(cluster))
    # before subscribing: Canal's "should subscribe first"
    raw.send(packet_pb2.GET, get(client="77"))
    err = raw.ack()
    assert err.error_code == 400
    assert "ClientIdentity[destination=example,clientId=77" in err.error_message
    assert "should subscribe first" in err.error_message
    # no destination or client id: 401
    raw.send(packet_pb2.SUBSCRIPTION, packet_pb2.Sub(client_id="77").SerializeToString())
    err = raw.ack()
    assert err.error_code == 401 and err.error_message.startswith("destination or clientId is null")
    raw.send(packet_pb2.SUBSCRIPTION, sub("77"))
    assert raw.ack().error_code == 0
    # a new client starts at the oldest change held (here: at least the CREATE TABLE)
    raw.send(packet_pb2.GET, get("77", timeout=-1))
    p = raw.packet()
    assert p.type == packet_pb2.MESSAGES and p.version == 1
    held = packet_pb2.Messages.FromString(p.body)
    assert held.batch_id > 0 and held.messages
    raw.send(packet_pb2.CLIENTACK, client_ack(held.batch_id, "77"))
    # GET without a wait: empty at once, batch id -1
    raw.send(packet_pb2.GET, get("77", timeout=-1))
    assert packet_pb2.Messages.FromString(raw.packet().body).batch_id == -1
    # a GET that waits (timeout in ms, unit 2) answers as soon as a row comes
    writer = threading.Timer(0.5, sandbox.primary.execute, [f"INSERT INTO {DB}.t VALUES (1, 'a')"])
    writer.start()
    raw.send(packet_pb2.GET, get("77", timeout=20_000, unit=2))
    messages = packet_pb2.Messages.FromString(raw.packet().body)
    writer.join()
    assert messages.batch_id > 0
    entries = [entry_pb2.Entry.FromString(m) for m in messages.messages]
    assert 1 in row_ids(entries)
    # CLIENTACK and CLIENTROLLBACK get no answer; an ack of an unknown batch surfaces on
    # the next read, in Canal's words, instead of the next packet's answer
    raw.send(packet_pb2.CLIENTACK, client_ack(-1, "77"))  # ignored: the last get was empty
    raw.send(packet_pb2.CLIENTACK, client_ack(messages.batch_id + 100, "77"))
    raw.send(packet_pb2.GET, get("77", timeout=-1))
    err = raw.ack()
    assert err.error_code == 400
    assert (
        f"ack error , clientId:77 batchId:{messages.batch_id + 100} is not exist , please check"
        in err.error_message
    )
    assert "something goes wrong with channel" in err.error_message
    # the batch is still outstanding: roll it back, get it again with a new id, ack it
    raw.send(
        packet_pb2.CLIENTROLLBACK,
        packet_pb2.ClientRollback(destination=DEST, client_id="77").SerializeToString(),
    )
    raw.send(packet_pb2.GET, get("77", timeout=-1))
    again = packet_pb2.Messages.FromString(raw.packet().body)
    assert again.batch_id > messages.batch_id
    assert row_ids([entry_pb2.Entry.FromString(m) for m in again.messages]) == row_ids(entries)
    raw.send(packet_pb2.CLIENTACK, client_ack(again.batch_id, "77"))
    # batch 0: Canal's 402, on the next read
    raw.send(packet_pb2.CLIENTACK, client_ack(0, "77"))
    raw.send(packet_pb2.GET, get("77", timeout=-1))
    err = raw.ack()
    assert err.error_code == 402 and err.error_message.startswith("batchId should assign value")
    raw.send(packet_pb2.GET, get("77", timeout=-1))  # the ack before it went through
    assert packet_pb2.Messages.FromString(raw.packet().body).batch_id == -1
    # an unsupported packet type
    raw.send(packet_pb2.HEARTBEAT, b"")
    err = raw.ack()
    assert (err.error_code, err.error_message) == (400, "packet type: HEARTBEAT is NOT supported!")
    unsub = packet_pb2.Unsub(destination=DEST, client_id="77")
    raw.send(packet_pb2.UNSUBSCRIPTION, unsub.SerializeToString())
    assert raw.ack().error_code == 0
    # one destination per connection: a relayed one closes on another destination
    raw.send(packet_pb2.SUBSCRIPTION, sub("77", dest="other"))
    assert raw.closed()


def test_one_destination_per_connection_and_unknown_destinations(
    cluster: list[NodeProc],
) -> None:
    raw = Raw(cluster[0])
    raw.send(packet_pb2.SUBSCRIPTION, sub(dest="nowhere"))
    err = raw.ack()
    assert err.error_code == 400 and "destination:nowhere should start first" in err.error_message
    raw = Raw(wait_leader(cluster))  # served by the leader itself: an error ACK
    raw.send(packet_pb2.SUBSCRIPTION, sub("78"))
    assert raw.ack().error_code == 0
    raw.send(packet_pb2.SUBSCRIPTION, sub("78", dest="other"))
    err = raw.ack()
    assert err.error_code == 400
    assert "this connection serves destination example; open another" in err.error_message
    raw.send(
        packet_pb2.UNSUBSCRIPTION,
        packet_pb2.Unsub(destination=DEST, client_id="78").SerializeToString(),
    )
    assert raw.ack().error_code == 0


def test_a_relayed_login_is_never_relayed_again(cluster: list[NodeProc]) -> None:
    """A login marked as a node's relay (``RELAY_MAGIC``) reaching a standby (a stale
    view) gets an error ACK instead of a second hop: no relay loops."""
    leader = wait_leader(cluster)
    raw = Raw(standby_of(cluster), login=False)
    seeds = packet_pb2.Handshake.FromString(raw.handshake.body).seeds
    auth = packet_pb2.ClientAuth(
        username=USER, password=scramble411(PASSWORD.encode(), seeds).hex().encode()
    )
    login = packet_pb2.Packet(magic_number=RELAY_MAGIC, type=packet_pb2.CLIENTAUTHENTICATION)
    login.body = auth.SerializeToString()
    raw.raw(login.SerializeToString())
    assert raw.ack().error_code == 0
    raw.send(packet_pb2.SUBSCRIPTION, sub("79"))
    err = raw.ack()
    assert err.error_code == 400 and f"(node {leader.id} does)" in err.error_message
    assert raw.closed()


def test_the_java_clients_rollback_on_connect_redelivers(
    cluster: list[NodeProc], sandbox: Sandbox
) -> None:
    sandbox.primary.execute(f"CREATE TABLE IF NOT EXISTS {DB}.t (id INT PRIMARY KEY, v TEXT)")
    c = connector(standby_of(cluster))
    c.subscribe(FILTER)
    drain(c, 10**9, timeout_s=1)  # whatever earlier tests wrote
    sandbox.primary.execute(f"INSERT INTO {DB}.t VALUES (101, 'x'), (102, 'y')")
    first = c.get_without_ack(1000, 10_000)
    assert row_ids(first.entries) == [101, 102]
    c.disconnect()  # without an ack
    c = connector(standby_of(cluster))  # subscribes with its filter, then rolls back
    again = c.get_without_ack(1000, 10_000)
    assert row_ids(again.entries) == [101, 102] and again.id > first.id
    c.ack(again.id)
    c.disconnect()


def test_a_step_down_ends_the_old_terms_sessions_and_loses_nothing(
    cluster: list[NodeProc], sandbox: Sandbox
) -> None:
    """The leader's own sessions and the relayed ones end with the term (fencing by
    epoch); a client that reconnects gets its unacked batch again."""
    sandbox.primary.execute(f"CREATE TABLE IF NOT EXISTS {DB}.t (id INT PRIMARY KEY, v TEXT)")
    leader = wait_leader(cluster)
    direct, relayed = Raw(leader), Raw(standby_of(cluster))
    for raw, client in ((direct, "80"), (relayed, "81")):
        raw.send(packet_pb2.SUBSCRIPTION, sub(client))
        assert raw.ack().error_code == 0
        while True:  # what earlier tests left
            raw.send(packet_pb2.GET, get(client, timeout=-1))
            held = packet_pb2.Messages.FromString(raw.packet().body).batch_id
            if held == -1:
                break
            raw.send(packet_pb2.CLIENTACK, client_ack(held, client))
    sandbox.primary.execute(f"INSERT INTO {DB}.t VALUES (201, 'z')")
    direct.send(packet_pb2.GET, get("80", timeout=10_000, unit=2))
    taken = packet_pb2.Messages.FromString(direct.packet().body)
    assert 201 in row_ids([entry_pb2.Entry.FromString(m) for m in taken.messages])
    with leader.client() as http:
        r = http.post(f"/v1/destinations/{DEST}/step-down", json={})
    assert r.status_code == 200, r.text
    direct.send(packet_pb2.GET, get("80", timeout=-1))
    err = direct.ack()
    assert err.error_code == 400 and "no longer leads it" in err.error_message
    assert direct.closed() and relayed.closed()
    again = Raw(leader)  # the old leader relays now
    again.send(packet_pb2.SUBSCRIPTION, sub("80"))
    assert again.ack().error_code == 0
    rollback = packet_pb2.ClientRollback(destination=DEST, client_id="80")
    again.send(packet_pb2.CLIENTROLLBACK, rollback.SerializeToString())  # as clients do
    again.send(packet_pb2.GET, get("80", timeout=10_000, unit=2))
    redelivered = packet_pb2.Messages.FromString(again.packet().body)
    assert 201 in row_ids([entry_pb2.Entry.FromString(m) for m in redelivered.messages])
    for client in ("80", "81"):
        again.send(
            packet_pb2.UNSUBSCRIPTION,
            packet_pb2.Unsub(destination=DEST, client_id=client).SerializeToString(),
        )
        assert again.ack().error_code == 0


def test_a_client_behind_gets_every_batch_once_in_order(
    cluster: list[NodeProc], sandbox: Sandbox
) -> None:
    """Full batches make the node take the next one ahead while the client reads: the
    next GET of the same size gets it; another size, a rollback or a reconnect roll it
    back. Acked rows come once each, in order; batch ids only grow."""
    sandbox.primary.execute(f"CREATE TABLE IF NOT EXISTS {DB}.t (id INT PRIMARY KEY, v TEXT)")
    leader = wait_leader(cluster)
    raw = Raw(leader)
    raw.send(packet_pb2.SUBSCRIPTION, sub("85"))
    assert raw.ack().error_code == 0
    while True:  # what earlier tests left
        raw.send(packet_pb2.GET, get("85", timeout=-1))
        held = packet_pb2.Messages.FromString(raw.packet().body).batch_id
        if held == -1:
            break
        raw.send(packet_pb2.CLIENTACK, client_ack(held, "85"))
    wanted = list(range(300, 330))
    sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i}, 'b')" for i in wanted))
    ids: list[int] = []
    acked: list[int] = []
    pending: list[int] = []

    def take(size: int) -> packet_pb2.Messages:
        raw.send(packet_pb2.GET, get("85", timeout=5000, unit=2, fetch_size=size))
        m = packet_pb2.Messages.FromString(raw.packet().body)
        assert not ids or m.batch_id > ids[-1]
        ids.append(m.batch_id)
        pending.extend(row_ids([entry_pb2.Entry.FromString(x) for x in m.messages]))
        return m

    def ack(m: packet_pb2.Messages) -> None:
        raw.send(packet_pb2.CLIENTACK, client_ack(m.batch_id, "85"))
        acked.extend(pending)
        pending.clear()

    ack(take(4))  # full: the next batch of 4 is taken ahead
    ack(take(4))  # ... and given here
    third = take(4)
    fourth = take(2)  # another size: the batch taken ahead is rolled back first
    ack(third)  # in order, as Canal's meta wants it
    ack(fourth)
    take(4)
    raw.send(
        packet_pb2.CLIENTROLLBACK,
        packet_pb2.ClientRollback(destination=DEST, client_id="85").SerializeToString(),
    )
    pending.clear()  # rolled back: they come again
    take(3)
    raw.close()  # with a batch taken ahead
    raw = Raw(standby_of(cluster))
    raw.send(packet_pb2.SUBSCRIPTION, sub("85"))
    assert raw.ack().error_code == 0
    raw.send(
        packet_pb2.CLIENTROLLBACK,
        packet_pb2.ClientRollback(destination=DEST, client_id="85").SerializeToString(),
    )
    pending.clear()
    ids.clear()
    while set(acked) < set(wanted):
        m = take(1000)
        assert m.batch_id != -1, (acked, wanted)
        ack(m)
    assert acked == wanted  # once each, in order
    raw.send(
        packet_pb2.UNSUBSCRIPTION,
        packet_pb2.Unsub(destination=DEST, client_id="85").SerializeToString(),
    )
    assert raw.ack().error_code == 0


def test_acks_and_rollbacks_of_one_batch_follow_canals_order(
    cluster: list[NodeProc], sandbox: Sandbox
) -> None:
    """Canal refuses a CLIENTACK or CLIENTROLLBACK of a batch that is not the first
    outstanding one (its meta's rule), on the next read."""
    sandbox.primary.execute(f"CREATE TABLE IF NOT EXISTS {DB}.t (id INT PRIMARY KEY, v TEXT)")
    raw = Raw(wait_leader(cluster))
    raw.send(packet_pb2.SUBSCRIPTION, sub("86"))
    assert raw.ack().error_code == 0
    sandbox.primary.execute(
        f"INSERT INTO {DB}.t VALUES (401, 'o')", f"INSERT INTO {DB}.t VALUES (402, 'o')"
    )
    batches = []
    for _ in range(3):  # whatever is held, at least two batches of one entry
        raw.send(packet_pb2.GET, get("86", timeout=5000, unit=2, fetch_size=1))
        batches.append(packet_pb2.Messages.FromString(raw.packet().body).batch_id)
    first, second = batches[0], batches[1]
    raw.send(packet_pb2.CLIENTACK, client_ack(second, "86"))
    raw.send(packet_pb2.GET, get("86", timeout=-1))
    err = raw.ack()
    assert err.error_code == 400
    assert (
        "exception: com.alibaba.otter.canal.meta.exception.CanalMetaManagerException: "
        f"batchId:{second} is not the firstly:{first}"
    ) in err.error_message
    rollback = packet_pb2.ClientRollback(destination=DEST, client_id="86", batch_id=second)
    raw.send(packet_pb2.CLIENTROLLBACK, rollback.SerializeToString())
    raw.send(packet_pb2.GET, get("86", timeout=-1))
    assert f"batchId:{second} is not the firstly:{first}" in raw.ack().error_message
    raw.send(packet_pb2.CLIENTACK, client_ack(first, "86"))  # in order: fine
    raw.send(packet_pb2.CLIENTACK, client_ack(second, "86"))
    raw.send(
        packet_pb2.UNSUBSCRIPTION,
        packet_pb2.Unsub(destination=DEST, client_id="86").SerializeToString(),
    )
    assert raw.ack().error_code == 0


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        _HEADER.pack(MAX_FRAME_BYTES + 1) + b"x",  # over the bound: never read
        _HEADER.pack(-5),
        _HEADER.pack(7) + b"\xff\xff\xff\xff\xff\xff\xff",  # not a Packet
    ],
    ids=["oversized", "negative", "garbage"],
)
def test_a_frame_that_is_not_canals_closes_the_connection(
    cluster: list[NodeProc], frame: bytes
) -> None:
    raw = Raw(cluster[1])
    raw.sock.sendall(frame)
    assert raw.closed()
    c = connector(cluster[1])  # the node goes on
    c.disconnect()


def _fuzz_frames() -> st.SearchStrategy[bytes]:
    kinds = st.sampled_from([*packet_pb2.PacketType.values(), 99, -1])
    body = st.one_of(
        st.binary(max_size=64),
        st.builds(
            sub, st.sampled_from(["1", "", "x" * 70, "a/b"]), st.sampled_from([DEST, "", "zz"])
        ),
        st.builds(get, st.sampled_from(["1", ""]), st.sampled_from([DEST, ""])),
        st.builds(client_ack, st.integers(-2, 3)),
    )
    packets = st.builds(
        lambda k, b, v: packet_pb2.Packet(type=k, body=b, version=v).SerializeToString(),
        kinds, body, st.integers(0, 3),
    )  # fmt: skip
    framed = st.builds(
        lambda p: _HEADER.pack(len(p)) + p, st.one_of(packets, st.binary(max_size=40))
    )
    lying = st.builds(
        lambda n, p: _HEADER.pack(n) + p, st.integers(-(2**31), 2**31 - 1), st.binary(max_size=16)
    )
    return st.lists(st.one_of(framed, lying), min_size=1, max_size=4).map(b"".join)


@settings(
    max_examples=150, deadline=None, suppress_health_check=list(HealthCheck),
    derandomize=True,
)  # fmt: skip
@given(data=_fuzz_frames(), login=st.booleans(), which=st.integers(0, 2))
def test_fuzzed_frames_never_stall_a_node(
    cluster: list[NodeProc], data: bytes, login: bool, which: int
) -> None:
    """Random frames (before and after the login, to the leader and the standbys): the
    node answers or closes; meanwhile another session goes on getting batches."""
    raw = Raw(cluster[which], login=login)
    raw.sock.settimeout(5)
    try:
        raw.sock.sendall(data)
        raw.sock.shutdown(socket.SHUT_WR)
        raw.closed()
    except OSError:
        pass
    finally:
        raw.close()
    watcher = _WATCHERS.get("w") or _watcher(cluster)
    watcher.send(packet_pb2.GET, get("watch", timeout=-1))
    batch = packet_pb2.Messages.FromString(watcher.packet().body).batch_id
    if batch != -1:
        watcher.send(packet_pb2.CLIENTACK, client_ack(batch, "watch"))


_WATCHERS: dict[str, Raw] = {}


def _watcher(cluster: list[NodeProc]) -> Raw:
    """A session (on a standby: relayed) that lives through every fuzzed example."""
    raw = _WATCHERS["w"] = Raw(cluster[2] if cluster[2] is not wait_leader(cluster) else cluster[1])
    raw.send(packet_pb2.SUBSCRIPTION, sub("watch"))
    assert raw.ack().error_code == 0
    return raw


# -- canal-python, then failovers ---------------------------------------------------------------


def _start_consumer(
    tmp_path: Path, addresses: list[str], name: str
) -> tuple[ManagedProcess, Path, Path]:
    out, stop = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.stop"
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    argv = (sys.executable, str(CONSUMER), str(out), str(stop), DEST, USER, PASSWORD, *addresses)
    proc = ManagedProcess(f"canal-python-{name}", argv, tmp_path / f"{name}.log", env=env)
    proc.start()
    return proc, out, stop


def _lines(out: Path) -> list[dict[str, Any]]:
    try:
        text = out.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _rows(lines: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    return [
        {"eventType": e["eventType"], **row}
        for line in lines if "batch" in line
        for e in line["entries"] if e["tableName"] == table and not e.get("isDdl", True)
        for row in e["rows"]
    ]  # fmt: skip


def _stop_consumer(proc: ManagedProcess, stop: Path) -> None:
    stop.touch()
    try:
        wait_until(lambda: not proc.is_running(), "the consumer stops", 20)
    finally:
        proc.stop(timeout_s=10)


def test_canal_python_consumes_every_kind_through_a_standby(
    cluster: list[NodeProc], sandbox: Sandbox, tmp_path: Path
) -> None:
    standby = standby_of(cluster)
    proc, out, stop = _start_consumer(tmp_path, [standby.canal], "kinds")
    try:
        wait_until(lambda: any(x.get("event") == "connected" for x in _lines(out)), "connected", 30)
        sandbox.primary.execute(
            f"CREATE TABLE {DB}.every ({COLUMNS})",
            f"INSERT INTO {DB}.every VALUES {', '.join(ROWS)}",
            f"UPDATE {DB}.every SET vc = 'changed' WHERE id = 2",
            f"DELETE FROM {DB}.every WHERE id = 3",
        )

        def all_there() -> bool:
            return len(_rows(_lines(out), "every")) >= len(ROWS) + 2

        wait_until(all_there, "canal-python got every row", 60)
    finally:
        _stop_consumer(proc, stop)
    lines = _lines(out)
    assert not [x for x in lines if x.get("event") == "error"], proc.log_tail()
    ddl = [e for x in lines if "batch" in x for e in x["entries"] if e.get("isDdl")]
    assert any(e["tableName"] == "every" and e["sql"].startswith("CREATE TABLE") for e in ddl)
    rows = _rows(lines, "every")
    kinds = [r["eventType"] for r in rows]
    assert kinds == ["INSERT"] * len(ROWS) + ["UPDATE", "DELETE"]
    names = list(TYPES)
    for r in rows[: len(ROWS)]:
        assert [c["name"] for c in r["after"]] == names and not r["before"]
        assert [c["index"] for c in r["after"]] == list(range(len(names)))
    second = {c["name"]: c for c in rows[1]["after"]}  # a few values in Canal's form
    assert second["id"]["isKey"] and not second["vc"]["isKey"]
    for name, form in {
        "id": ("2", 4, "int(11)"),
        "biu": ("18446744073709551615", 3, "bigint(20) unsigned"),  # widened by value
        "dtm": ("9999-12-31 23:59:59.999999", 93, "datetime(6)"),
        "vc": ("héllo 😀", 12, "varchar(40)"),
    }.items():
        c = second[name]
        assert (c["value"], c["sqlType"], c["mysqlType"]) == form, name
    null_row = next(r for r in rows if r["after"] and r["after"][0]["value"] == "3")
    assert all(c["isNull"] for c in null_row["after"][1:])
    update = rows[len(ROWS)]
    before, after = ({c["name"]: c for c in update[k]} for k in ("before", "after"))
    assert before["vc"]["value"] == "héllo 😀" and after["vc"]["value"] == "changed"
    assert after["vc"]["updated"] and not after["c"]["updated"]
    delete = rows[-1]
    assert not delete["after"] and delete["before"][0]["value"] == "3"


def _writer(sandbox: Sandbox, table: str, ids: range, every_s: float) -> threading.Thread:
    """Inserts ``ids`` into ``table``, one transaction each, ``every_s`` apart."""

    def run() -> None:
        with sandbox.primary.admin() as conn, conn.cursor() as cur:
            for i in ids:
                cur.execute(f"INSERT INTO {DB}.{table} VALUES ({i})")
                time.sleep(every_s)

    t = threading.Thread(target=run, name=f"writer {table}", daemon=True)
    t.start()
    return t


def _kill_leader(cluster: list[NodeProc]) -> NodeProc:
    leader = wait_leader(cluster)
    leader.kill()
    return leader


def test_canal_python_survives_a_leader_sigkill(
    cluster: list[NodeProc], sandbox: Sandbox, tmp_path: Path
) -> None:
    sandbox.primary.execute(f"CREATE TABLE {DB}.py_fail (id INT PRIMARY KEY)")
    standby = standby_of(cluster)
    addresses = [standby.canal] + [n.canal for n in cluster if n is not standby]
    proc, out, stop = _start_consumer(tmp_path, addresses, "failover")
    wanted = range(1, 201)
    try:
        wait_until(lambda: any(x.get("event") == "connected" for x in _lines(out)), "connected", 30)
        writer = _writer(sandbox, "py_fail", wanted, 0.02)
        wait_until(lambda: len(_rows(_lines(out), "py_fail")) >= 30, "rows before the kill", 30)
        killed = _kill_leader(cluster)
        writer.join(60)

        def ids() -> set[int]:
            return {int(r["after"][0]["value"]) for r in _rows(_lines(out), "py_fail")}

        wait_until(lambda: ids() >= set(wanted), "every row after the failover", 90)
    finally:
        _stop_consumer(proc, stop)
    lines = _lines(out)
    got = [int(r["after"][0]["value"]) for r in _rows(lines, "py_fail")]
    assert set(got) == set(wanted)  # nothing lost (duplicates possible: at least once)
    events = [x for x in lines if "event" in x]
    assert any(x["event"] == "error" for x in events), events
    assert sum(x["event"] == "connected" for x in events) >= 2
    _batch_ids_rise_per_connection(lines)
    killed.restart()
    wait_leader(cluster)


def _batch_ids_rise_per_connection(lines: list[dict[str, Any]]) -> None:
    """Within one connection, batch ids only grow: never one id for two batches."""
    last = 0
    for x in lines:
        if x.get("event") == "connected":
            last = 0
        elif "batch" in x:
            assert x["batch"] > last, x["batch"]
            last = x["batch"]


def test_the_java_clients_cluster_connector_survives_a_leader_sigkill(
    cluster: list[NodeProc], sandbox: Sandbox
) -> None:
    sandbox.primary.execute(f"CREATE TABLE {DB}.java_fail (id INT PRIMARY KEY)")
    c = ClusterConnector(
        [address(n) for n in cluster], USER, PASSWORD, DEST, retry_interval_s=0.5, so_timeout_s=30
    )
    c.connect()
    c.subscribe(f"{DB}\\.java_fail")
    wanted = set(range(1, 201))
    writer = _writer(sandbox, "java_fail", range(1, 201), 0.02)
    got: list[int] = []
    killed: NodeProc | None = None
    deadline = time.monotonic() + 120
    while set(got) < wanted and time.monotonic() < deadline:
        m = c.get_without_ack(100, 1000)
        got += row_ids(m.entries, "java_fail")
        c.ack(m.id)
        if killed is None and len(got) >= 30:
            killed = _kill_leader(cluster)
    writer.join(60)
    c.disconnect()
    assert killed is not None
    assert set(got) == wanted, sorted(wanted - set(got))[:20]
    assert any(e.startswith("failed getWithoutAck") or e.startswith("failed ack") for e in c.events)
    assert sum(e.startswith("connect ") for e in c.events) >= 2, c.events
    killed.restart()
    wait_leader(cluster)
