"""The ``canal`` Spark Structured Streaming source (PySpark Python Data Source API).

::

    from canal_client.spark import CanalDataSource
    spark.dataSource.register(CanalDataSource)
    df = (spark.readStream.format("canal").option("etcd", "http://127.0.0.1:2379")
          .option("destination", "example").option("clientId", "1001").load())

Rows: see ``canal_client.spark.rows`` (one row per changed row; map mode: ``before``/
``after`` as ``map<string,string>``) and, with ``.option("table", "schema.table")``, the
typed mode of ``canal_client.spark.schema`` (structs of the table's columns, asked of
the leader when the query starts; a table map of another shape stops the query with
``SchemaChanged`` before its rows are planned). Options: ``canal_client.spark.options``.

The modules, one responsibility each:

- ``source``: ``CanalDataSource`` (the name ``canal``) and ``local_session``;
- ``reader``: ``CanalStreamReader``, the driver-side reader (how batches become
  micro-batches, exactly once; availableNow);
- ``options``: ``CanalOptions``, validated;
- ``connection``: the connector the reader needs, its factory and the table lookup;
- ``progress``: the leader's binlog end and reader position (``/v1/health``);
- ``ledger``: entries taken but not committed; ``prefetch``: the next batches in a thread;
- ``rows``, ``arrow``, ``schema``: Spark rows and offsets, their Arrow decoding (on the
  executors), the map and typed schemas;
- ``delta`` (with ``delta_plan``, ``delta_schema``): ``DeltaMirror``, a ``foreachBatch``
  sink that MERGEs typed streams into Delta Lake tables (deltalake), imported from
  ``canal_client.spark.delta`` only: the source's Python workers do not load deltalake.

Entries are ordered by ``canal_protocol.ordering.EntryKey``.
"""

from canal_client.spark.connection import ConnectorLike, fetch_table, make_connector
from canal_client.spark.ledger import Ledger
from canal_client.spark.options import CanalOptions, table_filter
from canal_client.spark.progress import (
    BinlogPoint,
    HttpProgress,
    LeaderProgress,
    ProgressProbe,
    gtid_covers,
    parse_progress,
)
from canal_client.spark.reader import CanalPartition, CanalStreamReader
from canal_client.spark.source import CanalDataSource, local_session, schema_ddl
from canal_protocol.ordering import batch_end, batch_source, point_key

__all__ = [
    "BinlogPoint",
    "CanalDataSource",
    "CanalOptions",
    "CanalPartition",
    "CanalStreamReader",
    "ConnectorLike",
    "HttpProgress",
    "LeaderProgress",
    "Ledger",
    "ProgressProbe",
    "batch_end",
    "batch_source",
    "fetch_table",
    "gtid_covers",
    "local_session",
    "make_connector",
    "parse_progress",
    "point_key",
    "schema_ddl",
    "table_filter",
]
