"""Column names for binlogs that do not carry them (MySQL 5.7, ``binlog_row_metadata=MINIMAL``).

A table map event always has the column *types*; names, signedness of integers, text
charsets and ENUM/SET values come only with ``binlog_row_metadata=FULL`` (MySQL 8.0.1+,
MariaDB 10.5+). Without them a reader would guess (``UNKNOWN_COL0``, unsigned values
read as signed, ENUM as its index). ``SchemaTracker`` does what Canal's TSDB does, in
small: it knows each table from a CREATE TABLE (a schema file the user gives, like
``mysqldump --no-data`` output, and the DDL read from the binlog itself, in binlog
order) and fills in a table map's columns from it. It handles CREATE TABLE (and
``LIKE``), ALTER TABLE ADD / DROP / MODIFY / CHANGE / RENAME COLUMN and RENAME TO, DROP
TABLE and RENAME TABLE; a DDL it cannot follow makes the table unknown. A table map
for an unknown table, or one whose column count differs from what the tracker knows,
is refused (``BinlogConfigError`` naming the table and what to do) instead of being
delivered with guessed names. A column without a charset of its own is read with the
table's ``DEFAULT CHARSET``, else utf8mb4.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE

from canal_protocol.errors import BinlogConfigError

__all__ = ["ColumnDef", "SchemaTracker", "split_statements"]

_NOT_COLUMNS = {
    "PRIMARY", "KEY", "INDEX", "UNIQUE", "CONSTRAINT", "FOREIGN", "FULLTEXT", "SPATIAL", "CHECK",
}  # fmt: skip
_INT_TYPES = {
    FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24, FIELD_TYPE.LONG, FIELD_TYPE.LONGLONG,
    FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE,
}  # fmt: skip
_TEXT_TYPES = {FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.BLOB}
_COMMENTS = re.compile(r"/\*(?!!).*?\*/|/\*!\d*|\*/|--[^\n]*|#[^\n]*", re.DOTALL)
_NAME = r"(?:`((?:[^`]|``)+)`|([\w$]+))"
_QNAME = rf"{_NAME}(?:\s*\.\s*{_NAME})?"
_CHARSET = re.compile(r"\b(?:character\s+set|charset)\s*=?\s*['\"`]?(\w+)", re.IGNORECASE)
_TYPE = re.compile(
    r"^(\w+)\s*(\((?:[^()']|'(?:[^']|'')*')*\))?((?:\s+(?:unsigned|signed|zerofill))*)",
    re.IGNORECASE,
)
_KEEPS_COLUMNS = re.compile(
    r"^(?:alter|convert|drop|engine|auto_increment|comment|algorithm|lock|force|default|"
    r"row_format|key_block_size|order|enable|disable|character|charset|collate|"
    r"rename\s+(?:index|key))\b",
    re.IGNORECASE,
)
_BINARY_TYPES = re.compile(r"^(?:binary|varbinary|tinyblob|blob|mediumblob|longblob)\b", re.I)


@dataclass(frozen=True)
class ColumnDef:
    """One column as its DDL defines it."""

    name: str
    type_text: str  # e.g. "bigint(20) unsigned", "enum('a','b')"
    charset: str = ""  # its own CHARACTER SET, if any

    @property
    def unsigned(self) -> bool:
        return re.search(r"\bunsigned\b", self.type_text, re.IGNORECASE) is not None

    def values(self) -> list[str]:
        """ENUM/SET members."""
        m = re.match(r"^(?:enum|set)\s*\((.*)\)", self.type_text, re.IGNORECASE | re.DOTALL)
        if m is None:
            return []
        return [v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", m.group(1))]


@dataclass(frozen=True)
class _Table:
    columns: tuple[ColumnDef, ...]
    charset: str


def _strip(sql: str) -> str:
    return _COMMENTS.sub(" ", sql).strip().rstrip(";").strip()


def _name(m: re.Match[str], first: int) -> str:
    quoted, bare = m.group(first), m.group(first + 1)
    return (quoted or "").replace("``", "`") if quoted is not None else str(bare)


def _qualified(m: re.Match[str], first: int, default: str) -> tuple[str, str]:
    a = _name(m, first)
    if m.group(first + 2) is not None or m.group(first + 3) is not None:
        return a, _name(m, first + 2)
    return default, a


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside parentheses and quotes."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [p.strip() for p in out if p.strip()]


def split_statements(text: str) -> list[str]:
    """The statements of a schema file (``;`` outside quotes; comments dropped)."""
    return _split_top(_COMMENTS.sub(" ", text), ";")


def _column(text: str) -> ColumnDef | None:
    m = re.match(rf"^{_NAME}\s+(.*)$", text, re.DOTALL)
    if m is None:
        return None
    name, rest = _name(m, 1), m.group(3).strip()
    if m.group(1) is None and name.upper() in _NOT_COLUMNS:
        return None
    t = _TYPE.match(rest)
    if t is None:
        return None
    charset = _CHARSET.search(rest[t.end() :])
    return ColumnDef(name, t.group(0).strip(), charset.group(1).lower() if charset else "")


def _body(sql: str) -> tuple[str, str] | None:
    """(column definitions, table options) of a CREATE TABLE's ``( ... ) options``."""
    start = sql.find("(")
    if start < 0:
        return None
    depth, quote = 0, ""
    for i in range(start, len(sql)):
        ch = sql[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return sql[start + 1 : i], sql[i + 1 :]
    return None


class SchemaTracker:
    """Tables known from DDL; see the module doc."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], _Table | None] = {}  # None: unknown after a DDL

    def load(self, text: str, default_schema: str = "") -> None:
        """A schema file: CREATE TABLE / USE statements (e.g. mysqldump --no-data)."""
        schema = default_schema
        for stmt in split_statements(text):
            m = re.match(rf"^use\s+{_NAME}$", stmt, re.IGNORECASE)
            if m is not None:
                schema = _name(m, 1)
                continue
            self.apply(schema, stmt)

    def known(self, schema: str, table: str) -> tuple[ColumnDef, ...] | None:
        t = self._tables.get((schema, table))
        return t.columns if t is not None else None

    def apply(self, schema: str, sql: str) -> None:
        """Follow one statement (DDL changes tables; anything else is ignored)."""
        text = _strip(sql)
        for pattern, handler in self._handlers():
            m = re.match(pattern, text, re.IGNORECASE | re.DOTALL)
            if m is not None:
                handler(m, schema, text)
                return

    def _handlers(self) -> Iterator[tuple[str, Any]]:
        yield (rf"^create\s+(?:temporary\s+)?table\s+(?:if\s+not\s+exists\s+)?{_QNAME}\s*"
               rf"(?:\(\s*)?like\s+{_QNAME}", self._create_like)  # fmt: skip
        yield (rf"^create\s+(?:temporary\s+)?table\s+(?:if\s+not\s+exists\s+)?{_QNAME}",
               self._create)  # fmt: skip
        yield rf"^alter\s+(?:online\s+|ignore\s+)*table\s+{_QNAME}\s+(.*)$", self._alter
        yield r"^drop\s+(?:temporary\s+)?tables?\s+(?:if\s+exists\s+)?(.*)$", self._drop
        yield r"^rename\s+tables?\s+(.*)$", self._rename

    def _create(self, m: re.Match[str], schema: str, text: str) -> None:
        key = _qualified(m, 1, schema)
        parts = _body(text[m.end() :])
        if parts is None:  # CREATE TABLE ... SELECT without columns: cannot follow
            self._tables[key] = None
            return
        cols = tuple(c for c in (_column(d) for d in _split_top(parts[0])) if c is not None)
        charset = _CHARSET.search(parts[1])
        self._tables[key] = _Table(cols, charset.group(1).lower() if charset else "")

    def _create_like(self, m: re.Match[str], schema: str, text: str) -> None:
        self._tables[_qualified(m, 1, schema)] = self._tables.get(_qualified(m, 5, schema))

    def _drop(self, m: re.Match[str], schema: str, text: str) -> None:
        for part in _split_top(m.group(1)):
            n = re.match(rf"^{_QNAME}", part)
            if n is not None:
                self._tables.pop(_qualified(n, 1, schema), None)

    def _rename(self, m: re.Match[str], schema: str, text: str) -> None:
        for part in _split_top(m.group(1)):
            n = re.match(rf"^{_QNAME}\s+to\s+{_QNAME}$", part, re.IGNORECASE)
            if n is not None:
                table = self._tables.pop(_qualified(n, 1, schema), None)
                self._tables[_qualified(n, 5, schema)] = table

    def _alter(self, m: re.Match[str], schema: str, text: str) -> None:
        key = _qualified(m, 1, schema)
        table = self._tables.get(key)
        if table is None:
            return
        cols = list(table.columns)
        for spec in _split_top(m.group(5)):
            result = _alter_one(cols, spec)
            if result is False:
                self._tables[key] = None  # a change we cannot follow: refuse its rows
                return
            if isinstance(result, tuple):
                self._tables.pop(key)
                key = _qualified(result[0], 1, schema)
        self._tables[key] = replace(table, columns=tuple(cols))

    # -- table maps

    def fill(self, ev: Any) -> None:
        """Give a table map event's columns their names (and signedness, charsets,
        ENUM/SET values) from the DDL; nothing to do when the binlog has the names."""
        columns = ev.columns
        if all(getattr(c, "name", None) for c in columns):
            return
        where = f"{ev.schema}.{ev.table}"
        table = self._tables.get((ev.schema, ev.table))
        if table is None:
            raise BinlogConfigError(
                f"table {where}: the binlog carries no column names (MySQL 5.7, or "
                "binlog_row_metadata=MINIMAL) and no CREATE TABLE for it was found in the "
                "schema file or earlier in the binlogs (or a DDL changed it in a way canal "
                "cannot follow); add its CREATE TABLE to local.schema_file, or set "
                "binlog_row_metadata=FULL on the server"
            )
        if len(table.columns) != len(columns):
            raise BinlogConfigError(
                f"table {where}: the binlog has {len(columns)} columns, its DDL "
                f"{len(table.columns)} ({', '.join(c.name for c in table.columns)}); "
                "fix local.schema_file to the table's definition at the start of the binlogs"
            )
        for col, d in zip(columns, table.columns, strict=True):
            _apply_def(col, d, table.charset)


def _apply_def(col: Any, d: ColumnDef, table_charset: str) -> None:
    col.name = d.name
    if col.type in _INT_TYPES:
        col.unsigned = d.unsigned
    elif col.type in _TEXT_TYPES:
        if _BINARY_TYPES.match(d.type_text):
            col.character_set_name, col.collation_name = None, "binary"
        else:
            charset = d.charset or table_charset or "utf8mb4"
            col.character_set_name = "utf8" if charset.startswith("utf8") else charset
            col.collation_name = f"{charset}_general_ci"
    elif col.type == FIELD_TYPE.ENUM:
        col.enum_values = ["", *d.values()]
    elif col.type == FIELD_TYPE.SET:
        col.set_values = d.values()


def _position(cols: list[ColumnDef], rest: str) -> int:
    """Where FIRST / AFTER x puts a column (default: the end)."""
    if re.search(r"\bfirst\s*$", rest, re.IGNORECASE):
        return 0
    m = re.search(rf"\bafter\s+{_NAME}\s*$", rest, re.IGNORECASE)
    if m is not None:
        after = _name(m, 1).lower()
        for i, c in enumerate(cols):
            if c.name.lower() == after:
                return i + 1
    return len(cols)


def _index(cols: list[ColumnDef], name: str) -> int:
    for i, c in enumerate(cols):
        if c.name.lower() == name.lower():
            return i
    return -1


def _alter_one(cols: list[ColumnDef], spec: str) -> bool | tuple[re.Match[str]]:
    """Apply one ALTER TABLE clause to ``cols``; False when it cannot be followed;
    a (match,) for RENAME TO (the caller moves the table)."""
    flags = re.IGNORECASE | re.DOTALL
    if m := re.match(r"^add\s+(?:column\s+)?\((.*)\)$", spec, flags):
        new = [_column(d) for d in _split_top(m.group(1))]
        cols.extend(c for c in new if c is not None)
        return True
    if m := re.match(r"^add\s+(?:column\s+)?(?:if\s+not\s+exists\s+)?(.*)$", spec, flags):
        col = _column(m.group(1))
        if col is not None:
            cols.insert(_position(cols, m.group(1)), col)
        return True  # ADD INDEX/KEY/CONSTRAINT...: columns unchanged
    if m := re.match(rf"^drop\s+(?:column\s+)?(?:if\s+exists\s+)?{_NAME}\s*$", spec, flags):
        i = _index(cols, _name(m, 1))
        if i >= 0:
            del cols[i]
        return True  # DROP INDEX x / DROP PRIMARY KEY
    if m := re.match(rf"^(modify|change)\s+(?:column\s+)?{_NAME}\s+(.*)$", spec, flags):
        i = _index(cols, _name(m, 2))
        rest = m.group(4)
        col = _column(rest if m.group(1).lower() == "change" else f"`{_name(m, 2)}` {rest}")
        if i < 0 or col is None:
            return False
        del cols[i]
        cols.insert(_position(cols, rest) if re.search(r"\b(first|after)\b", rest, flags)
                    else i, col)  # fmt: skip
        return True
    if m := re.match(rf"^rename\s+column\s+{_NAME}\s+to\s+{_NAME}$", spec, flags):
        i = _index(cols, _name(m, 1))
        if i < 0:
            return False
        cols[i] = replace(cols[i], name=_name(m, 3))
        return True
    if m := re.match(rf"^rename\s+(?:to\s+|as\s+)?{_QNAME}$", spec, flags):
        return (m,)
    # no change to the column list or types we decode (else: cannot follow)
    return _KEEPS_COLUMNS.match(spec) is not None
