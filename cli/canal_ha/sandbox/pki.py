"""Certificates made with Debian's ``openssl``: a CA and the pairs it signs.

``make_ca(dir, name)`` writes ``name.crt`` and ``name.key``; ``issue(dir, name, ca, cn,
san)`` a key and a certificate the CA signs for both TLS ends (serverAuth and
clientAuth), with ``san`` as its subjectAltName (``IP:127.0.0.1,DNS:localhost``). Keys
(EC P-256) are written 0600, certificates 0644. A pair already there is kept (run again,
nothing changes), so a workdir's certificates outlive ``down`` and ``up``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from canal_protocol.errors import SandboxStartError

__all__ = ["DEFAULT_DAYS", "Pair", "issue", "make_ca"]

DEFAULT_DAYS = 365
_OPENSSL_TIMEOUT_S = 60
_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key."""

    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise SandboxStartError("openssl", "not installed (run scripts/setup.sh)")
    res = subprocess.run(
        [exe, *args], cwd=cwd, capture_output=True, text=True, timeout=_OPENSSL_TIMEOUT_S
    )
    if res.returncode != 0:
        raise SandboxStartError(f"openssl {args[0]}", res.stderr.strip()[-400:] or "failed")


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def make_ca(root: Path, name: str, days: int = DEFAULT_DAYS) -> Pair:
    """A self-signed CA ``root/name.crt`` (CN ``name``) with its key."""
    pair = Pair(root / f"{name}.crt", root / f"{name}.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    root.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_EC, "-keyout", pair.key.name, "-out", pair.cert.name,
             "-days", str(days), "-subj", f"/CN={name}", cwd=root)  # fmt: skip
    _private(pair.key)
    return pair


def issue(root: Path, name: str, ca: Pair, cn: str, san: str, days: int = DEFAULT_DAYS) -> Pair:
    """``root/name.crt`` and ``.key``: CN ``cn``, subjectAltName ``san``, signed by ``ca``."""
    pair = Pair(root / f"{name}.crt", root / f"{name}.key")
    if pair.cert.exists() and pair.key.exists():
        return pair
    root.mkdir(parents=True, exist_ok=True)
    csr, ext = root / f"{name}.csr", root / f"{name}.ext"
    _openssl("req", *_EC, "-keyout", pair.key.name, "-out", csr.name, "-subj", f"/CN={cn}",
             cwd=root)  # fmt: skip
    _private(pair.key)
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("x509", "-req", "-in", csr.name, "-CA", str(ca.cert), "-CAkey", str(ca.key),
             "-CAcreateserial", "-out", pair.cert.name, "-days", str(days),
             "-extfile", ext.name, cwd=root)  # fmt: skip
    csr.unlink()
    ext.unlink()
    return pair
