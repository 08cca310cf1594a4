"""Reader parts: the C decoder, npm zongji, a plain mysql-replication loop, BinlogReader.

Each reads the whole generated binlog from its start position, counts row changes,
and is repeated ``ctx.repeat`` times (median). A run that sees a different number of
rows than the dataset holds is an error, not a number.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_common import REPO, Context, Unavailable, median_runs
from canal_protocol.entry import Entry
from canal_protocol.positions import EntryPosition
from canal_server.parse.reader import BinlogReader, ReaderConfig

__all__ = ["binlog_reader", "install_zongji", "mariadb_binlog", "mysql_replication", "zongji"]

log = logging.getLogger("bench")

ROW_MARKERS = (b"### INSERT INTO ", b"### UPDATE ", b"### DELETE FROM ")
ZONGJI_DIR = REPO / "benchmarks" / "zongji"
READ_TIMEOUT_S = 1800.0


def _rate(rows: int, seconds: float, expected: int, what: str) -> dict[str, Any]:
    if rows != expected:
        raise RuntimeError(f"{what} saw {rows} row changes, the binlog has {expected}")
    return {"rows": rows, "seconds": round(seconds, 4), "rows_per_s": rows / seconds}


def _repeat(ctx: Context, one: Any) -> dict[str, Any]:
    return median_runs([one() for _ in range(ctx.repeat)])


# -- mariadb-binlog (C decoder) ----------------------------------------------------------


def _count_rows(stream: Any) -> int:
    """Row changes in mariadb-binlog -v output, counted on whole lines, chunk by chunk."""
    count, rest = 0, b""
    while chunk := stream.read(1 << 20):
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        block, rest = data[:cut], data[cut:]
        count += sum(block.count(m) for m in ROW_MARKERS)
    return count + sum(rest.count(m) for m in ROW_MARKERS)


def _mariadb_binlog_once(ctx: Context, binary: str) -> dict[str, Any]:
    dsn, ds = ctx.sandbox.primary.dsn(), ctx.dataset
    argv = [
        binary, "--no-defaults", "--read-from-remote-server", f"--host={dsn['host']}",
        f"--port={dsn['port']}", f"--user={dsn['user']}", f"--password={dsn['password']}",
        "--base64-output=DECODE-ROWS", "-v", f"--start-position={ds.offset}", *ds.files,
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    rows = _count_rows(proc.stdout)
    err = proc.stderr.read()
    code = proc.wait(READ_TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"mariadb-binlog exit {code}: {err.decode(errors='replace')[:400]}")
    return _rate(rows, elapsed, ds.rows, "mariadb-binlog")


def mariadb_binlog(ctx: Context) -> dict[str, Any]:
    binary = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if binary is None:
        raise Unavailable("mariadb-binlog is not installed")
    result = _repeat(ctx, lambda: _mariadb_binlog_once(ctx, binary))
    return {**result, "command": "mariadb-binlog --read-from-remote-server "
            "--base64-output=DECODE-ROWS -v (rows counted from ### lines)"}  # fmt: skip


# -- npm zongji ----------------------------------------------------------------------------


def install_zongji(directory: Path = ZONGJI_DIR) -> str:
    """@vlasky/zongji in ``directory``/node_modules, installed by ``npm ci`` (the exact
    versions of package-lock.json) when it is not there yet; its version.

    ``Unavailable`` (the part is skipped with the reason) when npm is missing or fails.
    """
    pkg = directory / "node_modules" / "@vlasky" / "zongji" / "package.json"
    if not pkg.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise Unavailable(
                f"npm not found: install Node.js and npm to run this part; it installs "
                f"@vlasky/zongji into {directory / 'node_modules'} with npm ci"
            )
        log.info(
            "zongji: %s is missing; installing @vlasky/zongji with npm ci (package-lock.json)",
            directory / "node_modules",
        )
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=directory, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not pkg.exists():
            raise Unavailable(
                f"npm ci in {directory} failed (exit {done.returncode}): {done.stderr[-400:]}"
            )
    return str(json.loads(pkg.read_text())["version"])


def _zongji_once(ctx: Context, node: str, server_id: int) -> dict[str, Any]:
    dsn, ds = ctx.sandbox.primary.dsn(), ctx.dataset
    opts = {
        "host": dsn["host"], "port": dsn["port"], "user": dsn["user"],
        "password": dsn["password"], "filename": ds.journal, "position": ds.offset,
        "serverId": server_id, "rows": ds.rows, "timeoutS": READ_TIMEOUT_S,
    }  # fmt: skip
    done = subprocess.run(
        [node, str(ZONGJI_DIR / "read.mjs"), json.dumps(opts)],
        capture_output=True, text=True, timeout=READ_TIMEOUT_S + 60, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"zongji reader exit {done.returncode}: "
                           f"{(done.stdout + done.stderr)[-400:]}")  # fmt: skip
    out = json.loads(lines[-1])
    return _rate(int(out["rows"]), float(out["seconds"]), ds.rows, "zongji")


def zongji(ctx: Context) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        raise Unavailable("node not found: install Node.js and npm to run this part")
    version = install_zongji()
    runs = [_zongji_once(ctx, node, 7700 + i) for i in range(ctx.repeat)]
    return {**median_runs(runs), "package": f"@vlasky/zongji@{version}"}


# -- plain mysql-replication loop ------------------------------------------------------------


def _mysql_replication_once(ctx: Context, server_id: int) -> dict[str, Any]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    dsn, ds = ctx.sandbox.primary.dsn(), ctx.dataset
    settings = {k: dsn[k] for k in ("host", "port", "user", "password")}
    t0 = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings=settings, server_id=server_id, log_file=ds.journal,
        log_pos=ds.offset, resume_stream=True, blocking=False, is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
    )  # fmt: skip
    rows = touched = 0
    try:
        for ev in stream:
            for row in ev.rows:
                for part in ("values", "before_values", "after_values"):
                    for value in row.get(part, {}).values():
                        touched += value is not None
            rows += len(ev.rows)
            if rows >= ds.rows:
                break
    finally:
        stream.close()
    return _rate(rows, time.perf_counter() - t0, ds.rows, "mysql-replication")


def mysql_replication(ctx: Context) -> dict[str, Any]:
    runs = [_mysql_replication_once(ctx, 7800 + i) for i in range(ctx.repeat)]
    return {**median_runs(runs), "loop": "BinLogStreamReader, every value of every row read"}


# -- canal-ha BinlogReader ---------------------------------------------------------------------


def _binlog_reader_once(ctx: Context, slave_id: int) -> dict[str, Any]:
    ds = ctx.dataset
    count = [0]
    done = threading.Event()

    def sink(entries: Sequence[Entry]) -> None:
        count[0] += sum(e.row_count for e in entries)
        if count[0] >= ds.rows:
            done.set()

    reader = BinlogReader(ReaderConfig(master=ctx.sandbox.primary.dsn(), slave_id=slave_id), sink)
    start = EntryPosition(ds.journal, ds.offset)
    thread = threading.Thread(target=reader.run, args=(start,), daemon=True)
    t0 = time.perf_counter()
    thread.start()
    try:
        while not done.wait(0.2) and thread.is_alive():
            if time.perf_counter() - t0 > READ_TIMEOUT_S:
                raise TimeoutError(f"BinlogReader did not read {ds.rows} rows in time")
        elapsed = time.perf_counter() - t0
    finally:
        reader.stop()
        thread.join(60)
    return _rate(count[0], elapsed, ds.rows, "BinlogReader")


def binlog_reader(ctx: Context) -> dict[str, Any]:
    runs = [_binlog_reader_once(ctx, 7900 + i) for i in range(ctx.repeat)]
    return {**median_runs(runs), "reader": "canal_server.parse.reader.BinlogReader, in process"}
