"""The end-to-end part's consumer: reads the whole binlog through the client and tallies it.

It runs in a process of its own (``python -m benchmarks.e2e_consumer ...``), started by
``bench_node.e2e_*``, so that the process reading the rows holds the client and nothing
else, as a consumer does (``canal-ha consume``, an application): run inside the
benchmark's own process, the client's cyclic GC also walks the harness's ~57,000
objects (sandbox, pymysql, psutil, httpx) at every full collection, 2-4 times a run at
20-30 ms each. The part also runs it in-process, reported beside (``in_harness_*``).

This module imports only the client and the standard library. Once they are imported,
the process moves its startup objects out of the cyclic GC's sight (``gc.freeze()``, as
the node and the latency part's consumer do): its full collections then walk only what
came later (5-7 a run, ~45 ms in all before, ~15 ms after). ``--no-freeze`` leaves it
out. Its one line of output is a JSON object (rows, duplicates, batches, seconds,
connect seconds, the read's CPU seconds, warnings).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from canal_client.connector import SimpleConnector

__all__ = ["Tally", "consume", "read_in_turn", "read_prefetched", "touch"]


def touch(batch: Any) -> int:
    """Values in a client batch, reading every value of every row image (as the zongji
    peer does: its rows are objects of column name -> value, ours value tuples with the
    entry's column names once)."""
    touched = 0
    for entry in batch.entries:
        images = entry.images
        if images is None:
            continue
        for image in images.before:
            for value in image:
                if value is not None:
                    touched += 1
        for image in images.after:
            for value in image:
                if value is not None:
                    touched += 1
    return touched


@dataclass
class Tally:
    """Rows received, told apart from redeliveries by the entry's binlog position."""

    rows: int = 0
    duplicate_rows: int = 0
    batches: int = 0
    seen: set[tuple[str, int]] = field(default_factory=set)

    def add(self, batch: Any) -> None:
        self.batches += 1
        for entry in batch.entries:
            key = (entry.header.logfile, entry.header.offset)
            if key in self.seen:
                self.duplicate_rows += entry.row_count
            else:
                self.seen.add(key)
                self.rows += entry.row_count
        touch(batch)


def read_prefetched(
    conn: Any, tally: Tally, rows: int, t0: float, batch_size: int, timeout_s: float
) -> float:
    """Read ``rows`` row changes through the connector's stream with prefetch (the next
    get in flight while a batch is read; acks on a later get); commit the last batch.
    Returns when the last row was read (the stream's close, which waits for the get in
    flight, a long poll with nothing left to read, is not timed)."""
    done_at = 0.0
    with conn.stream(batch_size, 1.0, prefetch=True) as batches:
        for batch in batches:
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"{tally.rows} of {rows} rows after {timeout_s}s")
            if not batch.is_empty:
                tally.add(batch)
            if tally.rows >= rows:
                done_at = time.perf_counter()
                batches.commit()
                break
    return done_at


def read_in_turn(
    conn: Any, tally: Tally, rows: int, t0: float, batch_size: int, timeout_s: float
) -> float:
    """Read ``rows`` row changes get after get, each get carrying the ack of the batch
    before; ack the last batch. Returns when the last row was read."""
    done: int | None = None
    while tally.rows < rows:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"{tally.rows} of {rows} rows after {timeout_s}s")
        batch = conn.get_without_ack(batch_size, 1.0, ack=done)
        done = None
        if not batch.is_empty:
            tally.add(batch)
            done = batch.id
    done_at = time.perf_counter()
    if done is not None:
        conn.ack(done)
    return done_at


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def consume(
    url: str,
    destination: str,
    client_id: str,
    *,
    wire: str,
    rows: int,
    batch_size: int,
    timeout_s: float,
    prefetch: bool,
    warnings: list[str],
) -> dict[str, Any]:
    """Connect, subscribe from the earliest position, read ``rows`` row changes; timed
    from the connector's creation. ``warnings``: where the caller collects the client's
    warnings meanwhile (counted in the result)."""
    tally = Tally()
    read = read_prefetched if prefetch else read_in_turn
    t0 = time.perf_counter()
    with SimpleConnector(url, destination, client_id, wire=wire) as conn:
        conn.subscribe(start="earliest")  # the dataset was written before: from its start
        connected_s = time.perf_counter() - t0
        cpu0 = time.process_time()
        done_at = read(conn, tally, rows, t0, batch_size, timeout_s)
        cpu_s = time.process_time() - cpu0
    return {
        "rows": tally.rows, "duplicate_rows": tally.duplicate_rows, "batches": tally.batches,
        "seconds": done_at - t0, "client_connect_s": connected_s, "cpu_s": round(cpu_s, 3),
        "client_warnings": len(warnings), "first_client_warnings": warnings[:3],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--url", required=True, help="a node's base URL")
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--wire", choices=("msgpack", "json"), default="msgpack")
    p.add_argument("--rows", type=int, required=True, help="row changes to read")
    p.add_argument("--batch-size", type=int, default=1000, help="entries per get")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="give up after (s)")
    p.add_argument("--prefetch", action="store_true", help="Connector.stream(prefetch=True)")
    p.add_argument("--no-freeze", dest="freeze", action="store_false", help="leave out gc.freeze()")
    args = p.parse_args(argv)
    if args.freeze:  # the client is imported: its objects join the frozen ones
        gc.collect()
        gc.freeze()
    warnings = _Count()
    logging.getLogger("canal_client").addHandler(warnings)
    logging.getLogger("canal_client").setLevel(logging.WARNING)
    got = consume(
        args.url, args.destination, args.client_id, wire=args.wire, rows=args.rows,
        batch_size=args.batch_size, timeout_s=args.timeout_s, prefetch=args.prefetch,
        warnings=warnings.messages,
    )  # fmt: skip
    print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
