"""Unit tests of `canal-ha consume` / `canal-ha status` logic (fake cluster, MemoryCoordinator)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from client_fixtures import FakeCluster, entry_wire
from memory_coordinator import MemoryCoordinator

from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_client.status import format_table, lag_of, status_from_etcd
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy
from canal_cluster.running import ElectionConfig
from canal_ha import consume as consume_cli
from canal_ha.cli import build_parser, main
from canal_ha.sandbox.ports import free_port
from canal_protocol import Entry

A = "http://127.0.0.1:7201"


def run_consume(
    fake: FakeCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *argv: str,
) -> list[str]:
    def connector(args: argparse.Namespace) -> Connector:
        retry = RetryPolicy(initial_s=0.001, max_delay_s=0.01, attempts=20)
        return SimpleConnector(A, "example", "c1", transport=fake.transport(), retry=retry)

    monkeypatch.setattr(consume_cli, "_connector", connector)
    args = build_parser().parse_args(
        ["consume", "--server", A, "--destination", "example", "--client-id", "c1", *argv]
    )
    assert args.func(args) == 0
    return capsys.readouterr().out.splitlines()


def test_json_lines_acked_per_batch_until_max_entries(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCluster([A], entries=[entry_wire(i, blob=b"\x00") for i in range(25)])
    lines = run_consume(
        fake, monkeypatch, capsys, "--format", "json", "--batch-size", "10", "--max-entries", "15"
    )
    assert [json.loads(line)["header"]["offset"] for line in lines] == [100 * i for i in range(15)]
    assert json.loads(lines[0])["rows"][0]["after"][1]["value"] == "AA=="  # base64 in JSON
    assert fake.cursor == 15 and not fake.outstanding  # batches of 10 and 5, both acked
    sizes = [b["size"] for b in fake.bodies if isinstance(b, dict) and "size" in b]
    assert sizes == [10, 5]


def test_idle_exit_and_text_format(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCluster([A], entries=[entry_wire(i) for i in range(3)])
    lines = run_consume(fake, monkeypatch, capsys, "--idle-exit", "0.2")
    assert len(lines) == 3 and fake.cursor == 3
    assert lines[1].endswith("bin.000001:100 INSERT db.t [id=1]")


def test_text_format_of_updates_nulls_binary_and_transactions() -> None:
    wire = entry_wire(1, blob=b"\xab")
    wire["header"]["event_type"] = "UPDATE"
    row = wire["rows"][0]
    row["before"] = [dict(c) for c in row["after"]]
    row["after"][1] = {**row["after"][1], "value": None, "is_null": True}
    line = consume_cli.format_entry(Entry.from_wire(wire), "text")
    assert line.endswith("UPDATE db.t [id=1, b=0xab] -> [id=1, b=NULL]")
    begin: dict[str, Any] = {**entry_wire(2), "type": "TRANSACTIONBEGIN", "rows": []}
    assert "BEGIN gtid=0-1-2" in consume_cli.format_entry(Entry.from_wire(begin), "text")


def test_usage_errors_exit_2() -> None:
    cli = [sys.executable, "-m", "canal_ha.cli"]
    res = subprocess.run([*cli, "consume", "--destination", "d", "--client-id", "c"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2 and "--etcd" in res.stderr
    res = subprocess.run(
        [*cli, "consume", "--server", "http://127.0.0.1:1", "--etcd", "http://127.0.0.1:2",
         "--destination", "d", "--client-id", "c"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "not allowed with" in res.stderr


def test_status_from_etcd_keys() -> None:
    coord, keys = MemoryCoordinator(), Keys("/st")
    coord.put(keys.node("n1"), json.dumps({"node": "n1", "url": A, "destinations": ["d"]}).encode())
    coord.put(keys.running("d"), json.dumps({"node": "n1", "url": A}).encode())
    coord.put(keys.destination_node("d", "n1"), b"{}")
    coord.put(keys.subscription("d", "c1"), json.dumps({"filter": "db\\..*"}).encode())
    cursor = {"identity": {"source_address": "x", "slave_id": 1},
              "position": {"journal": "bin.000002", "offset": 400, "gtid": "0-1-9",
                           "timestamp_ms": 1_000_000}}  # fmt: skip
    coord.put(keys.cursor("d", "c1"), json.dumps(cursor).encode())
    coord.put(keys.mark("d", "c1", 7), b"{}")
    coord.put(keys.client_running("d", "c1"), json.dumps({"node": "proc-1", "url": ""}).encode())
    # unsubscribed (the key stays with subscribed: false) and never subscribed: not listed
    gone = {"filter": "", "subscribed": False, "last_batch_id": 3}
    coord.put(keys.subscription("d", "gone"), json.dumps(gone).encode())
    coord.put(keys.client_running("d", "waiting"), json.dumps({"node": "p2", "url": ""}).encode())
    running = coord.get(keys.running("d"))
    assert running is not None
    asked: list[str] = []

    def health(url: str) -> dict[str, Any]:
        asked.append(url)
        return {"destinations": {"d": {"reader_position": READER, "binlog_end": END}}}

    status = status_from_etcd(coord, keys, health)
    assert asked == [A]
    d = status["destinations"]["d"]
    assert d["leader"] == {"node": "n1", "url": A, "epoch": running.create_revision}
    assert d["nodes"] == ["n1"]
    assert (d["reader_position"], d["binlog_end"]) == (READER, END)
    assert d["clients"] == {"c1": {
        "active": "proc-1", "filter": "db\\..*", "cursor": cursor, "lag_bytes": 600,
        "lag_s": 2.5, "outstanding_batches": 1,
    }}  # fmt: skip
    lines: list[str] = []
    format_table(status, lines.append)
    text = "\n".join(lines)
    assert "leader: n1" in text and "bin.000002:400 gtid=0-1-9" in text
    assert re.search(r"c1 +proc-1 +600 +2\.500 +1 ", text), text
    assert "gone" not in text and "waiting" not in text


READER = {"journal": "bin.000002", "offset": 900, "gtid": "0-1-12", "timestamp_ms": 1_002_500,
          "source_address": "x"}  # fmt: skip
END = {"journal": "bin.000002", "offset": 1000, "gtid": "0-1-13", "source_address": "x"}


def _cursor(journal: str, offset: int, ts: int, source: str = "x") -> dict[str, Any]:
    return {"identity": {"source_address": source, "slave_id": 1},
            "position": {"journal": journal, "offset": offset, "timestamp_ms": ts}}  # fmt: skip


def test_lag_is_the_distance_to_the_binlog_end() -> None:
    assert lag_of(_cursor("bin.000002", 400, 1_000_000), READER, END) == (600, 2.5)
    # at the binlog end: 0 and 0, however old the last commit is
    assert lag_of(_cursor("bin.000002", 1000, 5), READER, END) == (0, 0.0)
    # an earlier file: bytes unknown (file sizes), seconds by commit time
    assert lag_of(_cursor("bin.000001", 5000, 1_001_000), READER, END) == (None, 1.5)
    # another source (a switch to the standby): offsets are not comparable
    assert lag_of(_cursor("bin.000002", 400, 1_000_000, "y"), READER, END) == (None, 2.5)
    assert lag_of(None, READER, END) == (None, None)  # never acked
    assert lag_of(_cursor("bin.000002", 400, 1_000_000), None, None) == (None, None)


# -- bounded waits, clear failures (issue 13) ----------------------------------------------

CLI = [sys.executable, "-m", "canal_ha.cli"]
BOUND_S = 120  # generous: each command must end by itself well before this


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=BOUND_S)


def consume_argv(*source: str) -> list[str]:
    return ["consume", *source, "--destination", "example", "--client-id", "c1"]


def test_unreachable_etcd_fails_after_the_connect_timeout() -> None:
    etcd = f"http://127.0.0.1:{free_port()}"
    res = cli(*consume_argv("--etcd", etcd, "--connect-timeout", "2"))
    assert res.returncode == 1, res.stderr
    assert "etcd" in res.stderr and etcd in res.stderr and "not reachable" in res.stderr
    assert res.stdout == ""
    # --idle-exit no longer passes for success while nothing was ever reached
    res = cli(*consume_argv("--etcd", etcd, "--idle-exit", "1"))
    assert res.returncode == 1 and etcd in res.stderr, res.stderr


def test_unreachable_server_fails_after_the_connect_timeout() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = cli(*consume_argv("--server", url, "--connect-timeout", "2"))
    assert res.returncode == 1, res.stderr
    assert url in res.stderr and "not connected after 2 s" in res.stderr
    assert "--connect-timeout" in res.stderr


def test_idle_exit_is_honoured_while_not_connected() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = cli(*consume_argv("--server", url, "--connect-timeout", "600", "--idle-exit", "1"))
    assert res.returncode == 1, res.stderr
    assert "--idle-exit" in res.stderr and url in res.stderr


def test_out_of_range_ports_are_usage_errors() -> None:
    for command in ("consume", "status"):
        extra = ["--destination", "d", "--client-id", "c"] if command == "consume" else []
        res = cli(command, "--server", "http://127.0.0.1:99999", *extra)
        assert res.returncode == 2 and "--server" in res.stderr, res.stderr
        assert "port 99999 out of range" in res.stderr
        res = cli(command, "--etcd", "http://127.0.0.1:70000", *extra)
        assert res.returncode == 2 and "--etcd" in res.stderr, res.stderr
        assert "port 70000 out of range" in res.stderr
        assert "Traceback" not in res.stderr


def test_idle_exit_while_the_known_leader_is_gone_is_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCluster([A], entries=[entry_wire(i) for i in range(3)])
    transport = fake.transport()

    def handle(request: Any) -> Any:
        if fake.cursor >= 3:
            fake.new_leader(None)  # everything acked, then the leader is gone for good
        return transport.handle_request(request)

    def connector(args: argparse.Namespace) -> Connector:
        forever = RetryPolicy(initial_s=0.01, max_delay_s=0.05, attempts=-1)
        return SimpleConnector(
            A, "example", "c1", transport=httpx.MockTransport(handle), retry=forever
        )

    monkeypatch.setattr(consume_cli, "_connector", connector)
    argv = ["consume", "--server", A, "--destination", "example", "--client-id", "c1",
            "--idle-exit", "0.5"]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3
    assert "--idle-exit" in err and "while no leader answered" in err


def test_text_format_of_a_schema_level_statement() -> None:
    wire: dict[str, Any] = {**entry_wire(1), "is_ddl": True, "sql": "CREATE DATABASE shop",
                            "rows": []}  # fmt: skip
    wire["header"] = {**wire["header"], "schema": "shop", "table": "", "event_type": "QUERY"}
    line = consume_cli.format_entry(Entry.from_wire(wire), "text")
    assert line.endswith(" QUERY shop: CREATE DATABASE shop"), line
    wire["header"] = {**wire["header"], "table": "orders", "event_type": "CREATE"}
    line = consume_cli.format_entry(Entry.from_wire(wire), "text")
    assert line.endswith(" CREATE shop.orders: CREATE DATABASE shop"), line


def test_a_normal_exit_logs_no_warning(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    coord, keys = MemoryCoordinator(), Keys()
    coord.put(keys.running("example"), json.dumps({"node": "n1", "url": A}).encode())
    running = coord.get(keys.running("example"))
    assert running is not None
    fake = FakeCluster([A], epoch=running.create_revision,
                       entries=[entry_wire(i) for i in range(5)])  # fmt: skip
    election = ElectionConfig(ttl_s=3, safety_margin_s=0.5, loop_interval_s=0.1,
                              switch_delay_s=0.3)  # fmt: skip

    def connector(args: argparse.Namespace) -> Connector:
        return ClusterConnector(
            "example", "c1", coordinator=coord, transport=fake.transport(), exclusive=True,
            election=election, connect_timeout_s=args.connect_timeout,
        )  # fmt: skip

    monkeypatch.setattr(consume_cli, "_connector", connector)
    caplog.set_level(logging.INFO, "canal_client")
    for stop in (["--max-entries", "2"], ["--idle-exit", "3"]):
        argv = ["consume", "--etcd", "http://127.0.0.1:2379", "--destination", "example",
                "--client-id", "c1", *stop]  # fmt: skip
        caplog.clear()
        assert main(argv) == 0
        messages = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert any("is now active" in m for _, m in messages), messages
        assert any("no longer active" in m for _, m in messages), messages
        assert not [m for level, m in messages if level >= logging.WARNING], messages
    assert len(capsys.readouterr().out.splitlines()) == 5 and fake.cursor == 5
