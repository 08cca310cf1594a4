"""MySQL over the network through a whole node: a destination whose master is the replay
server (``mysql_replay``, a MySQL 8.4 test double serving MySQL-written binlog files)
delivers the rows over REST with the entries and positions the local reader gives for
the same bytes (tests/test_mysql_local.py checks those values)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from mysql_fixtures import FIXTURES, Run, rest_entries, rows, spans
from mysql_replay import MySQLReplayServer
from node_fixtures import NodeProc, node_cluster, wait_leader  # noqa: F401

Cluster = Callable[..., list[NodeProc]]
ENUM = "rmc__mysql-enum-string-set.000001"
BINLOG = "mysql-bin.000001"
END = 3331


def test_mysql_destination_serves_every_row_over_rest(
    node_cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    direct_dir, served = tmp_path / "direct", tmp_path / "served"
    direct_dir.mkdir()
    served.mkdir()
    expected = Run(direct_dir, [ENUM]).until((ENUM, END))
    shutil.copy(FIXTURES / ENUM, served / BINLOG)
    with MySQLReplayServer(served) as mysql:
        (node,) = node_cluster(
            1,
            destination={
                "master": {"address": mysql.address, "journal_name": BINLOG, "position": 4},
                "db": {"username": mysql.user, "password": mysql.password},
            },
        )
        wait_leader([node])
        got = rest_entries(node.url, node.destination, "mysql-network", END)
        health = node.health()
        assert not mysql.unknown, mysql.unknown  # every statement sent is MySQL's
    assert list(rows(got)) == list(rows(expected))
    assert spans(got, logfile=False) == spans(expected, logfile=False)
    assert {e.header.logfile for e in got} == {BINLOG}
    assert health is not None
    dest = health["destinations"][node.destination]
    assert dest["reader"]["state"] == "running"
    end = dest["binlog_end"]  # SHOW BINARY LOG STATUS, with its Executed_Gtid_Set
    assert (end["journal"], end["offset"]) == (BINLOG, END)
    assert end["gtid"] == "93e95066-a2f4-11ec-9b69-9657f0ae95e2:1-5"
    assert dest["database"]["reachable"] is True
