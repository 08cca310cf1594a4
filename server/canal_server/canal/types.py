"""A column's Canal metadata: ``sqlType`` (``java.sql.Types``), ``mysqlType`` text and
the function that gives its value's text (``values``).

canal-ha knows a column by its ``mysql_type`` text as the table map gives it
(``canal_server.parse.decoding.type_name``: ``int unsigned``, ``decimal(10,2)``,
``varchar(20)``, ``enum('a','b')``; MariaDB's JSON is ``longtext``). Canal's
``sqlType`` comes from the binlog type (``RowsLogBuffer.mysqlToJavaType`` and the value
read) with ``LogEventConvert``'s adjustments:

- an UNSIGNED integer whose value does not fit the signed type is widened one step
  (TINYINT → SMALLINT, SMALLINT → INTEGER, INT → BIGINT, BIGINT → DECIMAL); a value that
  fits keeps the signed type's code (so the code depends on the value);
- BINARY, VARBINARY, BLOB and GEOMETRY are BLOB, TEXT types CLOB (Canal asks its table
  meta whether a blob is ``tinytext``/``text``/``mediumtext``/``longtext``);
- ENUM is INTEGER (the value is the member's index), SET is BIT (the value is the
  bitmask) but BLOB when NULL, YEAR is VARCHAR, FLOAT REAL, DATETIME TIMESTAMP;
  MySQL's JSON is VARCHAR (OTHER when NULL).

``mysqlType`` is Canal's table meta text, the ``Type`` column of ``DESC`` (or
``SHOW CREATE TABLE``): the table map has no display widths, so integers get the
default ones MariaDB and MySQL before 8.0.19 show (``int(11)``, ``int(10) unsigned``,
``tinyint(4)``, ``bigint(20) unsigned``) and YEAR is ``year(4)``; MySQL 8.0.19 and later
show none (``int unsigned``, ``year``: ``widths=False``, ``display_widths(VERSION())``).
A width declared otherwise, ZEROFILL, ``tinyint(1)`` for BOOLEAN and a geometry subtype
(``point``) are not in the binlog and come out as the defaults.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from canal_server.canal import values

__all__ = [
    "LOCAL",
    "CanalForm",
    "CanalType",
    "SqlType",
    "canal_mysql_type",
    "canal_type",
    "display_widths",
]


class SqlType:
    """The ``java.sql.Types`` codes Canal uses."""

    BIT = -7
    TINYINT = -6
    BIGINT = -5
    CHAR = 1
    DECIMAL = 3
    INTEGER = 4
    SMALLINT = 5
    REAL = 7
    DOUBLE = 8
    VARCHAR = 12
    DATE = 91
    TIME = 92
    TIMESTAMP = 93
    OTHER = 1111
    BLOB = 2004
    CLOB = 2005


@dataclass(frozen=True, slots=True)
class CanalType:
    """How Canal describes one column type and writes its values.

    ``sql_type`` is a non-NULL value's code, ``null_sql_type`` a NULL's; an unsigned
    integer above ``wide_above`` (0: never) has ``wide_sql_type`` instead."""

    mysql_type: str
    sql_type: int
    null_sql_type: int
    text: Callable[[Any], str]
    wide_above: int = 0
    wide_sql_type: int = 0

    def sql_type_of(self, value: Any) -> int:
        if value is None:
            return self.null_sql_type
        if self.wide_above and value > self.wide_above:
            return self.wide_sql_type
        return self.sql_type


# name → (signed code, signed width, unsigned width, signed maximum, widened code)
_INTEGERS = {
    "tinyint": (SqlType.TINYINT, 4, 3, 0x7F, SqlType.SMALLINT),
    "smallint": (SqlType.SMALLINT, 6, 5, 0x7FFF, SqlType.INTEGER),
    "mediumint": (SqlType.INTEGER, 9, 8, 0x7FFFFF, SqlType.INTEGER),
    "int": (SqlType.INTEGER, 11, 10, 0x7FFFFFFF, SqlType.BIGINT),
    "bigint": (SqlType.BIGINT, 20, 20, 0x7FFFFFFFFFFFFFFF, SqlType.DECIMAL),
}
_TEXTS = ("tinytext", "text", "mediumtext", "longtext")
_BLOBS = ("tinyblob", "blob", "mediumblob", "longblob", "varbinary", "geometry")
_GEOMETRIES = (
    "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
    "geometrycollection",
)  # fmt: skip


def _base(mysql_type: str) -> tuple[str, bool]:
    """``"int unsigned"`` → ("int", True); ``"decimal(10,2)"`` → ("decimal", False)."""
    text = mysql_type.strip().lower()
    name = text.split("(", 1)[0].split(" ", 1)[0]
    return name, "unsigned" in text.rsplit(")", 1)[-1]


def display_widths(version: str) -> bool:
    """Whether the server of ``VERSION()`` shows integer display widths (and ``year(4)``)
    in ``DESC``: MariaDB and MySQL before 8.0.19 do, MySQL 8.0.19 and later do not."""
    if "mariadb" in version.lower():
        return True
    numbers = []
    for part in version.split("-", 1)[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers) < (8, 0, 19)


def canal_mysql_type(mysql_type: str, widths: bool = True) -> str:
    """Canal's ``mysqlType`` text for canal-ha's ``mysql_type`` (see the module doc);
    ``widths``: with the display widths of MariaDB and MySQL before 8.0.19."""
    name, unsigned = _base(mysql_type)
    if widths and name in _INTEGERS and "(" not in mysql_type:
        _, signed_width, unsigned_width, _, _ = _INTEGERS[name]
        if unsigned:
            return f"{name}({unsigned_width}) unsigned"
        return f"{name}({signed_width})"
    if widths and name == "year" and "(" not in mysql_type:
        return "year(4)"
    if name.startswith("type") and name[4:] == "245":
        return "json"  # MySQL's JSON (the reader names an unknown type by its number)
    return mysql_type


@dataclass(frozen=True)
class CanalForm:
    """What a Canal server's text depends on beyond the binlog: ``zone``, where TIMESTAMP
    values are printed (Canal: its JVM's default zone; None: this process's local zone),
    and ``widths``, whether ``mysqlType`` has display widths (the source's ``DESC``)."""

    zone: datetime.tzinfo | None = None
    widths: bool = True

    @classmethod
    def of_server(cls, version: str, zone: datetime.tzinfo | None = None) -> CanalForm:
        """The form for a source database of ``VERSION()`` ``version``."""
        return cls(zone, display_widths(version))


LOCAL = CanalForm()


@functools.lru_cache(maxsize=4096)
def canal_type(mysql_type: str, form: CanalForm = LOCAL) -> CanalType:
    """Canal's description of a column of canal-ha's ``mysql_type``."""
    zone, widths = form.zone, form.widths
    name, unsigned = _base(mysql_type)
    shown = canal_mysql_type(mysql_type, widths)
    if name in _INTEGERS:
        code, _, _, top, wide = _INTEGERS[name]
        if unsigned:
            return CanalType(shown, code, code, str, top, wide)
        return CanalType(shown, code, code, str)
    simple: dict[str, tuple[int, int, Callable[[Any], str]]] = {
        "decimal": (SqlType.DECIMAL, SqlType.DECIMAL, values.decimal_text),
        "float": (SqlType.REAL, SqlType.REAL, values.java_float),
        "double": (SqlType.DOUBLE, SqlType.DOUBLE, values.java_double),
        "bit": (SqlType.BIT, SqlType.BIT, values.bit_text),
        "datetime": (SqlType.TIMESTAMP, SqlType.TIMESTAMP, values.datetime_text),
        "date": (SqlType.DATE, SqlType.DATE, str),
        "time": (SqlType.TIME, SqlType.TIME, str),
        "year": (SqlType.VARCHAR, SqlType.VARCHAR, values.year_text),
        "char": (SqlType.CHAR, SqlType.CHAR, values.string_text),
        "varchar": (SqlType.VARCHAR, SqlType.VARCHAR, values.string_text),
        "binary": (SqlType.BLOB, SqlType.BLOB, values.fixed_binary_text),
        "json": (SqlType.VARCHAR, SqlType.OTHER, values.json_text),
    }
    if name in simple:
        code, null_code, text = simple[name]
        return CanalType(shown, code, null_code, text)
    if name == "timestamp":
        return CanalType(
            shown, SqlType.TIMESTAMP, SqlType.TIMESTAMP,
            functools.partial(values.timestamp_text, zone=zone),
        )  # fmt: skip
    if name in _TEXTS:
        return CanalType(shown, SqlType.CLOB, SqlType.CLOB, values.string_text)
    if name in _BLOBS or name in _GEOMETRIES:
        return CanalType(shown, SqlType.BLOB, SqlType.BLOB, values.binary_text)
    if name == "enum":
        index = values.enum_index_text(values.members(mysql_type))
        return CanalType(shown, SqlType.INTEGER, SqlType.INTEGER, index)
    if name == "set":
        bits = values.set_bits_text(values.members(mysql_type))
        return CanalType(shown, SqlType.BIT, SqlType.BLOB, bits)
    if shown == "json":
        return CanalType(shown, SqlType.VARCHAR, SqlType.OTHER, values.json_text)
    return CanalType(shown, SqlType.OTHER, SqlType.OTHER, str)
