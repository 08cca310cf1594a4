"""The Spark source's options, validated (``ConfigError`` names the option).

``etcd`` (comma-separated endpoints) or ``server`` (comma-separated node URLs),
``destination``, ``clientId``, ``batchSize`` (entries per server batch, 1000), ``filter``
(table regex), ``token``, ``etcdPrefix`` (``/canal``), ``pollTimeoutMs`` (1000),
``maxBatchesPerTrigger`` (100), ``maxRowsPerTrigger`` (500000), ``replayTimeoutS`` (120),
``rowsPerPartition`` (250000), ``rowsPerArrowBatch`` (250000),
``exclusive`` (false: one active consumer per client id), ``availableNowStallS`` (120),
``startingOffsets`` (``earliest``; see README), ``table`` (typed mode), ``prefetch`` (true),
``connectorFactory`` (tests: ``module:function`` building the connector); a secured etcd
(``https://`` endpoints): ``etcdCaFile``, ``etcdCertFile``, ``etcdKeyFile``, ``etcdUser``
and ``etcdPassword`` or ``etcdPasswordFile``; ``tokenFile`` instead of ``token`` (files
read on the driver; Spark redacts option values whose name holds "password" or "token"
in its UI and plans). README.md "Spark" describes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canal_protocol.errors import ConfigError

__all__ = ["CanalOptions", "table_filter"]


def _int(opts: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(name, f"must be within {low}..{high}, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = str(opts.get(name, default)).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(name, f"must be true or false, got {raw!r}")
    return raw == "true"


def _list(raw: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (raw or "").split(",") if p.strip())


@dataclass(frozen=True)
class CanalOptions:
    """The reader's options, validated (``ConfigError`` names the option)."""

    destination: str
    client_id: str
    etcd: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    batch_size: int = 1000
    filter: str = ""
    token: str | None = None
    etcd_prefix: str = "/canal"
    poll_timeout_s: float = 1.0
    max_batches_per_trigger: int = 100
    max_rows_per_trigger: int = 500_000
    replay_timeout_s: float = 120.0
    rows_per_partition: int = 250_000
    rows_per_arrow_batch: int = 250_000
    exclusive: bool = False
    connector_factory: str = ""
    available_now_stall_s: float = 120.0
    starting_offsets: str = "earliest"
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password: str = field(default="", repr=False)
    table: str = ""  # typed mode: "schema.table"
    prefetch: bool = True

    @property
    def table_parts(self) -> tuple[str, str]:
        schema, _, table = self.table.partition(".")
        return schema, table

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> CanalOptions:
        etcd, servers = _list(opts.get("etcd")), _list(opts.get("server"))
        factory = str(opts.get("connectorFactory", ""))
        if bool(etcd) == bool(servers) and not factory:
            raise ConfigError("etcd", "give exactly one of the options 'etcd' and 'server'")
        for name in ("destination", "clientId"):
            if not str(opts.get(name, "")).strip():
                raise ConfigError(name, "is required")
        exclusive, prefetch = _bool(opts, "exclusive", False), _bool(opts, "prefetch", True)
        starting = str(opts.get("startingOffsets", "earliest")).strip().lower()
        if starting not in ("earliest", "latest"):
            raise ConfigError("startingOffsets", f"must be earliest or latest, got {starting!r}")
        table = str(opts.get("table", "")).strip()
        if table and not re.fullmatch(r"[^.\s]+\.[^\s]+", table):
            raise ConfigError("table", f"must be schema.table, got {table!r}")
        if table and str(opts.get("filter", "")).strip():
            raise ConfigError("filter", "not with 'table': a typed query reads its one table")
        return cls(
            destination=str(opts["destination"]).strip(),
            client_id=str(opts["clientId"]).strip(),
            etcd=etcd,
            servers=servers,
            batch_size=_int(opts, "batchSize", 1000, 1, 65_536),  # the server's limit
            filter=str(opts.get("filter", "")),
            token=_secret_option(opts, "token", "tokenFile") or None,
            etcd_prefix=str(opts.get("etcdPrefix", "/canal")),
            poll_timeout_s=_int(opts, "pollTimeoutMs", 1000, 0, 600_000) / 1000,
            max_batches_per_trigger=_int(opts, "maxBatchesPerTrigger", 100, 1, 100_000),
            max_rows_per_trigger=_int(opts, "maxRowsPerTrigger", 500_000, 1, 1_000_000_000),
            replay_timeout_s=float(_int(opts, "replayTimeoutS", 120, 1, 86_400)),
            rows_per_partition=_int(opts, "rowsPerPartition", 250_000, 1, 10_000_000),
            rows_per_arrow_batch=_int(opts, "rowsPerArrowBatch", 250_000, 1, 10_000_000),
            exclusive=exclusive,
            connector_factory=factory,
            available_now_stall_s=float(_int(opts, "availableNowStallS", 120, 1, 86_400)),
            starting_offsets=starting,
            etcd_ca_file=str(opts.get("etcdCaFile", "")),
            etcd_cert_file=str(opts.get("etcdCertFile", "")),
            etcd_key_file=str(opts.get("etcdKeyFile", "")),
            etcd_user=str(opts.get("etcdUser", "")),
            etcd_password=_secret_option(opts, "etcdPassword", "etcdPasswordFile"),
            table=table,
            prefetch=prefetch,
        )

    def etcd_security(self) -> Any:
        """The ``EtcdSecurity`` of the ``etcd*`` options (None when none is given)."""
        if not (self.etcd_ca_file or self.etcd_cert_file or self.etcd_user):
            return None
        from canal_cluster.etcd_security import EtcdSecurity

        return EtcdSecurity(
            self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file, self.etcd_user,
            self.etcd_password, labels=_ETCD_LABELS,
        )  # fmt: skip


_ETCD_LABELS = {
    "endpoints": "etcd",
    "ca_file": "etcdCaFile",
    "cert_file": "etcdCertFile",
    "key_file": "etcdKeyFile",
    "username": "etcdUser",
    "password": "etcdPassword",
}


def _secret_option(opts: Mapping[str, str], name: str, file_name: str) -> str:
    """Option ``name``, or the content of the file ``file_name`` names (one trailing
    newline off): a secret that stays out of the job's code and command line."""
    path = str(opts.get(file_name, ""))
    if path and opts.get(name):
        raise ConfigError(file_name, f"give {name} or {file_name}, not both")
    if not path:
        return str(opts.get(name, ""))
    try:
        return Path(path).read_text().removesuffix("\n")
    except OSError as exc:
        raise ConfigError(file_name, f"cannot read {path!r}: {exc.strerror}") from None


def table_filter(options: CanalOptions) -> str:
    """The client filter of a query: ``filter``, or exactly the typed mode's table."""
    if not options.table:
        return options.filter
    schema, table = options.table_parts
    return re.escape(schema) + "\\." + re.escape(table)
