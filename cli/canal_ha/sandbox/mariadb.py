"""A private MariaDB server (primary or GTID replica) with the binlog settings canal needs
(with ``tls``: TLS offered and required on TCP, see ``canal_ha.sandbox.tls``)."""

from __future__ import annotations

import getpass
import hashlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pymysql

from canal_cluster.retry import wait_until
from canal_ha.sandbox.process import ManagedProcess, ProcessRecord
from canal_ha.sandbox.tls import ServerTls
from canal_protocol.errors import RetryExhausted, SandboxStartError

__all__ = [
    "APP_PASSWORD",
    "APP_USER",
    "CANAL_PASSWORD",
    "CANAL_USER",
    "REPL_PASSWORD",
    "REPL_USER",
    "DbPasswords",
    "MariaDBServer",
    "socket_path",
]

REPL_USER, REPL_PASSWORD = "repl", "repl-secret"
CANAL_USER, CANAL_PASSWORD = "canal", "canal-secret"
APP_USER, APP_PASSWORD = "app", "app-secret"  # read-write: where users write test data
SYSTEM_SCHEMAS = ("mysql", "sys", "performance_schema")  # read-only for the app user

# What canal needs from the server (DEVELOPERS.md / STACK-NOTES.md).
BINLOG_FLAGS = (
    "--log-bin=mariadb-bin",
    "--binlog-format=ROW",
    "--binlog-row-image=FULL",
    "--binlog-row-metadata=FULL",
    "--log-slave-updates",
    "--gtid-domain-id=0",
)
# Sandbox tuning: small memory, commits reach the OS at once (safe for process kills).
TUNING_FLAGS = (
    "--skip-name-resolve",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=32M",
    "--innodb-flush-log-at-trx-commit=2",
    "--sync-binlog=0",
    "--max-connections=300",
    "--max-allowed-packet=64M",
    "--skip-slave-start",
)


@dataclass(frozen=True)
class DbPasswords:
    """The passwords of the sandbox's users: the fixed ones, or (``canal-ha up --secure``)
    each read from a file of its own; ``files`` (user → path) is then what cluster.json
    and the summary name instead of the value."""

    repl: str = field(default=REPL_PASSWORD, repr=False)
    canal: str = field(default=CANAL_PASSWORD, repr=False)
    app: str = field(default=APP_PASSWORD, repr=False)
    files: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def from_files(cls, files: Mapping[str, Path | str]) -> DbPasswords:
        """Each of ``repl``, ``canal``, ``app`` from its file (one trailing newline off)."""
        paths = {user: Path(files[user]) for user in (REPL_USER, CANAL_USER, APP_USER)}
        values = {u: p.read_text().removesuffix("\n") for u, p in paths.items()}
        return cls(values[REPL_USER], values[CANAL_USER], values[APP_USER],
                   tuple(paths.items()))  # fmt: skip

    def file_of(self, user: str) -> Path | None:
        return dict(self.files).get(user)


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    if found is None:
        raise SandboxStartError(name, "not installed (run scripts/setup.sh)")
    return found


def socket_path(root: Path) -> Path:
    """Unix socket paths are limited to ~107 bytes; long workdirs get one in /tmp."""
    path = root / "mysqld.sock"
    if len(str(path)) < 100:
        return path
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"canal-ha-{digest}.sock"


@dataclass
class MariaDBServer:
    """One mariadbd on 127.0.0.1:port with its data, socket and logs under ``root``."""

    name: str
    root: Path
    server_id: int
    port: int
    tls: ServerTls | None = None
    passwords: DbPasswords = field(default_factory=DbPasswords)
    process: ManagedProcess = field(init=False)

    def __post_init__(self) -> None:
        self.process = ManagedProcess(
            f"mariadb-{self.name}", self._argv(), self.root / "stdout.log"
        )

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def socket(self) -> Path:
        return socket_path(self.root)

    @property
    def tmpdir(self) -> Path:
        """Private temp dir: concurrent install-db runs collide in a shared /tmp."""
        return self.root / "tmp"

    @property
    def error_log(self) -> Path:
        return self.root / "error.log"

    def _argv(self) -> tuple[str, ...]:
        return (
            _binary("mariadbd"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--socket={self.socket}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.root / 'mariadbd.pid'}",
            f"--log-error={self.error_log}",
            f"--tmpdir={self.tmpdir}",
            f"--user={getpass.getuser()}",
            f"--server-id={self.server_id}",
            *BINLOG_FLAGS,
            *TUNING_FLAGS,
            *self._tls_flags(),
        )

    def _tls_flags(self) -> tuple[str, ...]:
        if self.tls is None:
            return ()
        return (
            f"--ssl-ca={self.tls.ca_file}",
            f"--ssl-cert={self.tls.cert_file}",
            f"--ssl-key={self.tls.key_file}",
            "--require-secure-transport=ON",
        )

    def dsn(self) -> dict[str, Any]:
        """Connection facts for the canal user over TCP (what a server node uses)."""
        return {
            **self._user_dsn(CANAL_USER, self.passwords.canal),
            "server_id": self.server_id,
            "socket": str(self.socket),
        }

    def app_dsn(self) -> dict[str, Any]:
        """The read-write application user over TCP: where test data is written."""
        return self._user_dsn(APP_USER, self.passwords.app)

    def _user_dsn(self, user: str, password: str) -> dict[str, Any]:
        """host, port, user, password and a URL; a password kept in a file stays out of
        the URL, which ``password_file`` then accompanies."""
        out: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "user": user,
                               "password": password}  # fmt: skip
        password_file = self.passwords.file_of(user)
        if password_file is None:
            out["url"] = f"mysql://{user}:{password}@127.0.0.1:{self.port}"
        else:
            out["url"] = f"mysql://{user}@127.0.0.1:{self.port}"
            out["password_file"] = str(password_file)
        return out

    # -- lifecycle -------------------------------------------------------------

    def initialize(self) -> None:
        """Create the data directory (mariadb-install-db), once."""
        if (self.datadir / "mysql").is_dir():
            return
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        argv = [
            _binary("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--user={getpass.getuser()}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            f"--tmpdir={self.tmpdir}",
        ]
        log = self.root / "install.log"
        with open(log, "wb") as out:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT)
        if rc != 0:
            raise SandboxStartError(f"mariadb {self.name}", f"install-db exit {rc}", str(log))

    def start(self, timeout_s: float = 60.0) -> None:
        self.initialize()
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.process.start()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        def ready() -> bool:
            if not self.process.is_running():
                raise SandboxStartError(
                    f"mariadb {self.name}", "process exited", str(self.error_log)
                )
            if not self._socket_accepts():
                return False
            with self.admin() as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True

        try:
            wait_until(ready, f"mariadb {self.name} ready", timeout_s)
        except RetryExhausted as exc:
            if isinstance(exc.last_error, SandboxStartError):
                raise exc.last_error from None
            raise SandboxStartError(f"mariadb {self.name}", str(exc), str(self.error_log)) from exc

    def _socket_accepts(self) -> bool:
        """Probe the unix socket ourselves: pymysql leaks the socket of a failed connect."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(str(self.socket))
            except OSError:
                return False
        return True

    def stop(self) -> bool:
        return self.process.stop(timeout_s=30.0)

    def kill(self) -> None:
        self.process.kill()

    def restart(self, timeout_s: float = 60.0) -> None:
        self.process.stop(timeout_s=30.0)
        self.start(timeout_s)

    def record(self) -> ProcessRecord:
        return self.process.record()

    # -- SQL ------------------------------------------------------------------

    def admin(self) -> pymysql.connections.Connection[Any]:
        """A root connection over the unix socket (root has no TCP account)."""
        import pymysql  # the server extra's; the sandbox runs nodes, which need it anyway

        return pymysql.connect(
            unix_socket=str(self.socket),
            user="root",
            autocommit=True,
            connect_timeout=2,
            charset="utf8mb4",
        )

    def execute(self, *statements: str) -> list[tuple[Any, ...]]:
        """Run statements as root; the rows of the last one."""
        rows: list[tuple[Any, ...]] = []
        with self.admin() as conn, conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
                rows = list(cur.fetchall())
        return rows

    def scalar(self, sql: str) -> Any:
        rows = self.execute(sql)
        return rows[0][0] if rows else None

    def create_users(self) -> None:
        """The replication user (for replicas), the canal user (for server nodes) and the
        app user: every privilege on the databases but the system schemas (create schemas
        and tables, write rows), none on the server (no users, no replication). Passwords
        from files are set again at every start (a plain workdir may turn secure)."""
        pw = self.passwords
        users = ((REPL_USER, pw.repl), (CANAL_USER, pw.canal), (APP_USER, pw.app))
        accounts = [
            f"CREATE USER IF NOT EXISTS '{u}'@'127.0.0.1' IDENTIFIED BY '{p}'" for u, p in users
        ]
        if pw.files:
            accounts += [f"ALTER USER '{u}'@'127.0.0.1' IDENTIFIED BY '{p}'" for u, p in users]
        self.execute(
            *accounts,
            f"GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'127.0.0.1'",
            f"GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR, SLAVE MONITOR ON *.* "
            f"TO '{CANAL_USER}'@'127.0.0.1'",
            f"GRANT ALL PRIVILEGES ON `%`.* TO '{APP_USER}'@'127.0.0.1'",
            # an exact name wins over `%`: the system schemas stay read-only for app
            *(f"GRANT SELECT ON `{db}`.* TO '{APP_USER}'@'127.0.0.1'" for db in SYSTEM_SCHEMAS),
        )

    def replicate_from(self, primary: MariaDBServer) -> None:
        """Become a GTID replica of ``primary`` (MASTER_USE_GTID=slave_pos)."""
        ssl = f", MASTER_SSL=1, MASTER_SSL_CA='{primary.tls.ca_file}'" if primary.tls else ""
        self.execute(
            "STOP SLAVE",
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
            f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{primary.passwords.repl}', "
            f"MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1{ssl}",
            "START SLAVE",
        )

    def wait_caught_up(self, primary: MariaDBServer, timeout_s: float = 30.0) -> str:
        """Wait until this replica has applied the primary's binlog GTID state."""
        pos = str(primary.scalar("SELECT @@gtid_binlog_pos"))
        got = self.scalar(f"SELECT MASTER_GTID_WAIT('{pos}', {timeout_s})")
        if got != 0:
            status = self.execute("SHOW SLAVE STATUS")
            raise SandboxStartError(
                f"mariadb {self.name} replication",
                f"did not reach {pos} in {timeout_s}s: {status!r:.400}",
                str(self.error_log),
            )
        return pos

    def promote(self) -> None:
        """Stop replicating and forget the primary: this server is now a primary."""
        self.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")

    def binlog_files(self) -> list[str]:
        return [str(r[0]) for r in self.execute("SHOW BINARY LOGS")]

    def master_status(self) -> tuple[str, int]:
        row = self.execute("SHOW MASTER STATUS")[0]
        return str(row[0]), int(row[1])

    def settled_master_status(self, timeout_s: float = 30.0) -> tuple[str, int]:
        """The binlog end once MariaDB's own writes after a rotation are done.

        After a rotation MariaDB writes a ``Binlog_checkpoint`` naming the new file from a
        background thread, once the older file's transactions are durable: a read of the
        end before it lands is 45 bytes short. Waits until the newest checkpoint in the
        current file names that file (nothing else is written then while no client writes).
        """
        end: list[tuple[str, int]] = []

        def settled() -> bool:
            status = self.master_status()
            events = self.execute(f"SHOW BINLOG EVENTS IN '{status[0]}'")
            names = [str(e[5]) for e in events if e[2] == "Binlog_checkpoint"]
            end[:] = [status]
            return bool(names) and names[-1] == status[0] and self.master_status() == status

        wait_until(settled, "the binlog checkpoint of the current file", timeout_s)
        return end[0]

    def purge_binary_logs(self, timeout_s: float = 30.0) -> list[str]:
        """Rotate, then purge every binlog before the new current one; the purged names.

        MariaDB keeps a file until InnoDB has checkpointed past it, so the purge is
        repeated until every older file is gone.
        """
        before = self.binlog_files()
        self.execute("FLUSH BINARY LOGS")
        current = self.master_status()[0]

        def purged() -> bool:
            self.execute(f"PURGE BINARY LOGS TO '{current}'")
            return self.binlog_files() == [current]

        wait_until(purged, f"purge of binlogs before {current}", timeout_s)
        return [f for f in before if f != current]
