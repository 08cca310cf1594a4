"""Stream a canal-ha destination into parquet files partitioned by table, exactly once.

    python examples/spark_to_parquet.py --etcd http://127.0.0.1:2379 \\
        --destination example --client-id spark1 \\
        --output /tmp/out --checkpoint /tmp/ckpt --trigger available-now

``--trigger available-now`` reads what the destination has now, writes it and exits;
``--trigger 5s`` (a processing-time interval) runs until Ctrl-C. Restarting with the same
``--checkpoint`` continues where the last run stopped: no row is lost or written twice.
``--option key=value`` passes more source options (batchSize, filter, token, table, ...).
``--master spark://host:port`` (or ``spark-submit --master``) runs it on a cluster;
``--remote sc://host:port`` through a Spark Connect server.
At the end it prints what it wrote (rows per schema, table and event type).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from canal_client.spark import CanalDataSource, local_session


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--etcd", help="comma-separated etcd endpoints")
    where.add_argument("--server", help="comma-separated canal-ha node URLs")
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--output", required=True, help="parquet output directory")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    p.add_argument("--trigger", default="available-now", help="available-now or e.g. 5s")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--remote", help="a Spark Connect server (sc://host:port) instead of --master")
    return p.parse_args(argv)


def session(master: str, remote: str | None = None) -> SparkSession:
    if remote:  # Spark Connect: the server's Python workers need canal-ha installed
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.dataSource.register(CanalDataSource)
        return spark
    return local_session(master, "canal-to-parquet")


def start_query(spark: SparkSession, args: argparse.Namespace) -> Any:
    reader = spark.readStream.format("canal")
    reader = reader.option("etcd" if args.etcd else "server", args.etcd or args.server)
    reader = reader.option("destination", args.destination).option("clientId", args.client_id)
    for item in args.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.format("parquet")
        .partitionBy("schema", "table")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger.replace("s", " seconds"))
    return writer.start()


def follow(query: Any) -> None:
    """Print each micro-batch as it completes, until the query ends."""
    seen = -1
    while True:
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                print(f"batch {seen}: {progress['numInputRows']} rows", flush=True)
        if not query.isActive:
            break
        time.sleep(0.5)
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")


def summary(spark: SparkSession, output: str) -> None:
    if not any(Path(output).rglob("*.parquet")):  # Spark cannot infer an empty one's schema
        print(f"wrote 0 rows to {output}")
        return
    df = spark.read.parquet(output)
    counts = df.groupBy("schema", "table", "event_type").count().orderBy("schema", "table")
    print(f"wrote {df.count()} rows to {output}:")
    for row in counts.collect():
        name = f"{row['schema']}.{row['table']}" if row["table"] else f"{row['schema']} (schema)"
        print(f"  {name} {row['event_type']}: {row['count']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spark = session(args.master, args.remote)
    query = start_query(spark, args)
    try:
        follow(query)
    except KeyboardInterrupt:
        query.stop()
    if os.path.isdir(os.path.join(args.output, "_spark_metadata")):
        summary(spark, args.output)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
