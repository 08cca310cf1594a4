"""A steady write load with an exact record of what was committed.

``LoadWriter(server, tag)`` writes transactions of 1-3 row changes (insert, update,
delete) over two tables in two schemas, ``{tag}_a.items`` and ``{tag}_b.orders``. Each
row has a key ``k`` (never reused) and a version ``v`` that grows by one with every
change of that key. After each COMMIT it reads ``@@last_gtid``; the history is then
exact:

* a transaction whose COMMIT returned and whose GTID was read is *committed*;
* a transaction whose COMMIT failed (the server died) is *uncertain*: after the writer
  reconnects (to the same server, or to another one after ``retarget``) it compares the
  rows with the state the transaction would have left, and keeps it only if the
  database has it;
* after ``retarget`` (database failover), committed transactions whose GTID sequence
  number is above the new server's ``gtid_binlog_pos`` are lost by the database: they
  stay in the history as optional (they may have been delivered from the old primary),
  and the writer continues from the rows the new server has, with versions that never
  repeat.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import pymysql

from canal_cluster.retry import wait_until
from canal_ha.sandbox.mariadb import MariaDBServer
from chaos.checker import ExpectedChange

__all__ = ["LoadWriter", "Op", "gtid_seq"]

log = logging.getLogger("chaos.load")

TABLES = ("a.items", "b.orders")


@dataclass(frozen=True)
class Op:
    table: str  # full name: {tag}_a.items
    key: int
    op: str  # I | U | D
    version: int


@dataclass
class _Txn:
    no: int
    ops: tuple[Op, ...]
    t: float = 0.0
    gtid_seq: int | None = None
    state: str = "committed"  # committed | uncertain | db_lost | failed


def gtid_seq(gtid: str, domain: int = 0) -> int | None:
    """The sequence number of ``domain`` in a MariaDB GTID list (``0-1-42,1-2-7``)."""
    for part in str(gtid or "").split(","):
        bits = part.strip().split("-")
        if len(bits) == 3 and bits[0].isdigit() and int(bits[0]) == domain:
            return int(bits[2])
    return None


class LoadWriter:
    def __init__(
        self, server: MariaDBServer, tag: str, rate_txn_s: float = 40.0, seed: int = 0
    ) -> None:
        self.server = server
        self.tag = tag
        self.tables = tuple(f"{tag}_{t}" for t in TABLES)
        self.interval_s = 1.0 / rate_txn_s
        self._rnd = random.Random(seed)
        self._live: dict[str, dict[int, int]] = {t: {} for t in self.tables}
        self._maxver: dict[tuple[str, int], int] = {}
        self._next_key = 1
        self._txns: list[_Txn] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._idle = threading.Event()
        self._retargeted = False
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        self.errors = 0

    # -- public -------------------------------------------------------------------------

    @property
    def filter_regex(self) -> str:
        """Canal's filter for this load's tables (what a destination should serve)."""
        return f"{self.tag}_[ab]\\..*"

    def setup(self) -> LoadWriter:
        stmts = []
        for table in self.tables:
            schema = table.split(".")[0]
            stmts += [
                f"CREATE DATABASE IF NOT EXISTS {schema}",
                f"CREATE TABLE IF NOT EXISTS {table} (k INT PRIMARY KEY, v INT NOT NULL, "
                "pad VARCHAR(40) NOT NULL) ENGINE=InnoDB",
            ]
        self.server.execute(*stmts)
        return self

    def prefill(self, rows: int) -> LoadWriter:
        """``rows`` rows in each table before the load starts (version 1; not in the
        history: a destination started later sees them only through a snapshot)."""
        first = self._next_key
        for table in self.tables:
            self.server.execute(
                f"INSERT INTO {table} (k, v, pad) SELECT seq, 1, 'prefill' "
                f"FROM {table.split('.')[0]}.seq_{first}_to_{first + rows - 1}"
            )
            for key in range(first, first + rows):
                self._live[table][key] = 1
                self._maxver[(table, key)] = 1
        self._next_key = first + rows
        return self

    def db_state(self) -> dict[tuple[str, int], int]:
        """The rows the tables have now: (table, key) → version."""
        conn = self._connect()
        try:
            state: dict[tuple[str, int], int] = {}
            with conn.cursor() as cur:
                for table in self.tables:
                    cur.execute(f"SELECT k, v FROM {table}")
                    state.update(((table, int(k)), int(v)) for k, v in cur.fetchall())
            return state
        finally:
            conn.close()

    def db_lost_keys(self) -> set[tuple[str, int]]:
        """Keys changed by transactions the database lost in a failover."""
        with self._lock:
            return {(o.table, o.key) for t in self._txns if t.state == "db_lost" for o in t.ops}

    def start(self) -> LoadWriter:
        self._thread = threading.Thread(target=self._run, name=f"load {self.tag}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(90)
            assert not self._thread.is_alive(), "the load writer did not stop"
        self._close()

    def pause(self) -> None:
        """Stop writing; returns once the transaction in flight has finished."""
        self._running.clear()
        wait_until(self._idle.is_set, f"load {self.tag} pauses", 120.0)

    def resume(self) -> None:
        self._running.set()

    def retarget(self, server: MariaDBServer) -> None:
        """Write to ``server`` from now on (the promoted replica)."""
        with self._lock:
            self.server = server
            self._retargeted = True

    def committed(self) -> int:
        with self._lock:
            return sum(1 for t in self._txns if t.state == "committed")

    def history(self) -> list[ExpectedChange]:
        with self._lock:
            out = []
            for txn in self._txns:
                if txn.state in ("committed", "db_lost", "uncertain"):
                    required = txn.state == "committed"
                    for op in txn.ops:
                        out.append(
                            ExpectedChange(
                                op.table, op.key, op.op, op.version, txn.no, txn.t, required
                            )
                        )
            return out

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._running.is_set():
                self._idle.set()
                self._running.wait()
                self._idle.clear()
            if self._stop.is_set():
                break
            txn = _Txn(len(self._txns) + 1, self._plan())
            try:
                if self._conn is None:
                    self._conn = self._connect()
                self._execute(txn)
            except pymysql.err.Error as exc:
                self.errors += 1
                txn.state = "uncertain"
                log.warning("load %s: txn %d failed (%s); reconnecting", self.tag, txn.no, exc)
                with self._lock:
                    self._txns.append(txn)
                self._close()
                self._reconnect()
                continue
            with self._lock:
                self._txns.append(txn)
                self._apply(txn.ops)
            self._stop.wait(self.interval_s)

    def _plan(self) -> tuple[Op, ...]:
        ops: list[Op] = []
        used: set[tuple[str, int]] = set()
        for _ in range(self._rnd.randint(1, 3)):
            table = self._rnd.choice(self.tables)
            live = self._live[table]
            free = [k for k in live if (table, k) not in used]
            roll = self._rnd.random()
            if len(free) < 20 or roll < 0.4:
                key, self._next_key = self._next_key, self._next_key + 1
                op = Op(table, key, "I", self._bump(table, key))
            elif roll < 0.85:
                key = self._rnd.choice(free)
                op = Op(table, key, "U", self._bump(table, key))
            else:
                key = self._rnd.choice(free)
                op = Op(table, key, "D", live[key])
            used.add((table, key))
            ops.append(op)
        return tuple(ops)

    def _bump(self, table: str, key: int) -> int:
        """A version never used for this key before (failed attempts reserve theirs)."""
        version = self._maxver.get((table, key), 0) + 1
        self._maxver[(table, key)] = version
        return version

    def _apply(self, ops: tuple[Op, ...]) -> None:
        for op in ops:
            if op.op == "D":
                self._live[op.table].pop(op.key, None)
            else:
                self._live[op.table][op.key] = op.version

    def _execute(self, txn: _Txn) -> None:
        conn = self._conn
        conn.begin()
        with conn.cursor() as cur:
            for op in txn.ops:
                if op.op == "I":
                    cur.execute(
                        f"INSERT INTO {op.table} (k, v, pad) VALUES (%s, %s, %s)",
                        (op.key, op.version, f"t{txn.no}"),
                    )
                elif op.op == "U":
                    cur.execute(
                        f"UPDATE {op.table} SET v = %s, pad = %s WHERE k = %s",
                        (op.version, f"t{txn.no}", op.key),
                    )
                else:
                    cur.execute(f"DELETE FROM {op.table} WHERE k = %s", (op.key,))
        conn.commit()
        txn.t = time.time()
        with conn.cursor() as cur:
            cur.execute("SELECT @@last_gtid")
            row = cur.fetchone()
        txn.gtid_seq = gtid_seq(str(row[0])) if row else None

    # -- connections and resync -------------------------------------------------------------

    def _connect(self) -> Any:
        """A root connection over the unix socket. The socket is ours: pymysql leaks
        the one it makes when the connect fails (the server just died)."""
        conn = pymysql.connect(
            unix_socket=str(self.server.socket),
            user="root",
            autocommit=True,
            read_timeout=10,
            write_timeout=10,
            charset="utf8mb4",
            defer_connect=True,
        )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(2.0)
            sock.connect(str(self.server.socket))
            conn.connect(sock)
        except (OSError, pymysql.err.Error) as exc:
            sock.close()
            raise pymysql.err.OperationalError(2002, f"connect failed: {exc}") from exc
        return conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(pymysql.err.Error):
                conn.close()

    def _reconnect(self) -> None:
        def attempt() -> bool:
            if self._stop.is_set():
                return True
            try:
                self._conn = self._connect()
            except pymysql.err.Error:
                return False
            return True

        wait_until(attempt, f"load {self.tag} reconnects", 120.0, max_interval_s=0.2)
        if self._conn is not None:
            self._resync()

    def _db_state(self) -> tuple[dict[tuple[str, int], int], int | None]:
        state: dict[tuple[str, int], int] = {}
        with self._conn.cursor() as cur:
            for table in self.tables:
                cur.execute(f"SELECT k, v FROM {table}")
                for k, v in cur.fetchall():
                    state[(table, int(k))] = int(v)
            cur.execute("SELECT @@gtid_binlog_pos")
            row = cur.fetchone()
        return state, gtid_seq(str(row[0])) if row else None

    def _resync(self) -> None:
        """After a failure: settle uncertain and lost transactions, adopt the rows."""
        db, pos = self._db_state()
        with self._lock:
            if self._retargeted and pos is not None:
                for txn in self._txns:
                    if txn.state == "committed" and (txn.gtid_seq or 0) > pos:
                        txn.state = "db_lost"
            expected = self._replay()
            for txn in self._txns:
                if txn.state == "uncertain":
                    after = dict(expected)
                    _apply_state(after, txn.ops)
                    if all(
                        db.get((o.table, o.key)) == after.get((o.table, o.key)) for o in txn.ops
                    ):
                        txn.state = "committed"
                        txn.t = time.time()
                        expected = after
                    elif not self._retargeted:
                        txn.state = "failed"
            self._adopt(db)
            lost = sum(1 for t in self._txns if t.state == "db_lost")
        log.warning("load %s: resynced (gtid seq %s, %d lost by the database)", self.tag, pos, lost)

    def _replay(self) -> dict[tuple[str, int], int]:
        state: dict[tuple[str, int], int] = {}
        for txn in self._txns:
            if txn.state == "committed":
                _apply_state(state, txn.ops)
        return state

    def _adopt(self, db: dict[tuple[str, int], int]) -> None:
        self._live = {t: {} for t in self.tables}
        for (table, key), v in db.items():
            self._live[table][key] = v
        for (table, key), v in db.items():
            self._maxver[(table, key)] = max(self._maxver.get((table, key), 0), v)
        self._next_key = max([self._next_key, *(k + 1 for _, k in db)])


def _apply_state(state: dict[tuple[str, int], int], ops: tuple[Op, ...]) -> None:
    for op in ops:
        if op.op == "D":
            state.pop((op.table, op.key), None)
        else:
            state[(op.table, op.key)] = op.version
