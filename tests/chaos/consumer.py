"""The chaos consumer: a ClusterConnector loop that logs what it receives and acks.

Run as a process (so a scenario can SIGKILL it)::

    python tests/chaos/consumer.py --etcd URL[,URL] --prefix P --destination D \
        --client-id C --tag T --out FILE [--stall-after N] [--ack-on-get]

For each non-empty batch it appends one JSON line ``{"ev": "batch", "seq", "t", "id",
"epoch", "url", "ch": [[table, k, op, v], ...]}`` (flushed) *before* acking, then
``{"ev": "ack", "seq", "t"}`` after the ack returned, unless the connector dropped it
(its entries come again). ``--ack-on-get`` acks each batch on the next get instead, as
``canal-ha consume`` does (its ack line carries the time that get was sent). Only row
changes of the tables ``{tag}_*`` are listed (``op`` I/U/D, R for the rows of an incremental
snapshot, ``v`` the after-image version, the before-image one for deletes). ``--stall-after
N``: after logging the N-th batch, never ack and write ``{"ev": "stalled"}`` (the scenario
then kills it); SIGUSR1 does the same after the next batch (the nemesis: a consumer killed
before its ack). SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from types import FrameType
from typing import IO, Any

from canal_client.connector import ClusterConnector
from canal_cluster.running import ElectionConfig
from canal_protocol import Batch, Column, EntryType

_OPS = {"INSERT": "I", "UPDATE": "U", "DELETE": "D", "READ": "R"}


def _value(cols: tuple[Column, ...], name: str) -> Any:
    for c in cols:
        if c.name == name:
            return c.value
    return None


def changes_of(batch: Batch, tag: str) -> list[list[Any]]:
    out: list[list[Any]] = []
    for e in batch.entries:
        h = e.header
        op = _OPS.get(h.event_type)
        if e.type is not EntryType.ROWDATA or op is None or not h.schema.startswith(tag):
            continue
        for r in e.rows:
            image = r.before if op == "D" else r.after
            out.append([f"{h.schema}.{h.table}", _value(image, "k"), op, _value(image, "v")])
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--etcd", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--client-ttl", type=float, default=2.0)
    p.add_argument("--switch-delay", type=float, default=0.5)
    p.add_argument("--stall-after", type=int, default=0)
    p.add_argument(
        "--ack-on-get", action="store_true", help="ack each batch on the next get (as consume)"
    )
    return p.parse_args(argv)


class _Stop(Exception):
    pass


_stall_next = False  # SIGUSR1: stall after logging the next batch


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _on_usr1(signum: int, frame: FrameType | None) -> None:
    global _stall_next
    _stall_next = True


def _write(out: IO[str], record: dict[str, Any]) -> None:
    out.write(json.dumps(record, separators=(",", ":")) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    election = ElectionConfig(
        ttl_s=args.client_ttl,
        safety_margin_s=args.client_ttl / 4,
        loop_interval_s=args.client_ttl / 8,
        switch_delay_s=args.switch_delay,
    )
    connector = ClusterConnector(
        args.destination, args.client_id, etcd=args.etcd.split(","), prefix=args.prefix,
        exclusive=True, election=election, etcd_timeout_s=0.5,
    )  # fmt: skip
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGUSR1, _on_usr1)
    seq = 0
    with open(args.out, "a", encoding="utf-8") as out:
        _write(out, {"ev": "start", "t": time.time()})
        try:
            connector.connect()
            # the load runs before the first consumer subscribes: from the destination's
            # oldest held change (a new subscription starts at the end by default)
            connector.subscribe("", start="earliest")
            pending: int | None = None  # --ack-on-get: the batch the next get acks
            while True:
                sent = time.time()
                batch = connector.get_without_ack(args.batch_size, 1.0, ack=pending)
                if pending is not None and connector.last_ack_taken:
                    _write(out, {"ev": "ack", "seq": seq, "t": sent})  # at the send: earliest
                pending = None  # a dropped ack is no ack: its entries come again
                if batch.is_empty:
                    continue
                seq += 1
                _write(out, {
                    "ev": "batch", "seq": seq, "t": time.time(), "id": batch.id,
                    "epoch": connector.epoch, "url": connector.leader_url or "",
                    "ch": changes_of(batch, args.tag),
                })  # fmt: skip
                if _stall_next or (args.stall_after and seq >= args.stall_after):
                    _write(out, {"ev": "stalled", "t": time.time()})
                    while True:
                        time.sleep(3600)
                if args.ack_on_get:
                    pending = batch.id
                    continue
                if connector.ack(batch.id):  # a dropped ack is no ack: entries come again
                    _write(out, {"ev": "ack", "seq": seq, "t": time.time()})
        except _Stop:
            pass
        finally:
            connector.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
