"""binlog_search logic with in-memory binlogs: boundaries, time search, transaction BEGIN."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from canal_protocol.errors import PurgedPosition
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.parse.binlog_search import (
    BinlogEvent,
    BinlogFile,
    BinlogSearch,
    Boundary,
    EventKind,
    boundaries,
    open_group_start,
)
from canal_server.parse.finder import DatabaseLink, FinderConfig, FindReason, PositionFinder
from canal_server.parse.logposition import MemoryLogPositionManager

K = EventKind


class FakeBinlogs:
    """Files of events; ``BinlogInspector`` and ``EventSource`` at once."""

    def __init__(self, files: dict[str, list[BinlogEvent]], gtid_at_start: str = "") -> None:
        self.files = files
        self.gtid_at_start = gtid_at_start
        self.reads: list[tuple[str, int]] = []

    def read(self, journal: str, offset: int) -> Generator[BinlogEvent, None, None]:
        self.reads.append((journal, offset))
        for ev in self.files[journal]:
            if ev.start >= offset:
                yield ev

    def binary_logs(self) -> list[BinlogFile]:
        return [BinlogFile(n, evs[-1].end) for n, evs in self.files.items()]

    def master_status(self) -> tuple[str, int]:
        name = list(self.files)[-1]
        return name, self.files[name][-1].end

    def server_id(self) -> int:
        return 1

    def clock(self) -> int:
        return max(ev.timestamp for evs in self.files.values() for ev in evs)

    def gtid_at(self, journal: str, offset: int) -> str:
        return self.gtid_at_start if journal == next(iter(self.files)) and offset == 4 else "x"


def _file(created: int, *txns: tuple[int, int]) -> list[BinlogEvent]:
    """A file: format description at ``created``, then (begin ts, commit ts) transactions
    of GTID(40) + rows(100) + XID(30) bytes."""
    events = [BinlogEvent(4, 256, created, K.OTHER, 1)]
    pos = 256
    for begin_ts, commit_ts in txns:
        events.append(BinlogEvent(pos, pos + 40, begin_ts, K.BEGIN, 1))
        events.append(BinlogEvent(pos + 40, pos + 140, begin_ts, K.OTHER, 1))
        events.append(BinlogEvent(pos + 140, pos + 170, commit_ts, K.COMMIT, 1))
        pos += 170
    return events


def test_boundaries_of_transactions_ddl_and_file_start() -> None:
    events = [
        BinlogEvent(4, 256, 100, K.OTHER, 1),
        BinlogEvent(256, 300, 101, K.STANDALONE, 1),
        BinlogEvent(300, 400, 101, K.QUERY, 1),  # DDL: ends its standalone group
        BinlogEvent(400, 440, 102, K.BEGIN, 1),
        BinlogEvent(440, 500, 102, K.QUERY, 1),  # statement inside a transaction
        BinlogEvent(500, 530, 103, K.COMMIT, 1),
    ]
    got = [(b.offset, b.timestamp) for b in boundaries(iter(events))]
    assert got == [(4, 100), (256, 101), (400, 101), (400, 102), (530, 103)]


def test_open_group_start_inside_and_outside() -> None:
    events = _file(10, (11, 11), (12, 12))  # txn 1: 256..426, txn 2: 426..596
    assert open_group_start(iter(events), 256 + 40) == 256  # after BEGIN
    assert open_group_start(iter(events), 256 + 140) == 256  # before XID
    assert open_group_start(iter(events), 426 + 150) == 426  # inside XID event
    assert open_group_start(iter(events), 426) is None  # exactly between
    assert open_group_start(iter(events), 596) is None  # end of file


def test_search_file_returns_latest_boundary_and_stops_at_first_later_one() -> None:
    # Times out of order after the first later boundary are not trusted.
    fake = FakeBinlogs({"b.1": _file(10, (11, 11), (13, 13), (12, 12))})
    search = BinlogSearch(fake, fake)
    found = search.search_file("b.1", 12_000)
    assert found == Boundary(426, 11, 1)
    assert search.search_file("b.1", 9_000) is None
    assert search.search_file("b.1", 10_000) == Boundary(4, 10, 1)


def test_search_all_bisects_files_and_scans_one() -> None:
    files = {f"b.{i:06d}": _file(100 + 10 * i, (101 + 10 * i, 102 + 10 * i)) for i in range(16)}
    fake = FakeBinlogs(files)
    search = BinlogSearch(fake, fake)
    journal, found = search.search_all((100 + 10 * 9 + 1) * 1000)  # after file 9's BEGIN
    assert journal == "b.000009"
    assert found.offset == 256 and found.timestamp == 191
    assert search.scanned == ["b.000009"]
    assert search.first_time_reads <= 5  # log2(16) + 1, not one read per file


def test_search_all_after_everything_is_the_last_boundary() -> None:
    fake = FakeBinlogs({"b.1": _file(10, (11, 11)), "b.2": _file(20, (21, 22))})
    journal, found = BinlogSearch(fake, fake).search_all(99_000)
    assert (journal, found.offset, found.timestamp) == ("b.2", 426, 22)


def test_search_before_the_oldest_binlog() -> None:
    """A GTID state at the oldest file's start: older binlogs held transactions and were
    purged. Without one, only the server's first binlog (number 1) tells that history
    starts there."""
    files = {"b.000001": _file(30, (31, 31)), "b.000002": _file(40, (41, 41))}
    never_purged = FakeBinlogs(files, gtid_at_start="")
    journal, found = BinlogSearch(never_purged, never_purged).search_all(5_000)
    assert (journal, found.offset) == ("b.000001", 4)
    purged = FakeBinlogs(files, gtid_at_start="0-1-40")
    with pytest.raises(PurgedPosition, match=r"b\.000001.*0-1-40.*master\.timestamp"):
        BinlogSearch(purged, purged).search_all(5_000)


def test_search_before_a_later_oldest_binlog_without_gtids_is_purged() -> None:
    """MySQL with gtid_mode OFF: PREVIOUS_GTIDS is always empty, so an empty state does not
    say that nothing came before. The oldest file is mysql-bin.000057: 1-56 were purged."""
    files = {"mysql-bin.000057": _file(30, (31, 31)), "mysql-bin.000058": _file(40, (41, 41))}
    no_gtids = FakeBinlogs(files, gtid_at_start="")
    with pytest.raises(PurgedPosition, match=r"mysql-bin\.000057.*master\.timestamp"):
        BinlogSearch(no_gtids, no_gtids).search_all(5_000)


def test_transaction_begin() -> None:
    fake = FakeBinlogs({"b.1": _file(10, (11, 11), (12, 12))})
    search = BinlogSearch(fake, fake)
    assert search.transaction_begin("b.1", 426 + 40) == 426
    assert search.transaction_begin("b.1", 426) == 426


def test_time_at_an_offset() -> None:
    """The time of the last event ending at or before an offset; a file's start: the
    time it began."""
    fake = FakeBinlogs({"b.1": _file(10, (11, 12), (13, 14))})  # txns: 256..426, 426..596
    search = BinlogSearch(fake, fake)
    assert search.time_at("b.1", 4) == 10
    assert search.time_at("b.1", 256 + 40) == 11  # after the first BEGIN
    assert search.time_at("b.1", 426) == 12  # after the first commit
    assert search.time_at("b.1", 596) == 14


@pytest.mark.parametrize("interval_s", [0, 1])
def test_fallback_reads_the_cursors_whole_second_again(interval_s: int) -> None:
    """Two transactions commit in second 200 on the new database; the client's cursor
    (from the old one) is at the first. A fallback by time starts before that second
    whatever ``fallback_interval_s`` is (0 is valid): the second one is read."""
    fake = FakeBinlogs({"b.000001": _file(100, (100, 100), (200, 200), (200, 200))})
    cursor = EntryPosition("old.000009", 999, 7, "", 200_000)  # txns: 256, 426, 596..766
    positions = MemoryLogPositionManager()
    positions.persist("d", LogPosition(LogIdentity("127.0.0.1:1"), cursor))
    finder = PositionFinder(FinderConfig("d", fallback_interval_s=interval_s), positions)
    found = finder.find(DatabaseLink("127.0.0.1:2", fake, fake))
    assert found.reasons == (FindReason.FALLBACK_SOURCE_SWITCH,)
    assert (found.position.journal, found.position.offset) == ("b.000001", 426)
