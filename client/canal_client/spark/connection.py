"""The connector the Spark reader needs: its contract (``ConnectorLike``, what
``canal_client.connector`` gives), the factory (a ``ClusterConnector`` for the options,
or the ``connectorFactory`` plug-in ``module:function``) and the typed mode's table
lookup (``GET .../tables/{schema.table}`` of the leader)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from canal_client.spark.options import CanalOptions
from canal_client.spark.schema import TypedTable
from canal_cluster.retry import RetryPolicy
from canal_protocol import Batch
from canal_protocol.errors import CanalError, ConfigError, RetryExhausted, UnknownTable

__all__ = ["LOOKUP_RETRY", "ConnectorLike", "fetch_table", "make_connector"]


class ConnectorLike(Protocol):
    @property
    def epoch(self) -> int: ...
    @property
    def leader_url(self) -> str | None: ...
    def connect(self) -> None: ...
    def disconnect(self) -> None: ...
    def subscribe(self, filter: str = "", start: str | None = None) -> None: ...
    def get_without_ack(self, size: int, timeout_s: float) -> Batch: ...
    def get_batch(self, batch_id: int) -> Batch: ...
    def ack(self, batch_id: int) -> object: ...
    def rollback(self, batch_id: int | None = None) -> None: ...
    def move_cursor(self, logfile: str, offset: int) -> dict[str, Any] | None: ...


def make_connector(options: CanalOptions, lookup: bool = False) -> ConnectorLike:
    """A ClusterConnector for the options, or the ``connectorFactory`` ("module:function").
    ``lookup``: for read-only calls (``table``): no rollback on connect, bounded retries."""
    if options.connector_factory:
        module, _, name = options.connector_factory.partition(":")
        factory: Callable[[CanalOptions], ConnectorLike] = getattr(
            importlib.import_module(module), name
        )
        return factory(options)
    from canal_client.connector import ClusterConnector

    extra: dict[str, Any] = {}
    if lookup:
        extra = {"rollback_on_connect": False, "retry": LOOKUP_RETRY}
    return ClusterConnector(
        options.destination,
        options.client_id,
        etcd=list(options.etcd) or None,
        servers=list(options.servers) or None,
        token=options.token,
        prefix=options.etcd_prefix,
        exclusive=options.exclusive and not lookup,
        etcd_security=options.etcd_security(),
        **extra,
    )


LOOKUP_RETRY = RetryPolicy(initial_s=0.2, multiplier=2.0, max_delay_s=2.0, attempts=30)


def fetch_table(options: CanalOptions) -> TypedTable:
    """The typed mode's table as the leader answers it now (``GET .../tables/{t}``);
    ``ConfigError`` naming ``table`` when it does not exist or no leader answers."""
    conn = make_connector(options, lookup=True)
    lookup = getattr(conn, "table", None)
    if not callable(lookup):
        raise ConfigError("table", f"{type(conn).__name__} cannot look tables up")
    try:
        conn.connect()
        answer = lookup(options.table)
    except UnknownTable as exc:
        raise ConfigError("table", f"{options.table}: no such table ({exc})") from None
    except (RetryExhausted, CanalError) as exc:
        raise ConfigError(
            "table", f"{options.table}: the destination's leader did not answer its columns: {exc}"
        ) from None
    finally:
        conn.disconnect()
    return TypedTable.from_wire(answer)
