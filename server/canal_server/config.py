"""The node's TOML config, validated with pydantic; a bad value names its key.

Layout (keys follow Canal's instance.properties where one exists)::

    [node]
    id = "node1"                          # an id (canal_protocol.ids), unique in the cluster
    listen = "127.0.0.1:11112"            # host:port the REST API (uvicorn) binds
    advertise_url = "http://127.0.0.1:11112"  # what other nodes redirect to (default: from listen)
    http = "auto"                         # parser: auto (httptools if installed), h11, httptools
    loop = "auto"                         # event loop: auto (uvloop if installed), asyncio, uvloop
    header_timeout_s = 10.0               # a request's head must arrive within this long
    body_timeout_s = 30.0                 # its body within this long after the head (else 408)
    max_long_polls = 1000                 # long polls waiting at once; more: 503 at once

    [etcd]
    endpoints = ["http://127.0.0.1:2379"]  # https:// = TLS
    prefix = "/canal"
    timeout_s = 2.0                       # one etcd call
    ca_file = ""                          # TLS: the CA of etcd's certificate (default: system)
    cert_file = ""                        # TLS client certificate (etcd --client-cert-auth)
    key_file = ""
    username = ""                         # etcd user (auth enabled)
    password = ""                         # a secret (below)

    [election]
    ttl_s = 10.0                          # leader lease
    switch_delay_s = 5.0                  # non-owners wait this long before campaigning
    safety_margin_s = 2.0                 # fence this long before the lease could expire
    loop_interval_s = 1.0

    [balance]
    enable = true                         # keep at most ceil(D / N) leaders per node
    hold_s = 10.0                         # a destination stays this long before it moves

    [meta]
    flush_period_ms = 1000

    [canal]                               # Canal's TCP protocol (docs/canal-protocol.md)
    enable = true
    listen = "127.0.0.1:11111"            # Canal's canal.ip:canal.port
    advertise = ""                        # host:port other nodes relay to (default: listen)
    user = ""                             # canal.user; "" = any user name
    passwd = ""                           # canal.passwd: hex SHA1(SHA1(password)), a secret;
                                          #   "" = any password
    allow_plaintext_password = false      # also accept the password itself (canal-python)
    destinations = ["example"]            # optional: the destinations the user may consume
    clients = ["1001"]                    # optional: the client ids it may use

    [auth]
    tokens = []                           # bearer tokens with every right; none at all = no auth
    admin = [{ token = "..." }]           # admin tokens: every right (also cluster changes)
    consumer = [{ token = "...", destinations = ["example"], clients = ["c1"] }]
                                          # consumer tokens: client routes only, optionally
                                          # limited to destinations and/or client ids

    [tls]
    cert_file = ""                        # both set = HTTPS
    key_file = ""

    [destinations.example]
    master.address = "127.0.0.1:3306"
    master.journal_name = ""              # optional start position (Canal's master.*)
    master.position = 0
    master.timestamp = 0                  # ms since the epoch
    master.gtid = ""
    standby.address = "127.0.0.1:3307"    # optional [standby] with the same keys
    db.username = "canal"                 # Canal's dbUsername / dbPassword
    db.password = "canal"                 # a secret (below)
    db.tls.enabled = false                # require TLS, verify the server's certificate
    db.tls.ca_file = ""                   #   its CA (default: the system's CAs)
    db.tls.verify_identity = true         #   the certificate must name master/standby host
    db.tls.cert_file = ""                 #   optional client certificate and key
    db.tls.key_file = ""
    slave_id = 0                          # 0 = derived from the destination name
    gtid_mode = false
    filter.regex = ".*\\\\..*"
    filter.black_regex = ""
    filter.heartbeat_table = ""
    fallback_interval_s = 60
    dump_error_threshold = 2
    memory.buffer_size = 16384
    memory.buffer_bytes = 67108864
    transaction_size = 1024
    heartbeat_s = 5.0
    detecting.enable = false
    detecting.sql = "SELECT 1"
    detecting.interval_s = 3.0
    detecting.retry_threshold = 3
    detecting.timeout_s = 2.0
    local.dir = ""                        # read binlog files from this directory instead
    local.schema_file = ""                #   CREATE TABLEs for binlogs without column names
    local.poll_ms = 500                   #   how often the newest file is checked for more
    snapshot.tables = ["shop\\.orders"]   # incremental snapshot: schema.table regexes
    snapshot.mode = "never"               # "initial": snapshot when the destination is new
    snapshot.chunk_rows = 10000

Secrets (``etcd.password``, ``db.password``, ``canal.passwd``, each of ``auth.tokens``) are
a string or ``{ env = "NAME" }`` or ``{ file = "/run/secrets/x" }``
(``canal_server.secrets``).

``load_config(path)`` raises ``ConfigError(key, reason)``; ``render_toml(data)`` writes
such a file from a dict (test harnesses, ``canal-ha up``).
"""

from __future__ import annotations

import re
import ssl
import tomllib
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from canal_cluster.etcd_security import EtcdSecurity
from canal_cluster.keys import Keys
from canal_cluster.running import ElectionConfig
from canal_protocol.errors import ConfigError, InvalidArgument
from canal_protocol.ids import validate_id
from canal_server.filter import EventFilter
from canal_server.secrets import Secret, SecretText

__all__ = [
    "AdminToken",
    "AuthSection",
    "CanalSection",
    "ConsumerToken",
    "DestinationConfig",
    "NodeConfig",
    "SnapshotSection",
    "config_from_dict",
    "dsn_of",
    "load_config",
    "render_toml",
]

_HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9_.:\[\]-]+):(?P<port>\d{1,5})")


def _host_port(value: str) -> str:
    m = _HOST_PORT.fullmatch(value)
    if m is None:
        raise ValueError(f"must be host:port, got {value!r}")
    _port_in_range(int(m.group("port")), value)
    return value


def _port_in_range(port: int, value: str) -> None:
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range 1-65535 in {value!r}")


def _existing_file(path: str) -> str:
    if path and not Path(path).is_file():
        raise ValueError(f"no such file {path!r}")
    return path


def _check_id(value: str) -> str:
    """The id rule of ``canal_protocol.ids.validate_id``, as a pydantic ValueError."""
    try:
        return validate_id(value, "id")
    except InvalidArgument as exc:
        raise ValueError(exc.reason) from None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSection(_Section):
    id: str
    listen: str = "127.0.0.1:11112"
    advertise_url: str = ""
    http: Literal["auto", "h11", "httptools"] = "auto"
    loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    # slow clients (docs/api.md, "Limits"): a connection that has not sent a request's
    # whole head this long after it opened (or after the previous answer) is closed; a
    # body not read whole this long after the head is a 408
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    max_long_polls: int = Field(default=1000, ge=1, le=100_000)

    _id = field_validator("id")(_check_id)
    _listen = field_validator("listen")(_host_port)

    @field_validator("advertise_url")
    @classmethod
    def _url(cls, v: str) -> str:
        m = re.fullmatch(r"https?://[^\s/]+?(?::(?P<port>\d+))?", v.rstrip("/"))
        if v and m is None:
            raise ValueError(f"must be http(s)://host:port, got {v!r}")
        if m is not None and m.group("port"):
            _port_in_range(int(m.group("port")), v)
        return v.rstrip("/")


class EtcdSection(_Section):
    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:2379"], min_length=1)
    prefix: str = "/canal"
    timeout_s: float = Field(default=2.0, gt=0, le=60)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password: Secret = SecretStr("")

    _files = field_validator("ca_file", "cert_file", "key_file")(_existing_file)

    @model_validator(mode="after")
    def _security(self) -> EtcdSection:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file must be set together")
        if bool(self.username) != bool(self.password.get_secret_value()):
            raise ValueError("username and password must be set together")
        if (self.ca_file or self.cert_file) and not all(
            e.startswith("https://") for e in self.endpoints
        ):
            raise ValueError("ca_file/cert_file are set: the endpoints must be https://")
        return self

    def security(self) -> EtcdSecurity:
        """What the coordinator needs (``etcd_security``); the password given out here."""
        return EtcdSecurity(
            self.ca_file, self.cert_file, self.key_file,
            self.username, self.password.get_secret_value(),
        )  # fmt: skip

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: list[str]) -> list[str]:
        for e in v:
            _host_port(re.sub(r"^https?://", "", e).rstrip("/"))
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        try:
            Keys(v)
        except ConfigError as exc:
            raise ValueError(exc.reason) from None
        return v


class ElectionSection(_Section):
    ttl_s: float = Field(default=10.0, gt=0)
    switch_delay_s: float = Field(default=5.0, ge=0)
    safety_margin_s: float = Field(default=2.0, gt=0)
    loop_interval_s: float = Field(default=1.0, gt=0)

    def election_config(self) -> ElectionConfig:
        return ElectionConfig(
            self.ttl_s, self.safety_margin_s, self.loop_interval_s, self.switch_delay_s
        )


class BalanceSection(_Section):
    enable: bool = True
    hold_s: float = Field(default=10.0, ge=0)


class MetaSection(_Section):
    flush_period_ms: int = Field(default=1000, gt=0, le=3_600_000)


def _check_token(v: str) -> str:
    if not v or not v.isprintable() or " " in v:
        raise ValueError("a token must be a non-empty printable string without spaces")
    return v


def _check_ids(v: list[str] | None) -> list[str] | None:
    if v is not None:
        if not v:
            raise ValueError("give at least one, or leave the key out (= any)")
        for x in v:
            _check_id(x)
    return v


class AdminToken(_Section):
    """``[[auth.admin]]``: every right, including the routes that change the cluster."""

    token: SecretText = Field(repr=False)

    _token = field_validator("token")(_check_token)


class ConsumerToken(_Section):
    """``[[auth.consumer]]``: the client routes (and read-only node routes); None = any
    destination / client id."""

    token: SecretText = Field(repr=False)
    destinations: list[str] | None = None
    clients: list[str] | None = None

    _token = field_validator("token")(_check_token)
    _ids = field_validator("destinations", "clients")(_check_ids)


class AuthSection(_Section):
    tokens: list[SecretText] = Field(default_factory=list, repr=False)  # full rights
    admin: list[AdminToken] = Field(default_factory=list)
    consumer: list[ConsumerToken] = Field(default_factory=list)

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, v: list[str]) -> list[str]:
        if any(not t or not t.isprintable() or " " in t for t in v):
            raise ValueError("tokens must be non-empty printable strings without spaces")
        return v

    @model_validator(mode="after")
    def _unique(self) -> AuthSection:
        every = [*self.tokens, *(a.token for a in self.admin), *(c.token for c in self.consumer)]
        if len(set(every)) != len(every):
            raise ValueError("a token is listed twice (in tokens, admin or consumer)")
        return self

    @property
    def enabled(self) -> bool:
        """Any token configured: every route but health, metrics and docs needs one."""
        return bool(self.tokens or self.admin or self.consumer)


_PASSWD = re.compile(r"\*?[0-9A-Fa-f]{40}")


class CanalSection(_Section):
    """``[canal]``: the listener of Canal's TCP protocol (``canal_server.canal``) and its
    one user (Canal's ``canal.user`` / ``canal.passwd``), a consumer of ``destinations``
    / ``clients`` (None = any)."""

    enable: bool = True
    listen: str = "127.0.0.1:11111"
    advertise: str = ""
    user: str = ""
    passwd: Secret = SecretStr("")
    allow_plaintext_password: bool = False
    destinations: list[str] | None = None
    clients: list[str] | None = None

    _listen = field_validator("listen")(_host_port)
    _ids = field_validator("destinations", "clients")(_check_ids)

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, v: str) -> str:
        return _host_port(v) if v else v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("must be printable")
        return v

    @field_validator("passwd")
    @classmethod
    def _passwd(cls, v: SecretStr) -> SecretStr:
        text = v.get_secret_value()
        if text and _PASSWD.fullmatch(text) is None:
            raise ValueError(
                "must be the hex of SHA1(SHA1(password)) (40 hex digits, as Canal's "
                "canal.passwd or MySQL's PASSWORD() without its '*'), or empty"
            )
        return SecretStr(text.lstrip("*").upper())

    @property
    def passwd_hash(self) -> bytes:
        """SHA1(SHA1(password)) (b"": any password)."""
        return bytes.fromhex(self.passwd.get_secret_value())

    @property
    def advertised(self) -> str:
        """``host:port`` other nodes relay a client to."""
        return self.advertise or self.listen

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


class TlsSection(_Section):
    cert_file: str = ""
    key_file: str = ""

    @model_validator(mode="after")
    def _both(self) -> TlsSection:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file must be set together")
        for name in ("cert_file", "key_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"{name}: no such file {path!r}")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


class SourceSection(_Section):
    """``master.*`` / ``standby.*``."""

    address: str
    journal_name: str = ""
    position: int = Field(default=0, ge=0)
    timestamp: int = Field(default=0, ge=0, description="ms since the epoch")
    gtid: str = ""

    _address = field_validator("address")(_host_port)


class DbTlsSection(_Section):
    """``db.tls.*``: TLS to the database, for the binlog dump and every query."""

    enabled: bool = False
    ca_file: str = ""
    verify_identity: bool = True
    cert_file: str = ""
    key_file: str = ""

    _files = field_validator("ca_file", "cert_file", "key_file")(_existing_file)

    @model_validator(mode="after")
    def _pairs(self) -> DbTlsSection:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file must be set together")
        if not self.enabled and (self.ca_file or self.cert_file):
            raise ValueError("files are set but enabled = false: set enabled = true")
        if self.enabled:
            try:
                ctx = ssl.create_default_context(cafile=self.ca_file or None)
                if self.cert_file:
                    ctx.load_cert_chain(self.cert_file, self.key_file)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"the CA, certificate or key is no usable PEM: {exc}") from None
        return self

    def dsn_part(self) -> dict[str, Any] | None:
        """The DSN's ``tls`` entry (``binlog_stream`` makes the SSL context), or None."""
        if not self.enabled:
            return None
        return {
            "ca": self.ca_file or None,
            "cert": self.cert_file or None,
            "key": self.key_file or None,
            "verify_identity": self.verify_identity,
        }


class DbSection(_Section):
    username: str = "canal"
    password: Secret = SecretStr("")
    tls: DbTlsSection = DbTlsSection()


class FilterSection(_Section):
    regex: str = ""
    black_regex: str = ""
    heartbeat_table: str = ""

    @model_validator(mode="after")
    def _compiles(self) -> FilterSection:
        try:
            EventFilter(self.regex, self.black_regex, self.heartbeat_table)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
        return self


class MemorySection(_Section):
    buffer_size: int = Field(default=16384, ge=1, le=10_000_000)
    buffer_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)


class DetectingSection(_Section):
    enable: bool = False
    sql: str = "SELECT 1"
    interval_s: float = Field(default=3.0, gt=0)
    retry_threshold: int = Field(default=3, ge=1)
    timeout_s: float = Field(default=2.0, gt=0)


class LocalSection(_Section):
    """``local.*``: a destination that reads binlog files from a directory (Canal's
    LocalBinlogEventParser) instead of a server's binlog dump."""

    dir: str
    schema_file: str = ""
    poll_ms: int = Field(default=500, ge=10, le=60_000)

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        if not v or not Path(v).is_dir():
            raise ValueError(f"must be a directory of binlog files, got {v!r}")
        return v

    @field_validator("schema_file")
    @classmethod
    def _schema(cls, v: str) -> str:
        if v and not Path(v).is_file():
            raise ValueError(f"no such file {v!r}")
        return v


class SnapshotSection(_Section):
    """``snapshot.*``: the incremental snapshot of existing rows (docs/snapshot.md)."""

    tables: list[str] = Field(default_factory=list)
    mode: Literal["initial", "never"] = "never"
    chunk_rows: int = Field(default=10_000, ge=1, le=1_000_000)

    @field_validator("tables")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for i, pattern in enumerate(v):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"tables[{i}] {pattern!r} is not a regex: {exc}") from None
        return v

    @model_validator(mode="after")
    def _initial_needs_tables(self) -> SnapshotSection:
        if self.mode == "initial" and not self.tables:
            raise ValueError('mode "initial" needs snapshot.tables')
        return self


class DestinationConfig(_Section):
    """One destination (Canal's instance)."""

    name: str = ""  # filled from the table name
    master: SourceSection
    standby: SourceSection | None = None
    db: DbSection = DbSection()
    slave_id: int = Field(default=0, ge=0, lt=2**32)
    gtid_mode: bool = False
    filter: FilterSection = FilterSection()
    fallback_interval_s: int = Field(default=60, ge=0)
    dump_error_threshold: int = Field(default=2, ge=0)
    memory: MemorySection = MemorySection()
    transaction_size: int = Field(default=1024, ge=2, le=1_000_000)
    heartbeat_s: float = Field(default=5.0, gt=0)
    detecting: DetectingSection = DetectingSection()
    local: LocalSection | None = None
    snapshot: SnapshotSection = SnapshotSection()

    @property
    def effective_slave_id(self) -> int:
        """``slave_id``, or a stable id derived from the destination name."""
        return self.slave_id or 10_000 + zlib.crc32(self.name.encode()) % 1_000_000


class NodeConfig(_Section):
    node: NodeSection
    etcd: EtcdSection = EtcdSection()
    election: ElectionSection = ElectionSection()
    balance: BalanceSection = BalanceSection()
    meta: MetaSection = MetaSection()
    auth: AuthSection = AuthSection()
    tls: TlsSection = TlsSection()
    canal: CanalSection = CanalSection()
    destinations: dict[str, DestinationConfig] = Field(min_length=1)

    @field_validator("destinations", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            out = {}
            for name, table in v.items():
                _check_id(str(name))
                out[name] = {**table, "name": name} if isinstance(table, Mapping) else table
            return out
        return v

    @property
    def advertise_url(self) -> str:
        if self.node.advertise_url:
            return self.node.advertise_url
        scheme = "https" if self.tls.enabled else "http"
        return f"{scheme}://{self.node.listen}"

    @property
    def listen_host(self) -> str:
        return self.node.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.node.listen.rsplit(":", 1)[1])


def _same_port(a: str, b: str) -> bool:
    """Whether two ``host:port`` binds would take the same port (a wildcard host takes
    every address)."""
    (ha, pa), (hb, pb) = (x.rsplit(":", 1) for x in (a, b))
    wild = ("0.0.0.0", "::", "[::]", "")
    return pa == pb and (ha == hb or ha in wild or hb in wild)


def dsn_of(dest: DestinationConfig, source: SourceSection) -> dict[str, Any]:
    """A DSN dict (host, port, user, password, tls) for the reader, finder and probes."""
    host, port = source.address.rsplit(":", 1)
    dsn: dict[str, Any] = {
        "host": host,
        "port": int(port),
        "user": dest.db.username,
        "password": dest.db.password.get_secret_value(),
    }
    tls = dest.db.tls.dsn_part()
    if tls is not None:
        dsn["tls"] = tls
    return dsn


def _key_of(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "config"


def config_from_dict(data: Mapping[str, Any]) -> NodeConfig:
    """Validate a parsed config; ``ConfigError`` names the first bad key (all reasons)."""
    try:
        config = NodeConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        reasons = "; ".join(
            f"{_key_of(e['loc'])}: {e['msg']}" if i else e["msg"] for i, e in enumerate(errors)
        )
        raise ConfigError(_key_of(first["loc"]), reasons) from None
    config.election.election_config().validate(config.etcd.timeout_s)  # names election.*
    if config.canal.enable and _same_port(config.canal.listen, config.node.listen):
        raise ConfigError(
            "canal.listen",
            f"{config.canal.listen} takes node.listen's port (the REST API's, "
            f"{config.node.listen}): give one of them another port",
        )
    return config


def load_config(path: str | Path) -> NodeConfig:
    """Read and validate a TOML config file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from None
    return config_from_dict(data)


# -- writing (harnesses) ---------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):  # an inline table (e.g. auth.consumer = [{token = ...}])
        items = [f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None]
        return "{ " + ", ".join(items) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _flat(prefix: str, table: Mapping[str, Any]) -> list[str]:
    lines = []
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            lines.extend(_flat(f"{key}.", v))
        elif v is not None:
            lines.append(f"{key} = {_toml_value(v)}")
    return lines


def render_toml(data: Mapping[str, Any]) -> str:
    """TOML text for a config dict: one table per top-level section (dotted keys inside)."""
    out: list[str] = []
    for section, table in data.items():
        if section == "destinations":
            for name, dest in table.items():
                out += [f"[destinations.{name}]", *_flat("", dest), ""]
        else:
            out += [f"[{section}]", *_flat("", table), ""]
    return "\n".join(out)
