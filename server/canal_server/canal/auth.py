"""Canal's authentication: the MySQL 4.1 scramble of ``canal.user`` / ``canal.passwd``.

A Canal server keeps ``canal.passwd`` = hex(SHA1(SHA1(password))) and sends 8 random
seed bytes in its HANDSHAKE; Canal's Java client answers
``hex(SHA1(password) XOR SHA1(seed + SHA1(SHA1(password))))`` (``scramble411``). The
server recovers SHA1(password) from it and checks its SHA1 against the stored hash, as
MySQL does. Canal's rules (``CanalServerWithEmbedded.auth``): an empty configured user
accepts any user name, an empty configured password any password; a configured password
refuses an empty one. ``allow_plaintext_password`` also accepts the password itself
(canal-python 0.4 sends it unscrambled).

The check yields the client's ``Credential``: with SHA1(password) once known, so a node
that relays the session to the leader can log in there as the same user
(``upstream_password``), never storing or sending the password itself.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from canal_server.api.access import Grant
from canal_server.config import CanalSection

__all__ = [
    "SEED_BYTES",
    "CanalUser",
    "Credential",
    "new_seed",
    "passwd_of",
    "scramble411",
    "upstream_password",
]

SEED_BYTES = 8  # Canal's HandshakeInitializationHandler: RandomUtils.nextBytes(8)


def _sha1(*parts: bytes) -> bytes:
    h = hashlib.sha1()
    for p in parts:
        h.update(p)
    return h.digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def passwd_of(password: str) -> str:
    """``canal.passwd`` for a password: hex(SHA1(SHA1(password))), upper case (as Canal's
    docs and MySQL's ``PASSWORD()`` show it, without its ``*``)."""
    return _sha1(_sha1(password.encode())).hex().upper()


def scramble411(password: bytes, seed: bytes) -> bytes:
    """What Canal's Java client sends (before hex): SHA1(pw) XOR SHA1(seed + SHA1(SHA1(pw)))."""
    stage1 = _sha1(password)
    return _xor(stage1, _sha1(seed, _sha1(stage1)))


def upstream_password(stage1: bytes | None, seed: bytes) -> bytes:
    """The hex scramble for another node's ``seed`` from SHA1(password) (b"" without it:
    a server without a password takes any)."""
    if stage1 is None:
        return b""
    return _xor(stage1, _sha1(seed, _sha1(stage1))).hex().encode()


@dataclass(frozen=True)
class Credential:
    """Who a session logged in as; ``stage1`` is SHA1(password) when it was checked."""

    username: str
    stage1: bytes | None
    grant: Grant


@dataclass(frozen=True)
class CanalUser:
    """The configured user (``[canal]``) and its rights: a consumer of ``destinations``
    / ``clients`` (None = any), as a REST consumer token is."""

    name: str
    passwd_hash: bytes  # SHA1(SHA1(password)); b"": any password
    allow_plaintext: bool
    grant: Grant

    @classmethod
    def of(cls, section: CanalSection) -> CanalUser:
        dests = frozenset(section.destinations) if section.destinations is not None else None
        clients = frozenset(section.clients) if section.clients is not None else None
        return cls(
            section.user, section.passwd_hash, section.allow_plaintext_password,
            Grant("consumer", dests, clients),
        )  # fmt: skip

    def check(self, username: str, password: bytes, seed: bytes) -> Credential | None:
        """The client's credential, or None when refused (Canal's rules, module doc)."""
        if self.name and not hmac.compare_digest(self.name.encode(), username.encode()):
            return None
        if not self.passwd_hash:
            return Credential(username, None, self.grant)
        if not password:
            return None
        stage1 = self._scrambled(password, seed)
        if stage1 is None and self.allow_plaintext:
            plain = _sha1(password)
            if hmac.compare_digest(_sha1(plain), self.passwd_hash):
                stage1 = plain
        return Credential(username, stage1, self.grant) if stage1 is not None else None

    def _scrambled(self, password: bytes, seed: bytes) -> bytes | None:
        """SHA1(password) recovered from a hex scramble that checks, else None."""
        try:
            token = bytes.fromhex(password.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return None
        if len(token) != len(self.passwd_hash):
            return None
        stage1 = _xor(token, _sha1(seed, self.passwd_hash))
        return stage1 if hmac.compare_digest(_sha1(stage1), self.passwd_hash) else None


def new_seed() -> bytes:
    """The HANDSHAKE's random seeds."""
    return os.urandom(SEED_BYTES)
