"""`canal-ha server --config FILE`: one server node (etcd election + REST API on uvicorn).

Only argument parsing lives here; the server's dependencies are imported when the
command runs (``canal_server.serve``), so other commands never load them.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
from pathlib import Path

__all__ = ["register", "server"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("server", help="run one server node")
    p.add_argument("--config", type=Path, required=True, help="TOML config file")
    p.set_defaults(func=server)


def server(args: argparse.Namespace) -> int:
    from canal_server.config import load_config
    from canal_server.log_limit import install_log_limit
    from canal_server.secrets import install_log_redaction
    from canal_server.serve import run_node

    config = load_config(args.config)  # ConfigError → exit 2 naming the key
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack to the log
    root = logging.getLogger()
    if root.level > logging.INFO:
        root.setLevel(logging.INFO)
    install_log_redaction(root)  # a last guard: no secret of the config in the log
    install_log_limit(root)  # no cause (a client's bad requests) writes more than a few lines
    return run_node(config)
