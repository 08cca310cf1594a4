"""Certificates and etcd users for the TLS and credential tests, made with the package's
own tools (``canal_ha.sandbox.pki``: openssl; ``canal_ha.etcd_users``: etcd's Auth API),
the ones ``canal-ha up --secure`` uses.

``make_pki(dir)`` writes a CA, a server certificate for 127.0.0.1/localhost, client
certificates (``client``: CN canal-node; ``root``: CN root, etcd's admin under
``--client-cert-auth``; ``db``: CN canal, for MariaDB's REQUIRE X509) and a second CA
with a ``rogue`` client certificate etcd must refuse. ``server_tls(pki)`` is the
sandbox's ``ServerTls``; ``enable_etcd_auth`` adds a root user, a role limited to a
prefix and a user holding it, then turns auth on. ``run_cli`` runs ``canal-ha`` with the
``ETCD*`` variables of the environment removed (etcdctl's, which would leak into the test).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from canal_ha.etcd_users import AuthTls, EtcdUser, Permission, enable_auth
from canal_ha.sandbox import EtcdCluster, ServerTls
from canal_ha.sandbox.pki import Pair, issue, make_ca

__all__ = ["Pair", "Pki", "enable_etcd_auth", "make_pki", "run_cli", "server_tls"]

ROOT_PASSWORD = "root-pw-for-tests"
DAYS = 3


@dataclass(frozen=True)
class Pki:
    ca: Path
    server: Pair
    client: Pair  # CN canal-node
    root: Pair  # CN root
    db: Pair  # CN canal
    other_ca: Path
    rogue: Pair  # CN canal-node, signed by other_ca


def make_pki(root: Path) -> Pki:
    ca = make_ca(root, "ca", DAYS)
    other = make_ca(root, "other-ca", DAYS)
    return Pki(
        ca=ca.cert,
        server=issue(root, "server", ca, "localhost", "IP:127.0.0.1,DNS:localhost", DAYS),
        client=issue(root, "client", ca, "canal-node", "DNS:canal-node", DAYS),
        root=issue(root, "root", ca, "root", "DNS:root", DAYS),
        db=issue(root, "db", ca, "canal", "DNS:canal", DAYS),
        other_ca=other.cert,
        rogue=issue(root, "rogue", other, "canal-node", "DNS:canal-node", DAYS),
    )


def server_tls(pki: Pki, require_client_cert: bool = True) -> ServerTls:
    return ServerTls(
        pki.ca, pki.server.cert, pki.server.key, pki.root.cert, pki.root.key, require_client_cert
    )


def enable_etcd_auth(
    cluster: EtcdCluster, pki: Pki, users: dict[str, tuple[str, list[tuple[Permission, str]]]]
) -> None:
    """``users``: name → (password, [(read|write|readwrite, key prefix)] its role
    ``name-role`` holds); a root user; then auth on, as the root certificate."""
    every = [EtcdUser("root", ROOT_PASSWORD, "root")] + [
        EtcdUser(name, password, f"{name}-role", tuple(permissions))
        for name, (password, permissions) in users.items()
    ]
    tls = AuthTls(pki.ca, pki.root.cert, pki.root.key)
    enable_auth(cluster.endpoints[0], tls, every)


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``canal-ha ARGS`` with ``env`` added and every ``ETCD*`` variable removed, bounded."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    return subprocess.run(
        [sys.executable, "-m", "canal_ha.cli", *args], capture_output=True, text=True,
        timeout=timeout_s, env={**base, **env},
    )  # fmt: skip
