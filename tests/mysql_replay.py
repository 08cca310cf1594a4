"""A MySQL-protocol test server that replays binlog files written by real MySQL servers.

No MySQL server can be installed on these machines, so the network path of the MySQL
flavour is tested against this *test double of the network peer*: it speaks the client
protocol (handshake v10 with ``mysql_native_password`` or ``caching_sha2_password``: its
fast path for a user in the server's cache, else the full authentication a first login
does without TLS, the client asking for the server's RSA public key and sending the
password encrypted with it; text result sets, OK/ERR/EOF packets) well enough for pymysql and
mysql-replication, answers the queries canal-ha and the library send (``SELECT
VERSION()``, ``SHOW BINARY LOG STATUS`` / ``SHOW MASTER STATUS`` as the version has
them, ``SHOW BINARY LOGS``, ``@@gtid_executed``, ``@@gtid_purged``, ``@@server_id``,
``@@server_uuid``, ``SHOW GLOBAL VARIABLES ...``, ``SHOW GRANTS``, the ``SET``s of a
binlog dump) and serves ``COM_BINLOG_DUMP`` and ``COM_BINLOG_DUMP_GTID`` from the files
of one directory, event by event, unchanged, as MySQL's binlog sender does: a fake
ROTATE (timestamp 0, log_pos 0) at the start and at each new file; starting inside a
file, the file's FORMAT_DESCRIPTION with log_pos 0 first; a GTID dump starts at the
newest file whose PREVIOUS_GTIDS the replica has and skips the transactions it has;
the errors MySQL gives (1236 for a missing file, a bad offset, purged or foreign GTIDs,
1835 for a malformed dump packet, 1064 for ``SHOW MASTER STATUS`` on 8.4, 1305 for
MariaDB's ``BINLOG_GTID_POS``). Non-blocking dumps end with EOF; blocking dumps send
heartbeats while idle.

The event bytes are MySQL's (tests/fixtures/mysql, see NOTICE); what this server adds
(the fake rotate, heartbeats, result sets) follows MySQL's source and documentation, not
a capture of a real server's answers. Every query it does not know is answered with a
syntax error and recorded in ``unknown``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canal_protocol.gtid import GtidSet

__all__ = ["MySQLReplayServer", "ReplayFile"]

MAGIC = b"\xfebin"
HEADER = 19
ROTATE, FDE, STOP, HEARTBEAT = 4, 15, 3, 27
GTID, ANONYMOUS_GTID, PREVIOUS_GTIDS = 33, 34, 35
ARTIFICIAL_F = 0x20
IN_USE_F = 0x1
NON_BLOCK = 0x01
THROUGH_GTID = 0x04

CAPS = (
    0x1 | 0x2 | 0x4 | 0x8  # long password, found rows, long flag, connect with db
    | 0x200 | 0x2000 | 0x8000  # protocol 41, transactions, secure connection
    | 0x10000 | 0x20000 | 0x80000 | 0x200000  # multi statements/results, plugin auth, lenenc
)  # fmt: skip
STATUS_AUTOCOMMIT = 0x0002

ER_PARSE = 1064
ER_ACCESS_DENIED = 1045
ER_UNKNOWN_COM = 1047
ER_NO_FUNCTION = 1305
ER_UNKNOWN_VARIABLE = 1193
ER_MASTER_FATAL = 1236
ER_MALFORMED = 1835


def _lenenc_int(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + struct.pack("<I", n)[:3]
    return b"\xfe" + struct.pack("<Q", n)


def _lenenc_str(b: bytes) -> bytes:
    return _lenenc_int(len(b)) + b


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("-")[0])[:3])


# -- the files -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayEvent:
    start: int
    raw: bytes

    @property
    def type(self) -> int:
        return self.raw[4]

    @property
    def timestamp(self) -> int:
        return int(struct.unpack_from("<I", self.raw, 0)[0])

    @property
    def end(self) -> int:
        return self.start + len(self.raw)


@dataclass(frozen=True)
class ReplayFile:
    """One binlog file: its events (bytes as written), checksum, PREVIOUS_GTIDS, GTIDs."""

    name: str
    size: int
    events: tuple[ReplayEvent, ...]
    checksum: bool
    previous: GtidSet
    gtids: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> ReplayFile:
        data = path.read_bytes()
        if data[:4] != MAGIC:
            raise ValueError(f"{path} is not a binlog file")
        events, at = [], 4
        while at + HEADER <= len(data):
            size = struct.unpack_from("<I", data, at + 9)[0]
            events.append(ReplayEvent(at, data[at : at + size]))
            at += size
        fde = events[0].raw
        checksum = fde[-5] == 1
        previous, gtids = GtidSet(), []
        for ev in events:
            body = ev.raw[HEADER : len(ev.raw) - (4 if checksum else 0)]
            if ev.type == PREVIOUS_GTIDS:
                previous = _decode_gtid_set(body)[0]
            elif ev.type == GTID:
                gtids.append(f"{_uuid(body[1:17])}:{struct.unpack_from('<q', body, 17)[0]}")
        return cls(path.name, len(data), tuple(events), checksum, previous, tuple(gtids))

    def gtid_of(self, ev: ReplayEvent) -> str:
        body = ev.raw[HEADER:]
        return f"{_uuid(body[1:17])}:{struct.unpack_from('<q', body, 17)[0]}"


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _decode_gtid_set(data: bytes, at: int = 0) -> tuple[GtidSet, int]:
    """MySQL's encoded GTID set: n_sids, then uuid, n_intervals, [start, end+1]..."""
    (n,) = struct.unpack_from("<Q", data, at)
    at += 8
    found: dict[str, list[tuple[int, int]]] = {}
    for _ in range(n):
        uuid = _uuid(data[at : at + 16])
        (count,) = struct.unpack_from("<Q", data, at + 16)
        at += 24
        for _ in range(count):
            start, stop = struct.unpack_from("<QQ", data, at)
            found.setdefault(uuid, []).append((start, stop - 1))
            at += 16
    return GtidSet.of(found), at


def _with_checksum(raw: bytes) -> bytes:
    return raw + struct.pack("<I", zlib.crc32(raw))


def _artificial(kind: int, server_id: int, log_pos: int, body: bytes, checksum: bool) -> bytes:
    size = HEADER + len(body) + (4 if checksum else 0)
    raw = struct.pack("<IBIIIH", 0, kind, server_id, size, log_pos, ARTIFICIAL_F) + body
    return _with_checksum(raw) if checksum else raw


# -- errors and packets ----------------------------------------------------------------------


class ReplayError(Exception):
    """An ERR packet to send: (code, message)."""

    def __init__(self, code: int, message: str, state: str = "HY000") -> None:
        super().__init__(code, message)
        self.code, self.message, self.state = code, message, state


@functools.cache
def _rsa_key() -> Any:
    """The server's RSA key pair (caching_sha2_password's full authentication)."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _rsa_public_pem() -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        _rsa_key()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _rsa_decrypt(data: bytes) -> bytes:
    """RSA-OAEP with SHA-1 (what MySQL's sha2 authentication uses); b"" if it fails."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    try:
        return bytes(_rsa_key().decrypt(data, oaep))
    except ValueError:
        return b""


class _Conn:
    """Packets on one client socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seq = 0

    def read(self) -> bytes:
        head = self._exact(4)
        length = int.from_bytes(head[:3], "little")
        self.seq = (head[3] + 1) % 256
        return self._exact(length)

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("client closed")
            out += chunk
        return out

    def write(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack("<I", len(payload))[:3] + bytes([self.seq]) + payload)
        self.seq = (self.seq + 1) % 256

    def ok(self) -> None:
        self.write(b"\x00\x00\x00" + struct.pack("<HH", STATUS_AUTOCOMMIT, 0))

    def eof(self) -> None:
        self.write(b"\xfe" + struct.pack("<HH", 0, STATUS_AUTOCOMMIT))

    def error(self, err: ReplayError) -> None:
        msg = err.message.encode()
        self.write(b"\xff" + struct.pack("<H", err.code) + b"#" + err.state.encode() + msg)

    def result(self, names: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.write(_lenenc_int(len(names)))
        for i, name in enumerate(names):
            numeric = bool(rows) and all(isinstance(r[i], int) for r in rows)
            kind, charset = (0x08, 63) if numeric else (0xFD, 255)
            self.write(
                b"".join(_lenenc_str(s) for s in (b"def", b"", b"", b"", name.encode(), b""))
                + b"\x0c" + struct.pack("<HIBHB", charset, 1024, kind, 0, 0) + b"\0\0"
            )  # fmt: skip
        self.eof()
        for row in rows:
            self.write(
                b"".join(b"\xfb" if v is None else _lenenc_str(str(v).encode()) for v in row)
            )
        self.eof()


# -- the server ---------------------------------------------------------------------------------


@dataclass
class MySQLReplayServer:
    """Serves the binlog files of ``directory`` (name order) on a free loopback port.

    ``variables`` override the server variables (``binlog_format``, ``gtid_mode``, ...);
    ``version`` picks what the server says and which statements it knows.
    """

    directory: Path
    version: str = "8.4.3"
    server_id: int = 1
    server_uuid: str = ""
    user: str = "canal"
    password: str = "canal-pw"
    variables: dict[str, str] = field(default_factory=dict)
    grants: tuple[str, ...] = ("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `canal`@`%`",)
    clock: int = 0  # UNIX_TIMESTAMP(); 0: the newest event's time + 1
    queries: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    dumps: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: int = 0  # HEARTBEAT events sent
    full_auths: int = 0  # caching_sha2_password logins that sent the password RSA-encrypted
    key_requests: int = 0  # requests for the RSA public key

    def __post_init__(self) -> None:
        self._auth_cache: set[str] = set()  # caching_sha2_password: users logged in since start
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._clients: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = 0
        defaults = {
            "log_bin": "ON",
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL",
            "binlog_row_value_options": "",
            "binlog_checksum": "CRC32",
            "gtid_mode": "ON",
            "enforce_gtid_consistency": "ON",
            "server_id": str(self.server_id),
        }
        if _version_tuple(self.version) < (8, 0, 1):
            del defaults["binlog_row_metadata"], defaults["binlog_row_value_options"]
        self.variables = {**defaults, **{k.lower(): v for k, v in self.variables.items()}}
        self.variables = {k: v for k, v in self.variables.items() if v is not None}

    # -- life

    def start(self) -> MySQLReplayServer:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        t = threading.Thread(target=self._accept, name="mysql-replay", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            for c in self._clients:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(10)

    def __enter__(self) -> MySQLReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dsn(self, **kw: Any) -> dict[str, Any]:
        dsn = {"host": "127.0.0.1", "port": self.port, "user": self.user}
        return {**dsn, "password": self.password, **kw}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- what the server holds

    def files(self) -> list[ReplayFile]:
        paths = sorted(p for p in self.directory.iterdir() if p.is_file())
        return [ReplayFile.load(p) for p in paths if p.read_bytes()[:4] == MAGIC]

    def gtid_purged(self) -> GtidSet:
        files = self.files()
        return files[0].previous if files else GtidSet()

    def gtid_executed(self) -> GtidSet:
        out = GtidSet()
        for f in self.files():
            out = out | f.previous
            for g in f.gtids:
                uuid, _, n = g.rpartition(":")
                out = out.add(uuid, int(n))
        return out

    def uuid(self) -> str:
        if self.server_uuid:
            return self.server_uuid
        files = self.files()
        own = [g.rpartition(":")[0] for g in files[-1].gtids] if files else []
        return own[-1] if own else "00000000-0000-0000-0000-000000000001"

    def now(self) -> int:
        if self.clock:
            return self.clock
        times = [ev.timestamp for f in self.files() for ev in f.events]
        return max(times, default=int(time.time())) + 1

    # -- connections

    def _accept(self) -> None:
        assert self._listener is not None
        ids = iter(range(100, 1 << 30))
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._clients.append(sock)
            t = threading.Thread(target=self._serve, args=(sock, next(ids)), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, sock: socket.socket, conn_id: int) -> None:
        conn = _Conn(sock)
        session: dict[str, str] = {}
        try:
            if not self._handshake(conn, conn_id):
                return
            while not self._stop.is_set():
                packet = conn.read()
                conn.seq = 1
                if not self._command(conn, packet, session):
                    return
        except (ConnectionError, OSError):
            return
        finally:
            with self._lock:
                if sock in self._clients:
                    self._clients.remove(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _plugin(self) -> str:
        return "caching_sha2_password" if _version_tuple(self.version) >= (8,) else (
            "mysql_native_password"
        )  # fmt: skip

    def _handshake(self, conn: _Conn, conn_id: int) -> bool:
        salt = bytes(b % 94 + 33 for b in os.urandom(20))
        plugin = self._plugin()
        conn.write(
            b"\x0a" + self.version.encode() + b"\0" + struct.pack("<I", conn_id)
            + salt[:8] + b"\0" + struct.pack("<HBHH", CAPS & 0xFFFF, 255, STATUS_AUTOCOMMIT,
                                             CAPS >> 16)
            + bytes([21]) + b"\0" * 10 + salt[8:] + b"\0" + plugin.encode() + b"\0"
        )  # fmt: skip
        data = conn.read()
        at = 32  # after capabilities, max packet size, charset and 23 reserved bytes
        end = data.index(b"\0", at)
        user = data[at:end].decode()
        at = end + 1
        n = data[at]  # a length-encoded (or, without 0x200000, one-byte) length: < 251 here
        auth = data[at + 1 : at + 1 + n]
        if plugin == "caching_sha2_password" and self.password and user not in self._auth_cache:
            return self._full_auth(conn, user, salt)  # the cache is empty: no fast path
        if user != self.user or auth != self._scramble(plugin, salt):
            return _deny(conn, user)
        if plugin == "caching_sha2_password":
            conn.write(b"\x01\x03")  # fast auth succeeded
        conn.ok()
        return True

    def _full_auth(self, conn: _Conn, user: str, salt: bytes) -> bool:
        """caching_sha2_password's full authentication without TLS: "perform full
        authentication", the client asks for the public key (2) unless it has it, then
        sends (password + NUL) XOR the scramble, RSA-OAEP encrypted with it."""
        conn.write(b"\x01\x04")
        data = conn.read()
        if data == b"\x02":
            self.key_requests += 1
            conn.write(b"\x01" + _rsa_public_pem())
            data = conn.read()
        plain = bytes(b ^ salt[i % len(salt)] for i, b in enumerate(_rsa_decrypt(data)))
        if user != self.user or plain != self.password.encode() + b"\0":
            return _deny(conn, user)
        self._auth_cache.add(user)
        self.full_auths += 1
        conn.ok()
        return True

    def _scramble(self, plugin: str, salt: bytes) -> bytes:
        pw = self.password.encode()
        if not pw:
            return b""
        if plugin == "caching_sha2_password":
            p1 = hashlib.sha256(pw).digest()
            p3 = hashlib.sha256(hashlib.sha256(p1).digest() + salt).digest()
            return bytes(a ^ b for a, b in zip(p1, p3, strict=True))
        s1 = hashlib.sha1(pw).digest()
        s3 = hashlib.sha1(salt + hashlib.sha1(s1).digest()).digest()
        return bytes(a ^ b for a, b in zip(s1, s3, strict=True))

    def _command(self, conn: _Conn, packet: bytes, session: dict[str, str]) -> bool:
        cmd, body = packet[0], packet[1:]
        try:
            if cmd == 0x01:  # COM_QUIT
                return False
            if cmd == 0x03:
                self._query(conn, body.decode("utf-8", "replace"), session)
            elif cmd in (0x02, 0x0E, 0x15):  # INIT_DB, PING, REGISTER_SLAVE
                conn.ok()
            elif cmd == 0x12:
                self._dump(conn, *self._parse_dump(body), session)
                return False
            elif cmd == 0x1E:
                self._dump_gtid(conn, len(packet), body, session)
                return False
            else:
                raise ReplayError(ER_UNKNOWN_COM, "Unknown command")
        except ReplayError as err:
            conn.error(err)
            return cmd not in (0x12, 0x1E)
        return True

    # -- queries

    def _query(self, conn: _Conn, sql: str, session: dict[str, str]) -> None:
        text = " ".join(sql.strip().rstrip(";").split())
        self.queries.append(text)
        upper = text.upper()
        if upper.startswith("SET "):
            for name, value in re.findall(r"@(\w+)\s*=\s*([^,]+)", text):
                session[name.lower()] = value.strip()
            conn.ok()
            return
        if upper.startswith("SELECT "):
            names, row = self._select(text[7:])
            conn.result(names, [row])
            return
        show = self._show(text, upper)
        if show is None:
            self.unknown.append(text)
            raise ReplayError(
                ER_PARSE,
                f"You have an error in your SQL syntax; check the manual that corresponds to "
                f"your MySQL server version for the right syntax to use near '{text[:40]}'",
                "42000",
            )
        conn.result(*show)

    def _select(self, items: str) -> tuple[list[str], tuple[Any, ...]]:
        names, values = [], []
        for item in (i.strip() for i in items.split(",")):
            names.append(item)
            values.append(self._value(item))
        return names, tuple(values)

    def _value(self, item: str) -> Any:
        key = item.lower().replace("@@global.", "@@").replace("@@session.", "@@")
        fixed: Mapping[str, Any] = {
            "version()": self.version,
            "@@version": self.version,
            "@@server_id": self.server_id,
            "@@server_uuid": self.uuid(),
            "@@gtid_executed": str(self.gtid_executed()),
            "@@gtid_purged": str(self.gtid_purged()),
            "unix_timestamp()": self.now(),
            "current_user()": f"{self.user}@%",
            "1": 1,
        }
        if key in fixed:
            return fixed[key]
        if key.startswith("@@") and key[2:] in self.variables:
            return self.variables[key[2:]]
        if key.startswith("binlog_gtid_pos("):
            raise ReplayError(ER_NO_FUNCTION, "FUNCTION BINLOG_GTID_POS does not exist", "42000")
        if key.startswith("@@"):
            raise ReplayError(ER_UNKNOWN_VARIABLE, f"Unknown system variable '{key[2:]}'")
        self.unknown.append(item)
        raise ReplayError(ER_PARSE, f"You have an error in your SQL syntax near '{item}'", "42000")

    def _show(self, text: str, upper: str) -> tuple[list[str], list[tuple[Any, ...]]] | None:
        version = _version_tuple(self.version)
        if upper == "SHOW BINARY LOGS":
            if version >= (8, 0, 14):
                return ["Log_name", "File_size", "Encrypted"], [
                    (f.name, f.size, "No") for f in self.files()
                ]
            return ["Log_name", "File_size"], [(f.name, f.size) for f in self.files()]
        if upper in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
            known = version >= (8, 2) if "BINARY" in upper else version < (8, 4)
            if not known:
                return None
            files = self.files()
            rows = [(files[-1].name, files[-1].size, "", "", str(self.gtid_executed()))]
            names = ["File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set"]
            return names, rows if files else []
        if upper == "SHOW GRANTS":
            return [f"Grants for {self.user}@%"], [(g,) for g in self.grants]
        m = re.match(r"SHOW (?:GLOBAL |SESSION )?VARIABLES (LIKE|WHERE) (.*)$", text, re.I)
        if m:
            return ["Variable_name", "Value"], self._variables(m.group(1).upper(), m.group(2))
        return None

    def _variables(self, how: str, arg: str) -> list[tuple[Any, ...]]:
        if how == "LIKE":
            pattern = arg.strip().strip("'\"").lower().replace("%", ".*").replace("_", ".")
            wanted = [k for k in self.variables if re.fullmatch(pattern, k)]
        else:
            wanted = [n.lower() for n in re.findall(r"'([^']+)'", arg)]
        return [(k, self.variables[k]) for k in wanted if k in self.variables]

    # -- binlog dumps

    def _parse_dump(self, body: bytes) -> tuple[str, int, int]:
        pos, flags, _server = struct.unpack_from("<IHI", body, 0)
        return body[10:].decode(), pos, flags

    def _dump_gtid(self, conn: _Conn, length: int, body: bytes, session: dict[str, str]) -> None:
        """MySQL's com_binlog_dump_gtid: every field read against the declared length."""
        todo = length - 1

        def take(n: int) -> bytes:
            nonlocal todo, body
            if todo < n:
                raise ReplayError(ER_MALFORMED, "Malformed communication packet.", "08S01")
            todo -= n
            out, body = body[:n], body[n:]
            return out

        flags = struct.unpack("<H", take(2))[0]
        take(4)
        name_size = struct.unpack("<I", take(4))[0]
        name = take(name_size).rstrip(b"\0").decode()
        pos = struct.unpack("<Q", take(8))[0]
        wanted = GtidSet()
        if flags & THROUGH_GTID:
            size = struct.unpack("<I", take(4))[0]
            wanted = _decode_gtid_set(take(size))[0]
        self._dump(conn, name, pos, flags, session, wanted)

    def _dump(
        self,
        conn: _Conn,
        name: str,
        pos: int,
        flags: int,
        session: dict[str, str],
        gtids: GtidSet | None = None,
    ) -> None:
        self.dumps.append({"file": name, "pos": pos, "flags": flags, "gtids": gtids})
        files = self.files()
        checksum = self.variables.get("binlog_checksum", "NONE").upper() == "CRC32"
        if checksum and "master_binlog_checksum" not in session:
            raise ReplayError(
                ER_MASTER_FATAL,
                "Replica can not handle replication events with the checksum that source "
                "is configured to log",
            )
        if gtids is not None:
            index, pos = self._gtid_start(files, gtids), 4
        else:
            index = self._file_start(files, name, pos)
        heartbeat_ns = int(session.get("master_heartbeat_period", "0").strip("'") or 0)
        for i in range(index, len(files)):
            f = files[i]
            start = pos if i == index else 4
            conn.write(b"\x00" + self._fake_rotate(f.name, start, checksum))
            for raw in self._events(f, start, gtids):
                conn.write(b"\x00" + raw)
        if flags & NON_BLOCK:
            conn.eof()
            return
        last = files[-1] if files else None
        while not self._stop.wait(heartbeat_ns / 1e9 if heartbeat_ns else 0.2):
            if heartbeat_ns and last is not None:
                beat = _artificial(HEARTBEAT, self.server_id, last.size, last.name.encode(), True)
                conn.write(b"\x00" + (beat if checksum else beat[:-4]))
                self.heartbeats += 1

    def _fake_rotate(self, name: str, pos: int, checksum: bool) -> bytes:
        body = struct.pack("<Q", pos) + name.encode()
        return _artificial(ROTATE, self.server_id, 0, body, checksum)

    def _file_start(self, files: list[ReplayFile], name: str, pos: int) -> int:
        names = [f.name for f in files]
        if not name:
            name = names[0] if names else ""
        if name not in names:
            raise ReplayError(
                ER_MASTER_FATAL,
                "Could not find first log file name in binary log index file",
            )
        f = files[names.index(name)]
        if pos > f.size:
            raise ReplayError(
                ER_MASTER_FATAL,
                "Client requested source to start replication from position > file size",
            )
        if pos > 4 and pos != f.size and pos not in {ev.start for ev in f.events}:
            raise ReplayError(
                ER_MASTER_FATAL,
                "bogus data in log event; the first event '"
                f"{name}' at {pos}, the last event read from '{name}' at 4, the last byte "
                f"read from '{name}' at {pos}.",
            )
        return names.index(name)

    def _gtid_start(self, files: list[ReplayFile], wanted: GtidSet) -> int:
        if self.variables.get("gtid_mode", "OFF").upper() != "ON":
            raise ReplayError(
                ER_MASTER_FATAL,
                "The replication sender thread cannot start in AUTO_POSITION mode: this "
                f"server has GTID_MODE = {self.variables.get('gtid_mode')} instead of ON.",
            )
        purged = self.gtid_purged()
        if not purged <= wanted:
            raise ReplayError(
                ER_MASTER_FATAL,
                "Cannot replicate because the source purged required binary logs. Replicate "
                "the missing transactions from elsewhere, or provision a new replica from "
                f"backup. The GTID set sent by the replica is '{wanted}', and the missing "
                f"transactions are '{purged - wanted}'",
            )
        if (wanted - self.gtid_executed()).intervals(self.uuid()):
            raise ReplayError(
                ER_MASTER_FATAL,
                "Slave has more GTIDs than the master has, using the master's SERVER_UUID. "
                "This may indicate that the end of the binary log was truncated or that the "
                "last binary log file was lost, e.g., after a power or disk failure when "
                "sync_binlog != 1.",
            )
        for i in range(len(files) - 1, -1, -1):
            if files[i].previous <= wanted:
                return i
        return 0

    def _events(self, f: ReplayFile, start: int, gtids: GtidSet | None) -> Iterator[bytes]:
        skipping = False
        for ev in f.events:
            if ev.type == FDE:
                if start > 4:  # resent for a dump that starts later: log_pos 0
                    yield self._unpositioned(ev.raw, f.checksum)
                    continue
            elif ev.start < start:
                continue
            if gtids is not None and ev.type in (GTID, ANONYMOUS_GTID):
                if ev.type == ANONYMOUS_GTID:
                    raise ReplayError(
                        ER_MASTER_FATAL,
                        "Cannot replicate anonymous transaction when AUTO_POSITION = 1, at "
                        f"file {f.name}, position {ev.start}.",
                    )
                skipping = f.gtid_of(ev) in gtids
            elif ev.type in (ROTATE, STOP, PREVIOUS_GTIDS, FDE):
                skipping = False
            if not skipping:
                yield ev.raw

    def _unpositioned(self, raw: bytes, checksum: bool) -> bytes:
        flags = struct.unpack_from("<H", raw, 17)[0] & ~IN_USE_F
        out = raw[:13] + struct.pack("<I", 0) + struct.pack("<H", flags) + raw[19:]
        return _with_checksum(out[:-4]) if checksum else out


def _deny(conn: _Conn, user: str) -> bool:
    """MySQL's answer to a wrong user or password (1045); False: the login failed."""
    conn.error(
        ReplayError(
            ER_ACCESS_DENIED,
            f"Access denied for user '{user}'@'localhost' (using password: YES)",
            "28000",
        )
    )
    return False
