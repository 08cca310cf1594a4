"""TLS for the sandbox's servers: certificates the caller made (tests use openssl).

With ``ServerTls`` the sandbox's etcd serves ``https://`` (and with
``require_client_cert`` checks client certificates: etcd's ``--client-cert-auth``), and
its MariaDB servers offer TLS and refuse TCP connections without it
(``require_secure_transport=ON``; the root account keeps the unix socket). The
sandbox's own probes (etcd's ``/health``) present ``client_cert_file`` when set.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ServerTls"]


@dataclass(frozen=True)
class ServerTls:
    """A CA, the servers' certificate and key (for 127.0.0.1), the probes' client pair."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    require_client_cert: bool = False

    def client_context(self) -> ssl.SSLContext:
        """What the sandbox's own probes use: trust the CA, present the client pair."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_cert_file is not None:
            ctx.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return ctx

    def to_json(self) -> dict[str, Any]:
        return {
            "ca_file": str(self.ca_file),
            "cert_file": str(self.cert_file),
            "key_file": str(self.key_file),
            "client_cert_file": str(self.client_cert_file) if self.client_cert_file else None,
            "client_key_file": str(self.client_key_file) if self.client_key_file else None,
            "require_client_cert": self.require_client_cert,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ServerTls | None:
        if not data:
            return None
        client_cert, client_key = data.get("client_cert_file"), data.get("client_key_file")
        return cls(
            Path(data["ca_file"]), Path(data["cert_file"]), Path(data["key_file"]),
            Path(client_cert) if client_cert else None,
            Path(client_key) if client_key else None,
            bool(data.get("require_client_cert", False)),
        )  # fmt: skip
