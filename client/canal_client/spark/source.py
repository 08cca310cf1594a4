"""``CanalDataSource`` (``spark.readStream.format("canal")``) and a local SparkSession
with it registered."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from canal_client.spark.connection import fetch_table
from canal_client.spark.options import CanalOptions
from canal_client.spark.reader import CanalStreamReader
from canal_client.spark.schema import TypedTable, generic_ddl, generic_struct, typed_struct

__all__ = ["CanalDataSource", "local_session", "schema_ddl"]

log = logging.getLogger("canal_client.spark")


def schema_ddl() -> str:
    """The map mode's schema as a Spark DDL string."""
    return generic_ddl()


def local_session(
    master: str = "local[2]", app: str = "canal", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A SparkSession for jobs on this machine or a loopback cluster, with the source
    registered: no UI, UTC, driver bound to 127.0.0.1, two shuffle partitions, Python
    workers of this interpreter (unless ``PYSPARK_PYTHON`` says otherwise) that may take
    120 s to start on a busy machine (Spark's default wait is 15 s); ``conf``: more
    settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.python.authenticate.socketTimeout": "120s",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(CanalDataSource)
    return spark


class CanalDataSource(DataSource):
    """``spark.readStream.format("canal")``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = CanalOptions.parse(options)
        self.typed: TypedTable | None = None

    @classmethod
    def name(cls) -> str:
        return "canal"

    def schema(self) -> StructType:
        """Map mode: ``generic_struct()``; typed mode: the table's columns, asked of the
        destination's leader now (kept: this object is pickled after this call)."""
        if not self.parsed.table:
            return generic_struct()
        self.typed = fetch_table(self.parsed)
        log.info(
            "%s: typed stream of %s, schema version %s: %s",
            self.parsed.destination, self.typed.full_name, self.typed.version,
            ", ".join(f"{n} {k}" for n, k in self.typed.shape),
        )  # fmt: skip
        return typed_struct(self.typed)

    def streamReader(self, schema: StructType) -> CanalStreamReader:
        if self.parsed.table and self.typed is None:  # a schema given by the user
            self.typed = fetch_table(self.parsed)
        return CanalStreamReader(self.parsed, typed=self.typed, schema=schema)
