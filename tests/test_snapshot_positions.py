"""Positions of snapshot entries: ordered after the binlog position they are put at and
before the next binlog event, in the store, cursors and ``move_cursor``."""

from __future__ import annotations

import pytest
from serving_fixtures import IDENTITY, EntryFactory

from canal_protocol.entry import Entry, EntryType, EventType, Header
from canal_protocol.positions import EntryPosition, LogPosition
from canal_server.snapshot import MAX_MARKS, Mark, SnapshotRun
from canal_server.store import EventStore


def _read(at: Entry, n: int) -> Entry:
    h = at.header
    header = Header(h.logfile, h.end_offset, h.end_offset, h.server_id, h.timestamp_ms, "",
                    "db", "t", EventType.READ, n)  # fmt: skip
    return Entry(EntryType.ROWDATA, header)


def test_snapshot_entries_sort_between_binlog_positions_and_move_cursor_stops_before() -> None:
    f = EntryFactory()
    first = f.tx()
    reads = [_read(first[-1], n) for n in (1, 2, 3)]
    second = f.tx()
    store = EventStore("d")
    store.put([*first, *reads, *second], IDENTITY)
    keys = [LogPosition(IDENTITY, e.position()).position.sort_key for e in [*first, *reads]]
    keys += [e.position().sort_key for e in second]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    end = first[-1].position()
    assert EntryPosition.from_dict(reads[1].position().to_dict()) == reads[1].position()
    assert "snapshot" not in end.to_dict() and reads[0].position().to_dict()["snapshot"] == 1
    # a commit "through the entry starting at" the READ entries' offset stops before them
    ev = store.last_starting_by(end.journal, end.offset)
    assert ev is not None and ev.entry is first[-1]
    assert [e.entry for e in store.get(ev.position, 10)][:3] == reads


def test_marks_resume_at_the_newest_at_or_before_the_cursor_and_stay_bounded() -> None:
    def at(offset: int) -> LogPosition:
        return LogPosition(IDENTITY, EntryPosition("mariadb-bin.000001", offset, snapshot=1))

    run = SnapshotRun("s1", ["db.a", "db.b"], 10)
    for i in range(1, 1001):
        table, done = (0, i == 500) if i <= 500 else (1, False)
        mark = Mark(at(i * 100), table, (i,), done, i * 10, i)
        run.add_mark(mark, at(150))  # the cursor stays after the first mark only
    assert len(run.marks) <= MAX_MARKS + 1 and run.marks[0].position == at(100)
    assert run.marks[-1].after == (1000,)
    run.resume(at(60_000))  # newest kept mark at or before it
    kept = run.marks[0]
    assert kept.position.offset <= 60_000 and run.current == kept.table
    assert run.progress[kept.table].after == kept.after
    run.resume(at(50))  # before every mark: from the start
    assert run.current == 0 and run.progress[0].after is None and run.marks == []


@pytest.mark.parametrize("reads", [1, 2, 3, 5, 42])
@pytest.mark.parametrize("later", [1, 2, 3, 7])
def test_move_cursor_through_a_chunk_never_passes_the_rest_of_it(reads: int, later: int) -> None:
    """A chunk put at a transaction's end ``R`` is stored before the next transaction,
    whose BEGIN (MariaDB: its GTID event) also starts at ``R``. A commit "through" ``R``
    (a Spark checkpoint inside the chunk) stops before the chunk, whatever else is stored
    around it; a commit through a later BEGIN still moves through that BEGIN."""
    f = EntryFactory()
    first = f.tx()
    chunk = [_read(first[-1], n) for n in range(1, reads + 1)]
    rest = [e for _ in range(later) for e in f.tx()]
    assert rest[0].header.offset == first[-1].header.end_offset  # the BEGIN starts at R
    store = EventStore("d")
    store.put([*first, *chunk, *rest], IDENTITY)
    end = first[-1].position()
    ev = store.last_starting_by(end.journal, end.offset)
    assert ev is not None and ev.entry is first[-1], ev
    assert [e.entry for e in store.get(ev.position, reads)] == chunk
    begin = rest[-3]  # the last transaction's BEGIN (at R itself when it is the only one)
    ev = store.last_starting_by(begin.header.logfile, begin.header.offset)
    assert ev is not None and ev.entry is (first[-1] if later == 1 else begin)
