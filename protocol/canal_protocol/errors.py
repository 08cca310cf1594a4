"""Every exception canal-ha raises on purpose, in one tree.

::

    CanalError                      base of everything below
    ├── ConfigError                 a bad configuration value (names the key)
    ├── SandboxError                the private MariaDB/etcd sandbox
    │   ├── SandboxStartError       a part did not start (names the part and its log)
    │   └── SandboxStateError       cluster.json missing/unreadable, unknown member
    ├── RetryExhausted              a RetryPolicy ran out of attempts or time
    ├── BinlogError                 reading the binlog failed
    │   ├── BinlogConfigError       server variables canal needs are wrong (names them)
    │   ├── PositionNotFound        no binlog holds the wanted start position/time
    │   ├── PurgedPosition          the start position was purged (errno 1236)
    │   ├── BinlogConnectionLost    the binlog dump connection broke (resume from own position)
    │   └── RowDecodeError          a rows event's row data is truncated or corrupt (rowcodec)
    ├── StoreError                  the event store
    │   └── StoreClosed             put/get on a store that was stopped
    ├── ServerError                 embedded server calls (client-facing, API 4xx)
    │   ├── UnknownDestination      no such destination (404)
    │   ├── NotSubscribed           the client has not subscribed (409)
    │   ├── UnknownBatch            batch id unknown, acked or rolled back (404/409)
    │   ├── BatchUnavailable        an outstanding batch's entries are not (yet) stored (503)
    │   ├── StartUnavailable        a new subscription's start is not known yet (503)
    │   ├── InvalidArgument         a bad argument; names the field (400)
    │   │   └── UnknownTable        no such table; a snapshot's regex matches none (404)
    │   ├── UnknownSnapshot         no such incremental snapshot (404)
    │   ├── SnapshotConflict        a table is in a running snapshot, or it has ended (409)
    │   ├── Unauthorized            no or bad bearer token (401)
    │   └── Forbidden               a valid token without the right (403: role, destination)
    ├── CoordinationError           etcd and elections
    │   ├── CoordinatorUnavailable  etcd cannot be reached right now
    │   │   └── CoordinatorAccessDenied  etcd refuses us: TLS, user/password or role (names the key)
    │   ├── Fenced                  our epoch is stale or our lease lapsed: step down
    │   └── HandoverFailed          a graceful handover (step-down) could not be done (409)
    │       └── HandoverTimeout     handed over, but the successor did not take over in time (503)
    └── ClientError                 (canal_client) a call to the servers could not complete
        ├── ServerUnreachable       connection refused/reset, timeout (transport)
        ├── LeaderUnavailable       503 / no leader known yet (``retry_after_s``)
        ├── StaleLeader             a reply carried a lower epoch than one already seen
        ├── UnexpectedResponse      a reply the client cannot use (status, body, redirects)
        ├── ReplayMismatch          (Spark source) a replayed micro-batch differs from its plan
        └── SchemaChanged           (Spark source) a typed stream's table changed its columns
            └── IncompatibleChange  (Delta mirror) a column change the mirror cannot follow

Later packages add their own subclasses of ``CanalError`` here, so that one
``except CanalError`` catches every deliberate failure of the project.
"""

from __future__ import annotations

__all__ = [
    "BatchUnavailable",
    "BinlogConfigError",
    "BinlogConnectionLost",
    "BinlogError",
    "CanalError",
    "ClientError",
    "ConfigError",
    "CoordinationError",
    "CoordinatorAccessDenied",
    "CoordinatorUnavailable",
    "Fenced",
    "Forbidden",
    "HandoverFailed",
    "HandoverTimeout",
    "IncompatibleChange",
    "InvalidArgument",
    "LeaderUnavailable",
    "NotSubscribed",
    "PositionNotFound",
    "PurgedPosition",
    "ReplayMismatch",
    "RetryExhausted",
    "RowDecodeError",
    "SandboxError",
    "SandboxStartError",
    "SandboxStateError",
    "SchemaChanged",
    "ServerError",
    "ServerUnreachable",
    "SnapshotConflict",
    "StaleLeader",
    "StartUnavailable",
    "StoreClosed",
    "StoreError",
    "Unauthorized",
    "UnexpectedResponse",
    "UnknownBatch",
    "UnknownDestination",
    "UnknownSnapshot",
    "UnknownTable",
]


class CanalError(Exception):
    """Base of every deliberate canal-ha failure."""


class ConfigError(CanalError):
    """A configuration value is invalid; the message names the key and the reason."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class SandboxError(CanalError):
    """Something went wrong with the private sandbox."""


class SandboxStartError(SandboxError):
    """A sandbox part did not start; says which part and where its log is."""

    def __init__(self, part: str, reason: str, log_path: str | None = None) -> None:
        where = f" (log: {log_path})" if log_path else ""
        super().__init__(f"{part} failed to start: {reason}{where}")
        self.part = part
        self.log_path = log_path


class SandboxStateError(SandboxError):
    """The recorded sandbox state is missing, unreadable or does not name that part."""


class RetryExhausted(CanalError):
    """A retry policy gave up; ``last_error`` is the final failure, if any."""

    def __init__(self, what: str, attempts: int, last_error: BaseException | None) -> None:
        tail = f": {last_error}" if last_error is not None else ""
        super().__init__(f"{what}: gave up after {attempts} attempts{tail}")
        self.what = what
        self.attempts = attempts
        self.last_error = last_error


class BinlogError(CanalError):
    """Reading the binlog failed."""


class BinlogConfigError(BinlogError):
    """The database's binlog settings are not what canal needs; names each variable."""


class PositionNotFound(BinlogError):
    """No binlog holds the wanted start position or time."""


class PurgedPosition(BinlogError):
    """The start position lies in a purged binlog (MySQL error 1236)."""


class BinlogConnectionLost(BinlogError):
    """The binlog dump connection broke (errors 2013/2006); resume from our own position."""


class RowDecodeError(BinlogError):
    """The row data of a rows event is truncated or corrupt (it cannot be decoded)."""


class StoreError(CanalError):
    """The event store failed."""


class StoreClosed(StoreError):
    """The store was stopped while a put or get waited."""


class ServerError(CanalError):
    """A client-facing failure of the embedded server (maps to an API 4xx)."""


class UnknownDestination(ServerError):
    """No such destination."""


class NotSubscribed(ServerError):
    """The client has not subscribed to the destination."""


class UnknownBatch(ServerError):
    """The batch id is unknown, already acked or rolled back."""


class InvalidArgument(ServerError):
    """A bad argument; ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownTable(InvalidArgument):
    """No such table (404 ``unknown_table``): the destination's database has no table of
    that name (the tables route), or a snapshot's regex matches none; ``field`` names the
    input."""


class UnknownSnapshot(ServerError):
    """No incremental snapshot has this id."""


class SnapshotConflict(ServerError):
    """A table is already in a snapshot that runs, or the snapshot has ended; ``field``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class CoordinationError(CanalError):
    """etcd or an election failed."""


class CoordinatorUnavailable(CoordinationError):
    """etcd cannot be reached right now."""


class CoordinatorAccessDenied(CoordinatorUnavailable):
    """etcd answered but refuses us: the TLS handshake (certificate, CA, host name), the
    user name or password, or the role's permissions; ``key`` names the setting to fix.

    A start-up check raises it at once (no retry can fix it); loops that run later
    treat it like an outage (a leader fences itself), so it subclasses that."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class Fenced(CoordinationError):
    """Our epoch is stale or our lease lapsed: stop serving and writing."""


class HandoverFailed(CoordinationError):
    """A graceful handover could not be done: this node does not lead the destination,
    no other node can take it, or etcd did not take the handover."""


class HandoverTimeout(HandoverFailed):
    """The leader handed the destination over, but the successor did not lead it in time
    (the handover expires with its lease and the other nodes campaign)."""


class BatchUnavailable(ServerError):
    """An outstanding batch's entries are not in the store (yet): retry later or roll back."""


class StartUnavailable(ServerError):
    """A new subscription's start is not known yet: the leader's reader is still finding
    where to begin (503, retry)."""


class Unauthorized(ServerError):
    """No or a bad bearer token (401)."""


class Forbidden(ServerError):
    """A valid token that may not do this (403): a consumer token on an admin route, on
    a destination or client id it is not limited to."""


class ClientError(CanalError):
    """canal_client: a call to the servers could not complete."""


class ServerUnreachable(ClientError):
    """The server could not be reached or broke the connection (transport failure)."""


class LeaderUnavailable(ClientError):
    """No leader is known right now (503); ``retry_after_s`` is the server's hint."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StaleLeader(ClientError):
    """A reply carried a lower epoch than one already seen: it came from a stale leader."""


class UnexpectedResponse(ClientError):
    """A reply the client cannot use (unknown status, bad body, redirect loop)."""


class ReplayMismatch(ClientError):
    """The Spark source could not rebuild a planned micro-batch exactly (count or range)."""


class SchemaChanged(ClientError):
    """A typed Spark stream met rows of its table with other columns than the query's
    schema (an ALTER TABLE): the message names the table, the change and what to do."""


class IncompatibleChange(SchemaChanged):
    """The Delta mirror (``canal_client.spark.delta``) cannot follow a table's new columns (a
    type that does not widen, a key column gone): the message names the table and the
    column; nothing of the micro-batch was written."""
