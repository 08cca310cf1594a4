"""EmbeddedServer: subscribe / get / ack / rollback semantics over a real store and meta."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_fixtures import IDENTITY, EntryFactory, position_of

from canal_protocol.batch import Batch
from canal_protocol.entry import Entry
from canal_protocol.errors import (
    BatchUnavailable,
    InvalidArgument,
    NotSubscribed,
    StoreClosed,
    UnknownBatch,
)
from canal_server.embedded import EmbeddedServer
from canal_server.meta import MemoryMetaManager, MetaSnapshot
from canal_server.store import EventStore

WAIT_S = 30.0


def _server(buffer_size: int = 1024) -> tuple[EmbeddedServer, EventStore, EntryFactory]:
    store = EventStore("d", buffer_size=buffer_size)
    return EmbeddedServer("d", store, MemoryMetaManager("d")), store, EntryFactory()


def _put(store: EventStore, entries: list[Entry]) -> list[Entry]:
    assert store.put(entries, IDENTITY) == len(entries)
    return entries


def test_get_ack_moves_cursor_and_frees_store() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    entries = _put(store, fac.rows(5))
    b1 = server.get_without_ack("c", 2)
    b2 = server.get_without_ack("c", 2)
    assert (b1.id, list(b1.entries)) == (1, entries[:2])
    assert (b2.id, list(b2.entries)) == (2, entries[2:4])
    assert b1.start == position_of(entries[0]) and b1.end == position_of(entries[1])
    assert server.cursor("c") is None
    server.ack("c", 2)
    assert server.cursor("c") == position_of(entries[3])
    assert store.stats()[0] == 1
    b3 = server.get_without_ack("c", 10)
    assert (b3.id, list(b3.entries)) == (3, entries[4:])


def test_empty_batch_when_nothing_arrives_and_long_poll_wakes_on_put() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    empty = server.get_without_ack("c", 10, timeout_s=0.05)
    assert empty == Batch.empty() and empty.to_wire() == {"id": -1, "entries": []}
    result: list[Batch] = []
    t = threading.Thread(target=lambda: result.append(server.get_without_ack("c", 10, WAIT_S)))
    t.start()
    entries = _put(store, fac.rows(2))
    t.join(WAIT_S)
    assert result and result[0].id == 1 and result[0].entries[0] == entries[0]


def test_ack_is_cumulative_and_unknown_ids_are_refused_clearly() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    _put(store, fac.rows(6))
    ids = [server.get_without_ack("c", 2).id for _ in range(3)]
    assert ids == [1, 2, 3]
    server.ack("c", 2)
    with pytest.raises(UnknownBatch, match="not outstanding"):
        server.ack("c", 1)
    with pytest.raises(UnknownBatch, match="never issued"):
        server.ack("c", 4)
    with pytest.raises(UnknownBatch, match="never issued"):
        server.ack("c", -1)
    server.ack("c", 3)
    with pytest.raises(UnknownBatch):
        server.get_batch("c", 3)


def test_rollback_one_batch_and_later_then_redeliver() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    entries = _put(store, fac.rows(6))
    for _ in range(3):
        server.get_without_ack("c", 2)
    server.rollback("c", 2)
    with pytest.raises(UnknownBatch):
        server.ack("c", 3)
    again = server.get_without_ack("c", 10)
    assert again.id == 4 and list(again.entries) == entries[2:]
    server.rollback("c")
    with pytest.raises(UnknownBatch):
        server.rollback("c", 4)
    redo = server.get_without_ack("c", 10)
    assert list(redo.entries) == entries
    server.rollback("never-subscribed")  # like Canal: clients roll back on connect


def test_get_batch_returns_the_same_entries() -> None:
    server, store, fac = _server()
    server.subscribe("c", "db\\.keep")
    entries = _put(store, [*fac.tx("db", "keep", 2), *fac.tx("db", "drop", 2)])
    b = server.get_without_ack("c", 100)
    assert list(b.entries) == entries[:4]
    assert server.get_batch("c", b.id) == b


def test_get_auto_acks() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    entries = _put(store, fac.rows(3))
    b = server.get("c", 3)
    assert list(b.entries) == entries
    assert server.cursor("c") == position_of(entries[-1])
    with pytest.raises(UnknownBatch):
        server.ack("c", b.id)


def test_errors_for_unsubscribed_and_bad_arguments() -> None:
    server, _, _ = _server()
    with pytest.raises(NotSubscribed):
        server.get_without_ack("c", 1)
    with pytest.raises(NotSubscribed):
        server.ack("c", 1)
    with pytest.raises(NotSubscribed):
        server.rollback("c", 1)
    with pytest.raises(NotSubscribed):
        server.cursor("c")
    server.subscribe("c")
    for size in (0, -1, 65537):
        with pytest.raises(InvalidArgument) as info:
            server.get_without_ack("c", size)
        assert info.value.field == "size"
    with pytest.raises(InvalidArgument) as info:
        server.get_without_ack("c", 1, timeout_s=-1)
    assert info.value.field == "timeout"
    for bad in ("c/../x", "", "x" * 65, "running"):
        with pytest.raises(InvalidArgument) as info:
            server.subscribe(bad)
        assert info.value.field == "client_id"
    with pytest.raises(InvalidArgument) as info:
        server.subscribe("c", "db\\.(")
    assert info.value.field == "filter"


def test_client_filter_narrows_and_skips_filtered_stretches() -> None:
    server, store, fac = _server()
    server.subscribe("c", "shop\\..*")
    skipped = _put(store, fac.tx("other", "t", 3))
    assert server.get_without_ack("c", 10, timeout_s=0.01).is_empty
    assert server.cursor("c") == position_of(skipped[-1]), "a filtered stretch is skipped"
    assert store.stats()[0] == 0, "and freed"
    wanted = _put(store, fac.tx("shop", "orders", 2))
    _put(store, fac.tx("other", "t", 1))
    b = server.get_without_ack("c", 100)
    assert list(b.entries) == wanted


def test_filtered_stretch_with_outstanding_batch_waits_for_ack() -> None:
    server, store, fac = _server()
    server.subscribe("c", "shop\\..*")
    first = _put(store, fac.tx("shop", "orders", 1))
    b1 = server.get_without_ack("c", 100)
    other = _put(store, fac.tx("other", "t", 2))
    assert server.get_without_ack("c", 100, timeout_s=0.01).is_empty
    server.ack("c", b1.id)
    assert server.cursor("c") == position_of(first[-1])
    assert server.get_without_ack("c", 100, timeout_s=0.01).is_empty
    assert server.cursor("c") == position_of(other[-1])


def test_subscribe_later_from_earliest_starts_at_first_stored_entry_clients_independent() -> None:
    server, store, fac = _server()
    server.subscribe("a")
    entries = _put(store, fac.rows(4))
    server.ack("a", server.get_without_ack("a", 2).id)
    server.subscribe("b", start="earliest")  # the default, latest, would skip all four
    assert list(server.get_without_ack("b", 10).entries) == entries[2:]
    assert list(server.get_without_ack("a", 10).entries) == entries[2:]
    server.subscribe("b")  # idempotent: keeps its outstanding batch
    assert [bid for bid, _ in server.meta.batches("b")] == [1]


def test_store_frees_only_what_every_client_acked_and_unsubscribe_releases() -> None:
    server, store, fac = _server()
    server.subscribe("a")
    server.subscribe("b")
    _put(store, fac.rows(4))
    server.get("a", 4)
    assert store.stats()[0] == 4
    server.get("b", 1)
    assert store.stats()[0] == 3
    server.unsubscribe("b")
    assert store.stats()[0] == 0
    with pytest.raises(NotSubscribed):
        server.get_without_ack("b", 1)
    server.unsubscribe("b")  # idempotent


def test_a_latest_subscription_to_a_full_store_lets_the_blocked_reader_go_on() -> None:
    """Nobody subscribed and the store filled, so the reader's put blocks; a client then
    subscribes at ``latest``: what lies before its start is freed and the put goes on,
    else the client waited for entries the reader could never put."""
    server, store, fac = _server(buffer_size=2)
    first = _put(store, fac.rows(2))
    later = fac.rows(3)
    writer = threading.Thread(target=lambda: store.put(later, IDENTITY), daemon=True)
    writer.start()
    assert server.subscribe("c").cursor == position_of(first[-1])
    got: list[Entry] = []
    while len(got) < len(later):
        b = server.get_without_ack("c", 5, timeout_s=WAIT_S)
        assert not b.is_empty, "the reader's put must go on"
        got.extend(b.entries)
        server.ack("c", b.id)
    writer.join(WAIT_S)
    assert got == later and not writer.is_alive()


def test_backpressure_reader_and_consumer_threads_deliver_everything_in_order() -> None:
    server, store, fac = _server(buffer_size=8)
    server.subscribe("c")
    entries = fac.rows(300)
    writer = threading.Thread(target=lambda: store.put(entries, IDENTITY))
    writer.start()
    got: list[Entry] = []
    while len(got) < len(entries):
        b = server.get_without_ack("c", 5, timeout_s=WAIT_S)
        assert not b.is_empty, "the writer must make progress"
        assert store.stats()[0] <= 8
        got.extend(b.entries)
        server.ack("c", b.id)
    writer.join(WAIT_S)
    assert got == entries


def test_stop_wakes_a_long_poll_with_store_closed() -> None:
    server, store, _ = _server()
    server.subscribe("c")
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            server.get_without_ack("c", 1, timeout_s=WAIT_S)
        except StoreClosed as exc:
            errors.append(exc)

    t = threading.Thread(target=poll)
    t.start()
    store.stop()
    t.join(WAIT_S)
    assert errors and isinstance(errors[0], StoreClosed)


def test_restart_resumes_from_cursor_and_serves_outstanding_batch_by_range() -> None:
    """A new leader: fresh store refilled by the reader from before the cursor, meta restored."""
    server, store, fac = _server()
    server.subscribe("c", "db\\..*")
    entries = _put(store, fac.rows(6))
    server.ack("c", server.get_without_ack("c", 2).id)
    outstanding = server.get_without_ack("c", 2)
    snap = MetaSnapshot.from_dict(json.loads(json.dumps(server.meta.snapshot().to_dict())))

    store2 = EventStore("d")
    meta2 = MemoryMetaManager("d")
    meta2.restore(snap)
    server2 = EmbeddedServer("d", store2, meta2)
    with pytest.raises(BatchUnavailable):
        server2.get_batch("c", outstanding.id, timeout_s=0.01)
    _put(store2, entries[1:4])  # the reader restarts before the cursor
    assert server2.get_batch("c", outstanding.id) == outstanding
    nxt = server2.get_without_ack("c", 10, timeout_s=0.01)
    assert nxt.is_empty, "nothing after the outstanding batch is stored yet"
    _put(store2, entries[4:])
    nxt = server2.get_without_ack("c", 10)
    assert nxt.id == outstanding.id + 1 and list(nxt.entries) == entries[4:]
    server2.ack("c", nxt.id)
    assert server2.cursor("c") == position_of(entries[-1])
    assert store2.stats()[0] == 0

    # rolled back on reconnect instead: redelivery from the cursor, skipping stored entries
    meta3 = MemoryMetaManager("d")
    meta3.restore(snap)
    store3 = EventStore("d")
    server3 = EmbeddedServer("d", store3, meta3)
    server3.rollback("c")
    _put(store3, entries[:])
    b = server3.get_without_ack("c", 100)
    assert list(b.entries) == entries[2:]
    assert b.id == outstanding.id + 1


def test_batch_wire_forms() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    _put(store, fac.rows(2))
    b = server.get_without_ack("c", 2)
    wire = json.loads(json.dumps(b.to_json_wire()))
    assert set(wire) == {"id", "entries", "start", "end"}
    assert b.start is not None and wire["start"] == b.start.to_dict()
    back = Batch.from_wire(wire, binary_as_base64=True)
    assert back.to_json_wire() == b.to_json_wire()
    assert (back.id, back.start, back.end) == (b.id, b.start, b.end)
    assert Batch.from_wire(b.to_wire()).to_wire() == b.to_wire()


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 5)),
        st.tuples(st.just("get"), st.integers(1, 4)),
        st.tuples(st.just("ack"), st.integers(0, 3)),
        st.tuples(st.just("rollback"), st.integers(-1, 3)),
        st.tuples(st.just("reread"), st.integers(0, 3)),
    ),
    max_size=50,
)


@settings(max_examples=120, deadline=None)
@given(_ops, st.integers(2, 12))
def test_random_get_ack_rollback_delivers_each_entry_once_in_order(
    ops: list[tuple[str, int]], buffer_size: int
) -> None:
    """Acked batches, concatenated, are exactly the stored entries in order."""
    server, store, fac = _server(buffer_size)
    server.subscribe("c")
    stored: list[Entry] = []
    acked: list[Entry] = []
    outstanding: list[Batch] = []
    for op, arg in ops:
        if op == "put":
            batch = fac.rows(arg)
            stored.extend(batch[: store.put(batch, IDENTITY, timeout_s=0)])
        elif op == "get":
            b = server.get_without_ack("c", arg)
            expected_from = len(acked) + sum(len(o.entries) for o in outstanding)
            if b.is_empty:
                assert expected_from == len(stored)
                continue
            assert list(b.entries) == stored[expected_from : expected_from + len(b.entries)]
            outstanding.append(b)
        elif outstanding and op == "ack":
            idx = min(arg, len(outstanding) - 1)
            server.ack("c", outstanding[idx].id)
            for done in outstanding[: idx + 1]:
                acked.extend(done.entries)
            del outstanding[: idx + 1]
        elif op == "rollback" and (arg < 0 or not outstanding):
            server.rollback("c")
            outstanding.clear()
        elif outstanding and op == "rollback":
            idx = min(arg, len(outstanding) - 1)
            server.rollback("c", outstanding[idx].id)
            del outstanding[idx:]
        elif outstanding and op == "reread":
            b = outstanding[min(arg, len(outstanding) - 1)]
            assert server.get_batch("c", b.id) == b
        assert acked == stored[: len(acked)]
        assert store.stats()[0] <= buffer_size
        assert store.stats()[0] == len(stored) - len(acked)


def test_concurrent_clients_and_writer_with_resubscribes() -> None:
    """Threads: a writer under backpressure, two consumers, a re-subscriber; no deadlock."""
    server, store, fac = _server(buffer_size=16)
    server.subscribe("a")
    server.subscribe("b", "db\\..*")
    entries = fac.rows(400)
    got: dict[str, list[Entry]] = {"a": [], "b": []}
    failures: list[BaseException] = []
    stop = threading.Event()

    def consume(client: str) -> None:
        try:
            while len(got[client]) < len(entries):
                b = server.get_without_ack(client, 7, timeout_s=WAIT_S)
                assert not b.is_empty
                got[client].extend(b.entries)
                server.ack(client, b.id)
        except BaseException as exc:
            failures.append(exc)

    def resubscribe() -> None:
        while not stop.is_set():
            server.subscribe("b", "db\\..*")
            server.subscriptions()

    threads = [
        threading.Thread(target=lambda: store.put(entries, IDENTITY)),
        threading.Thread(target=consume, args=("a",)),
        threading.Thread(target=consume, args=("b",)),
    ]
    churn = threading.Thread(target=resubscribe)
    for t in [*threads, churn]:
        t.start()
    for t in threads:
        t.join(WAIT_S * 4)
    stop.set()
    churn.join(WAIT_S)
    assert not failures
    assert not any(t.is_alive() for t in [*threads, churn])
    assert got["a"] == entries and got["b"] == entries


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.lists(st.booleans(), min_size=1, max_size=6)),
            st.tuples(st.just("get"), st.integers(1, 4)),
            st.tuples(st.just("ack"), st.integers(0, 2)),
            st.tuples(st.just("rollback"), st.integers(0, 2)),
        ),
        max_size=50,
    ),
    st.integers(2, 8),
)
def test_random_ops_with_client_filter_deliver_exactly_the_matching_entries(
    ops: list[tuple[str, Any]], buffer_size: int
) -> None:
    """Filtered stretches are skipped (never stall the store); matches arrive once, in order."""
    server, store, fac = _server(buffer_size)
    server.subscribe("c", "db\\.keep")
    wanted: list[Entry] = []
    acked: list[Entry] = []
    outstanding: list[Batch] = []
    for op, arg in ops:
        if op == "put":
            batch = [fac.entry(table="keep" if k else "drop") for k in arg]
            n = store.put(batch, IDENTITY, timeout_s=0)
            wanted.extend(e for e in batch[:n] if e.header.table == "keep")
        elif op == "get":
            b = server.get_without_ack("c", arg)
            if not b.is_empty:
                assert all(e.header.table == "keep" for e in b.entries)
                outstanding.append(b)
        elif op == "ack" and outstanding:
            idx = min(arg, len(outstanding) - 1)
            server.ack("c", outstanding[idx].id)
            for done in outstanding[: idx + 1]:
                acked.extend(done.entries)
            del outstanding[: idx + 1]
        elif op == "rollback" and outstanding:
            idx = min(arg, len(outstanding) - 1)
            server.rollback("c", outstanding[idx].id)
            del outstanding[idx:]
        assert acked == wanted[: len(acked)]
    server.rollback("c")
    while (b := server.get("c", 5)).entries:
        acked.extend(b.entries)
    assert acked == wanted
    assert store.stats()[0] == 0, "everything stored was delivered or skipped, then freed"


def test_a_retried_get_answers_the_batch_its_first_attempt_took() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    entries = _put(store, fac.rows(6))
    first = server.get_without_ack("c", 2, request_id="r1")  # its answer was lost
    again = server.get_without_ack("c", 2, request_id="r1")  # the client's retry
    assert (again.id, list(again.entries)) == (first.id, entries[:2])
    nxt = server.get_without_ack("c", 2, request_id="r2")
    assert (nxt.id, list(nxt.entries)) == (first.id + 1, entries[2:4])
    server.rollback("c", nxt.id)  # a rolled-back batch is not answered again
    redo = server.get_without_ack("c", 2, request_id="r2")
    assert list(redo.entries) == entries[2:4] and redo.id == nxt.id + 1
    auto = server.get("c", 2, request_id="r3")  # acked everything up to it
    assert server.get("c", 2, request_id="r3") == auto
    assert server.cursor("c") == position_of(entries[5])


def test_a_retry_while_the_first_attempt_still_waits_gets_the_same_batch() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    got: list[Batch] = []
    waiters = [
        threading.Thread(target=lambda: got.append(server.get_without_ack("c", 5, WAIT_S, "r")))
        for _ in range(2)
    ]
    for t in waiters:
        t.start()
    entries = _put(store, fac.rows(3))
    for t in waiters:
        t.join(WAIT_S)
    assert len(got) == 2 and got[0] == got[1]
    assert got[0].id == 1 and list(got[0].entries) == entries
    assert server.get_without_ack("c", 5, request_id="s").is_empty


def test_a_batch_holds_the_entries_of_one_database() -> None:
    """After a database switch the store holds entries of two sources: a batch never
    mixes them (its start and end name the database of every entry in it)."""
    from canal_protocol.positions import LogIdentity

    server, store, fac = _server()
    server.subscribe("c")
    old = _put(store, fac.rows(3))
    standby = LogIdentity("127.0.0.1:3307", IDENTITY.slave_id)
    new = fac.rows(3)
    assert store.put(new, standby) == 3
    first = server.get_without_ack("c", 10)
    assert list(first.entries) == old and first.end is not None
    assert first.end.identity == IDENTITY
    second = server.get_without_ack("c", 10)
    assert list(second.entries) == new and second.start is not None
    assert second.start.identity == second.end.identity == standby  # type: ignore[union-attr]
