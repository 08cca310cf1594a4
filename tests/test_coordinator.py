"""The Coordinator contract, run against the in-memory fake and the real etcd alike."""

from __future__ import annotations

import pytest
from coord_fixtures import WAIT_S, Backend, backend, etcd_endpoints

from canal_cluster.coordinator import Delete, Put, WatchEvent, WatchEventType
from canal_cluster.retry import wait_until
from canal_protocol.errors import Fenced

__all__ = ["backend", "etcd_endpoints"]  # fixtures used below


def test_campaign_first_wins_with_create_revision_as_epoch(backend: Backend) -> None:
    c, key = backend.coord, backend.key("running")
    l1, l2 = c.grant_lease(5), c.grant_lease(5)
    won = c.campaign(key, b"node-a", l1)
    assert won.won and won.epoch is not None
    kv = c.get(key)
    assert kv is not None and kv.create_revision == won.epoch and kv.lease == l1.id
    lost = c.campaign(key, b"node-b", l2)
    assert not lost.won and lost.epoch is None
    assert lost.holder is not None and lost.holder.value == b"node-a"
    assert lost.holder.create_revision == won.epoch


def test_epochs_strictly_increase_across_elections(backend: Backend) -> None:
    c, key = backend.coord, backend.key("running")
    epochs = []
    for i in range(4):
        lease = c.grant_lease(5)
        result = c.campaign(key, f"n{i}".encode(), lease)
        assert result.won and result.epoch is not None
        epochs.append(result.epoch)
        assert c.resign(key, result.epoch)
        c.revoke(lease)
    assert epochs == sorted(set(epochs))


def test_resign_deletes_only_our_own_record(backend: Backend) -> None:
    c, key = backend.coord, backend.key("running")
    lease = c.grant_lease(5)
    first = c.campaign(key, b"a", lease)
    assert first.epoch is not None
    c.revoke(lease)  # our lease is gone, someone else wins
    second = c.campaign(key, b"b", c.grant_lease(5))
    assert second.won and second.epoch is not None and second.epoch > first.epoch
    assert not c.resign(key, first.epoch)
    kv = c.get(key)
    assert kv is not None and kv.value == b"b"


def test_fenced_txn_applies_only_with_the_current_epoch(backend: Backend) -> None:
    c, key = backend.coord, backend.key("running")
    lease = c.grant_lease(5)
    epoch = c.campaign(key, b"a", lease).epoch
    assert epoch is not None
    c.put(backend.key("m/2"), b"old")
    rev = c.fenced_txn(
        key, epoch, [Put(backend.key("cursor"), b"1"), Delete(backend.key("m/"), prefix=True)]
    )
    cursor = c.get(backend.key("cursor"))
    assert cursor is not None and cursor.value == b"1" and cursor.mod_revision == rev
    assert c.get(backend.key("m/2")) is None
    with pytest.raises(Fenced):
        c.fenced_txn(key, epoch + 1000, [Put(backend.key("cursor"), b"2")])
    c.revoke(lease)
    with pytest.raises(Fenced):
        c.fenced_txn(key, epoch, [Put(backend.key("cursor"), b"3")])
    cursor = c.get(backend.key("cursor"))
    assert cursor is not None and cursor.value == b"1"


def test_expired_lease_deletes_its_keys_and_keepalive_then_fences(backend: Backend) -> None:
    c, key = backend.coord, backend.key("node")
    lease = c.grant_lease(1)
    c.register(key, b"me", lease)
    assert c.keepalive(lease) >= 1
    backend.let_lease_expire(lease, key)
    with pytest.raises(Fenced):
        c.keepalive(lease)
    c.revoke(lease)  # unknown lease: not an error


def test_revoke_deletes_registered_keys(backend: Backend) -> None:
    c = backend.coord
    lease = c.grant_lease(30)
    c.register(backend.key("cluster/n1"), b"{}", lease)
    c.register(backend.key("cluster/n2"), b"{}", lease)
    assert len(c.get_prefix(backend.key("cluster/")).items) == 2
    c.revoke(lease)
    assert c.get_prefix(backend.key("cluster/")).items == ()


def test_get_prefix_is_sorted_and_carries_revisions(backend: Backend) -> None:
    c = backend.coord
    r1 = c.put(backend.key("b"), b"2")
    r2 = c.put(backend.key("a"), b"1")
    r3 = c.put(backend.key("b"), b"3")
    assert r1 < r2 < r3
    got = c.get_prefix(backend.key(""))
    assert [kv.key for kv in got.items] == [backend.key("a"), backend.key("b")]
    b = got.items[1]
    assert (b.value, b.create_revision, b.mod_revision, b.version) == (b"3", r1, r3, 2)
    assert got.revision >= r3
    assert c.delete(backend.key(""), prefix=True) == 2
    assert c.delete(backend.key("a")) == 0


def test_watch_key_and_prefix_in_order(backend: Backend) -> None:
    c = backend.coord
    start = c.get_prefix(backend.key("")).revision + 1
    on_key: list[WatchEvent] = []
    on_prefix: list[WatchEvent] = []
    w1 = c.watch(backend.key("k"), on_key.append, start_revision=start)
    w2 = c.watch(backend.key("p/"), on_prefix.append, prefix=True, start_revision=start)
    r1 = c.put(backend.key("k"), b"v1")
    c.put(backend.key("p/1"), b"x")
    c.put(backend.key("other"), b"x")
    c.delete(backend.key("k"))
    c.delete(backend.key("p/"), prefix=True)
    wait_until(lambda: len(on_key) == 2 and len(on_prefix) == 2, "watch events", WAIT_S)
    assert [(e.type, e.key) for e in on_key] == [
        (WatchEventType.PUT, backend.key("k")),
        (WatchEventType.DELETE, backend.key("k")),
    ]
    assert on_key[0].value == b"v1" and on_key[0].create_revision == r1
    assert [e.type for e in on_prefix] == [WatchEventType.PUT, WatchEventType.DELETE]
    w1.cancel()
    w2.cancel()
    c.put(backend.key("k"), b"after-cancel")
    marker: list[WatchEvent] = []
    w3 = c.watch(backend.key("k"), marker.append, start_revision=start)
    wait_until(lambda: len(marker) == 3, "replay from start revision", WAIT_S)
    w3.cancel()
    assert len(on_key) == 2


def test_watch_sees_lease_expiry(backend: Backend) -> None:
    c, key = backend.coord, backend.key("running")
    events: list[WatchEvent] = []
    lease = c.grant_lease(1)
    epoch = c.campaign(key, b"a", lease).epoch
    assert epoch is not None
    c.watch(key, events.append, start_revision=epoch)
    backend.let_lease_expire(lease, key)
    wait_until(lambda: len(events) == 2, "put and delete seen", WAIT_S)
    assert [e.type for e in events] == [WatchEventType.PUT, WatchEventType.DELETE]
