"""CPU per one-row transaction of the reader's put path: BinlogReader → EventSink →
EventStore, in this process (prints, never asserts).

Usage: ``.venv/bin/python benchmarks/reader_small_tx.py [TRANSACTIONS] [--runs N]``.
Starts a private sandbox MariaDB in a temporary directory, commits TRANSACTIONS
autocommit one-row INSERTs (the latency part's table), reads them ``--runs`` times from
the same position into a fresh store and prints the process CPU per transaction (the
reader thread does all the work; the main thread polls every 50 ms). The figure the
latency part's node spends per transaction at 5,000 tx/s, minus HTTP.

The store keeps every entry by default: the garbage collector's full collections then
walk all of them, a cost that grows with the run. ``--ack``: a client registered
before the reader starts acknowledges everything stored at every poll (every 50 ms),
so the store frees entries as a node's does for a consumer that keeps up.
``--stream``: only the parse layer, in this thread: the binlog stream's events, their
spans and the transaction assembler's entries (handed to a sink that drops them), no
sink, filter or store.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import pymysql

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_protocol.positions import EntryPosition
from canal_server.filter import EventFilter
from canal_server.parse import binlog_stream
from canal_server.parse.logposition import MemoryLogPositionManager
from canal_server.parse.reader import EVENTS, BinlogReader, ReaderConfig
from canal_server.parse.transaction import TransactionAssembler
from canal_server.sink import EventSink
from canal_server.store import EventStore

TABLE = "bench_small.lat"


def load(db: MariaDBServer, transactions: int) -> EntryPosition:
    db.execute(
        "DROP DATABASE IF EXISTS bench_small", "CREATE DATABASE bench_small",
        f"CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, sent_us BIGINT NOT NULL, "
        "note VARCHAR(16))",
    )  # fmt: skip
    journal, offset = db.master_status()
    conn = pymysql.connect(unix_socket=str(db.socket), user="root", autocommit=True)
    with conn, conn.cursor() as cur:
        for i in range(transactions):
            cur.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, 'x')", (i, time.time_ns() // 1000))
    return EntryPosition(journal=journal, offset=offset)


def measure(
    db: MariaDBServer, start: EntryPosition, transactions: int, run: int, ack: bool = False
) -> float:
    """Process CPU µs per transaction until all of them (3 entries each) are stored
    (``ack``: and freed as they come, see the module doc)."""
    store = EventStore("bench", buffer_size=10**7, buffer_bytes=10**11)
    if ack:
        store.register("bench")

    def stored() -> bool:
        last = store.last_seq
        if ack and last:
            store.ack("bench", last)
        return last >= 3 * transactions

    sink = EventSink("bench", EventFilter(), store, MemoryLogPositionManager())
    config = ReaderConfig(master=db.dsn(), slave_id=9950 + run, destination="bench")
    reader = BinlogReader(config, lambda entries: sink.sink(entries, reader.identity))
    thread = threading.Thread(target=reader.run, args=(start,), daemon=True)
    cpu0 = time.process_time()
    thread.start()
    try:
        wait_until(stored, "every transaction stored", 600, interval_s=0.05)
        cpu = time.process_time() - cpu0
    finally:
        reader.stop()
        thread.join(30)
    return cpu / transactions * 1e6


def measure_stream(db: MariaDBServer, start: EntryPosition, transactions: int, run: int) -> float:
    """Process CPU µs per transaction of reading and assembling them (``--stream``)."""
    made: list[int] = []
    asm = TransactionAssembler(lambda entries: made.append(len(entries)), start, "", 1000)
    stream = binlog_stream.open_stream(
        db.dsn(), 9950 + run, journal=start.journal, offset=start.offset, blocking=False,
        only_events=EVENTS,
    )  # fmt: skip
    cpu0 = time.process_time()
    try:
        while (ev := binlog_stream.next_event(stream)) is not None:
            asm.on_event(ev, binlog_stream.event_span(ev))
        cpu = time.process_time() - cpu0
    finally:
        stream.close()
    if sum(made) < 3 * transactions:
        raise SystemExit(f"read {sum(made)} entries, expected {3 * transactions} or more")
    return cpu / transactions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transactions", nargs="?", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ack", action="store_true", help="free stored entries as they come")
    parser.add_argument("--stream", action="store_true", help="the parse layer only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="canal-bench-") as tmp:
        box = Sandbox(Path(tmp), etcd_members=1, standby=False).start()
        try:
            start = load(box.primary, args.transactions)
            for run in range(args.runs):
                if args.stream:
                    us = measure_stream(box.primary, start, args.transactions, run)
                else:
                    us = measure(box.primary, start, args.transactions, run, args.ack)
                freed = ", parse layer only" if args.stream else ", acked" if args.ack else ""
                print(
                    f"run {run + 1}: {args.transactions} one-row transactions{freed}, "
                    f"{us:.1f} µs CPU each"
                )
        finally:
            box.stop()


if __name__ == "__main__":
    main()
