"""Certificates made here with Debian's ``openssl``, and etcd users and roles made with
``etcdctl``, for the TLS and credential tests.

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
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from canal_ha.sandbox import EtcdCluster, ServerTls

__all__ = ["Pair", "Pki", "enable_etcd_auth", "etcdctl", "make_pki", "run_cli", "server_tls"]

ROOT_PASSWORD = "root-pw-for-tests"
_OPENSSL_TIMEOUT_S = 60


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server: Pair
    client: Pair  # CN canal-node
    root: Pair  # CN root
    db: Pair  # CN canal
    other_ca: Path
    rogue: Pair  # CN canal-node, signed by other_ca


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    assert exe is not None, "openssl is installed (Debian)"
    subprocess.run(
        [exe, *args], cwd=cwd, check=True, capture_output=True, timeout=_OPENSSL_TIMEOUT_S
    )


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _ca(root: Path, name: str) -> Path:
    _openssl("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "3", "-subj", f"/CN={name}", cwd=root)  # fmt: skip
    return root / f"{name}.crt"


def _issue(root: Path, name: str, ca: str, cn: str, san: str) -> Pair:
    _openssl("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
             cwd=root)  # fmt: skip
    (root / f"{name}.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "3",
             "-extfile", f"{name}.ext", cwd=root)  # fmt: skip
    return Pair(root / f"{name}.crt", root / f"{name}.key")


def make_pki(root: Path) -> Pki:
    root.mkdir(parents=True, exist_ok=True)
    ca = _ca(root, "ca")
    other = _ca(root, "other-ca")
    return Pki(
        ca=ca,
        server=_issue(root, "server", "ca", "localhost", "IP:127.0.0.1,DNS:localhost"),
        client=_issue(root, "client", "ca", "canal-node", "DNS:canal-node"),
        root=_issue(root, "root", "ca", "root", "DNS:root"),
        db=_issue(root, "db", "ca", "canal", "DNS:canal"),
        other_ca=other,
        rogue=_issue(root, "rogue", "other-ca", "canal-node", "DNS:canal-node"),
    )


def server_tls(pki: Pki, require_client_cert: bool = True) -> ServerTls:
    return ServerTls(
        pki.ca, pki.server.cert, pki.server.key, pki.root.cert, pki.root.key, require_client_cert
    )


def etcdctl(cluster: EtcdCluster, pki: Pki, *args: str, user: str | None = None) -> str:
    """Run etcdctl against the cluster as the root certificate (and ``user``)."""
    exe = shutil.which("etcdctl")
    assert exe is not None, "etcdctl is installed (Debian's etcd-client)"
    argv = [exe, f"--endpoints={','.join(cluster.endpoints)}", f"--cacert={pki.ca}",
            f"--cert={pki.root.cert}", f"--key={pki.root.key}", "--dial-timeout=10s",
            "--command-timeout=20s"]  # fmt: skip
    if user is not None:
        argv.append(f"--user={user}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env["ETCDCTL_API"] = "3"
    res = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, f"etcdctl {' '.join(args)}: {res.stderr}"
    return res.stdout


def enable_etcd_auth(
    cluster: EtcdCluster, pki: Pki, users: dict[str, tuple[str, list[tuple[str, str]]]]
) -> None:
    """``users``: name → (password, [(read|write|readwrite, key prefix)] its role holds);
    then auth on (etcdctl's ``user add name:password`` form, as an operator would)."""
    etcdctl(cluster, pki, "user", "add", f"root:{ROOT_PASSWORD}")
    etcdctl(cluster, pki, "role", "add", "root")
    etcdctl(cluster, pki, "user", "grant-role", "root", "root")
    for name, (password, permissions) in users.items():
        etcdctl(cluster, pki, "role", "add", f"{name}-role")
        for permission, prefix in permissions:
            etcdctl(cluster, pki, "role", "grant-permission", f"{name}-role", "--prefix=true",
                    permission, prefix)  # fmt: skip
        etcdctl(cluster, pki, "user", "add", f"{name}:{password}")
        etcdctl(cluster, pki, "user", "grant-role", name, f"{name}-role")
    etcdctl(cluster, pki, "auth", "enable")


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``canal-ha ARGS`` with ``env`` added and every ``ETCD*`` variable removed, bounded."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    return subprocess.run(
        [sys.executable, "-m", "canal_ha.cli", *args], capture_output=True, text=True,
        timeout=timeout_s, env={**base, **env},
    )  # fmt: skip
