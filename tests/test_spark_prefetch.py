"""The Spark source's prefetch against real nodes: the reader takes the next server
batches (without ack) while the executors run a micro-batch; a leader SIGKILL while
such prefetched, unplanned batches are outstanding loses and repeats nothing (the new
leader delivers them again from the cursor, the reader drops what it holds twice).
Spark's micro-batch loop is played by ``test_spark_reader.Engine`` (its ``run`` lets
the prefetch end before the next step)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

from node_fixtures import DEST, db_destination, node_cluster, wait_leader  # noqa: F401  (fixture)
from test_spark_db_switch import RealEngine, ids

from canal_client.spark import CanalOptions
from canal_client.spark.rows import Offset
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox

TX_ROWS = 20


def insert(sandbox: Sandbox, db: str, first: int, last: int) -> None:
    for lo in range(first, last + 1, TX_ROWS):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, min(lo + TX_ROWS, last + 1)))
        sandbox.primary.execute(f"INSERT INTO {db}.items VALUES {values}")


def test_a_leader_sigkill_with_prefetched_batches_outstanding_keeps_exactly_once(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_pf_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(2, destination=db_destination(sandbox.primary, db))
    leader = wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(20))"
    )
    insert(sandbox, db, 1, 2_000)
    opts = CanalOptions(
        destination=DEST, client_id="prefetch", etcd=tuple(sandbox.etcd_endpoints),
        etcd_prefix=nodes[0].prefix, batch_size=15, max_batches_per_trigger=3,
        poll_timeout_s=2.0, prefetch=True,
    )  # fmt: skip
    eng = RealEngine(None, opts)  # type: ignore[arg-type]
    for _ in range(3):
        assert eng.step()
    planned = Offset.from_dict(eng.offset(len(eng.offsets) - 1)).last
    ahead = [it for it in eng.reader.ledger.items if it.key > planned]
    assert ahead, "the prefetch took no batch beyond the planned micro-batch"
    leader.kill()
    writer = threading.Thread(target=insert, args=(sandbox, db, 2_001, 3_000))
    writer.start()
    wait_leader(nodes, exclude=[leader])
    writer.join()
    got: list[int] = []

    def drained() -> bool:
        eng.step()
        got[:] = ids(eng.rows())
        return len(got) >= 3_000

    wait_until(drained, "every row through the Spark source", 180)
    eng.drain()
    eng.reader.stop()
    got = ids(eng.rows())
    missing = sorted(set(range(1, 3_001)) - set(got))[:20]
    twice = sorted({i for i in got if got.count(i) > 1})[:20]
    assert sorted(got) == list(range(1, 3_001)), json.dumps({"missing": missing, "twice": twice})
    assert got == sorted(got), "out of binlog order"
