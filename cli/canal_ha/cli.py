"""The `canal-ha` command line: argument parsing and dispatch, one function per command.

Exit codes (docs/api.md): 0 success, 2 bad usage or config (one-line reason; etcd
refusing our certificate, user or role too), 1 runtime failure. Each command module
registers its subcommands; the heavy dependencies (the server's, the sandbox's) are
imported when a command runs, so `canal-ha consume` works
with the base install. A command whose extra is not installed exits 2 with the pip
command that installs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from canal_ha import consume, sandbox_cli, server_cli, snapshot_cli, step_down
from canal_ha.args import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from canal_protocol.errors import (
    CanalError,
    ConfigError,
    CoordinatorAccessDenied,
    SandboxStateError,
)

__all__ = ["build_parser", "main"]

# The third-party modules each extra brings: a command that needs a missing one says
# which extra to install.
EXTRAS = {
    "server": ("fastapi", "uvicorn", "pydantic", "pymysql", "pymysqlreplication", "MySQLdb"),
    "spark": ("pyspark", "pyarrow"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="canal-ha", description="canal-ha: a change-data-capture cluster for MySQL/MariaDB"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (sandbox_cli, server_cli, consume, snapshot_cli, step_down):
        module.register(sub)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = args.func
    return handler(args)


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra that would bring the module ``exc`` misses, if it is one of ours."""
    top = (exc.name or "").split(".")[0]
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _dispatch(args)
    except (ConfigError, SandboxStateError, CoordinatorAccessDenied) as exc:
        print(f"canal-ha {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CanalError as exc:
        print(f"canal-ha {args.command}: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        print(
            f"canal-ha {args.command}: needs the '{extra}' extra ({exc.name} is not installed);"
            f" install it with: pip install 'canal-ha[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except BrokenPipeError:  # `canal-ha status | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
