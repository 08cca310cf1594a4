"""A table's columns as the leader's database has them now (``information_schema``).

``query_table(dsn, schema, table)`` answers what the REST route
``GET /v1/destinations/{d}/tables/{schema}.{table}`` returns: the columns in table
order with their ``mysql_type`` in the notation of the entries' ``columns.mysql_types``
(``canal_server.parse.decoding.type_name``: ``int unsigned``, ``decimal(30,10)``,
``varchar(40)``, ``datetime(6)``, ``enum('a','b')``; JSON is ``longtext``, display
widths and ZEROFILL are dropped), so a client can compare a table map's columns with
them; the raw ``column_type`` of ``information_schema``; ``nullable``; ``is_key``
(part of the primary key) and the primary key's columns in key order. ``version`` is
a short hash of the names and ``mysql_type`` values: it changes exactly when a
column is added, dropped, renamed, reordered or changes its type.

The query runs on the database the destination reads now (after a switch: the
standby), with the same connect and read timeouts as the binlog end probe.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from canal_protocol.errors import UnknownTable
from canal_server.parse import binlog_stream

__all__ = ["QUERY_TIMEOUT_S", "TableColumn", "TableSchema", "mysql_type_of", "query_table"]

QUERY_TIMEOUT_S = 2
_INTS = ("tinyint", "smallint", "mediumint", "int", "bigint")
_TEMPORAL = ("time", "datetime", "timestamp")
_GEOMETRY = (
    "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
    "multipolygon", "geometrycollection",
)  # fmt: skip
_LENGTHED = ("char", "varchar", "binary", "varbinary")
_AS_IS = (
    "float", "double", "date", "year", "tinytext", "text", "mediumtext", "longtext",
    "tinyblob", "blob", "mediumblob", "longblob",
)  # fmt: skip


@dataclass(frozen=True)
class TableColumn:
    name: str
    mysql_type: str  # the entries' notation (see the module docstring)
    column_type: str  # information_schema.COLUMNS.COLUMN_TYPE as the database has it
    nullable: bool
    is_key: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mysql_type": self.mysql_type,
            "column_type": self.column_type,
            "nullable": self.nullable,
            "is_key": self.is_key,
        }


@dataclass(frozen=True)
class TableSchema:
    schema: str
    table: str
    columns: tuple[TableColumn, ...]
    primary_key: tuple[str, ...]
    source_address: str

    @property
    def version(self) -> str:
        shape = [[c.name, c.mysql_type] for c in self.columns]
        return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "version": self.version,
            "columns": [c.to_dict() for c in self.columns],
            "primary_key": list(self.primary_key),
            "source_address": self.source_address,
        }


def mysql_type_of(row: Mapping[str, Any]) -> str:
    """The entries' notation of one ``information_schema.COLUMNS`` row."""
    data_type = str(row["DATA_TYPE"]).lower()
    column_type = str(row["COLUMN_TYPE"]).lower()
    if data_type in _INTS:
        return data_type + (" unsigned" if "unsigned" in column_type else "")
    if data_type == "decimal":
        return f"decimal({int(row['NUMERIC_PRECISION'])},{int(row['NUMERIC_SCALE'] or 0)})"
    if data_type in _TEMPORAL:
        fsp = int(row.get("DATETIME_PRECISION") or 0)
        return data_type + (f"({fsp})" if fsp else "")
    if data_type in _LENGTHED:
        return f"{data_type}({int(row['CHARACTER_MAXIMUM_LENGTH'])})"
    if data_type in _GEOMETRY:
        return "geometry"
    if data_type in ("json",):
        return "longtext"
    if data_type in _AS_IS:
        return data_type
    if data_type in ("enum", "set", "bit"):
        return str(row["COLUMN_TYPE"]).split(" ", 1)[0]  # enum('a','b') as declared
    return column_type


_COLUMNS_SQL = (
    "SELECT COLUMN_NAME, ORDINAL_POSITION, IS_NULLABLE, DATA_TYPE, COLUMN_TYPE, COLUMN_KEY,"
    " NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_MAXIMUM_LENGTH"
    " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
    " ORDER BY ORDINAL_POSITION"
)
_KEY_SQL = (
    "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s"
    " AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX"
)


def _rows(cur: Any, sql: str, args: Sequence[str]) -> list[dict[str, Any]]:
    cur.execute(sql, args)
    names = [d[0].upper() for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def query_table(dsn: Mapping[str, Any], schema: str, table: str) -> TableSchema:
    """The table's columns (``UnknownTable`` when it does not exist). Raises
    ``pymysql.err.MySQLError``/``OSError`` when the database does not answer within
    ``QUERY_TIMEOUT_S``."""
    conn = {**dsn, "connect_timeout": QUERY_TIMEOUT_S, "read_timeout": QUERY_TIMEOUT_S}
    with binlog_stream.connect(conn) as c, c.cursor() as cur:
        rows = _rows(cur, _COLUMNS_SQL, (schema, table))
        key = [str(r["COLUMN_NAME"]) for r in _rows(cur, _KEY_SQL, (schema, table))]
    if not rows:
        where = f"{dsn['host']}:{dsn['port']}"
        raise UnknownTable("table", f"{schema}.{table}: no such table in {where}")
    columns = tuple(
        TableColumn(
            name=str(r["COLUMN_NAME"]),
            mysql_type=mysql_type_of(r),
            column_type=str(r["COLUMN_TYPE"]),
            nullable=str(r["IS_NULLABLE"]).upper() == "YES",
            is_key=str(r["COLUMN_NAME"]) in key,
        )
        for r in rows
    )
    return TableSchema(schema, table, columns, tuple(key), f"{dsn['host']}:{dsn['port']}")
