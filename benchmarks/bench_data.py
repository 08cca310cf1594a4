"""The generated binlog every reader part reads: mixed types, a few tables, ~1000-row txs.

Three tables of the same shape (int key, int, bigint, decimal, varchar, datetime(6),
blob). Transactions of ``TX_ROWS`` row changes rotate over the tables; of every ten,
eight insert, one updates and one deletes rows inserted earlier, so the binlog has
all three kinds of row events. The binlog is flushed before and after the load, so the
load sits in its own files, which the C decoder can then read whole.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from benchmarks.bench_common import Dataset
from canal_ha.sandbox import MariaDBServer

__all__ = ["SCHEMA", "TABLES", "TX_ROWS", "generate", "row_select"]

SCHEMA = "bench"
TABLES = ("orders", "payments", "events")
TX_ROWS = 1000
COLUMNS = (
    "id INT PRIMARY KEY, qty INT NOT NULL, big BIGINT, price DECIMAL(12,2), "
    "name VARCHAR(64), created DATETIME(6), payload BLOB"
)


def row_select(first: int, last: int) -> str:
    """A SELECT producing rows ``first..last`` (sequence engine) in table column order."""
    return (
        f"SELECT seq, seq % 1000, seq * 1000003, seq / 100, CONCAT('name-', seq, '-', "
        f"REPEAT('x', seq % 20)), TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq SECOND"
        f" + INTERVAL seq % 1000000 MICROSECOND, UNHEX(SHA2(seq, 256))"
        f" FROM {SCHEMA}.seq_{first}_to_{last}"
    )


@dataclass
class _Table:
    name: str
    next_id: int = 1
    ranges: deque[tuple[int, int]] = field(default_factory=deque)


def _statement(t: _Table, kind: str, n: int) -> tuple[str, str]:
    """The SQL of one transaction of ``n`` row changes; the kind actually used."""
    full = f"{SCHEMA}.{t.name}"
    usable = [r for r in t.ranges if r[1] - r[0] + 1 >= n]
    if kind == "update" and usable:
        first = usable[-1][0]
        return (
            f"UPDATE {full} SET qty = qty + 1, price = price + 0.5, name = CONCAT(name, 'u')"
            f" WHERE id BETWEEN {first} AND {first + n - 1}",
            "update",
        )
    if kind == "delete" and t.ranges and t.ranges[0][1] - t.ranges[0][0] + 1 >= n:
        first, last = t.ranges.popleft()
        if last - first + 1 > n:
            t.ranges.appendleft((first + n, last))
        return f"DELETE FROM {full} WHERE id BETWEEN {first} AND {first + n - 1}", "delete"
    first, last = t.next_id, t.next_id + n - 1
    t.next_id = last + 1
    t.ranges.append((first, last))
    return f"INSERT INTO {full} {row_select(first, last)}", "insert"


def _kind(tx: int) -> str:
    return {8: "update", 9: "delete"}.get(tx % 10, "insert")


def generate(db: MariaDBServer, rows: int) -> Dataset:
    """Create the tables and write ``rows`` row changes; the Dataset describing them."""
    ddl = [f"CREATE TABLE {SCHEMA}.{t} ({COLUMNS})" for t in TABLES]
    db.execute(f"DROP DATABASE IF EXISTS {SCHEMA}", f"CREATE DATABASE {SCHEMA}", *ddl)
    db.execute("FLUSH BINARY LOGS")
    journal, offset = db.master_status()
    tables = [_Table(t) for t in TABLES]
    kinds = {"insert": 0, "update": 0, "delete": 0}
    t0 = time.monotonic()
    tx = written = 0
    with db.admin() as conn, conn.cursor() as cur:
        while written < rows:
            n = min(TX_ROWS, rows - written)
            sql, kind = _statement(tables[tx % len(tables)], _kind(tx), n)
            cur.execute(sql)
            if cur.rowcount != n:
                raise RuntimeError(f"{sql[:60]}… changed {cur.rowcount} rows, not {n}")
            kinds[kind] += n
            written += n
            tx += 1
    load_s = time.monotonic() - t0
    end_journal, end_offset = db.master_status()
    files = _files_between(db, journal, end_journal)
    db.execute("FLUSH BINARY LOGS")
    size = sum(int(r[1]) for r in db.execute("SHOW BINARY LOGS") if str(r[0]) in files)
    return Dataset(
        rows, tx, journal, offset, files, end_journal, end_offset,
        tuple(f"{SCHEMA}.{t}" for t in TABLES), kinds, size - offset, round(load_s, 3),
    )  # fmt: skip


def _files_between(db: MariaDBServer, first: str, last: str) -> tuple[str, ...]:
    names = db.binlog_files()
    return tuple(names[names.index(first) : names.index(last) + 1])
