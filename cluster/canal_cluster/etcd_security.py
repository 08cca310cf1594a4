"""TLS and users for etcd: what ``EtcdCoordinator`` needs for a secured cluster.

- ``EtcdSecurity``: the CA file, the client certificate and key, the user name and
  password (the node's ``etcd.*`` keys; the clients' options). ``https://`` endpoints
  use TLS, verified with ``ca_file`` (else the system's CAs); a client certificate is
  sent when ``cert_file``/``key_file`` are set (etcd's ``--client-cert-auth``). With a
  user name the coordinator asks etcd for a token (``Authenticate``) and sends it with
  every call and watch. ``labels`` says how errors name each setting (config keys for
  the node, option names for the command line and Spark).
- ``channel_credentials(security)``: gRPC credentials from the files; an unreadable
  file, a file that is no PEM certificate or key, or a key that does not match its
  certificate is a ``ConfigError`` naming the setting (checked with Python's ``ssl``).
- ``access_problem(exc, security)``: ``CoordinatorAccessDenied`` naming the setting to
  fix when a gRPC failure says etcd refuses us (a failed TLS handshake, a wrong user or
  password, a role without the permission), else None.
- ``invalid_token(exc)``: etcd no longer knows our token (it expired, or etcd
  restarted): authenticate again.

The password is never part of a message or a ``repr``.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from canal_protocol.errors import ConfigError, CoordinatorAccessDenied

__all__ = [
    "CONFIG_LABELS",
    "EtcdSecurity",
    "access_problem",
    "channel_credentials",
    "grpc_error_of",
    "invalid_token",
    "uses_tls",
]

# How the node's config names each setting (the default ``labels``).
CONFIG_LABELS: Mapping[str, str] = {
    "endpoints": "etcd.endpoints",
    "ca_file": "etcd.ca_file",
    "cert_file": "etcd.cert_file",
    "key_file": "etcd.key_file",
    "username": "etcd.username",
    "password": "etcd.password",
}

# Words of gRPC's TLS failures (BoringSSL/OpenSSL via grpc core) and what they mean.
_SERVER_NOT_TRUSTED = (
    "CERTIFICATE_VERIFY_FAILED",
    "Hostname Verification",
    "handshake failed",
    "WRONG_VERSION_NUMBER",
)
_CLIENT_REFUSED = (
    "TSI_DATA_CORRUPTED",
    "ALERT_BAD_CERTIFICATE",
    "ALERT_UNKNOWN_CA",
    "ALERT_CERTIFICATE_REQUIRED",
    "ALERT_HANDSHAKE_FAILURE",
    "ALERT_CERTIFICATE_UNKNOWN",
)


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach a secured etcd; all empty = plain gRPC, no user."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    labels: Mapping[str, str] = field(default_factory=lambda: dict(CONFIG_LABELS), compare=False)

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError(self.label("cert_file"), f"and {self.label('key_file')} go together")
        if bool(self.username) != bool(self.password):
            raise ConfigError(
                self.label("password" if self.username else "username"),
                f"{self.label('username')} and {self.label('password')} go together",
            )
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(self.label(name), f"no such file {path!r}")

    def label(self, name: str) -> str:
        return self.labels.get(name, name)

    @property
    def has_tls_files(self) -> bool:
        return bool(self.ca_file or self.cert_file)

    @property
    def who(self) -> str:
        """The identity etcd sees, for messages."""
        if self.username:
            return f"user {self.username!r}"
        if self.cert_file:
            return "the user named by the client certificate's CN"
        return "an anonymous client"


def uses_tls(endpoints: Sequence[str], security: EtcdSecurity) -> bool:
    """Whether the endpoints are ``https://`` (all or none); TLS files need https."""
    schemes = {urlsplit(e if "//" in e else f"http://{e}").scheme for e in endpoints}
    if len(schemes) > 1:
        raise ConfigError(security.label("endpoints"), "mixes http:// and https:// endpoints")
    tls = schemes == {"https"}
    if security.has_tls_files and not tls:
        name = "ca_file" if security.ca_file else "cert_file"
        raise ConfigError(
            security.label(name), "is set but the endpoints are http://: use https:// endpoints"
        )
    return tls


def _read(path: str, label: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(label, f"cannot read {path!r}: {exc.strerror or exc}") from None


def _check_pem(security: EtcdSecurity) -> None:
    """Load the files with Python's ssl: gRPC would only fail later, obscurely."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if security.ca_file:
        try:
            ctx.load_verify_locations(cafile=security.ca_file)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                security.label("ca_file"), f"{security.ca_file!r} holds no PEM CA certificate"
            ) from exc
    if security.cert_file:
        try:
            ctx.load_cert_chain(security.cert_file, security.key_file)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                security.label("cert_file"),
                f"{security.cert_file!r} and {security.label('key_file')} "
                f"{security.key_file!r} are not a PEM certificate and its key ({exc.args[-1]})",
            ) from exc


def channel_credentials(security: EtcdSecurity) -> grpc.ChannelCredentials:
    """TLS credentials for the channels (ConfigError naming a bad file)."""
    _check_pem(security)
    ca = _read(security.ca_file, security.label("ca_file")) if security.ca_file else None
    cert = _read(security.cert_file, security.label("cert_file")) if security.cert_file else None
    key = _read(security.key_file, security.label("key_file")) if security.key_file else None
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def grpc_error_of(exc: BaseException | None) -> grpc.RpcError | None:
    """The gRPC error behind ``exc`` (pyetcd re-raises some as its own exceptions)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _code_details(exc: BaseException | None) -> tuple[Any, str]:
    err = grpc_error_of(exc)
    if err is None:
        return None, ""
    return err.code(), str(err.details() or "")


def invalid_token(exc: BaseException | None) -> bool:
    """etcd does not know our auth token (expired, or etcd restarted): authenticate again."""
    code, details = _code_details(exc)
    return code == grpc.StatusCode.UNAUTHENTICATED and "token" in details


def access_problem(
    exc: BaseException | None, security: EtcdSecurity, what: str = ""
) -> CoordinatorAccessDenied | None:
    """``CoordinatorAccessDenied`` naming the setting when etcd refuses us, else None."""
    code, details = _code_details(exc)
    if code is None:
        return None
    short = details[:300]
    if code == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in details:
        return CoordinatorAccessDenied(
            security.label("password"),
            f"etcd refused {security.who}: wrong user name or password ({short})",
        )
    if code == grpc.StatusCode.PERMISSION_DENIED or "user name is empty" in details:
        doing = f" ({what})" if what else ""
        return CoordinatorAccessDenied(
            security.label("username"),
            f"etcd denied {security.who} access{doing}: the user's role needs readwrite on "
            f"the key prefix (docs/security.md), or auth is on and no user was given ({short})",
        )
    if any(m in details for m in _CLIENT_REFUSED):
        return CoordinatorAccessDenied(
            security.label("cert_file"),
            "etcd closed the TLS connection: it did not accept our client certificate "
            "(none given, or not signed by a CA in etcd's --trusted-ca-file)",
        )
    if any(m.lower() in details.lower() for m in _SERVER_NOT_TRUSTED):
        return CoordinatorAccessDenied(
            security.label("ca_file"),
            f"TLS handshake with etcd failed: its certificate is not signed by the CA of "
            f"{security.label('ca_file')} or does not name the host ({short})",
        )
    return None
