"""Unit tests of the connectors' HTTP logic against a fake cluster (httpx.MockTransport)."""

from __future__ import annotations

import logging
import ssl
import subprocess
import sys
from typing import Any, cast

import httpx
import pytest
from client_fixtures import FakeCluster, entry_wire

from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_client.exclusive import ActiveGate
from canal_client.resolver import Leader, LeaderResolver, StaticResolver
from canal_client.wire import HttpChannel, tls_context
from canal_cluster.retry import RetryPolicy
from canal_protocol import Batch, EntryType
from canal_protocol.errors import (
    InvalidArgument,
    NotSubscribed,
    RetryExhausted,
    Unauthorized,
    UnknownBatch,
)

A, B, C = "http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"
FAST = RetryPolicy(initial_s=0.001, max_delay_s=0.01, attempts=50)


def cluster(n: int = 20, leader: str = A) -> FakeCluster:
    return FakeCluster([A, B, C], leader=leader, entries=[entry_wire(i) for i in range(n)])


def simple(fake: FakeCluster, url: str = A, **kw: Any) -> SimpleConnector:
    kw.setdefault("retry", FAST)
    return SimpleConnector(url, "example", "1001", transport=fake.transport(), **kw)


def servers(fake: FakeCluster, **kw: Any) -> ClusterConnector:
    kw.setdefault("retry", FAST)
    return ClusterConnector("example", "1001", servers=[A, B, C], transport=fake.transport(), **kw)


def ids(batch: Batch) -> list[Any]:
    return [e.rows[0].after_values()["id"] for e in batch.entries]


HEAVY = "('pymysqlreplication', 'fastapi', 'uvicorn', 'starlette')"


def test_import_pulls_no_server_dependencies() -> None:
    code = (
        "import sys, canal_client, canal_client.connector, canal_ha.consume\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        f"{HEAVY[:-1]}, 'pymysql', 'canal_server')]\n"
        "assert not bad, bad\n"
        # `canal-ha consume` parses its command line without them either
        "from canal_ha.cli import build_parser\n"
        "build_parser().parse_args(['consume', '--server', 'http://127.0.0.1:1',"
        " '--destination', 'd', '--client-id', 'c'])\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {HEAVY}]\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_msgpack_by_default_typed_batches_and_bearer_token() -> None:
    fake = cluster()
    fake.entries[0] = entry_wire(0, blob=b"\x00\xffraw")
    with simple(fake, token="s3cret") as conn:
        conn.subscribe("db\\..*")
        batch = conn.get_without_ack(3, 0.1)
        assert batch.id == 1 and ids(batch) == [0, 1, 2]
        entry = batch.entries[0]
        assert entry.type is EntryType.ROWDATA and entry.full_name == "db.t"
        assert entry.rows[0].after_values()["b"] == b"\x00\xffraw"
        assert entry.header.gtid == "0-1-0" and entry.header.end_offset == 100
        assert batch.end is not None and batch.end.offset == 300
        assert conn.epoch == 5 and conn.leader_url == A
    h = fake.headers[-1]
    assert h["accept"] == "application/msgpack"
    assert h["authorization"] == "Bearer s3cret"
    assert fake.subscribed == {"1001": "db\\..*"}


def test_json_wire_decodes_base64_binary_back_to_bytes() -> None:
    fake = cluster()
    fake.entries[0] = entry_wire(0, blob=b"\x01\x02")
    with simple(fake, wire="json") as conn:
        conn.subscribe()
        entry = conn.get_without_ack(1, 0).entries[0]
    assert entry.rows[0].after_values()["b"] == b"\x01\x02"
    assert entry.to_json_wire()["rows"][0]["after"][1]["value"] == "AQI="
    assert fake.headers[-1]["accept"] == "application/json"


def test_connect_follows_307_then_subscribes_and_rolls_back() -> None:
    fake = cluster(leader=B)
    with simple(fake, url=A) as conn:
        conn.subscribe("x")
        assert conn.leader_url == B
        assert ids(conn.get_without_ack(2, 0)) == [0, 1]
    posts = [(u, p.rsplit("/", 1)[-1]) for (u, m, p) in fake.calls if m == "POST"]
    assert posts[:2] == [(A, "rollback"), (B, "rollback")]  # rollback on connect, via 307
    assert (B, "batches") in posts


def test_ack_moves_cursor_and_get_auto_acks() -> None:
    fake = cluster()
    with simple(fake) as conn:
        conn.subscribe()
        batch = conn.get_without_ack(5, 0)
        conn.ack(batch.id)
        assert fake.cursor == 5
        assert conn.cursor() is not None
        assert ids(conn.get(5, 0)) == [5, 6, 7, 8, 9]
        assert fake.cursor == 10 and not fake.outstanding
        again = conn.get_without_ack(2, 0)
        assert ids(conn.get_batch(again.id)) == [10, 11]
        conn.rollback(again.id)
        assert ids(conn.get_without_ack(2, 0)) == [10, 11]
        empty = conn.get_without_ack(100, 0)
        conn.rollback()
        assert fake.read == 10
        assert empty.id != -1


def test_empty_batch_when_nothing_arrives() -> None:
    fake = cluster(n=0)
    with simple(fake) as conn:
        conn.subscribe()
        batch = conn.get_without_ack(10, 0.05)
    assert batch.id == -1 and batch.entries == [] and batch.is_empty


def test_503_retry_after_is_waited_then_retried() -> None:
    fake = cluster()
    fake.leader, fake.retry_after = None, "1"
    waits: list[float] = []

    class Recording(StaticResolver):
        def wait_change(self, timeout_s: float) -> None:
            waits.append(timeout_s)
            fake.new_leader(A)  # a leader is elected while we wait

    conn = Connector("example", "1001", Recording([A]), transport=fake.transport(), retry=FAST)
    with conn:
        conn.subscribe()
        assert ids(conn.get_without_ack(1, 0)) == [0]
    assert waits and waits[0] >= 1.0  # Retry-After honoured over the 1 ms backoff


def test_backoff_starts_over_for_a_new_leader() -> None:
    """The backoff grown against a dead leader does not delay the first calls to the
    next one (the failover benchmark lost 2 s to it)."""
    fake = cluster(leader=B)
    fake.down.update((A, B))
    waits: list[float] = []

    class Switching(LeaderResolver):
        now = A

        def current(self) -> Leader:
            return Leader(self.now)

        def failed(self, url: str) -> None:
            pass

        def redirected(self, url: str) -> None:
            pass

        def wait_change(self, timeout_s: float) -> None:
            waits.append(timeout_s)
            if len(waits) == 6:
                self.now = B  # elected while we wait; still starting up for two calls
            if len(waits) == 8:
                fake.down.discard(B)

    policy = RetryPolicy(initial_s=0.001, multiplier=2.0, max_delay_s=1.0, attempts=50)
    conn = Connector("example", "1001", Switching(), transport=fake.transport(), retry=policy)
    with conn:
        conn.subscribe()
        assert ids(conn.get_without_ack(1, 0)) == [0]
    assert waits[:6] == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016, 0.032])
    assert waits[6:] == pytest.approx([0.001, 0.002])  # counted again for B


def test_down_server_is_skipped_in_the_list() -> None:
    fake = cluster(leader=C)
    fake.down.add(A)
    with servers(fake) as conn:
        conn.subscribe()
        assert ids(conn.get_without_ack(1, 0)) == [0]
        assert conn.leader_url == C


def test_stale_epoch_reply_is_refused_and_retried_elsewhere() -> None:
    fake = cluster(leader=A)
    with servers(fake) as conn:
        conn.subscribe()
        conn.ack(conn.get_without_ack(2, 0).id)
        assert conn.epoch == 5
        fake.reply_epoch[A] = 4  # A now answers like a deposed leader
        fake.new_leader(B, 6)
        fake.reply_epoch[B] = 6
        # B wins but A still claims to lead with a lower epoch: never accepted
        fake.leader = A
        with pytest.raises(RetryExhausted):
            conn.get_without_ack(1, 0)
        fake.leader = B
        assert ids(conn.get_without_ack(1, 0)) == [2]
        assert conn.epoch == 6 and conn.leader_url == B


def test_leader_change_reconnects_resubscribes_rolls_back_and_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = cluster()
    caplog.set_level(logging.INFO, logger="canal_client")
    with servers(fake) as conn:
        conn.subscribe("db\\.t")
        first = conn.get_without_ack(3, 0)
        fake.new_leader(B, 9)  # failover: A dies, B restores the cursor (0)
        fake.down.add(A)
        fake.subscribed.clear()
        second = conn.get_without_ack(3, 0)
        assert ids(second) == [0, 1, 2]  # redelivered from the cursor
        assert conn.ack(first.id) is False  # a batch of the old session: dropped, not sent
        assert fake.cursor == 0
        assert conn.ack(second.id) is True
        assert fake.cursor == 3
    assert fake.subscribed == {"1001": "db\\.t"}  # subscribed again with the last filter
    change = [r for r in caplog.records if "following leader change" in r.getMessage()]
    assert len(change) == 1
    msg = change[0].getMessage()
    assert "example/1001" in msg and A in msg and B in msg and "epoch 5" in msg and "9" in msg
    assert any("dropped" in r.getMessage() for r in caplog.records)


def test_epoch_bump_on_same_url_is_a_leader_change() -> None:
    fake = cluster()
    with simple(fake) as conn:
        conn.subscribe()
        conn.get_without_ack(3, 0)
        rollbacks = fake.paths("POST").count("/v1/destinations/example/clients/1001/rollback")
        fake.epoch = 7  # same node, re-elected: its state was reloaded
        assert ids(conn.get_without_ack(3, 0)) == [0, 1, 2]
        after = fake.paths("POST").count("/v1/destinations/example/clients/1001/rollback")
        assert after == rollbacks + 1 and conn.epoch == 7


def test_errors_are_typed() -> None:
    fake = cluster()
    with simple(fake) as conn:
        with pytest.raises(NotSubscribed):
            conn.get_without_ack(1, 0)
        conn.subscribe()
        with pytest.raises(UnknownBatch):
            conn.get_batch(42)
        with pytest.raises(UnknownBatch):
            conn.ack(42)
        with pytest.raises(InvalidArgument) as err:
            conn.get_without_ack(0, 0)
        assert err.value.field == "size"


def test_a_refused_ack_is_not_sent_again_by_the_next_get() -> None:
    fake = cluster()
    with simple(fake) as conn:
        conn.subscribe()
        with pytest.raises(UnknownBatch):
            conn.get_without_ack(1, 0, ack=42)  # never issued: nothing taken
        assert ids(conn.get_without_ack(1, 0)) == [0]
        assert conn.last_ack_taken is None


def test_401_is_unauthorized_and_not_retried() -> None:
    def deny(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": "unauthorized", "message": "token"})

    conn = SimpleConnector(A, "example", "1001", transport=httpx.MockTransport(deny), retry=FAST)
    with pytest.raises(Unauthorized):
        conn.connect()
    conn.disconnect()


def test_unreachable_cluster_exhausts_the_retry_policy() -> None:
    fake = cluster()
    fake.down.update({A, B, C})
    conn = servers(fake, retry=RetryPolicy(initial_s=0.001, max_delay_s=0.001, attempts=4))
    with pytest.raises(RetryExhausted) as err:
        conn.connect()
    conn.disconnect()
    assert err.value.attempts == 4
    assert {u for (u, _, _) in fake.calls} == {A, B, C}


def test_bad_ids_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        SimpleConnector(A, "example", "running")
    with pytest.raises(InvalidArgument):
        SimpleConnector(A, "../x", "1001")


def test_channels_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx makes a CA-loaded SSL context per client (20-160 ms of CPU each here)
    tls_context()  # the process's one, made at most once
    made: list[object] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kw: Any) -> ssl.SSLContext:
        made.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    for _ in range(3):
        HttpChannel().close()
    assert made == []


def test_an_id_a_new_leader_issues_again_does_not_take_the_ack_of_the_old_batch() -> None:
    """A new leader issues again the ids its predecessor never flushed. The caller still
    holds the old leader's batch with such an id (a stream's prefetch fetched the next
    batch meanwhile): its ack is dropped, it must not ack the new batch, unseen."""
    fake = cluster()
    with servers(fake) as conn:
        conn.subscribe()
        first = conn.get_without_ack(2, 0)
        held = conn.get_without_ack(2, 0, ack=first.id)  # the caller works on it
        assert (held.id, fake.cursor) == (2, 2)
        fake.new_leader(B, 9)  # A dies before flushing batch id 2: B issues it again
        fake.down.add(A)
        fake.next_batch = 2
        fetched = conn.get_without_ack(2, 0)  # the prefetch follows B
        assert ids(fetched) == [2, 3]  # from the cursor: what `held` held
        sent = len(fake.bodies)
        later = conn.get_without_ack(2, 0, ack=held.id)  # `held` processed
        assert conn.last_ack_taken is False  # a batch of the old session: dropped
        assert fake.cursor == 2  # `fetched` is not acked unseen
        assert not any(isinstance(b, dict) and "ack" in b for b in fake.bodies[sent:])
        assert conn.ack(later.id) is True and fake.cursor == 6


class BlippingGate:
    """An ``ActiveGate`` stand-in: always active; ``blip()`` is the role lost and
    regained (a client lease blip): ``generation`` grows."""

    generation = 0

    def blip(self) -> None:
        self.generation += 1

    def check_access(self) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def valid_for(self) -> float:
        return 60.0

    def wait_active(self, timeout_s: float) -> bool:
        return True


def test_a_batch_the_leader_acked_is_kept_when_the_gate_blips_during_the_get() -> None:
    """get() (auto ack) while the active role is lost and regained: the leader acked the
    batch, so only this caller can have it; get_without_ack drops its batch (the next
    session rolls it back: it comes again)."""
    fake = cluster()
    gate = BlippingGate()

    blips = [1, 1]  # during the next two gets

    def blip_on_get(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/batches") and blips:
            gate.blip()
            blips.pop()
        return fake.handle(request)

    transport = httpx.MockTransport(blip_on_get)
    gated = cast(ActiveGate, gate)
    conn = Connector(
        "example", "1001", StaticResolver([A]), retry=FAST, transport=transport, gate=gated
    )
    with conn:
        conn.subscribe()
        assert ids(conn.get(3, 0)) == [0, 1, 2]
        assert fake.cursor == 3
        assert conn.get_without_ack(3, 0).is_empty  # no longer the active consumer's
        assert ids(conn.get_without_ack(3, 0)) == [3, 4, 5]  # rolled back, comes again
