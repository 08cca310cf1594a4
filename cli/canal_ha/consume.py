"""`canal-ha consume` and `canal-ha status`.

``consume`` follows the leader (``--etcd``: by the running key, with the
ClientRunningMonitor so one process per client id consumes; ``--server``: one URL or a
comma-separated list, following 307), prints each entry (JSON Lines with ``--format
json``: the entry's wire form; else one readable line) and acks each batch after
printing and flushing it: with the next get (its ``ack``, one round trip less), or on
its own when it stops. It exits 0 after ``--max-entries`` entries or ``--idle-exit``
seconds without entries; SIGTERM and Ctrl-C stop it cleanly (the last printed batch is
acked, within ``STOP_ACK_S``; the batch being printed is not acked and comes again).
Leader changes it follows are logged on stderr.

Bounded waits: no leader reached within ``--connect-timeout`` seconds (etcd or the
server not reachable, no leader elected) ends it with exit 1 naming what was missing;
an unknown destination fails at once. Once a leader was reached it retries through
failovers, but ``--idle-exit`` still ends it: with exit 1 when the time ran out while
no leader answered (a consumer that never saw the database idle does not claim it).

A secured etcd (both commands): ``https://`` endpoints with ``--etcd-cacert``,
``--etcd-cert``/``--etcd-key`` and ``--etcd-user`` (the password from
``$CANAL_ETCD_PASSWORD`` or ``--etcd-password-file``, never on the command line); etcd
refusing them ends the command at once with exit 1 naming the option.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_client.status import (
    fetch_health,
    format_table,
    status_from_etcd,
    status_from_server,
)
from canal_client.wire import HttpChannel
from canal_cluster.keys import Keys
from canal_cluster.running import ElectionConfig
from canal_ha.args import positive_int
from canal_ha.source import add_source_options, coordinator, etcd_security, token
from canal_protocol import Batch, Column, Entry, EntryType, EventType
from canal_protocol.errors import CanalError, ConfigError, RetryExhausted

__all__ = ["consume", "format_entry", "register", "status"]

DEFAULT_CONNECT_TIMEOUT_S = 30.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`consume` and `status`."""
    p = sub.add_parser("consume", help="follow the leader and print each entry, ack per batch")
    add_source_options(p)
    p.add_argument("--destination", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--batch-size", type=positive_int("--batch-size"), default=1000)
    p.add_argument("--filter", default="", help="schema.table regex (Canal's filter)")
    p.add_argument("--start", choices=("latest", "earliest"), default="latest",
                   help="where a NEW client id starts: latest = only changes after it "
                   "subscribed, earliest = the oldest change the destination still holds; "
                   "a client id already subscribed resumes from its cursor")  # fmt: skip
    p.add_argument("--format", choices=("json", "text"), default="text")
    p.add_argument("--max-entries", type=positive_int("--max-entries"), default=0,
                   help="exit 0 after N entries (0 = never)")  # fmt: skip
    p.add_argument("--idle-exit", type=float, default=0.0,
                   help="exit 0 after S seconds without entries (0 = never)")  # fmt: skip
    p.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                   help="give up (exit 1) when no leader was reached in S seconds "
                        f"(default {DEFAULT_CONNECT_TIMEOUT_S:g})")  # fmt: skip
    p.add_argument("--wire", choices=("msgpack", "json"), default="msgpack")
    p.add_argument("--no-exclusive", action="store_true",
                   help="with --etcd: do not take the client running key")  # fmt: skip
    p.add_argument("--client-ttl", type=float, default=10.0, help="client running key TTL (s)")
    p.add_argument("--switch-delay", type=float, default=5.0,
                   help="wait before taking over from a vanished consumer (s)")  # fmt: skip
    p.add_argument("--poll-timeout", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=consume)

    p = sub.add_parser("status", help="nodes, leaders, epochs, each client's cursor and lag")
    add_source_options(p)
    p.add_argument("--format", choices=("json", "table"), default="table")
    p.set_defaults(func=status)


# -- consume ------------------------------------------------------------------------------


def _election(args: argparse.Namespace) -> ElectionConfig:
    ttl = args.client_ttl
    if ttl <= 0 or args.switch_delay < 0:
        raise ConfigError("--client-ttl", "must be > 0 (and --switch-delay >= 0)")
    margin = min(2.0, ttl / 4)
    return ElectionConfig(
        ttl_s=ttl,
        safety_margin_s=margin,
        loop_interval_s=min(1.0, ttl / 10),
        switch_delay_s=args.switch_delay,
    )


def _connect_bound(args: argparse.Namespace) -> tuple[float, str]:
    """How long the first contact may take, and the option that says so."""
    if args.idle_exit and args.idle_exit < args.connect_timeout:
        return args.idle_exit, "--idle-exit"
    return args.connect_timeout, "--connect-timeout"


def _connector(args: argparse.Namespace) -> Connector:
    common: dict[str, Any] = {
        "token": token(args), "wire": args.wire, "connect_timeout_s": _connect_bound(args)[0],
    }  # fmt: skip
    if args.etcd:
        return ClusterConnector(
            args.destination, args.client_id, etcd=args.etcd, prefix=args.prefix,
            exclusive=not args.no_exclusive, election=_election(args),
            etcd_timeout_s=min(2.0, args.client_ttl / 5), etcd_security=etcd_security(args),
            **common,
        )  # fmt: skip
    if len(args.server) == 1:
        return SimpleConnector(args.server[0], args.destination, args.client_id, **common)
    return ClusterConnector(args.destination, args.client_id, servers=args.server, **common)


def _value_text(c: Column) -> str:
    if c.is_null or c.value is None:
        return f"{c.name}=NULL"
    if isinstance(c.value, bytes):
        return f"{c.name}=0x{c.value.hex()}"
    return f"{c.name}={c.value!r}" if isinstance(c.value, str) else f"{c.name}={c.value}"


def format_entry(entry: Entry, fmt: str) -> str:
    """One line: the JSON wire form (``json``) or a readable line (``text``)."""
    if fmt == "json":
        return json.dumps(entry.to_json_wire(), ensure_ascii=False, separators=(",", ":"))
    h = entry.header
    when = datetime.datetime.fromtimestamp(h.timestamp_ms / 1000, datetime.UTC)
    snap = f"+r{h.snapshot}" if h.snapshot else ""
    head = f"{when.isoformat(timespec='milliseconds')} {h.logfile}:{h.offset}{snap}"
    if h.event_type is EventType.READ and entry.type is not EntryType.ROWDATA:
        word = "BEGIN" if entry.type is EntryType.TRANSACTIONBEGIN else "COMMIT"
        return f"{head} {word} snapshot chunk of {entry.full_name}"
    if entry.type is EntryType.TRANSACTIONBEGIN:
        return f"{head} BEGIN gtid={h.gtid}"
    if entry.type is EntryType.TRANSACTIONEND:
        return f"{head} COMMIT gtid={h.gtid}"
    if entry.is_ddl or not entry.rows:  # a schema-level statement has no table
        name = f"{h.schema}.{h.table}" if h.table else h.schema or "-"
        return f"{head} {h.event_type} {name}: {entry.sql}"
    rows = []
    for r in entry.rows:
        before = ", ".join(_value_text(c) for c in r.before)
        after = ", ".join(_value_text(c) for c in r.after)
        rows.append(f"[{before}] -> [{after}]" if before and after else f"[{before or after}]")
    return f"{head} {h.event_type} {entry.full_name} {' | '.join(rows)}"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


STOP_ACK_S = 2.0  # after Ctrl-C/SIGTERM: the last printed batch's ack, at most this long


class _Printer:
    """Prints batches and counts entries against --max-entries."""

    def __init__(self, out: TextIO, fmt: str, max_entries: int) -> None:
        self.out, self.fmt, self.max = out, fmt, max_entries
        self.printed = 0

    def room(self, batch_size: int) -> int:
        return batch_size if not self.max else min(batch_size, self.max - self.printed)

    def print_batch(self, batch: Batch) -> bool:
        """Print what fits; True when the whole batch was printed."""
        take = batch.entries if not self.max else batch.entries[: self.max - self.printed]
        self.out.write("".join(format_entry(e, self.fmt) + "\n" for e in take))
        self.out.flush()
        self.printed += len(take)
        return len(take) == len(batch.entries)

    @property
    def done(self) -> bool:
        return bool(self.max) and self.printed >= self.max


def consume(args: argparse.Namespace) -> int:
    client_log = logging.getLogger("canal_client")
    if client_log.getEffectiveLevel() > logging.INFO:
        client_log.setLevel(logging.INFO)  # leader changes followed go to stderr
    if args.idle_exit < 0 or args.poll_timeout <= 0:
        raise ConfigError("--idle-exit", "must be >= 0")
    if args.connect_timeout <= 0:
        raise ConfigError("--connect-timeout", "must be > 0")
    printer = _Printer(sys.stdout, args.format, args.max_entries)
    connector = _connector(args)
    with _sigterm_as_interrupt(), contextlib.suppress(KeyboardInterrupt):
        try:
            with _gave_up_after(args, connector):
                connector.connect()
                _set_idle_deadline(connector, args, time.monotonic())
                connector.subscribe(args.filter, start=args.start)
            _consume_loop(connector, printer, args)
        except BrokenPipeError:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout is gone
        finally:
            connector.disconnect()
    return 0


@contextlib.contextmanager
def _gave_up_after(args: argparse.Namespace, connector: Connector) -> Iterator[None]:
    """A call that gave up (connect timeout, --idle-exit while no leader answers) becomes
    one message naming the option; the caller exits 1."""
    try:
        yield
    except RetryExhausted as exc:
        if not connector.reached:
            what = f"{exc.what} ({_connect_bound(args)[1]})"
        else:
            idle = f"no entries for {args.idle_exit:g} s (--idle-exit)"
            what = f"{exc.what}: {idle} while no leader answered"
        raise RetryExhausted(what, exc.attempts, exc.last_error) from exc


def _set_idle_deadline(connector: Connector, args: argparse.Namespace, last: float) -> None:
    if args.idle_exit:
        connector.set_deadline(last + args.idle_exit)


def _consume_loop(connector: Connector, printer: _Printer, args: argparse.Namespace) -> None:
    """Print batches; each printed batch is acked by the next get, the last one on its
    own when the loop ends (bounded by ``STOP_ACK_S`` after Ctrl-C or SIGTERM)."""
    printed: list[int] = []  # the last printed batch not acked yet (0 or 1 id)
    try:
        _print_batches(connector, printer, args, printed)
    except KeyboardInterrupt:
        if printed:
            connector.set_deadline(time.monotonic() + STOP_ACK_S)
            with contextlib.suppress(CanalError):  # not acked: it comes again
                connector.ack(printed[0])
        raise
    if printed:
        with _gave_up_after(args, connector):
            connector.ack(printed.pop())


def _print_batches(
    connector: Connector, printer: _Printer, args: argparse.Namespace, printed: list[int]
) -> None:
    last = time.monotonic()
    _set_idle_deadline(connector, args, last)
    while not printer.done:
        poll = args.poll_timeout
        if args.idle_exit:
            poll = max(0.05, min(poll, last + args.idle_exit - time.monotonic()))
        ack = printed[0] if printed else None
        with _gave_up_after(args, connector):
            batch = connector.get_without_ack(printer.room(args.batch_size), poll, ack=ack)
        printed.clear()  # acked by that get
        if batch.is_empty:
            if args.idle_exit and time.monotonic() - last >= args.idle_exit:
                return
            continue
        last = time.monotonic()
        _set_idle_deadline(connector, args, last)
        if printer.print_batch(batch):
            printed.append(batch.id)
        else:
            with _gave_up_after(args, connector):
                connector.rollback(batch.id)  # the rest comes again to the next consumer


# -- status -------------------------------------------------------------------------------


def status(args: argparse.Namespace) -> int:
    channel = HttpChannel(wire="json", token=token(args))
    try:
        if args.etcd:
            with coordinator(args) as coord:
                data = status_from_etcd(coord, Keys(args.prefix), fetch_health(channel))
        else:
            data = status_from_server(channel, args.server[0].rstrip("/"))
    finally:
        channel.close()
    if args.format == "json":
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        format_table(data)
    return 0
