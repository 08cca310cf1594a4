"""availableNow runs of the Spark source end at the binlog end the leader reported when
they started, also while the leader's reader is still catching up.

Against fakes (no Spark): ``LaggingServer`` hands out only what its "reader" has put into
a bounded "store" so far, and its probe reports the reader position and the binlog end
as ``/v1/health`` does. Then one real run: a SparkSession reading a real node whose store
(``memory.buffer_size``) is far smaller than the backlog, so the reader necessarily lags
behind when the run starts, and waits for the run's acks to go on.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from node_fixtures import DEST, db_destination, node_cluster, wait_leader  # noqa: F401  (fixture)
from spark_fixtures import (  # noqa: F401  (fixture)
    FakeConnector,
    FakeServer,
    make_entries,
    spark,
)
from test_spark_reader import OPTS, Engine, expected

from canal_client.spark import (
    BinlogPoint,
    CanalOptions,
    CanalStreamReader,
    ConnectorLike,
    LeaderProgress,
    gtid_covers,
    parse_progress,
    point_key,
)
from canal_cluster.retry import wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol import Batch
from canal_protocol.ordering import EntryKey

LOGFILE = "mariadb-bin.000001"


def point(offset: int, gtid: str = "") -> BinlogPoint:
    return BinlogPoint(point_key(LOGFILE, offset, "db:3306", gtid), gtid, "db:3306")


@dataclass
class LaggingServer(FakeServer):
    """A FakeServer whose reader puts ``step`` entries of ``backlog`` into a store of
    ``capacity`` entries per poll; the store frees entries on ack only."""

    backlog: list[dict[str, Any]] | None = None
    capacity: int = 10
    step: int = 3
    filtered_tail: int = 0  # binlog bytes after the last entry that no client gets
    stuck_at: int | None = None  # the reader reads no further than this many entries

    def __post_init__(self) -> None:
        if not self.entries:  # the reader filled the store before the run started
            self.entries = (self.backlog or [])[: min(self.capacity, self.stuck_at or 1 << 30)]

    def take(self, size: int) -> Batch:
        backlog = self.backlog or []
        limit = len(backlog) if self.stuck_at is None else self.stuck_at
        visible = min(limit, len(self.entries) + self.step, self.cursor + self.capacity)
        self.entries = backlog[: max(visible, len(self.entries))]
        return super().take(size)

    def binlog_end(self) -> int:
        backlog = self.backlog or []
        return int(backlog[-1]["header"]["end_offset"]) + self.filtered_tail if backlog else 256

    def reader_at(self) -> int:
        if len(self.entries) == len(self.backlog or []):
            return self.binlog_end()  # read everything, the filtered tail too
        return int(self.entries[-1]["header"]["end_offset"]) if self.entries else 256

    def progress(self, conn: ConnectorLike) -> LeaderProgress:
        return LeaderProgress(self.epoch, point(self.reader_at()), point(self.binlog_end()))


class TargetEngine(Engine):
    """Engine whose reader asks ``probe`` (None: an older node without binlog_end)."""

    def __init__(self, server: LaggingServer, opts: CanalOptions, probe: bool = True) -> None:
        self.probe = probe
        super().__init__(server, opts)

    def restart(self, rollback_on_connect: bool = True) -> CanalStreamReader:
        server = self.server
        assert isinstance(server, LaggingServer)

        def factory(_: CanalOptions) -> ConnectorLike:
            conn = FakeConnector(server, rollback_on_connect)
            self.connectors.append(conn)
            return conn

        probe = server.progress if self.probe else (lambda conn: None)
        self.reader = CanalStreamReader(self.opts, factory, probe)
        self.reader.prepareForTriggerAvailableNow()
        return self.reader


def options(**kw: Any) -> CanalOptions:
    return CanalOptions(**{**OPTS.__dict__, "batch_size": 4, "max_batches_per_trigger": 3, **kw})


def test_run_reads_everything_of_its_start_while_the_reader_lags() -> None:
    backlog = make_entries(40, 2)  # 120 entries; the store holds 10, a trigger takes 12
    server = LaggingServer(backlog=backlog, capacity=10, step=3)
    eng = TargetEngine(server, options())
    eng.drain()
    assert eng.rows() == expected(backlog)
    assert len(eng.offsets) > 10  # many micro-batches: the store was full many times


def test_without_binlog_end_the_run_ends_at_the_first_empty_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backlog = make_entries(40, 2)
    server = LaggingServer(backlog=backlog, capacity=10, step=3, stuck_at=30)
    eng = TargetEngine(server, options(), False)
    with caplog.at_level(logging.WARNING, "canal_client.spark"):
        eng.drain()  # no availableNowStallS wait: the first empty poll ends it
    assert "reports no binlog_end" in caplog.text
    assert eng.rows() == expected(backlog[:30])  # the old behaviour: ends early


def test_entries_written_after_the_start_wait_for_the_next_run() -> None:
    first, later = make_entries(20, 1), make_entries(5, 1, first_id=21, start=10_000)
    server = LaggingServer(backlog=list(first), capacity=8, step=2)
    eng = TargetEngine(server, options())
    assert eng.step()
    server.backlog = first + later  # committed after the run started
    eng.drain()
    assert eng.rows() == expected(first)
    eng.restart()  # the next run
    eng.drain()
    assert eng.rows() == expected(first + later)  # each row once


def test_reader_past_the_target_and_an_empty_poll_end_the_run() -> None:
    backlog = make_entries(12, 1)
    server = LaggingServer(backlog=backlog, capacity=6, step=2, filtered_tail=5_000)
    eng = TargetEngine(server, options())
    eng.drain()  # served never reaches the target: the filtered tail ends it
    assert eng.rows() == expected(backlog)


def test_a_stalled_leader_ends_the_run_early_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backlog = make_entries(12, 1)
    server = LaggingServer(backlog=backlog, capacity=20, step=3, stuck_at=9)
    eng = TargetEngine(server, options(available_now_stall_s=1.0))
    with caplog.at_level(logging.WARNING, "canal_client.spark"):
        eng.drain()
    assert "no progress for 1 s" in caplog.text
    assert eng.rows() == expected(backlog[:9])
    server.stuck_at = None
    eng.restart()
    eng.drain()
    assert eng.rows() == expected(backlog)


def test_gtid_and_points() -> None:
    assert gtid_covers("0-1-42,1-2-7", "0-1-40,1-5-7")
    assert not gtid_covers("0-1-42", "0-1-40,1-5-7")  # domain 1 missing
    assert not gtid_covers("0-1-42", "")
    target = point(1000, "0-1-50")
    assert point(1000).reaches(target) and point(2000).reaches(target)
    assert not point(999, "0-1-49").reaches(target)
    rotated = BinlogPoint(EntryKey.of("mariadb-bin.000002", 4), "0-1-50", "db:3306")
    assert point(999, "0-1-50").reaches(rotated)  # a rotation after the last transaction
    assert not BinlogPoint(EntryKey.of(LOGFILE, 5000), "", "other:3306").reaches(target)
    health = {
        "destinations": {
            DEST: {
                "role": "leader", "epoch": 7,
                "reader_position": {"journal": LOGFILE, "offset": 900, "gtid": "0-1-49",
                                    "timestamp_ms": 1, "source_address": "db:3306"},
                "binlog_end": {"journal": LOGFILE, "offset": 1000, "gtid": "0-1-50",
                               "source_address": "db:3306"},
            }
        }
    }  # fmt: skip
    progress = parse_progress(health, DEST)
    assert progress == LeaderProgress(7, point(900, "0-1-49"), target)
    health["destinations"][DEST]["role"] = "standby"
    assert parse_progress(health, DEST) is None
    assert parse_progress({"destinations": {DEST: {"role": "leader", "epoch": 1}}}, DEST) == (
        LeaderProgress(1, None, None)  # an older node
    )


# -- a real node and a real SparkSession ------------------------------------------------------

ROWS, TX_ROWS, STORE = 30_000, 1_000, 40


def store_entries(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'canal_store_entries{{destination="{DEST}"}}'):
            return float(line.split()[-1])
    return -1.0


def test_spark_run_gets_the_whole_backlog_of_a_lagging_leader(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"t_avail_{uuid.uuid4().hex[:8]}"
    journal, position = sandbox.primary.master_status()
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    for lo in range(1, ROWS + 1, TX_ROWS):
        values = ",".join(f"({i},'v{i}')" for i in range(lo, lo + TX_ROWS))
        sandbox.primary.execute(f"INSERT INTO {db}.items (id, val) VALUES {values}")
    master = {"address": f"127.0.0.1:{sandbox.primary.port}", "journal_name": journal,
              "position": position}  # fmt: skip
    nodes = node_cluster(
        1,
        destination={"filter": {"regex": f"{db}\\..*"}, "master": master,
                     "memory": {"buffer_size": STORE}},
    )  # fmt: skip
    leader = wait_leader(nodes)
    # nobody acked yet: the reader stops with a full store, far behind the binlog end
    wait_until(lambda: store_entries(leader.url) == STORE, "a full store", 60)
    health = leader.health()
    assert health is not None
    d = health["destinations"][DEST]
    assert d["binlog_end"]["journal"] == sandbox.primary.master_status()[0]
    reader = (d["reader_position"]["journal"], d["reader_position"]["offset"])
    assert reader < (d["binlog_end"]["journal"], d["binlog_end"]["offset"])

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = (
        spark.readStream.format("canal")
        .option("etcd", ",".join(sandbox.etcd_endpoints))
        .option("etcdPrefix", nodes[0].prefix)
        .option("destination", DEST)
        .option("clientId", "spark-an")
        .option("batchSize", "10")
        .option("maxBatchesPerTrigger", "4")  # a trigger can take the whole store
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    keys = [r["primary_key"] for r in rows if not r["is_ddl"]]
    assert len(keys) == ROWS  # every row written before the run, each once
    assert set(keys) == {f'{{"id":"{i}"}}' for i in range(1, ROWS + 1)}
    assert sorted(r["sql"].split(" (")[0] for r in rows if r["is_ddl"]) == [
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.items",
    ]


def metric(url: str, name: str, client: str) -> float | None:
    """The value of ``name{destination=DEST, client=client}`` in the node's /metrics."""
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") and f'client="{client}"' in line:
            return float(line.split()[-1])
    return None


def cursor_at(url: str, client: str) -> tuple[str, int] | None:
    r = httpx.get(f"{url}/v1/destinations/{DEST}/clients/{client}/cursor", timeout=10)
    r.raise_for_status()
    cursor = r.json()["cursor"]
    return None if cursor is None else (cursor["position"]["journal"], cursor["position"]["offset"])


def test_one_batch_runs_move_the_cursor_and_read_only_new_rows(
    sandbox: Sandbox,
    node_cluster: Any,  # noqa: F811
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 13 item 1: three availableNow runs of one micro-batch each on one checkpoint.
    Spark never calls ``commit`` for the last micro-batch of a run; the cursor must still
    move to the end of every run, nothing stay outstanding, and the store be freed."""
    db, client = f"t_once_{uuid.uuid4().hex[:8]}", "spark-once"
    nodes = node_cluster(1, destination=db_destination(sandbox.primary, db))
    leader = wait_leader(nodes)
    sandbox.primary.execute(
        f"CREATE DATABASE {db}", f"CREATE TABLE {db}.items (id INT PRIMARY KEY, val VARCHAR(32))"
    )
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = 1
    for run, count in enumerate((20, 15, 10)):
        for lo in range(first, first + count, 5):  # transactions of 5 rows
            values = ",".join(f"({i},'v{i}')" for i in range(lo, lo + 5))
            sandbox.primary.execute(f"INSERT INTO {db}.items (id, val) VALUES {values}")
        first += count
        end = sandbox.primary.master_status()
        query = (
            spark.readStream.format("canal")
            .option("etcd", ",".join(sandbox.etcd_endpoints))
            .option("etcdPrefix", nodes[0].prefix)
            .option("destination", DEST)
            .option("clientId", client)
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert not query.isActive and query.exception() is None
        commits = [p for p in (ckpt / "commits").iterdir() if p.name.isdigit()]
        assert len(commits) == run + 1  # one micro-batch per run
        read = sum(p["numInputRows"] for p in query.recentProgress)
        assert read == count + (2 if run == 0 else 0)  # only the new rows (+ the DDL)
        # Spark committed everything the run read: the cursor is at its end, nothing is
        # outstanding and the leader's store could drop all of it
        assert cursor_at(leader.url, client) == end, f"run {run}"
        assert metric(leader.url, "canal_outstanding_batches", client) == 0, f"run {run}"
        wait_until(lambda: store_entries(leader.url) == 0, "an empty store", 30)

    rows = spark.read.parquet(str(out)).collect()
    keys = [r["primary_key"] for r in rows if not r["is_ddl"]]
    assert sorted(keys) == sorted(f'{{"id":"{i}"}}' for i in range(1, first))  # each once
    assert sorted(r["sql"].split(" (")[0] for r in rows if r["is_ddl"]) == [
        f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.items",
    ]


def test_snapshot_entries_at_the_binlog_end_are_part_of_the_run() -> None:
    """An incremental snapshot of an idle table puts its READ entries at the binlog end
    (its last transaction's end, with snapshot ordinals): the binlog end a run starts
    with lies before them, yet they are there when it starts and belong to it."""
    changes = make_entries(6, 1)
    end = int(changes[-1]["header"]["end_offset"])
    chunk = make_entries(2, 3, first_id=100, start=end)
    for n, e in enumerate(chunk, 1):
        e["header"].update(offset=end, end_offset=end, gtid="", event_type="READ", snapshot=n)
    backlog = changes + chunk
    server = LaggingServer(backlog=backlog, capacity=8, step=3)
    assert server.binlog_end() == end
    eng = TargetEngine(server, options())
    eng.drain()
    assert eng.rows() == expected(backlog)
    eng.restart()  # the next run: nothing twice
    eng.drain()
    assert eng.rows() == expected(backlog)
