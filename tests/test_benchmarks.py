"""The benchmark harness: a tiny run of the reader parts (JSON shape), report helpers.

No timing asserts: the numbers of a loaded test machine mean nothing; only that the
harness runs, counts every row and writes the documented JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_common import (  # noqa: E402
    Context,
    NotYet,
    Part,
    Unavailable,
    median_runs,
    percentile,
    run_part,
)
from benchmarks.bench_node import thread_waits_s, waited_s  # noqa: E402
from benchmarks.bench_readers import ZONGJI_DIR, install_zongji  # noqa: E402
from benchmarks.bench_report import ratios, render_table  # noqa: E402

SMOKE_PARTS = ("mariadb_binlog", "mysql_replication", "binlog_reader")
SMOKE_ROWS = 10_000  # ten transactions: inserts, one update and one delete transaction


def _run_harness(out: Path, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the harness; on a timeout SIGTERM it (it then stops its sandbox) and fail."""
    argv = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--out", str(out), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=40)
        pytest.fail(f"harness timed out:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def test_reader_parts_write_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    only = ",".join(SMOKE_PARTS)
    done = _run_harness(out, "--rows", str(SMOKE_ROWS), "--only", only, "--repeat", "1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())

    machine = result["machine"]
    assert machine["nproc"] >= 1 and machine["cpu_model"] and machine["memory_bytes"] > 0
    assert machine["python"] == sys.version.split()[0]

    binlog = result["binlog"]
    assert binlog["rows"] == SMOKE_ROWS and binlog["transactions"] == 10
    assert binlog["kinds"] == {"insert": 8000, "update": 1000, "delete": 1000}
    assert len(binlog["tables"]) == 3 and binlog["files"]

    assert list(result["parts"]) == list(SMOKE_PARTS)
    for name, part in result["parts"].items():
        assert part["status"] == "ok", (name, part)
        assert part["rows"] == SMOKE_ROWS
        assert part["rows_per_s"] > 0 and len(part["runs"]) == 1
    assert result["ratios"]["mysql_replication"]["vs_mysql_replication"] == 1.0
    assert result["ratios"]["mariadb_binlog"]["vs_c_decoder"] == 1.0
    assert set(result["ratios"]["binlog_reader"]) == {"vs_mysql_replication", "vs_c_decoder"}
    for title in ("mariadb-binlog", "mysql-replication loop", "BinlogReader", "machine:"):
        assert title in done.stdout


def test_the_canal_tcp_part_writes_the_documented_json(tmp_path: Path) -> None:
    """Canal's TCP protocol end to end beside REST msgpack, at a tiny size: every row
    read once on both paths, the ratio and where the time goes recorded."""
    out = tmp_path / "canal.json"
    done = _run_harness(out, "--rows", "2000", "--only", "canal_tcp", "--repeat", "1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    part = json.loads(out.read_text())["parts"]["canal_tcp"]
    assert part["status"] == "ok", part
    assert part["rows"] == 2000 and part["duplicate_rows"] == 0 and part["batches"] >= 1
    assert part["values"] > 0 and part["rows_per_s"] > 0 and len(part["runs"]) == 1
    assert part["reconnects"] >= 0
    assert part["rest_msgpack_rows_per_s"] > 0 and len(part["rest_msgpack_runs"]) == 1
    assert part["vs_rest_msgpack"] > 0 and part["goal_vs_rest_msgpack"] == 0.5
    assert isinstance(part["meets_goal"], bool)
    assert part["cpu_vs_rest_msgpack"] > 0
    for key in ("node_cpu_us_per_row", "rest_msgpack_node_cpu_us_per_row",
                "rest_msgpack_consumer_cpu_us_per_row",
                "consumer_cpu_us_per_row", "consumer_parse_us_per_row",
                "consumer_wait_us_per_row"):  # fmt: skip
        assert part[key] >= 0, key
    encode = part["encode"]
    assert encode["rows"] == 2000 and encode["canal_protobuf_us_per_row"] > 0
    assert encode["rest_msgpack_us_per_row"] > 0 and encode["canal_top_functions"]
    assert encode["consumer_parse_cpu_us_per_row"] > 0 and encode["consumer_top_functions"]
    assert "Canal TCP" in done.stdout and "REST msgpack in the same run" in done.stdout


@pytest.mark.timeout(900)
def test_delta_mirror_part_at_a_tiny_size_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = _run_harness(
        out, "--rows", "1000", "--only", "delta_mirror", "--delta-sizes", "1500",
        "--delta-changes", "200", "--delta-batches", "2", timeout_s=840,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    part = json.loads(out.read_text())["parts"]["delta_mirror"]
    assert part["status"] == "ok", part
    assert (part["changes_per_batch"], part["rounds"]) == (200, 2)
    assert [s["rows"] for s in part["sizes"]] == [1500]
    for size in part["sizes"]:  # each mirror was checked against the table by the job
        for kind in ("delta", "parquet"):
            run = size[kind]
            assert run["rows"] == 400 and run["micro_batches"] == len(run["batches"]) >= 2
            assert all(b["rows"] <= 200 and b["add_batch_ms"] >= 0 for b in run["batches"])
        assert size["delta"]["files"] >= 1
    assert "Delta MERGE | parquet full rewrite" in done.stdout


def test_unknown_part_is_a_usage_error(tmp_path: Path) -> None:
    done = _run_harness(tmp_path / "x.json", "--only", "no_such_part")
    assert done.returncode == 2 and "no_such_part" in done.stderr
    assert not (tmp_path / "x.json").exists()


def _ctx() -> Context:
    return Context(sandbox=None, dataset=None, workdir=Path("."))  # type: ignore[arg-type]


def test_a_failing_part_records_its_outcome_and_never_raises() -> None:
    def boom(ctx: Context) -> dict[str, Any]:
        raise RuntimeError("decoder exploded")

    def missing(ctx: Context) -> dict[str, Any]:
        raise Unavailable("npm not found")

    def later(ctx: Context) -> dict[str, Any]:
        raise NotYet("examples/spark_to_parquet.py does not exist yet")

    error = run_part(Part("a", "A", boom), _ctx())
    assert error["status"] == "error" and "decoder exploded" in error["error"]
    assert run_part(Part("b", "B", missing), _ctx())["status"] == "unavailable"
    record = run_part(Part("c", "C", later), _ctx())
    assert record["status"] == "not yet" and "spark_to_parquet" in record["reason"]
    assert record["title"] == "C" and record["wall_s"] >= 0


def test_ratios_use_both_baselines_and_skip_missing_ones() -> None:
    parts: dict[str, dict[str, Any]] = {
        "mariadb_binlog": {"status": "ok", "rows_per_s": 1000.0},
        "mysql_replication": {"status": "ok", "rows_per_s": 20.0},
        "binlog_reader": {"status": "ok", "rows_per_s": 40.0},
        "zongji": {"status": "unavailable", "reason": "no npm"},
    }
    got = ratios(parts)
    assert got["binlog_reader"] == {"vs_mysql_replication": 2.0, "vs_c_decoder": 0.04}
    assert "zongji" not in got
    del parts["mariadb_binlog"]
    assert ratios(parts)["binlog_reader"]["vs_c_decoder"] is None


def test_table_shows_every_part_and_its_outcome() -> None:
    result = {
        "machine": {"nproc": 2, "cpu_model": "cpu", "memory_bytes": 2**30, "python": "3"},
        "parts": {
            "binlog_reader": {"status": "ok", "title": "reader", "rows_per_s": 5.0, "runs": [5]},
            "e2e_msgpack": {"status": "not yet", "title": "e2e", "reason": "no node"},
            "failover": {
                "status": "ok", "title": "failover", "trials_s": [4.0, 5.0],
                "median_s": 4.5, "max_s": 5.0, "election": {"ttl_s": 3, "switch_delay_s": 1},
            },
        },
        "ratios": {"binlog_reader": {"vs_mysql_replication": None, "vs_c_decoder": None}},
    }  # fmt: skip
    text = render_table(result)
    assert "reader" in text and "not yet" in text and "no node" in text
    assert "ttl 3 s, switch delay 1 s" in text
    assert "sigkill: median 4.50 s, max 5.00 s over 2 trials" in text


def _fake_task(proc: Path, tid: str, schedstat: str) -> None:
    (proc / "7" / "task" / tid).mkdir(parents=True, exist_ok=True)
    (proc / "7" / "task" / tid / "schedstat").write_text(schedstat)


def test_thread_waits_come_from_schedstat_per_thread(tmp_path: Path) -> None:
    _fake_task(tmp_path, "7", "900000000 2500000000 40\n")
    _fake_task(tmp_path, "8", "100 500000000 3\n")
    before = thread_waits_s(7, str(tmp_path))
    assert before == {"7": 2.5, "8": 0.5}
    (tmp_path / "7" / "task" / "8" / "schedstat").unlink()  # thread 8 ended
    _fake_task(tmp_path, "7", "900000000 3000000000 41\n")
    _fake_task(tmp_path, "9", "5 250000000 1\n")  # thread 9 started
    after = thread_waits_s(7, str(tmp_path))
    assert after == {"7": 3.0, "9": 0.25}
    assert waited_s(before, after) == pytest.approx(0.75)  # 0.5 more by 7, 0.25 by 9
    assert thread_waits_s(8, str(tmp_path)) is None  # no such process
    assert waited_s(None, after) is None
    assert thread_waits_s(os.getpid()) is not None  # this kernel keeps schedstat


def test_latency_lines_show_the_machine_and_the_node_waiting_for_a_core() -> None:
    rate = {
        "target_tps": 5000.0, "achieved_tps": 4999.0, "ack": "on_get", "p50_ms": 9.0,
        "p99_ms": 60.0, "max_ms": 80.0, "samples": 50000, "goal_p99_ms": 20.0,
        "insert_p50_ms": 0.1, "insert_p99_ms": 1.5, "after_commit_p50_ms": 8.9,
        "after_commit_p99_ms": 59.9, "node_cpu_us_per_tx": 137.0, "loadavg_1m": 1.6,
        "machine_busy_pct": 84.2, "node_cpu_wait": 0.55,
    }  # fmt: skip

    def table(rate: dict[str, Any]) -> str:
        return render_table({
            "machine": {"nproc": 2, "cpu_model": "cpu", "memory_bytes": 2**30, "python": "3"},
            "parts": {"latency": {"status": "ok", "title": "latency", "rates": [rate]}},
            "ratios": {},
        })  # fmt: skip

    text = table(rate)
    assert "p99 60.0 ms" in text and "NOT met" in text
    assert "machine 84% busy, node threads waited 0.55 s/s for a core" in text
    assert "waited" not in table({**rate, "node_cpu_wait": None})  # no schedstat


def test_median_and_percentile() -> None:
    runs = [{"rows_per_s": r, "seconds": s} for r, s in ((3.0, 1), (1.0, 3), (2.0, 2))]
    med = median_runs(runs)
    assert med["rows_per_s"] == 2.0 and med["seconds"] == 2 and med["runs"] == [3.0, 1.0, 2.0]
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0


# -- the zongji peer: installed by the harness, not committed --------------------------------


def _zongji_copy(tmp_path: Path) -> Path:
    """benchmarks/zongji without node_modules (as a fresh clone has it)."""
    work = tmp_path / "zongji"
    work.mkdir()
    for name in ("package.json", "package-lock.json", "read.mjs"):
        shutil.copy(ZONGJI_DIR / name, work / name)
    return work


def test_zongji_node_modules_are_not_committed() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "benchmarks/zongji"], cwd=REPO, capture_output=True, text=True
    )
    assert tracked.returncode == 0, tracked.stderr
    files = tracked.stdout.split()
    assert "benchmarks/zongji/package-lock.json" in files
    assert not [f for f in files if "/node_modules/" in f]


def test_zongji_is_installed_with_npm_ci_from_the_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recording npm on PATH (a fast unit test: no registry is asked)."""
    work = _zongji_copy(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "npm-calls"
    npm = bin_dir / "npm"
    npm.write_text(
        "#!/bin/sh\n"
        f'echo "$PWD $*" >> {calls}\n'
        "mkdir -p node_modules/@vlasky/zongji\n"
        """echo '{"version": "0.9.9"}' > node_modules/@vlasky/zongji/package.json\n"""
    )
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    assert install_zongji(work) == "0.9.9"
    cwd, command, *_ = calls.read_text().split()
    assert (cwd, command) == (str(work), "ci"), "npm ci: the versions of package-lock.json"
    assert install_zongji(work) == "0.9.9"
    assert len(calls.read_text().splitlines()) == 1, "installed once, then reused"


def test_zongji_without_npm_is_unavailable_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = _zongji_copy(tmp_path)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(Unavailable) as info:
        install_zongji(work)
    reason = str(info.value)
    assert "npm" in reason and "node_modules" in reason and "npm ci" in reason
    assert not (work / "node_modules").exists()
