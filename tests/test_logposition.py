"""Log position managers: memory, min cursor from meta, failback."""

from __future__ import annotations

import pytest
from serving_fixtures import IDENTITY, EntryFactory, position_of

from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.meta import MemoryMetaManager, MetaManager
from canal_server.parse.logposition import (
    FailbackLogPositionManager,
    Holders,
    LogPositionManager,
    MemoryLogPositionManager,
    MetaLogPositionManager,
)


def test_memory_manager_keeps_latest_per_destination() -> None:
    m = MemoryLogPositionManager()
    a, b = (position_of(e) for e in EntryFactory().rows(2))
    assert m.get_latest("d") is None
    m.persist("d", a)
    m.persist("d", b)
    m.persist("e", a)
    assert m.get_latest("d") == b and m.get_latest("e") == a
    m.forget("d")
    assert m.get_latest("d") is None


def test_meta_manager_gives_min_cursor_over_subscribed_clients() -> None:
    metas: dict[str, MetaManager] = {"d": MemoryMetaManager("d")}
    meta = metas["d"]
    mgr = MetaLogPositionManager(metas.get)
    assert mgr.get_latest("d") is None and mgr.get_latest("unknown") is None
    p1, p2, p3 = (position_of(e) for e in EntryFactory().rows(3))
    for c in ("a", "b", "c", "never-acked"):
        meta.subscribe(c, "")
    meta.update_cursor("a", p3)
    meta.update_cursor("b", p1)
    meta.update_cursor("c", p2)
    assert mgr.get_latest("d") == p1
    meta.unsubscribe("b")
    assert mgr.get_latest("d") == p2
    mgr.persist("d", p1)
    assert mgr.get_latest("d") == p2, "persist does not touch cursors"


def test_meta_manager_across_sources_takes_older_timestamp() -> None:
    meta = MemoryMetaManager("d")
    old = LogPosition(IDENTITY, EntryPosition("bin.000009", 900, 1, "", 1000, True))
    other = LogPosition(
        LogIdentity("127.0.0.1:3307", 1001), EntryPosition("bin.000001", 4, 2, "", 2000)
    )
    meta.subscribe("a", "")
    meta.subscribe("b", "")
    meta.update_cursor("a", other)
    meta.update_cursor("b", old)
    assert MetaLogPositionManager(lambda d: meta).get_latest("d") == old


class _Broken(LogPositionManager):
    def get_latest(self, destination: str) -> LogPosition | None:
        raise AssertionError("not asked")

    def persist(self, destination: str, position: LogPosition) -> None:
        raise OSError("disk gone")


def test_failback_reads_primary_then_secondary_and_persists_to_primary() -> None:
    p1, p2 = (position_of(e) for e in EntryFactory().rows(2))
    primary, secondary = MemoryLogPositionManager(), MemoryLogPositionManager()
    fb = FailbackLogPositionManager(primary, secondary)
    assert fb.get_latest("d") is None
    secondary.persist("d", p1)
    assert fb.get_latest("d") == p1
    fb.persist("d", p2)
    assert primary.get_latest("d") == p2 and secondary.get_latest("d") == p1
    assert fb.get_latest("d") == p2


def test_failback_persists_to_secondary_when_primary_fails() -> None:
    p1 = position_of(EntryFactory().rows(1)[0])
    secondary = MemoryLogPositionManager()
    FailbackLogPositionManager(_Broken(), secondary).persist("d", p1)
    assert secondary.get_latest("d") == p1
    with pytest.raises(OSError):
        FailbackLogPositionManager(_Broken(), _Broken()).persist("d", p1)


def test_clients_without_cursor_count_as_being_at_the_origin() -> None:
    """A new leader must not start after changes a client has not acked yet."""
    meta = MemoryMetaManager("d")
    mgr = MetaLogPositionManager(lambda d: meta)
    origin, p1, p2 = (position_of(e) for e in EntryFactory().rows(3))
    assert mgr.get_latest("d") is None, "no origin, no clients: nothing known"
    meta.set_origin(origin)
    assert mgr.get_latest("d") == origin, "no clients yet: the origin"
    meta.subscribe("acked", "")
    meta.update_cursor("acked", p2)
    assert mgr.get_latest("d") == p2
    meta.subscribe("fresh", "")
    assert mgr.get_latest("d") == origin, "a subscribed client without cursor holds the origin"
    meta.update_cursor("fresh", p1)
    assert mgr.get_latest("d") == p1


def test_origin_is_part_of_snapshot_and_version() -> None:
    meta = MemoryMetaManager("d")
    origin = position_of(EntryFactory().rows(1)[0])
    v = meta.version
    meta.set_origin(origin)
    assert meta.dirty_since(v)
    v = meta.version
    meta.set_origin(origin)
    assert not meta.dirty_since(v), "setting the same origin is no change"
    snap = meta.snapshot()
    assert snap.origin == origin
    again = MemoryMetaManager("d")
    again.restore(type(snap).from_dict(snap.to_dict()))
    assert again.origin() == origin


def test_holders_of_the_latest_position() -> None:
    """Who pins where a new leader starts: acked cursors, or the origin (and the clients
    that have no cursor yet)."""
    meta = MemoryMetaManager("d")
    mgr = MetaLogPositionManager(lambda d: meta)
    origin, p1, p2 = (position_of(e) for e in EntryFactory().rows(3))
    meta.set_origin(origin)
    assert mgr.holders("d", origin) == Holders(origin=True)
    meta.subscribe("fresh", "")
    meta.subscribe("acked", "")
    meta.update_cursor("acked", p1)
    meta.subscribe("also", "")
    meta.update_cursor("also", p1)
    assert mgr.holders("d", origin) == Holders(origin=True, without_cursor=("fresh",))
    assert mgr.holders("d", p1) == Holders(cursors=("acked", "also"))
    assert mgr.holders("d", p2) == Holders()
    assert MetaLogPositionManager(lambda d: None).holders("d", p1) == Holders()
