"""A new leader resumes from a client cursor that lies inside a transaction.

Batches are cut by entry count, so an acked cursor can end between two rows events of
one transaction. The new leader (after the old one is SIGKILLed) must deliver every
remaining row of that transaction and its END, exactly once, in file mode and in GTID
mode. Real MariaDB, etcd and node processes (``node_fixtures``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, WAIT_S, NodeProc, fresh_database, node_cluster, wait_leader  # noqa: F401

from canal_cluster.etcd_coordinator import EtcdCoordinator
from canal_cluster.keys import Keys
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_ha.sandbox.mariadb import MariaDBServer

DB = "t_txresume"
PAD = "x" * 200  # wide rows: one INSERT of many rows spans several rows events
FIRST = range(1, 121)  # t1, statement 1 (several rows events)
SECOND = range(1, 4)  # t2, statement 2
THIRD = range(121, 131)  # t1, statement 3
NEXT_ID = 100  # t2, the transaction after: where reading stops

Entry = tuple[str, str, tuple[int, ...]]  # (type, table, ids of its rows)


@pytest.fixture
def tables(sandbox: Sandbox) -> Iterator[MariaDBServer]:
    with fresh_database(
        sandbox.primary, DB, "t1 (id INT PRIMARY KEY, pad VARCHAR(255))", "t2 (id INT PRIMARY KEY)"
    ) as p:
        yield p


def _base(client: str) -> str:
    return f"/v1/destinations/{DEST}/clients/{client}"


def _write_transaction(p: MariaDBServer) -> None:
    t1 = ",".join(f"({i}, '{PAD}')" for i in FIRST)
    t1_more = ",".join(f"({i}, '{PAD}')" for i in THIRD)
    t2 = ",".join(f"({i})" for i in SECOND)
    p.execute(
        "BEGIN",
        f"INSERT INTO {DB}.t1 VALUES {t1}",
        f"INSERT INTO {DB}.t2 VALUES {t2}",
        f"INSERT INTO {DB}.t1 VALUES {t1_more}",
        "COMMIT",
    )


def _entries(batch: dict[str, Any]) -> list[Entry]:
    out: list[Entry] = []
    for e in batch["entries"]:
        ids = tuple(
            next(c["value"] for c in r["after"] if c["name"] == "id") for r in e.get("rows", [])
        )
        out.append((e["type"], e["header"]["table"], ids))
    return out


def _take(http: httpx.Client, client: str, size: int) -> dict[str, Any]:
    r = http.post(f"{_base(client)}/batches", json={"size": size, "timeout_ms": 5_000})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _ack(http: httpx.Client, client: str, batch_id: int) -> None:
    r = http.post(f"{_base(client)}/batches/{batch_id}/ack")
    assert r.status_code == 200, r.text


def _subscribe(node: NodeProc, client: str) -> None:
    """PUT the subscription until the node serves it (503 while it starts)."""

    def ok() -> bool:
        with node.client() as http:
            return bool(http.put(f"{_base(client)}/subscription", json={}).status_code == 200)

    wait_until(ok, f"{node.id} serves {client}", WAIT_S)


def _read_until_next(node: NodeProc, client: str) -> list[Entry]:
    """Everything the client gets (acking each batch) through the END of the transaction
    that writes t2 id NEXT_ID."""
    got: list[Entry] = []
    deadline = time.monotonic() + WAIT_S
    with node.client() as http:
        while not (got and got[-1][0] == "TRANSACTIONEND" and (
            ("ROWDATA", "t2", (NEXT_ID,)) in got
        )):  # fmt: skip
            assert time.monotonic() < deadline, f"gave up waiting; got so far: {got}"
            batch = _take(http, client, 7)
            if batch["id"] == -1:
                continue
            got += _entries(batch)
            _ack(http, client, batch["id"])
    return got


def _summary(got: list[Entry]) -> str:
    """``BEGIN, t1[1..39], t1[40..78], ..., END`` for failure messages."""
    short = {"TRANSACTIONBEGIN": "BEGIN", "TRANSACTIONEND": "END"}
    return ", ".join(
        f"{table}[{ids[0]}..{ids[-1]}]" if ids else short.get(kind, kind)
        for kind, table, ids in got
    )


def _cursor(coord: EtcdCoordinator, prefix: str, client: str) -> dict[str, Any] | None:
    kv = coord.get(Keys(prefix).cursor(DEST, client))
    return dict(json.loads(kv.value)) if kv is not None else None


@pytest.mark.parametrize("gtid_mode", [False, True], ids=["file", "gtid"])
def test_new_leader_delivers_the_rest_of_the_transaction_the_cursor_is_in(
    node_cluster: Any,  # noqa: F811
    tables: MariaDBServer,
    coord: EtcdCoordinator,
    gtid_mode: bool,
) -> None:
    dest = {"filter": {"regex": f"{DB}\\..*"}, "gtid_mode": gtid_mode}
    nodes = node_cluster(2, destination=dest)
    old = wait_leader(nodes)
    _subscribe(old, "c")
    _write_transaction(tables)
    with old.client() as http:
        first = _take(http, "c", 3)  # BEGIN and two rows events of statement 1
        got = _entries(first)
        assert [t for t, _, _ in got] == ["TRANSACTIONBEGIN", "ROWDATA", "ROWDATA"], got
        assert got[2][2][-1] < FIRST[-1], "premise: statement 1 spans more rows events"
        _ack(http, "c", first["id"])
    end = first["end"]
    wait_until(
        lambda: _cursor(coord, old.prefix, "c") == end, "the cursor inside T in etcd", WAIT_S
    )

    old.kill()
    new = wait_leader(nodes, exclude=[old])
    _subscribe(new, "c")
    tables.execute(f"INSERT INTO {DB}.t2 VALUES ({NEXT_ID})")
    got += _read_until_next(new, "c")

    kinds = [t for t, _, _ in got]
    rows = len(kinds) - 5  # BEGIN .. END of T, then BEGIN, one row, END
    assert kinds == ["TRANSACTIONBEGIN"] + ["ROWDATA"] * rows + [
        "TRANSACTIONEND", "TRANSACTIONBEGIN", "ROWDATA", "TRANSACTIONEND"
    ], _summary(got)  # fmt: skip
    t1 = [i for t, table, ids in got if table == "t1" for i in ids]
    t2 = [i for t, table, ids in got if table == "t2" for i in ids]
    assert t1 == [*FIRST, *THIRD], f"t1 rows lost or twice: {_summary(got)}"
    assert t2 == [*SECOND, NEXT_ID], f"t2 rows lost or twice: {_summary(got)}"
