"""Canal's ``Entry`` bytes of a batch beside the compact msgpack batch, in one process.

Usage: ``.venv/bin/python -m benchmarks.bench_canal_encode [--rows N] [--repeat R]``.

Builds batches of the benchmark table's rows (``bench_data``'s shape: int key, int,
bigint, decimal(12,2), varchar(64), datetime(6), blob; the same values as its
``row_select``) in the server's form (``PackedRows``, the C decoder's msgpack bytes, as
the store holds them), in two shapes: ``large`` (1000-row transactions, 64 rows an
entry: BEGIN, 16 ROWDATA, END; eight inserts, one update, one delete of every ten) and
``small`` (one-row insert transactions: BEGIN, ROWDATA, END). Then times, per shape:

- ``msgpack_compact``: ``Batch.pack_compact_pieces`` (what a REST msgpack GET sends; the
  anchor);
- ``canal_generated``: ``to_canal_entry(e).SerializeToString()`` per entry (the
  generated upb classes for every message);
- ``canal_python``: ``encode_entries_python`` (the bytes written by hand in Python, a
  function generated per table: the C encoder's reference);
- ``canal_encode``: ``encode_entries`` (the C encoder, ``_canalcodec``: what the Canal
  listener sends; the same bytes as ``canal_python``).

Rows are row changes (an UPDATE's before + after image count once). The ways take
turns run by run. Prints rows/s per way (median of ``--repeat`` runs) and rows per
second of the process's CPU time (steadier on a loaded machine), and writes
``benchmarks/results/canal_encode.json``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack

from benchmarks.bench_common import REPO, machine_info, write_result
from canal_protocol.batch import Batch
from canal_protocol.entry import Entry, EntryType, EventType, Header, TableColumns
from canal_server.canal.convert import (
    CanalForm,
    encode_entries,
    encode_entries_python,
    to_canal_entry,
)
from canal_server.packed import PackedRows, pack_columns

__all__ = ["WAYS", "batches", "main", "measure"]

COLUMNS = TableColumns(
    ("id", "qty", "big", "price", "name", "created", "payload"),
    ("int", "int", "bigint", "decimal(12,2)", "varchar(64)", "datetime(6)", "blob"),
    (True, False, False, False, False, False, False),
)
ROWS_PER_ENTRY = 64
TX_ROWS = 1000
UTC = CanalForm(datetime.UTC)


def _row(seq: int) -> tuple[Any, ...]:
    """The values ``bench_data.row_select`` writes for ``seq``."""
    created = datetime.datetime(2024, 1, 1) + datetime.timedelta(
        seconds=seq, microseconds=seq % 1_000_000
    )
    return (
        seq, seq % 1000, seq * 1000003, f"{seq / 100:.2f}",
        f"name-{seq}-{'x' * (seq % 20)}", created.strftime("%Y-%m-%dT%H:%M:%S.%f"),
        hashlib.sha256(str(seq).encode()).digest(),
    )  # fmt: skip


def _packed(before: Sequence[Any], after: Sequence[Any]) -> PackedRows:
    pack = msgpack.Packer(use_bin_type=True).pack
    return PackedRows(
        COLUMNS, max(len(before), len(after)), pack(list(before)), pack(list(after)),
        pack_columns(COLUMNS),
    )  # fmt: skip


def _header(offset: int, kind: EventType, gtid: str, table: str = "orders") -> Header:
    return Header("mariadb-bin.000001", offset, offset + 100, 1, 1_704_067_200_000, gtid,
                  "bench" if table else "", table, kind)  # fmt: skip


def _transaction(tx: int, first: int, n: int, kind: EventType, per: int) -> list[Entry]:
    gtid, before_state = f"0-1-{tx + 1}", f"0-1-{tx}"
    offset = tx * 100_000
    out = [Entry(EntryType.TRANSACTIONBEGIN, _header(offset, EventType.GTID, gtid, ""),
                 gtid_state=before_state)]  # fmt: skip
    for start in range(first, first + n, per):
        rows = [_row(s) for s in range(start, min(start + per, first + n))]
        if kind is EventType.INSERT:
            images = _packed([], rows)
        elif kind is EventType.DELETE:
            images = _packed(rows, [])
        else:
            changed = [(r[0], r[1] + 1, r[2], r[3], r[4] + "u", r[5], r[6]) for r in rows]
            images = _packed(rows, changed)
        offset += 1000
        out.append(Entry(EntryType.ROWDATA, _header(offset, kind, gtid), images=images,
                         gtid_state=before_state))  # fmt: skip
    out.append(Entry(EntryType.TRANSACTIONEND, _header(offset + 1000, EventType.QUERY, gtid, ""),
                     gtid_state=gtid))  # fmt: skip
    return out


def batches(rows: int) -> dict[str, list[Entry]]:
    """The two shapes' entries, ``rows`` row changes each."""
    large: list[Entry] = []
    kinds = {8: EventType.UPDATE, 9: EventType.DELETE}
    tx = 0
    while tx * TX_ROWS < rows:
        n = min(TX_ROWS, rows - tx * TX_ROWS)
        large += _transaction(tx, tx * TX_ROWS + 1, n, kinds.get(tx % 10, EventType.INSERT),
                              ROWS_PER_ENTRY)  # fmt: skip
        tx += 1
    small: list[Entry] = []
    for seq in range(1, rows + 1):
        small += _transaction(seq, seq, 1, EventType.INSERT, 1)
    return {"large": large, "small": small}


def _fresh(entries: Sequence[Entry]) -> list[Entry]:
    """The entries with rows not decoded yet (``PackedRows`` caches its tuples)."""
    out = []
    for e in entries:
        rows = e.images
        if isinstance(rows, PackedRows):
            rows = PackedRows(rows.columns, rows.count, rows.packed_before,
                              rows.packed_after, rows.packed_columns)  # fmt: skip
            e = Entry(e.type, e.header, e.is_ddl, e.sql, rows, e.gtid_state)
        out.append(e)
    return out


WAYS: dict[str, Callable[[list[Entry]], int]] = {
    "msgpack_compact": lambda es: sum(map(len, Batch(1, es).pack_compact_pieces())),
    "canal_generated": lambda es: sum(
        len(m.SerializeToString()) for e in es if (m := to_canal_entry(e, UTC)) is not None
    ),
    "canal_python": lambda es: sum(map(len, encode_entries_python(es, UTC))),
    "canal_encode": lambda es: sum(map(len, encode_entries(es, UTC))),
}


def measure(entries: list[Entry], rows: int, repeat: int) -> dict[str, dict[str, Any]]:
    """rows/s and bytes of each way, the median of ``repeat`` runs each; the ways take
    turns run by run, so a change in the machine's load falls on all of them. Also rows
    per second of this process's CPU time (``cpu_rows_per_s``): on a machine shared with
    other jobs, wall-clock rates move with their load, CPU time much less."""
    runs: dict[str, list[float]] = {name: [] for name in WAYS}
    cpu: dict[str, list[float]] = {name: [] for name in WAYS}
    sizes: dict[str, int] = {}
    for _ in range(repeat):
        for name, way in WAYS.items():
            fresh = _fresh(entries)
            t0, c0 = time.perf_counter(), time.process_time()
            sizes[name] = way(fresh)
            c1, t1 = time.process_time(), time.perf_counter()
            runs[name].append(rows / (t1 - t0))
            cpu[name].append(rows / max(c1 - c0, 1e-9))
    return {
        name: {"rows_per_s": statistics.median(r), "runs": r,
               "cpu_rows_per_s": statistics.median(cpu[name]), "bytes": sizes[name]}
        for name, r in runs.items()
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/canal_encode.json")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"machine": machine_info(), "rows": args.rows, "shapes": {}}
    for shape, entries in batches(args.rows).items():
        ways = measure(entries, args.rows, args.repeat)
        anchor = ways["msgpack_compact"]["rows_per_s"]
        cpu_anchor = ways["msgpack_compact"]["cpu_rows_per_s"]
        for way in ways.values():
            way["vs_msgpack_compact"] = round(way["rows_per_s"] / anchor, 3)
            way["cpu_vs_msgpack_compact"] = round(way["cpu_rows_per_s"] / cpu_anchor, 3)
        result["shapes"][shape] = {"entries": len(entries), "ways": ways}
        print(f"{shape}: {args.rows} rows in {len(entries)} entries")
        for name, w in ways.items():
            print(f"  {name:16} {w['rows_per_s']:>12,.0f} rows/s  x{w['vs_msgpack_compact']:<6}"
                  f" {w['cpu_rows_per_s']:>12,.0f} rows/cpu-s  x{w['cpu_vs_msgpack_compact']:<6}"
                  f" {w['bytes']:>12,} bytes")  # fmt: skip
    m = result["machine"]
    print(f"machine: {m.get('cpu_model')} x{m.get('nproc')}, python {m.get('python')}")
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
