"""The canal_tcp part: the generated binlog end to end through Canal's TCP protocol,
beside REST msgpack in the same run.

Each of ``ctx.repeat`` rounds starts a fresh one-node cluster reading the generated binlog
from its start (as ``bench_node``'s e2e parts do) and reads it whole with
``benchmarks/canal_consumer.py`` in a process of its own (every ``Entry`` and
``RowChange`` parsed, every value read); then, in the same round, a fresh node read whole
by ``benchmarks/e2e_consumer.py`` over REST msgpack (the ``e2e_msgpack`` part's path):
the anchor. The goal: at least half of REST msgpack's rows/s (``vs_rest_msgpack``, the
medians' ratio). ``cpu_vs_rest_msgpack`` is the ratio of the CPU a row costs the node
and the consumer together (REST's over Canal's, the medians' runs): what the rows/s
ratio comes to when the two processes have a core each, whatever else runs on the
machine.

Where the time goes, per row: the node's CPU over each read (``node_cpu_us_per_row``,
both paths), the Canal consumer's wait for answers, its parsing and its CPU, and
(``encode``) the CPU of both ends measured in this process on the same entries, free of
the machine's other load: the node turning a batch into bytes (Canal's protobuf,
``encode_entries`` and the MESSAGES frame, against REST's compact msgpack) and the
consumer parsing those bytes, each with its top functions (``cProfile``).
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import psutil

from benchmarks import bench_node
from benchmarks.bench_cluster import DEST, BenchNode, start_nodes, stop_all, wait_leader
from benchmarks.bench_common import REPO, Context, median_runs
from benchmarks.canal_consumer import read_batch
from canal_protocol.batch import Batch
from canal_protocol.entry import Entry
from canal_protocol.positions import EntryPosition
from canal_server.canal.convert import encode_entries
from canal_server.canal.wire import messages_frame
from canal_server.parse.reader import BinlogReader, ReaderConfig

__all__ = ["GOAL_VS_REST", "canal_tcp"]

GOAL_VS_REST = 0.5
TIMEOUT_S = 1800.0
BATCH_SIZE = bench_node.BATCH_SIZE


def _node_cpu_s(node: BenchNode) -> float:
    t = psutil.Process(node.pid).cpu_times()
    return float(t.user + t.system)


def _consume_canal(node: BenchNode, rows: int, client_id: str) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "benchmarks.canal_consumer", "--address", node.canal,
        "--destination", DEST, "--client-id", client_id, "--rows", str(rows),
        "--batch-size", str(BATCH_SIZE), "--timeout-s", str(TIMEOUT_S),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            argv, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S + 60, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the Canal consumer did not finish within {TIMEOUT_S:.0f}s") from exc
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the Canal consumer exited {done.returncode}: {tail}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _once(ctx: Context, run: int, path: str) -> dict[str, Any]:
    """One read of the whole binlog by a fresh node: ``path`` "canal" or "rest"."""
    ds = ctx.dataset
    master = {"journal_name": ds.journal, "position": ds.offset}
    nodes = start_nodes(ctx, 1, f"canal-tcp-{path}-{run}", destination={"master": master})
    try:
        wait_leader(nodes)
        cpu0 = _node_cpu_s(nodes[0])
        if path == "canal":
            got = _consume_canal(nodes[0], ds.rows, f"canal-tcp-{run}")
        else:
            got = bench_node._consume_apart(nodes[0].url, "msgpack", ds.rows, prefetch=False)
        node_cpu_s = _node_cpu_s(nodes[0]) - cpu0
    finally:
        stop_all(nodes)
    if got["rows"] != ds.rows:
        raise RuntimeError(f"the {path} consumer got {got['rows']} row changes of {ds.rows}")
    out = {
        **got, "seconds": round(got["seconds"], 3), "rows_per_s": got["rows"] / got["seconds"],
        "node_cpu_s": round(node_cpu_s, 3),
        "node_cpu_us_per_row": round(node_cpu_s / ds.rows * 1e6, 2),
    }  # fmt: skip
    out["consumer_cpu_us_per_row"] = round(got["cpu_s"] / ds.rows * 1e6, 2)
    if path == "canal":
        out["consumer_parse_us_per_row"] = round(got["parse_s"] / ds.rows * 1e6, 2)
        out["consumer_wait_us_per_row"] = round(got["wait_s"] / ds.rows * 1e6, 2)
    return out


def _entries(ctx: Context) -> list[Entry]:
    """The generated binlog's entries, read in this process by ``BinlogReader``."""
    ds = ctx.dataset
    got: list[Entry] = []
    rows = [0]
    done = threading.Event()

    def sink(entries: Sequence[Entry]) -> None:
        got.extend(entries)
        rows[0] += sum(e.row_count for e in entries)
        if rows[0] >= ds.rows:
            done.set()

    reader = BinlogReader(ReaderConfig(master=ctx.sandbox.primary.dsn(), slave_id=7990), sink)
    thread = threading.Thread(
        target=reader.run, args=(EntryPosition(ds.journal, ds.offset),), daemon=True
    )
    thread.start()
    try:
        if not done.wait(TIMEOUT_S):
            raise TimeoutError("BinlogReader did not read the binlog in time")
    finally:
        reader.stop()
        thread.join(60)
    return got


def _top(profile: cProfile.Profile, n: int = 6) -> list[str]:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(n)
    lines = [line.strip() for line in text.getvalue().splitlines()]
    return [line for line in lines if "}" in line or ".py:" in line][:n]


def _encode(ctx: Context) -> dict[str, Any]:
    """Where the CPU goes, per row, measured in this process on the same entries in
    batches of ``BATCH_SIZE`` (no other process competes within a measure): the node's
    MESSAGES frames (``encode_entries`` and the framing) against REST's compact msgpack,
    and the consumer's parsing of those frames (``canal_consumer.read_batch``: Packet,
    Messages, Entry, RowChange, every value), each with its top functions."""
    entries = _entries(ctx)
    rows = sum(e.row_count for e in entries)
    batches = [entries[i : i + BATCH_SIZE] for i in range(0, len(entries), BATCH_SIZE)]
    t0 = time.process_time()
    frames = [messages_frame(i + 1, encode_entries(b)) for i, b in enumerate(batches)]
    canal_s = time.process_time() - t0
    t0 = time.process_time()
    for i, batch in enumerate(batches):
        Batch(i + 1, batch).pack_compact()
    msgpack_s = time.process_time() - t0
    tally = {"rows": 0, "duplicate_rows": 0, "values": 0, "value_chars": 0}
    seen: set[tuple[str, int]] = set()
    t0 = time.process_time()
    for frame in frames:
        read_batch(frame[4:], seen, tally)
    parse_s = time.process_time() - t0
    some = batches[: max(1, len(batches) // 4)]
    node, consumer = cProfile.Profile(), cProfile.Profile()
    node.enable()
    some_frames = [messages_frame(i + 1, encode_entries(b)) for i, b in enumerate(some)]
    node.disable()
    consumer.enable()
    for frame in some_frames:
        read_batch(frame[4:], set(), dict.fromkeys(tally, 0))
    consumer.disable()
    return {
        "rows": rows,
        "canal_protobuf_us_per_row": round(canal_s / rows * 1e6, 2),
        "rest_msgpack_us_per_row": round(msgpack_s / rows * 1e6, 2),
        "consumer_parse_cpu_us_per_row": round(parse_s / rows * 1e6, 2),
        "canal_top_functions": _top(node),
        "consumer_top_functions": _top(consumer),
        "note": "CPU time in the benchmark's process on the entries BinlogReader gives for "
        "the generated binlog: encode_entries + the MESSAGES frame vs Batch.pack_compact; "
        "the Canal consumer's parse of those frames (every Entry, RowChange and value)",
    }


def _cpu(run: dict[str, Any]) -> float:
    """CPU per row of a read, node and consumer (µs)."""
    return float(run["node_cpu_us_per_row"]) + float(run["consumer_cpu_us_per_row"])


def canal_tcp(ctx: Context) -> dict[str, Any]:
    canal, rest = [], []
    for run in range(ctx.repeat):
        canal.append(_once(ctx, run, "canal"))
        rest.append(_once(ctx, run, "rest"))
    mid, anchor = median_runs(canal), median_runs(rest)
    ratio = mid["rows_per_s"] / anchor["rows_per_s"]
    return {
        **mid,
        "rest_msgpack_rows_per_s": anchor["rows_per_s"],
        "rest_msgpack_runs": anchor["runs"],
        "rest_msgpack_node_cpu_us_per_row": anchor["node_cpu_us_per_row"],
        "rest_msgpack_consumer_cpu_us_per_row": anchor["consumer_cpu_us_per_row"],
        "vs_rest_msgpack": round(ratio, 3),
        "cpu_vs_rest_msgpack": round(_cpu(anchor) / _cpu(mid), 3),
        "goal_vs_rest_msgpack": GOAL_VS_REST,
        "meets_goal": ratio >= GOAL_VS_REST,
        "encode": _encode(ctx),
        "batch_size_entries": BATCH_SIZE,
        "path": "leader node -> Canal TCP (GET fetch_size 1000, timeout 1000 ms, CLIENTACK "
        "after each batch) -> benchmarks/canal_consumer.py in a process of its own, every "
        "Entry and RowChange parsed with the generated classes; anchor: a fresh node -> REST "
        "msgpack -> benchmarks/e2e_consumer.py (e2e_msgpack's headline path), in the same "
        "round",
    }
