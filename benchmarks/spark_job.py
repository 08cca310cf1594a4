"""The Spark part of the benchmark, in its own process: one SparkSession (local[2]) runs

0. a warm-up, not timed: the two anchors below over rows of ``range`` (the JVM's
   code generation and JIT, the Python workers: what a long-running stream has long
   behind it, and what the anchors would otherwise get from the runs before them);
1. ``canal``: the canal source (map mode, every table) → parquet, available-now;
   ``canal_b`` (with ``--b-server``): the same run with the ``--b-option`` options too,
   on a node of its own (an A/B of options in one run);
2. ``canal_typed``: a typed stream of one table → parquet, available-now;
3. ``jvm_range``: Spark's own ``range`` → rows of the same shape (the map mode's
   schema, the same number of rows) → parquet;
4. ``python_arrow``: a Python data source yielding the rows ``canal`` wrote, from
   memory, as Arrow record batches of the canal run's ``rowsPerPartition`` (one per
   partition) → parquet; ``python_arrow_typed``: the same with the rows ``canal_typed``
   wrote, in its schema.

Every run writes parquet with the session's defaults (snappy). A streaming run's rate
is its **steady state**: the rows of every micro-batch after the first over the time
from the end of the first micro-batch to the end of the last (``StreamingQueryProgress``
timestamps); the first micro-batch is reported separately (from ``start()`` to its end).
The anchors are batch writes: rows over wall time. Prints one JSON object (the last line
of its output).

    python benchmarks/spark_job.py --server URL --destination D --workdir DIR \\
        --table bench.orders [--option key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from canal_client.spark import local_session
from canal_client.spark.schema import generic_struct

DEFAULT_ROWS_PER_PARTITION = 250_000  # the source's default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--typed-server", required=True, help="a node of its own for the typed run")
    p.add_argument("--destination", required=True)
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--table", required=True, help="schema.table of the typed run")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--b-server", default="", help="a node of its own for a B run (A/B)")
    p.add_argument("--b-option", action="append", default=[], metavar="KEY=VALUE",
                   help="the B run's options, after the --option ones")  # fmt: skip
    p.add_argument("--master", default="local[2]")
    p.add_argument("--warm-up-rows", type=int, default=300_000, help="rows of the warm-up")
    return p.parse_args(argv)


def session(master: str) -> SparkSession:
    spark = local_session(master, "canal-bench")
    spark.dataSource.register(MemoryArrowSource)
    return spark


def _end_s(progress: dict[str, Any]) -> float:
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + float(progress["batchDuration"]) / 1000


def stream(
    spark: SparkSession, args: argparse.Namespace, name: str, server: str, **extra: str
) -> dict[str, Any]:
    """One available-now canal query into parquet: rows, first micro-batch, steady state."""
    out, ckpt = args.workdir / name, args.workdir / f"{name}-ckpt"
    reader = spark.readStream.format("canal").option("server", server)
    reader = reader.option("destination", args.destination).option("clientId", f"bench-{name}")
    for item in args.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    for key, value in extra.items():
        reader = reader.option(key, value)
    t0 = time.time()
    query = (
        reader.load().writeStream.format("parquet").option("path", str(out))
        .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    wall = time.time() - t0
    if query.exception() is not None:
        raise SystemExit(f"{name}: {query.exception()}")
    progress = query.recentProgress
    batches = [p for p in progress if p["numInputRows"] > 0]
    if not batches:
        raise SystemExit(f"{name}: no rows in {len(progress)} micro-batches: {progress[-3:]}")
    rows = sum(int(p["numInputRows"]) for p in batches)
    first_end = _end_s(batches[0])
    steady_rows = rows - int(batches[0]["numInputRows"])
    steady_s = _end_s(batches[-1]) - first_end
    return {
        "rows": rows, "micro_batches": len(batches), "wall_s": round(wall, 3),
        "first_batch_s": round(first_end - t0, 3),
        "first_batch_rows": int(batches[0]["numInputRows"]),
        "rows_per_micro_batch": round(rows / len(batches)),
        "steady_rows": steady_rows, "steady_s": round(steady_s, 3),
        "steady_from": first_end, "steady_to": _end_s(batches[-1]),
        "rows_per_s": steady_rows / steady_s if steady_s > 0 else 0.0,
        # every micro-batch, the first included: rows over the sum of their durations
        "batches_rows_per_s": rows * 1000 / sum(int(p["batchDuration"]) for p in batches),
        "output": str(out),
        "batches": [
            {"rows": int(p["numInputRows"]), "ms": int(p["batchDuration"]),
             **{k: int(v) for k, v in p["durationMs"].items() if k != "triggerExecution"}}
            for p in batches
        ],
    }  # fmt: skip


def jvm_range(spark: SparkSession, rows: int, out: Path) -> dict[str, Any]:
    """``range`` → the map mode's schema (seven text values per image) → parquet."""
    after = (
        "map('id', cast(id as string), 'qty', cast(id % 1000 as string),"
        " 'big', cast(id * 1000003 as string), 'price', cast(cast(id / 100 as decimal(12,2))"
        " as string), 'name', concat('name-', id, '-', repeat('x', cast(id % 20 as int))),"
        " 'created', '2024-01-01T00:00:00.123456', 'payload', base64(unhex(sha2(cast(id as"
        " string), 256))))"
    )
    df = spark.range(rows).selectExpr(
        "'bench' AS schema", "'orders' AS table", "'INSERT' AS event_type", "false AS is_ddl",
        "CAST(NULL AS STRING) AS sql", "'0-1-1' AS gtid", "'mariadb-bin.000002' AS logfile",
        "id * 100 AS offset", "CAST(id % 90 AS INT) AS row_index", "CAST(1 AS BIGINT) AS server_id",
        "TIMESTAMP'2024-01-01 00:00:00' AS commit_ts",
        "CAST(NULL AS MAP<STRING,STRING>) AS before", f"{after} AS after",
        "concat('{\"id\":\"', id, '\"}') AS primary_key",
    )  # fmt: skip
    t0 = time.time()
    df.write.mode("overwrite").parquet(str(out))
    seconds = time.time() - t0
    return {
        "rows": rows, "seconds": round(seconds, 3), "rows_per_s": rows / seconds,
        "from": t0, "to": t0 + seconds,
    }  # fmt: skip


class _ArrowPartition(InputPartition):
    def __init__(self, index: int, path: str) -> None:
        super().__init__(index)
        self.path = path


class _MemoryReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[InputPartition]:
        files = sorted(Path(self.path).glob("*.arrow"))
        return [_ArrowPartition(i, str(f)) for i, f in enumerate(files)]

    def read(self, partition: InputPartition) -> Any:
        assert isinstance(partition, _ArrowPartition)
        yield from pa.ipc.open_stream(pa.memory_map(partition.path))


class MemoryArrowSource(DataSource):
    """Arrow IPC files (``stage_rows``), memory-mapped: rows yielded from memory; the
    option ``schema``: their Spark schema as JSON (default: the map mode's)."""

    @classmethod
    def name(cls) -> str:
        return "memory_arrow"

    def schema(self) -> StructType:
        if "schema" in self.options:
            return StructType.fromJson(json.loads(self.options["schema"]))
        return generic_struct()

    def reader(self, schema: StructType) -> DataSourceReader:
        return _MemoryReader(self.options["path"])


def stage_rows(source: str, into: Path, per_partition: int, schema: StructType) -> int:
    """The rows ``canal`` wrote as Arrow IPC files of the source's ``schema``, one per
    partition of ``per_partition`` rows, read once (page cache) so that the timed run
    reads them from memory; how many."""
    target = to_arrow_schema(schema, timezone="UTC")
    table = pq.read_table(source).select(target.names).cast(target)
    into.mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(table.to_batches(per_partition)):
        path = into / f"{i:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        path.read_bytes()
    return int(table.num_rows)


def python_arrow(
    spark: SparkSession,
    source: str,
    rows: int,
    out: Path,
    per_partition: int,
    schema: StructType | None = None,
) -> dict[str, Any]:
    """``source``'s rows (parquet, of ``schema``: the map mode's by default) yielded from
    memory by a Python data source → parquet."""
    schema = schema or generic_struct()
    staged_in = out.with_name(out.name + "_in")
    staged = stage_rows(source, staged_in, per_partition, schema)
    if staged != rows:
        raise SystemExit(f"python_arrow: {staged} rows staged, not {rows}")
    reader = spark.read.format("memory_arrow").option("schema", schema.json())
    df = reader.option("path", str(staged_in)).load()
    t0 = time.time()
    df.write.mode("overwrite").parquet(str(out))
    seconds = time.time() - t0
    written = spark.read.parquet(str(out)).count()
    if written != rows:
        raise SystemExit(f"python_arrow wrote {written} rows, not {rows}")
    return {
        "rows": rows, "seconds": round(seconds, 3), "rows_per_s": rows / seconds,
        "rows_per_partition": per_partition, "from": t0, "to": t0 + seconds,
    }  # fmt: skip


def warm_up(spark: SparkSession, rows: int, work: Path, per_partition: int) -> dict[str, Any]:
    """Both anchors once over ``range`` rows, not timed (see the module docstring)."""
    t0 = time.time()
    jvm_range(spark, rows, work / "warmup_jvm")
    python_arrow(spark, str(work / "warmup_jvm"), rows, work / "warmup_arrow", per_partition)
    return {"rows": rows, "seconds": round(time.time() - t0, 3)}


def _rows_per_partition(args: argparse.Namespace) -> int:
    for item in args.option:
        key, _, value = item.partition("=")
        if key == "rowsPerPartition":
            return int(value)
    return DEFAULT_ROWS_PER_PARTITION


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    spark = session(args.master)
    result: dict[str, Any] = {"session_start_s": round(time.time() - t0, 3)}
    per_partition = _rows_per_partition(args)
    result["warm_up"] = warm_up(spark, args.warm_up_rows, args.workdir, per_partition)
    canal = stream(spark, args, "canal", args.server)
    result["canal"] = canal
    if args.b_server:  # the same map-mode run with other options, right after (A/B)
        b_args = argparse.Namespace(**{**vars(args), "option": args.option + args.b_option})
        result["canal_b"] = stream(spark, b_args, "canal_b", args.b_server)
    result["canal_typed"] = stream(spark, args, "canal_typed", args.typed_server, table=args.table)
    result["jvm_range"] = jvm_range(spark, canal["rows"], args.workdir / "jvm_range")
    result["python_arrow"] = python_arrow(
        spark, canal["output"], canal["rows"], args.workdir / "python_arrow", per_partition
    )
    typed = result["canal_typed"]
    typed_schema = spark.read.parquet(typed["output"]).schema
    result["python_arrow_typed"] = python_arrow(
        spark, typed["output"], typed["rows"], args.workdir / "python_arrow_typed",
        per_partition, typed_schema,
    )  # fmt: skip
    spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
