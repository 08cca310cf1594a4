"""Fakes and fixtures for the Spark source tests.

``FakeServer`` follows the server's batch semantics for one client (embedded.py):
get_without_ack after the last outstanding batch or the cursor, cumulative ack, rollback,
get_batch of an outstanding batch, move_cursor. ``FakeConnector`` follows the connector contract
(rollback on connect, ``epoch``). ``file_connector`` builds one from a JSON file (entries)
plus a state file (cursor, next id), so a real SparkSession can read through it in its
own Python processes and a restarted query finds the cursor the server kept.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from canal_client.spark import BinlogPoint, CanalOptions, LeaderProgress, point_key
from canal_client.spark.rows import Row
from canal_protocol import Batch, Entry
from canal_protocol.errors import UnknownBatch
from canal_protocol.ordering import EntryKey, entry_key

if TYPE_CHECKING:
    from canal_server.embedded import EmbeddedServer

LOGFILE = "mariadb-bin.000001"


def make_entries(
    n_tx: int, rows_per_tx: int, first_id: int = 1, start: int = 256, file: str = LOGFILE
) -> list[dict[str, Any]]:
    """Wire entries of ``n_tx`` insert transactions (BEGIN, one ROWDATA, END) on t.items."""
    out: list[dict[str, Any]] = []
    pos, row_id = start, first_id
    for tx in range(n_tx):
        gtid = f"0-1-{first_id + tx}"
        rows = []
        for _ in range(rows_per_tx):
            after = [_col("id", row_id, True), _col("val", f"v{row_id}", False)]
            rows.append({"before": [], "after": after})
            row_id += 1
        for kind, event, body in (
            ("TRANSACTIONBEGIN", "GTID", []),
            ("ROWDATA", "INSERT", rows),
            ("TRANSACTIONEND", "QUERY", []),
        ):
            out.append(_entry(kind, event, pos, gtid, body, file))
            pos += 100
    return out


def ddl_entry(sql: str, pos: int, file: str = LOGFILE) -> dict[str, Any]:
    e = _entry("ROWDATA", "CREATE", pos, "0-1-999", [], file)
    e["is_ddl"], e["sql"] = True, sql
    return e


def _col(name: str, value: Any, key: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "is_key": key,
        "updated": True,
        "mysql_type": "int" if key else "varchar(20)",
        "is_null": value is None,
    }


def _entry(
    kind: str, event: str, pos: int, gtid: str, rows: list[Any], file: str
) -> dict[str, Any]:
    header = {
        "logfile": file,
        "offset": pos,
        "end_offset": pos + 100,
        "server_id": 1,
        "timestamp_ms": 1_700_000_000_000 + pos,
        "gtid": gtid,
        "schema": "t",
        "table": "items",
        "event_type": event,
    }
    return {"type": kind, "header": header, "is_ddl": False, "sql": "", "rows": rows}


def arrow_rows(batches: Iterable[Any]) -> list[Row]:
    """The rows of the source's RecordBatches as ``entry_rows`` gives them (maps as dicts)."""
    out: list[Row] = []
    for batch in batches:
        for row in batch.to_pylist():
            out.append(tuple(dict(v) if isinstance(v, list) else v for v in row.values()))
    return out


@dataclass
class FakeServer:
    """One destination, one client: entries, cursor, outstanding batches."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    cursor: int = 0  # index of the first entry not acked
    next_id: int = 1
    outstanding: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> [lo, hi)
    epoch: int = 1
    acks: list[int] = field(default_factory=list)
    moves: list[int] = field(default_factory=list)  # the cursor after each move_cursor

    def take(self, size: int) -> Batch:
        lo = max((hi for _, hi in self.outstanding.values()), default=self.cursor)
        hi = min(lo + size, len(self.entries))
        if hi <= lo:
            return Batch.empty()
        bid, self.next_id = self.next_id, self.next_id + 1
        self.outstanding[bid] = (lo, hi)
        return self._batch(bid)

    def _batch(self, bid: int) -> Batch:
        lo, hi = self.outstanding[bid]
        return Batch(bid, [Entry.from_wire(e) for e in self.entries[lo:hi]])

    def get_batch(self, bid: int) -> Batch:
        if bid not in self.outstanding:
            raise UnknownBatch(f"batch {bid} is not outstanding")
        return self._batch(bid)

    def ack(self, bid: int) -> None:
        if bid not in self.outstanding:
            raise UnknownBatch(f"ack: batch {bid} is not outstanding")
        self.cursor = self.outstanding[bid][1]
        self.outstanding = {b: r for b, r in self.outstanding.items() if b > bid}
        self.acks.append(bid)

    def rollback(self) -> None:
        self.outstanding.clear()

    def move_cursor(self, logfile: str, offset: int) -> int:
        """POST .../cursor: drop outstanding batches, cursor forward past the entries
        starting at or before logfile:offset; the new cursor."""
        self.outstanding.clear()
        through = EntryKey.of(logfile, offset)
        done = sum(1 for e in self.entries if entry_key(e) <= through)
        self.cursor = max(self.cursor, done)
        self.moves.append(self.cursor)
        return self.cursor

    def failover(self, cursor_back_to: int | None = None, reuse_ids: bool = False) -> None:
        """A new leader: outstanding batches gone, maybe older cursor (unflushed acks)."""
        self.outstanding.clear()
        if cursor_back_to is not None:
            self.cursor = min(self.cursor, cursor_back_to)
        if reuse_ids:
            self.next_id = max(1, self.next_id - 3)
        self.epoch += 1


class FakeConnector:
    """The connector contract over a FakeServer; rolls back on connect like the real one."""

    def __init__(self, server: FakeServer, rollback_on_connect: bool = True) -> None:
        self.server = server
        self.rollback_on_connect = rollback_on_connect
        self.calls: list[str] = []
        self.starts: list[str | None] = []  # the start of each subscribe
        self.connected = False

    @property
    def epoch(self) -> int:
        return self.server.epoch

    @property
    def leader_url(self) -> str | None:
        return f"fake://leader/{self.server.epoch}"

    def connect(self) -> None:
        self.connected = True
        if self.rollback_on_connect:
            self.server.rollback()

    def disconnect(self) -> None:
        self.connected = False

    def subscribe(self, filter: str = "", start: str | None = None) -> None:
        self.calls.append(f"subscribe {filter}")
        self.starts.append(start)

    def get_without_ack(self, size: int, timeout_s: float) -> Batch:
        self.calls.append("get_without_ack")
        return self.server.take(size)

    def get_batch(self, batch_id: int) -> Batch:
        self.calls.append(f"get_batch {batch_id}")
        return self.server.get_batch(batch_id)

    def ack(self, batch_id: int) -> None:
        self.calls.append(f"ack {batch_id}")
        self.server.ack(batch_id)

    def rollback(self, batch_id: int | None = None) -> None:
        self.calls.append("rollback")
        self.server.rollback()

    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None:
        self.calls.append(f"move_cursor {logfile}:{offset}")
        return {"index": self.server.move_cursor(logfile, offset)}


class EmbeddedConnector:
    """The connector contract over a real ``EmbeddedServer`` in this process (its store,
    batches, cursor and ``move_cursor``); ``leader`` swaps the server (a new term)."""

    def __init__(self, server: EmbeddedServer, client: str = "spark", epoch: int = 1) -> None:
        self.server, self.client, self.epoch = server, client, epoch
        self.leader_url: str | None = f"embedded://{epoch}"

    def connect(self) -> None:
        if self.server.meta.is_subscribed(self.client):
            self.server.rollback(self.client)

    def disconnect(self) -> None:
        pass

    def subscribe(self, filter: str = "", start: str | None = None) -> None:
        self.server.subscribe(self.client, filter, "latest" if start == "latest" else "earliest")

    def get_without_ack(self, size: int, timeout_s: float) -> Batch:
        return self.server.get_without_ack(self.client, size, timeout_s)

    def get_batch(self, batch_id: int) -> Batch:
        return self.server.get_batch(self.client, batch_id)

    def ack(self, batch_id: int) -> None:
        self.server.ack(self.client, batch_id)

    def rollback(self, batch_id: int | None = None) -> None:
        self.server.rollback(self.client, batch_id)

    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None:
        cursor = self.server.move_cursor(self.client, logfile, offset)
        return None if cursor is None else {"position": cursor.position.to_dict()}


def reading(source: str, epoch: int = 1) -> Callable[[Any], LeaderProgress]:
    """A progress probe: the leader of ``epoch`` reads the database at ``source``."""
    return lambda _: LeaderProgress(epoch, BinlogPoint(point_key("", 0, source), "", source))


# -- a fake reachable from Spark's Python processes -----------------------------------------


class FileConnector(FakeConnector):
    """FakeConnector whose server reads ``data.json`` and keeps cursor/next id in a file."""

    def __init__(self, data: Path) -> None:
        self.data, self.state = data, data.with_suffix(".state.json")
        state = json.loads(self.state.read_text()) if self.state.exists() else {}
        server = FakeServer(cursor=state.get("cursor", 0), next_id=state.get("next_id", 1))
        super().__init__(server)

    def _load(self) -> None:
        self.server.entries = json.loads(self.data.read_text())

    def get_without_ack(self, size: int, timeout_s: float) -> Batch:
        self._load()
        batch = super().get_without_ack(size, timeout_s)
        self._save()
        return batch

    def ack(self, batch_id: int) -> None:
        super().ack(batch_id)
        self._save()

    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None:
        self._load()
        moved = super().move_cursor(logfile, offset)
        self._save()
        return moved

    def _save(self) -> None:
        state = {"cursor": self.server.cursor, "next_id": self.server.next_id}
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state)


def file_connector(options: CanalOptions) -> FileConnector:
    """``connectorFactory=spark_fixtures:file_connector``; ``server=file:///…/data.json``."""
    return FileConnector(Path(options.servers[0].removeprefix("file://")))


# -- SparkSession ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """local[2] SparkSession on 127.0.0.1 whose Python workers use this interpreter."""
    from canal_client.spark import local_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    tests_dir = str(Path(__file__).parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([tests_dir, *paths])
    session = local_session("local[2]", "canal-spark-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@dataclass(frozen=True)
class ItemsSource:
    """A fresh database ``db`` with ``items (id INT PRIMARY KEY, val VARCHAR(32))`` holding
    rows ``1..rows`` (inserted 100 per statement) and one node of ``DEST`` reading it
    from before its creation (its filter: only ``db``)."""

    db: str
    nodes: list[Any]
    etcd: str  # the sandbox's endpoints, comma-separated

    @property
    def prefix(self) -> str:
        return str(self.nodes[0].prefix)


@pytest.fixture
def items_source(sandbox: Any, node_cluster: Any) -> Callable[[str, int], ItemsSource]:
    """``items_source(tag, rows)``: an ``ItemsSource`` whose database is ``tag_<random>``
    (the test module imports ``node_cluster`` from node_fixtures)."""
    from node_fixtures import wait_leader

    def make(tag: str, rows: int) -> ItemsSource:
        db = f"{tag}_{uuid.uuid4().hex[:8]}"
        journal, position = sandbox.primary.master_status()
        master = {"address": f"127.0.0.1:{sandbox.primary.port}", "journal_name": journal,
                  "position": position}  # fmt: skip
        destination = {"filter": {"regex": f"{db}\\..*"}, "master": master}
        nodes = node_cluster(1, destination=destination)
        wait_leader(nodes)
        sandbox.primary.execute(
            f"CREATE DATABASE {db}",
            f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))",
        )
        for lo in range(1, rows + 1, 100):
            values = ",".join(f"({i},'v{i}')" for i in range(lo, min(lo + 100, rows + 1)))
            sandbox.primary.execute(f"INSERT INTO {db}.items VALUES {values}")
        return ItemsSource(db, nodes, ",".join(sandbox.etcd_endpoints))

    return make
