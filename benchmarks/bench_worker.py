"""One consumer process of the cost-curve parts (bench_scale): several of them run at once
so the clients do not share one GIL with each other or with the harness.

    python -m benchmarks.bench_worker --url URL --destination D --client-id C \
        --rows N --go FILE

Subscribes from the earliest change, prints ``{"ev": "ready"}``, waits until ``--go``
exists, then reads (touching every value, acking every batch) until it has ``--rows``
distinct row changes and prints ``{"ev": "done", "rows", "duplicate_rows", "start",
"end"}`` (wall-clock times, comparable across processes). Exit 1 with ``{"ev":
"error"}`` when it gives up (``--timeout`` seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

BATCH_SIZE = 1000


def _say(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def _touch(batch: Any) -> int:
    """Values in the batch, reading every value of every row image (as bench_node's e2e)."""
    touched = 0
    for entry in batch.entries:
        images = entry.images
        if images is None:
            continue
        for image in (*images.before, *images.after):
            for value in image:
                if value is not None:
                    touched += 1
    return touched


def _read(conn: Any, rows: int, deadline: float) -> tuple[int, int]:
    seen: set[tuple[str, int]] = set()
    got = dups = 0
    while got < rows:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{got} of {rows} rows")
        batch = conn.get_without_ack(BATCH_SIZE, 1.0)
        if batch.is_empty:
            continue
        for entry in batch.entries:
            key = (entry.header.logfile, entry.header.offset)
            if key in seen:
                dups += entry.row_count
            else:
                seen.add(key)
                got += entry.row_count
        _touch(batch)
        conn.ack(batch.id)
    return got, dups


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--go", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    from canal_client.connector import SimpleConnector

    deadline = time.monotonic() + args.timeout
    try:
        with SimpleConnector(args.url, args.destination, args.client_id) as conn:
            conn.subscribe(start="earliest")
            _say(ev="ready")
            while not args.go.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{args.go} never appeared")
                time.sleep(0.01)
            start = time.time()
            rows, dups = _read(conn, args.rows, deadline)
            end = time.time()
    except Exception as exc:
        _say(ev="error", error=f"{type(exc).__name__}: {exc}")
        return 1
    _say(ev="done", rows=rows, duplicate_rows=dups, start=start, end=end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
