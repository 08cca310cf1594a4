"""The reader switches to the standby inside a transaction larger than
``transaction_size``, after its first piece was stored: the store must hold that
transaction once (the standby has it: the resume skips what was stored) or, when the
standby does not go on with it, see it ended before anything else begins (never a BEGIN
inside it). Real MariaDB primary and GTID standby, the reader's real put path
(``EventSink``, ``EventStore``, the memory position) and the real finder choosing the
start on the standby, as the instance's read loop does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from reader_fixtures import collect_leaked_sockets
from test_reader import FAST_RETRY, Running, here, run_again

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import Entry, EntryType
from canal_protocol.positions import EntryPosition
from canal_server.filter import EventFilter
from canal_server.parse.finder import FinderConfig, FindReason, PositionFinder
from canal_server.parse.logposition import MemoryLogPositionManager
from canal_server.parse.reader import BinlogReader, ReaderConfig, RunResult
from canal_server.sink import EventSink
from canal_server.store import EventStore

DB = "t_reader_switch"
SIZE = 4  # T, BEGIN + 10 rows + END, comes in pieces of 4
ROWS = list(range(1, 11))
B, R, E = EntryType.TRANSACTIONBEGIN, EntryType.ROWDATA, EntryType.TRANSACTIONEND


class Pipe:
    """A reader putting into a store through the instance's sink; it switches to the
    standby (as its heartbeat detector would) right after the first piece of a
    transaction is stored."""

    def __init__(self, box: Sandbox, slave_id: int, gtid_mode: bool) -> None:
        self.store = EventStore(DB, buffer_size=10_000)
        self.memory = MemoryLogPositionManager()
        quiet = EventFilter(f"{DB}\\..*", empty_tx_interval_s=1e9, empty_tx_threshold=10**9)
        self.sink = EventSink(DB, quiet, self.store, self.memory)
        self.config = ReaderConfig(
            master=box.primary.dsn(), standby=box.replica.dsn(), slave_id=slave_id,
            gtid_mode=gtid_mode, transaction_size=SIZE, retry=FAST_RETRY,
        )  # fmt: skip
        self.reader = BinlogReader(self.config, self._put)
        self.switched = False

    def _put(self, entries: Sequence[Entry]) -> None:
        self.sink.sink(entries, self.reader.identity)
        if not self.switched and self.sink.in_transaction:
            self.switched = self.reader._on_detect_failure(self.config.detecting.retry_threshold)

    def start(self, start: EntryPosition) -> Running:
        return run_again(Running(self.reader, threading.Thread(target=lambda: None)), start)

    def resume_on_the_standby(self, running: Running, reason: FindReason) -> Running:
        """The instance's next round: the finder's start on the source read now."""
        wait_until(lambda: bool(running.result), "the run ended by the switch", 60)
        assert running.result == [RunResult.SWITCHED]
        finder = FinderConfig(DB, gtid_mode=self.config.gtid_mode, slave_id=self.config.slave_id)
        found = PositionFinder(finder, self.memory).find(self.reader.link())
        assert found.reasons[0] == reason, found
        return run_again(running, found.position)

    def stored(self) -> list[Entry]:
        return [s.entry for s in self.store.get(None, 10_000)]

    def wait_stored(self, row_id: int) -> list[Entry]:
        """What the store holds once the transaction writing ``row_id`` has ended."""

        def ended() -> bool:
            entries = self.stored()
            return entries[-1].type is E and row_id in _ids(entries)

        wait_until(ended, f"the END of the transaction of row {row_id} stored", 60)
        return self.stored()


def _ids(entries: Sequence[Entry]) -> list[Any]:
    return [r.after[0].value for e in entries for r in e.rows]


def _tables(box: Sandbox) -> EntryPosition:
    box.primary.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY)",
    )
    start = here(box)
    box.primary.execute(f"INSERT INTO {DB}.t VALUES (0)")  # a boundary: the memory position
    return start


def _write_t(box: Sandbox) -> None:
    box.primary.execute("BEGIN", *(f"INSERT INTO {DB}.t VALUES ({i})" for i in ROWS), "COMMIT")


@pytest.mark.parametrize("gtid_mode", [False, True], ids=["file", "gtid"])
def test_a_switch_inside_a_split_transaction_stores_it_once(db: Sandbox, gtid_mode: bool) -> None:
    """The standby has the transaction (GTID replication): the resume there starts
    before it (switch-by-gtid, or the GTID history) and skips what the store has."""
    start = _tables(db)
    _write_t(db)
    db.primary.execute(f"INSERT INTO {DB}.t VALUES (100)")
    db.replica.wait_caught_up(db.primary)
    pipe = Pipe(db, 6121 + gtid_mode, gtid_mode)
    running = pipe.start(start)
    try:
        reason = FindReason.GTID_HISTORY if gtid_mode else FindReason.SWITCH_BY_GTID
        running = pipe.resume_on_the_standby(running, reason)
        stored = pipe.wait_stored(100)
    finally:
        running.stop()
        pipe.store.stop()
    assert pipe.switched
    assert [e.type for e in stored] == [B, R, E, B, *[R] * len(ROWS), E, B, R, E]
    assert _ids(stored) == [0, *ROWS, 100]
    assert len({e.header.gtid for e in stored[3:15]}) == 1  # T's pieces: one transaction
    assert pipe.reader.identity.source_server_id == db.replica.server_id


@pytest.mark.parametrize("gtid_mode", [False, True], ids=["file", "gtid"])
def test_a_switch_to_a_standby_without_the_transaction_ends_it_first(
    make_sandbox: Any, gtid_mode: bool
) -> None:
    """The standby never got the transaction (its replication stopped before it) and is
    promoted: the resume there reads another transaction first. The store gets an END of
    the open transaction at the standby's position before that one, not a BEGIN inside
    it; reading on from that END's position is reading on from the standby's boundary."""
    box = make_sandbox(standby=True)
    start = _tables(box)
    box.replica.wait_caught_up(box.primary)
    box.replica.execute("STOP SLAVE")
    _write_t(box)
    pipe = Pipe(box, 6123, gtid_mode)
    running = pipe.start(start)
    try:
        wait_until(lambda: bool(running.result), "the run ended by the switch", 60)
        box.replica.promote()
        box.replica.execute(f"INSERT INTO {DB}.t VALUES (100)")
        reason = FindReason.GTID_HISTORY if gtid_mode else FindReason.SWITCH_BY_GTID
        running = pipe.resume_on_the_standby(running, reason)
        stored = pipe.wait_stored(100)
    finally:
        running.stop()
        pipe.store.stop()
    assert [e.type for e in stored] == [B, R, E, B, R, R, R, E, B, R, E]
    assert _ids(stored) == [0, 1, 2, 3, 100]
    closing, after = stored[7], stored[8]
    assert closing.header.gtid == stored[3].header.gtid  # T's
    here_ = closing.position()  # the standby's boundary before the next transaction
    assert (here_.journal, here_.offset) == (after.header.logfile, after.header.offset)
    assert here_.gtid == after.gtid_state
    memory = pipe.memory.get_latest(DB)
    assert memory is not None and memory.identity.source_server_id == box.replica.server_id
    box.stop()
    collect_leaked_sockets()
