"""Where a new subscription starts: ``start`` = latest (default), earliest or a position.

First the EmbeddedServer over a real store and meta (fast), then several clients of real
nodes: a new client with ``latest`` sees only later changes, ``earliest`` the oldest
change still held, a position what follows it; a re-subscribe never moves a cursor; a
leader failover right after subscribing keeps the start.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, WAIT_S, NodeProc, fresh_database, node_cluster, wait_leader  # noqa: F401
from node_fixtures import client_path as base
from node_fixtures import json_row_ids as ids_of
from serving_fixtures import IDENTITY, EntryFactory, position_of

from canal_client.connector import SimpleConnector
from canal_cluster.retry import wait_until
from canal_ha.cli import build_parser
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import Entry
from canal_protocol.errors import ConfigError, CoordinatorUnavailable, InvalidArgument
from canal_protocol.positions import EntryPosition, LogPosition
from canal_server.embedded import EmbeddedServer
from canal_server.meta import MemoryMetaManager
from canal_server.store import EventStore

DB = "t_start"

# -- the embedded server ------------------------------------------------------------------


def _server() -> tuple[EmbeddedServer, EventStore, EntryFactory]:
    store = EventStore("d", buffer_size=1024)
    return EmbeddedServer("d", store, MemoryMetaManager("d")), store, EntryFactory()


def _put(store: EventStore, entries: list[Entry]) -> list[Entry]:
    assert store.put(entries, IDENTITY) == len(entries)
    return entries


def _all(server: EmbeddedServer, client: str) -> list[Entry]:
    return list(server.get_without_ack(client, 1000).entries)


def test_latest_earliest_and_a_position_with_several_clients() -> None:
    server, store, fac = _server()
    server.subscribe("a")
    old = _put(store, fac.rows(4))
    server.ack("a", server.get_without_ack("a", 2).id)  # frees old[0], old[1]
    latest = server.subscribe("b")
    assert latest.created and latest.cursor == position_of(old[-1])
    assert server.cursor("b") == position_of(old[-1])  # recorded at once
    earliest = server.subscribe("c", start="earliest")
    assert earliest.cursor == position_of(old[1])  # just before the oldest entry held
    at = server.subscribe("d", start=position_of(old[2]))
    assert at.cursor == position_of(old[2])
    new = _put(store, fac.rows(2))
    assert _all(server, "b") == new
    assert _all(server, "c") == old[2:] + new
    assert _all(server, "d") == old[3:] + new


class _FlakyMeta(MemoryMetaManager):
    """A meta manager whose first flush to etcd fails (etcd unreachable for a moment)."""

    def __init__(self) -> None:
        super().__init__("d")
        self.flushed_versions: list[int] = []
        self._fail = True

    def flush(self) -> bool:
        if self._fail:
            self._fail = False
            raise CoordinatorUnavailable("etcd: connection refused")
        self.flushed_versions.append(self.version)
        return True


def test_a_retried_subscribe_after_a_failed_flush_still_reaches_etcd() -> None:
    """The first subscribe answered 503 (its flush failed) but stayed in memory: the
    client's retry must flush the start before answering, though nothing changes."""
    meta = _FlakyMeta()
    server = EmbeddedServer("d", EventStore("d", buffer_size=16), meta)
    with pytest.raises(CoordinatorUnavailable):
        server.subscribe("a")
    again = server.subscribe("a")
    assert not again.created
    assert meta.flushed_versions == [meta.version]


def test_a_position_outside_what_is_held_is_refused_naming_start() -> None:
    server, store, fac = _server()
    server.subscribe("a")
    old = _put(store, fac.rows(3))
    server.ack("a", server.get_without_ack("a", 2).id)
    freed = position_of(old[0])
    beyond = LogPosition(IDENTITY, EntryPosition(journal="mariadb-bin.000009", offset=4))
    for bad in (freed, beyond, "newest"):
        with pytest.raises(InvalidArgument) as err:
            server.subscribe("x", start=bad)  # type: ignore[arg-type]
        assert err.value.field == "start"
        assert "x" not in server.subscriptions()
    assert server.subscribe("x", start=position_of(old[1])).created  # the oldest held


def test_resubscribe_never_moves_the_cursor_and_a_new_subscription_starts_anew() -> None:
    server, store, fac = _server()
    server.subscribe("a")
    old = _put(store, fac.rows(3))
    first = server.subscribe("b")
    again = server.subscribe("b", "db\\..*", start="earliest")
    assert not again.created and again.cursor == first.cursor  # start ignored
    assert _all(server, "b") == []
    server.unsubscribe("b")
    assert server.subscribe("b", start="earliest").created
    assert _all(server, "b") == old


# -- the clients' options ---------------------------------------------------------------


def test_consume_start_option() -> None:
    parse = build_parser().parse_args
    common = ["consume", "--server", "http://127.0.0.1:1", "--destination", "d", "--client-id", "c"]
    assert parse(common).start == "latest"
    assert parse([*common, "--start", "earliest"]).start == "earliest"
    with pytest.raises(SystemExit):
        parse([*common, "--start", "oldest"])


def test_spark_starting_offsets_reach_subscribe() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from spark_fixtures import FakeConnector, FakeServer

    from canal_client.spark import CanalOptions, CanalStreamReader

    opts = {"server": "fake://", "destination": "d", "clientId": "c"}
    assert CanalOptions.parse(opts).starting_offsets == "earliest"
    with pytest.raises(ConfigError) as err:
        CanalOptions.parse({**opts, "startingOffsets": "newest"})
    assert err.value.key == "startingOffsets"
    conn = FakeConnector(FakeServer())
    options = CanalOptions.parse({**opts, "startingOffsets": "Latest"})
    reader = CanalStreamReader(options, lambda _: conn)
    reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert conn.starts == ["latest"]


# -- real nodes ------------------------------------------------------------------------------


@pytest.fixture
def table(sandbox: Sandbox) -> Iterator[Any]:
    with fresh_database(sandbox.primary, DB) as p:
        yield p


def subscribe(http: httpx.Client, client: str, start: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"filter": f"{DB}\\.t"}
    if start is not None:
        body["start"] = start
    r = http.put(f"{base(client)}/subscription", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def batch(http: httpx.Client, client: str, size: int, timeout_ms: int = 10_000) -> dict[str, Any]:
    r = http.post(f"{base(client)}/batches", json={"size": size, "timeout_ms": timeout_ms})
    assert r.status_code == 200, r.text
    return dict(r.json())


def rows_until(http: httpx.Client, client: str, last: int) -> list[int]:
    """Row ids of every batch (acked) until row ``last`` arrived."""
    seen: list[int] = []
    while last not in seen:
        b = batch(http, client, 100)
        assert b["id"] != -1, f"{client}: row {last} did not arrive (got {seen})"
        seen += ids_of(b)
        assert http.post(f"{base(client)}/batches/{b['id']}/ack").status_code == 200
    return seen


def nothing_more(http: httpx.Client, client: str) -> bool:
    return bool(batch(http, client, 100, timeout_ms=1500)["id"] == -1)


def wait_read_past(node: NodeProc, position: dict[str, Any]) -> None:
    """Until the leader's reader has put everything up to ``position`` into the store
    (``reader_position`` of /v1/health), so it is part of a ``latest`` start."""
    want = (position["position"]["journal"], position["position"]["offset"])

    def read() -> bool:
        h = node.health()
        p = h["destinations"][DEST]["reader_position"] if h else None
        return p is not None and (p["journal"], p["offset"]) >= want

    wait_until(read, f"the reader past {want}", WAIT_S)


def test_several_clients_start_where_they_ask_and_keep_it_across_a_failover(
    node_cluster: Any,  # noqa: F811
    table: Any,
) -> None:
    nodes = node_cluster(2, destination={"filter": {"regex": f"{DB}\\..*"}})
    leader = wait_leader(nodes)
    with leader.client() as http:
        subscribe(http, "a")
        for i in (1, 2, 3):
            table.execute(f"INSERT INTO {DB}.t VALUES ({i})")
        tx = [batch(http, "a", 3) for _ in range(3)]  # BEGIN, row, END each
        assert [ids_of(b) for b in tx] == [[1], [2], [3]]
        assert http.post(f"{base('a')}/batches/{tx[0]['id']}/ack").status_code == 200
        wait_read_past(leader, tx[2]["end"])

        b = subscribe(http, "b")  # latest, the default
        assert b["created"] and b["cursor"] is not None
        assert http.get(f"{base('b')}/cursor").json()["cursor"] == b["cursor"]
        c = subscribe(http, "c", "earliest")
        d = subscribe(http, "d", tx[1]["end"])
        assert d["cursor"] == tx[1]["end"]
        for bad in (tx[0]["start"], {**tx[2]["end"], "position": {"journal": "zz", "offset": 4}}):
            r = http.put(f"{base('e')}/subscription", json={"start": bad})
            assert r.status_code == 400 and r.json()["field"] == "start", r.text
        r = http.put(f"{base('e')}/subscription", json={"start": "oldest"})
        assert r.status_code == 400 and r.json()["field"] == "start", r.text

        table.execute(f"INSERT INTO {DB}.t VALUES (4)")
        assert rows_until(http, "b", 4) == [4]  # only what came after it subscribed
        assert rows_until(http, "c", 4) == [2, 3, 4]  # row 1 was freed: 2 is the oldest held
        assert rows_until(http, "d", 4) == [3, 4]
        assert c["created"] and d["created"]

        again = subscribe(http, "b", "earliest")  # a re-subscribe never moves the cursor
        assert not again["created"]
        assert again["cursor"] == http.get(f"{base('b')}/cursor").json()["cursor"]
        assert nothing_more(http, "b")

        with SimpleConnector(leader.url, DEST, "py", wire="json") as conn:
            conn.subscribe(f"{DB}\\.t", start="earliest")
            got: list[Any] = []
            while 4 not in got:
                pulled = conn.get(100, 10.0)
                assert pulled.id != -1, got
                got += [r.after[0].value for e in pulled.entries for r in e.rows]
            assert got == [2, 3, 4]

        wait_read_past(leader, batch_end_of_row(http, "c"))
        g = subscribe(http, "g")  # flushed to etcd before the answer
    leader.kill()
    new = wait_leader(nodes, exclude=[leader])
    table.execute(f"INSERT INTO {DB}.t VALUES (5)")
    with new.client() as http:
        wait_until(lambda: resubscribed(http, "g"), "the new leader serves", WAIT_S)
        assert http.get(f"{base('g')}/cursor").json()["cursor"] == g["cursor"]
        assert rows_until(http, "g", 5) == [5]  # its start survived the failover
        assert rows_until(http, "b", 5) == [5]


def batch_end_of_row(http: httpx.Client, client: str) -> dict[str, Any]:
    """The client's cursor (the end of what it acked last)."""
    cursor = http.get(f"{base(client)}/cursor").json()["cursor"]
    assert cursor is not None
    return dict(cursor)


def resubscribed(http: httpx.Client, client: str) -> bool:
    r = http.put(f"{base(client)}/subscription", json={"filter": f"{DB}\\.t"})
    if r.status_code == 200:
        assert r.json()["created"] is False  # the subscription came from etcd
    return r.status_code == 200
