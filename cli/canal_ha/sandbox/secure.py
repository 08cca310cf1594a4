"""The sandbox in production dress (``canal-ha up --secure``): what it makes and where.

Under ``workdir/secrets/`` (0700), each secret a file of its own, 0600, never printed
nor written into a config (node configs name them with ``{ file = ... }``):

- ``ca.crt``, ``ca.key``: the sandbox's CA (it signs every certificate below);
- ``server.crt``, ``.key``: etcd's and MariaDB's certificate (127.0.0.1, localhost);
- ``etcd-root.crt``, ``.key``: CN root, etcd's administrator, only to set up the users;
- ``node.crt``, ``.key``: CN canal-node, the server nodes' etcd client certificate;
- ``client.crt``, ``.key``: CN canal-client, the consumers', the tools' and Spark's;
- ``etcd-{root,node,client}.password``: the etcd users root, canal-node, canal-client;
- ``db-{canal,app,repl}.password``: the MariaDB users canal (nodes), app (your writes),
  repl (a standby);
- ``admin.token``: ``[[auth.admin]]``, every REST right (step-down, snapshots, the
  console's actions); ``consumer.token``: ``[[auth.consumer]]`` limited to the
  destination;
- ``canal.password``: the password of Canal's TCP user ``canal`` (what a Canal client
  logs in with); ``canal.passwd``: its hash, the nodes' ``[canal] passwd``.

etcd serves https only, asks for client certificates (``--client-cert-auth``) and has
auth on with the users of ``etcd_users()``: ``canal-node`` readwrite on the prefix,
``canal-client`` read on it plus readwrite on the keys of ``client_ids`` (what an
exclusive consumer writes: its running key), ``root`` for the setup. Each certificate's
CN is its user's name, so a certificate alone gives no more than its user's role.
MariaDB requires TLS on TCP (``require_secure_transport=ON``); the nodes verify its
certificate (``db.tls``). Files already there are kept (a workdir keeps its secrets
across ``down`` and ``up``); the users' passwords are set from them at every start.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canal_cluster.keys import DEFAULT_PREFIX, Keys
from canal_ha.etcd_users import AuthTls, EtcdUser, Permission, enable_auth
from canal_ha.sandbox.mariadb import APP_USER, CANAL_USER, REPL_USER, DbPasswords
from canal_ha.sandbox.pki import Pair, issue, make_ca
from canal_ha.sandbox.tls import ServerTls
from canal_protocol.errors import SandboxStartError

__all__ = ["CANAL_TCP_USER", "CLIENT_USER", "NODE_USER", "SECRETS_DIR", "SecureSetup"]

SECRETS_DIR = "secrets"
NODE_USER, CLIENT_USER = "canal-node", "canal-client"
_PASSWORDS = ("etcd-root", "etcd-node", "etcd-client", "db-canal", "db-app", "db-repl", "canal")
CANAL_TCP_USER = "canal"  # Canal's canal.user
_TOKENS = ("admin", "consumer")
_CERT_OF = {"root": "etcd-root", NODE_USER: "node", CLIENT_USER: "client"}  # etcd user: pair


@dataclass(frozen=True)
class SecureSetup:
    """The secure sandbox's files under ``root`` (``workdir/secrets``) and what uses them."""

    root: Path
    destination: str = "example"
    client_ids: tuple[str, ...] = ("c1",)
    prefix: str = DEFAULT_PREFIX

    # -- files ------------------------------------------------------------------------

    @property
    def ca(self) -> Pair:
        return Pair(self.root / "ca.crt", self.root / "ca.key")

    def pair(self, name: str) -> Pair:
        """``server``, ``etcd-root``, ``node`` or ``client``."""
        return Pair(self.root / f"{name}.crt", self.root / f"{name}.key")

    def password_file(self, name: str) -> Path:
        """``etcd-root``, ``etcd-node``, ``etcd-client``, ``db-canal``, ``db-app``, ``db-repl``."""
        return self.root / f"{name}.password"

    def token_file(self, role: str) -> Path:
        """``admin`` or ``consumer``."""
        return self.root / f"{role}.token"

    @property
    def canal_passwd_file(self) -> Path:
        """The hash of ``canal.password`` a node checks logins against (``[canal] passwd``)."""
        return self.root / "canal.passwd"

    def create(self) -> SecureSetup:
        """Make what is missing (CA, certificates, passwords, tokens); every key and
        secret 0600, the directory 0700."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        ca = make_ca(self.root, "ca")
        issue(self.root, "server", ca, "localhost", "IP:127.0.0.1,DNS:localhost")
        issue(self.root, "etcd-root", ca, "root", "DNS:root")
        issue(self.root, "node", ca, NODE_USER, f"DNS:{NODE_USER}")
        issue(self.root, "client", ca, CLIENT_USER, f"DNS:{CLIENT_USER}")
        for path in [*map(self.password_file, _PASSWORDS), *map(self.token_file, _TOKENS)]:
            _secret_file(path)
        from canal_server.canal.auth import passwd_of

        self.canal_passwd_file.unlink(missing_ok=True)  # derived: made again from the password
        _secret_file(self.canal_passwd_file, passwd_of(self._read(self.password_file("canal"))))
        for path in self.secret_files():
            os.chmod(path, 0o600)
        return self

    def secret_files(self) -> list[Path]:
        """Every file that must stay private: keys, passwords, tokens."""
        pairs = ("server", "etcd-root", "node", "client")
        keys = [self.ca.key, *(self.pair(n).key for n in pairs)]
        return [*keys, *map(self.password_file, _PASSWORDS), self.canal_passwd_file,
                *map(self.token_file, _TOKENS)]  # fmt: skip

    # -- the servers --------------------------------------------------------------------

    def server_tls(self) -> ServerTls:
        """etcd on https with client certificates, MariaDB requiring TLS; the sandbox's
        own health probes present the client certificate (any the CA signed will do)."""
        server, probe = self.pair("server"), self.pair("client")
        return ServerTls(self.ca.cert, server.cert, server.key, probe.cert, probe.key,
                         require_client_cert=True)  # fmt: skip

    def db_passwords(self) -> DbPasswords:
        return DbPasswords.from_files(
            {u: self.password_file(f"db-{u}") for u in (CANAL_USER, APP_USER, REPL_USER)}
        )

    def _roles(self) -> list[tuple[str, str, tuple[tuple[Permission, str], ...], str]]:
        """(user, its password file's name, its role's permissions, what it is for)."""
        keys = Keys(self.prefix)
        whole: tuple[Permission, str] = ("read", f"{self.prefix}/")
        clients: tuple[tuple[Permission, str], ...] = tuple(
            ("readwrite", keys.client_prefix(self.destination, c)) for c in self.client_ids
        )
        return [
            ("root", "etcd-root", (), "setup only"),
            (NODE_USER, "etcd-node", (("readwrite", f"{self.prefix}/"),), "server nodes"),
            (CLIENT_USER, "etcd-client", (whole, *clients),
             "consume, status, step-down, snapshot, Spark"),
        ]  # fmt: skip

    def etcd_users(self) -> list[EtcdUser]:
        """Each user holds the role of its own name (root: etcd's ``root`` role)."""
        return [EtcdUser(name, self._read(self.password_file(pw)), name, perms)
                for name, pw, perms, _ in self._roles()]  # fmt: skip

    def enable_etcd_auth(self, endpoints: list[str]) -> list[str]:
        """etcd's users and roles (``etcd_users``), then auth on, as root; the steps."""
        root = self.pair("etcd-root")
        tls = AuthTls(self.ca.cert, root.cert, root.key)
        try:
            return enable_auth(endpoints[0], tls, self.etcd_users())
        except RuntimeError as exc:
            raise SandboxStartError("etcd users and roles", str(exc)) from None

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text().removesuffix("\n")

    # -- the node's config and the clients' options ------------------------------------

    def node_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` (a node's, as ``canal-ha up`` writes it) with etcd's TLS and user,
        the database's TLS and password file, and the two tokens: files, no values."""
        node = self.pair("node")
        config["etcd"].update({
            "ca_file": str(self.ca.cert), "cert_file": str(node.cert),
            "key_file": str(node.key), "username": NODE_USER,
            "password": {"file": str(self.password_file("etcd-node"))},
        })  # fmt: skip
        for dest in config["destinations"].values():
            dest["db"] = {
                "username": CANAL_USER,
                "password": {"file": str(self.password_file(f"db-{CANAL_USER}"))},
                "tls": {"enabled": True, "ca_file": str(self.ca.cert), "verify_identity": True},
            }
        if "canal" in config:  # Canal's TCP listener
            config["canal"].update({
                "user": CANAL_TCP_USER, "passwd": {"file": str(self.canal_passwd_file)},
                "destinations": [self.destination],
            })  # fmt: skip
        config["auth"] = {
            "admin": [{"token": {"file": str(self.token_file("admin"))}}],
            "consumer": [{"token": {"file": str(self.token_file("consumer"))},
                          "destinations": [self.destination]}],
        }  # fmt: skip
        return config

    def client_options(self, endpoints: list[str]) -> list[str]:
        """The source options of ``consume``, ``status``, ``step-down`` and ``snapshot``."""
        client = self.pair("client")
        return [
            "--etcd", ",".join(endpoints), "--etcd-cacert", str(self.ca.cert),
            "--etcd-cert", str(client.cert), "--etcd-key", str(client.key),
            "--etcd-user", CLIENT_USER,
            "--etcd-password-file", str(self.password_file("etcd-client")),
        ]  # fmt: skip

    def summary(self, endpoints: list[str]) -> list[tuple[str, str]]:
        """``canal-ha up``'s lines: where each certificate and secret lives (names in
        ``root``; paths, never a value), who uses it, and the clients' options."""
        out = [
            ("secrets", f"{self.root}  (0700; each key, password and token a 0600 file)"),
            ("ca", "ca.crt  (signs etcd's and MariaDB's server.crt and the client certificates)"),
        ]
        for i, (name, pw, perms, use) in enumerate(self._roles()):
            rights = ", ".join(f"{kind} {prefix}" for kind, prefix in perms) or "every right"
            files = f"{_CERT_OF[name]}.crt/.key, {pw}.password"
            out.append(("users" if i == 0 else "", f"etcd {name}: {rights}  ({use}; {files})"))
        out += [
            ("", "mariadb canal (server nodes; db-canal.password), app (db-app.password), "
                 "repl (db-repl.password)"),
            ("", f"canal TCP user {CANAL_TCP_USER} (canal.password; the nodes hold its hash, "
                 "canal.passwd)"),
            ("tokens", f"admin.token (auth.admin: every right), consumer.token (auth.consumer: "
                       f"destination {self.destination})"),
            ("clients", " ".join(self.client_options(endpoints))),
        ]  # fmt: skip
        return out

    # -- cluster.json --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Where each secret and certificate lives (paths, never a value) and who uses it."""

        users = {
            name: {"role": name, "permissions": [list(p) for p in perms], "use": use,
                   "cert": str(self.pair(_CERT_OF[name]).cert),
                   "key": str(self.pair(_CERT_OF[name]).key),
                   "password_file": str(self.password_file(pw))}
            for name, pw, perms, use in self._roles()
        }  # fmt: skip
        return {
            "dir": str(self.root),
            "destination": self.destination,
            "prefix": self.prefix,
            "client_ids": list(self.client_ids),
            "ca": {"cert": str(self.ca.cert), "key": str(self.ca.key)},
            "server": {
                "cert": str(self.pair("server").cert),
                "key": str(self.pair("server").key),
            },
            "etcd_users": users,
            "mariadb_users": {
                u: {"password_file": str(self.password_file(f"db-{u}"))}
                for u in (CANAL_USER, APP_USER, REPL_USER)
            },
            "canal_tcp": {
                "user": CANAL_TCP_USER,
                "password_file": str(self.password_file("canal")),
                "passwd_file": str(self.canal_passwd_file),
                "destinations": [self.destination],
            },
            "tokens": {
                "admin": {"file": str(self.token_file("admin")), "config": "auth.admin"},
                "consumer": {
                    "file": str(self.token_file("consumer")),
                    "config": "auth.consumer",
                    "destinations": [self.destination],
                },
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SecureSetup | None:
        if not data:
            return None
        return cls(Path(data["dir"]), str(data["destination"]),
                   tuple(data["client_ids"]), str(data["prefix"]))  # fmt: skip


def _secret_file(path: Path, value: str | None = None) -> None:
    """``value`` (default: 32 random hex digits) in a new 0600 file; an existing file is
    kept."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(16) if value is None else value)
