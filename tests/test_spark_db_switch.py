"""A database switch under the Spark source: the primary is SIGKILLed mid-stream, its
GTID replica promoted, the node switches to it (``gtid_mode``: the replica's binlog has
its own file names and offsets). The source's replay (a driver restarted from its
checkpoint, a micro-batch planned before the switch and run after it) and its
duplicate detection key entries by GTID across the two databases: every row arrives
exactly once. Spark's micro-batch loop is played by ``test_spark_reader.Engine``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import SandboxFactory
from node_fixtures import DEST, start_nodes, wait_leader
from test_spark_reader import Engine

from canal_client.spark import CanalOptions, CanalStreamReader
from canal_client.spark.rows import Row
from canal_cluster.retry import wait_until

TX_ROWS = 10


class RealEngine(Engine):
    """The engine over real connectors (a new reader, as a restarted driver has)."""

    def restart(self, rollback_on_connect: bool = True) -> CanalStreamReader:
        old: CanalStreamReader | None = getattr(self, "reader", None)
        if old is not None:  # a crashed driver: its process's sockets close with it
            close = getattr(old._probe, "close", None)
            if callable(close):
                close()
        self.reader = CanalStreamReader(self.opts)
        return self.reader


def insert(box_db: Any, db: str, first: int, last: int) -> None:
    for lo in range(first, last + 1, TX_ROWS):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, min(lo + TX_ROWS, last + 1)))
        box_db.execute(f"INSERT INTO {db}.items VALUES {values}")


def ids(rows: list[Row]) -> list[int]:
    """The ids of the inserted rows, in stream order (map mode: ``after`` is a dict)."""
    return [int(r[12]["id"]) for r in rows if r[3] is False and r[2] == "INSERT"]


@pytest.mark.timeout(600)
def test_replay_and_duplicates_across_a_database_switch(
    make_sandbox: SandboxFactory, tmp_path: Path
) -> None:
    box = make_sandbox(standby=True)
    db = f"t_sw_{uuid.uuid4().hex[:8]}"
    box.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(20))"
    )
    box.replica.wait_caught_up(box.primary)
    # other binlog names: the primary's files are numbered past the replica's (FLUSH
    # BINARY LOGS is not replicated), so positions of the two never compare
    box.primary.execute(*["FLUSH BINARY LOGS"] * 3)
    journal, position = box.primary.master_status()
    destination = {
        "filter": {"regex": f"{db}\\..*"}, "gtid_mode": True,
        "master": {"address": f"127.0.0.1:{box.primary.port}", "journal_name": journal,
                   "position": position},
        "standby": {"address": f"127.0.0.1:{box.replica.port}"},
        "detecting": {"enable": True, "interval_s": 0.5, "retry_threshold": 2, "timeout_s": 1.0},
    }  # fmt: skip
    nodes = start_nodes(box, 1, tmp_path, destination=destination)
    for node in nodes:
        box.add_process(node.process)
    leader = wait_leader(nodes)
    insert(box.primary, db, 1, 300)
    box.replica.wait_caught_up(box.primary)
    opts = CanalOptions(
        destination=DEST, client_id="switch", etcd=tuple(box.etcd_endpoints),
        etcd_prefix=nodes[0].prefix, batch_size=7, max_batches_per_trigger=2,
        poll_timeout_s=2.0,
    )  # fmt: skip
    eng = RealEngine(None, opts)  # type: ignore[arg-type]
    for _ in range(4):
        assert eng.step()
    assert eng.step(crash_before_run=True)  # planned on the primary, run after the switch
    box.primary.kill()
    box.replica.promote()

    def switched() -> bool:
        h = leader.health()
        d = h["destinations"][DEST] if h else None
        address = ((d or {}).get("database") or {}).get("address", "")
        return str(address).endswith(f":{box.replica.port}")

    wait_until(switched, "the node reading the promoted replica", 60)
    insert(box.replica, db, 301, 500)
    for _ in range(3):
        eng.step()
    eng.restart()  # a driver restarted from its checkpoint, after the switch
    got: list[int] = []

    def drained() -> bool:
        eng.step()
        got[:] = ids(eng.rows())
        return len(got) >= 500

    wait_until(drained, "every row through the Spark source", 180)
    eng.drain()
    eng.reader.stop()
    got = ids(eng.rows())
    missing = sorted(set(range(1, 501)) - set(got))[:20]
    twice = sorted({i for i in got if got.count(i) > 1})[:20]
    assert sorted(got) == list(range(1, 501)), json.dumps({"missing": missing, "twice": twice})
    assert got == sorted(got), "out of binlog order"
