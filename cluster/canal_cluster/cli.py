"""The `canal-ha` command line: argument parsing and dispatch, one function per command.

Exit codes (API.md): 0 success, 2 bad usage or config (one-line reason), 1 runtime failure.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from canal_cluster.errors import CanalError, ConfigError, SandboxStateError

__all__ = ["build_parser", "main", "positive_int"]

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be >= 0, not {value}")
        return value

    return parse


# Each module registers its subcommands: ``register(sub)`` adds parsers whose
# ``func`` default is the handler ``(args) -> exit code``. Modules are imported lazily
# so `canal-ha consume` never imports the server's dependencies.
COMMAND_MODULES = (
    "canal_cluster.sandbox_cli",
    "canal_server.server_cli",
    "canal_client.consume_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="canal-ha", description="canal-ha: a change-data-capture cluster for MySQL/MariaDB"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = args.func
    return handler(args)


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
    except BrokenPipeError:  # `canal-ha status | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
