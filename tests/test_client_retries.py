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
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, NodeProc, wait_leader
from node_fixtures import batch_row_ids as ids_of
from node_fixtures import node_cluster as _node_cluster  # noqa: F401 - the fixture

from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_cluster.retry import RetryPolicy
from canal_ha.sandbox import Sandbox
from canal_protocol import Batch
from canal_protocol.errors import RetryExhausted, UnexpectedResponse

DB = "t_client_retries"
ROWS = 40
NodeCluster = Callable[..., list[NodeProc]]
RETRY = RetryPolicy(initial_s=0.05, max_delay_s=0.2, attempts=50)
THREE_ATTEMPTS = RetryPolicy(initial_s=0.05, max_delay_s=0.2, attempts=3)


@dataclass
class Loss:
    """The ``nth`` request ``method`` whose path ends with ``suffix`` is lost: after
    the node handled it (``handled``), or before it reached the node; ``garbled``: the
    node handled it and its answer is replaced by a body the client cannot decode."""

    method: str
    suffix: str
    nth: int
    handled: bool
    garbled: bool = False
    seen: int = 0


@dataclass
class LosingTransport(httpx.BaseTransport):
    losses: list[Loss]
    inner: httpx.HTTPTransport = field(default_factory=httpx.HTTPTransport)
    lost: list[str] = field(default_factory=list)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        matching = [
            loss
            for loss in self.losses
            if request.method == loss.method and request.url.path.endswith(loss.suffix)
        ]
        for loss in matching:  # each counts every matching request
            loss.seen += 1
        for loss in matching:
            if loss.seen == loss.nth:
                if loss.handled or loss.garbled:
                    self.inner.handle_request(request).read()
                self.lost.append(f"{request.method} {request.url.path} {loss.handled}")
                if loss.garbled:
                    return httpx.Response(
                        200, headers={"Content-Type": "application/msgpack"}, content=b"\xc1"
                    )
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
    how: str,
    sandbox: Sandbox,
    leader: NodeProc,
    transport: LosingTransport,
    retry: RetryPolicy = RETRY,
) -> Connector:
    if how == "etcd":  # the same leader in the same epoch, as etcd names it
        return ClusterConnector(DEST, "r1", etcd=sandbox.etcd_endpoints, prefix=leader.prefix,
                                transport=transport, retry=retry)  # fmt: skip
    return SimpleConnector(leader.url, DEST, "r1", transport=transport, retry=retry)


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


def _continues(batch: Batch, after: Batch) -> list[int]:
    """The rows of ``batch``, which must follow those of ``after`` (no gap, no repeat)."""
    rows = ids_of(batch)
    assert rows and rows[0] == ids_of(after)[-1] + 1, (ids_of(after), rows)
    return rows


def _end(batch: Batch) -> dict[str, Any]:
    assert batch.end is not None
    return batch.end.to_dict()


def _drain(conn: Connector, last: Batch, got: list[int]) -> None:
    """Every row left, each get acking the batch before it."""
    while len(got) < ROWS:
        batch = conn.get_without_ack(3, 5.0, ack=last.id)
        got += _continues(batch, last)
        last = batch
    conn.ack(last.id)


def _given_up(nth: int) -> list[Loss]:
    """The ``nth`` get takes a batch and its answer is lost, its two retries never
    arrive: a policy of three attempts gives up."""
    return [Loss("POST", "/batches", nth, handled=True)] + [
        Loss("POST", "/batches", n, handled=False) for n in (nth + 1, nth + 2)
    ]


@pytest.mark.parametrize("how", ["url", "etcd"])
def test_a_get_that_gave_up_is_answered_by_the_next_get(
    sandbox: Sandbox, leader: NodeProc, how: str
) -> None:
    """A get whose retries ran out after its first attempt took a batch: the caller's
    next get gets that batch, not the one after it (whose ack would commit the first
    one unseen), with the same ack or with another one, also when that one gives up."""
    transport = LosingTransport(_given_up(2) + _given_up(6) + _given_up(10) + _given_up(13))
    with connector(how, sandbox, leader, transport, THREE_ATTEMPTS) as conn:
        conn.subscribe()
        sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(ROWS)))
        first = conn.get_without_ack(3, 5.0)
        got = ids_of(first)
        with pytest.raises(RetryExhausted):
            conn.get_without_ack(3, 5.0, ack=first.id)
        held = conn.get_without_ack(3, 5.0, ack=first.id)  # the caller tries again
        assert conn.last_ack_taken is True and conn.cursor() == _end(first)
        got += _continues(held, first)
        with pytest.raises(RetryExhausted):
            conn.get_without_ack(3, 5.0)  # the caller holds `held` meanwhile
        batch = conn.get_without_ack(3, 5.0, ack=held.id)  # then acks it on its next get
        assert conn.last_ack_taken is True and conn.cursor() == _end(held)
        got += _continues(batch, held)
        with pytest.raises(RetryExhausted):
            conn.get_without_ack(3, 5.0)
        with pytest.raises(RetryExhausted):  # its ack went on its own, its get gave up
            conn.get_without_ack(3, 5.0, ack=batch.id)
        last = conn.get_without_ack(3, 5.0, ack=batch.id)  # the ack again: done already
        assert conn.last_ack_taken is True and conn.cursor() == _end(batch)
        got += _continues(last, batch)
        _drain(conn, last, got)
    assert len(transport.lost) == 12, transport.lost
    assert got == list(range(ROWS)), got  # each row once, in order


def test_an_answer_the_client_cannot_read_is_taken_by_the_next_get(
    sandbox: Sandbox, leader: NodeProc
) -> None:
    """A get that failed on its answer (not retried: UnexpectedResponse) after the node
    took a batch: the next get gets that batch."""
    transport = LosingTransport([Loss("POST", "/batches", 2, handled=True, garbled=True)])
    with connector("url", sandbox, leader, transport) as conn:
        conn.subscribe()
        sandbox.primary.execute(*(f"INSERT INTO {DB}.t VALUES ({i})" for i in range(ROWS)))
        first = conn.get_without_ack(3, 5.0)
        got = ids_of(first)
        with pytest.raises(UnexpectedResponse):
            conn.get_without_ack(3, 5.0, ack=first.id)
        _drain(conn, first, got)
    assert transport.lost and got == list(range(ROWS)), got
