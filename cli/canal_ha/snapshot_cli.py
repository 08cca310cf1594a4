"""`canal-ha snapshot`: start an incremental snapshot and watch it, or show / cancel one.

::

    canal-ha snapshot (--etcd E | --server URL) --destination D --tables 'shop\\.orders' ...
    canal-ha snapshot (--etcd E | --server URL) --destination D [--show ID] [--cancel ID]

Starting prints the snapshot's id, then one progress line per ``--interval`` seconds
until it ends: exit 0 when it is done, 1 when it failed or was cancelled, or when
``--timeout`` seconds pass first (it says what it waited for; the snapshot goes on on
the server). ``--no-wait`` returns after starting. Bad input (a bad regex, an unknown
table, a table without a key, one already in a running snapshot) exits 2 with the
server's message naming the field. Without ``--tables`` it lists the destination's
snapshots (``--show ID``: one). The leader is found by etcd's running key (``--etcd``)
or by following the 307 of a server (``--server``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

from canal_client.wire import HttpChannel
from canal_ha.args import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, positive_int
from canal_ha.source import add_source_options, leader_url, token
from canal_protocol.errors import (
    ConfigError,
    InvalidArgument,
    LeaderUnavailable,
    ServerUnreachable,
)

__all__ = ["register", "snapshot"]

ENDED = ("done", "failed", "cancelled")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "snapshot", help="start an incremental snapshot of tables and watch its progress"
    )
    add_source_options(p)
    p.add_argument("--destination", required=True)
    p.add_argument("--tables", nargs="+", metavar="REGEX", help="schema.table regexes to start")
    p.add_argument("--chunk-rows", type=positive_int("--chunk-rows"), default=0)
    p.add_argument("--show", metavar="ID", help="one snapshot's progress")
    p.add_argument("--cancel", metavar="ID", help="cancel a snapshot")
    p.add_argument("--no-wait", action="store_true", help="return once it has started")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between progress lines")
    p.add_argument("--timeout", type=float, default=0.0, help="give up waiting after (s); 0: never")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=snapshot)


def progress_line(s: dict[str, Any]) -> str:
    """One line of a snapshot's progress."""
    return (
        f"{s['id']} {s['state']}: tables {s['tables_done']}/{s['tables_total']}, "
        f"{s['rows']:,} rows in {s['chunks']:,} chunks, {s['rows_per_s']:,.0f} rows/s"
        + (f" ({s['error']})" if s.get("error") else "")
    )


def snapshot(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.timeout < 0:
        raise ConfigError("--interval", "must be > 0 (and --timeout >= 0)")
    channel = HttpChannel(wire="json", token=token(args))
    base = f"/v1/destinations/{args.destination}/snapshots"
    try:
        url = leader_url(args)
        if args.cancel:
            body = channel.request("DELETE", url, f"{base}/{args.cancel}", follow_redirects=True)
            return _print(args, body.body)
        if args.show:
            body = channel.request("GET", url, f"{base}/{args.show}", follow_redirects=True)
            return _print(args, body.body)
        if not args.tables:
            body = channel.request("GET", url, base, follow_redirects=True)
            for s in (body.body or {}).get("snapshots", []):
                _print(args, s)
            return EXIT_OK
        request: dict[str, Any] = {"tables": list(args.tables)}
        if args.chunk_rows:
            request["chunk_rows"] = args.chunk_rows
        try:
            started = channel.request("POST", url, base, request, follow_redirects=True).body
        except InvalidArgument as exc:
            print(f"canal-ha snapshot: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _print(args, started)
        if args.no_wait:
            return EXIT_OK
        return _watch(args, channel, url, f"{base}/{started['id']}")
    finally:
        channel.close()


def _print(args: argparse.Namespace, s: dict[str, Any]) -> int:
    if args.format == "json":
        print(json.dumps(s, sort_keys=True), flush=True)
    else:
        print(progress_line(s), flush=True)
    return EXIT_OK if s.get("state") != "failed" else EXIT_RUNTIME


def _watch(args: argparse.Namespace, channel: HttpChannel, url: str, path: str) -> int:
    deadline = time.monotonic() + args.timeout if args.timeout else None
    attempt = 0
    while True:
        time.sleep(args.interval)
        if deadline is not None and time.monotonic() > deadline + args.interval:
            print(f"canal-ha snapshot: gave up after {args.timeout:g} s: no leader answered",
                  file=sys.stderr)  # fmt: skip
            return EXIT_RUNTIME
        try:
            s = channel.request("GET", url, path, follow_redirects=True).body
        except (LeaderUnavailable, ServerUnreachable):  # a failover: the next leader resumes
            attempt += 1
            with contextlib.suppress(LeaderUnavailable):
                url = leader_url(args, attempt)
            continue
        _print(args, s)
        if s["state"] in ENDED:
            return EXIT_OK if s["state"] == "done" else EXIT_RUNTIME
        if deadline is not None and time.monotonic() > deadline:
            print(
                f"canal-ha snapshot: gave up after {args.timeout:g} s waiting for "
                f"{s['id']} to finish ({s['state']}); it goes on on the server",
                file=sys.stderr,
            )
            return EXIT_RUNTIME
