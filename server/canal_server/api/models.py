"""Request and response models of the REST API (validation and the OpenAPI schema).

Requests are validated strictly (no string → int coercion, unknown fields refused);
responses are documented here but written by the routes themselves, as JSON or
msgpack (``Accept: application/msgpack``). In msgpack, binary column values are
bytes; in JSON they are base64 strings.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from canal_protocol.errors import InvalidArgument
from canal_protocol.ids import ID_JSON_PATTERN, ID_MAX_LEN, validate_id
from canal_server.embedded import MAX_BATCH_SIZE, MAX_TIMEOUT_S

__all__ = [
    "LAYOUT_DOC",
    "MAX_FILTER_LEN",
    "MAX_INT64",
    "MAX_TIMEOUT_MS",
    "START_DOC",
    "AckOut",
    "BatchOut",
    "BatchRequest",
    "BinlogEndOut",
    "ClusterOut",
    "ColumnOut",
    "ColumnsOut",
    "ConsoleActionOut",
    "ConsoleActionRequest",
    "ConsoleClientOut",
    "ConsoleDestinationOut",
    "ConsoleLeadershipOut",
    "ConsoleNodeDestinationOut",
    "ConsoleNodeOut",
    "ConsoleNodeRowOut",
    "ConsoleStateOut",
    "CursorOut",
    "CursorRequest",
    "DatabaseOut",
    "DestinationHealth",
    "EntryOut",
    "EntryPositionIn",
    "ErrorBody",
    "EtcdOut",
    "HeaderOut",
    "HealthOut",
    "Id",
    "IdentityIn",
    "Layout",
    "Position",
    "PositionIn",
    "ReaderOut",
    "ReaderPositionOut",
    "RollbackOut",
    "RowOut",
    "SnapshotListOut",
    "SnapshotOut",
    "SnapshotRequest",
    "StepDownOut",
    "StepDownRequest",
    "SubscriptionOut",
    "SubscriptionRequest",
    "TableColumnOut",
    "TableOut",
    "TableProgressOut",
    "UnsubscribeOut",
]

MAX_TIMEOUT_MS = int(MAX_TIMEOUT_S * 1000)
Layout = Literal["rows", "compact"]
LAYOUT_DOC = (
    "`rows` (default): API.md's entries, each row a list of column objects; `compact`:"
    " each ROWDATA entry of a rows event has `columns` ({names, mysql_types, keys}) once"
    " and `before`/`after` as lists of value lists in column order (no `rows`)"
)
MAX_FILTER_LEN = 4096


def _id(value: str) -> str:
    try:
        return validate_id(value, "id")
    except InvalidArgument as exc:
        raise ValueError(exc.reason) from None


# An id in a body (the one id rule, canal_protocol.ids): 400 naming its field
Id = Annotated[
    str,
    AfterValidator(_id),
    WithJsonSchema(
        {"type": "string", "minLength": 1, "maxLength": ID_MAX_LEN, "pattern": ID_JSON_PATTERN}
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


MAX_INT64 = 2**63 - 1
START_DOC = (
    "where a NEW subscription of this client id starts (also the first one after an "
    "unsubscribe): `latest` (default) = the destination's current end (the newest position "
    "the leader's reader has put into its store): only changes after it are delivered; "
    "`earliest` = just before the oldest change the destination still holds (what no "
    "client has acked yet, or where the leader's store begins); a position (a cursor, or a "
    "batch's `start`/`end`): the changes after it, which must lie within what is held "
    "(else 400 with `field: start`). The start becomes the client's cursor at once (and is "
    "in etcd before the answer: a new leader keeps it). A re-subscribe never moves the "
    "cursor: `start` is then ignored."
)


class IdentityIn(_Request):
    source_address: str = Field(default="", max_length=255, description="host:port")
    slave_id: int = Field(default=0, ge=0, le=MAX_INT64)
    source_server_id: int = Field(
        default=0, ge=0, le=MAX_INT64, description="@@server_id of the database read; 0 = unknown"
    )


class EntryPositionIn(_Request):
    journal: str = Field(max_length=255, description="binlog file")
    offset: int = Field(ge=0, le=MAX_INT64, description="where the next event starts")
    server_id: int = Field(default=0, ge=0, le=MAX_INT64)
    gtid: str = Field(default="", max_length=MAX_FILTER_LEN)
    timestamp_ms: int = Field(default=0, ge=0, le=MAX_INT64)
    included: bool = True
    part: int = Field(
        default=0, ge=0, le=MAX_INT64,
        description="inside a MySQL 8 compressed transaction: the place after its n-th "
        "event (offset = its payload's start); 0 elsewhere",
    )  # fmt: skip


class PositionIn(_Request):
    """A position as ``GET .../cursor`` and batches give it."""

    identity: IdentityIn
    position: EntryPositionIn


class SubscriptionRequest(_Request):
    filter: str = Field(
        default="",
        max_length=MAX_FILTER_LEN,
        description="comma-separated regexes on schema.table (Canal syntax); empty = all",
    )
    start: Literal["latest", "earliest"] | PositionIn = Field(
        default="latest", description=START_DOC
    )


class BatchRequest(_Request):
    size: int = Field(default=1000, ge=1, le=MAX_BATCH_SIZE, description="max entries in the batch")
    timeout_ms: int = Field(default=0, ge=0, le=MAX_TIMEOUT_MS, description="long-poll wait")
    auto_ack: bool = Field(default=False, description="true: Canal's get (ack at once)")
    layout: Layout = Field(default="rows", description=LAYOUT_DOC)
    request_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="the client's name for this get, the same on its retries: a retry of a "
        "get that already took a batch gets that batch again (nothing skipped, nothing "
        "delivered twice); the last 16 per client are remembered",
    )
    ack: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT64,
        description="a batch the client has processed: acknowledged (as `POST .../ack`, "
        "cumulative) before this get takes the next batch, saving the ack's round trip. A "
        "batch issued but no longer outstanding (acked by a lost attempt of this get, or "
        "rolled back) is a no-op here; an id never issued: 409 batch_not_outstanding",
    )


class CursorRequest(_Request):
    logfile: str = Field(
        min_length=1, max_length=512, description="`header.logfile` of the last committed entry"
    )
    offset: int = Field(
        ge=0, le=2**63 - 1, description="`header.offset` (the event's start) of that entry"
    )


class ErrorBody(BaseModel):
    error: str = Field(description="machine-readable code, e.g. invalid_argument")
    message: str
    field: str | None = Field(default=None, description="the bad input, for invalid_argument")
    leader: str | None = Field(default=None, description="leader URL, for not_leader")


class Position(BaseModel):
    identity: dict[str, Any]
    position: dict[str, Any]


class ColumnOut(BaseModel):
    name: str
    value: Any = Field(description="int, str (DECIMAL, temporal ISO-8601, JSON text), bytes")
    is_key: bool
    updated: bool
    mysql_type: str
    is_null: bool


class RowOut(BaseModel):
    before: list[ColumnOut]
    after: list[ColumnOut]


class HeaderOut(BaseModel):
    logfile: str
    offset: int
    end_offset: int
    server_id: int
    timestamp_ms: int
    gtid: str
    schema_: str = Field(alias="schema")
    table: str
    event_type: str
    part: int = Field(
        default=0,
        description="only on the entries of a MySQL 8 compressed transaction (one "
        "TRANSACTION_PAYLOAD event, the offset and end_offset of them all): 1, 2, ... their "
        "order in it",
    )


class ColumnsOut(BaseModel):
    names: list[str]
    mysql_types: list[str]
    keys: list[bool]


class EntryOut(BaseModel):
    type: str = Field(description="TRANSACTIONBEGIN, ROWDATA or TRANSACTIONEND")
    header: HeaderOut
    is_ddl: bool
    sql: str
    rows: list[RowOut] | None = Field(default=None, description="layout `rows` (the default)")
    columns: ColumnsOut | None = Field(default=None, description="layout `compact`")
    before: list[list[Any]] | None = Field(default=None, description="layout `compact`")
    after: list[list[Any]] | None = Field(default=None, description="layout `compact`")


class BatchOut(BaseModel):
    id: int = Field(description="-1 when nothing arrived within the timeout")
    entries: list[EntryOut]
    start: Position | None = None
    end: Position | None = None


class SubscriptionOut(BaseModel):
    destination: str
    client_id: str
    filter: str
    cursor: Position | None = Field(
        description="where the client resumes after: its start for a new subscription, "
        "else its unchanged cursor"
    )
    created: bool = Field(description="true: a new subscription (its `start` applied)")


class UnsubscribeOut(BaseModel):
    destination: str
    client_id: str
    subscribed: bool


class AckOut(BaseModel):
    acked: int


class RollbackOut(BaseModel):
    rolled_back: int | None = Field(description="the batch id, or null for all")


class CursorOut(BaseModel):
    cursor: Position | None


class TableColumnOut(BaseModel):
    name: str
    mysql_type: str = Field(
        description="the entries' notation (`columns.mysql_types`): `int unsigned`, "
        "`decimal(30,10)`, `varchar(40)`, `datetime(6)`, `enum('a','b')`; JSON is `longtext`"
    )
    column_type: str = Field(description="information_schema.COLUMNS.COLUMN_TYPE as is")
    nullable: bool
    is_key: bool = Field(description="part of the primary key")


class TableOut(BaseModel):
    destination: str
    schema_: str = Field(alias="schema")
    table: str
    version: str = Field(
        description="hash of the column names and mysql_types: changes with every ALTER "
        "that adds, drops, renames, reorders or retypes a column"
    )
    columns: list[TableColumnOut] = Field(description="in table order")
    primary_key: list[str] = Field(description="the primary key's columns in key order")
    source_address: str = Field(description="host:port of the database asked")


class ReaderOut(BaseModel):
    state: str = Field(description="idle, finding, running, retrying or failed")
    error: str = Field(description="last reader error, e.g. a purged binlog position")
    error_type: str
    start: dict[str, Any] | None
    warning: str = Field(
        default="",
        description="set for the whole term when the leader went on in a way that may have "
        "skipped changes, e.g. the destination's origin could not be found on the source "
        "and it started anew (what, where, and which clients are concerned)",
    )


class ReaderPositionOut(BaseModel):
    journal: str = Field(description="binlog file")
    offset: int = Field(description="where the next event starts")
    gtid: str = Field(description="GTID state including the last transaction read")
    timestamp_ms: int = Field(description="commit time of the last transaction read")
    source_address: str = Field(description="host:port of the database read")


class BinlogEndOut(BaseModel):
    journal: str = Field(description="SHOW MASTER STATUS: the current binlog file")
    offset: int = Field(description="SHOW MASTER STATUS: its end")
    gtid: str = Field(description="@@gtid_binlog_pos, read after the position")
    source_address: str = Field(description="host:port of the database asked")


class DatabaseOut(BaseModel):
    reachable: bool = Field(
        description="the database answered SHOW MASTER STATUS (1 s timeouts, cached for 1 s)"
    )
    address: str = Field(
        description="host:port asked: the source the leader reads, else the configured master"
    )
    error: str = Field(description="why it is not reachable; empty when it is")


class EtcdOut(BaseModel):
    reachable: bool = Field(
        description="etcd answered a read within the node's etcd timeout (cached for 1 s)"
    )
    error: str = Field(description="why it is not reachable; empty when it is")


class DestinationHealth(BaseModel):
    role: str = Field(description="leader, standby, fenced or starting")
    epoch: int
    leader_node: str | None
    leader_url: str | None
    reader: ReaderOut
    reader_position: ReaderPositionOut | None = Field(
        default=None,
        description="the newest position the reader has put into the store (everything "
        "before it is stored or filtered out; its start before the first transaction); "
        "null when this node does not read the destination",
    )
    binlog_end: BinlogEndOut | None = Field(
        default=None,
        description="where the source's binlog ends now (cached for 1 s); only on the "
        "leader, null when the database does not answer",
    )
    database: DatabaseOut


class HealthOut(BaseModel):
    node: str
    url: str
    row_decoder: Literal["c", "python"] = Field(
        description="the row decoder this node runs: the C extension, or Python "
        "(when the extension is missing, or CANAL_ROWCODEC=python)"
    )
    etcd: EtcdOut
    destinations: dict[str, DestinationHealth]


class ClusterOut(BaseModel):
    nodes: list[dict[str, Any]]
    destinations: dict[str, dict[str, Any]]


MAX_STEP_DOWN_MS = 600_000


class StepDownRequest(_Request):
    to: Id | None = Field(
        default=None,
        description="the node to hand over to: live, not leaving, configured for the "
        "destination; default: the one leading the fewest destinations",
    )
    timeout_ms: int = Field(
        default=10_000,
        ge=1,
        le=MAX_STEP_DOWN_MS,
        description="how long to wait for the successor to lead (else 503 handover_timeout)",
    )


class StepDownOut(BaseModel):
    destination: str
    from_: str = Field(alias="from", description="the node that led and stepped down")
    to: str = Field(description="the node that leads now")
    epoch: int = Field(description="the epoch handed over")
    new_epoch: int = Field(description="the successor's epoch")
    took_ms: float = Field(description="from the request to the successor leading")


# -- the web console (/console, routes_console.py) ------------------------------------------


class ConsoleLeadershipOut(BaseModel):
    at_ms: int = Field(description="when the node recorded it (ms since the epoch)")
    node: str
    change: Literal["gained", "ended"]
    epoch: int | None
    reason: str = Field(description="e.g. won, took_over, handed_over, lost, fenced, released")
    detail: str = Field(description="why, for handovers and rebalancing")


class ConsoleClientOut(BaseModel):
    client_id: str
    cursor: Position | None
    lag_s: float | None = Field(description="cursor behind the newest event read, seconds")
    outstanding_batches: int
    active_consumer: str | None = Field(
        description="the consumer holding the client's running key in etcd"
    )


class ConsoleNodeDestinationOut(DestinationHealth):
    lag_bytes: int | None = Field(
        description="binlog end minus reader position (same file; null otherwise)"
    )
    lag_s: float | None = Field(description="0 at the end, else now minus the last commit read")
    store_entries: int
    store_bytes: int
    store_capacity_bytes: int = Field(description="memory.buffer_bytes")
    rows_per_s: list[list[float]] = Field(
        description="[t_ms, rows/s] every 5 s, the last 10 minutes, as this node read them"
    )
    leadership: list[ConsoleLeadershipOut]
    clients: list[ConsoleClientOut] = Field(description="on the leader only")
    snapshots: list[dict[str, Any]] = Field(description="on the leader only (SnapshotOut)")


class ConsoleNodeOut(BaseModel):
    node: str
    url: str
    version: str
    row_decoder: Literal["c", "python"]
    etcd: EtcdOut
    destinations: dict[str, ConsoleNodeDestinationOut]


class ConsoleNodeRowOut(BaseModel):
    node: str
    url: str
    alive: bool | None = Field(
        description="registered in etcd (its lease is alive); null when etcd did not answer"
    )
    reachable: bool = Field(description="answered /v1/console/node to the answering node")
    leaving: bool
    version: str | None
    row_decoder: str | None
    destinations: list[str] = Field(description="configured")
    leads: list[str]
    etcd_reachable: bool | None
    error: str


class ConsoleDestinationOut(BaseModel):
    leader: dict[str, Any] | None = Field(description="{node, url, epoch} from etcd")
    nodes: list[str]
    reader: ReaderOut | None
    reader_position: ReaderPositionOut | None
    binlog_end: BinlogEndOut | None
    lag_bytes: int | None
    lag_s: float | None
    store_entries: int | None
    store_bytes: int | None
    store_capacity_bytes: int | None
    database: DatabaseOut | None
    clients: list[ConsoleClientOut]
    snapshots: list[dict[str, Any]]
    rows_per_s: list[list[float]] = Field(description="[t_ms, rows/s] summed over the nodes")
    leadership: list[ConsoleLeadershipOut] = Field(description="newest first, every node's")


class ConsoleStateOut(BaseModel):
    node: str = Field(description="the node that answered")
    url: str
    at_ms: int
    etcd: EtcdOut = Field(description="reachable false: this node lost etcd")
    nodes: list[ConsoleNodeRowOut]
    destinations: dict[str, ConsoleDestinationOut]


class ConsoleActionRequest(_Request):
    action: Literal["step_down", "start_snapshot", "cancel_snapshot", "rollback"]
    destination: Id
    client_id: Id | None = Field(default=None, description="rollback")
    snapshot_id: Id | None = Field(default=None, description="cancel_snapshot")
    tables: list[str] | None = Field(
        default=None, max_length=256, description="start_snapshot: regexes on schema.table"
    )
    to: Id | None = Field(default=None, description="step_down: the successor")


class ConsoleActionOut(BaseModel):
    action: str
    destination: str
    leader: str = Field(description="the URL the action was sent to")
    status: int = Field(description="the leader's HTTP status (also this answer's)")
    result: dict[str, Any] = Field(description="the leader's answer")


# -- incremental snapshots (routes_snapshots.py) ----------------------------------------------


class SnapshotRequest(_Request):
    tables: list[str] = Field(
        min_length=1,
        max_length=256,
        description="regexes matched against the whole `schema.table` (case-insensitive, "
        'the filter\'s engine: docs/api.md, "Filters"); every table must be InnoDB, inside '
        "the destination's filter, with a primary key or a unique key of NOT NULL columns",
    )
    chunk_rows: int | None = Field(
        default=None, ge=1, le=1_000_000, description="rows per chunk (default: the config's)"
    )


class TableProgressOut(BaseModel):
    table: str
    done: bool
    rows: int = Field(description="rows read into the stream (re-read chunks count again)")
    chunks: int
    last_key: list[Any] | None = Field(description="the last key read (bytes as {b64})")
    note: str = Field(description='"dropped" when the table went away during the snapshot')


class SnapshotOut(BaseModel):
    id: str
    state: str = Field(description="pending, running, done, cancelled or failed")
    tables: list[TableProgressOut]
    tables_done: int
    tables_total: int
    rows: int
    chunks: int
    rows_per_s: float = Field(
        description="running: since this leader took the snapshot up; done: over its run"
    )
    chunk_rows: int
    created_ms: int
    started_ms: int
    finished_ms: int
    error: str


class SnapshotListOut(BaseModel):
    snapshots: list[SnapshotOut]
