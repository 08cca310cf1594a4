"""``reader_position`` and ``binlog_end`` of ``GET /v1/health``.

The probe alone (cache, an unreachable database), then two real nodes: the leader
reports its source's binlog end and a reader position that reaches it, the standby
neither; the answer fits the OpenAPI model.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from node_fixtures import DEST, node_cluster, wait_leader  # noqa: F401  (fixture)

from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.ports import free_port
from canal_server.api.models import HealthOut
from canal_server.instance import BinlogEndProbe, master_status

DSN = {"host": "127.0.0.1", "port": 3306, "user": "canal", "password": ""}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_probe_asks_at_most_once_per_ttl_and_per_source() -> None:
    asked: list[str] = []
    answers: list[dict[str, Any] | None] = [{"journal": "b.000001", "offset": 4}, None]

    def query(dsn: Mapping[str, Any]) -> dict[str, Any] | None:
        asked.append(f"{dsn['host']}:{dsn['port']}")
        return answers[min(len(asked) - 1, 1)]

    clock = Clock()
    probe = BinlogEndProbe(query, ttl_s=1.0, clock=clock)
    assert probe.get(DSN) == {"journal": "b.000001", "offset": 4}
    clock.now += 0.9
    assert probe.get(DSN) == {"journal": "b.000001", "offset": 4}  # cached
    assert len(asked) == 1
    clock.now += 0.2
    assert probe.get(DSN) is None  # asked again: the database does not answer
    assert probe.get(DSN) is None and len(asked) == 2  # a failure is cached too
    assert probe.get({**DSN, "port": 3307}) is None and len(asked) == 3  # another source


def test_master_status_of_an_unreachable_database_is_none() -> None:
    assert master_status({**DSN, "port": free_port()}) is None


def test_leader_reports_binlog_end_and_a_reader_position_reaching_it(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
) -> None:
    nodes = node_cluster(2)
    leader = wait_leader(nodes)
    standby = next(n for n in nodes if n is not leader)
    db = f"t_health_{uuid.uuid4().hex[:8]}"
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY)",
        f"INSERT INTO {db}.t VALUES (1), (2)",
    )  # fmt: skip
    journal, offset = sandbox.primary.master_status()
    gtid = str(sandbox.primary.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
    address = f"127.0.0.1:{sandbox.primary.port}"
    try:
        found: list[dict[str, Any]] = []

        def caught_up() -> bool:
            health = leader.health()
            d = health["destinations"][DEST] if health else {}
            pos, end = d.get("reader_position") or {}, d.get("binlog_end") or {}
            found[:] = [health] if health else []
            want = (journal, offset)
            return (pos.get("journal"), pos.get("offset")) == want and (
                end.get("journal"),
                end.get("offset"),
            ) == want  # binlog_end may be a second old (cached)

        wait_until(caught_up, "the reader at the binlog end", 30)
        health = found[0]
        HealthOut.model_validate(health)
        d = health["destinations"][DEST]
        assert d["binlog_end"] == {
            "journal": journal, "offset": offset, "gtid": gtid, "source_address": address,
        }  # fmt: skip
        assert d["reader_position"]["gtid"] == gtid
        assert d["reader_position"]["source_address"] == address
        assert d["reader_position"]["timestamp_ms"] > 0
        assert d["reader"]["state"] == "running"  # the old fields stay

        other = standby.health()
        assert other is not None
        HealthOut.model_validate(other)
        s = other["destinations"][DEST]
        assert s["role"] == "standby" and s["binlog_end"] is None
        assert s["reader_position"] is None
    finally:
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {db}")
