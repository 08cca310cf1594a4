"""What `canal-ha demo` shows until the server lands: a writer and a binlog tail.

A writer thread commits small transactions of inserts (plus some updates and deletes)
into ``demo.orders`` on the sandbox primary at a target rate; a reader thread follows
the primary's binlog with canal-ha's BinlogReader and counts the changed rows. The main
thread prints one live line: binlog position, rows written and rows read per second.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from canal_cluster.sandbox import Sandbox
from canal_server.entry import Entry
from canal_server.positions import EntryPosition
from canal_server.reader import BinlogReader, ReaderConfig

__all__ = ["DemoRun"]

log = logging.getLogger(__name__)

SCHEMA = (
    "CREATE DATABASE IF NOT EXISTS demo",
    "CREATE TABLE IF NOT EXISTS demo.orders ("
    " id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,"
    " customer VARCHAR(32) NOT NULL,"
    " amount DECIMAL(12,2) NOT NULL,"
    " status ENUM('new','paid','shipped') NOT NULL DEFAULT 'new',"
    " created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
)
TX_PER_S = 20


@dataclass
class Counter:
    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.value += n


@dataclass
class DemoRun:
    box: Sandbox
    rate: int = 2000
    written: Counter = field(default_factory=Counter)
    read: Counter = field(default_factory=Counter)
    position: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _reader: BinlogReader | None = None
    _start_at: EntryPosition = field(default_factory=EntryPosition)
    _started: float = 0.0

    def start(self) -> None:
        self.box.primary.execute(*SCHEMA)
        journal, offset = self.box.primary.master_status()
        self.position = f"{journal}:{offset}"
        self._start_at = EntryPosition(journal=journal, offset=offset)
        d = self.box.primary.dsn()
        config = ReaderConfig(master={k: d[k] for k in ("host", "port", "user", "password")},
                              slave_id=4242, destination="demo")  # fmt: skip
        self._reader = BinlogReader(config, self._sink)
        self._started = time.monotonic()
        for target, name in ((self._write_loop, "demo-writer"), (self._read_loop, "demo-reader")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _write_loop(self) -> None:
        per_tx = max(1, self.rate // TX_PER_S)
        with self.box.primary.admin() as conn, conn.cursor() as cur:
            n = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                cur.execute("BEGIN")
                cur.executemany(
                    "INSERT INTO demo.orders (customer, amount) VALUES (%s, %s)",
                    [(f"c{random.randrange(1000)}", f"{random.uniform(1, 500):.2f}")] * per_tx,
                )
                changed = per_tx
                if n % 5 == 4:
                    changed += cur.execute(
                        "UPDATE demo.orders SET status='paid' ORDER BY id DESC LIMIT 1"
                    )
                    changed += cur.execute("DELETE FROM demo.orders ORDER BY id LIMIT 1")
                cur.execute("COMMIT")
                self.written.add(changed)
                n += 1
                next_at += 1.0 / TX_PER_S
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _sink(self, entries: Sequence[Entry]) -> None:
        self.read.add(sum(len(e.rows) for e in entries))
        last = entries[-1].header
        self.position = f"{last.logfile}:{last.end_offset}"

    def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            self._reader.run(self._start_at)
        except Exception as exc:
            log.warning("binlog reader ended: %s", exc)

    def report_until(self, stop: threading.Event, duration_s: float) -> None:
        tty = sys.stdout.isatty()
        last_w, last_r, last_t = 0, 0, time.monotonic()
        while not stop.wait(1.0):
            now = time.monotonic()
            w, r = self.written.value, self.read.value
            dt = now - last_t
            line = (
                f"binlog {self.position}  written {w:,} rows ({(w - last_w) / dt:,.0f}/s)"
                f"  read from binlog {r:,} rows ({(r - last_r) / dt:,.0f}/s)"
            )
            print(f"\r{line}   " if tty else line, end="" if tty else "\n", flush=True)
            last_w, last_r, last_t = w, r, now
            if duration_s and now - self._started >= duration_s:
                break
        if tty:
            print()

    def stop(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.stop()
        for t in self._threads:
            t.join(timeout=10)

    def final_line(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return (
            f"demo: wrote {self.written.value:,} rows and read {self.read.value:,} from the binlog "
            f"in {elapsed:.1f}s"
        )
