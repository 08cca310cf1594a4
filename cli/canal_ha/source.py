"""Where a command finds the cluster: one set of options and one leader lookup.

Every command that talks to a running cluster (``consume``, ``status``, ``step-down``,
``snapshot``) takes the same source options: ``--etcd`` endpoints (with ``--prefix`` and
the TLS and user options of a secured etcd: ``--etcd-cacert``, ``--etcd-cert``,
``--etcd-key``, ``--etcd-user``, the password from ``$CANAL_ETCD_PASSWORD`` or
``--etcd-password-file``, never on the command line) or ``--server`` node URLs, and a
bearer token (``--token``, ``--token-file`` or ``$CANAL_TOKEN``). ``leader_url`` is the
one way a command finds a destination's leader: its running key in etcd, or a node URL
(which answers 307 to the leader).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from canal_client.resolver import normalize_url
from canal_cluster.keys import DEFAULT_PREFIX, Keys
from canal_protocol.errors import ConfigError, LeaderUnavailable

__all__ = [
    "ETCD_PASSWORD_ENV",
    "TOKEN_ENV",
    "add_source_options",
    "coordinator",
    "etcd_security",
    "leader_url",
    "token",
]

TOKEN_ENV = "CANAL_TOKEN"
ETCD_PASSWORD_ENV = "CANAL_ETCD_PASSWORD"
_ETCD_LABELS = {
    "endpoints": "--etcd",
    "ca_file": "--etcd-cacert",
    "cert_file": "--etcd-cert",
    "key_file": "--etcd-key",
    "username": "--etcd-user",
    "password": f"${ETCD_PASSWORD_ENV} / --etcd-password-file",
}


def _urls(option: str, etcd: bool) -> Any:
    """argparse type: comma-separated URLs, each checked (scheme, port 1-65535)."""

    def parse(text: str) -> list[str]:
        urls = [e.strip() for e in text.split(",") if e.strip()]
        for url in urls:
            full = url if "//" in url or not etcd else f"http://{url}"
            try:
                normalize_url(full, option)
            except ConfigError as exc:
                raise argparse.ArgumentTypeError(exc.reason) from None
            if etcd and not full.startswith(("http://", "https://")):
                raise argparse.ArgumentTypeError(f"expected http(s)://host:port, got {url!r}")
        return urls

    return parse


def add_source_options(p: argparse.ArgumentParser, server_help: str = "") -> None:
    """``--etcd`` or ``--server`` (one is required), ``--prefix``, ``--token`` and the
    options of a secured etcd."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--etcd", type=_urls("--etcd", etcd=True),
                     help="etcd endpoints, comma separated")  # fmt: skip
    src.add_argument("--server", type=_urls("--server", etcd=False),
                     help=server_help or "server URL(s), comma separated")  # fmt: skip
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="etcd key prefix")
    p.add_argument("--token", default=None, help=f"bearer token (default: ${TOKEN_ENV})")
    p.add_argument("--token-file", default="", help="file holding the bearer token")
    p.add_argument("--etcd-cacert", default="", help="CA of etcd's certificate (https://)")
    p.add_argument("--etcd-cert", default="", help="TLS client certificate for etcd")
    p.add_argument("--etcd-key", default="", help="its key")
    p.add_argument("--etcd-user", default="", help="etcd user (password: "
                   f"${ETCD_PASSWORD_ENV} or --etcd-password-file)")  # fmt: skip
    p.add_argument("--etcd-password-file", default="", help="file holding the etcd password")


def token(args: argparse.Namespace) -> str | None:
    """The bearer token: ``--token``, else ``--token-file``'s content (one trailing
    newline off), else ``$CANAL_TOKEN``, else none."""
    if args.token:
        return str(args.token)
    if args.token_file:
        return _read_secret("--token-file", args.token_file) or None
    return os.environ.get(TOKEN_ENV) or None


def _read_secret(option: str, path: str) -> str:
    try:
        return Path(path).read_text().removesuffix("\n")
    except OSError as exc:
        raise ConfigError(option, f"cannot read it: {exc.strerror}") from None


def etcd_security(args: argparse.Namespace) -> Any:
    """The ``EtcdSecurity`` of the ``--etcd-*`` options (None when none is given)."""
    password = os.environ.get(ETCD_PASSWORD_ENV, "")
    if args.etcd_password_file:
        password = _read_secret("--etcd-password-file", args.etcd_password_file)
    if not (args.etcd_cacert or args.etcd_cert or args.etcd_key or args.etcd_user):
        return None
    from canal_cluster.etcd_security import EtcdSecurity

    return EtcdSecurity(
        args.etcd_cacert, args.etcd_cert, args.etcd_key, args.etcd_user,
        password if args.etcd_user else "", labels=_ETCD_LABELS,
    )  # fmt: skip


@contextlib.contextmanager
def coordinator(args: argparse.Namespace) -> Iterator[Any]:
    """An ``EtcdCoordinator`` on ``--etcd`` with the command's security, closed after."""
    from canal_cluster.etcd_coordinator import EtcdCoordinator

    coord = EtcdCoordinator(args.etcd, timeout_s=2.0, security=etcd_security(args))
    try:
        yield coord
    finally:
        coord.close()


def leader_url(args: argparse.Namespace, attempt: int = 0) -> str:
    """Where to send a destination's request: with ``--etcd`` its leader's URL from the
    running key (``LeaderUnavailable`` saying whether no node leads it right now or
    none configures it); with ``--server`` the URLs in turn, ``attempt`` picking one (a
    standby answers 307 to the leader)."""
    if args.server:
        return str(args.server[attempt % len(args.server)]).rstrip("/")
    from canal_cluster.running import read_running

    keys = Keys(args.prefix)
    with coordinator(args) as coord:
        info = read_running(coord, keys.running(args.destination))
        if info is not None and info.url:
            return info.url.rstrip("/")
        nodes = coord.get_prefix(keys.destination_nodes_prefix(args.destination)).items
    what = "no leader right now" if nodes else "no node configures it"
    raise LeaderUnavailable(f"{args.destination}: {what} (etcd {','.join(args.etcd)})")
