"""The `canal-ha` command line: argument parsing and dispatch, one function per command.

Exit codes (API.md): 0 success, 2 bad usage or config (one-line reason), 1 runtime failure.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from canal_cluster.errors import CanalError, ConfigError, SandboxStateError

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
DEFAULT_WORKDIR = Path(".canal-ha")


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be >= 0, not {value}")
        return value

    return parse


def _add_up(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="start the embedded sandbox (MariaDB, etcd, server nodes)")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="state and logs")
    p.add_argument("--nodes", type=_positive("--nodes"), default=3, help="server nodes")
    p.add_argument("--etcd-members", type=int, choices=(1, 3), default=1)
    p.add_argument("--standby", action="store_true", help="also start a GTID replica")
    p.add_argument("--detach", action="store_true", help="return once everything is up")


def _add_down(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("down", help="stop what `up` started in a workdir, by pid")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="sandbox + a writer + a live binlog line; Ctrl-C stops")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--rate", type=_positive("--rate"), default=2000, help="rows/s to write")
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds (0 = never)")
    p.add_argument("--standby", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="canal-ha", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_up(sub)
    _add_down(sub)
    _add_demo(sub)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    from canal_cluster import sandbox_cli

    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "up": sandbox_cli.up,
        "down": sandbox_cli.down,
        "demo": sandbox_cli.demo,
    }
    return commands[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _dispatch(args)
    except (ConfigError, SandboxStateError) as exc:
        print(f"canal-ha {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CanalError as exc:
        print(f"canal-ha {args.command}: {exc}", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
