"""MemoryMetaManager: subscriptions, cursors, marks, batch ids, snapshots."""

from __future__ import annotations

import json

import pytest
from serving_fixtures import EntryFactory, position_of

from canal_server.meta import MemoryMetaManager, MetaSnapshot, PositionRange


def _range(fac: EntryFactory) -> PositionRange:
    a, b = fac.rows(2)
    return PositionRange(position_of(a), position_of(b))


def test_position_range_round_trips_through_json() -> None:
    r = _range(EntryFactory())
    assert PositionRange.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_subscribe_is_idempotent_and_changes_filter() -> None:
    meta = MemoryMetaManager("d")
    meta.subscribe("c1", "a\\..*")
    v = meta.version
    meta.subscribe("c1", "a\\..*")
    assert meta.version == v, "same subscription again changes nothing"
    meta.subscribe("c1", "b\\..*")
    assert meta.subscription("c1") == "b\\..*"
    meta.subscribe("c0", "")
    assert meta.clients() == ["c0", "c1"]
    assert meta.is_subscribed("c0") and not meta.is_subscribed("zz")


def test_batch_ids_grow_and_survive_unsubscribe() -> None:
    fac = EntryFactory()
    meta = MemoryMetaManager("d")
    meta.subscribe("c", "")
    ranges = [_range(fac) for _ in range(3)]
    assert [meta.add_batch("c", r) for r in ranges] == [1, 2, 3]
    assert meta.remove_batch("c", 2) == ranges[1]
    assert meta.remove_batch("c", 2) is None
    assert meta.batches("c") == [(1, ranges[0]), (3, ranges[2])]
    assert meta.batch("c", 3) == ranges[2]
    meta.update_cursor("c", ranges[0].end)
    meta.unsubscribe("c")
    assert meta.clients() == [] and meta.cursor("c") is None and meta.batches("c") == []
    meta.subscribe("c", "")
    assert meta.cursor("c") is None
    assert meta.add_batch("c", ranges[0]) == 4, "ids never repeat for a client id"


def test_writes_to_unsubscribed_client_raise_key_error() -> None:
    meta = MemoryMetaManager("d")
    r = _range(EntryFactory())
    with pytest.raises(KeyError):
        meta.add_batch("c", r)
    with pytest.raises(KeyError):
        meta.update_cursor("c", r.end)
    assert meta.cursor("c") is None and meta.batch("c", 1) is None


def test_snapshot_restore_round_trip_and_versions() -> None:
    fac = EntryFactory()
    meta = MemoryMetaManager("d")
    meta.subscribe("a", "x\\..*")
    meta.subscribe("b", "")
    r1, r2 = _range(fac), _range(fac)
    meta.add_batch("a", r1)
    meta.add_batch("a", r2)
    meta.update_cursor("b", r1.end)
    meta.unsubscribe("b")
    meta.subscribe("b", "")
    snap = meta.snapshot()
    assert not meta.dirty_since(snap.version)
    meta.remove_batch("a", 1)
    assert meta.dirty_since(snap.version)
    assert snap.clients["a"].batches == ((1, r1), (2, r2)), "snapshots are immutable copies"

    wire = json.loads(json.dumps(snap.to_dict()))
    other = MemoryMetaManager("d")
    other.restore(MetaSnapshot.from_dict(wire))
    assert other.clients() == ["a", "b"]
    assert other.batches("a") == [(1, r1), (2, r2)]
    assert other.subscription("a") == "x\\..*"
    assert other.last_batch_id("b") == 0
    assert other.add_batch("a", r1) == 3
    assert other.version > snap.version
    with pytest.raises(ValueError, match="restored into"):
        MemoryMetaManager("e").restore(snap)
