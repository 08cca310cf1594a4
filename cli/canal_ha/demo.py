"""What `canal-ha demo` shows: a writer, the server nodes and `canal-ha consume`.

A writer thread commits small transactions of inserts (plus some updates and deletes)
into ``demo.orders`` on the sandbox primary at a target rate. With server nodes, a
`canal-ha consume` process follows the leader and prints JSON Lines, which are counted
here (distinct rows by binlog position, duplicates); its log lines about the leader are
shown. ``kill_leader`` SIGKILLs the leader node mid-stream: the consumer follows the
new leader and at the end every written row has been consumed (failover without loss).
Without nodes a reader thread follows the binlog with canal-ha's BinlogReader. The main
thread prints one live line: binlog position, rows written and rows read per second.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from canal_ha.console import say
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import Entry
from canal_protocol.positions import EntryPosition
from canal_server.parse.reader import BinlogReader, ReaderConfig

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
CONSUMER_CLIENT_ID = "demo"
LeaderFinder = Callable[[], dict[str, Any] | None]


@dataclass
class Counter:
    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        with self.lock:
            self.value += n


class ConsumerTail:
    """A `canal-ha consume --format json` process; counts rows, forwards its leader log."""

    def __init__(self, box: Sandbox, read: Counter) -> None:
        argv = [sys.executable, "-m", "canal_ha.cli", "consume",
                "--etcd", ",".join(box.etcd_endpoints), "--destination", "example",
                "--client-id", CONSUMER_CLIENT_ID, "--filter", "demo\\..*",
                "--start", "earliest", "--format", "json"]  # fmt: skip
        self.read = read
        self.seen: set[tuple[str, int, int]] = set()
        self.duplicates = 0
        self.position = ""
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True,  # Ctrl-C stops the demo, which then stops the consumer
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._out, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._err, args=(self.proc.stderr,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _out(self, stream: IO[str]) -> None:
        for line in stream:
            entry = json.loads(line)
            h = entry["header"]
            self.position = f"{h['logfile']}:{h.get('end_offset', h['offset'])}"
            for i, _ in enumerate(entry["rows"]):
                key = (h["logfile"], int(h["offset"]), i)
                if key in self.seen:
                    self.duplicates += 1
                else:
                    self.seen.add(key)
                    self.read.add(1)

    def _err(self, stream: IO[str]) -> None:
        for line in stream:
            if "leader" in line or "active" in line or "ERROR" in line:
                say(f"\nconsumer: {line.rstrip()}", flush=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for t in self._threads:
            t.join(timeout=10)


@dataclass
class DemoRun:
    box: Sandbox
    rate: int = 2000
    written: Counter = field(default_factory=Counter)
    read: Counter = field(default_factory=Counter)
    position: str = ""
    find_leader: LeaderFinder | None = None  # set: consume through the server nodes
    kill_leader_after_s: float | None = None
    killed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _reader: BinlogReader | None = None
    _consumer: ConsumerTail | None = None
    _start_at: EntryPosition = field(default_factory=EntryPosition)
    _started: float = 0.0

    def start(self) -> None:
        self.box.primary.execute(*SCHEMA)
        journal, offset = self.box.primary.master_status()
        self.position = f"{journal}:{offset}"
        self._started = time.monotonic()
        targets = [(self._write_loop, "demo-writer")]
        if self.find_leader is not None:
            self._consumer = ConsumerTail(self.box, self.read)
            if self.kill_leader_after_s is not None:
                targets.append((self._kill_leader_later, "demo-killer"))
        else:
            self._start_at = EntryPosition(journal=journal, offset=offset)
            d = self.box.primary.dsn()
            config = ReaderConfig(master={k: d[k] for k in ("host", "port", "user", "password")},
                                  slave_id=4242, destination="demo")  # fmt: skip
            self._reader = BinlogReader(config, self._sink)
            targets.append((self._read_loop, "demo-reader"))
        for target, name in targets:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _kill_leader_later(self) -> None:
        assert self.find_leader is not None and self.kill_leader_after_s is not None
        if self._stop.wait(self.kill_leader_after_s):
            return
        leader = self.find_leader()
        if leader is None:
            say("\ndemo: no leader to kill right now", flush=True)
            return
        for proc in self.box.processes():
            if proc.name == leader["node"] and proc.is_running():
                proc.kill()
                self.killed.append(leader["node"])
                say(f"\ndemo: SIGKILL the leader {leader['node']} ({leader['url']}, "
                      f"epoch {leader['epoch']}); the consumer follows the next one",
                      flush=True)  # fmt: skip

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
            via = " and consumed by canal-ha consume" if self._consumer is not None else ""
            position = (self._consumer.position if self._consumer else "") or self.position
            line = (
                f"binlog {position}  written {w:,} rows ({(w - last_w) / dt:,.0f}/s)"
                f"  read from binlog{via} {r:,} rows ({(r - last_r) / dt:,.0f}/s)"
            )
            say(f"\r{line}   " if tty else line, end="" if tty else "\n", flush=True)
            last_w, last_r, last_t = w, r, now
            if duration_s and now - self._started >= duration_s:
                break
        if tty:
            say()

    def stop(self, catch_up_s: float = 60.0) -> None:
        """Stop writing; with a consumer, give it ``catch_up_s`` to read every row."""
        self._stop.set()
        if self._reader is not None:
            self._reader.stop()
        for t in self._threads:
            t.join(timeout=10)
        if self._consumer is not None:
            deadline = time.monotonic() + catch_up_s
            while (
                self.read.value < self.written.value
                and self._consumer.proc.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            self._consumer.stop()

    def final_line(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        if self._consumer is None:
            return (
                f"demo: wrote {self.written.value:,} rows and read {self.read.value:,} from the "
                f"binlog in {elapsed:.1f}s"
            )
        missing = max(self.written.value - self.read.value, 0)
        killed = f"; SIGKILLed leader(s): {', '.join(self.killed)}" if self.killed else ""
        return (
            f"demo: wrote {self.written.value:,} rows; canal-ha consume got {self.read.value:,} "
            f"distinct rows, {self._consumer.duplicates:,} duplicates, {missing:,} missing, "
            f"in {elapsed:.1f}s{killed}"
        )
