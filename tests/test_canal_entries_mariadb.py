"""Every MariaDB column type through the binlog reader and the Canal converter, value by
value, as Canal's LogEventConvert gives them (docs/canal-protocol.md).

The tables are tests/test_every_type.py's (its COLUMNS and ROWS) and one of extras (bit
widths, tiny/long text and blobs, geometry, every byte, float edge values, zone-printed
TIMESTAMP, a composite unsigned key). Expected ``sqlType`` / ``value`` / ``mysqlType``
are written out by hand from Canal's rules; ``mysqlType`` is also checked against what
``DESC`` says (Canal's table meta). Header positions are checked against ``SHOW BINLOG
EVENTS``, the GTID against ``@@gtid_binlog_pos``. The incremental snapshot's READ rows
of the same table give the binlog INSERT's columns, as INSERTs marked ``snapshot``.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from reader_fixtures import db  # noqa: F401  (fixture)
from test_every_type import COLUMNS, ROWS, _read

from canal_cluster.retry import RetryPolicy, wait_until
from canal_ha.sandbox import Sandbox
from canal_protocol.canal import entry_pb2 as pb
from canal_protocol.entry import Entry, EntryType
from canal_protocol.positions import EntryPosition, LogIdentity, LogPosition
from canal_server.canal.convert import encode_entries
from canal_server.canal.types import CanalForm, SqlType
from canal_server.parse.reader import BinlogReader, ReaderConfig
from canal_server.parse.snapshot import ChunkReader
from canal_server.snapshot import _chunk_entries

DB = "t_canal"
UTC = CanalForm(datetime.UTC)
CST = CanalForm(datetime.timezone(datetime.timedelta(hours=8)))
(BIT, TINYINT, BIGINT, CHAR, DECIMAL, INTEGER, SMALLINT, REAL, DOUBLE, VARCHAR, DATE, TIME,
 TIMESTAMP, BLOB, CLOB) = (
    SqlType.BIT, SqlType.TINYINT, SqlType.BIGINT, SqlType.CHAR, SqlType.DECIMAL,
    SqlType.INTEGER, SqlType.SMALLINT, SqlType.REAL, SqlType.DOUBLE, SqlType.VARCHAR,
    SqlType.DATE, SqlType.TIME, SqlType.TIMESTAMP, SqlType.BLOB, SqlType.CLOB,
)  # fmt: skip

# -- test_every_type's table ------------------------------------------------------------------

MYSQL_TYPES = {
    "id": "int(11)", "ti": "tinyint(4)", "tiu": "tinyint(3) unsigned", "si": "smallint(6)",
    "siu": "smallint(5) unsigned", "mi": "mediumint(9)", "miu": "mediumint(8) unsigned",
    "i": "int(11)", "iu": "int(10) unsigned", "bi": "bigint(20)", "biu": "bigint(20) unsigned",
    "d": "decimal(30,10)", "dw": "decimal(65,30)", "f": "float", "dbl": "double", "dt": "date",
    "tm": "time(6)", "tm0": "time", "dtm": "datetime(6)", "dtm3": "datetime(3)",
    "ts": "timestamp(6)", "y": "year(4)", "c": "char(10)", "vc": "varchar(40)", "tx": "text",
    "mt": "mediumtext", "b": "binary(4)", "vb": "varbinary(16)", "bl": "blob", "lb": "longblob",
    "e": "enum('a','b','c')", "s": "set('x','y','z')", "bt": "bit(12)", "j": "longtext",
}  # fmt: skip
# (sqlType, value; None: NULL) of every column of the four rows, in column order
INSERTED: dict[int, list[tuple[int, str | None]]] = {
    1: [
        (INTEGER, "1"), (TINYINT, "-128"), (TINYINT, "0"), (SMALLINT, "-32768"), (SMALLINT, "0"),
        (INTEGER, "-8388608"), (INTEGER, "0"), (INTEGER, "-2147483648"), (INTEGER, "0"),
        (BIGINT, "-9223372036854775808"), (BIGINT, "0"),
        (DECIMAL, "-12345678901234567890.0123456789"),
        (DECIMAL, "-99999999999999999999999999999999999.999999999999999999999999999999"),
        (REAL, "-3.4E38"), (DOUBLE, "-1.7976931348623157E308"), (DATE, "0000-00-00"),
        (TIME, "-838:59:59.000000"), (TIME, "00:00:00"), (TIMESTAMP, "0000-00-00 00:00:00.000000"),
        (TIMESTAMP, "1000-01-01 00:00:00.001"), (TIMESTAMP, "1970-01-01 00:00:01.000001"),
        (VARCHAR, "0000"), (CHAR, ""), (VARCHAR, ""), (CLOB, ""), (CLOB, ""),
        (BLOB, ""),  # BINARY(4) x'00': the binlog keeps no trailing 0x00, nothing is left
        (BLOB, ""), (BLOB, ""), (BLOB, ""), (INTEGER, "1"), (BIT, "0"), (BIT, "0"), (CLOB, "{}"),
    ],
    2: [
        (INTEGER, "2"), (TINYINT, "127"), (SMALLINT, "255"), (SMALLINT, "32767"),
        (INTEGER, "65535"), (INTEGER, "8388607"), (INTEGER, "16777215"), (INTEGER, "2147483647"),
        (BIGINT, "4294967295"), (BIGINT, "9223372036854775807"),
        (DECIMAL, "18446744073709551615"), (DECIMAL, "99999999999999999999.9999999999"),
        (DECIMAL, "0.000000000000000000000000000001"), (REAL, "1.1"), (DOUBLE, "2.2"),
        (DATE, "9999-12-31"), (TIME, "838:59:59.999999"), (TIME, "-00:00:01"),
        (TIMESTAMP, "9999-12-31 23:59:59.999999"), (TIMESTAMP, "2024-02-29 12:34:56.789"),
        (TIMESTAMP, "2038-01-19 03:14:07.999999"), (VARCHAR, "2155"), (CHAR, "chars"),
        (VARCHAR, "héllo 😀"), (CLOB, "text 😀"), (CLOB, "medium"), (BLOB, "\x00\x01"),
        (BLOB, "\x00\xff\x00"), (BLOB, "\x00\x01\x02"), (BLOB, "\xff\x00"), (INTEGER, "3"),
        (BIT, "5"), (BIT, "2049"), (CLOB, '{"a": [1, 2.5], "b": null}'),
    ],
    3: [
        (INTEGER, "3"), (TINYINT, None), (TINYINT, None), (SMALLINT, None), (SMALLINT, None),
        (INTEGER, None), (INTEGER, None), (INTEGER, None), (INTEGER, None), (BIGINT, None),
        (BIGINT, None), (DECIMAL, None), (DECIMAL, None), (REAL, None), (DOUBLE, None),
        (DATE, None), (TIME, None), (TIME, None), (TIMESTAMP, None), (TIMESTAMP, None),
        (TIMESTAMP, None), (VARCHAR, None), (CHAR, None), (VARCHAR, None), (CLOB, None),
        (CLOB, None), (BLOB, None), (BLOB, None), (BLOB, None), (BLOB, None), (INTEGER, None),
        (BLOB, None),  # a NULL SET is BLOB (RowsLogBuffer: BINARY; LogEventConvert: BLOB)
        (BIT, None), (CLOB, None),
    ],
    4: [
        (INTEGER, "4"), (TINYINT, "0"), (TINYINT, "1"), (SMALLINT, "-1"), (SMALLINT, "1"),
        (INTEGER, "0"), (INTEGER, "1"), (INTEGER, "0"), (INTEGER, "1"), (BIGINT, "0"),
        (BIGINT, "1"), (DECIMAL, "0.0000000000"), (DECIMAL, "-0.500000000000000000000000000000"),
        (REAL, "0.0"), (DOUBLE, "-1.0E-4"), (DATE, "2020-00-00"), (TIME, "00:00:00.500000"),
        (TIME, "12:34:56"), (TIMESTAMP, "2020-02-03 04:05:06.000100"),
        (TIMESTAMP, "2020-02-03 04:05:06.100"), (TIMESTAMP, "2001-02-03 04:05:06.500000"),
        (VARCHAR, "1901"), (CHAR, "a b"), (VARCHAR, "x"), (CLOB, "y"), (CLOB, "z"), (BLOB, "A"),
        (BLOB, "B"), (BLOB, "C"), (BLOB, "D"), (INTEGER, "2"), (BIT, "2"), (BIT, "1"),
        (CLOB, '[1, "two"]'),
    ],
}  # fmt: skip

# -- the extras ---------------------------------------------------------------------------------

EXTRA_COLUMNS = """
  id INT UNSIGNED NOT NULL, k2 VARCHAR(5) NOT NULL,
  b1 BIT(1), b64 BIT(64), tt TINYTEXT, tb TINYBLOB, mb MEDIUMBLOB, lt LONGTEXT, g GEOMETRY,
  fl FLOAT, dd DOUBLE, every_byte BLOB, dec0 DECIMAL(5,0), tm3 TIME(3), ts0 TIMESTAMP NULL,
  dt0 DATETIME, en ENUM('x','it''s'), st SET('a','b','c','d'), js JSON, u8 VARCHAR(20),
  PRIMARY KEY (id, k2)
"""
EVERY_BYTE = "".join(chr(i) for i in range(256))  # ISO-8859-1: one character per byte
EXTRA_ROWS = [
    "(4294967295, 'k', b'1', b'" + "1" * 64 + "', 'tiny', x'00ff', x'', 'long',"
    " ST_GeomFromText('POINT(1 2)'), 3.4028235e38, 4.9e-324, UNHEX('"
    + "".join(f"{i:02X}" for i in range(256)) + "'), -5, '-00:00:00.5',"
    " '2024-06-30 23:59:59', '0999-01-02 03:04:05', 'it''s', 'a,d', '{\"k\": \"v\", \"n\": 1.5}',"
    " '🙂 mañana')",
    "(1, 'k', b'0', b'0', '', x'', NULL, '', NULL, 16777216, 282879384806159008, x'', 0,"
    " '100:00:00', '1970-01-01 00:00:01', '2000-01-01 00:00:00', '', '', '[]', '')",
    "(2, 'k', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 2915093760, 0.0001, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL, NULL)",
]  # fmt: skip
EXTRA_TYPES = {
    "id": "int(10) unsigned", "k2": "varchar(5)", "b1": "bit(1)", "b64": "bit(64)",
    "tt": "tinytext", "tb": "tinyblob", "mb": "mediumblob", "lt": "longtext", "g": "geometry",
    "fl": "float", "dd": "double", "every_byte": "blob", "dec0": "decimal(5,0)",
    "tm3": "time(3)", "ts0": "timestamp", "dt0": "datetime", "en": "enum('x','it''s')",
    "st": "set('a','b','c','d')", "js": "longtext", "u8": "varchar(20)",
}  # fmt: skip
POINT = "\x00\x00\x00\x00\x01\x01\x00\x00\x00" + "\x00" * 6 + "\xf0?" + "\x00" * 7 + "@"
EXTRA_INSERTED: dict[int, list[tuple[int, str | None]]] = {
    4294967295: [
        (BIGINT, "4294967295"), (VARCHAR, "k"), (BIT, "1"), (BIT, "18446744073709551615"),
        (CLOB, "tiny"), (BLOB, "\x00\xff"), (BLOB, ""), (CLOB, "long"), (BLOB, POINT),
        (REAL, "3.4028235E38"), (DOUBLE, "4.9E-324"), (BLOB, EVERY_BYTE), (DECIMAL, "-5"),
        (TIME, "-00:00:00.500"), (TIMESTAMP, "2024-07-01 07:59:59"),  # printed at +08:00
        (TIMESTAMP, "0999-01-02 03:04:05"), (INTEGER, "2"), (BIT, "9"),
        (CLOB, '{"k": "v", "n": 1.5}'), (VARCHAR, "🙂 mañana"),
    ],
    1: [
        (INTEGER, "1"), (VARCHAR, "k"), (BIT, "0"), (BIT, "0"), (CLOB, ""), (BLOB, ""),
        (BLOB, None), (CLOB, ""), (BLOB, None), (REAL, "1.6777216E7"),
        (DOUBLE, "2.82879384806159008E17"), (BLOB, ""), (DECIMAL, "0"), (TIME, "100:00:00.000"),
        (TIMESTAMP, "1970-01-01 08:00:01"), (TIMESTAMP, "2000-01-01 00:00:00"),
        (INTEGER, "0"),  # '' inserted into an ENUM (non-strict mode): the error value, index 0
        (BIT, "0"), (CLOB, "[]"), (VARCHAR, ""),
    ],
    2: [
        (INTEGER, "2"), (VARCHAR, "k"), (BIT, None), (BIT, None), (CLOB, None), (BLOB, None),
        (BLOB, None), (CLOB, None), (BLOB, None), (REAL, "2.91509376E9"), (DOUBLE, "1.0E-4"),
        (BLOB, None), (DECIMAL, None), (TIME, None), (TIMESTAMP, None), (TIMESTAMP, None),
        (INTEGER, None), (BLOB, None), (CLOB, None), (VARCHAR, None),
    ],
}  # fmt: skip


def _decode(data: bytes) -> tuple[pb.Entry, Any]:
    entry = pb.Entry.FromString(data)
    if entry.entryType == pb.ROWDATA:
        return entry, pb.RowChange.FromString(entry.storeValue)
    return entry, None


def _expect(
    image: Any, mysql_types: dict[str, str], want: list[tuple[int, str | None]], keys: set[str],
    updated: set[str] | bool,
) -> None:  # fmt: skip
    """Every column of ``image`` (a RowData's columns) is what Canal gives."""
    names = list(mysql_types)
    assert [c.name for c in image] == names
    for i, (col, (sql_type, value)) in enumerate(zip(image, want, strict=True)):
        name = names[i]
        flag = updated if isinstance(updated, bool) else name in updated
        got = (col.index, col.sqlType, col.isNull, col.value, col.mysqlType, col.isKey,
               col.updated, col.length, col.HasField("isNull"), len(col.props))  # fmt: skip
        assert got == (i, sql_type, value is None, value or "", mysql_types[name],
                       name in keys, flag, 0, True, 0), name  # fmt: skip


def _desc(box: Sandbox, table: str) -> dict[str, str]:
    return {str(r[0]): str(r[1]) for r in box.primary.execute(f"DESC {DB}.{table}")}


def _prepare(box: Sandbox) -> tuple[EntryPosition, str]:
    """Both tables written: inserts, an update and a delete on each; the GTID state after
    the first insert."""
    box.primary.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    journal, offset = box.primary.master_status()
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION sql_mode = ''")  # zero dates, the ENUM error value
        cur.execute(f"CREATE TABLE {DB}.t ({COLUMNS}) DEFAULT CHARSET=utf8mb4")
        cur.execute(f"CREATE TABLE {DB}.x ({EXTRA_COLUMNS}) DEFAULT CHARSET=utf8mb4")
        cur.execute(f"INSERT INTO {DB}.t VALUES {', '.join(ROWS)}")
        cur.execute("SELECT @@gtid_binlog_pos")
        gtid = str(cur.fetchone()[0])
        cur.execute(f"UPDATE {DB}.t SET vc = 'changed', tiu = tiu + 1 WHERE id IN (1, 4)")
        cur.execute(f"DELETE FROM {DB}.t WHERE id = 3")
        cur.execute(f"INSERT INTO {DB}.x VALUES {', '.join(EXTRA_ROWS)}")
        cur.execute(f"UPDATE {DB}.x SET st = 'd,a', en = 'x' WHERE id = 1")
        cur.execute(f"DELETE FROM {DB}.x WHERE id = 2")
    return EntryPosition(journal=journal, offset=offset), gtid


def test_every_type_as_canal_gives_it(db: Sandbox) -> None:  # noqa: F811
    start, gtid_after_insert = _prepare(db)
    assert _desc(db, "t") == MYSQL_TYPES  # what Canal's table meta says
    assert _desc(db, "x") == EXTRA_TYPES
    entries = _read(db, start, 4 + 2 + 1 + 3 + 1 + 1, 6210)
    assert [(e.header.table, e.header.event_type.value) for e in entries] == [
        ("t", "INSERT"), ("t", "UPDATE"), ("t", "DELETE"),
        ("x", "INSERT"), ("x", "UPDATE"), ("x", "DELETE"),
    ]  # fmt: skip
    t_insert, t_update, t_delete, x_insert, x_update, x_delete = (
        _decode(data)[1] for data in encode_entries(entries, CST)
    )
    keys = {"id"}
    ids = [int(r.afterColumns[0].value) for r in t_insert.rowDatas]
    assert ids == [1, 2, 3, 4]
    for rid, row in zip(ids, t_insert.rowDatas, strict=True):
        assert len(row.beforeColumns) == 0
        want = INSERTED[rid]
        if rid in (1, 2, 4):  # a TIMESTAMP is printed in the zone asked for (+08:00 here)
            stamp = {1: "1970-01-01 08:00:01.000001", 2: "2038-01-19 11:14:07.999999",
                     4: "2001-02-03 12:05:06.500000"}[rid]  # fmt: skip
            want = [*want[:20], (TIMESTAMP, stamp), *want[21:]]
        _expect(row.afterColumns, MYSQL_TYPES, want, keys, True)
        INSERTED[rid] = want
    for row in t_update.rowDatas:
        rid = int(row.beforeColumns[0].value)
        _expect(row.beforeColumns, MYSQL_TYPES, INSERTED[rid], keys, False)
        after = list(INSERTED[rid])
        after[2] = (TINYINT, {1: "1", 4: "2"}[rid])
        after[23] = (VARCHAR, "changed")
        _expect(row.afterColumns, MYSQL_TYPES, after, keys, {"tiu", "vc"})
    (deleted,) = t_delete.rowDatas
    _expect(deleted.beforeColumns, MYSQL_TYPES, INSERTED[3], keys, False)
    assert len(deleted.afterColumns) == 0

    keys = {"id", "k2"}
    ids = [int(r.afterColumns[0].value) for r in x_insert.rowDatas]
    assert ids == [4294967295, 1, 2]
    for rid, row in zip(ids, x_insert.rowDatas, strict=True):
        _expect(row.afterColumns, EXTRA_TYPES, EXTRA_INSERTED[rid], keys, True)
    (change,) = x_update.rowDatas
    _expect(change.beforeColumns, EXTRA_TYPES, EXTRA_INSERTED[1], keys, False)
    after = list(EXTRA_INSERTED[1])
    after[16], after[17] = (INTEGER, "1"), (BIT, "9")
    _expect(change.afterColumns, EXTRA_TYPES, after, keys, {"en", "st"})
    (gone,) = x_delete.rowDatas
    _expect(gone.beforeColumns, EXTRA_TYPES, EXTRA_INSERTED[2], keys, False)

    _headers_match_the_binlog(db, start, gtid_after_insert)
    _snapshot_reads_are_the_inserts(db, x_insert)
    db.primary.execute(f"DROP DATABASE IF EXISTS {DB}")


def _headers_match_the_binlog(box: Sandbox, start: EntryPosition, gtid: str) -> None:
    """The first INSERT's transaction, every entry of it, against SHOW BINLOG EVENTS."""
    got: list[Entry] = []
    cfg = ReaderConfig(master=box.primary.dsn(), slave_id=6211, retry=RetryPolicy(0.05))
    reader = BinlogReader(cfg, got.extend)
    thread = threading.Thread(target=reader.run, args=(start,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: sum(e.row_count for e in list(got)) >= 4, "the first insert", 60)
    finally:
        reader.stop()
        thread.join(30)
    tx: list[Entry] = []
    for e in got:
        if e.type is EntryType.TRANSACTIONBEGIN or tx:
            tx.append(e)
        if tx and e.type is EntryType.TRANSACTIONEND:
            break
    canal = [_decode(data)[0] for data in encode_entries(tx, UTC)]
    assert [c.entryType for c in canal] == [pb.TRANSACTIONBEGIN, pb.ROWDATA, pb.TRANSACTIONEND]
    shown = box.primary.execute(f"SHOW BINLOG EVENTS IN '{start.journal}'")
    events = {int(r[1]): (str(r[2]), int(r[3]), int(r[4])) for r in shown}
    # Pos → (Event_type, Server_id, End_log_pos); an Xid event's Info: COMMIT /* xid=N */
    info = {int(r[1]): str(r[5]) for r in shown}
    kinds = []
    for c in canal:
        h = c.header
        kind, server_id, end = events[h.logfileOffset]
        kinds.append(kind)
        assert (h.logfileName, h.serverId, h.eventLength) == (start.journal, server_id,
                                                              end - h.logfileOffset)  # fmt: skip
        assert h.gtid == gtid  # the state including the transaction, as Canal in GTID mode
        assert (h.version, h.serverenCode, h.sourceType) == (1, "UTF-8", pb.MYSQL)
        assert h.executeTime % 1000 == 0 and h.executeTime > 1_600_000_000_000
    assert kinds == ["Gtid", "Write_rows_v1", "Xid"]
    xid = info[canal[2].header.logfileOffset].split("xid=")[1].split()[0]
    assert pb.TransactionEnd.FromString(canal[2].storeValue).transactionId == xid
    assert pb.TransactionBegin.FromString(canal[0].storeValue).threadId == 0  # MariaDB: none
    assert [(p.key, p.value) for p in canal[1].header.props] == [("rowsCount", "4")]
    assert (canal[1].header.schemaName, canal[1].header.tableName) == (DB, "t")
    assert canal[1].header.eventType == pb.INSERT and not canal[0].header.HasField("eventType")


def _snapshot_reads_are_the_inserts(box: Sandbox, insert: Any) -> None:
    """The snapshot's READ rows of ``x`` (as they are now: row 1 updated, row 2 deleted):
    INSERTs marked ``snapshot``, the row the binlog inserted unchanged column for column."""
    with ChunkReader(box.primary.dsn()) as reader:
        shape = reader.shape(DB, "x")
        chunk = reader.read(shape, None, 100)
    at = LogPosition(
        LogIdentity("127.0.0.1:1", 1), EntryPosition(journal="mariadb-bin.000001", offset=4)
    )
    entries = _chunk_entries(shape, chunk.rows, at, 0, "0-1-1")
    begin, read, end = (_decode(data) for data in encode_entries(entries, CST))
    assert [(p.key, p.value) for p in begin[0].header.props] == [("snapshot", "1")]
    assert [(p.key, p.value) for p in read[0].header.props] == [("rowsCount", "2"),
                                                                 ("snapshot", "2")]  # fmt: skip
    assert read[0].header.eventType == pb.INSERT and read[1].eventType == pb.INSERT
    assert [(p.key, p.value) for p in end[0].header.props] == [("snapshot", "3")]
    by_id = {r.afterColumns[0].value: r for r in read[1].rowDatas}
    assert set(by_id) == {"4294967295", "1"}
    assert list(by_id["4294967295"].afterColumns) == list(insert.rowDatas[0].afterColumns)
