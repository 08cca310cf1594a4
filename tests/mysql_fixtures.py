"""What the MySQL tests share: the fixture files (tests/fixtures/mysql, see NOTICE), a
binlog reader run in a thread (the local reader on a directory, ``Run``; the network
reader on ``mysql_replay``, ``Reading``), the rows and header spans they compare, and a
REST client that takes a node's entries up to a position.

The local and the network reader are held to the same expectations: the same entries,
positions and values for the same bytes.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mysql_replay import MySQLReplayServer

from canal_client.connector import SimpleConnector
from canal_protocol.entry import Entry, EntryType
from canal_protocol.positions import EntryPosition
from canal_server.parse.local_reader import LocalBinlogReader, LocalReaderConfig
from canal_server.parse.reader import BinlogReader, ReaderConfig

__all__ = [
    "FIXTURES",
    "SCHEMA",
    "Reading",
    "Run",
    "rest_entries",
    "rows",
    "spans",
    "wait_for",
]

FIXTURES = Path(__file__).parent / "fixtures" / "mysql"
SCHEMA = FIXTURES / "schema.sql"


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the reader"
        time.sleep(0.02)


class _Threaded:
    """A reader (``run(start)``, ``stop()``, ``last_position``) run in a thread: what it
    sank in ``entries``, what ended it in ``error``."""

    reader: Any

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.error: BaseException | None = None

    def start(self, start: EntryPosition) -> threading.Thread:
        def run() -> None:
            try:
                self.reader.run(start)
            except BaseException as exc:  # the test asserts on it
                self.error = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def at(self, end: tuple[str, int]) -> bool:
        last = self.reader.last_position
        return last is not None and (last.journal, last.offset) == end

    def read_until(self, start: EntryPosition, end: tuple[str, int]) -> list[Entry]:
        """Read from ``start`` until the last committed position is ``end``, then stop."""
        thread = self.start(start)
        try:
            wait_for(lambda: self.error is not None or self.at(end))
        finally:
            self.reader.stop()
            thread.join(10)
        if self.error is not None:
            raise self.error
        return self.entries


class Run(_Threaded):
    """A LocalBinlogReader over a directory holding ``files``, from the first of them."""

    def __init__(self, tmp: Path, files: Sequence[str], schema: Path | None = SCHEMA) -> None:
        super().__init__()
        for name in files:
            shutil.copy(FIXTURES / name, tmp / name)
        config = LocalReaderConfig(str(tmp), str(schema or ""), poll_s=0.05, slave_id=7)
        self.reader = LocalBinlogReader(config, self.entries.extend)
        self.first = EntryPosition(sorted(files)[0], 4)

    def until(self, position: tuple[str, int]) -> list[Entry]:
        return self.read_until(self.first, position)


class Reading(_Threaded):
    """A BinlogReader on the replay server."""

    def __init__(self, srv: MySQLReplayServer, gtid_mode: bool = False) -> None:
        super().__init__()
        config = ReaderConfig(srv.dsn(), slave_id=4711, gtid_mode=gtid_mode, heartbeat_s=1.0)
        self.reader = BinlogReader(config, self.entries.extend)

    def until(self, start: EntryPosition, end: tuple[str, int]) -> list[Entry]:
        return self.read_until(start, end)


def rows(entries: Sequence[Entry]) -> Iterator[tuple[str, str, Any]]:
    """(table, event type, (before, after)) of every changed row."""
    for e in entries:
        if e.type is EntryType.ROWDATA and not e.is_ddl:
            for r in e.rows:
                before = {c.name: c.value for c in r.before} if r.before else None
                after = {c.name: c.value for c in r.after} if r.after else None
                yield e.header.table, e.header.event_type.value, (before, after)


def spans(entries: Sequence[Entry], logfile: bool = True) -> list[tuple[Any, ...]]:
    """Where each entry is (the wire carries no per-entry GTID state); ``logfile``
    False when the files are served under other names."""
    return [
        ((e.header.logfile,) if logfile else ())
        + (e.header.offset, e.header.end_offset, e.header.server_id, e.header.gtid,
           e.header.timestamp_ms, e.header.part)
        for e in entries
    ]  # fmt: skip


def rest_entries(url: str, destination: str, client: str, end_offset: int) -> list[Entry]:
    """Every entry a new subscription (from the earliest, every table) gets over REST,
    acking each batch, until one ends at ``end_offset`` (bounded: 60 s)."""
    got: list[Entry] = []
    conn = SimpleConnector(url, destination, client)
    conn.connect()
    try:
        conn.subscribe(".*\\..*", start="earliest")  # the files predate the subscription
        deadline = time.monotonic() + 60
        while not got or got[-1].position().offset != end_offset:
            assert time.monotonic() < deadline, f"only {len(got)} entries arrived"
            batch = conn.get_without_ack(100, 2.0)
            got.extend(batch.entries)
            if batch.id != -1:
                conn.ack(batch.id)
    finally:
        conn.disconnect()
    return got
