"""The whole private sandbox: MariaDB primary (+ GTID standby) and etcd, with cluster.json.

``Sandbox.start()`` brings every part up (readiness checks, never sleeps) and writes
``workdir/cluster.json``; ``Sandbox.load(workdir)`` rebuilds the handles from that
file in another process so ``stop()`` works by the recorded pids.

``secure``: etcd on https with client certificates and users, MariaDB requiring TLS,
every secret a 0600 file under ``workdir/secrets`` (``canal_ha.sandbox.secure``);
cluster.json then names the files, never a password.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canal_ha.sandbox.etcd import EtcdCluster, EtcdMember
from canal_ha.sandbox.mariadb import DbPasswords, MariaDBServer, socket_path
from canal_ha.sandbox.ports import free_port
from canal_ha.sandbox.process import ManagedProcess, ProcessRecord
from canal_ha.sandbox.secure import SecureSetup
from canal_ha.sandbox.tls import ServerTls
from canal_protocol.errors import ConfigError, SandboxError, SandboxStateError

__all__ = ["STATE_FILE", "Sandbox"]

log = logging.getLogger(__name__)
STATE_FILE = "cluster.json"
PRIMARY_SERVER_ID, STANDBY_SERVER_ID = 1, 2


@dataclass
class Sandbox:
    """Private MariaDB + etcd on loopback ports under ``workdir``."""

    workdir: Path
    etcd_members: int = 1
    standby: bool = False
    primary_db: MariaDBServer | None = None
    standby_db: MariaDBServer | None = None
    etcd: EtcdCluster | None = None
    extra: list[ManagedProcess] = field(default_factory=list)
    started_at: float = 0.0
    tls: ServerTls | None = None  # https etcd, MariaDB requiring TLS (sandbox/tls.py)
    secure: SecureSetup | None = None  # tls, etcd users, secrets in files (sandbox/secure.py)
    db_passwords: DbPasswords = field(default_factory=DbPasswords)

    # -- start / stop -----------------------------------------------------------

    def start(self) -> Sandbox:
        """Start every part; on failure stop what started and re-raise (names the part)."""
        self.workdir = self.workdir.resolve()
        if self.secure is not None:
            _check_socket_private(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.secure is not None:
            os.chmod(self.workdir, 0o700)  # MariaDB's root socket and the secrets are in it
            self.secure.create()
            self.tls, self.db_passwords = self.secure.server_tls(), self.secure.db_passwords()
        t0 = time.monotonic()
        try:
            self._start_parts()
        except BaseException:
            self.stop()
            raise
        self.started_at = time.time()
        self.write_state()
        log.info("sandbox up in %.1fs at %s", time.monotonic() - t0, self.workdir)
        return self

    def _start_parts(self) -> None:
        self.etcd = EtcdCluster(self.workdir / "etcd", self.etcd_members, tls=self.tls)
        self.etcd.start()
        if self.secure is not None:
            self.secure.enable_etcd_auth(self.etcd.endpoints)
        self.primary_db = MariaDBServer(
            "primary", self.workdir / "primary", PRIMARY_SERVER_ID, free_port(), tls=self.tls,
            passwords=self.db_passwords,
        )  # fmt: skip
        self.primary_db.start()
        self.primary_db.create_users()
        if self.standby:
            self.standby_db = MariaDBServer(
                "standby", self.workdir / "standby", STANDBY_SERVER_ID, free_port(),
                tls=self.tls, passwords=self.db_passwords,
            )  # fmt: skip
            self.standby_db.start()
            self.standby_db.replicate_from(self.primary_db)
            self.standby_db.wait_caught_up(self.primary_db)

    def processes(self) -> list[ManagedProcess]:
        """Every process of the sandbox, in the order they should be stopped."""
        procs = list(self.extra)
        for db in (self.standby_db, self.primary_db):
            if db is not None:
                procs.append(db.process)
        if self.etcd is not None:
            procs.extend(m.process for m in self.etcd.members)
        return procs

    def stop(self) -> list[str]:
        """Stop every recorded process that still runs; the names of those stopped."""
        stopped = [p.name for p in self.processes() if _stop_quietly(p)]
        if (self.workdir / STATE_FILE).exists():
            self.write_state(stopped=True)
        return stopped

    def add_process(self, proc: ManagedProcess) -> None:
        """Track a process started beside the sandbox (a server node, a writer)."""
        self.extra.append(proc)
        self.write_state()

    # -- handles ------------------------------------------------------------------

    @property
    def primary(self) -> MariaDBServer:
        if self.primary_db is None:
            raise SandboxError("sandbox has no primary database (not started)")
        return self.primary_db

    @property
    def replica(self) -> MariaDBServer:
        if self.standby_db is None:
            raise SandboxError("sandbox has no standby (start it with standby=True)")
        return self.standby_db

    @property
    def etcd_cluster(self) -> EtcdCluster:
        if self.etcd is None:
            raise SandboxError("sandbox has no etcd (not started)")
        return self.etcd

    @property
    def etcd_endpoints(self) -> list[str]:
        return self.etcd_cluster.endpoints

    # -- cluster.json -------------------------------------------------------------

    def state(self, stopped: bool = False) -> dict[str, Any]:
        etcd = self.etcd_cluster
        return {
            "version": 1,
            "workdir": str(self.workdir),
            "started_at": self.started_at,
            "stopped": stopped,
            "owner_pid": os.getpid(),
            "tls": self.tls.to_json() if self.tls is not None else None,
            "secure": self.secure.to_json() if self.secure is not None else None,
            "etcd": {
                "endpoints": etcd.endpoints,
                "members": [_member_state(m) for m in etcd.members],
            },
            "mariadb": {
                "primary": _db_state(self.primary_db, app=True),
                "standby": _db_state(self.standby_db),
            },
            "processes": [p.record().to_json() for p in self.processes() if p.pid is not None],
            "extra": [p.record().to_json() for p in self.extra if p.pid is not None],
        }

    def write_state(self, stopped: bool = False) -> Path:
        path = self.workdir / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.state(stopped), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, workdir: Path) -> Sandbox:
        """Rebuild the handles of a sandbox another process started, from cluster.json."""
        path = workdir.resolve() / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SandboxStateError(
                f"no {STATE_FILE} in {workdir}: nothing was started there"
            ) from None
        except (OSError, ValueError) as exc:
            raise SandboxStateError(f"{path} is unreadable: {exc}") from exc
        return _from_state(path.parent, data)


def _check_socket_private(workdir: Path) -> None:
    """Root's password-less unix socket must lie in the 0700 workdir (a long workdir
    moves it to the shared temp dir)."""
    socket = socket_path(workdir / "primary")
    if not socket.is_relative_to(workdir):
        raise ConfigError(
            "--workdir",
            f"{workdir} is too long for MariaDB's unix socket to lie inside it (it would be "
            f"{socket}, open to every local user): use a shorter path",
        )


def _stop_quietly(proc: ManagedProcess) -> bool:
    try:
        return proc.stop()
    except Exception:  # one stubborn process must not keep the others running
        log.exception("could not stop %s (pid %s)", proc.name, proc.pid)
        return False


def _member_state(m: EtcdMember) -> dict[str, Any]:
    return {
        "name": m.name,
        "client_url": m.client_url,
        "peer_url": m.peer_url,
        "metrics_port": m.metrics_port,
        "initial_cluster": m.initial_cluster,
        "dir": str(m.root),
        "log": str(m.process.log_path),
        "pid": m.process.pid,
    }


def _db_state(db: MariaDBServer | None, app: bool = False) -> dict[str, Any] | None:
    """Its place, the canal user's DSN, logs, pid; ``app``: the app user's DSN too."""
    if db is None:
        return None
    state = {
        "name": db.name,
        "dir": str(db.root),
        **_no_secret(db.dsn()),
        "error_log": str(db.error_log),
        "log": str(db.process.log_path),
        "pid": db.process.pid,
    }
    if app:
        state["app"] = _no_secret(db.app_dsn())
    return state


def _no_secret(dsn: dict[str, Any]) -> dict[str, Any]:
    """A DSN without the password when a file holds it (``password_file`` names it)."""
    return {k: v for k, v in dsn.items() if k != "password" or "password_file" not in dsn}


def _from_state(workdir: Path, data: dict[str, Any]) -> Sandbox:
    try:
        tls = ServerTls.from_json(data.get("tls"))
        secure = SecureSetup.from_json(data.get("secure"))
        etcd = EtcdCluster(
            workdir / "etcd",
            len(data["etcd"]["members"]),
            members=[_member_from(m, tls) for m in data["etcd"]["members"]],
            tls=tls,
        )
        dbs = data["mariadb"]
        passwords = _passwords_of(secure)
        box = _sandbox_from(workdir, etcd, dbs, tls, passwords)
        box.secure = secure
        box.extra = [
            ManagedProcess.adopt(ProcessRecord.from_json(r)) for r in data.get("extra", [])
        ]
        box.started_at = float(data.get("started_at", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise SandboxStateError(f"{workdir / STATE_FILE} is malformed: {exc!r}") from exc
    return box


def _passwords_of(secure: SecureSetup | None) -> DbPasswords:
    """The database passwords from their files; the fixed ones when there are none (or
    they are gone: stopping by pid needs no password)."""
    if secure is None:
        return DbPasswords()
    try:
        return secure.db_passwords()
    except OSError as exc:
        log.warning("the sandbox's database passwords are unreadable: %s", exc)
        return DbPasswords()


def _sandbox_from(
    workdir: Path,
    etcd: EtcdCluster,
    dbs: dict[str, Any],
    tls: ServerTls | None,
    passwords: DbPasswords,
) -> Sandbox:
    primary = _db_from(dbs["primary"], tls, passwords)
    standby = _db_from(dbs["standby"], tls, passwords) if dbs.get("standby") else None
    return Sandbox(
        workdir,
        etcd_members=etcd.size,
        standby=standby is not None,
        primary_db=primary,
        standby_db=standby,
        etcd=etcd,
        tls=tls,
        db_passwords=passwords,
    )


def _member_from(m: dict[str, Any], tls: ServerTls | None) -> EtcdMember:
    member = EtcdMember(
        m["name"],
        Path(m["dir"]),
        int(m["client_url"].rsplit(":", 1)[1]),
        int(m["peer_url"].rsplit(":", 1)[1]),
        int(m["metrics_port"]),
        initial_cluster=m["initial_cluster"],
        tls=tls,
    )
    member.process.pid = m["pid"]
    return member


def _db_from(d: dict[str, Any], tls: ServerTls | None, passwords: DbPasswords) -> MariaDBServer:
    db = MariaDBServer(
        d["name"], Path(d["dir"]), int(d["server_id"]), int(d["port"]), tls, passwords
    )
    db.process.pid = d["pid"]
    return db
