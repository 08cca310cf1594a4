"""Every MariaDB column type through BinlogReader, compared value by value with SELECT
and with ``mariadb-binlog -v``; then ALTER TABLE mid-stream."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.entry import Column, Entry, EntryType
from canal_protocol.positions import EntryPosition
from canal_server.parse.reader import BinlogReader, ReaderConfig

DB = "t_types"
COLUMNS = """
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED,
  bi BIGINT, biu BIGINT UNSIGNED,
  d DECIMAL(30,10), dw DECIMAL(65,30), f FLOAT, dbl DOUBLE,
  dt DATE, tm TIME(6), tm0 TIME, dtm DATETIME(6), dtm3 DATETIME(3), ts TIMESTAMP(6) NULL,
  y YEAR, c CHAR(10), vc VARCHAR(40), tx TEXT, mt MEDIUMTEXT,
  b BINARY(4), vb VARBINARY(16), bl BLOB, lb LONGBLOB,
  e ENUM('a','b','c'), s SET('x','y','z'), bt BIT(12), j JSON
"""
TYPES = {
    "id": "int", "ti": "tinyint", "tiu": "tinyint unsigned", "si": "smallint",
    "siu": "smallint unsigned", "mi": "mediumint", "miu": "mediumint unsigned", "i": "int",
    "iu": "int unsigned", "bi": "bigint", "biu": "bigint unsigned", "d": "decimal(30,10)",
    "dw": "decimal(65,30)", "f": "float", "dbl": "double", "dt": "date", "tm": "time(6)",
    "tm0": "time", "dtm": "datetime(6)", "dtm3": "datetime(3)", "ts": "timestamp(6)",
    "y": "year", "c": "char(10)", "vc": "varchar(40)", "tx": "text", "mt": "mediumtext",
    "b": "binary(4)", "vb": "varbinary(16)", "bl": "blob", "lb": "longblob",
    "e": "enum('a','b','c')", "s": "set('x','y','z')", "bt": "bit(12)", "j": "longtext",
}  # fmt: skip
ROWS = [
    "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,"
    " -12345678901234567890.0123456789,"
    " -99999999999999999999999999999999999.999999999999999999999999999999,"
    " -3.4e38, -1.7976931348623157e308, '0000-00-00', '-838:59:59.000000', '00:00:00',"
    " '0000-00-00 00:00:00', '1000-01-01 00:00:00.001', '1970-01-01 00:00:01.000001',"
    " 0, '', '', '', '', x'00', x'', x'', x'', 'a', '', b'0', '{}')",
    "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295,"
    " 9223372036854775807, 18446744073709551615,"
    " 99999999999999999999.9999999999, 0.000000000000000000000000000001,"
    " 1.1, 2.2, '9999-12-31', '838:59:59.999999', '-00:00:01',"
    " '9999-12-31 23:59:59.999999', '2024-02-29 12:34:56.789', '2038-01-19 03:14:07.999999',"
    " 2155, 'chars', 'héllo 😀', 'text 😀', 'medium', x'00010000', x'00ff00', x'000102',"
    " x'ff00', 'c', 'x,z', b'100000000001', '{\"a\": [1, 2.5], \"b\": null}')",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL)",
    "(4, 0, 1, -1, 1, 0, 1, 0, 1, 0, 1, 0, -0.5, 0, -0.0001, '2020-00-00', '00:00:00.5', "
    " '12:34:56', '2020-02-03 04:05:06.000100', '2020-02-03 04:05:06.100',"
    " '2001-02-03 04:05:06.5', 1901, 'a b', 'x', 'y', 'z', x'41', x'42', x'43', x'44',"
    " 'b', 'y', b'1', '[1, \"two\"]')",
]  # fmt: skip
FLOATS = {"f", "dbl"}
BINARY = {"b", "vb", "bl", "lb"}


def _sql_expr(name: str) -> str:
    if name in FLOATS:
        return name
    if name in BINARY:
        return f"HEX({name})"
    if name == "bt":
        return f"{name} + 0"
    return f"CAST({name} AS CHAR)"


def _as_text(col: Column) -> Any:
    """Our value in the form the SELECT expression above returns."""
    v = col.value
    if v is None or col.name in FLOATS:
        return v
    if col.name in BINARY:
        assert isinstance(v, bytes)
        return v.hex().upper()
    if col.name == "ts":
        assert isinstance(v, str) and v.endswith("Z")
        return v[:-1].replace("T", " ")
    if col.name in ("dtm", "dtm3"):
        return str(v).replace("T", " ")
    if col.name == "y":
        assert isinstance(v, int)
        return f"{v:04d}"
    return str(v)


def _select(box: Sandbox, names: list[str], where: str = "") -> dict[int, dict[str, Any]]:
    exprs = ", ".join(_sql_expr(n) for n in names)
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT id, {exprs} FROM {DB}.t {where} ORDER BY id")
        rows = cur.fetchall()
    out = {}
    for row in rows:
        values = dict(zip(names, row[1:], strict=True))
        for n in names:
            if n == "bt" and values[n] is not None:
                values[n] = str(int(values[n]))
        out[int(row[0])] = values
    return out


def _read(box: Sandbox, start: EntryPosition, nrows: int, slave_id: int) -> list[Entry]:
    got: list[Entry] = []
    cfg = ReaderConfig(master=box.primary.dsn(), slave_id=slave_id, retry=RetryPolicy(0.05))
    reader = BinlogReader(cfg, got.extend)
    thread = threading.Thread(target=reader.run, args=(start,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: sum(len(e.rows) for e in list(got)) >= nrows, f"{nrows} rows", 60)
    finally:
        reader.stop()
        thread.join(30)
    assert not thread.is_alive()
    return [e for e in got if e.type == EntryType.ROWDATA and not e.is_ddl]


def _prepare(box: Sandbox) -> EntryPosition:
    box.primary.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    journal, offset = box.primary.master_status()
    box.primary.execute(
        "SET SESSION sql_mode = ''",  # (root's session only) zero dates allowed
        f"CREATE TABLE {DB}.t ({COLUMNS}) DEFAULT CHARSET=utf8mb4",
    )
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"INSERT INTO {DB}.t VALUES {', '.join(ROWS)}")
        cur.execute(f"UPDATE {DB}.t SET vc = 'changed', tiu = tiu + 1 WHERE id IN (1, 4)")
        cur.execute(f"DELETE FROM {DB}.t WHERE id = 3")
    return EntryPosition(journal=journal, offset=offset)


def test_every_type_matches_select_and_mariadb_binlog(db: Sandbox) -> None:
    start = _prepare(db)
    entries = _read(db, start, 4 + 2 + 1, 6201)
    kinds = [e.header.event_type.value for e in entries]
    assert kinds == ["INSERT", "UPDATE", "DELETE"]
    inserted = {int(r.after[0].value or 0): r.after for r in entries[0].rows}
    names = [c.name for c in inserted[1]][1:]
    assert list(TYPES) == ["id", *names]
    assert {c.name: c.mysql_type for c in inserted[1]} == TYPES
    assert all(c.is_key == (c.name == "id") for c in inserted[1])
    assert all(c.updated for r in entries[0].rows for c in r.after)
    assert all(c.is_null == (c.value is None) for r in entries[0].rows for c in r.after)
    assert all(c.is_null for c in inserted[3][1:])
    # (a) the rows as SELECT has them now (after the update/delete) ...
    now = _select(db, names)
    updated = {int(r.after[0].value or 0): r for r in entries[1].rows}
    for rid, want in now.items():
        cols = updated[rid].after if rid in updated else inserted[rid]
        got = {c.name: _as_text(c) for c in cols[1:]}
        assert got == want, rid
    # ... the update's images and flags, the delete's before image
    for rid, change in updated.items():
        assert {c.name for c in change.after if c.updated} == {"vc", "tiu"}, rid
        assert [c.value for c in change.before] == [c.value for c in inserted[rid]]
    assert [c.value for c in entries[2].rows[0].before] == [c.value for c in inserted[3]]
    assert not any(c.updated for c in entries[2].rows[0].before)
    # (b) mariadb-binlog's decoding of the same INSERT rows.
    decoded = _mariadb_binlog_rows(db, start.journal, f"INSERT INTO `{DB}`.`t`")
    assert len(decoded) == 4
    for printed in decoded:
        ours = inserted[int(printed[1])]
        assert len(printed) == len(ours)
        for i, col in enumerate(ours, start=1):
            assert _same(col, printed[i]), (ours[0].value, col, printed[i])


def test_alter_table_mid_stream_keeps_names_and_values(db: Sandbox) -> None:
    name = "t_types_alter"
    db.primary.execute(f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
    journal, offset = db.primary.master_status()
    db.primary.execute(
        f"CREATE TABLE {name}.t (id INT PRIMARY KEY, a VARCHAR(10), b INT UNSIGNED)",
        f"INSERT INTO {name}.t VALUES (1, 'one', 4294967295)",
        f"ALTER TABLE {name}.t ADD COLUMN c DECIMAL(10,2) AFTER id, DROP COLUMN a",
        f"INSERT INTO {name}.t VALUES (2, -1.25, 7)",
        f"ALTER TABLE {name}.t ADD COLUMN a TEXT",
        f"UPDATE {name}.t SET a = 'new' WHERE id = 1",
    )
    entries = _read(db, EntryPosition(journal=journal, offset=offset), 3, 6202)

    def image(e: Entry) -> list[tuple[str, Any, str]]:
        return [(c.name, c.value, c.mysql_type) for c in e.rows[0].after]

    assert image(entries[0]) == [
        ("id", 1, "int"), ("a", "one", "varchar(10)"), ("b", 4294967295, "int unsigned"),
    ]  # fmt: skip
    assert image(entries[1]) == [
        ("id", 2, "int"), ("c", "-1.25", "decimal(10,2)"), ("b", 7, "int unsigned"),
    ]  # fmt: skip
    assert image(entries[2]) == [
        ("id", 1, "int"), ("c", None, "decimal(10,2)"), ("b", 4294967295, "int unsigned"),
        ("a", "new", "text"),
    ]  # fmt: skip
    assert [c.name for c in entries[2].rows[0].after if c.updated] == ["a"]


# -- mariadb-binlog -v ----------------------------------------------------------------------

_AT = re.compile(rb"^###   @(\d+)=(.*)$")


def _mariadb_binlog_rows(box: Sandbox, journal: str, header: str) -> list[dict[int, bytes]]:
    """The ``@N=value`` lines (raw bytes) of every row under ``header``."""
    dsn = box.primary.dsn()
    binary = shutil.which("mariadb-binlog") or "/usr/bin/mariadb-binlog"
    out = subprocess.run(
        [
            binary, "--read-from-remote-server", "--host=127.0.0.1", f"--port={dsn['port']}",
            f"--user={dsn['user']}", f"--password={dsn['password']}",
            "--base64-output=DECODE-ROWS", "-v", journal,
        ],
        capture_output=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    rows: list[dict[int, bytes]] = []
    current: dict[int, bytes] | None = None
    for line in out.split(b"\n"):
        if line.startswith((b"### INSERT", b"### UPDATE", b"### DELETE")):
            current = None
            if line == b"### " + header.encode():
                current = {}
                rows.append(current)
        elif current is not None and (m := _AT.match(line)):
            current[int(m.group(1))] = m.group(2).rstrip()
    return rows


def _unquote(raw: bytes) -> bytes:
    assert raw[:1] == b"'" and raw[-1:] == b"'", raw
    body, out, i = raw[1:-1], bytearray(), 0
    while i < len(body):
        if body[i : i + 2] == b"\\x":
            out.append(int(body[i + 2 : i + 4], 16))
            i += 4
        else:
            out.append(body[i])
            i += 1
    return bytes(out)


def _number(raw: bytes, unsigned: bool) -> int:
    m = re.fullmatch(rb"(-?\d+)(?: \((\d+)\))?", raw)
    assert m, raw
    return int(m.group(2) if unsigned and m.group(2) else m.group(1))


def _bits(raw: bytes) -> int:
    assert raw.startswith(b"b'"), raw
    return int(raw[2:-1], 2)


def _checks() -> dict[str, Callable[[Column, bytes], bool]]:
    def f32(c: Column, r: bytes) -> bool:
        return struct.pack("<f", float(r)) == struct.pack("<f", c.value)

    def ts(c: Column, r: bytes) -> bool:
        if Decimal(r.decode()) == 0:
            return str(c.value).startswith("0000-00-00")
        sec, _, frac = r.decode().partition(".")
        when = datetime.fromtimestamp(int(sec), UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return c.value == when + (f".{frac}" if frac else "") + "Z"

    def enum(c: Column, r: bytes) -> bool:
        return c.value == ["", "a", "b", "c"][int(r)]

    def set_(c: Column, r: bytes) -> bool:
        mask = _bits(r)
        return c.value == ",".join(m for i, m in enumerate("xyz") if mask & (1 << i))

    return {
        "float": f32,
        "double": lambda c, r: float(r) == c.value,
        "decimal": lambda c, r: Decimal(r.decode()) == Decimal(str(c.value)),
        "date": lambda c, r: _unquote(r).decode().replace(":", "-") == c.value,
        "time": lambda c, r: _unquote(r).decode() == c.value,
        "datetime": lambda c, r: _unquote(r).decode().replace(" ", "T") == c.value,
        "timestamp": ts,
        # mariadb-binlog prints YEAR 0000 as 1900 (stored byte 0 + 1900); SELECT says 0000
        "year": lambda c, r: int(r) == c.value or (r == b"1900" and c.value == 0),
        "enum": enum,
        "set": set_,
        "bit": lambda c, r: _bits(r) == c.value,
    }


def _same(col: Column, raw: bytes) -> bool:
    if raw == b"NULL":
        return col.is_null
    base = col.mysql_type.split("(", 1)[0].split(" ", 1)[0]
    if base.endswith("int"):
        return _number(raw, col.mysql_type.endswith("unsigned")) == col.value
    if base in ("binary", "varbinary") or base.endswith("blob"):
        # mariadb-binlog prints the stored bytes: BINARY(n) without its 0x00 padding
        return _unquote(raw) == bytes(col.value).rstrip(b"\0") or _unquote(raw) == col.value  # type: ignore[arg-type]
    if base in ("char", "varchar") or base.endswith("text"):
        return _unquote(raw).decode("utf-8") == col.value
    return _checks()[base](col, raw)
