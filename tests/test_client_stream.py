"""``Connector.stream``: batches as an iterator, acked by a later get once the caller
asks for the next one; with ``prefetch`` the next get is in flight meanwhile
(``canal_client.stream``). Real nodes, real MariaDB and etcd."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgpack
import pytest
from node_fixtures import DEST, NodeProc, fresh_database, node_cluster, wait_leader
from node_fixtures import batch_row_ids as ids_of

from canal_client import stream
from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol import Batch
from canal_protocol.errors import ClientError, InvalidArgument

__all__ = ["node_cluster"]  # the fixture, used by name

DB = "t_stream"
NodeCluster = Callable[..., list[NodeProc]]
FILTER = {"filter": {"regex": f"{DB}\\..*"}}
WAIT_S = 60.0


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


@dataclass
class Outage(httpx.BaseTransport):
    """Passes requests to the node until a get hands out a batch; from then on, while
    ``on``, gets (``only_gets``) or all requests fail: refused (``status`` None) or
    answered with ``status``. ``done``: "METHOD path" of the requests the node answered."""

    status: int | None = None
    only_gets: bool = True
    on: bool = False
    armed: bool = True
    inner: httpx.HTTPTransport = field(default_factory=httpx.HTTPTransport)
    done: list[str] = field(default_factory=list)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        get = request.method == "POST" and request.url.path.endswith("/batches")
        if self.on and (get or not self.only_gets):
            if self.status is None:
                raise httpx.ConnectError("planned outage", request=request)
            return httpx.Response(self.status, json={"error": "no_leader", "message": "outage"})
        response = self.inner.handle_request(request)
        response.read()
        if get and self.armed and response.status_code == 200:
            handed_out = msgpack.unpackb(response.content)["id"] != -1
            self.on, self.armed = handed_out, not handed_out
        self.done.append(f"{request.method} {request.url.path}")
        return response

    def close(self) -> None:
        self.inner.close()


class Handling(Exception):
    """The with block's own error."""


def _again(conn: Connector, rows: int) -> list[int]:
    """The rows a fresh get hands out, until ``rows`` came."""
    got: list[int] = []
    while rows not in got:
        batch = conn.get(10, 5.0)
        assert not batch.is_empty, f"only {got} came again"
        got += ids_of(batch)
    return got


@pytest.mark.parametrize("body", ["raise", "break"])
def test_closing_after_the_prefetched_get_gave_up_rolls_back_the_batch_shown(
    sandbox: Sandbox, node_cluster: NodeCluster, body: str
) -> None:
    """The prefetched get fails until ``set_deadline`` ends it (``RetryExhausted``):
    the end of the with block still rolls back the batch yielded last, raises nothing
    of its own, and the block's own error is the one that comes out."""
    leader = wait_leader(node_cluster(1, destination=FILTER))
    outage = Outage()  # after the first batch every get is refused
    forever = RetryPolicy(initial_s=0.05, max_delay_s=0.2)  # the deadline ends it
    with (
        fresh_database(sandbox.primary, DB),
        SimpleConnector(leader.url, DEST, "s5", transport=outage, retry=forever) as conn,
    ):
        conn.subscribe()
        _insert(sandbox, 1, 3)
        shown: list[int] = []

        def consume() -> None:
            with conn.stream(10, 30.0) as batches:
                for batch in batches:
                    shown.extend(ids_of(batch))
                    if shown and body == "raise":
                        raise Handling("the batch could not be handled")
                    if shown:
                        break

        conn.set_deadline(time.monotonic() + 1.0)
        if body == "raise":
            with pytest.raises(Handling):
                consume()
        else:
            consume()
        outage.on = False
        conn.set_deadline(None)
        assert _again(conn, 3) == [1, 2, 3], f"{shown} was shown and not rolled back"


def test_close_gives_up_on_a_prefetched_get_that_retries_through_an_outage(
    sandbox: Sandbox, node_cluster: NodeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the default policy (retry forever) the prefetched get retries as long as
    the leader answers 503: ``close()`` waits ``timeout_s + WAIT_MARGIN_S`` for it, then
    raises a ``ClientError`` naming what it waited for; once the leader is back the
    stream's rollback is sent after that get, and the rows come again."""
    monkeypatch.setattr(stream, "WAIT_MARGIN_S", 1.0)
    bound_s = 0.5 + 1.0
    leader = wait_leader(node_cluster(1, destination=FILTER))
    outage = Outage(status=503, only_gets=False)  # after the first batch: no leader
    with (
        fresh_database(sandbox.primary, DB),
        SimpleConnector(leader.url, DEST, "s6", transport=outage) as conn,
    ):
        conn.subscribe()
        _insert(sandbox, 1, 3)
        batches = conn.stream(10, 0.5)
        shown = next(b for b in batches if not b.is_empty)
        errors: list[BaseException] = []

        def close() -> None:
            try:
                batches.close()
            except BaseException as exc:
                errors.append(exc)

        closer = threading.Thread(target=close)
        start = time.monotonic()
        closer.start()
        closer.join(bound_s + 10.0)
        took, waiting = time.monotonic() - start, closer.is_alive()
        outage.on = False  # the leader is back: a close still waiting ends too
        closer.join(WAIT_S)
        assert not waiting, f"close() still waited after {took:.1f} s (bound {bound_s} s)"
        assert took >= bound_s - 0.1
        assert len(errors) == 1 and isinstance(errors[0], ClientError), errors
        assert "get in flight" in str(errors[0])
        assert f"batch {shown.id} and the prefetched one are rolled back" in str(errors[0])
        rollback = re.compile(r"POST .*/batches/\d+/rollback")
        wait_until(
            lambda: any(rollback.fullmatch(r) for r in outage.done),
            "the stream's rollback once the get in flight ended",
            WAIT_S,
        )
        assert _again(conn, 3) == [1, 2, 3]
