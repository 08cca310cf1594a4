"""Keep a copy of source tables in parquet or Delta Lake: a mirror, exactly once, from
typed streams.

    python examples/spark_mirror.py --etcd http://127.0.0.1:2379 --destination example \\
        --client-id mirror --table shop.orders --table shop.customers \\
        --output /tmp/mirror --checkpoint /tmp/mirror-ckpt --trigger available-now \\
        [--format delta]

``--format delta``: each micro-batch is MERGEd into the Delta table
``<output>/<table>`` by ``canal_client.spark.delta.DeltaMirror`` (the latest change per
key, one Delta commit per micro-batch recording the query's app id and batch id: a
replayed micro-batch is skipped; its cost follows the changes, not the table;
docs/spark.md "Delta Lake mirror").
The default, ``--format parquet``, is described below.

One typed query per table (``.option("table", ...)``, client id ``<client-id>.<table>``,
checkpoint ``<checkpoint>/<table>``). Each micro-batch is applied with ``foreachBatch``:
the latest change per primary key wins (binlog order), INSERT/UPDATE (and READ, the
snapshot's rows) upsert the after image, DELETE removes the key (and an UPDATE of the
key removes the old one), TRUNCATE and DROP
empty the table. The new state is written as a new version directory
``<output>/<table>/v=<batch id>`` and then made current by replacing the file
``<output>/<table>/_current`` (an atomic rename); a replayed micro-batch whose version
is already current is skipped, so a crash anywhere gives the same mirror. Older
versions are deleted (the previous one is kept). Read a mirror with ``read_mirror``
(or the directory named in ``_current``). Every version is a full copy of the table:
fine for tables that fit a micro-batch's rewrite; larger ones want ``--format delta``.

After an ALTER TABLE the query stops (``SchemaChanged``); run the job again: the typed
stream reads the new columns and the mirror's older rows get them (null when added,
cast when retyped, gone when dropped; Delta: the rules of docs/spark.md, an incompatible
retype stops the job with ``IncompatibleChange`` naming the table and column).
``--trigger available-now`` applies what the destination has and exits; ``--trigger
5s`` runs until Ctrl-C. At the end it prints the rows of each mirror.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from functools import reduce
from operator import or_
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from canal_client.spark import (
    CanalOptions,
    fetch_table,
    local_session,
    make_connector,
    table_filter,
)
from canal_client.spark.delta import DeltaMirror

CURRENT = "_current"
EMPTYING = ("TRUNCATE", "ERASE")  # DDL rows after which the table is empty


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--etcd", help="comma-separated etcd endpoints")
    where.add_argument("--server", help="comma-separated canal-ha node URLs")
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True, help="prefix of each table's client id")
    p.add_argument("--table", action="append", required=True, help="schema.table (repeat)")
    p.add_argument("--output", required=True, help="mirror directory")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    p.add_argument("--trigger", default="available-now", help="available-now or e.g. 5s")
    p.add_argument(
        "--format", choices=("parquet", "delta"), default="parquet",
        help="parquet: a full copy per micro-batch; delta: MERGE into a Delta table",
    )  # fmt: skip
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--master", default="local[2]")
    return p.parse_args(argv)


def session(master: str) -> SparkSession:
    return local_session(master, "canal-mirror")


# -- the mirror's versions -----------------------------------------------------------------


def current_version(table_dir: Path) -> int | None:
    """The batch id whose version is current (None: no version yet)."""
    try:
        return int((table_dir / CURRENT).read_text().strip().removeprefix("v="))
    except FileNotFoundError:
        return None


def read_mirror(spark: SparkSession, output: str, table: str) -> DataFrame | None:
    """The current state of a mirrored table (None before its first version)."""
    version = current_version(Path(output) / table)
    if version is None:
        return None
    return spark.read.parquet(str(Path(output) / table / f"v={version}"))


def _publish(table_dir: Path, batch_id: int) -> None:
    tmp = table_dir / f".{CURRENT}.tmp"
    tmp.write_text(f"v={batch_id}\n")
    os.replace(tmp, table_dir / CURRENT)  # atomic: the version is current, or not yet
    for old in table_dir.glob("v=*"):
        if int(old.name[2:]) < batch_id - 1:
            shutil.rmtree(old, ignore_errors=True)


# -- applying a micro-batch ----------------------------------------------------------------


def conform(state: DataFrame, image: StructType) -> DataFrame:
    """The state in the image's columns: added ones null, retyped ones cast."""
    have = set(state.columns)
    return state.select(
        [
            (F.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in image.fields
        ]
    )


def apply_changes(
    changes: DataFrame, state: DataFrame | None, keys: list[str], image: StructType
) -> DataFrame:
    """The state after a micro-batch of typed rows (``_seq``: their binlog order)."""
    emptied = changes.where(F.col("is_ddl") & F.col("event_type").isin(*EMPTYING))
    last_empty = emptied.agg(F.max("_seq")).first()
    cut = last_empty[0] if last_empty is not None else None
    rows = changes.where(~F.col("is_ddl"))
    if cut is not None:
        rows, state = rows.where(F.col("_seq") > cut), None
    row_image = F.coalesce(F.col("after"), F.col("before"))
    keyed = rows.select(
        (F.col("_seq") * 2 + 1).alias("_ord"), "event_type", "after",
        *[row_image[k].alias(f"_k_{k}") for k in keys],
    )  # fmt: skip
    # an UPDATE that changes the key also deletes the old key, just before it
    moved = reduce(or_, [F.col("before")[k] != F.col("after")[k] for k in keys])
    old_keys = rows.where((F.col("event_type") == "UPDATE") & moved).select(
        (F.col("_seq") * 2).alias("_ord"), F.lit("DELETE").alias("event_type"), "after",
        *[F.col("before")[k].alias(f"_k_{k}") for k in keys],
    )  # fmt: skip
    keyed = keyed.unionByName(old_keys)
    newest = Window.partitionBy(*[f"_k_{k}" for k in keys]).orderBy(F.col("_ord").desc())
    latest = keyed.withColumn("_n", F.row_number().over(newest)).where("_n = 1")
    upserts = latest.where(F.col("event_type") != "DELETE").select("after.*")
    if state is None:
        return upserts
    touched = latest.select(*[F.col(f"_k_{k}").alias(k) for k in keys])
    kept = conform(state, image).join(touched, on=keys, how="left_anti")
    return kept.unionByName(upserts)


class Mirror:
    """The ``foreachBatch`` function of one table's query."""

    def __init__(self, spark: SparkSession, output: str, table: str, keys: list[str]) -> None:
        self.spark, self.table, self.keys = spark, table, keys
        self.dir = Path(output) / table

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        current = current_version(self.dir)
        if current is not None and current >= batch_id:
            print(f"{self.table} batch {batch_id}: already applied (v={current})", flush=True)
            return
        image = batch.schema["after"].dataType
        assert isinstance(image, StructType)
        changes = batch.withColumn("_seq", F.monotonically_increasing_id()).persist()
        try:
            n = changes.count()
            if n == 0 and current is not None:
                return
            state = read_mirror(self.spark, str(self.dir.parent), self.table)
            new = apply_changes(changes, state, self.keys, image)
            new.write.mode("overwrite").parquet(str(self.dir / f"v={batch_id}"))
        finally:
            changes.unpersist()
        _publish(self.dir, batch_id)
        print(f"{self.table} batch {batch_id}: {n} changes applied (v={batch_id})", flush=True)


# -- the job ------------------------------------------------------------------------------


def source_options(args: argparse.Namespace, table: str) -> dict[str, str]:
    opts = {
        "etcd" if args.etcd else "server": args.etcd or args.server,
        "destination": args.destination,
        "clientId": f"{args.client_id}.{table}",
        "table": table,
    }
    for item in args.option:
        key, _, value = item.partition("=")
        opts[key] = value
    return opts


def start_query(spark: SparkSession, args: argparse.Namespace, table: str) -> Any:
    opts = source_options(args, table)
    keys = list(fetch_table(CanalOptions.parse(opts)).primary_key)
    if not keys:
        raise SystemExit(f"{table} has no primary key: a mirror needs one")
    df = spark.readStream.format("canal").options(**opts).load()
    sink: Any = Mirror(spark, args.output, table, keys)
    if args.format == "delta":
        sink = DeltaMirror(
            args.output, tables=[table], keys=keys, report=lambda a: print(a, flush=True)
        )
    writer = df.writeStream.foreachBatch(sink)
    writer = writer.option("checkpointLocation", str(Path(args.checkpoint) / table))
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger.replace("s", " seconds"))
    return writer.queryName(f"mirror {table}").start()


def started(query: Any, timeout_s: float = 300.0) -> None:
    """Wait until the query's source runner is up (or the query ended; bounded, then it
    goes on anyway). The queries start one after another: a query's source runner is a
    Python worker that must connect back to Spark within Spark's fixed 10 s, which
    several starting at once on a busy machine can miss."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["message"] == "Initializing sources":
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def subscribe_all(args: argparse.Namespace) -> None:
    """Subscribe every table's client id before the first query starts: a client id that
    subscribes after another query acked starts at what the destination still holds
    (``startingOffsets`` earliest), without the changes the others acked. A subscribed
    client id keeps its cursor: a restarted job changes nothing here."""
    for table in args.table:
        options = CanalOptions.parse(source_options(args, table))
        conn = make_connector(options, lookup=True)
        try:
            conn.connect()
            conn.subscribe(table_filter(options), start=options.starting_offsets)
        finally:
            conn.disconnect()


WORKER_START = "Python worker failed to connect back"
START_TRIES = 5


def start(spark: SparkSession, args: argparse.Namespace, table: str) -> Any:
    """Start a table's query and wait for its source runner; a query whose source
    runner missed Spark's 10 s to connect back (nothing of it ran: its checkpoint is
    as it was) is started again, up to ``START_TRIES`` times in all."""
    for attempt in range(1, START_TRIES + 1):
        query = start_query(spark, args, table)
        started(query)
        failure = None if query.isActive else query.exception()
        if failure is None or WORKER_START not in str(failure) or attempt == START_TRIES:
            return query
        print(f"{table}: the source runner did not connect back in time; starting the "
              f"query again ({attempt}/{START_TRIES - 1})", flush=True)  # fmt: skip
        time.sleep(5.0 * attempt)  # a busy machine: let it calm down a little
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spark = session(args.master)
    subscribe_all(args)
    queries = [start(spark, args, table) for table in args.table]
    try:
        while any(q.isActive for q in queries) and not any(q.exception() for q in queries):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    for q in queries:
        q.stop()  # one failed (or Ctrl-C): stop the others too
    failed = [
        f"{table}: {q.exception()}"
        for table, q in zip(args.table, queries, strict=True)
        if q.exception() is not None
    ]
    for table in args.table:
        if args.format == "delta":
            path = Path(args.output) / table
            if not DeltaTable.is_deltatable(str(path)):
                print(f"mirror {table}: no Delta table yet")
                continue
            dt = DeltaTable(str(path))
            print(f"mirror {table}: {dt.count()} rows (Delta version {dt.version()})")
            continue
        state = read_mirror(spark, args.output, table)
        count = state.count() if state is not None else 0
        print(f"mirror {table}: {count} rows (v={current_version(Path(args.output) / table)})")
    spark.stop()
    if failed:
        raise SystemExit("query failed: " + "; ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
