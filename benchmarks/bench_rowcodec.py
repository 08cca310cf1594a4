"""Row decoding speed: the reference, rowcodec's generated Python and its C decoder.

Usage: ``.venv/bin/python -m benchmarks.bench_rowcodec [--rows N] [--repeat R]``.

Starts a private sandbox (MariaDB + etcd in a temp dir), writes the benchmark binlog
(``bench_data.generate``: int key, int, bigint, decimal(12,2), varchar(64),
datetime(6), blob; 1000-row transactions; inserts, updates, deletes), reads every rows
event's raw packet once into memory and then times decoding them, all in this process:

- ``reference``: mysql-replication's ``ev.rows`` + ``decoding.row_changes`` (the event
  objects are rebuilt from the packets before each timed run, outside the timing);
- ``python``: ``rowcodec.TableCodec`` with the generated Python decoder;
- ``c``: the same with the C decoder.

Then the way to msgpack (the server packs every rows event's images once, as the
compact layout's ``before``/``after`` arrays):

- ``c+packb``: ``decode`` (C) then ``msgpack.packb`` of the before and after images;
- ``packed``: ``decode_packed`` (C writes the msgpack bytes itself), by default: the
  GIL kept for these ~8 KB events;
- ``packed_nogil``: ``decode_packed`` with the GIL released for every event;

each alone, then while another Python thread spins on pure-Python work (the
``spinner``, standing for the node's HTTP thread): the reader's rows/s and the
spinner's work per second (thousands of loop steps) during the same time, next to the
spinner's rate alone. Last, the same against the spinner with the events of each
table and kind joined into bodies of ``LARGE`` bytes or more (``packed_gil`` keeps the
GIL, ``packed_nogil`` releases it; ``decode_packed`` releases it from
``rowcodec.NOGIL_MIN_BYTES`` on).

Rows are row changes (an UPDATE's before + after image count once). Prints rows/s per
decoder (median of ``--repeat`` runs) and writes ``benchmarks/results/rowcodec.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack
import pymysql.protocol
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from benchmarks.bench_common import REPO, machine_info, write_result
from benchmarks.bench_data import SCHEMA, generate
from canal_ha.sandbox import Sandbox
from canal_server.parse import decoding, rowcodec
from canal_server.parse.binlog_stream import next_event, open_stream

__all__ = ["main", "measure", "run"]

KINDS = {WriteRowsEvent: "INSERT", UpdateRowsEvent: "UPDATE", DeleteRowsEvent: "DELETE"}
DEFAULT_OUT = REPO / "benchmarks" / "results" / "rowcodec.json"
PACKERS = ("c+packb", "packed", "packed_nogil")
LARGE = 1 << 20  # bytes of a joined body
CONTENDED_S = 1.0  # reader time per contended run (the GIL switch interval is 5 ms)


@dataclass(frozen=True)
class RawEvent:
    """One rows event as read: its packet, kind, table id and rows body."""

    packet: bytes
    kind: str
    table_id: int
    body: tuple[bytes, int, int]
    rows: int


@dataclass(frozen=True)
class Captured:
    events: tuple[RawEvent, ...]
    table_map: dict[int, Any]
    use_checksum: bool

    @property
    def rows(self) -> int:
        return sum(e.rows for e in self.events)


def per_row(e: RawEvent) -> int:
    return 2 if e.kind == "UPDATE" else 1


def capture(box: Sandbox, journal: str, offset: int) -> Captured:
    """Every rows event of the benchmark schema, kept in memory."""
    stream = open_stream(
        box.primary.dsn(), 9911, journal=journal, offset=offset, blocking=False,
        only_events=list(KINDS),
    )  # fmt: skip
    events, tables = [], {}
    try:
        while (ev := next_event(stream)) is not None:
            body = rowcodec.rows_body(ev)
            if ev.schema != SCHEMA or body is None:
                continue
            tables[ev.table_id] = ev.table_map[ev.table_id]  # (the stream forgets at rotations)
            rows = len(ev.rows)
            packet = bytes(ev.packet.packet._data)
            events.append(RawEvent(packet, KINDS[type(ev)], ev.table_id, body, rows))
        return Captured(tuple(events), tables, stream._BinLogStreamReader__use_checksum)
    finally:
        stream.close()


def rebuild(captured: Captured) -> list[Any]:
    """Fresh library event objects of every captured packet (ev.rows not read yet)."""
    connection = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mariadb")
    out = []
    for e in captured.events:
        wrapper = BinLogPacketWrapper(
            pymysql.protocol.MysqlPacket(e.packet, "utf8"), captured.table_map, connection,
            (10, 11, 0), captured.use_checksum, frozenset(KINDS), None, None, None, None,
            False, False, False, True, False,
        )  # fmt: skip
        out.append(wrapper.event)
    return out


def time_reference(captured: Captured) -> float:
    events = rebuild(captured)
    specs = {tid: decoding.column_specs(t.columns) for tid, t in captured.table_map.items()}
    t0 = time.perf_counter()
    for ev in events:
        decoding.row_changes(KINDS[type(ev)], specs[ev.table_id], ev.rows)
    return time.perf_counter() - t0


def time_codec(captured: Captured, native: bool) -> float:
    codecs = codecs_of(captured, native)
    t0 = time.perf_counter()
    for e in captured.events:
        codecs[e.table_id].decode(*e.body, 2 if e.kind == "UPDATE" else 1)
    return time.perf_counter() - t0


def codecs_of(captured: Captured, native: bool) -> dict[int, rowcodec.TableCodec]:
    codecs = {}
    for tid, table in captured.table_map.items():
        codec = rowcodec.table_codec(table.columns, native=native)
        if codec is None:
            raise RuntimeError(f"no codec for table {table.schema}.{table.table}")
        codecs[tid] = codec
    return codecs


def pack_with_packb(codec: rowcodec.TableCodec, e: RawEvent) -> rowcodec.Packed:
    """decode, then msgpack.packb of each side (what the server does without C packing)."""
    images = codec.decode(*e.body, per_row(e))
    if e.kind == "UPDATE":
        before, after = images[0::2], images[1::2]
    else:
        before, after = ([], images) if e.kind == "INSERT" else (images, [])
    packb = msgpack.packb
    return len(after or before), packb(before, use_bin_type=True), packb(after, use_bin_type=True)


def packer(name: str) -> Callable[[rowcodec.TableCodec, RawEvent], rowcodec.Packed | None]:
    if name == "c+packb":
        return pack_with_packb
    release = {"packed": None, "packed_gil": False, "packed_nogil": True}[name]

    def packed(codec: rowcodec.TableCodec, e: RawEvent) -> rowcodec.Packed | None:
        side: rowcodec.Side = "before" if e.kind == "DELETE" else "after"
        return codec.decode_packed(*e.body, per_row(e), side, release_gil=release)

    return packed


def time_packing(captured: Captured, name: str, min_seconds: float = 0.0) -> tuple[int, float]:
    """(rows, seconds) of packing every event, again until ``min_seconds`` have passed."""
    codecs, pack = codecs_of(captured, True), packer(name)
    rows, t0 = 0, time.perf_counter()
    while True:
        for e in captured.events:
            pack(codecs[e.table_id], e)
        rows += captured.rows
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return rows, elapsed


class Spinner:
    """A thread spinning on pure-Python work; ``steps`` counts thousands of loop steps."""

    def __init__(self) -> None:
        self.steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spinner", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for k in range(1000):
                total += k
            self.steps += 1

    def __enter__(self) -> Spinner:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def spinner_alone() -> float:
    """The spinner's thousands of steps per second with nothing else running."""
    with Spinner() as spinner:
        s0, t0 = spinner.steps, time.perf_counter()
        time.sleep(CONTENDED_S)
        return (spinner.steps - s0) / (time.perf_counter() - t0)


def contended(captured: Captured, name: str) -> tuple[float, float]:
    """(reader rows/s, spinner kilo-steps/s) while both run."""
    with Spinner() as spinner:
        s0, t0 = spinner.steps, time.perf_counter()
        rows, _ = time_packing(captured, name, CONTENDED_S)
        elapsed = time.perf_counter() - t0
        return rows / elapsed, (spinner.steps - s0) / elapsed


def joined(captured: Captured, min_bytes: int) -> Captured:
    """The events of each table and kind joined into bodies of ``min_bytes`` or more."""
    groups: dict[tuple[int, str], list[RawEvent]] = {}
    for e in captured.events:
        groups.setdefault((e.table_id, e.kind), []).append(e)
    out: list[RawEvent] = []
    for (tid, kind), events in groups.items():
        parts: list[RawEvent] = []
        for k, e in enumerate(events):
            parts.append(e)
            if sum(p.body[2] - p.body[1] for p in parts) >= min_bytes or k == len(events) - 1:
                body = b"".join(p.body[0][p.body[1] : p.body[2]] for p in parts)
                rows = sum(p.rows for p in parts)
                out.append(RawEvent(b"", kind, tid, (body, 0, len(body)), rows))
                parts = []
    return Captured(tuple(out), captured.table_map, captured.use_checksum)


def check_identical(captured: Captured) -> None:
    """Every decoder gives the same values on every event (before timing them)."""
    for ev, raw in zip(rebuild(captured), captured.events, strict=True):
        table = captured.table_map[raw.table_id]
        ref = []
        for change in decoding.row_changes(raw.kind, decoding.column_specs(table.columns), ev.rows):
            ref += [tuple(c.value for c in img) for img in (change.before, change.after) if img]
        for native in (False, True):
            codec = rowcodec.table_codec(table.columns, native=native)
            assert codec is not None
            got = codec.decode(*raw.body, 2 if raw.kind == "UPDATE" else 1)
            if got != ref or [list(map(type, r)) for r in got] != [list(map(type, r)) for r in ref]:
                raise AssertionError(f"{'C' if native else 'python'} codec differs on {raw.kind}")
        c_codec = rowcodec.table_codec(table.columns, native=True)
        assert c_codec is not None
        want = pack_with_packb(c_codec, raw)
        for name in PACKERS[1:]:
            if packer(name)(c_codec, raw) != want:
                raise AssertionError(f"{name} differs from decode + packb on {raw.kind}")


def measure(captured: Captured, repeat: int) -> dict[str, Any]:
    """rows/s of each decoder (median of ``repeat`` runs) over the captured events."""
    check_identical(captured)
    timers: dict[str, Callable[[], float]] = {
        "reference": lambda: time_reference(captured),
        "python": lambda: time_codec(captured, False),
        "c": lambda: time_codec(captured, True),
    }
    out: dict[str, Any] = {}
    for name, timer in timers.items():
        runs = []
        for _ in range(repeat):
            gc.collect()
            runs.append(captured.rows / timer())
        out[name] = {
            "rows_per_s": round(statistics.median(runs), 1),
            "us_per_row": round(1e6 / statistics.median(runs), 3),
            "runs": [round(r, 1) for r in runs],
        }
    ref = out["reference"]["rows_per_s"]
    out["speedup"] = {k: round(out[k]["rows_per_s"] / ref, 1) for k in ("python", "c")}
    return out


def measure_packing(captured: Captured, repeat: int) -> dict[str, Any]:
    """rows/s to msgpack bytes of each packer, alone and against the spinner (medians)."""
    alone: dict[str, Any] = {}
    for name in PACKERS:
        runs = []
        for _ in range(repeat):
            gc.collect()
            rows, seconds = time_packing(captured, name)
            runs.append(rows / seconds)
        rate = statistics.median(runs)
        alone[name] = {
            "rows_per_s": round(rate, 1),
            "us_per_row": round(1e6 / rate, 3),
            "runs": [round(r, 1) for r in runs],
        }
    spin = statistics.median(spinner_alone() for _ in range(repeat))
    against: dict[str, Any] = {}
    for name in PACKERS:
        pairs = [contended(captured, name) for _ in range(repeat)]
        against[name] = {
            "rows_per_s": round(statistics.median(p[0] for p in pairs), 1),
            "spinner_ksteps_per_s": round(statistics.median(p[1] for p in pairs), 1),
            "runs": [[round(p[0], 1), round(p[1], 1)] for p in pairs],
        }
    large = joined(captured, LARGE)
    against_large: dict[str, Any] = {"min_body_bytes": LARGE, "events": len(large.events)}
    for name in ("packed_gil", "packed_nogil"):
        pairs = [contended(large, name) for _ in range(repeat)]
        against_large[name] = {
            "rows_per_s": round(statistics.median(p[0] for p in pairs), 1),
            "spinner_ksteps_per_s": round(statistics.median(p[1] for p in pairs), 1),
            "runs": [[round(p[0], 1), round(p[1], 1)] for p in pairs],
        }
    return {
        "alone": alone,
        "speedup": round(alone["packed"]["rows_per_s"] / alone["c+packb"]["rows_per_s"], 2),
        "spinner_alone_ksteps_per_s": round(spin, 1),
        "contended": against,
        "contended_large_bodies": against_large,
        "switch_interval_s": sys.getswitchinterval(),
        "contended_seconds": CONTENDED_S,
    }


def run(rows: int, repeat: int) -> dict[str, Any]:
    """Start a sandbox, write ``rows`` row changes, capture and time; the result document."""
    result: dict[str, Any] = {"machine": machine_info(), "started_at": time.time()}
    with tempfile.TemporaryDirectory(prefix="canal-rowcodec-") as tmp:
        box = Sandbox(Path(tmp) / "sandbox", etcd_members=1, standby=False).start()
        try:
            dataset = generate(box.primary, rows)
            captured = capture(box, dataset.journal, dataset.offset)
        finally:
            box.stop()
    result["binlog"] = dataclasses.asdict(dataset)
    result["captured"] = {
        "events": len(captured.events),
        "rows": captured.rows,
        "body_bytes": sum(e.body[2] - e.body[1] for e in captured.events),
    }
    result["config"] = {"rows": rows, "repeat": repeat, "c_built": rowcodec.HAVE_NATIVE}
    result["decoders"] = measure(captured, repeat)
    result["packing"] = measure_packing(captured, repeat)
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['captured']['rows']:,} row changes in {result['captured']['events']} rows events"
    ]
    for name in ("reference", "python", "c"):
        d = result["decoders"][name]
        speedup = result["decoders"]["speedup"].get(name, 1.0)
        rate, cost = d["rows_per_s"], d["us_per_row"]
        lines.append(f"  {name:<10} {rate:>14,.0f} rows/s  {cost:>8.3f} us/row  x{speedup}")
    packing = result["packing"]
    lines.append("to msgpack bytes, alone:")
    for name in PACKERS:
        rate, cost = packing["alone"][name]["rows_per_s"], packing["alone"][name]["us_per_row"]
        lines.append(f"  {name:<12} {rate:>12,.0f} rows/s  {cost:>8.3f} us/row")
    spin = packing["spinner_alone_ksteps_per_s"]
    lines.append(f"against a pure-Python spinner thread (alone: {spin:,.0f} ksteps/s):")
    for name in PACKERS:
        d = packing["contended"][name]
        rate, steps = d["rows_per_s"], d["spinner_ksteps_per_s"]
        lines.append(f"  {name:<12} {rate:>12,.0f} rows/s  spinner {steps:>10,.0f} ksteps/s")
    large = packing["contended_large_bodies"]
    lines.append(f"  bodies of {large['min_body_bytes']:,}+ bytes ({large['events']} events):")
    for name in ("packed_gil", "packed_nogil"):
        d = large[name]
        rate, steps = d["rows_per_s"], d["spinner_ksteps_per_s"]
        lines.append(f"  {name:<12} {rate:>12,.0f} rows/s  spinner {steps:>10,.0f} ksteps/s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=100_000, help="row changes in the binlog")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per decoder (median)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result file")
    args = p.parse_args(argv)
    if not rowcodec.HAVE_NATIVE:
        print("the C decoder is not built (pip install -e .): its numbers are missing")
        return 1
    result = run(args.rows, args.repeat)
    print(render(result))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
