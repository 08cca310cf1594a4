"""The example job on a Spark standalone cluster: a master and two workers started from
the pyspark package's ``bin/spark-class`` on loopback ports (``SparkStandalone``), the
job submitted with ``spark-submit``, executors in their own JVMs and Python workers.
Two available-now runs from one checkpoint write every change exactly once."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from node_fixtures import DEST, node_cluster, wait_leader  # noqa: F401  (fixture)
from test_spark_e2e import EXAMPLE, sink_rows

from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.spark_cluster import SparkStandalone


@pytest.mark.timeout(900)
def test_example_on_a_standalone_cluster_writes_each_change_once(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_sa_{uuid.uuid4().hex[:8]}"
    journal, position = sandbox.primary.master_status()
    master = {"address": f"127.0.0.1:{sandbox.primary.port}", "journal_name": journal,
              "position": position}  # fmt: skip
    nodes = node_cluster(1, destination={"filter": {"regex": f"{db}\\..*"}, "master": master})
    wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    for lo in range(1, 3001, 100):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, lo + 100))
        sandbox.primary.execute(f"INSERT INTO {db}.items VALUES {values}")
    cluster = SparkStandalone(tmp_path / "spark", workers=2).start()
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "submit.log"
    app = [
        str(EXAMPLE), "--master", cluster.url, "--etcd", ",".join(sandbox.etcd_endpoints),
        "--destination", DEST, "--client-id", "standalone", "--output", str(out),
        "--checkpoint", str(ckpt), "--trigger", "available-now",
        "--option", f"etcdPrefix={nodes[0].prefix}", "--option", "batchSize=50",
        "--option", "rowsPerPartition=500",
    ]  # fmt: skip
    try:
        assert cluster.submit(app, log, timeout_s=400) == 0, log.read_text()[-3000:]
        sandbox.primary.execute(
            f"UPDATE {db}.items SET val = 'u' WHERE id <= 500",
            f"DELETE FROM {db}.items WHERE id > 2500",
        )
        assert cluster.submit(app, log, timeout_s=400) == 0, log.read_text()[-3000:]
        apps = cluster.state().get("completedapps") or []
    finally:
        stopped = cluster.stop()
    assert "spark-master" in stopped and cluster.executor_pids() == []
    rows = [r for r in sink_rows(out) if not r["is_ddl"]]
    positions = Counter((r["logfile"], r["offset"], r["row_index"]) for r in rows)
    assert positions.most_common(1)[0][1] == 1, "a change was written twice"
    kinds = Counter(r["event_type"] for r in rows)
    assert kinds == {"INSERT": 3000, "UPDATE": 500, "DELETE": 500}
    assert len(apps) == 2 and all(a["state"] == "FINISHED" for a in apps)
    for i in (1, 2):  # each worker ran executors (their own JVMs) for both runs
        executors = list((tmp_path / "spark" / f"worker{i}").glob("app-*/*/stderr"))
        assert len(executors) == 2, executors
