"""Unit tests of `canal-ha consume` / `canal-ha status` logic (fake cluster, MemoryCoordinator)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import pytest
from client_fixtures import FakeCluster, entry_wire
from memory_coordinator import MemoryCoordinator

from canal_client.connector import Connector, SimpleConnector
from canal_client.status import format_table, status_from_etcd
from canal_cluster.keys import Keys
from canal_cluster.retry import RetryPolicy
from canal_ha import consume as consume_cli
from canal_ha.cli import build_parser
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
    running = coord.get(keys.running("d"))
    assert running is not None
    status = status_from_etcd(coord, keys, now_ms=1_002_500)
    d = status["destinations"]["d"]
    assert d["leader"] == {"node": "n1", "url": A, "epoch": running.create_revision}
    assert d["nodes"] == ["n1"]
    assert d["clients"]["c1"] == {
        "active": "proc-1", "filter": "db\\..*", "cursor": cursor, "lag_s": 2.5,
        "outstanding_batches": 1,
    }  # fmt: skip
    lines: list[str] = []
    format_table(status, lines.append)
    text = "\n".join(lines)
    assert "leader: n1" in text and "bin.000002:400 gtid=0-1-9" in text and "2.500" in text
