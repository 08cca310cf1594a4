"""canal-ha benchmark harness: one command, one generated binlog, a table and a JSON file.

Usage::

    .venv/bin/python benchmarks/run.py [--rows N] [--only NAME,...] [--out FILE]

Starts a private sandbox (MariaDB + etcd in a temp dir), writes ``--rows`` row changes
(mixed types, three tables, 1000-row transactions), runs every part (see ``PARTS``;
``--only`` picks some), prints a table and writes JSON (default
``benchmarks/results/latest.json``). The sandbox is stopped at the end by pid. A part
that fails records its error; the run goes on. Numbers on a loaded machine are not
final: run it when the machine is quiet. SIGTERM/Ctrl-C stop the sandbox too.
The ``zongji`` part needs Node.js and npm: on first use it installs @vlasky/zongji into
``benchmarks/zongji/node_modules`` with ``npm ci`` (package-lock.json; not committed);
without npm it is reported ``unavailable`` with the reason.

The JSON document::

    machine   nproc, cpu_model, memory_bytes, python, platform, loadavg_at_start
    config    rows, repeat, parts, latency_seconds, failover_*, rss_rows, snapshot_rows,
              delta_sizes, delta_changes, delta_batches
    binlog    rows, transactions, kinds {insert, update, delete}, tables, journal,
              offset, files, end_journal, end_offset, bytes, load_s
    parts     {name: {status: ok | error | unavailable | not yet, title, wall_s,
              reason/error when not ok, and the part's numbers: readers and end to
              end rows, seconds, rows_per_s (median), runs; canal_tcp also
              rest_msgpack_rows_per_s, rest_msgpack_runs, vs_rest_msgpack,
              goal_vs_rest_msgpack, meets_goal, cpu_vs_rest_msgpack, reconnects,
              node_cpu_us_per_row and consumer_cpu_us_per_row (both paths),
              consumer_{parse,wait}_us_per_row, encode {canal_protobuf_us_per_row,
              rest_msgpack_us_per_row, consumer_parse_cpu_us_per_row,
              canal_top_functions, consumer_top_functions}; latency rates[] with
              target_tps, achieved_tps, p50_ms, p99_ms, max_ms, samples, goal_p99_ms,
              insert_p50_ms, insert_p99_ms, after_commit_p50_ms, after_commit_p99_ms,
              node_cpu_us_per_tx, loadavg_1m;
              failover kinds {sigkill, sigstop: trials_s, median_s, max_s, phase
              medians, goal_median_s, goal_max_s, meets_goal}, election; node_rss
              rss_before_bytes, rss_after_bytes, bytes_per_row, store_bytes_per_row; snapshot
              table_rows, rows_per_s (end to end), mariadb_dump_rows_per_s,
              pymysql_loop_rows_per_s, vs_mariadb_dump, vs_pymysql_loop, their runs; handover
              sigterm/step_down {stalls_ms, median_ms, max_ms}, duplicate_rows,
              lost_rows; settle phases[] with phase, leaders, seconds, moves,
              moves_in_quiet_window; scale_clients / scale_destinations runs[] with
              consumers, aggregate_rows_per_s, per_client_rows_per_s, node_cpu_cores; idle_cost
              runs[] with destinations, rss_bytes, cpu_percent, and the per-destination
              slopes; delta_mirror changes_per_batch, rounds, sizes[] with table, rows,
              delta/parquet {micro_batches, rows, median_add_batch_ms, batches[] with
              rows, add_batch_ms, batch_ms}, delta.files}}
    ratios    {name: {vs_mysql_replication, vs_c_decoder}} for every part with rows/s
    started_at, duration_s
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (
    bench_api,
    bench_canal,
    bench_delta,
    bench_node,
    bench_readers,
    bench_scale,
    bench_snapshot,
    bench_spark,
)
from benchmarks.bench_common import REPO, Context, Part, machine_info, run_part, write_result
from benchmarks.bench_data import generate
from benchmarks.bench_report import ratios, render_table
from canal_ha.sandbox import Sandbox

__all__ = ["PARTS", "main"]

log = logging.getLogger("bench")

PARTS: tuple[Part, ...] = (
    Part("mariadb_binlog", "mariadb-binlog -v (C decoder)", bench_readers.mariadb_binlog),
    Part("zongji", "npm @vlasky/zongji (Node)", bench_readers.zongji),
    Part("mysql_replication", "mysql-replication loop", bench_readers.mysql_replication),
    Part("binlog_reader", "canal-ha BinlogReader (in-process)", bench_readers.binlog_reader),
    Part("e2e_msgpack", "canal-ha node -> REST msgpack -> client", bench_node.e2e_msgpack),
    Part("e2e_json", "canal-ha node -> REST JSON -> client", bench_node.e2e_json),
    Part("canal_tcp", "canal-ha node -> Canal TCP -> client", bench_canal.canal_tcp),
    Part("spark_parquet", "Spark source -> parquet", bench_spark.spark_parquet),
    Part(
        "delta_mirror",
        "mirror per micro-batch as the table grows: Delta MERGE vs parquet rewrite",
        bench_delta.delta_mirror,
    ),
    Part("latency", "commit -> client latency", bench_node.latency),
    Part("failover", "failover: leader SIGKILL / SIGSTOP -> first batch", bench_node.failover),
    Part("node_rss", "node RSS, rows buffered (not acked)", bench_node.node_rss),
    Part("snapshot", "snapshot: node -> REST msgpack -> client", bench_snapshot.snapshot),
    Part("snapshot_rss", "snapshot of a large table: node RSS", bench_snapshot.snapshot_rss),
    Part("settle", "fair share: 9 destinations on 3 nodes", bench_scale.settle),
    Part("handover", "graceful handover: consumer stall", bench_scale.handover),
    Part("scale_clients", "cost curve: clients on one destination", bench_scale.scale_clients),
    Part(
        "scale_destinations",
        "cost curve: destinations on one node",
        bench_scale.scale_destinations,
    ),
    Part("idle_cost", "cost curve: idle destinations on one node", bench_scale.idle_cost),
    Part(
        "api_filter_health",
        "REST: /v1/health under a pathological filter",
        bench_api.api_filter_health,
    ),
    Part("api_long_polls", "REST: concurrent long polls", bench_api.api_long_polls),
)
DEFAULT_OUT = REPO / "benchmarks" / "results" / "latest.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    names = [p.name for p in PARTS]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=300_000, help="row changes in the binlog")
    p.add_argument("--only", default="", help=f"comma-separated parts of: {','.join(names)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result file")
    p.add_argument(
        "--repeat", type=int, default=5, help="runs per reader and end-to-end path (median)"
    )
    p.add_argument("--latency-seconds", type=float, default=10.0, help="per rate")
    p.add_argument("--failover-trials", type=int, default=20, help="per kind (SIGKILL, SIGSTOP)")
    p.add_argument("--failover-ttl", type=float, default=3.0, help="election.ttl_s (s)")
    p.add_argument(
        "--failover-switch-delay", type=float, default=1.0, help="election.switch_delay_s (s)"
    )
    p.add_argument("--rss-rows", type=int, default=100_000)
    p.add_argument(
        "--snapshot-rows", type=int, default=1_000_000, help="rows of the snapshot part's table"
    )
    p.add_argument(
        "--snapshot-rss-rows", type=int, default=10_000_000, help="rows of snapshot_rss's table"
    )
    p.add_argument("--handovers", type=int, default=20, help="SIGTERM steps, and step-downs")
    p.add_argument("--scale-clients", default="1,4,16", help="client counts (scale_clients)")
    p.add_argument(
        "--scale-destinations", default="1,4,16", help="destination counts (scale_*, idle_cost)"
    )
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle_cost sample (s)")
    p.add_argument("--api-seconds", type=float, default=10.0, help="api_filter_health phase (s)")
    p.add_argument("--api-tps", type=float, default=200.0, help="api_filter_health rows/s")
    p.add_argument("--api-polls", type=int, default=1000, help="api_long_polls: polls at once")
    p.add_argument("--api-poll-timeout-ms", type=int, default=5000, help="their timeout_ms")
    p.add_argument(
        "--delta-sizes", default="100000,1000000,10000000", help="table rows (delta_mirror)"
    )
    p.add_argument("--delta-changes", type=int, default=10_000, help="row changes per batch")
    p.add_argument("--delta-batches", type=int, default=3, help="micro-batches per size")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - set(names))
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    if args.rows < 1000 or args.rss_rows < 1000 or args.snapshot_rows < 1000:
        p.error("--rows, --rss-rows and --snapshot-rows must be >= 1000")
    if args.repeat < 1 or args.failover_trials < 1 or args.latency_seconds <= 0:
        p.error("--repeat and --failover-trials must be >= 1, --latency-seconds > 0")
    args.parts = [part for part in PARTS if not only or part.name in only]
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the sandbox, generate the binlog, run the parts; the result document."""
    started = time.time()
    result: dict[str, Any] = {"machine": machine_info(), "started_at": started}
    result["config"] = {
        "rows": args.rows,
        "repeat": args.repeat,
        "parts": [p.name for p in args.parts],
        **_options(args),
    }
    with tempfile.TemporaryDirectory(prefix="canal-bench-") as tmp:
        box = Sandbox(Path(tmp) / "sandbox", etcd_members=1, standby=False).start()
        try:
            log.info("generating %d row changes", args.rows)
            dataset = generate(box.primary, args.rows)
            result["binlog"] = dataclasses.asdict(dataset)
            ctx = Context(box, dataset, Path(tmp), args.repeat, _options(args))
            result["parts"] = {part.name: run_part(part, ctx) for part in args.parts}
        finally:
            stopped = box.stop()
            log.info("sandbox stopped: %s", ", ".join(stopped))
    result["ratios"] = ratios(result["parts"])
    result["duration_s"] = round(time.time() - started, 1)
    return result


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "latency_seconds": args.latency_seconds,
        "failover_trials": args.failover_trials,
        "rss_rows": args.rss_rows,
        "snapshot_rows": args.snapshot_rows,
        "snapshot_rss_rows": args.snapshot_rss_rows,
        "failover_ttl_s": args.failover_ttl,
        "failover_switch_delay_s": args.failover_switch_delay,
        "handovers": args.handovers,
        "scale_clients": args.scale_clients,
        "scale_destinations": args.scale_destinations,
        "idle_seconds": args.idle_seconds,
        "api_seconds": args.api_seconds,
        "api_tps": args.api_tps,
        "api_polls": args.api_polls,
        "api_poll_timeout_ms": args.api_poll_timeout_ms,
        "delta_sizes": args.delta_sizes,
        "delta_changes": args.delta_changes,
        "delta_batches": args.delta_batches,
    }


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through run(): the sandbox is stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("bench").setLevel(logging.INFO)
    logging.getLogger("pymysqlreplication").setLevel(logging.WARNING)
    if not args.verbose:  # retries during failover trials are expected, not news
        logging.getLogger("canal_client").setLevel(logging.ERROR)
    result = run(args)
    print(render_table(result) + "\n")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
