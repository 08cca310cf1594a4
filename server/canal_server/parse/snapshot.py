"""A table's rows in key order, chunk by chunk, each chunk tied to an exact binlog position.

``ChunkReader(dsn)`` keeps one connection (mysqlclient, the C client library, text
protocol, session time zone UTC) for one snapshot run:

* ``shape(schema, table)`` reads the table's columns and its chunking key from
  ``information_schema`` (the primary key, else the first unique key whose columns are
  all NOT NULL; else ``NoSnapshotKey`` naming the table). Read again before every chunk,
  so an ALTER between chunks is followed.
* ``read(shape, after, limit)`` runs one chunk: ``START TRANSACTION WITH CONSISTENT
  SNAPSHOT, READ ONLY``; ``SHOW STATUS LIKE 'binlog_snapshot_%'`` gives the binlog
  position P whose committed transactions are exactly the ones the chunk's SELECT sees
  (MariaDB takes both under its commit-order lock); the keyset SELECT
  (``WHERE key > after ORDER BY key LIMIT n``); COMMIT. Only SELECT, no lock, no write.

Values come out in the binlog path's forms (``canal_server.parse.decoding``): ints as int,
DECIMAL the server's text (the column's scale), FLOAT the shortest decimal of the stored
float32 (read as ``CAST(col AS DOUBLE)``: the text of a FLOAT has 6 digits only), DOUBLE
float (the server prints the shortest round-trip form), DATE/TIME text, DATETIME with
``T``, TIMESTAMP in UTC with ``T`` and ``Z`` (zero dates as the server has them), YEAR
int, text str, binary bytes (BINARY(n) with its 0x00 padding), ENUM/SET text, BIT int
(``col + 0``), JSON text. ``mysql_type`` and ``is_key`` as the table map gives them.
tests/test_snapshot_values.py checks the every-type table against the binlog path.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import MySQLdb
from MySQLdb.constants import FIELD_TYPE
from MySQLdb.converters import conversions

from canal_protocol.entry import TableColumns, Value
from canal_protocol.errors import BinlogError, InvalidArgument
from canal_server.parse.decoding import _float32

__all__ = [
    "Chunk",
    "ChunkReader",
    "NoSnapshotKey",
    "ShapeChanged",
    "TableShape",
    "key_from_json",
    "key_to_json",
    "pack_rows",
    "sql_key",
]

log = logging.getLogger(__name__)

Key = tuple[Value, ...]
_INTS = ("tinyint", "smallint", "mediumint", "int", "bigint")
_GEOMETRY = (
    "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
    "multipolygon", "geometrycollection",
)  # fmt: skip
_SIMPLE = ("float", "double", "date", "year", "tinytext", "text", "mediumtext", "longtext",
           "tinyblob", "blob", "mediumblob", "longblob", "json")  # fmt: skip


def _datetime(text: str) -> str:
    return text.replace(" ", "T")


def _timestamp(text: str) -> str:
    return text.replace(" ", "T") + "Z"


# The text protocol's values as our forms, per field type (a type not here: str for
# text columns, bytes for binary ones, as the library gives them); the library's own
# encoders of Python parameters (int, float, ...: keys that are types) are kept.
_CONV: dict[Any, Any] = {
    **{k: v for k, v in conversions.items() if not isinstance(k, int)},
    FIELD_TYPE.TINY: int,
    FIELD_TYPE.SHORT: int,
    FIELD_TYPE.LONG: int,
    FIELD_TYPE.INT24: int,
    FIELD_TYPE.LONGLONG: int,
    FIELD_TYPE.YEAR: int,
    FIELD_TYPE.DOUBLE: float,
    FIELD_TYPE.FLOAT: float,
    FIELD_TYPE.DECIMAL: str,
    FIELD_TYPE.NEWDECIMAL: str,
    FIELD_TYPE.DATE: str,
    FIELD_TYPE.TIME: str,
    FIELD_TYPE.DATETIME: _datetime,
    FIELD_TYPE.TIMESTAMP: _timestamp,
}


class NoSnapshotKey(InvalidArgument):
    """The table has neither a primary key nor a unique key of NOT NULL columns."""


class ShapeChanged(BinlogError):
    """The table changed (or went away) while a chunk was read: read it again."""


@dataclass(frozen=True)
class TableShape:
    """What a chunk of ``schema.table`` reads: columns (as entries describe them), the
    chunking key, and one SELECT expression per column."""

    schema: str
    table: str
    columns: TableColumns
    key: tuple[str, ...]
    key_index: tuple[int, ...]
    key_types: tuple[str, ...]
    exprs: tuple[str, ...]
    float_index: tuple[int, ...]

    @property
    def full_name(self) -> str:
        return f"{self.schema}.{self.table}"

    def select(self, after: Key | None, limit: int) -> tuple[str, tuple[Any, ...]]:
        """The keyset SELECT of the chunk after ``after`` (None: from the first key)."""
        cols = ", ".join(self.exprs)
        order = ", ".join(_quote(k) for k in self.key)
        args: tuple[Any, ...]
        where, args = "", ()
        if after is not None:
            where, args = _after(self.key, sql_key(after, self.key_types))
        sql = f"SELECT {cols} FROM {_quote(self.schema)}.{_quote(self.table)}{where}"
        return f"{sql} ORDER BY {order} LIMIT {int(limit)}", args


@dataclass(frozen=True)
class Chunk:
    """One chunk: the binlog position it is consistent with, its rows (msgpack of the
    value lists, as PackedRows keeps them), each row's key, and the last key read."""

    journal: str
    offset: int
    rows: tuple[tuple[Value, ...], ...]
    keys: tuple[Key, ...]
    last_key: Key | None

    def __len__(self) -> int:
        return len(self.rows)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _after(key: Sequence[str], values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """``(k1 > v1) OR (k1 = v1 AND k2 > v2) ...``: what the range optimizer uses."""
    ors: list[str] = []
    args: list[Any] = []
    for i in range(len(key)):
        parts = [f"{_quote(key[j])} = %s" for j in range(i)] + [f"{_quote(key[i])} > %s"]
        ors.append("(" + " AND ".join(parts) + ")")
        args.extend(values[: i + 1])
    return " WHERE " + " OR ".join(ors), tuple(args)


def sql_key(key: Key, types: Sequence[str]) -> tuple[Any, ...]:
    """Our key values as SQL parameters: DATETIME/TIMESTAMP back to the server's text;
    ENUM and SET as their numbers (``ORDER BY`` sorts them by number, and compared with
    a number they compare by number, with a string by text)."""
    out: list[Any] = []
    for value, t in zip(key, types, strict=True):
        if isinstance(value, str) and t.startswith(("datetime", "timestamp")):
            value = value.rstrip("Z").replace("T", " ")
        elif isinstance(value, str) and t.startswith("enum("):
            value = _members(t).index(value) + 1 if value else 0
        elif isinstance(value, str) and t.startswith("set("):
            members = _members(t)
            value = sum(1 << members.index(m) for m in value.split(",") if m)
        out.append(value)
    return tuple(out)


def _members(mysql_type: str) -> list[str]:
    """The members of ``enum('a','b')`` / ``set(...)`` (quotes doubled inside)."""
    body = mysql_type[mysql_type.index("(") + 1 : mysql_type.rindex(")")]
    return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", body)]


def key_to_json(key: Key | None) -> list[Any] | None:
    """A key as JSON (bytes as ``{"b64": ...}``) for the progress in etcd."""
    if key is None:
        return None
    return [{"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v for v in key]


def key_from_json(data: Sequence[Any] | None) -> Key | None:
    if data is None:
        return None
    return tuple(base64.b64decode(v["b64"]) if isinstance(v, Mapping) else v for v in data)


def mysql_type(row: Mapping[str, Any]) -> str:
    """The column's type as the binlog path names it (``decoding.type_name``)."""
    data, column = str(row["DATA_TYPE"]).lower(), str(row["COLUMN_TYPE"]).lower()
    if data in _INTS:
        return data + (" unsigned" if "unsigned" in column else "")
    if data in _GEOMETRY:
        return "geometry"
    if data == "json":
        return "longtext"
    if data in _SIMPLE:
        return data
    if data == "decimal":
        return f"decimal({row['NUMERIC_PRECISION']},{row['NUMERIC_SCALE']})"
    if data in ("time", "datetime", "timestamp"):
        fsp = int(row["DATETIME_PRECISION"] or 0)
        return data + (f"({fsp})" if fsp else "")
    return column.split(")", 1)[0] + (")" if "(" in column else "")


def _expr(name: str, data_type: str) -> str:
    if data_type == "float":
        return f"CAST({_quote(name)} AS DOUBLE)"
    if data_type == "bit":
        return f"{_quote(name)} + 0"
    return _quote(name)


def _tls_args(tls: Mapping[str, Any] | None) -> dict[str, Any]:
    """mysqlclient's TLS arguments for the DSN's ``tls`` entry (``db.tls.*``), the same
    settings the binlog connection uses: CA, optional client certificate, identity check."""
    if not tls:
        return {}
    files = {k: tls[k] for k in ("ca", "cert", "key") if tls.get(k)}
    mode = (
        "VERIFY_IDENTITY"
        if tls.get("verify_identity")
        else "VERIFY_CA"
        if "ca" in files
        else "REQUIRED"
    )
    return {"ssl": files, "ssl_mode": mode}


_ACCESS_DENIED = (1142, 1143)  # ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR


class ChunkReader:
    """Reads chunks of tables on its own connection; see the module doc."""

    def __init__(self, dsn: Mapping[str, Any], connect_timeout_s: float = 5.0) -> None:
        self._dsn = dict(dsn)
        self._timeout = connect_timeout_s
        self._conn: Any = None

    @property
    def source_address(self) -> str:
        return f"{self._dsn['host']}:{self._dsn['port']}"

    def _cursor(self) -> Any:
        if self._conn is None:
            conn = MySQLdb.connect(
                host=self._dsn["host"], port=int(self._dsn["port"]), user=self._dsn["user"],
                password=self._dsn.get("password", ""), charset="utf8mb4", conv=_CONV,
                connect_timeout=int(max(1, self._timeout)), **_tls_args(self._dsn.get("tls")),
            )  # fmt: skip
            cur = conn.cursor()
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self._conn = conn
        return self._conn.cursor()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(MySQLdb.Error):
                conn.close()

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tables -----------------------------------------------------------------------

    def tables(self) -> list[tuple[str, str, str]]:
        """Every base table of the server: (schema, table, engine)."""
        cur = self._cursor()
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, ENGINE FROM information_schema.TABLES "
            "WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN "
            "('mysql', 'information_schema', 'performance_schema', 'sys') "
            "ORDER BY TABLE_SCHEMA, TABLE_NAME"
        )
        return [(str(s), str(t), str(e or "")) for s, t, e in cur.fetchall()]

    def select_denied(self, schema: str, table: str) -> str | None:
        """The server's refusal when this user cannot SELECT from the table, else None."""
        cur = self._cursor()
        try:
            cur.execute(f"SELECT 1 FROM {_quote(schema)}.{_quote(table)} LIMIT 0")
        except MySQLdb.OperationalError as exc:
            if exc.args and exc.args[0] in _ACCESS_DENIED:
                return str(exc.args[1]) if len(exc.args) > 1 else str(exc)
            raise
        cur.fetchall()
        return None

    def shape(self, schema: str, table: str) -> TableShape:
        """The table's columns and chunking key (``NoSnapshotKey``; ``ShapeChanged`` when
        the table does not exist)."""
        cur = self._cursor()
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, "
            "DATETIME_PRECISION, IS_NULLABLE, COLUMN_KEY FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (schema, table),
        )
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        if not rows:
            raise ShapeChanged(f"table {schema}.{table} does not exist")
        key = self._key(cur, schema, table, {r["COLUMN_NAME"]: r for r in rows})
        cols = [str(r["COLUMN_NAME"]) for r in rows]
        types = [mysql_type(r) for r in rows]
        data_types = [str(r["DATA_TYPE"]).lower() for r in rows]
        return TableShape(
            schema=schema,
            table=table,
            columns=TableColumns(
                tuple(cols), tuple(types), tuple(r["COLUMN_KEY"] == "PRI" for r in rows)
            ),
            key=key,
            key_index=tuple(cols.index(k) for k in key),
            key_types=tuple(types[cols.index(k)] for k in key),
            exprs=tuple(_expr(c, t) for c, t in zip(cols, data_types, strict=True)),
            float_index=tuple(i for i, t in enumerate(data_types) if t == "float"),
        )

    @staticmethod
    def _key(cur: Any, schema: str, table: str, columns: Mapping[str, Any]) -> tuple[str, ...]:
        cur.execute(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0 "
            "ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX",
            (schema, table),
        )
        indexes: dict[str, list[str]] = {}
        for index, column in cur.fetchall():
            indexes.setdefault(str(index), []).append(str(column))
        for cols in indexes.values():
            if all(columns[c]["IS_NULLABLE"] == "NO" for c in cols):
                return tuple(cols)
        raise NoSnapshotKey(
            "tables",
            f"table {schema}.{table} has no primary key and no unique key of NOT NULL "
            "columns: its rows cannot be told apart, so it cannot be snapshotted",
        )

    # -- chunks -----------------------------------------------------------------------

    def read(self, shape: TableShape, after: Key | None, limit: int) -> Chunk:
        """One chunk (see the module doc); ``ShapeChanged`` if the table changed meanwhile."""
        cur = self._cursor()
        sql, args = shape.select(after, limit)
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            try:
                cur.execute(sql, args or None)
            except MySQLdb.OperationalError as exc:
                # 1054 unknown column, 1146 no such table, 1412 table definition changed
                if exc.args and exc.args[0] in (1054, 1146, 1412):
                    raise ShapeChanged(f"{shape.full_name} changed: {exc}") from None
                raise
            rows = cur.fetchall()
        finally:
            self._conn.query("COMMIT")
        if shape.float_index:
            rows = tuple(_fix_floats(r, shape.float_index) for r in rows)
        idx = shape.key_index
        keys = tuple(tuple(r[i] for i in idx) for r in rows)
        return Chunk(
            journal=status["binlog_snapshot_file"],
            offset=int(status["binlog_snapshot_position"]),
            rows=tuple(rows),
            keys=keys,
            last_key=keys[-1] if keys else None,
        )

    def gtid_state_at(self, journal: str, offset: int) -> str:
        """``BINLOG_GTID_POS`` (it reads the binlog file up to there: ask sparingly)."""
        cur = self._cursor()
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (journal, offset))
        row = cur.fetchone()
        return str(row[0] or "") if row else ""


def _fix_floats(row: tuple[Value, ...], index: tuple[int, ...]) -> tuple[Value, ...]:
    values = list(row)
    for i in index:
        v = values[i]
        if isinstance(v, float):
            values[i] = _float32(v)
    return tuple(values)


def pack_rows(rows: Sequence[tuple[Value, ...]]) -> bytes:
    """msgpack of a list of value lists (what ``PackedRows`` keeps)."""
    return bytes(msgpack.packb(rows, use_bin_type=True))
