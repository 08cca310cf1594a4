"""EventStore: bounds, backpressure, multi-client freeing, long poll, stop."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_fixtures import IDENTITY, EntryFactory, position_of

from canal_cluster.retry import wait_until
from canal_protocol.errors import InvalidArgument, StoreClosed, StoreError
from canal_server.store import EventStore, estimate_size

WAIT_S = 30.0


def _thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def test_put_and_get_by_seq_position_and_from_head() -> None:
    fac = EntryFactory()
    store = EventStore("d")
    entries = fac.rows(5)
    assert store.put(entries, IDENTITY) == 5
    got = store.get(None, 10)
    assert [e.entry for e in got] == entries
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert [e.entry for e in store.get(2, 2)] == entries[2:4]
    assert [e.entry for e in store.get(position_of(entries[1]), 10)] == entries[2:]
    assert store.get(5, 10) == []
    assert got[0].position == position_of(entries[0])


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(InvalidArgument) as info:
        EventStore("d", buffer_size=0)
    assert info.value.field == "memory.buffer_size"
    with pytest.raises(InvalidArgument):
        EventStore("d", buffer_bytes=0)


def test_count_bound_blocks_put_until_ack() -> None:
    fac = EntryFactory()
    store = EventStore("d", buffer_size=3)
    store.register("c")
    assert store.put(fac.rows(5), IDENTITY, timeout_s=0.05) == 3
    assert store.stats()[0] == 3
    rest = fac.rows(2)
    t, result = _thread(lambda: store.put(rest, IDENTITY))
    t.join(0.2)
    assert t.is_alive() and result == [], "put must block while the store is full"
    store.ack("c", 2)
    t.join(WAIT_S)
    assert result == [2]
    assert [e.seq for e in store.get(None, 10)] == [3, 4, 5]


def test_byte_bound_and_oversized_entry_alone() -> None:
    fac = EntryFactory()
    one = estimate_size(fac.rows(1)[0])
    store = EventStore("d", buffer_size=100, buffer_bytes=one * 2)
    store.register("c")
    assert store.put(fac.rows(3), IDENTITY, timeout_s=0.05) == 2
    assert store.stats()[1] <= one * 2
    tiny = EventStore("d", buffer_bytes=10)
    tiny.register("c")
    big = fac.rows(2)
    assert tiny.put(big, IDENTITY, timeout_s=0.05) == 1, "an oversized entry fits alone"
    tiny.ack("c", 1)
    assert tiny.put(big[1:], IDENTITY, timeout_s=0.05) == 1


def test_freed_only_when_every_registered_client_acked() -> None:
    fac = EntryFactory()
    store = EventStore("d")
    store.put(fac.rows(4), IDENTITY)
    store.register("a")
    store.register("b")
    store.ack("a", 4)
    assert store.stats()[0] == 4
    store.ack("b", 2)
    assert store.stats()[0] == 2
    assert store.first_seq == 3
    with pytest.raises(StoreError):
        store.get(1, 10)
    store.unregister("b")
    assert store.stats() == (0, 0)


def test_no_client_frees_nothing_and_new_client_pins_what_is_stored() -> None:
    fac = EntryFactory()
    store = EventStore("d")
    store.register("a")
    store.put(fac.rows(3), IDENTITY)
    store.ack("a", 2)
    store.register("late")
    store.ack("a", 3)
    assert [e.seq for e in store.get(None, 10)] == [3], "late pins seq 3"
    store.unregister("a")
    store.unregister("late")
    assert store.stats()[0] == 1, "nothing is freed without clients"
    with pytest.raises(StoreError):
        store.ack("nobody", 1)


def test_a_client_registered_after_a_full_store_frees_what_it_passed() -> None:
    """Nobody subscribed, the store filled: a client registering at the end frees what
    lies before it and wakes the blocked put (it used to stay blocked for good)."""
    fac = EntryFactory()
    store = EventStore("d", buffer_size=2)
    assert store.put(fac.rows(2), IDENTITY) == 2
    rest = fac.rows(2)
    putter, result = _thread(lambda: store.put(rest, IDENTITY, timeout_s=WAIT_S))
    last = store.last_position
    assert last is not None and store.register("c", last) == last
    assert store.stats()[0] == 0 and store.freed_position == last
    putter.join(WAIT_S)
    assert result == [2]
    assert [e.entry for e in store.get(None, 10)] == rest


def test_get_long_polls_until_put() -> None:
    fac = EntryFactory()
    store = EventStore("d")
    t, result = _thread(lambda: store.get(None, 10, timeout_s=WAIT_S))
    entries = fac.rows(2)
    store.put(entries, IDENTITY)
    t.join(WAIT_S)
    assert len(result) == 1
    got = result[0]
    assert isinstance(got, list) and got[0].entry == entries[0]
    assert store.get(2, 1, timeout_s=0.01) == []


def test_stop_wakes_put_and_get_with_store_closed() -> None:
    fac = EntryFactory()
    store = EventStore("d", buffer_size=1)
    store.put(fac.rows(1), IDENTITY)
    putter, put_result = _thread(lambda: store.put(fac.rows(1), IDENTITY))
    getter, get_result = _thread(lambda: store.get(1, 1, timeout_s=WAIT_S))
    wait_until(lambda: store.stats()[0] == 1, "stored", WAIT_S)
    store.stop()
    putter.join(WAIT_S)
    getter.join(WAIT_S)
    assert isinstance(put_result[0], StoreClosed)
    assert isinstance(get_result[0], StoreClosed)
    with pytest.raises(StoreClosed):
        store.get(None, 1)


def test_find_range_and_seq_at_or_before() -> None:
    fac = EntryFactory()
    store = EventStore("d")
    store.register("c")
    entries = fac.rows(6)
    store.put(entries[:4], IDENTITY)
    assert store.find_range(position_of(entries[1]), position_of(entries[2])) == (2, 3)
    assert store.find_range(position_of(entries[2]), position_of(entries[5])) is None
    store.put(entries[4:], IDENTITY)
    assert store.find_range(position_of(entries[2]), position_of(entries[5])) == (3, 6)
    assert store.seq_at_or_before(position_of(entries[3])) == 4
    store.ack("c", 3)
    with pytest.raises(StoreError):
        store.find_range(position_of(entries[0]), position_of(entries[4]))
    assert store.seq_at_or_before(position_of(entries[0])) is None
    assert [e.seq for e in store.get_range(4, 5)] == [4, 5]


def test_get_after_position_skips_what_arrives_later_but_is_not_after() -> None:
    fac = EntryFactory()
    entries = fac.rows(4)
    store = EventStore("d")
    cursor = position_of(entries[1])
    assert store.get(cursor, 10) == []
    store.put(entries[:2], IDENTITY)
    assert store.get(cursor, 10, timeout_s=0.01) == []
    store.put(entries[2:], IDENTITY)
    assert [e.entry for e in store.get(cursor, 10)] == entries[2:]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 6)),
        st.tuples(st.just("get"), st.sampled_from(["a", "b"]), st.integers(1, 5)),
        st.tuples(st.just("ack"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("rollback"), st.sampled_from(["a", "b"])),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 6), st.integers(1, 5))
def test_store_invariants_under_random_operations(
    operations: list[tuple[object, ...]], size: int, bytes_in_entries: int
) -> None:
    """Bounds never exceeded; each client reads every entry once, in order, nothing lost."""
    fac = EntryFactory()
    one = estimate_size(fac.rows(1)[0])
    store = EventStore("d", buffer_size=size, buffer_bytes=one * bytes_in_entries)
    clients = {"a": (0, 0), "b": (0, 0)}  # client -> (acked seq, read seq)
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for c in clients:
        store.register(c)
    put_entries = []
    for op in operations:
        if op[0] == "put":
            batch = fac.rows(int(op[1]))  # type: ignore[call-overload]
            n = store.put(batch, IDENTITY, timeout_s=0)
            put_entries.extend(batch[:n])
        elif op[0] == "get":
            c = str(op[1])
            acked, read = clients[c]
            got = store.get(read, int(op[2]))  # type: ignore[call-overload]
            seen[c].extend(e.seq for e in got)
            assert [e.entry for e in got] == put_entries[read : read + len(got)]
            clients[c] = (acked, read + len(got))
        elif op[0] == "ack":
            c = str(op[1])
            store.ack(c, clients[c][1])
            clients[c] = (clients[c][1], clients[c][1])
        else:
            c = str(op[1])
            acked, read = clients[c]
            seen[c] = [s for s in seen[c] if s <= acked]
            clients[c] = (acked, acked)
        count, nbytes = store.stats()
        assert count <= size
        assert count == 1 or nbytes <= one * bytes_in_entries
        assert store.first_seq == min(a for a, _ in clients.values()) + 1
    for c, (acked, _) in clients.items():
        assert seen[c] == list(range(1, len(seen[c]) + 1))
        assert acked <= len(put_entries)
