"""Parse throughput of BinlogReader: rows/s for 50k inserted rows (prints, never asserts).

Usage: ``.venv/bin/python benchmarks/reader_throughput.py [ROWS]``. Starts a private
sandbox MariaDB in a temporary directory, inserts ROWS rows (5 columns, 1000 rows per
transaction), reads them three times with BinlogReader from the same position, and
stops the sandbox.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_protocol.entry import Entry
from canal_protocol.positions import EntryPosition
from canal_server.parse.reader import BinlogReader, ReaderConfig

COLUMNS = "id INT PRIMARY KEY, name VARCHAR(40), amount DECIMAL(12,2), ts DATETIME(3), n BIGINT"


def load(db: MariaDBServer, rows: int) -> EntryPosition:
    db.execute("DROP DATABASE IF EXISTS bench_reader", "CREATE DATABASE bench_reader")
    db.execute(f"CREATE TABLE bench_reader.t ({COLUMNS})")
    journal, offset = db.master_status()
    per_tx = 1000
    for first in range(0, rows, per_tx):
        last = min(first + per_tx, rows)
        db.execute(
            "INSERT INTO bench_reader.t SELECT seq, CONCAT('name-', seq), seq / 100,"
            f" NOW(3), seq * 1000 FROM bench_reader.seq_{first + 1}_to_{last}"
        )
    return EntryPosition(journal=journal, offset=offset)


def measure(db: MariaDBServer, start: EntryPosition, rows: int) -> float:
    count = [0]

    def sink(entries: Sequence[Entry]) -> None:
        for e in entries:
            count[0] += e.row_count

    reader = BinlogReader(ReaderConfig(master=db.dsn(), slave_id=9901), sink)
    t0 = time.perf_counter()
    thread = threading.Thread(target=reader.run, args=(start,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: count[0] >= rows, f"{rows} rows read", 600, interval_s=0.01)
        elapsed = time.perf_counter() - t0
    finally:
        reader.stop()
        thread.join(30)
    return rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="?", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="canal-bench-") as tmp:
        box = Sandbox(Path(tmp), etcd_members=1, standby=False).start()
        try:
            start = load(box.primary, args.rows)
            for run in range(3):
                rate = measure(box.primary, start, args.rows)
                print(f"run {run + 1}: {args.rows} rows, {rate:,.0f} rows/s (BinlogReader)")
        finally:
            box.stop()


if __name__ == "__main__":
    main()
