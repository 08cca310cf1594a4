"""A new leader whose master cannot be reached switches to the configured standby after
``detecting.retry_threshold`` failed starts (the probe that switches a running reader
does not run before reading begins): found by the nemesis, where a leader elected after
a database failover went back to the dead primary and retried it forever."""

from __future__ import annotations

from collections.abc import Callable

from node_fixtures import DEST, WAIT_S, NodeProc, wait_leader
from node_fixtures import node_cluster as _node_cluster  # noqa: F401 - the fixture

from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.ports import free_port

NodeCluster = Callable[..., list[NodeProc]]


def test_a_leader_starts_on_the_standby_when_the_master_is_unreachable(
    sandbox: Sandbox,
    _node_cluster: NodeCluster,  # noqa: F811
) -> None:
    live = sandbox.primary.dsn()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    nodes = _node_cluster(
        1,
        destination={
            "master": {"address": dead},
            "standby": {"address": f"{live['host']}:{live['port']}"},
            "detecting": {"enable": True, "interval_s": 0.5, "retry_threshold": 2},
        },
    )
    leader = wait_leader(nodes, timeout_s=WAIT_S)
    health = leader.health()
    assert health is not None
    reader = health["destinations"][DEST]["reader"]
    assert reader["state"] == "running", reader
    assert "switching to" in leader.log_tail(200), leader.log_tail(40)
