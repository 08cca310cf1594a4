"""Client timeouts and retries against a real node: while nothing failed, nothing is
delivered twice and nothing skipped.

A transport between the connector and the real node loses chosen exchanges the way a
request timeout does: the request never reached the node, or the node handled it and
its answer was lost. The connector retries with the same leader in the same epoch; it
must neither roll back what it holds (redelivery) nor take a batch after one whose
answer it never saw (a skip that its next ack would commit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from node_fixtures import DEST, NodeProc, wait_leader
from node_fixtures import batch_row_ids as ids_of
from node_fixtures import node_cluster as _node_cluster  # noqa: F401 - the fixture

from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_cluster.retry import RetryPolicy
from canal_ha.sandbox import Sandbox

DB = "t_client_retries"
ROWS = 40
NodeCluster = Callable[..., list[NodeProc]]
RETRY = RetryPolicy(initial_s=0.05, max_delay_s=0.2, attempts=50)


@dataclass
class Loss:
    """The ``nth`` request ``method`` whose path ends with ``suffix`` is lost: after
    the node handled it (``handled``), or before it reached the node."""

    method: str
    suffix: str
    nth: int
    handled: bool
    seen: int = 0


@dataclass
class LosingTransport(httpx.BaseTransport):
    losses: list[Loss]
    inner: httpx.HTTPTransport = field(default_factory=httpx.HTTPTransport)
    lost: list[str] = field(default_factory=list)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for loss in self.losses:
            if request.method == loss.method and request.url.path.endswith(loss.suffix):
                loss.seen += 1
                if loss.seen == loss.nth:
                    if loss.handled:
                        self.inner.handle_request(request).read()
                    self.lost.append(f"{request.method} {request.url.path} {loss.handled}")
                    raise httpx.ReadTimeout("planned loss", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def leader(sandbox: Sandbox, _node_cluster: NodeCluster) -> Iterator[NodeProc]:  # noqa: F811
    sandbox.primary.execute(
        f"DROP DATABASE IF EXISTS {DB}",
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY)",
    )
    nodes = _node_cluster(1, destination={"filter": {"regex": f"{DB}\\..*"}})
    yield wait_leader(nodes)
    sandbox.primary.execute(f"DROP DATABASE IF EXISTS {DB}")


def connector(
    how: str, sandbox: Sandbox, leader: NodeProc, transport: LosingTransport
) -> Connector:
    if how == "etcd":  # the same leader in the same epoch, as etcd names it
        return ClusterConnector(DEST, "r1", etcd=sandbox.etcd_endpoints, prefix=leader.prefix,
                                transport=transport, retry=RETRY)  # fmt: skip
    return SimpleConnector(leader.url, DEST, "r1", transport=transport, retry=RETRY)


@pytest.mark.parametrize("how", ["url", "etcd"])
def test_lost_requests_and_answers_neither_redeliver_nor_skip(
    sandbox: Sandbox, leader: NodeProc, how: str
) -> None:
    transport = LosingTransport(
        [
            Loss("POST", "/batches", 2, handled=True),  # a batch taken, its answer lost
            Loss("POST", "/ack", 2, handled=False),  # an ack that never arrived
            Loss("POST", "/ack", 4, handled=True),  # an ack done, its answer lost
            Loss("POST", "/batches", 9, handled=False),  # a get that never arrived
        ]
    )
    got: list[int] = []
    with connector(how, sandbox, leader, transport) as conn:
        conn.subscribe()
        sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(ROWS)))
        held = False
        while len(got) < ROWS:
            batch = conn.get_without_ack(3, 5.0)
            assert not batch.is_empty, f"only {len(got)} of {ROWS} rows arrived"
            got += ids_of(batch)
            if not held:
                held = True  # every other batch is held while the next one is fetched
                continue
            conn.ack(batch.id)  # cumulative: also the held one
            held = False
    assert len(transport.lost) == 4, transport.lost
    assert sorted(got) == list(range(ROWS)), got  # each row once: no rollback, no skip
    assert got == sorted(got)
