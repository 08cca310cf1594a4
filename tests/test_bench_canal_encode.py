"""benchmarks/bench_canal_encode.py at a tiny size: it runs, counts every row and writes
the documented JSON (no timing asserts: a loaded test machine's numbers mean nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import bench_canal_encode  # noqa: E402


def test_canal_encode_benchmark_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "canal_encode.json"
    bench_canal_encode.main(["--rows", "2500", "--repeat", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["rows"] == 2500 and result["machine"]["nproc"] >= 1
    assert set(result["shapes"]) == {"large", "small"}
    large, small = result["shapes"]["large"], result["shapes"]["small"]
    # three transactions (1000, 1000, 500 rows): BEGIN, ROWDATA of up to 64 rows, END
    assert large["entries"] == 2 * 3 + 16 + 16 + 8
    assert small["entries"] == 3 * 2500
    for shape in (large, small):
        ways = shape["ways"]
        assert list(ways) == [
            "msgpack_compact", "canal_generated", "canal_python", "canal_encode"
        ]  # fmt: skip
        assert all(w["rows_per_s"] > 0 and len(w["runs"]) == 1 for w in ways.values())
        assert ways["msgpack_compact"]["vs_msgpack_compact"] == 1.0
        assert ways["msgpack_compact"]["cpu_vs_msgpack_compact"] == 1.0
        assert all(w["cpu_rows_per_s"] > 0 for w in ways.values())
        # the hand-written bytes hold the same fields as the generated classes' (in
        # another order): the same size; the C and the Python encoder write the same
        assert ways["canal_encode"]["bytes"] == ways["canal_generated"]["bytes"] > 0
        assert ways["canal_python"]["bytes"] == ways["canal_encode"]["bytes"]
