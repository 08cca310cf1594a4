"""PeriodicMetaManager: fenced flushes of subscriptions, cursors and marks to etcd."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from coord_fixtures import ETCD_CFG, ETCD_TIMEOUT_S, WAIT_S, FakeClock, etcd_endpoints
from memory_coordinator import MemoryCoordinator

from canal_cluster.coordinator import Coordinator
from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_cluster.running import Reason, RunningMonitor
from canal_protocol.errors import CoordinatorUnavailable, Fenced
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.meta import PositionRange
from canal_server.meta.periodic import MAX_TXN_OPS, PeriodicMetaManager

__all__ = ["etcd_endpoints"]  # fixture used below

D, C = "d1", "c1"
SOURCE = LogIdentity("127.0.0.1:3306", 1001)


def pos(offset: int) -> LogPosition:
    return LogPosition(
        SOURCE, EntryPosition("mariadb-bin.000001", offset, 1, f"0-1-{offset}", offset)
    )


def rng(a: int, b: int) -> PositionRange:
    return PositionRange(pos(a), pos(b))


def stored(coord: Coordinator, key: str) -> object:
    kv = coord.get(key)
    return json.loads(kv.value) if kv is not None else None


@pytest.fixture
def mem() -> MemoryCoordinator:
    return MemoryCoordinator(clock=FakeClock())


def lead(coord: Coordinator, keys: Keys, node: str = "n1") -> int:
    result = coord.campaign(
        keys.running(D), json.dumps({"node": node}).encode(), coord.grant_lease(30)
    )
    assert result.won and result.epoch is not None
    return result.epoch


@pytest.fixture
def meta(mem: MemoryCoordinator) -> Iterator[PeriodicMetaManager]:
    m = PeriodicMetaManager(mem, Keys(), D, flush_period_ms=3_600_000)
    m.activate(lead(mem, Keys()))
    yield m
    m.deactivate(final_flush=False)


def test_flush_writes_the_exact_state_then_only_differences(
    mem: MemoryCoordinator, meta: PeriodicMetaManager
) -> None:
    k = Keys()
    meta.subscribe(C, "db\\..*")
    b1 = meta.add_batch(C, rng(100, 200))
    b2 = meta.add_batch(C, rng(300, 400))
    meta.remove_batch(C, b1)
    meta.update_cursor(C, pos(200))
    assert meta.flush()
    assert stored(mem, k.cursor(D, C)) == pos(200).to_dict()
    assert stored(mem, k.subscription(D, C)) == {
        "filter": "db\\..*", "subscribed": True, "last_batch_id": 2,
    }  # fmt: skip
    marks = mem.get_prefix(k.marks_prefix(D, C)).items
    assert [m.key for m in marks] == [k.mark(D, C, b2)]
    assert json.loads(marks[0].value) == rng(300, 400).to_dict()
    assert not meta.flush()  # nothing changed
    calls = mem.calls
    meta.remove_batch(C, b2)
    meta.update_cursor(C, pos(400))
    assert meta.flush()
    assert mem.calls == calls + 1  # one fenced transaction
    assert mem.get_prefix(k.marks_prefix(D, C)).items == ()
    assert stored(mem, k.cursor(D, C)) == pos(400).to_dict()


def test_failed_flush_is_retried_never_dropped(
    mem: MemoryCoordinator, meta: PeriodicMetaManager
) -> None:
    meta.subscribe(C, "")
    meta.update_cursor(C, pos(10))
    mem.available = False
    with pytest.raises(CoordinatorUnavailable):
        meta.flush()
    meta.update_cursor(C, pos(20))
    with pytest.raises(CoordinatorUnavailable):
        meta.flush()
    mem.available = True
    assert meta.flush()
    assert stored(mem, Keys().cursor(D, C)) == pos(20).to_dict()


def test_stale_epoch_flush_is_fenced_and_reported(mem: MemoryCoordinator) -> None:
    k = Keys()
    reported: list[int] = []
    meta = PeriodicMetaManager(mem, k, D, flush_period_ms=3_600_000, on_fenced=reported.append)
    epoch = lead(mem, k)
    meta.activate(epoch)
    mem.delete(k.running(D))
    lead(mem, k, "n2")  # someone else leads now
    meta.subscribe(C, "")
    meta.update_cursor(C, pos(10))
    with pytest.raises(Fenced):
        meta.flush()
    assert reported == [epoch]
    assert mem.get(k.cursor(D, C)) is None
    assert meta.epoch is None and not meta.flush()


def test_activation_loads_subscriptions_cursors_marks_and_batch_ids(
    mem: MemoryCoordinator, meta: PeriodicMetaManager
) -> None:
    meta.subscribe(C, "f1")
    meta.subscribe("c2", "f2")
    for i in range(3):
        meta.add_batch(C, rng(i * 10, i * 10 + 5))
    meta.remove_batch(C, 1)
    meta.update_cursor(C, pos(5))
    for bid, _ in meta.batches("c2"):
        meta.remove_batch("c2", bid)
    b = meta.add_batch("c2", rng(1, 2))
    meta.remove_batch("c2", b)  # no mark left, only the counter
    meta.subscribe("c3", "")
    meta.add_batch("c3", rng(1, 2))
    meta.unsubscribe("c3")  # only its batch id counter remains
    meta.deactivate()  # final flush
    before = meta.snapshot()
    other = PeriodicMetaManager(mem, Keys(), D, flush_period_ms=3_600_000)
    other.activate(before_epoch := lead_again(mem))
    try:
        assert other.epoch == before_epoch
        after = other.snapshot()
        assert dict(after.clients) == dict(before.clients)
        assert other.add_batch(C, rng(50, 60)) == 4
        assert other.add_batch("c2", rng(50, 60)) == 2
        assert not other.is_subscribed("c3") and other.last_batch_id("c3") == 1
    finally:
        other.deactivate(final_flush=False)


def lead_again(mem: MemoryCoordinator) -> int:
    mem.delete(Keys().running(D))
    return lead(mem, Keys(), "n2")


def test_large_changes_are_split_into_several_transactions(
    mem: MemoryCoordinator, meta: PeriodicMetaManager
) -> None:
    meta.subscribe(C, "")
    n = 2 * MAX_TXN_OPS + 7
    for i in range(n):
        meta.add_batch(C, rng(i, i + 1))
    assert meta.flush()
    assert len(mem.get_prefix(Keys().marks_prefix(D, C)).items) == n


def test_flusher_thread_writes_every_period(mem: MemoryCoordinator) -> None:
    meta = PeriodicMetaManager(mem, Keys(), D, flush_period_ms=20)
    meta.activate(lead(mem, Keys()))
    try:
        meta.subscribe(C, "")
        meta.update_cursor(C, pos(77))
        key = Keys().cursor(D, C)
        wait_until(lambda: stored(mem, key) == pos(77).to_dict(), "periodic flush", WAIT_S)
    finally:
        meta.deactivate(final_flush=False)


# -- with the real etcd and the election ----------------------------------------------------


def _deactivator(meta: PeriodicMetaManager) -> Callable[[int], None]:
    return lambda _epoch: meta.deactivate()


def test_acks_then_graceful_stop_leave_the_exact_cursor_in_etcd(etcd_endpoints: list[str]) -> None:
    keys = Keys(f"/t-{uuid.uuid4().hex[:12]}")
    coords = [EtcdCoordinator(etcd_endpoints, timeout_s=ETCD_TIMEOUT_S) for _ in range(2)]
    metas = [PeriodicMetaManager(co, keys, D, flush_period_ms=3_600_000) for co in coords]
    monitors = [
        RunningMonitor(co, keys.running(D), f"n{i}", "", ETCD_CFG, m.activate, _deactivator(m))
        for i, (co, m) in enumerate(zip(coords, metas, strict=True))
    ]
    try:
        monitors[0].start()
        wait_until(monitors[0].is_leader, "n0 leads", WAIT_S)
        monitors[1].start()
        m0 = metas[0]
        m0.subscribe(C, "")
        for i in range(5):
            m0.add_batch(C, rng(i * 100, i * 100 + 99))
        for bid in (1, 2, 3):  # ack three of five
            m0.remove_batch(C, bid)
            m0.update_cursor(C, pos(bid * 100 - 1))
        monitors[0].stop()  # graceful: final flush with the epoch, then release
        assert stored(coords[1], keys.cursor(D, C)) == pos(299).to_dict()
        marks = coords[1].get_prefix(keys.marks_prefix(D, C)).items
        assert [Keys.batch_id_of(kv.key) for kv in marks] == [4, 5]
        wait_until(monitors[1].is_leader, "n1 takes over", WAIT_S)
        assert metas[1].cursor(C) == pos(299)
        assert [b for b, _ in metas[1].batches(C)] == [4, 5]
        assert metas[1].add_batch(C, rng(900, 999)) == 6
    finally:
        for mon in monitors:
            mon.stop()
        coords[0].delete(keys.prefix, prefix=True)
        for co in coords:
            co.close()


def test_stale_epoch_flush_on_etcd_makes_the_leader_step_down(etcd_endpoints: list[str]) -> None:
    keys = Keys(f"/t-{uuid.uuid4().hex[:12]}")
    coord = EtcdCoordinator(etcd_endpoints, timeout_s=ETCD_TIMEOUT_S)
    zombie = RunningMonitor(coord, keys.running(D), "z", "", ETCD_CFG)  # driven by hand
    meta = PeriodicMetaManager(coord, keys, D, 3_600_000, on_fenced=zombie.report_fenced)
    try:
        assert zombie.cycle(time.monotonic()) is Reason.WON
        epoch = zombie.leader_epoch()
        assert epoch is not None
        meta.activate(epoch)
        coord.delete(keys.running(D))  # deposed behind its back
        lead(coord, keys, "n2")
        meta.subscribe(C, "")
        meta.update_cursor(C, pos(1))
        with pytest.raises(Fenced):
            meta.flush()
        assert coord.get(keys.cursor(D, C)) is None
        assert not zombie.is_leader()
        assert zombie.cycle(time.monotonic()) is Reason.STALE_EPOCH
    finally:
        meta.deactivate(final_flush=False)
        zombie.stop()
        coord.delete(keys.prefix, prefix=True)
        coord.close()


def test_origin_is_flushed_and_loaded_by_the_next_leader(
    mem: MemoryCoordinator, meta: PeriodicMetaManager
) -> None:
    meta.set_origin(pos(4))
    assert meta.flush()
    assert stored(mem, Keys().origin(D)) == pos(4).to_dict()
    meta.deactivate(final_flush=False)
    other = PeriodicMetaManager(mem, Keys(), D, flush_period_ms=3_600_000)
    other.activate(lead_again(mem))
    try:
        assert other.origin() == pos(4)
        assert other.clients() == []
    finally:
        other.deactivate(final_flush=False)


def test_a_cursor_inside_a_compressed_transaction_round_trips_through_etcd(
    etcd_endpoints: list[str],
) -> None:
    """A cursor after the first entries of a MySQL 8 compressed transaction keeps its
    ``part`` through etcd; a cursor written without one (before parts existed) loads
    with part 0."""
    keys = Keys(f"/t-{uuid.uuid4().hex[:12]}")
    coord = EtcdCoordinator(etcd_endpoints, timeout_s=ETCD_TIMEOUT_S)
    inside = LogPosition(SOURCE, EntryPosition("mysql-bin.000001", 274, 1, "", 1000, part=3))
    try:
        first = PeriodicMetaManager(coord, keys, D, flush_period_ms=3_600_000)
        first.activate(lead(coord, keys))
        first.subscribe(C, "")
        first.subscribe("old", "")
        first.update_cursor(C, inside)
        first.update_cursor("old", pos(431))
        first.deactivate()  # the final flush
        assert stored(coord, keys.cursor(D, C)) == {
            "identity": SOURCE.to_dict(),
            "position": {"journal": "mysql-bin.000001", "offset": 274, "server_id": 1,
                         "gtid": "", "timestamp_ms": 1000, "included": False, "part": 3},
        }  # fmt: skip
        old = pos(431).to_dict()
        assert "part" not in old["position"]
        coord.put(keys.cursor(D, "old"), json.dumps(old).encode())
        coord.delete(keys.running(D))
        second = PeriodicMetaManager(coord, keys, D, flush_period_ms=3_600_000)
        second.activate(lead(coord, keys, "n2"))
        try:
            assert second.cursor(C) == inside
            assert second.cursor("old") == pos(431)
        finally:
            second.deactivate(final_flush=False)
    finally:
        coord.delete(keys.prefix, prefix=True)
        coord.close()
