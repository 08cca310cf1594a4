"""The example job through Spark Connect: a ``start-connect-server.sh`` server on a free
loopback port (``SparkConnectServer``, its Python workers run this interpreter), the job
a thin client (``--remote sc://…``, the ``connect`` extra). Two available-now runs from
one checkpoint write every change exactly once."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from node_fixtures import DEST, node_cluster, wait_leader  # noqa: F401  (fixture)
from test_spark_e2e import Driver, sink_rows

from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.spark_cluster import SparkConnectServer


@pytest.mark.timeout(900)
def test_example_through_spark_connect_writes_each_change_once(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_sc_{uuid.uuid4().hex[:8]}"
    journal, position = sandbox.primary.master_status()
    master = {"address": f"127.0.0.1:{sandbox.primary.port}", "journal_name": journal,
              "position": position}  # fmt: skip
    nodes = node_cluster(1, destination={"filter": {"regex": f"{db}\\..*"}, "master": master})
    wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    for lo in range(1, 1001, 100):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, lo + 100))
        sandbox.primary.execute(f"INSERT INTO {db}.items VALUES {values}")
    server = SparkConnectServer(tmp_path / "connect").start()
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "client.log"
    args = [
        "--remote", server.url, "--etcd", ",".join(sandbox.etcd_endpoints),
        "--destination", DEST, "--client-id", "connect", "--output", str(out),
        "--checkpoint", str(ckpt), "--trigger", "available-now",
        "--option", f"etcdPrefix={nodes[0].prefix}", "--option", "batchSize=50",
    ]  # fmt: skip
    try:
        assert Driver(args, log).wait(300) == 0, log.read_text()[-3000:]
        sandbox.primary.execute(f"DELETE FROM {db}.items WHERE id > 900")
        assert Driver(args, log).wait(300) == 0, log.read_text()[-3000:]
    finally:
        assert server.stop()
    rows = [r for r in sink_rows(out) if not r["is_ddl"]]
    positions = Counter((r["logfile"], r["offset"], r["row_index"]) for r in rows)
    assert positions.most_common(1)[0][1] == 1, "a change was written twice"
    assert Counter(r["event_type"] for r in rows) == {"INSERT": 1000, "DELETE": 100}
    assert "wrote 1102 rows" in log.read_text()
