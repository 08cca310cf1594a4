"""``Connector.stream``: batches as an iterator, acked by a later get once the caller
asks for the next one; with ``prefetch`` the next get is in flight meanwhile
(``canal_client.stream``). Real nodes, real MariaDB and etcd."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from node_fixtures import DEST, NodeProc, fresh_database, node_cluster, wait_leader
from node_fixtures import batch_row_ids as ids_of

from canal_client.connector import ClusterConnector, SimpleConnector
from canal_cluster.retry import RetryPolicy
from canal_ha.sandbox import Sandbox
from canal_protocol import Batch
from canal_protocol.errors import InvalidArgument

__all__ = ["node_cluster"]  # the fixture, used by name

DB = "t_stream"
NodeCluster = Callable[..., list[NodeProc]]
FILTER = {"filter": {"regex": f"{DB}\\..*"}}


def _insert(sandbox: Sandbox, first: int, last: int) -> None:
    """One transaction per row: each row is its own entry."""
    sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(first, last + 1)))


def _end(batch: Batch) -> dict[str, Any]:
    assert batch.end is not None
    return batch.end.to_dict()


@pytest.mark.parametrize("prefetch", [True, False])
def test_stream_yields_in_order_and_acks_only_processed_batches(
    sandbox: Sandbox, node_cluster: NodeCluster, prefetch: bool
) -> None:
    leader = wait_leader(node_cluster(1, destination=FILTER))
    with (
        fresh_database(sandbox.primary, DB),
        SimpleConnector(leader.url, DEST, "s1") as conn,
        SimpleConnector(leader.url, DEST, "s1") as look,  # reads the cursor only
    ):
        conn.subscribe()
        _insert(sandbox, 1, 12)
        got: list[int] = []
        ends: list[Any] = [look.cursor()]  # the subscription's, then the processed batches'
        with conn.stream(2, 5.0, prefetch=prefetch) as batches:
            assert batches.prefetch is prefetch
            for batch in batches:
                if batch.is_empty:
                    continue
                # acked: processed batches only, never this one (prefetch: its get, in
                # flight now, was sent before this batch was processed)
                cursor = look.cursor()
                assert cursor in ends and cursor != _end(batch)
                got += ids_of(batch)
                ends.append(_end(batch))
                if len(got) >= 12:
                    batches.commit()
                    assert look.cursor() == _end(batch)
                    break
        assert got == list(range(1, 13))
        assert look.cursor() == ends[-1]
        assert ids_of(conn.get(10, 0.2)) == []  # the prefetched batch held no row left


def test_closing_a_stream_rolls_back_what_was_not_processed(
    sandbox: Sandbox, node_cluster: NodeCluster
) -> None:
    leader = wait_leader(node_cluster(1, destination=FILTER))
    with (
        fresh_database(sandbox.primary, DB),
        SimpleConnector(leader.url, DEST, "s2") as conn,
        SimpleConnector(leader.url, DEST, "s2") as look,
    ):
        conn.subscribe()
        _insert(sandbox, 1, 6)
        seen: list[Batch] = []
        with conn.stream(3, 5.0) as batches:
            for batch in batches:
                if not batch.is_empty:
                    seen.append(batch)
                if len(seen) == 2:
                    break  # the second batch was not processed: no commit
        # the first batch was processed (the second was asked for): acked by close; the
        # second and the prefetched third (rows were there: no wait) are rolled back
        assert look.cursor() == _end(seen[0])
        assert not conn.outstanding(seen[1].id) and not conn.outstanding(seen[1].id + 1)
        again: list[int] = []
        while 6 not in again:
            batch = conn.get(10, 5.0)
            assert not batch.is_empty, f"only {again} came again"
            again += ids_of(batch)
        first = ids_of(seen[0])
        assert first + again == list(range(1, 7))
        assert again[: len(ids_of(seen[1]))] == ids_of(seen[1])


def test_stream_arguments_are_checked(sandbox: Sandbox) -> None:
    conn = SimpleConnector("http://127.0.0.1:9", DEST, "s3")
    with pytest.raises(InvalidArgument) as exc:
        conn.stream(0, 1.0)
    assert exc.value.field == "size"
    with pytest.raises(InvalidArgument) as exc:
        conn.stream(10, -1.0)
    assert exc.value.field == "timeout_s"


def test_a_leader_change_while_a_prefetch_is_in_flight(
    sandbox: Sandbox, node_cluster: NodeCluster
) -> None:
    """The prefetched get waits on the leader when it is killed: the get follows the new
    leader (which rolled back the old session's batches), the ack of the batch fetched
    from the old leader is dropped, and every row arrives, in order after the change."""
    nodes = node_cluster(2, destination=FILTER)
    old = wait_leader(nodes)
    conn = ClusterConnector(
        DEST, "s4", etcd=sandbox.etcd_endpoints, prefix=nodes[0].prefix,
        retry=RetryPolicy(initial_s=0.05, max_delay_s=0.5, deadline_s=120),
    )  # fmt: skip
    with fresh_database(sandbox.primary, DB), conn:
        conn.subscribe()
        _insert(sandbox, 1, 4)
        runs: list[list[int]] = [[]]  # ids by epoch
        epochs = [0]
        with conn.stream(100, 5.0) as batches:
            for batch in batches:
                if batch.is_empty:
                    continue
                if conn.epoch != epochs[-1]:
                    epochs.append(conn.epoch)
                    runs.append([])
                runs[-1] += ids_of(batch)
                if len(epochs) == 2 and 4 in runs[-1] and len(runs[-1]) == 4:
                    old.kill()  # the next get is in flight, waiting on it
                    _insert(sandbox, 5, 8)
                if 8 in runs[-1]:
                    batches.commit()
                    break
    assert len(epochs) == 3 and epochs[1] < epochs[2], epochs
    assert runs[1] == [1, 2, 3, 4]
    # the new leader resumes at the cursor: what the old one had acked, no further
    after = runs[2]
    assert after == sorted(after) and after[-4:] == [5, 6, 7, 8]
    assert set(after) <= set(range(1, 9))
