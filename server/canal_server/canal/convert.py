"""canal-ha's entries as Canal's protobuf ``Entry`` (``EntryProtocol.proto``).

``encode_entries(entries)`` gives the serialized ``Entry`` of every entry a Canal client
gets, in order: what a MESSAGES packet carries. ``to_canal_entry(entry)`` builds the same
message with the generated classes (the reference: a test parses ``encode_entries``'
bytes and compares). The rules follow Canal's ``LogEventConvert``:

- Header: ``version`` 1, ``logfileName``, ``logfileOffset`` (the event's start),
  ``serverId``, ``serverenCode`` ``UTF-8``, ``executeTime`` (ms), ``sourceType`` MYSQL,
  ``schemaName``/``tableName``, ``eventLength``, ``eventType`` (not on BEGIN/END, as
  Canal), ``gtid`` (the GTID state including the entry's transaction, as Canal in GTID
  mode), ``props``: ``curtGtid`` (MySQL GTIDs), ``rowsCount`` (rows entries).
- TRANSACTIONBEGIN's storeValue a ``TransactionBegin`` with ``threadId`` (MySQL's
  ``BEGIN``; MariaDB's GTID event has none: 0), TRANSACTIONEND's a ``TransactionEnd``
  with ``transactionId`` the XID (``"0"`` for a ``COMMIT`` query, as Canal).
- ROWDATA's a ``RowChange``: rows: ``eventType``, ``isDdl`` false, ``rowDatas`` (INSERT
  after columns, DELETE before columns, UPDATE both); a statement: ``isDdl`` true, ``sql``,
  ``ddlSchemaName``. Columns: ``index``, ``sqlType``, ``name``, ``isKey``, ``updated``
  (every column of an INSERT's after image; in an UPDATE's after image those whose text
  or nullness changed), ``isNull`` (always set, as Canal), ``value`` (``values``),
  ``mysqlType`` (``types``); ``length`` is never set (Canal does not set it).

canal-ha's own kinds: the rows of an incremental snapshot (``READ``) are INSERTs with
the header prop ``snapshot`` (their ordinal), also on the BEGIN/END around a chunk; a
HEARTBEAT entry has no Canal form (Canal's sink drops heartbeats before its store) and
is dropped. docs/canal-protocol.md has the table.

Speed: ``encode_entries`` writes the bytes in C (``_native``, ``_canalcodec.c``: a
table's constant bytes per column encoded once, the values read from the store's msgpack
without a Python object each); ``encode_entries_python`` writes the same bytes in Python
(``_wire``), the C encoder's reference and its way out for what it does not write
itself; the generated (upb) classes build a Python object per column of every row
(measured: benchmarks/bench_canal_encode.py, docs/canal-protocol.md "Speed").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgpack

from canal_protocol.canal import entry_pb2 as pb
from canal_protocol.entry import Entry, EntryType, EventType, Header, TableColumns
from canal_protocol.gtid import GtidSet, MariadbGtidState, is_mysql_gtid_set
from canal_server.canal import _native, _wire
from canal_server.canal.types import LOCAL, CanalForm, CanalType, canal_type
from canal_server.packed import PackedRows

__all__ = [
    "LOCAL",
    "SNAPSHOT_PROP",
    "CanalForm",
    "canal_gtid",
    "column_value",
    "encode_entries",
    "encode_entries_python",
    "to_canal_entry",
]

SNAPSHOT_PROP = "snapshot"  # header prop of an incremental snapshot's entries: the ordinal
_ENCODING = "UTF-8"
_ENTRY_TYPES = {
    EntryType.TRANSACTIONBEGIN: pb.TRANSACTIONBEGIN,
    EntryType.ROWDATA: pb.ROWDATA,
    EntryType.TRANSACTIONEND: pb.TRANSACTIONEND,
}
_EVENT_TYPES = {
    EventType.INSERT: pb.INSERT, EventType.UPDATE: pb.UPDATE, EventType.DELETE: pb.DELETE,
    EventType.QUERY: pb.QUERY, EventType.CREATE: pb.CREATE, EventType.ALTER: pb.ALTER,
    EventType.ERASE: pb.ERASE, EventType.TRUNCATE: pb.TRUNCATE, EventType.RENAME: pb.RENAME,
    EventType.CINDEX: pb.CINDEX, EventType.DINDEX: pb.DINDEX, EventType.GTID: pb.GTID,
    EventType.XACOMMIT: pb.XACOMMIT, EventType.READ: pb.INSERT,
}  # fmt: skip
_ROWS_KINDS = {EventType.INSERT, EventType.UPDATE, EventType.DELETE, EventType.READ}


def _begin(entry: Entry) -> bytes:
    """TransactionBegin: the thread id of MySQL's ``BEGIN`` (0: MariaDB has none)."""
    return pb.TransactionBegin(threadId=entry.thread_id).SerializeToString()


def _end(entry: Entry) -> bytes:
    """TransactionEnd: the XID (``"0"`` without one, as Canal for a ``COMMIT`` query)."""
    return pb.TransactionEnd(transactionId=str(entry.xid)).SerializeToString()


# -- values ---------------------------------------------------------------------------------


def column_value(mysql_type: str, value: Any, form: CanalForm = LOCAL) -> tuple[int, str]:
    """(``sqlType``, ``value`` text) of one value of a column of canal-ha's
    ``mysql_type``; (null code, ``""``) for NULL (Canal leaves ``value`` unset)."""
    kind = canal_type(mysql_type, form)
    if value is None:
        return kind.null_sql_type, ""
    return kind.sql_type_of(value), kind.text(value)


# -- header -----------------------------------------------------------------------------------

_last_gtid: tuple[str, str, str] = ("", "", "")


def canal_gtid(gtid: str, state: str) -> str:
    """Canal's ``Header.gtid``: the GTID state ``state`` (canal-ha's ``gtid_state``: before
    the transaction inside it) with the entry's own ``gtid`` in it (MariaDB: its domain's
    entry; MySQL: added to the set)."""
    global _last_gtid
    if not state or state == gtid:
        return gtid
    if not gtid:
        return state
    last = _last_gtid  # the entries of a transaction ask the same, one after the other
    if last[0] == gtid and last[1] == state:
        return last[2]
    if "," not in state and ":" not in state and state.partition("-")[0] == gtid.partition("-")[0]:
        return gtid  # MariaDB, one domain: the transaction's GTID is the state after it
    if is_mysql_gtid_set(state) or is_mysql_gtid_set(gtid):
        merged = str(GtidSet.parse(state) | GtidSet.parse(gtid))
    else:
        merged = str(MariadbGtidState.parse(state).with_state(MariadbGtidState.parse(gtid)))
    _last_gtid = (gtid, state, merged)
    return merged


def _props(entry: Entry) -> list[tuple[str, str]]:
    h = entry.header
    props = []
    if h.gtid and not h.snapshot and is_mysql_gtid_set(h.gtid):
        props.append(("curtGtid", h.gtid))
    if entry.type is EntryType.ROWDATA and entry.images is not None and len(entry.images):
        props.append(("rowsCount", str(len(entry.images))))
    if h.snapshot:
        props.append((SNAPSHOT_PROP, str(h.snapshot)))
    return props


def _header_fields(entry: Entry) -> _wire.HeaderFields:
    """What Canal's header says of ``entry`` (eventType only on ROWDATA, as Canal)."""
    h: Header = entry.header
    return (
        h.logfile, h.offset, h.server_id, h.timestamp_ms, h.schema, h.table,
        max(h.end_offset - h.offset, 0),
        _EVENT_TYPES[h.event_type] if entry.type is EntryType.ROWDATA else None,
        _props(entry), canal_gtid(h.gtid, entry.gtid_state),
    )  # fmt: skip


def _header(entry: Entry) -> pb.Header:
    logfile, offset, server_id, time_ms, schema, table, length, kind, props, gtid = _header_fields(
        entry
    )
    header = pb.Header(
        version=1, logfileName=logfile, logfileOffset=offset, serverId=server_id,
        serverenCode=_ENCODING, executeTime=time_ms, sourceType=pb.MYSQL, schemaName=schema,
        tableName=table, eventLength=length, gtid=gtid,
        props=[pb.Pair(key=k, value=v) for k, v in props],
    )  # fmt: skip
    if kind is not None:
        header.eventType = kind  # type: ignore[assignment]
    return header


def _has_canal_form(entry: Entry) -> bool:
    return entry.header.event_type is not EventType.HEARTBEAT and entry.type in _ENTRY_TYPES


def _row_change_head(entry: Entry) -> pb.RowChange:
    """The RowChange without its rows."""
    kind = _EVENT_TYPES[entry.header.event_type]
    if _is_statement(entry):
        return pb.RowChange(
            eventType=kind, isDdl=True, sql=entry.sql, ddlSchemaName=entry.header.schema
        )
    return pb.RowChange(eventType=kind, isDdl=False)


def _is_statement(entry: Entry) -> bool:
    return entry.is_ddl or entry.header.event_type not in _ROWS_KINDS


# a rows RowChange's head by event type: ``eventType`` and ``isDdl`` false
_ROWS_HEADS = {
    k: pb.RowChange(eventType=_EVENT_TYPES[k], isDdl=False).SerializeToString() for k in _ROWS_KINDS
}


# -- rows: the texts and flags Canal gives ------------------------------------------------------

Texts = tuple[str | None, ...]  # a row image's value texts, None for NULL


def _types(columns: TableColumns, form: CanalForm) -> tuple[CanalType, ...]:
    return tuple(canal_type(t, form) for t in columns.mysql_types)


def _texts(kinds: Sequence[CanalType], image: Sequence[Any]) -> Texts:
    return tuple(None if v is None else k.text(v) for k, v in zip(kinds, image, strict=True))


def _updated(before: Texts, after: Texts) -> list[bool]:
    """Canal's ``isUpdate``: a column changed when its text or its nullness did."""
    return [a != b for a, b in zip(after, before, strict=True)]


def _images(entry: Entry) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(before, after) images (a snapshot READ has ``after`` only, as an INSERT); the
    server's packed rows decoded without keeping the tuples in the store."""
    rows = entry.images
    if rows is None or entry.is_ddl:
        return (), ()
    if isinstance(rows, PackedRows):
        return rows.decoded()
    return rows.before, rows.after


# -- the reference: generated classes --------------------------------------------------------


def _pb_columns(
    columns: TableColumns,
    kinds: Sequence[CanalType],
    image: Sequence[Any],
    texts: Texts,
    updated: Sequence[bool],
) -> list[pb.Column]:
    out = []
    for i, (value, text) in enumerate(zip(image, texts, strict=True)):
        col = pb.Column(
            index=i,
            sqlType=kinds[i].sql_type_of(value),
            name=columns.names[i],
            isKey=columns.keys[i],
            updated=updated[i],
            isNull=text is None,
            mysqlType=kinds[i].mysql_type,
        )
        if text is not None:
            col.value = text
        out.append(col)
    return out


def to_canal_entry(entry: Entry, form: CanalForm = LOCAL) -> pb.Entry | None:
    """Canal's ``Entry`` of ``entry`` built with the generated classes; None when it has
    no Canal form (a heartbeat). ``form``: the time zone of TIMESTAMP texts and the
    display widths of ``mysqlType`` (``CanalForm``; default: the local zone, widths)."""
    if not _has_canal_form(entry):
        return None
    out = pb.Entry(header=_header(entry), entryType=_ENTRY_TYPES[entry.type])
    if entry.type is EntryType.TRANSACTIONBEGIN:
        out.storeValue = _begin(entry)
        return out
    if entry.type is EntryType.TRANSACTIONEND:
        out.storeValue = _end(entry)
        return out
    change = _row_change_head(entry)
    befores, afters = _images(entry)
    if befores or afters:
        assert entry.images is not None
        columns = entry.images.columns
        kinds = _types(columns, form)
        none = [False] * len(columns.names)
        every = [True] * len(columns.names)
        for i in range(max(len(befores), len(afters))):
            row = change.rowDatas.add()
            before = _texts(kinds, befores[i]) if befores else None
            if before is not None:
                row.beforeColumns.extend(_pb_columns(columns, kinds, befores[i], before, none))
            if afters:
                after = _texts(kinds, afters[i])
                updated = _updated(before, after) if before is not None else every
                row.afterColumns.extend(_pb_columns(columns, kinds, afters[i], after, updated))
    out.storeValue = change.SerializeToString()
    return out


# -- the fast paths: written by hand, in C and in Python ---------------------------------------


def encode_entries(entries: Sequence[Entry], form: CanalForm = LOCAL) -> list[bytes]:
    """One serialized Canal Entry (entry_pb2.Entry) per canal-ha entry that a Canal client
    gets (entries with no Canal form are dropped, documented), in order. ``form``: as
    ``to_canal_entry``'s (``CanalForm.of_server(VERSION())`` for a source database).

    Written by the C encoder (``_native``) where it is built, else by
    ``encode_entries_python``: the same bytes."""
    if not _native.use_native():
        return encode_entries_python(entries, form)
    encoder = _encoders.get(form) or _encoder(form)
    return encoder.encode(entries)


def encode_entries_python(entries: Sequence[Entry], form: CanalForm = LOCAL) -> list[bytes]:
    """``encode_entries`` in Python (``_wire``): the C encoder's reference, and what
    it hands an entry it does not write itself (a statement, a value it has no text
    for)."""
    out = []
    for entry in entries:
        data = _encode_entry(entry, form)
        if data is not None:
            out.append(data)
    return out


def _encode_entry(entry: Entry, form: CanalForm) -> bytes | None:
    """One entry's bytes (None: no Canal form)."""
    if not _has_canal_form(entry):
        return None
    kind = entry.type
    header = _wire.header_bytes(_header_fields(entry))
    if kind is EntryType.TRANSACTIONBEGIN:
        store = _wire.begin_bytes(entry.thread_id)
    elif kind is EntryType.TRANSACTIONEND:
        store = _wire.end_bytes(entry.xid)
    else:
        if _is_statement(entry):
            store = _row_change_head(entry).SerializeToString()
        else:
            store = _ROWS_HEADS[entry.header.event_type]
        befores, afters = _images(entry)
        if befores or afters:
            assert entry.images is not None
            try:
                store += _wire.row_datas(entry.images.columns, form, befores, afters)
            except (TypeError, ValueError, AttributeError, UnicodeError) as exc:
                raise _unwritable(entry, form, befores + afters) from exc
    return _wire.entry_bytes(header, _ENTRY_TYPES[kind], store)


_encoders: dict[CanalForm, _native.Encoder] = {}  # the C encoder by form, once it is used


def _encoder(form: CanalForm) -> _native.Encoder:
    """The C encoder of ``form``: the tables' plans, the reference per entry."""
    encoder = _native.Encoder(
        begin=EntryType.TRANSACTIONBEGIN, rowdata=EntryType.ROWDATA,
        end=EntryType.TRANSACTIONEND, heartbeat=EventType.HEARTBEAT,
        entry_codes={k: int(v) for k, v in _ENTRY_TYPES.items()},
        event_codes={k: int(v) for k, v in _EVENT_TYPES.items()},
        rows_heads=dict(_ROWS_HEADS), canal_gtid=canal_gtid,
        plan_of=_native.plan_of(form), packed_type=PackedRows,
        fallback=functools.partial(_encode_entry, form=form),
        unpackb=functools.partial(msgpack.unpackb, raw=False, use_list=False),
    )  # fmt: skip
    if len(_encoders) >= 64:
        _encoders.clear()
    _encoders[form] = encoder
    return encoder


def _unwritable(entry: Entry, form: CanalForm, images: Sequence[Sequence[Any]]) -> ValueError:
    """The error for a rows entry with a value Canal's form cannot be made of: it names
    the table, the column, its type and the value (found again value by value)."""
    assert entry.images is not None
    columns = entry.images.columns
    h = entry.header
    where = f"{h.schema}.{h.table} at {h.logfile}:{h.offset}"
    for image in images:
        if len(image) != len(columns.names):
            return ValueError(
                f"{where}: a row of {len(image)} values for {len(columns.names)} columns"
            )
        for name, mysql_type, value in zip(columns.names, columns.mysql_types, image, strict=True):
            try:
                column_value(mysql_type, value, form)
            except (TypeError, ValueError, AttributeError, UnicodeError) as exc:
                return ValueError(
                    f"{where}: column {name} ({mysql_type}): no Canal text for {value!r}: {exc}"
                )
    return ValueError(f"{where}: the rows cannot be written as Canal's (before and after differ?)")
