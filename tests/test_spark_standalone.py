"""The example job on a Spark standalone cluster: a master and two workers started from
the pyspark package's ``bin/spark-class`` on loopback ports (``SparkStandalone``), the
job submitted with ``spark-submit``, executors in their own JVMs and Python workers.
Two available-now runs from one checkpoint write every change exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from node_fixtures import DEST, node_cluster  # noqa: F401  (fixture)
from spark_fixtures import ItemsSource, items_source  # noqa: F401  (fixture)
from test_spark_e2e import EXAMPLE, sink_rows

from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.spark_cluster import SparkStandalone


@pytest.mark.timeout(900)
def test_example_on_a_standalone_cluster_writes_each_change_once(
    items_source: Callable[[str, int], ItemsSource],  # noqa: F811
    sandbox: Sandbox,
    tmp_path: Path,
) -> None:
    src = items_source("t_sa", 3000)
    cluster = SparkStandalone(tmp_path / "spark", workers=2).start()
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "submit.log"
    app = [
        str(EXAMPLE), "--master", cluster.url, "--etcd", src.etcd,
        "--destination", DEST, "--client-id", "standalone", "--output", str(out),
        "--checkpoint", str(ckpt), "--trigger", "available-now",
        "--option", f"etcdPrefix={src.prefix}", "--option", "batchSize=50",
        "--option", "rowsPerPartition=500",
    ]  # fmt: skip
    try:
        assert cluster.submit(app, log, timeout_s=400) == 0, log.read_text()[-3000:]
        sandbox.primary.execute(
            f"UPDATE {src.db}.items SET val = 'u' WHERE id <= 500",
            f"DELETE FROM {src.db}.items WHERE id > 2500",
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
