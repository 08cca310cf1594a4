"""The example job through Spark Connect: a ``start-connect-server.sh`` server on a free
loopback port (``SparkConnectServer``, its Python workers run this interpreter), the job
a thin client (``--remote sc://…``, the ``connect`` extra). Two available-now runs from
one checkpoint write every change exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from node_fixtures import DEST, node_cluster  # noqa: F401  (fixture)
from spark_fixtures import ItemsSource, items_source  # noqa: F401  (fixture)
from test_spark_e2e import Driver, sink_rows

from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.spark_cluster import SparkConnectServer


@pytest.mark.timeout(900)
def test_example_through_spark_connect_writes_each_change_once(
    items_source: Callable[[str, int], ItemsSource],  # noqa: F811
    sandbox: Sandbox,
    tmp_path: Path,
) -> None:
    src = items_source("t_sc", 1000)
    server = SparkConnectServer(tmp_path / "connect").start()
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "client.log"
    args = [
        "--remote", server.url, "--etcd", src.etcd,
        "--destination", DEST, "--client-id", "connect", "--output", str(out),
        "--checkpoint", str(ckpt), "--trigger", "available-now",
        "--option", f"etcdPrefix={src.prefix}", "--option", "batchSize=50",
    ]  # fmt: skip
    try:
        assert Driver(args, log).wait(300) == 0, log.read_text()[-3000:]
        sandbox.primary.execute(f"DELETE FROM {src.db}.items WHERE id > 900")
        assert Driver(args, log).wait(300) == 0, log.read_text()[-3000:]
    finally:
        assert server.stop()
    rows = [r for r in sink_rows(out) if not r["is_ddl"]]
    positions = Counter((r["logfile"], r["offset"], r["row_index"]) for r in rows)
    assert positions.most_common(1)[0][1] == 1, "a change was written twice"
    assert Counter(r["event_type"] for r in rows) == {"INSERT": 1000, "DELETE": 100}
    assert "wrote 1102 rows" in log.read_text()
