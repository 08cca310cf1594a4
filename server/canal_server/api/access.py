"""Who may do what: the bearer tokens of ``[auth]`` and their rights.

* ``auth.tokens`` and ``[[auth.admin]]``: **admin** tokens, every right: the client
  routes of every destination and client id, and the routes that change the cluster
  (``require_admin``: e.g. starting or cancelling a snapshot, stepping down).
* ``[[auth.consumer]]``: **consumer** tokens: the client routes and the read-only node
  routes; ``destinations`` / ``clients`` (optional) limit them to those destination
  names / client ids, so such a token cannot read, ack or roll back another client.

No token configured at all: no auth (everything open, as before). ``/v1/health``,
``/metrics`` and ``/docs`` never need a token. A missing or unknown token is 401; a
known token without the right is 403 ``forbidden`` naming what it is limited to.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Literal

from canal_server.config import AuthSection

__all__ = ["ADMIN", "Access", "Grant"]

Role = Literal["admin", "consumer"]


@dataclass(frozen=True)
class Grant:
    """The rights of one token."""

    role: Role
    destinations: frozenset[str] | None = None  # None: every destination
    clients: frozenset[str] | None = None  # None: every client id

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def refusal(self, destination: str | None, client: str | None) -> str | None:
        """Why this token may not act on ``destination`` / ``client`` (None: it may)."""
        limit = self.destinations
        if limit is not None and destination is not None and destination not in limit:
            allowed = ", ".join(sorted(limit))
            return (
                f"this consumer token is limited to destination(s) {allowed}, not {destination!r}"
            )
        if self.clients is not None and client is not None and client not in self.clients:
            allowed = ", ".join(sorted(self.clients))
            return f"this consumer token is limited to client id(s) {allowed}, not {client!r}"
        return None


ADMIN = Grant("admin")


class Access:
    """The configured tokens; ``grant_of(token)`` compares in constant time."""

    def __init__(self, auth: AuthSection) -> None:
        self._grants: list[tuple[bytes, Grant]] = [(t.encode(), ADMIN) for t in auth.tokens]
        self._grants += [(a.token.encode(), ADMIN) for a in auth.admin]
        for c in auth.consumer:
            dests = frozenset(c.destinations) if c.destinations is not None else None
            clients = frozenset(c.clients) if c.clients is not None else None
            self._grants.append((c.token.encode(), Grant("consumer", dests, clients)))

    @property
    def enabled(self) -> bool:
        return bool(self._grants)

    def grant_of(self, token: bytes) -> Grant | None:
        found = None
        for known, grant in self._grants:  # every one compared: no timing hint
            if hmac.compare_digest(token, known):
                found = grant
        return found
