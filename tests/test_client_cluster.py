"""Unit tests of the etcd side of the client: leader by watch, ClientRunningMonitor gate.

A MemoryCoordinator plays etcd; the servers are the fake cluster of client_fixtures.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import httpx
import pytest
from client_fixtures import FakeCluster, entry_wire
from memory_coordinator import MemoryCoordinator

from canal_client.connector import ClusterConnector
from canal_client.exclusive import ActiveGate
from canal_client.resolver import EtcdResolver
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy, wait_until
from canal_cluster.running import ElectionConfig
from canal_protocol import Batch
from canal_protocol.errors import ClientError

A, B = "http://127.0.0.1:7101", "http://127.0.0.1:7102"
KEYS = Keys()
RUNNING = KEYS.running("example")
FAST = RetryPolicy(initial_s=0.001, max_delay_s=0.01, attempts=200)
GATE_CFG = ElectionConfig(ttl_s=3, safety_margin_s=0.5, loop_interval_s=0.1, switch_delay_s=0.3)


def elect(coord: MemoryCoordinator, node: str, url: str) -> int:
    """Make ``node`` the leader: replace the running key; returns the new epoch."""
    coord.delete(RUNNING)
    coord.put(RUNNING, json.dumps({"node": node, "url": url}).encode())
    kv = coord.get(RUNNING)
    assert kv is not None
    return kv.create_revision


def test_resolver_follows_the_running_key_by_watch() -> None:
    coord = MemoryCoordinator()
    resolver = EtcdResolver(coord, KEYS, "example")
    resolver.start()
    try:
        assert resolver.current() is None
        epoch = elect(coord, "n1", A)
        leader = resolver.current()
        assert leader is not None and (leader.url, leader.epoch, leader.node) == (A, epoch, "n1")
        woke = threading.Event()

        def waiter() -> None:
            resolver.wait_change(60)
            woke.set()

        t = threading.Thread(target=waiter)
        t.start()
        coord.delete(RUNNING)
        t.join(30)
        assert woke.is_set()  # woken by the DELETE, long before 60 s
        assert resolver.current() is None
        epoch2 = elect(coord, "n2", B)
        leader = resolver.current()
        assert leader is not None and leader.url == B and leader.epoch == epoch2 > epoch
    finally:
        resolver.close()


def test_resolver_never_goes_back_to_a_lower_epoch() -> None:
    coord = MemoryCoordinator()
    resolver = EtcdResolver(coord, KEYS, "example")
    resolver.start()
    try:
        elect(coord, "n1", A)
        high = elect(coord, "n2", B)
        resolver._set(None)  # a DELETE seen
        from canal_cluster.running import RunningInfo

        resolver._set(RunningInfo("n1", A, high - 5))  # a stale read of an old record
        assert resolver.current() is None
        resolver.reload()
        leader = resolver.current()
        assert leader is not None and leader.url == B and leader.epoch == high
    finally:
        resolver.close()


def test_cluster_connector_follows_a_failover_seen_in_etcd(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="canal_client")
    coord = MemoryCoordinator()
    fake = FakeCluster([A, B], leader=A, entries=[entry_wire(i) for i in range(10)])
    fake.epoch = elect(coord, "n1", A)
    conn = ClusterConnector(
        "example", "1001", coordinator=coord, transport=fake.transport(), retry=FAST
    )
    with conn:
        conn.subscribe()
        first = conn.get_without_ack(4, 0)
        assert len(first.entries) == 4 and conn.epoch == fake.epoch
        old_epoch = fake.epoch
        # A is SIGKILLed: it refuses connections; later B is elected
        fake.down.add(A)
        fake.new_leader(B)
        fake.subscribed.clear()
        fake.epoch = elect(coord, "n2", B)
        second = conn.get_without_ack(4, 0)
        assert [e.header.offset for e in second.entries] == [0, 100, 200, 300]
        assert conn.leader_url == B and conn.epoch == fake.epoch > old_epoch
        conn.ack(second.id)
        assert fake.cursor == 4
    msgs = [r.getMessage() for r in caplog.records if "following leader change" in r.getMessage()]
    assert msgs == [
        f"example/1001: following leader change {A} (epoch {old_epoch}) -> {B} (epoch {fake.epoch})"
    ]


def test_cluster_connector_waits_for_a_leader() -> None:
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[entry_wire(0)])
    conn = ClusterConnector(
        "example", "1001", coordinator=coord, transport=fake.transport(),
        retry=RetryPolicy(initial_s=0.05, max_delay_s=0.05, attempts=-1),
    )  # fmt: skip
    done = threading.Event()

    def run() -> None:
        with conn:
            conn.subscribe()
            done.set()

    t = threading.Thread(target=run)
    t.start()
    assert not done.wait(0.3)  # no running key yet: connect waits
    fake.epoch = elect(coord, "n1", A)
    t.join(30)
    assert done.is_set() and fake.subscribed == {"1001": ""}


def test_gate_one_active_consumer_per_client_id() -> None:
    coord = MemoryCoordinator()
    first = ActiveGate(coord, KEYS, "example", "1001", GATE_CFG, node="c1")
    second = ActiveGate(coord, KEYS, "example", "1001", GATE_CFG, node="c2")
    first.start()
    try:
        assert first.wait_active(30)
        second.start()
        assert not second.wait_active(0.5)
        assert first.is_active()
        gen = first.generation
        first.stop()  # releases the key: the other takes over after the switch delay
        assert second.wait_active(30)
        assert not first.is_active() and first.generation == gen + 1
    finally:
        first.stop()
        second.stop()


def test_exclusive_connector_waits_then_takes_over_from_the_cursor() -> None:
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[entry_wire(i) for i in range(10)])
    fake.epoch = elect(coord, "n1", A)

    def make() -> ClusterConnector:
        return ClusterConnector(
            "example", "1001", coordinator=coord, transport=fake.transport(), retry=FAST,
            exclusive=True, election=GATE_CFG,
        )  # fmt: skip

    active, waiting = make(), make()
    active.connect()
    try:
        active.subscribe()
        wait_until(lambda: not active.get_without_ack(3, 0.2).is_empty, "active consumes", 30)
        waiting.connect()
        waiting.subscribe()
        assert waiting.get_without_ack(3, 0.3).is_empty  # not active: gets nothing
        rollbacks = fake.paths("POST").count("/v1/destinations/example/clients/1001/rollback")
        active.disconnect()  # releases the client running key
        batch = waiting.get_without_ack(3, 30)
        assert [e.header.offset for e in batch.entries] == [0, 100, 200]  # from the cursor
        after = fake.paths("POST").count("/v1/destinations/example/clients/1001/rollback")
        assert after == rollbacks + 1  # rolled back on taking over
    finally:
        active.disconnect()
        waiting.disconnect()


def test_disconnect_stops_a_call_waiting_for_a_leader() -> None:
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[])
    fake.epoch = elect(coord, "n1", A)
    forever = RetryPolicy(initial_s=0.05, max_delay_s=5.0, attempts=-1)
    conn = ClusterConnector(
        "example", "1001", coordinator=coord, transport=fake.transport(), retry=forever
    )
    conn.connect()
    conn.subscribe()
    fake.down.add(A)  # the leader died; its running key has not expired yet
    failures: list[BaseException] = []

    def call() -> None:
        try:
            conn.get_without_ack(1, 0)
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=call)
    t.start()
    wait_until(lambda: any(u == A for (u, _, p) in fake.calls if p.endswith("batches")),
               "the call tried the dead leader", 30)  # fmt: skip
    conn.disconnect()
    t.join(30)
    assert not t.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], ClientError), failures


def exclusive(
    coord: MemoryCoordinator, transport: httpx.BaseTransport, **kw: Any
) -> ClusterConnector:
    return ClusterConnector(
        "example", "1001", coordinator=coord, transport=transport, retry=FAST,
        exclusive=True, election=GATE_CFG, **kw,
    )  # fmt: skip


def offsets(batch: Batch) -> list[int]:
    return [e.header.offset for e in batch.entries]


def test_an_exclusive_connector_with_an_injected_coordinator_connects_again() -> None:
    """Only a connector that made its own etcd client cannot connect again (docs/api.md):
    the gate's monitor, which runs once, is a new one after ``disconnect``."""
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[entry_wire(i) for i in range(3)])
    fake.epoch = elect(coord, "n1", A)
    conn = exclusive(coord, fake.transport())
    conn.connect()
    try:
        conn.subscribe()
        assert offsets(conn.get_without_ack(3, 30)) == [0, 100, 200]
        conn.disconnect()
        conn.connect()  # a new term of the client running key
        assert offsets(conn.get_without_ack(3, 30)) == [0, 100, 200]  # rolled back: again
    finally:
        conn.disconnect()


class HeldGet:
    """A transport in front of ``fake`` that holds the next get once ``arm`` is set:
    a long poll in flight, which takes its batch only when ``release`` is set."""

    def __init__(self, fake: FakeCluster) -> None:
        self.fake = fake
        self.arm, self.held, self.release = threading.Event(), threading.Event(), threading.Event()
        self.refuse = False  # connections refused once the held get has its answer

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.refuse:
            raise httpx.ConnectError("connection refused", request=request)
        if self.arm.is_set() and request.method == "POST" and request.url.path.endswith("/batches"):
            self.arm.clear()
            self.held.set()
            assert self.release.wait(30)
        return self.fake.handle(request)


def cut_from_etcd(conn: ClusterConnector, coord: MemoryCoordinator) -> None:
    """``conn``'s process loses etcd: its client monitor makes no keepalive, the role
    ends at its fencing deadline, and etcd expires its lease (revoked here at once)."""
    gate = conn._gate
    assert gate is not None
    lease = gate._monitor._lease
    assert lease is not None
    gate._monitor.stop(release=False)
    wait_until(lambda: not gate.is_active(), "the consumer's role ended at its deadline", 30)
    coord.revoke(lease)


def lose_role_during_get(
    coord: MemoryCoordinator, held: HeldGet, first: ClusterConnector, second: ClusterConnector
) -> tuple[threading.Thread, list[Batch], Batch]:
    """``first`` is active and its get waits at the leader (``held``) while it loses
    etcd and ``second`` takes over (rolling back on connect) and gets its first batch;
    then the held get takes a batch. The thread of that get, its result, ``second``'s batch."""
    first.connect()
    first.subscribe()
    running = KEYS.client_running("example", "1001")
    wait_until(lambda: coord.get(running) is not None, "the first consumer's running key", 30)
    second.connect()
    second.subscribe()
    held.arm.set()
    got: list[Batch] = []
    t = threading.Thread(target=lambda: got.append(first.get_without_ack(3, 5)))
    t.start()
    assert held.held.wait(30)
    cut_from_etcd(first, coord)
    batch = second.get_without_ack(3, 30)  # waits for the role, rolls back, gets
    return t, got, batch


def test_a_batch_taken_after_the_role_was_lost_comes_to_the_next_active_consumer() -> None:
    """A's get outlives its active role (A lost etcd, not the leader): the batch it takes
    after B took over and rolled back on connect is dropped by A; B must receive it (B's
    ack of the batch after it acks it too: unseen, lost)."""
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[entry_wire(i) for i in range(12)])
    fake.epoch = elect(coord, "n1", A)
    held = HeldGet(fake)
    first, second = (
        exclusive(coord, httpx.MockTransport(held.handle)),
        exclusive(coord, fake.transport()),
    )
    try:
        t, got, batch = lose_role_during_get(coord, held, first, second)
        held.release.set()
        t.join(30)
        assert got and got[0].is_empty  # dropped: not the active consumer
        seen = offsets(batch)
        while not batch.is_empty:
            batch = second.get_without_ack(3, 0, ack=batch.id)
            seen += offsets(batch)
        assert seen == [100 * i for i in range(12)]
    finally:
        held.release.set()
        first.disconnect()
        second.disconnect()


def test_a_dropped_batch_the_leader_cannot_take_back_is_given_up_in_bounded_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The rollback of a dropped batch is tried for ``request_timeout_s`` at most; then
    the get returns (empty, not the active consumer) and an error names the batch."""
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[entry_wire(i) for i in range(12)])
    fake.epoch = elect(coord, "n1", A)
    held = HeldGet(fake)
    first = exclusive(coord, httpx.MockTransport(held.handle), request_timeout_s=0.5)
    second = exclusive(coord, fake.transport())
    try:
        t, got, _ = lose_role_during_get(coord, held, first, second)
        calls = len(fake.calls)
        held.refuse = True  # the leader is no longer reachable once it answered the get
        held.release.set()
        t.join(30)
        assert not t.is_alive() and got and got[0].is_empty
        assert len(fake.calls) == calls + 1  # the get; no rollback got through
        assert any("could not roll back batch 2" in r.getMessage() and r.levelno == logging.ERROR
                   for r in caplog.records)  # fmt: skip
    finally:
        held.release.set()
        first.disconnect()
        second.disconnect()


def test_an_active_consumers_long_poll_ends_by_its_fencing_deadline() -> None:
    """Past the deadline another consumer can take over and roll back on connect: a
    batch the poll took after that would be acked unseen by the next one's acks."""
    coord = MemoryCoordinator()
    fake = FakeCluster([A], leader=A, entries=[])
    fake.epoch = elect(coord, "n1", A)
    with exclusive(coord, fake.transport()) as conn:
        conn.subscribe()
        assert conn.get_without_ack(3, 30).is_empty
    waits = [b["timeout_ms"] for b in fake.bodies if isinstance(b, dict) and "timeout_ms" in b]
    assert waits and max(waits) <= (GATE_CFG.ttl_s - GATE_CFG.safety_margin_s) * 1000
