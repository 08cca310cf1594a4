"""canal-ha entries → Canal's protobuf Entry (canal_server.canal), on hand-built entries.

Expected texts and codes are written out from Canal's rules (LogEventConvert,
RowsLogBuffer; docs/canal-protocol.md), never computed by the code under test. Java's
float texts are as OpenJDK 17's ``Double.toString`` / ``Float.toString`` print them
(checked with a small Java program on this machine: Canal runs on Java 8-17).
"""

from __future__ import annotations

import datetime
import json
import os
import random
import subprocess
import sys
from decimal import Decimal
from typing import Any

import msgpack
import pytest
from google.protobuf.json_format import MessageToDict

from canal_protocol.canal import entry_pb2 as pb
from canal_protocol.entry import Entry, EntryType, EventType, Header, RowImages, TableColumns
from canal_server.canal.convert import canal_gtid, column_value, encode_entries, to_canal_entry
from canal_server.canal.types import CanalForm, SqlType, canal_mysql_type, display_widths
from canal_server.canal.values import java_double, java_float, json_text
from canal_server.packed import PackedRows, pack_columns

UTC = CanalForm(datetime.UTC)
CST = CanalForm(datetime.timezone(datetime.timedelta(hours=8)))
T = SqlType


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (0.1, "0.1"), (-2.5, "-2.5"),
        (100.0, "100.0"), (1234567.0, "1234567.0"), (9999999.999, "9999999.999"),
        (1e7, "1.0E7"), (12345678.9, "1.23456789E7"), (1e10, "1.0E10"), (0.001, "0.001"),
        (0.0001, "1.0E-4"), (-1.5e-5, "-1.5E-5"), (0.30000000000000004, "0.30000000000000004"),
        (1.7976931348623157e308, "1.7976931348623157E308"), (5e-324, "4.9E-324"),
        (2.2250738585072014e-308, "2.2250738585072014E-308"),
        # a whole number of 2^53 or more, below 2^63: Java 8-18 print its exact digits
        (2.82879384806159e17, "2.82879384806159008E17"), (2.0**60, "1.15292150460684698E18"),
        (1e18, "1.0E18"), (9.007199254740992e15, "9.007199254740992E15"),
    ],
)  # fmt: skip
def test_double_text_is_javas(x: float, text: str) -> None:
    assert java_double(x) == text


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0, "0.0"), (-0.0, "-0.0"), (1.1, "1.1"), (0.1, "0.1"), (-3.4e38, "-3.4E38"),
        (3.4028234663852886e38, "3.4028235E38"), (1.401298464324817e-45, "1.4E-45"),
        (1e-5, "1.0E-5"), (123.456, "123.456"), (1.2345678, "1.2345678"),
        (9999999.0, "9999999.0"), (16777216.0, "1.6777216E7"),
        # whole floats of 2^24 or more: Java 8-18 print more than the shortest digits
        (2915093760.0, "2.91509376E9"), (561580277760.0, "5.6158028E11"),
    ],
)  # fmt: skip
def test_float_text_is_javas(x: float, text: str) -> None:
    assert java_float(x) == text


@pytest.mark.parametrize(
    ("mysql_type", "value", "sql_type", "text"),
    [
        ("tinyint", -128, T.TINYINT, "-128"), ("tinyint unsigned", 127, T.TINYINT, "127"),
        ("tinyint unsigned", 128, T.SMALLINT, "128"), ("tinyint unsigned", 255, T.SMALLINT, "255"),
        ("smallint unsigned", 32767, T.SMALLINT, "32767"),
        ("smallint unsigned", 65535, T.INTEGER, "65535"),
        ("mediumint unsigned", 16777215, T.INTEGER, "16777215"),
        ("int", -2147483648, T.INTEGER, "-2147483648"),
        ("int unsigned", 2147483647, T.INTEGER, "2147483647"),
        ("int unsigned", 4294967295, T.BIGINT, "4294967295"),
        ("bigint", -9223372036854775808, T.BIGINT, "-9223372036854775808"),
        ("bigint unsigned", 9223372036854775807, T.BIGINT, "9223372036854775807"),
        ("bigint unsigned", 18446744073709551615, T.DECIMAL, "18446744073709551615"),
        ("decimal(10,2)", "-0.50", T.DECIMAL, "-0.50"),
        ("decimal(10,2)", "-0.00", T.DECIMAL, "0.00"),
        ("decimal(5,0)", "12345", T.DECIMAL, "12345"),
        ("decimal(65,30)", "0.000000000000000000000000000001", T.DECIMAL,
         "0.000000000000000000000000000001"),
        ("float", 1.1, T.REAL, "1.1"), ("double", -1e-4, T.DOUBLE, "-1.0E-4"),
        ("bit(1)", 1, T.BIT, "1"), ("bit(64)", 18446744073709551615, T.BIT, "18446744073709551615"),
        ("date", "0000-00-00", T.DATE, "0000-00-00"), ("date", "2020-00-00", T.DATE, "2020-00-00"),
        ("time", "-838:59:59", T.TIME, "-838:59:59"),
        ("time(6)", "-00:00:00.500000", T.TIME, "-00:00:00.500000"),
        ("time(3)", "100:00:00.000", T.TIME, "100:00:00.000"),
        ("datetime(6)", "2020-02-03T04:05:06.000100", T.TIMESTAMP, "2020-02-03 04:05:06.000100"),
        ("datetime", "0000-00-00T00:00:00", T.TIMESTAMP, "0000-00-00 00:00:00"),
        ("datetime", "999-01-02T03:04:05", T.TIMESTAMP, "0999-01-02 03:04:05"),
        ("timestamp(6)", "2001-02-03T04:05:06.500000Z", T.TIMESTAMP, "2001-02-03 04:05:06.500000"),
        ("timestamp(3)", "0000-00-00T00:00:00.000Z", T.TIMESTAMP, "0000-00-00 00:00:00.000"),
        ("year", 0, T.VARCHAR, "0000"), ("year", 2155, T.VARCHAR, "2155"),
        ("char(10)", "a b", T.CHAR, "a b"), ("varchar(20)", "héllo 😀", T.VARCHAR, "héllo 😀"),
        ("tinytext", "t", T.CLOB, "t"), ("longtext", '{"a": 1}', T.CLOB, '{"a": 1}'),
        ("binary(4)", b"A\x00\x00\x00", T.BLOB, "A"),
        ("binary(4)", b"\x00\x01\x00\x00", T.BLOB, "\x00\x01"),
        ("varbinary(16)", b"\x00\xff\x00", T.BLOB, "\x00\xff\x00"),
        ("blob", bytes([0x80, 0xFF]), T.BLOB, "\x80\xff"),
        ("geometry", b"\x00\x01", T.BLOB, "\x00\x01"),
        ("enum('a','b','c')", "c", T.INTEGER, "3"), ("enum('a','b','c')", "", T.INTEGER, "0"),
        ("enum('x','it''s')", "it's", T.INTEGER, "2"),
        ("set('x','y','z')", "x,z", T.BIT, "5"), ("set('x','y','z')", "", T.BIT, "0"),
        ("type245", '{"k": [1, 2]}', T.VARCHAR, '{"k": [1, 2]}'),
    ],
)  # fmt: skip
def test_value_text_and_sql_type(mysql_type: str, value: Any, sql_type: int, text: str) -> None:
    assert column_value(mysql_type, value, UTC) == (sql_type, text)


def test_timestamp_is_printed_in_the_zone() -> None:
    assert column_value("timestamp", "2024-06-30T23:59:59Z", CST) == (
        T.TIMESTAMP,
        "2024-07-01 07:59:59",
    )
    assert column_value("timestamp", "1970-01-01T00:00:01Z", UTC)[1] == "1970-01-01 00:00:01"


@pytest.mark.parametrize(
    ("mysql_type", "code"),
    [
        ("tinyint", T.TINYINT), ("tinyint unsigned", T.TINYINT), ("int unsigned", T.INTEGER),
        ("bigint unsigned", T.BIGINT), ("decimal(4,1)", T.DECIMAL), ("float", T.REAL),
        ("year", T.VARCHAR), ("binary(2)", T.BLOB), ("varbinary(2)", T.BLOB), ("blob", T.BLOB),
        ("text", T.CLOB), ("char(2)", T.CHAR), ("enum('a')", T.INTEGER), ("set('a')", T.BLOB),
        ("bit(3)", T.BIT), ("type245", T.OTHER), ("datetime", T.TIMESTAMP), ("time", T.TIME),
    ],
)  # fmt: skip
def test_null_sql_type(mysql_type: str, code: int) -> None:
    assert column_value(mysql_type, None) == (code, "")


@pytest.mark.parametrize(
    ("ours", "canal"),
    [
        ("tinyint", "tinyint(4)"), ("tinyint unsigned", "tinyint(3) unsigned"),
        ("smallint", "smallint(6)"), ("smallint unsigned", "smallint(5) unsigned"),
        ("mediumint", "mediumint(9)"), ("mediumint unsigned", "mediumint(8) unsigned"),
        ("int", "int(11)"), ("int unsigned", "int(10) unsigned"), ("bigint", "bigint(20)"),
        ("bigint unsigned", "bigint(20) unsigned"), ("year", "year(4)"), ("type245", "json"),
        ("decimal(10,2)", "decimal(10,2)"), ("varchar(20)", "varchar(20)"),
        ("datetime(6)", "datetime(6)"), ("enum('a','b')", "enum('a','b')"), ("bit(1)", "bit(1)"),
    ],
)  # fmt: skip
def test_mysql_type_text(ours: str, canal: str) -> None:
    assert canal_mysql_type(ours) == canal


@pytest.mark.parametrize(
    ("version", "widths"),
    [
        ("10.11.6-MariaDB-0+deb12u1-log", True), ("11.4.2-MariaDB", True), ("5.7.40-log", True),
        ("8.0.18", True), ("8.0.19", False), ("8.0.32-0ubuntu0.22.04.2", False), ("8.4.0", False),
        ("9.0.1", False),
    ],
)  # fmt: skip
def test_display_widths_by_server_version(version: str, widths: bool) -> None:
    """MySQL 8.0.19 dropped integer display widths from DESC (``int unsigned``, ``year``)."""
    assert display_widths(version) is widths
    form = CanalForm.of_server(version)
    assert canal_mysql_type("int unsigned", form.widths) == (
        "int(10) unsigned" if widths else "int unsigned"
    )
    assert canal_mysql_type("year", form.widths) == ("year(4)" if widths else "year")
    assert canal_mysql_type("bit(3)", form.widths) == "bit(3)"


def test_mysql_json_text_is_canals() -> None:
    """MySQL's binary JSON as the reader has it (the library's parse: bytes keys and
    strings) in the text Canal's JsonConversion writes."""
    value = {
        b"age": 24, b"s": 'q"\n\t\\\x01\x1f\x7f\xa0¡😀'.encode(),
        b"l": [1, -2.5, 1e20, None, True, False, []], b"o": {},
        b"d": Decimal("1.50"), b"t": datetime.timedelta(hours=-1, seconds=1),
        b"z": datetime.timedelta(0), b"dt": datetime.datetime(2020, 1, 2, 3, 4, 5, 6),
    }  # fmt: skip
    assert json_text(value) == (
        '{"age": 24, "s": "q\\"\\n\\t\\\\\\u0001\\u001f\\u007f\\u00a0¡😀", '
        '"l": [1, -2.5, 1.0E20, null, true, false, []], "o": {}, "d": 1.50, '
        '"t": "-00:59:59.000000", "z": "00:00:00", "dt": "2020-01-02 03:04:05.000006"}'
    )
    assert json_text('{"a":1}') == '{"a":1}'  # text stays as it is (MariaDB's JSON)


# -- entries ----------------------------------------------------------------------------------

COLS = TableColumns(
    ("id", "u", "name", "ts"), ("int", "tinyint unsigned", "varchar(10)", "timestamp"),
    (True, False, False, False),
)  # fmt: skip


def _header(kind: EventType, gtid: str = "0-1-8", **kw: Any) -> Header:
    base: dict[str, Any] = dict(logfile="mariadb-bin.000003", offset=1000, end_offset=1080,
                                server_id=7, timestamp_ms=1_700_000_000_000, gtid=gtid,
                                schema="shop", table="t", event_type=kind)  # fmt: skip
    base.update(kw)
    return Header(**base)


def _rows(
    kind: EventType, before: Any = (), after: Any = (), state: str = "0-1-7", **kw: Any
) -> Entry:
    return Entry(EntryType.ROWDATA, _header(kind, **kw), images=RowImages(COLS, before, after),
                 gtid_state=state)  # fmt: skip


def _column(index: int, name: str, sql: int, mysql: str, value: str | None, **kw: Any) -> pb.Column:
    col = pb.Column(
        index=index, sqlType=sql, name=name, mysqlType=mysql, isNull=value is None, **kw
    )
    if value is not None:
        col.value = value
    return col


def _decode(data: bytes) -> tuple[pb.Entry, Any]:
    entry = pb.Entry.FromString(data)
    if entry.entryType == pb.ROWDATA:
        return entry, pb.RowChange.FromString(entry.storeValue)
    if entry.entryType == pb.TRANSACTIONBEGIN:
        return entry, pb.TransactionBegin.FromString(entry.storeValue)
    return entry, pb.TransactionEnd.FromString(entry.storeValue)


def _same(entries: list[Entry], form: CanalForm = UTC) -> list[tuple[pb.Entry, Any]]:
    """encode_entries' bytes parse to what to_canal_entry builds; both, decoded."""
    fast = [_decode(b) for b in encode_entries(entries, form)]
    ref = [to_canal_entry(e, form) for e in entries]
    slow = [_decode(r.SerializeToString()) for r in ref if r is not None]
    assert len(fast) == len(slow)
    for (fe, fs), (se, ss) in zip(fast, slow, strict=True):
        assert fe.header == se.header and fe.entryType == se.entryType
        assert fs == ss
    return fast


def test_update_row_columns_and_header() -> None:
    entry = _rows(EventType.UPDATE, before=((1, 200, "a", "2024-01-01T00:00:00Z"),),
                  after=((1, 201, "a", None),))  # fmt: skip
    ((e, change),) = _same([entry])
    h = e.header
    assert (h.version, h.logfileName, h.logfileOffset, h.serverId, h.serverenCode) == (
        1, "mariadb-bin.000003", 1000, 7, "UTF-8",
    )  # fmt: skip
    assert (h.executeTime, h.sourceType, h.schemaName, h.tableName, h.eventLength) == (
        1_700_000_000_000, pb.MYSQL, "shop", "t", 80,
    )  # fmt: skip
    assert h.eventType == pb.UPDATE and h.gtid == "0-1-8"
    assert [(p.key, p.value) for p in h.props] == [("rowsCount", "1")]
    assert e.entryType == pb.ROWDATA
    assert change.eventType == pb.UPDATE and change.HasField("isDdl") and not change.isDdl
    assert change.tableId == 0 and change.sql == ""
    (row,) = change.rowDatas
    assert list(row.beforeColumns) == [
        _column(0, "id", T.INTEGER, "int(11)", "1", isKey=True),
        _column(1, "u", T.SMALLINT, "tinyint(3) unsigned", "200"),
        _column(2, "name", T.VARCHAR, "varchar(10)", "a"),
        _column(3, "ts", T.TIMESTAMP, "timestamp", "2024-01-01 00:00:00"),
    ]
    assert list(row.afterColumns) == [
        _column(0, "id", T.INTEGER, "int(11)", "1", isKey=True),
        _column(1, "u", T.SMALLINT, "tinyint(3) unsigned", "201", updated=True),
        _column(2, "name", T.VARCHAR, "varchar(10)", "a"),
        _column(3, "ts", T.TIMESTAMP, "timestamp", None, updated=True),
    ]


def test_insert_delete_and_the_updated_flag() -> None:
    insert = _rows(EventType.INSERT, after=((1, 5, "", None), (2, 6, "b", None)))
    delete = _rows(EventType.DELETE, before=((1, 5, "", None),))
    (_, ins), (_, dele) = _same([insert, delete])
    assert [len(r.beforeColumns) for r in ins.rowDatas] == [0, 0]
    assert all(c.updated for r in ins.rowDatas for c in r.afterColumns)  # INSERT: every column
    assert ins.rowDatas[0].afterColumns[2] == _column(
        2, "name", T.VARCHAR, "varchar(10)", "", updated=True
    )  # an empty string is not NULL
    (row,) = dele.rowDatas
    assert len(row.afterColumns) == 0 and not any(c.updated for c in row.beforeColumns)
    assert [c.isNull for c in row.beforeColumns] == [False, False, False, True]


def test_updated_compares_texts_and_nullness() -> None:
    """Canal's ``isUpdate`` compares the value texts: -0.0 → 0.0 is an update (Java
    prints them differently), NULL → '' is one, NULL → NULL is not."""
    cols = TableColumns(("id", "f", "s", "n"), ("int", "double", "varchar(3)", "int"),
                        (True, False, False, False))  # fmt: skip
    images = RowImages(cols, ((1, -0.0, None, None),), ((1, 0.0, "", None),))
    entry = Entry(EntryType.ROWDATA, _header(EventType.UPDATE), images=images)
    ((_, change),) = _same([entry])
    assert [c.updated for c in change.rowDatas[0].afterColumns] == [False, True, True, False]
    assert [c.value for c in change.rowDatas[0].beforeColumns] == ["1", "-0.0", "", ""]


def test_transaction_begin_end_and_gtids() -> None:
    begin = Entry(EntryType.TRANSACTIONBEGIN, _header(EventType.GTID, schema="", table=""),
                  gtid_state="0-1-7,1-2-3")  # fmt: skip
    rows = _rows(EventType.INSERT, after=((1, 1, "x", None),), state="0-1-7,1-2-3")
    end = Entry(EntryType.TRANSACTIONEND, _header(EventType.QUERY, schema="", table=""),
                gtid_state="0-1-8,1-2-3")  # fmt: skip
    (b, tb), (r, _), (e, te) = _same([begin, rows, end])
    # Canal's gtid: the state including the transaction (MariaDB: domain by domain)
    assert [x.header.gtid for x in (b, r, e)] == ["0-1-8,1-2-3"] * 3
    assert not b.header.HasField("eventType") and not e.header.HasField("eventType")
    assert (b.header.schemaName, b.header.tableName, list(b.header.props)) == ("", "", [])
    assert b.entryType == pb.TRANSACTIONBEGIN and tb.threadId == 0
    assert e.entryType == pb.TRANSACTIONEND and te.transactionId == "0"
    begin = Entry(begin.type, begin.header, gtid_state=begin.gtid_state, thread_id=8)
    end = Entry(end.type, end.header, gtid_state=end.gtid_state, xid=18446744073709551615)
    (_, tb), (_, te) = _same([begin, end])
    assert (tb.threadId, te.transactionId) == (8, "18446744073709551615")


def test_mysql_gtid_set_and_current_gtid() -> None:
    uuid = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
    entry = _rows(EventType.DELETE, before=((1, 1, "x", None),), gtid=f"{uuid}:4",
                  state=f"{uuid}:1-3,aaaaaaaa-0000-0000-0000-000000000000:5")  # fmt: skip
    ((e, _),) = _same([entry])
    assert e.header.gtid == f"{uuid}:1-4,aaaaaaaa-0000-0000-0000-000000000000:5"
    assert [(p.key, p.value) for p in e.header.props] == [
        ("curtGtid", f"{uuid}:4"), ("rowsCount", "1"),
    ]  # fmt: skip
    assert canal_gtid(f"{uuid}:9", "") == f"{uuid}:9"  # an entry read from the wire
    assert canal_gtid("", f"{uuid}:1-3") == f"{uuid}:1-3"  # an anonymous transaction


def test_ddl_entry() -> None:
    ddl = Entry(EntryType.ROWDATA, _header(EventType.ALTER), is_ddl=True,
                sql="ALTER TABLE t ADD c INT", gtid_state="0-1-8")  # fmt: skip
    query = Entry(EntryType.ROWDATA, _header(EventType.QUERY, schema="", table=""),
                  is_ddl=True, sql="GRANT ALL ON *.* TO x", gtid_state="0-1-8")  # fmt: skip
    (d, dc), (q, qc) = _same([ddl, query])
    assert d.header.eventType == pb.ALTER and list(d.header.props) == []
    assert (dc.eventType, dc.isDdl, dc.sql, dc.ddlSchemaName) == (
        pb.ALTER, True, "ALTER TABLE t ADD c INT", "shop",
    )  # fmt: skip
    assert len(dc.rowDatas) == 0
    assert (q.header.eventType, qc.isDdl, qc.ddlSchemaName) == (pb.QUERY, True, "")


def test_snapshot_read_is_an_insert_marked_snapshot_and_heartbeats_are_dropped() -> None:
    h: dict[str, Any] = dict(end_offset=1000, gtid="0-1-7", snapshot=4)
    read = Entry(EntryType.ROWDATA, _header(EventType.READ, **h),
                 images=RowImages(COLS, (), ((3, 1, "r", None),)), gtid_state="0-1-7")  # fmt: skip
    begin = Entry(EntryType.TRANSACTIONBEGIN, _header(EventType.READ, **{**h, "snapshot": 3}),
                  gtid_state="0-1-7")  # fmt: skip
    beat = Entry(EntryType.ROWDATA, _header(EventType.HEARTBEAT))
    assert to_canal_entry(beat) is None
    (b, _), (r, change) = _same([begin, beat, read])
    assert [(p.key, p.value) for p in b.header.props] == [("snapshot", "3")]
    assert r.header.eventType == pb.INSERT and r.header.eventLength == 0
    assert r.header.gtid == "0-1-7"  # the state the chunk follows
    assert [(p.key, p.value) for p in r.header.props] == [("rowsCount", "1"), ("snapshot", "4")]
    assert change.eventType == pb.INSERT and not change.isDdl
    assert all(c.updated for c in change.rowDatas[0].afterColumns)


def test_packed_rows_are_decoded_without_keeping_the_tuples() -> None:
    """The store's rows (the C decoder's msgpack) give the same columns, and stay small."""
    after: list[list[Any]] = [[1, 9, "p", "2024-01-01T00:00:00Z"], [2, 250, None, None]]
    packed = PackedRows(COLS, 2, b"\x90", msgpack.packb(after), pack_columns(COLS))
    entry = Entry(EntryType.ROWDATA, _header(EventType.INSERT), images=packed, gtid_state="0-1-7")
    plain = _rows(EventType.INSERT, after=tuple(tuple(row) for row in after))
    assert encode_entries([entry], UTC) == encode_entries([plain], UTC)
    assert "images" not in vars(packed)


def test_long_values_wide_tables_and_random_rows() -> None:
    """Values of any length (a column's prefix is precomputed for short ones), indexes
    and names past one varint byte, every type with random values and NULLs."""
    types = ["int", "bigint unsigned", "varchar(300)", "blob", "double", "float",
             "decimal(20,4)", "datetime(3)", "timestamp", "date", "time(6)", "year",
             "bit(64)", "enum('a','b')", "set('a','b','c')", "tinyint unsigned"]  # fmt: skip
    rnd = random.Random(32)

    def value(t: str) -> Any:
        gen: Any = {
            "int": lambda: rnd.randint(-(2**31), 2**31 - 1),
            "bigint unsigned": lambda: rnd.choice([0, 2**63 - 1, 2**63, 2**64 - 1]),
            "varchar(300)": lambda: "é" * rnd.choice([0, 1, 63, 64, 65, 200]),
            "blob": lambda: bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 5, 100]))),
            "double": lambda: rnd.choice([0.1, -2.5e300, 1e-7, 3.0]),
            "float": lambda: rnd.choice([1.1, 3.4e38, 16777216.0]),
            "decimal(20,4)": lambda: rnd.choice(["0.0000", "-123.4560"]),
            "datetime(3)": lambda: "2020-01-02T03:04:05.678",
            "timestamp": lambda: "2020-01-02T03:04:05Z",
            "date": lambda: "2020-01-02",
            "time(6)": lambda: "-12:00:00.000001",
            "year": lambda: rnd.choice([0, 1901]),
            "bit(64)": lambda: 2**64 - 1,
            "enum('a','b')": lambda: "b",
            "set('a','b','c')": lambda: "a,c",
            "tinyint unsigned": lambda: rnd.choice([0, 200]),
        }[t]
        return None if rnd.random() < 0.2 else gen()

    width = 150  # column indexes up to 149: two varint bytes
    col_types = [types[i % len(types)] for i in range(width)]
    cols = TableColumns(tuple(f"c{i}_" + "n" * (i % 130) for i in range(width)), tuple(col_types),
                        tuple(i == 0 for i in range(width)))  # fmt: skip
    images = [tuple(value(t) for t in col_types) for _ in range(30)]
    entries = [
        Entry(
            EntryType.ROWDATA, _header(EventType.INSERT), images=RowImages(cols, (), tuple(images))
        ),
        Entry(
            EntryType.ROWDATA,
            _header(EventType.UPDATE),
            images=RowImages(cols, tuple(images[:15]), tuple(images[15:])),
        ),
        Entry(EntryType.ROWDATA, _header(EventType.DELETE), images=RowImages(cols, tuple(images))),
    ]
    (_, ins), (_, upd), (_, dele) = _same(entries, CST)
    col = ins.rowDatas[0].afterColumns[149]
    assert (col.index, col.name) == (149, "c149_" + "n" * 19)
    assert len(ins.rowDatas) == 30 and len(upd.rowDatas) == 15 and len(dele.rowDatas) == 30


def test_a_value_without_a_canal_form_is_an_error_naming_the_column() -> None:
    """A value that does not fit its column type (not what the reader gives): an error
    naming the table, the column, its type and the value, not a stray TypeError."""
    bad = _rows(
        EventType.INSERT, after=((1, 2, "x", "2024-01-01T00:00:00Z"), (2, 3, b"\xff", None))
    )
    with pytest.raises(ValueError, match=r"shop\.t at mariadb-bin\.000003:1000: column name "
                       r"\(varchar\(10\)\): no Canal text for b'\\xff'"):  # fmt: skip
        encode_entries([bad], UTC)
    short = _rows(EventType.DELETE, before=((1, 2, "x"),))
    with pytest.raises(ValueError, match="a row of 3 values for 4 columns"):
        encode_entries([short], UTC)


_CANAL_PYTHON = """
import json, sys
from google.protobuf.json_format import MessageToDict
from canal.protocol import EntryProtocol_pb2 as E
out = []
for line in sys.stdin:
    entry = E.Entry.FromString(bytes.fromhex(line.strip()))
    store = {1: E.TransactionBegin, 2: E.RowChange, 3: E.TransactionEnd}[entry.entryType]
    out.append([MessageToDict(entry.header), entry.entryType,
                MessageToDict(store.FromString(entry.storeValue))])
print(json.dumps(out))
"""


def test_canal_python_reads_the_entries() -> None:
    """canal-python 0.4 (PyPI; its own generated EntryProtocol classes) parses the bytes
    into the same fields the project's generated classes read from them."""
    cols = TableColumns(("id", "v", "b"), ("bigint unsigned", "double", "blob"),
                        (True, False, False))  # fmt: skip
    entries = [
        Entry(
            EntryType.TRANSACTIONBEGIN,
            _header(EventType.GTID, schema="", table=""),
            gtid_state="0-1-7",
            thread_id=3,
        ),
        Entry(
            EntryType.ROWDATA,
            _header(EventType.UPDATE),
            gtid_state="0-1-7",
            images=RowImages(cols, ((2**64 - 1, -0.0, b"\x00\xff"),), ((1, 1e20, None),)),
        ),
        Entry(EntryType.ROWDATA, _header(EventType.ALTER), is_ddl=True, sql="ALTER TABLE t"),
        Entry(
            EntryType.TRANSACTIONEND,
            _header(EventType.QUERY, schema="", table=""),
            gtid_state="0-1-8",
            xid=77,
        ),
    ]
    data = encode_entries(entries, UTC)
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    done = subprocess.run(
        [sys.executable, "-c", _CANAL_PYTHON], input="\n".join(d.hex() for d in data),
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    theirs = json.loads(done.stdout)
    ours = []
    for entry, store in (_decode(d) for d in data):
        ours.append([MessageToDict(entry.header), entry.entryType, MessageToDict(store)])
    assert theirs == ours
    change = theirs[1][2]["rowDatas"][0]
    assert change["beforeColumns"][0]["value"] == "18446744073709551615"
    assert change["beforeColumns"][0]["sqlType"] == T.DECIMAL
    assert change["beforeColumns"][2]["value"] == "\x00\xff"
    assert change["afterColumns"][1] == {
        "index": 1, "sqlType": T.DOUBLE, "name": "v", "updated": True, "isNull": False,
        "value": "1.0E20", "mysqlType": "double",
    }  # fmt: skip
    assert theirs[3][2] == {"transactionId": "77"} and theirs[0][2] == {"threadId": "3"}
