"""MySQL's own binlog bytes (tests/fixtures/mysql, see NOTICE) through the local reader and
the Canal converter: MySQL GTID sets and ``curtGtid`` in the header, ENUM and SET of a
MySQL 8 table (indexes and bitmasks), unsigned and invisible columns, BIT, BLOB and TEXT,
``mysqlType`` as MySQL 8.0.19+ (no display widths) and 5.7 (widths) show it.

Expected values are written out by hand from the CREATE TABLE statements in the files,
the values the files' own tests give (test_mysql_local.py) and Canal's rules.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from mysql_fixtures import Run

from canal_protocol.canal import entry_pb2 as pb
from canal_protocol.errors import BinlogConfigError
from canal_server.canal.convert import encode_entries
from canal_server.canal.types import CanalForm, SqlType

MYSQL8 = CanalForm(datetime.UTC, widths=False)  # CanalForm.of_server("8.0.28")
MYSQL57 = CanalForm(datetime.UTC, widths=True)
A = "0123456789" * 12 + "012345678"  # 129 characters
LONG = A * 2 + "0123456789" * 4
T = SqlType


def _decoded(entries: Any, form: CanalForm) -> list[tuple[pb.Entry, Any]]:
    out = []
    for data in encode_entries(entries, form):
        entry = pb.Entry.FromString(data)
        change = (
            pb.RowChange.FromString(entry.storeValue) if entry.entryType == pb.ROWDATA else None
        )
        out.append((entry, change))
    return out


def _columns(image: Any) -> list[tuple[Any, ...]]:
    """(name, sqlType, value or None for NULL, mysqlType, isKey, updated) of each column."""
    return [
        (c.name, c.sqlType, None if c.isNull else c.value, c.mysqlType, c.isKey, c.updated)
        for c in image
    ]


def test_mysql8_enum_set_text_and_gtids(tmp_path: Path) -> None:
    name = "rmc__mysql-enum-string-set.000001"
    uuid = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
    got = _decoded(Run(tmp_path, [name]).until((name, 3331)), MYSQL8)
    assert [(e.entryType, e.header.logfileOffset, e.header.eventLength) for e, _ in got] == [
        (pb.ROWDATA, 236, 257), (pb.ROWDATA, 572, 219),  # ALTER USER, CREATE TABLE
        (pb.TRANSACTIONBEGIN, 870, 76), (pb.ROWDATA, 1077, 452), (pb.TRANSACTIONEND, 1529, 31),
        (pb.TRANSACTIONBEGIN, 1639, 85), (pb.ROWDATA, 1855, 773), (pb.TRANSACTIONEND, 2628, 31),
        (pb.TRANSACTIONBEGIN, 2738, 76), (pb.ROWDATA, 2945, 355), (pb.TRANSACTIONEND, 3300, 31),
    ]  # fmt: skip
    # the GTID set including each transaction, its own GTID as curtGtid (Canal in GTID mode)
    n = [1, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]
    assert [e.header.gtid for e, _ in got] == [
        f"{uuid}:1" if k == 1 else f"{uuid}:1-{k}" for k in n
    ]
    assert [e.header.props[0].value for e, _ in got] == [f"{uuid}:{k}" for k in n]
    assert {e.header.props[0].key for e, _ in got} == {"curtGtid"}
    # BEGIN's thread id and the XIDs, as mariadb-binlog prints them for this file
    begins = [pb.TransactionBegin.FromString(e.storeValue) for e, _ in got if e.entryType == 1]
    ends = [pb.TransactionEnd.FromString(e.storeValue) for e, _ in got if e.entryType == 3]
    assert [b.threadId for b in begins] == [9, 9, 9]
    assert [e.transactionId for e in ends] == ["50", "51", "52"]
    create = got[1][1]
    assert (create.eventType, create.isDdl, create.ddlSchemaName) == (pb.CREATE, True, "mysql")
    assert create.sql.startswith("CREATE TABLE t(f1 CHAR(128)")
    types = ["char(128)", "varchar(300)", "enum('var1','variant2','foo')",
             "set('one','two','three','four')", "text"]  # fmt: skip
    first = [
        ("f1", T.CHAR, "0123456789" * 10, types[0], False, True),
        ("f2", T.VARCHAR, LONG, types[1], False, True),
        ("f3", T.INTEGER, "1", types[2], False, True),  # 'var1': ENUM index 1
        ("f4", T.BIT, "5", types[3], False, True),  # 'one,three': bits 0 and 2
        ("f5", T.CLOB, "0123456789", types[4], False, True),
    ]
    insert, update, delete = got[3][1], got[6][1], got[9][1]
    assert got[3][0].header.props[1].value == "1"  # rowsCount
    (row,) = insert.rowDatas
    assert _columns(row.afterColumns) == first and len(row.beforeColumns) == 0
    (row,) = update.rowDatas
    assert _columns(row.beforeColumns) == [(*c[:5], False) for c in first]
    second = [
        ("f1", T.CHAR, "field1", types[0], False, True),
        ("f2", T.VARCHAR, "field_2", types[1], False, True),
        ("f3", T.INTEGER, "2", types[2], False, True),
        ("f4", T.BIT, "10", types[3], False, True),  # 'two,four': bits 1 and 3
        ("f5", T.CLOB, LONG, types[4], False, True),
    ]
    assert _columns(row.afterColumns) == second
    (row,) = delete.rowDatas
    assert _columns(row.beforeColumns) == [(*c[:5], False) for c in second]


def test_mysql8_unsigned_invisible_blob_and_bit(tmp_path: Path) -> None:
    a, b = "rmc__binlog-invisible-columns.000001", "rmc__mysql_type_bit.000001"
    got = _decoded(Run(tmp_path, [a, b]).until((b, 970 + 31)), MYSQL8)
    changes = [c for e, c in got if c is not None and not c.isDdl]
    types = ["int unsigned", "int unsigned", "int", "text", "blob", "bigint unsigned"]
    first = [
        ("f1", T.INTEGER, "1", types[0], False, True),
        ("f2", T.INTEGER, "2", types[1], False, True),
        ("f3", T.INTEGER, "-3", types[2], False, True),
        ("f4", T.CLOB, "4", types[3], False, True),
        ("f5", T.BLOB, "\x05", types[4], False, True),
        ("f6", T.BIGINT, "6000000000", types[5], False, True),
    ]
    assert _columns(changes[0].rowDatas[0].afterColumns) == first
    old = [
        ("f1", T.INTEGER, None, types[0], False, False),
        ("f2", T.INTEGER, None, types[1], False, False),
        ("f3", T.INTEGER, "-33", types[2], False, False),
        ("f4", T.CLOB, "44", types[3], False, False),
        ("f5", T.BLOB, "U", types[4], False, False),
        ("f6", T.BIGINT, None, types[5], False, False),
    ]
    assert _columns(changes[1].rowDatas[0].afterColumns) == [(*c[:5], True) for c in old]
    (row,) = changes[2].rowDatas
    assert _columns(row.beforeColumns) == old
    assert _columns(row.afterColumns) == [
        ("f1", T.INTEGER, "111", types[0], False, True),
        ("f2", T.INTEGER, "222", types[1], False, True),
        ("f3", T.INTEGER, "-333", types[2], False, True),
        ("f4", T.CLOB, "444", types[3], False, True),
        ("f5", T.BLOB, "U", types[4], False, False),  # unchanged
        ("f6", T.BIGINT, None, types[5], False, False),  # NULL → NULL: unchanged
    ]
    assert _columns(changes[3].rowDatas[0].afterColumns) == [
        ("a", T.BIT, "4", "bit(3)", False, True),  # b'100'
        ("b", T.CLOB, "foo", "text", False, True),
        ("c", T.BIT, "32", "bit(8)", False, True),
    ]
    # the second file's GTIDs join the first file's set
    last = got[-1][0].header
    assert last.gtid == (
        "97c7af02-4c50-11ec-acd8-681842034964:1-5,fbda2ad0-7c46-11ec-ae30-4ef7efc81a2a:1-3"
    )


def test_mysql57_display_widths_and_a_two_row_delete(tmp_path: Path) -> None:
    """MySQL 5.7.40 (names from tests/fixtures/mysql/schema.sql): ``int(11)`` as its DESC
    shows it; a DELETE of two rows is one RowChange with two RowDatas."""
    name = "ape__mysql-bin.000080"
    uuid = "58cf6502-63db-11ed-8079-0242ac110002"
    got = _decoded(Run(tmp_path, [name]).until((name, 2454)), MYSQL57)
    entry, change = got[1]
    assert (entry.header.tableName, entry.header.eventType, entry.header.gtid) == (
        "b", pb.DELETE, f"{uuid}:1-53",
    )  # fmt: skip
    assert [(p.key, p.value) for p in entry.header.props] == [
        ("curtGtid", f"{uuid}:53"), ("rowsCount", "2"),
    ]  # fmt: skip
    assert [_columns(r.beforeColumns) for r in change.rowDatas] == [
        [("id", T.INTEGER, "12", "int(11)", False, False)]
    ] * 2
    erase = [c for e, c in got if c is not None and c.eventType == pb.ERASE]
    assert len(erase) == 2 and all(c.isDdl and c.sql.upper().startswith("DROP") for c in erase)


def test_mysql8_json_as_canal_writes_it(tmp_path: Path) -> None:
    """MySQL 8.0.22's JSON column (names from the CREATE TABLE in the file): VARCHAR with
    the text Canal's JsonConversion gives; the partial update after these is refused by
    the reader (test_mysql_local.py)."""
    name = "rmc__json.binlog.000001"
    run = Run(tmp_path, [name])
    with pytest.raises(BinlogConfigError):
        run.until((name, 4011))
    inserts = [e for e in run.entries if e.header.event_type.value == "INSERT"]
    got = _decoded(inserts[:1], MYSQL8)
    (row,) = got[0][1].rowDatas
    assert _columns(row.afterColumns) == [
        ("id", T.INTEGER, "1", "int", False, True),
        ("json_col", T.VARCHAR, '{"age": 24, "data": "xxxxxxxxxx", "name": "Joe"}', "json",
         False, True),
        ("name", T.VARCHAR, "Joe", "varchar(100)", False, True),
        ("age", T.INTEGER, "24", "int", False, True),
    ]  # fmt: skip
