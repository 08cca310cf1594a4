"""The Spark stream reader's offsets, acks and replays against a fake connector (no Spark).

``Engine`` plays Spark's micro-batch loop as the source sees it (MicroBatchExecution):
the offset log and the commit log are durable, the sink commits a batch atomically with
the commit log, ``commit(end)`` of batch N-1 comes after the offset of batch N is
written, and a restarted driver first re-runs a planned but uncommitted batch.
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from spark_fixtures import FakeConnector, FakeServer, arrow_rows, make_entries

from canal_client.spark import CanalOptions, CanalStreamReader, ConnectorLike
from canal_client.spark.rows import Offset, Row, entry_rows
from canal_protocol.errors import ConfigError, ReplayMismatch, UnexpectedResponse

OPTS = CanalOptions(
    destination="example",
    client_id="1001",
    servers=("fake://",),
    batch_size=4,
    max_batches_per_trigger=1,
    prefetch=False,  # the tests of the prefetch below turn it on
)
PREFETCH = CanalOptions(**{**OPTS.__dict__, "prefetch": True})


class Engine:
    def __init__(self, server: FakeServer, opts: CanalOptions = OPTS) -> None:
        self.server, self.opts = server, opts
        self.offsets: list[str] = []  # the offset log, as JSON
        self.committed = -1  # the commit log
        self.sink: dict[int, list[Row]] = {}
        self.connectors: list[FakeConnector] = []
        self.reader = self.restart()

    def restart(self, rollback_on_connect: bool = True) -> CanalStreamReader:
        def factory(_: CanalOptions) -> ConnectorLike:
            conn = FakeConnector(self.server, rollback_on_connect)
            self.connectors.append(conn)
            return conn

        self.reader = CanalStreamReader(self.opts, factory)
        return self.reader

    def offset(self, n: int) -> dict[str, Any]:
        return json.loads(self.offsets[n]) if n >= 0 else self.reader.initialOffset()

    def step(self, crash_before_run: bool = False) -> bool:
        """One trigger; False when there was nothing new."""
        last = len(self.offsets) - 1
        if last > self.committed:
            self.run(last)
            return True
        start = self.offset(last)
        end = self.reader.latestOffset(start, ReadAllAvailable())
        if end == start:
            return False
        self.offsets.append(json.dumps(end))
        if last >= 0:
            self.reader.commit(self.offset(last))
        if crash_before_run:
            self.restart()
        else:
            self.run(last + 1)
        return True

    def run(self, n: int) -> None:
        parts = self.reader.partitions(self.offset(n - 1), self.offset(n))
        # the prefetch runs while the executors do: let it end by itself (deterministic)
        assert self.reader.wait_prefetch(30), "the prefetch did not end"
        self.sink[n] = arrow_rows(b for p in parts for b in self.reader.read(p))
        self.committed = n

    def drain(self, limit: int = 1000) -> None:
        for _ in range(limit):
            if not self.step():
                return
        raise AssertionError("the stream did not drain")

    def rows(self) -> list[Row]:
        return [row for n in sorted(self.sink) for row in self.sink[n]]


def expected(entries: list[dict[str, Any]]) -> list[Row]:
    return [row for e in entries for row in entry_rows(e)]


def test_each_trigger_takes_batches_without_ack_and_commit_acks_them() -> None:
    server = FakeServer(make_entries(3, 2))  # 9 entries
    eng = Engine(server)
    assert eng.step()
    assert Offset.from_dict(eng.offset(0)).total == 4 and server.acks == []
    assert list(server.outstanding) == [1]
    assert eng.step()  # plans batch 2, then commits micro-batch 0 -> ack 1
    assert server.acks == [1] and list(server.outstanding) == [2]
    assert Offset.from_dict(eng.offset(1)).batches == (2,)
    eng.drain()
    assert eng.rows() == expected(server.entries)
    # the trigger that finds nothing more plans after the last micro-batch: Spark committed
    # it, so it is acked although Spark never calls commit for it
    assert server.acks == [1, 2, 3]
    assert server.outstanding == {}


def test_latest_offset_is_start_when_nothing_arrives() -> None:
    eng = Engine(FakeServer([]))
    start = eng.reader.initialOffset()
    assert eng.reader.latestOffset(start, ReadAllAvailable()) == start
    assert eng.reader.partitions(start, start) == []


def test_read_max_rows_limits_the_entries_of_a_trigger() -> None:
    server = FakeServer(make_entries(4, 1))
    reader = Engine(server).reader
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(3))
    assert Offset.from_dict(end).total == 3
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert Offset.from_dict(end2).total == 4  # the rest of the batch already taken
    assert Offset.from_dict(reader.latestOffset(end2, ReadAllAvailable())).total == 8


def test_max_rows_per_trigger_bounds_the_fetch_and_the_micro_batch() -> None:
    """maxRowsPerTrigger: a trigger fetches server batches until the ledger holds that many
    rows, and plans whole entries up to it (at least one); nothing is lost or repeated."""
    server = FakeServer(make_entries(6, 3))  # 6 transactions: BEGIN, 3 rows, END
    opts = CanalOptions(
        **{**OPTS.__dict__, "batch_size": 3, "max_batches_per_trigger": 10,
           "max_rows_per_trigger": 5}
    )  # fmt: skip
    eng = Engine(server, opts)
    assert eng.step()
    assert list(server.outstanding) == [1, 2]  # 6 rows held: no third fetch
    first = Offset.from_dict(eng.offset(0))
    assert first.total == 4  # BEGIN, 3 rows, END, BEGIN: the next 3 rows would pass 5
    assert len(eng.sink[0]) == 3
    eng.drain()
    assert eng.rows() == expected(server.entries)
    assert max(len(rows) for rows in eng.sink.values()) <= 5
    single = CanalOptions(**{**opts.__dict__, "max_rows_per_trigger": 1})
    eng = Engine(FakeServer(make_entries(2, 3)), single)
    eng.drain()  # an entry of more rows than the limit still goes, alone
    assert [len(rows) for rows in eng.sink.values()] == [3, 3]


def test_restarted_driver_replays_the_uncommitted_batch_from_the_cursor() -> None:
    server = FakeServer(make_entries(10, 3))
    eng = Engine(server)
    eng.step()
    assert eng.step(crash_before_run=True)  # offset 1 written, never run
    eng.step()  # re-runs micro-batch 1: re-read from the cursor, not by id
    assert any(c.startswith("get_batch") for c in eng.connectors[-1].calls)
    assert eng.connectors[-1].calls.count("rollback") >= 1
    eng.drain()
    assert eng.rows() == expected(server.entries)


def test_replay_uses_get_batch_while_the_batches_are_outstanding() -> None:
    server = FakeServer(make_entries(10, 3))
    eng = Engine(server)
    eng.step()
    eng.step()
    eng.restart(rollback_on_connect=False)
    eng.committed = 0  # as if the sink had not committed micro-batch 1
    del eng.sink[1]
    eng.step()
    calls = eng.connectors[-1].calls
    assert [c for c in calls if c.startswith("get_batch")] and "rollback" not in calls
    eng.drain()
    assert eng.rows() == expected(server.entries)


def test_replay_with_other_server_batch_boundaries_gives_the_same_rows() -> None:
    server = FakeServer(make_entries(12, 2))
    eng = Engine(server)
    eng.step()
    eng.step(crash_before_run=True)
    eng.opts = CanalOptions(**{**OPTS.__dict__, "batch_size": 7})
    eng.restart()
    eng.drain()
    assert eng.rows() == expected(server.entries)


def test_duplicates_after_failover_with_lost_acks_are_dropped() -> None:
    server = FakeServer(make_entries(20, 2))
    eng = Engine(server)
    for _ in range(4):
        eng.step()
    server.failover(cursor_back_to=0, reuse_ids=True)  # acks not flushed: all again
    eng.drain()
    assert eng.rows() == expected(server.entries)


def test_replay_that_cannot_match_the_plan_fails_loudly() -> None:
    server = FakeServer(make_entries(6, 2))
    eng = Engine(server)
    eng.step()
    eng.step(crash_before_run=True)
    del server.entries[5]  # e.g. a narrower filter: one planned entry is gone
    with pytest.raises(ReplayMismatch, match="planned with 4 entries"):
        eng.step()


def test_available_now_stops_at_entries_committed_after_it_began() -> None:
    entries = make_entries(6, 1)
    for e in entries[9:]:
        e["header"]["timestamp_ms"] = 4_000_000_000_000  # "later" than prepare time
    server = FakeServer(entries)
    eng = Engine(server)
    eng.reader.prepareForTriggerAvailableNow()
    eng.drain()
    assert eng.rows() == expected(entries[:9])


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_random_crashes_failovers_and_growth_keep_exactly_once(seed: int, prefetch: bool) -> None:
    rnd = random.Random(seed)
    everything = make_entries(40, rnd.randint(1, 3))
    server = FakeServer(everything[:10])
    opts = CanalOptions(
        **{**OPTS.__dict__, "batch_size": rnd.randint(1, 6), "max_batches_per_trigger": 2,
           "prefetch": prefetch}
    )  # fmt: skip
    eng = Engine(server, opts)
    for _ in range(60):
        op = rnd.random()
        if op < 0.5:
            eng.step()
        elif op < 0.6:
            eng.step(crash_before_run=True)
        elif op < 0.7:
            eng.restart()
        elif op < 0.8:
            server.failover(rnd.randint(0, server.cursor), reuse_ids=rnd.random() < 0.5)
        elif op < 0.85:
            server.rollback()  # a silent reconnect of the connector
        else:
            server.entries = everything[: len(server.entries) + rnd.randint(1, 12)]
    server.entries = everything
    eng.drain()
    assert eng.rows() == expected(everything)


def test_a_new_reader_moves_the_cursor_through_its_checkpointed_start() -> None:
    """A driver that stopped after micro-batch 1 was committed but never acked (the end of
    an availableNow run, or a crash before the next trigger): the next run's reader moves
    the cursor through the checkpointed offset and reads only what follows."""
    server = FakeServer(make_entries(6, 1))  # 18 entries, server batches of 4
    eng = Engine(server)
    eng.step()
    eng.step()  # micro-batch 1 committed by the sink; ack 1 only
    assert server.acks == [1] and server.cursor == 4
    eng.restart()  # the next run: a new reader, the connect rolls back
    assert eng.step()
    assert server.moves == [8]  # through the last entry of micro-batch 1
    calls = eng.connectors[-1].calls
    assert calls.index("move_cursor mariadb-bin.000001:956") < calls.index("get_without_ack")
    assert Offset.from_dict(eng.offset(2)).batches == (server.next_id - 1,)
    eng.drain()
    assert eng.rows() == expected(server.entries)
    assert server.cursor == len(server.entries) and server.outstanding == {}


class OldNodeConnector(FakeConnector):
    """A node without POST .../cursor (it answers 405)."""

    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None:
        self.calls.append("move_cursor")
        raise UnexpectedResponse("POST .../cursor: 405 Method Not Allowed")


def test_without_the_cursor_route_the_entries_are_read_again_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FakeServer(make_entries(6, 1))
    eng = Engine(server)
    eng.step()
    eng.step()
    reader = CanalStreamReader(OPTS, lambda _: OldNodeConnector(server))
    eng.reader = reader
    with caplog.at_level(logging.WARNING, "canal_client.spark"):
        eng.drain()
    assert "cannot move the cursor" in caplog.text
    assert eng.rows() == expected(server.entries)
    assert server.cursor == len(server.entries)


def test_options_name_the_bad_one() -> None:
    good = {"server": "http://127.0.0.1:1", "destination": "d", "clientId": "c"}
    assert CanalOptions.parse({**good, "batchSize": "65536"}).batch_size == 65536
    for name, value in (("batchSize", "65537"), ("pollTimeoutMs", "x"), ("exclusive", "yes")):
        with pytest.raises(ConfigError, match=name):
            CanalOptions.parse({**good, name: value})


def test_partitions_are_even_and_hold_whole_entries() -> None:
    server = FakeServer(make_entries(20, 3))  # 60 rows in entries of 3
    opts = CanalOptions(**{**OPTS.__dict__, "batch_size": 100, "rows_per_partition": 25})
    reader = Engine(server, opts).reader
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    sizes = [p.rows for p in parts]
    assert len(parts) == 3 and sum(sizes) == 60 and max(sizes) - min(sizes) <= 3
    assert [r for p in parts for r in arrow_rows(reader.read(p))] == expected(server.entries)


def test_the_prefetch_takes_the_next_batches_while_the_micro_batch_runs() -> None:
    """After ``partitions`` the reader fetches a trigger's worth more (without ack) in a
    thread; the next trigger plans them without a fetch of its own."""
    server = FakeServer(make_entries(10, 2))  # 30 entries
    opts = CanalOptions(**{**PREFETCH.__dict__, "max_batches_per_trigger": 2})
    eng = Engine(server, opts)
    assert eng.step()
    assert list(server.outstanding) == [1, 2, 3, 4] and server.acks == []
    conn = eng.connectors[-1]
    fetches = conn.calls.count("get_without_ack")
    start = eng.offset(0)
    end = eng.reader.latestOffset(start, ReadAllAvailable())
    assert conn.calls.count("get_without_ack") == fetches  # planned from the prefetch
    assert Offset.from_dict(end).batches == (3, 4) and server.acks == [2]
    eng.offsets.append(json.dumps(end))
    eng.reader.commit(start)
    eng.run(1)
    eng.drain()
    assert eng.rows() == expected(server.entries)
    assert server.outstanding == {}


def test_the_prefetch_is_bounded_by_max_rows_per_trigger() -> None:
    server = FakeServer(make_entries(20, 3))  # BEGIN, 3 rows, END; batches of 3 entries
    opts = CanalOptions(
        **{**PREFETCH.__dict__, "batch_size": 3, "max_batches_per_trigger": 10,
           "max_rows_per_trigger": 5}
    )  # fmt: skip
    eng = Engine(server, opts)
    assert eng.step()
    # the trigger took batches 1-2 (6 rows held), planned 3 rows; the 3 rows after the
    # plan and the 3 of batch 3 reach 5: the prefetch took batch 3 only
    assert list(server.outstanding) == [1, 2, 3]
    eng.drain()
    assert eng.rows() == expected(server.entries)
    assert max(len(rows) for rows in eng.sink.values()) <= 5


def test_prefetched_batches_lost_in_a_failover_are_read_again_once() -> None:
    """The leader changes while prefetched (unplanned, unacked) batches are outstanding:
    the new leader delivers them again from the cursor; every row once."""
    server = FakeServer(make_entries(20, 2))
    opts = CanalOptions(**{**PREFETCH.__dict__, "max_batches_per_trigger": 3})
    eng = Engine(server, opts)
    eng.step()
    eng.step()
    assert len(server.outstanding) > 3  # planned and prefetched batches
    server.failover(cursor_back_to=server.cursor, reuse_ids=True)
    eng.drain()
    assert eng.rows() == expected(server.entries)
    assert server.cursor == len(server.entries)


def test_stop_ends_the_prefetch() -> None:
    server = FakeServer(make_entries(10, 2))
    eng = Engine(server, PREFETCH)
    start = eng.reader.initialOffset()
    end = eng.reader.latestOffset(start, ReadAllAvailable())
    eng.reader.partitions(start, end)
    eng.reader.stop()
    assert eng.reader.wait_prefetch(0)
    assert not eng.connectors[-1].connected


def test_prefetch_option() -> None:
    good = {"server": "http://127.0.0.1:1", "destination": "d", "clientId": "c"}
    assert CanalOptions.parse(good).prefetch
    assert not CanalOptions.parse({**good, "prefetch": "False"}).prefetch
    with pytest.raises(ConfigError, match="prefetch"):
        CanalOptions.parse({**good, "prefetch": "0"})


def test_a_trigger_tops_up_a_small_prefetch_with_what_is_ready() -> None:
    """The prefetch took less than a trigger's worth (the leader's store held no more
    beside the running micro-batch): the next trigger takes what is ready now, without
    waiting, up to maxBatchesPerTrigger batches in all."""
    server = FakeServer(make_entries(10, 2))  # 30 entries, batches of 4
    opts = CanalOptions(**{**PREFETCH.__dict__, "max_batches_per_trigger": 3})
    eng = Engine(server, opts)
    start = eng.reader.initialOffset()
    first = eng.reader.latestOffset(start, ReadAllAvailable())
    assert Offset.from_dict(first).batches == (1, 2, 3)
    server.entries, rest = server.entries[:14], server.entries[14:]  # a store that is full
    eng.reader.partitions(start, first)
    assert eng.reader.wait_prefetch(30)
    assert list(server.outstanding) == [1, 2, 3, 4]  # the prefetch: entries 12-13 only
    server.entries += rest
    second = eng.reader.latestOffset(first, ReadAllAvailable())
    assert Offset.from_dict(second).batches == (4, 5, 6)  # 4 prefetched, 5-6 topped up
    assert Offset.from_dict(second).total == 22  # 12 + 2 + 4 + 4
