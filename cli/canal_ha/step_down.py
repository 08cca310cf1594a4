"""`canal-ha step-down`: hand a destination over to another node (graceful handover).

Finds the destination's leader (``--etcd``: its running key; ``--server``: any node,
which answers 307 to the leader) and asks it ``POST /v1/destinations/{d}/step-down``:
the leader stops serving, flushes its meta a last time and names the successor
(``--to``, else the live node leading the fewest destinations), which takes over at
once. Prints ``d: node1 (epoch 12) -> node2 (epoch 15) in 84 ms`` and exits 0 once the
successor leads; exits 1 naming the cause when there is no leader, no node can take
it, or the successor does not lead within ``--timeout`` seconds; 2 for a bad option
(an unknown or unfit ``--to`` included).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx

from canal_ha.args import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from canal_ha.source import add_source_options, leader_url, token
from canal_protocol.errors import ConfigError, InvalidArgument
from canal_protocol.ids import validate_id

__all__ = ["register", "step_down"]

DEFAULT_TIMEOUT_S = 10.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "step-down", help="hand a destination over to another node (graceful handover)"
    )
    add_source_options(
        p, server_help="node URL(s), comma separated (a node redirects to the leader)"
    )
    p.add_argument("--destination", required=True)
    p.add_argument("--to", default=None, help="the node to hand over to (default: least loaded)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="wait this long for the successor to lead (s, "
                        f"default {DEFAULT_TIMEOUT_S:g})")  # fmt: skip
    p.set_defaults(func=step_down)


def _check(args: argparse.Namespace) -> None:
    try:
        validate_id(args.destination, "--destination")
        if args.to is not None:
            validate_id(args.to, "--to")
    except InvalidArgument as exc:
        raise ConfigError(exc.field, exc.reason) from None
    if not 0 < args.timeout <= 600:
        raise ConfigError("--timeout", f"must be > 0 and <= 600, got {args.timeout:g}")


def step_down(args: argparse.Namespace) -> int:
    _check(args)
    url = leader_url(args)
    bearer = token(args)
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    body: dict[str, Any] = {"timeout_ms": int(args.timeout * 1000)}
    if args.to is not None:
        body["to"] = args.to
    path = f"/v1/destinations/{args.destination}/step-down"
    try:
        with httpx.Client(headers=headers, timeout=args.timeout + 10) as http:
            r = http.post(f"{url}{path}", json=body, follow_redirects=True)
    except httpx.HTTPError as exc:
        print(f"canal-ha step-down: {url} did not answer: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    return _report(r)


def _report(r: httpx.Response) -> int:
    try:
        data = r.json()
    except ValueError:
        data = {"error": "http_error", "message": r.text[:200]}
    if r.status_code == 200:
        print(
            f"{data['destination']}: {data['from']} (epoch {data['epoch']}) -> {data['to']} "
            f"(epoch {data['new_epoch']}) in {data['took_ms']:.0f} ms"
        )
        return EXIT_OK
    message = f"{data.get('error', r.status_code)}: {data.get('message', '')}"
    if r.status_code == 400 and data.get("field") == "to":
        print(f"canal-ha step-down: --to: {message}", file=sys.stderr)
        return EXIT_USAGE
    print(f"canal-ha step-down: {r.status_code} {message}", file=sys.stderr)
    return EXIT_RUNTIME
