"""Before a node starts: do etcd and each database let it in, with what it needs?

``check_at_start(config, coordinator)`` (``canal-ha server`` runs it before serving):

- **etcd**: ``check_access`` (the TLS handshake, the user and password, the role's
  read and write under ``etcd.prefix``). A refusal ends the start with
  ``CoordinatorAccessDenied`` naming the setting; etcd not answering is only logged
  (the node keeps trying, as it does through an outage).
- **each database** a destination reads (master, standby): log in (``db.*``, with
  ``db.tls.*``) and check the grants (``parse.grants``). A refused login, a failed TLS
  handshake or a missing grant ends the start with a ``ConfigError`` naming the key
  (``destinations.<d>.db.password``, ``….db.tls.ca_file``, ``….db.username``); a
  database that does not answer is only logged: its reader checks the same when it
  starts (``BinlogConfigError`` in ``/v1/health``).

Messages name users, hosts and files, never a password.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import pymysql

from canal_cluster.coordinator import Coordinator
from canal_protocol.errors import ConfigError, CoordinatorAccessDenied, CoordinatorUnavailable
from canal_server.config import DestinationConfig, NodeConfig, SourceSection, dsn_of
from canal_server.parse import binlog_stream, grants

__all__ = ["START_CHECK_TIMEOUT_S", "check_at_start", "check_database", "check_etcd"]

log = logging.getLogger(__name__)

START_CHECK_TIMEOUT_S = 5.0
_TLS_WORDS = ("SSL", "TLS", "certificate", "CERTIFICATE")


def check_at_start(config: NodeConfig, coordinator: Coordinator) -> None:
    """etcd first, then every database source (module docstring)."""
    check_etcd(coordinator, config.etcd.prefix)
    for name, dest in config.destinations.items():
        if dest.local is not None:
            continue
        for role, source in (("master", dest.master), ("standby", dest.standby)):
            if source is not None:
                check_database(name, role, dest, source)


def check_etcd(coordinator: Coordinator, prefix: str) -> None:
    try:
        coordinator.check_access(prefix, write=True)
    except CoordinatorAccessDenied:
        raise
    except CoordinatorUnavailable as exc:
        log.warning("etcd does not answer at start (%s); the node keeps trying", exc)


def check_database(name: str, role: str, dest: DestinationConfig, source: SourceSection) -> None:
    """ConfigError naming the key when the database refuses the user, the TLS handshake
    fails or a grant is missing; a warning when it does not answer."""
    key = f"destinations.{name}.db"
    dsn: dict[str, Any] = {
        **dsn_of(dest, source),
        "connect_timeout": START_CHECK_TIMEOUT_S,
        "read_timeout": START_CHECK_TIMEOUT_S,
    }
    address = source.address
    try:
        with binlog_stream.connect(dsn) as conn, conn.cursor() as cur:
            missing = grants.missing_grants(cur)
            if missing:
                error = grants.grants_error(cur, missing, address)
                raise ConfigError(f"{key}.username", str(error))
    except ssl.SSLError as exc:  # the files themselves (the handshake fails inside pymysql)
        raise ConfigError(f"{key}.tls.ca_file", f"cannot set up TLS: {exc}") from None
    except pymysql.err.OperationalError as exc:
        _raise_refusal(exc, key, address, dest)
        log.warning(
            "destination %s: %s database %s does not answer at start (%s); its reader "
            "will wait for it", name, role, address, exc,
        )  # fmt: skip
    except (pymysql.err.MySQLError, OSError) as exc:
        log.warning("destination %s: checking %s database %s failed: %s", name, role, address, exc)


def _raise_refusal(
    exc: pymysql.err.OperationalError, key: str, address: str, dest: DestinationConfig
) -> None:
    code = exc.args[0] if exc.args else None
    text = str(exc.args[-1]) if exc.args else str(exc)
    if code == grants.ER_ACCESS_DENIED:
        raise ConfigError(
            f"{key}.password",
            f"{address} refused user {dest.db.username!r} ({text}): wrong user name or "
            "password, or the server requires TLS (db.tls.enabled) or a client certificate "
            "(db.tls.cert_file)",
        ) from None
    if any(word in text for word in _TLS_WORDS):
        which = "verify_identity" if "match" in text or "Hostname" in text else "ca_file"
        raise ConfigError(f"{key}.tls.{which}", f"TLS to {address} failed: {text}") from None
