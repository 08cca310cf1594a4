"""``POST C/cursor``: commit through an entry the client committed elsewhere (a Spark
checkpoint), after its batches were rolled back; and the Spark reader that uses it when
a new run starts from its checkpoint (issue 13 item 1), against real nodes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from node_fixtures import DEST, NodeProc, node_cluster, wait_leader  # noqa: F401  (fixture)
from node_fixtures import client_path as base
from pyspark.sql.streaming.datasource import ReadAllAvailable
from serving_fixtures import IDENTITY, EntryFactory, position_of

from canal_client.connector import ClusterConnector
from canal_client.spark import CanalOptions, CanalStreamReader
from canal_client.spark.rows import Offset
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.errors import NotSubscribed, UnknownBatch
from canal_server.embedded import EmbeddedServer
from canal_server.meta import MemoryMetaManager
from canal_server.store import EventStore

WAIT_S = 60.0


def _server() -> tuple[EmbeddedServer, EventStore, EntryFactory]:
    store = EventStore("d", buffer_size=1024)
    return EmbeddedServer("d", store, MemoryMetaManager("d")), store, EntryFactory()


def test_move_drops_batches_moves_forward_only_and_frees_the_store() -> None:
    server, store, fac = _server()
    server.subscribe("c")
    entries = fac.rows(10)
    store.put(entries, IDENTITY)
    server.get_without_ack("c", 4)
    server.get_without_ack("c", 4)
    h = entries[5].header
    assert server.move_cursor("c", h.logfile, h.offset) == position_of(entries[5])
    assert server.meta.batches("c") == []  # both batches dropped
    assert store.stats()[0] == 4  # entries 0..5 freed
    batch = server.get_without_ack("c", 10)
    assert list(batch.entries) == entries[6:]  # the next get starts after the cursor
    # backwards, or before everything stored: no move (the batch is dropped all the same)
    assert server.move_cursor("c", h.logfile, entries[2].header.offset) == position_of(entries[5])
    assert server.move_cursor("c", h.logfile, 0) == position_of(entries[5])
    assert server.meta.batches("c") == []
    # between two entries: through the last one starting before it
    between = entries[7].header.offset + 1
    assert server.move_cursor("c", h.logfile, between) == position_of(entries[7])
    # past what is stored: as far as the store reaches
    assert server.move_cursor("c", h.logfile, 10**9) == position_of(entries[-1])
    assert server.move_cursor("c", "mariadb-bin.000002", 4) == position_of(entries[-1])
    assert store.stats()[0] == 0


def test_move_of_a_client_not_subscribed_is_refused() -> None:
    server, _, _ = _server()
    with pytest.raises(NotSubscribed):
        server.move_cursor("nobody", "mariadb-bin.000001", 4)


# -- real nodes ----------------------------------------------------------------------------


def insert(sandbox: Sandbox, db: str, first: int, count: int) -> tuple[str, int]:
    """``count`` rows in transactions of 5; the binlog end after them."""
    for lo in range(first, first + count, 5):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, lo + 5))
        sandbox.primary.execute(f"INSERT INTO {db}.items (id, val) VALUES {values}")
    return sandbox.primary.master_status()


def cursor_of(node: NodeProc, client: str) -> tuple[str, int] | None:
    with node.client() as http:
        cursor = http.get(f"{base(client)}/cursor").json()["cursor"]
    return None if cursor is None else (cursor["position"]["journal"], cursor["position"]["offset"])


def reader_at(node: NodeProc, end: tuple[str, int]) -> bool:
    h = node.health()
    pos = h["destinations"][DEST]["reader_position"] if h else None
    return pos is not None and (pos["journal"], pos["offset"]) >= end


def test_rest_route_validates_and_answers_the_cursor(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
) -> None:
    db = f"t_mv_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1, destination={"filter": {"regex": f"{db}\\..*"}})
    leader = wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    with leader.client() as http:
        r = http.post(f"{base('m1')}/cursor", json={"logfile": "x.000001", "offset": 4})
        assert r.status_code == 409 and r.json()["error"] == "not_subscribed"
        assert http.put(f"{base('m1')}/subscription", json={}).status_code == 200
        for body, field in (
            ({}, "logfile"),
            ({"logfile": "", "offset": 4}, "logfile"),
            ({"logfile": "mariadb-bin.000001"}, "offset"),
            ({"logfile": "mariadb-bin.000001", "offset": -1}, "offset"),
            ({"logfile": "mariadb-bin.000001", "offset": "4"}, "offset"),
        ):
            r = http.post(f"{base('m1')}/cursor", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
        end = insert(sandbox, db, 1, 10)
        wait_until(lambda: reader_at(leader, end), "the reader at the binlog end", WAIT_S)
        batch = http.post(f"{base('m1')}/batches", json={"size": 100, "timeout_ms": 5000}).json()
        last = batch["entries"][-1]["header"]
        assert (last["logfile"], last["end_offset"]) == end
        through = {"logfile": last["logfile"], "offset": last["offset"]}
        r = http.post(f"{base('m1')}/cursor", json=through)
        assert r.status_code == 200, r.text
        pos = r.json()["cursor"]["position"]
        assert (pos["journal"], pos["offset"]) == end == cursor_of(leader, "m1")
        r = http.get(f"{base('m1')}/batches/{batch['id']}")
        assert r.status_code == 404  # the batch was dropped by the move
        schema = http.get("/openapi.json").json()
        post = schema["paths"]["/v1/destinations/{destination}/clients/{client_id}/cursor"]["post"]
        assert post["requestBody"]["required"] and "CursorRequest" in str(post["requestBody"])


def spark_reader(sandbox: Sandbox, nodes: list[NodeProc], client: str) -> CanalStreamReader:
    opts = CanalOptions(
        destination=DEST,
        client_id=client,
        etcd=tuple(sandbox.etcd_endpoints),
        etcd_prefix=nodes[0].prefix,
        poll_timeout_s=5.0,
    )
    return CanalStreamReader(opts)


def run_batch(reader: CanalStreamReader, start: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Plan and run one micro-batch as Spark does: its end offset and row count."""
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    return end, sum(b.num_rows for p in parts for b in reader.read(p))


@pytest.mark.parametrize("failover", [False, True], ids=["same-leader", "after-failover"])
def test_new_run_moves_the_cursor_through_the_checkpointed_offset(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    failover: bool,
) -> None:
    """A driver that stopped after its sink committed a micro-batch but before the source
    acked it (no further trigger): the next run, a new reader starting at that offset,
    moves the cursor there and reads only what came after."""
    db, client = f"t_mv_{uuid.uuid4().hex[:8]}", "spark-mv"
    journal, position = sandbox.primary.master_status()
    master = {"address": f"127.0.0.1:{sandbox.primary.port}", "journal_name": journal,
              "position": position}  # fmt: skip
    destination = {"filter": {"regex": f"{db}\\..*"}, "master": master}
    nodes = node_cluster(2 if failover else 1, destination=destination)
    leader = wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    first_end = insert(sandbox, db, 1, 20)
    wait_until(lambda: reader_at(leader, first_end), "the reader at the binlog end", WAIT_S)
    reader = spark_reader(sandbox, nodes, client)
    start = reader.initialOffset()
    checkpoint, rows = run_batch(reader, start)
    assert rows == 22 and Offset.from_dict(checkpoint).total > 0
    reader.stop()  # the driver ends here: the sink committed, the source acked nothing
    # the cursor is still where the subscription started (before the rows), not past them
    assert cursor_of(leader, client) not in (None, first_end)

    if failover:
        leader.kill()
        leader = wait_leader(nodes, exclude=[leader])
    second_end = insert(sandbox, db, 21, 10)
    wait_until(lambda: reader_at(leader, second_end), "the reader at the binlog end", WAIT_S)
    reader = spark_reader(sandbox, nodes, client)
    try:
        latest, rows = run_batch(reader, checkpoint)  # the next run: a new reader
        assert rows == 10  # only the new rows
        assert cursor_of(leader, client) == first_end  # moved through the checkpoint
        assert Offset.from_dict(latest).total == Offset.from_dict(checkpoint).total + 6
        assert reader.latestOffset(latest, ReadAllAvailable()) == latest  # nothing more
        assert cursor_of(leader, client) == second_end  # and acked what it planned after
    finally:
        reader.stop()
    with leader.client() as http:
        r = http.post(f"{base(client)}/batches", json={"size": 100, "timeout_ms": 0}).json()
    assert r["id"] == -1  # nothing left for this client


def test_connector_move_cursor_through_a_real_leader(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
) -> None:
    db = f"t_mv_{uuid.uuid4().hex[:8]}"
    nodes = node_cluster(1, destination={"filter": {"regex": f"{db}\\..*"}})
    leader = wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    end = insert(sandbox, db, 1, 5)
    wait_until(lambda: reader_at(leader, end), "the reader at the binlog end", WAIT_S)
    conn = ClusterConnector(DEST, "c-mv", etcd=sandbox.etcd_endpoints, prefix=nodes[0].prefix)
    with conn:
        conn.subscribe(start="earliest")  # the rows were written before it subscribed
        batch = conn.get_without_ack(100, 5.0)
        last = batch.entries[-1].header
        cursor = conn.move_cursor(last.logfile, last.offset)
        assert cursor is not None
        assert (cursor["position"]["journal"], cursor["position"]["offset"]) == end
        assert conn.get_without_ack(100, 0.0).id == -1
        with pytest.raises(UnknownBatch, match="not outstanding"):
            conn.ack(batch.id)  # the move dropped it
