"""Failover where the clock allows it: a consumer with a long poll in flight to a leader
that is SIGSTOPped stops waiting on it as soon as etcd's watch names the new leader.

Without that, the poll waits for its HTTP read timeout (``request_timeout_s`` plus the
poll's own wait): here 60 + 60 s, far longer than the election takes. The rows written
once the new leader reads must arrive well before the stalled request could have ended;
after SIGCONT the zombie's late answer is dropped and every row came exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from node_fixtures import DEST, WAIT_S, NodeProc, wait_leader
from node_fixtures import batch_row_ids as ids_of
from node_fixtures import node_cluster as _node_cluster  # noqa: F401 - the fixture

from canal_client.connector import ClusterConnector
from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox

DB = "t_client_stop"
NodeCluster = Callable[..., list[NodeProc]]
POLL_S = 60.0  # each get waits this long for a row
REQUEST_TIMEOUT_S = 60.0  # added to the poll's wait: the old client stalled 120 s
BOUND_S = 90.0  # from SIGSTOP to the rows written after the failover, with room to spare


def test_a_long_poll_to_a_stopped_leader_ends_when_etcd_names_the_next(
    sandbox: Sandbox,
    _node_cluster: NodeCluster,  # noqa: F811
) -> None:
    sandbox.primary.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY)",
    )
    nodes = _node_cluster(3, destination={"filter": {"regex": f"{DB}\\..*"}})
    zombie = wait_leader(nodes)
    conn = ClusterConnector(
        DEST, "stop1", etcd=sandbox.etcd_endpoints, prefix=nodes[0].prefix,
        retry=RetryPolicy(initial_s=0.05, max_delay_s=0.5, deadline_s=WAIT_S * 3),
        request_timeout_s=REQUEST_TIMEOUT_S,
    )  # fmt: skip
    got: list[tuple[float, int, list[int]]] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def consume() -> None:
        try:
            while not stop.is_set():
                batch = conn.get_without_ack(100, POLL_S)
                if not batch.is_empty:
                    got.append((time.monotonic(), conn.epoch, ids_of(batch)))
                    conn.ack(batch.id)
        except Exception as exc:  # surfaced below (disconnect ends the last poll)
            if not stop.is_set():
                errors.append(exc)

    conn.connect()
    conn.subscribe()
    consumer = threading.Thread(target=consume, name="consumer")
    consumer.start()
    try:
        sandbox.primary.execute(f"INSERT INTO {DB}.t VALUES (1)")
        wait_until(lambda: bool(got) or bool(errors), "the first row", WAIT_S)
        old_epoch = conn.epoch
        time.sleep(0.5)  # the consumer's next long poll is now waiting on the leader
        stopped_at = time.monotonic()
        zombie.pause()
        new = wait_leader(nodes, exclude=[zombie], timeout_s=WAIT_S)
        sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(2, 6)))
        wait_until(
            lambda: sum(len(ids) for _, _, ids in got) >= 5 or bool(errors),
            "the rows written after the failover",
            BOUND_S,
        )
        arrived = got[-1][0] - stopped_at
        zombie.resume()
        sandbox.primary.execute(f"INSERT INTO {DB}.t VALUES (6)")
        wait_until(lambda: sum(len(ids) for _, _, ids in got) >= 6 or bool(errors), "row 6", WAIT_S)
    finally:
        zombie.resume()
        stop.set()
        conn.disconnect()
        consumer.join(WAIT_S)
        sandbox.primary.execute(f"DROP DATABASE IF EXISTS {DB}")
    assert not errors, errors
    assert not consumer.is_alive()
    assert arrived < BOUND_S < POLL_S + REQUEST_TIMEOUT_S
    assert [i for _, _, ids in got for i in ids] == [1, 2, 3, 4, 5, 6]  # once each, in order
    new_epoch = new.health()["destinations"][DEST]["epoch"]  # type: ignore[index]
    assert got[0][1] == old_epoch < new_epoch
    assert all(epoch == new_epoch for _, epoch, _ in got[1:])
    print(f"rows after the failover arrived {arrived:.2f}s after SIGSTOP")
