"""MySQL's own binlog bytes (tests/fixtures/mysql, see NOTICE) through the local binlog
reader: the EventDecoder, the TransactionAssembler and the RowsDecoder of the network path.

Expected values are what the files hold, as MySQL wrote them (what ``mysqlbinlog -v``
prints for them), checked against the CREATE TABLE statements in the same files; the
source projects' tests only count events for these files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mysql_fixtures import FIXTURES, Run, rows, wait_for

from canal_protocol.entry import Entry, EntryType
from canal_protocol.errors import BinlogConfigError
from canal_protocol.gtid import GtidSet
from canal_protocol.positions import EntryPosition
from canal_server.parse.local_reader import LocalBinlogDir

A = "0123456789" * 12 + "012345678"  # 129 characters


def test_enum_and_set_values_with_full_metadata(tmp_path: Path) -> None:
    name = "rmc__mysql-enum-string-set.000001"
    entries = Run(tmp_path, [name]).until((name, 3331))
    first = {"f1": "0123456789" * 10, "f2": A * 2 + "0123456789" * 4, "f3": "var1",
             "f4": "one,three", "f5": "0123456789"}  # fmt: skip
    second = {"f1": "field1", "f2": "field_2", "f3": "variant2", "f4": "two,four",
              "f5": A * 2 + "0123456789" * 4}  # fmt: skip
    assert list(rows(entries)) == [
        ("t", "INSERT", (None, first)),
        ("t", "UPDATE", (first, second)),
        ("t", "DELETE", (second, None)),
    ]


def test_mysql_transactions_gtids_and_positions(tmp_path: Path) -> None:
    name = "rmc__mysql-enum-string-set.000001"
    entries = Run(tmp_path, [name]).until((name, 3331))
    uuid = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
    kinds = [(e.type.value, e.header.gtid, e.header.offset, e.header.end_offset) for e in entries]
    assert kinds == [
        ("ROWDATA", f"{uuid}:1", 236, 493),  # ALTER USER: a statement of its own
        ("ROWDATA", f"{uuid}:2", 572, 791),  # CREATE TABLE
        ("TRANSACTIONBEGIN", f"{uuid}:3", 870, 946),  # BEGIN (after the GTID event)
        ("ROWDATA", f"{uuid}:3", 1077, 1529),
        ("TRANSACTIONEND", f"{uuid}:3", 1529, 1560),  # XID
        ("TRANSACTIONBEGIN", f"{uuid}:4", 1639, 1724),
        ("ROWDATA", f"{uuid}:4", 1855, 2628),
        ("TRANSACTIONEND", f"{uuid}:4", 2628, 2659),
        ("TRANSACTIONBEGIN", f"{uuid}:5", 2738, 2814),
        ("ROWDATA", f"{uuid}:5", 2945, 3300),
        ("TRANSACTIONEND", f"{uuid}:5", 3300, 3331),
    ]
    assert [e.is_ddl for e in entries[:2]] == [True, True]
    assert entries[1].header.event_type.value == "CREATE"
    assert GtidSet.parse(entries[-1].gtid_state) == GtidSet.parse(f"{uuid}:1-5")
    assert entries[-1].position().offset == 3331


def test_invisible_columns_unsigned_and_bit(tmp_path: Path) -> None:
    a, b = "rmc__binlog-invisible-columns.000001", "rmc__mysql_type_bit.000001"
    entries = Run(tmp_path, [a, b]).until((b, 970 + 31))
    old = {"f1": None, "f2": None, "f3": -33, "f4": "44", "f5": b"U", "f6": None}
    assert list(rows(entries)) == [
        (
            "t1",
            "INSERT",
            (None, {"f1": 1, "f2": 2, "f3": -3, "f4": "4", "f5": b"\x05", "f6": 6000000000}),
        ),
        ("t1", "INSERT", (None, old)),
        ("t1", "UPDATE", (old, {**old, "f1": 111, "f2": 222, "f3": -333, "f4": "444"})),
        ("foo", "INSERT", (None, {"a": 4, "b": "foo", "c": 32})),  # BIT(3) b'100', BIT(6)
    ]
    mysql_types = [c.mysql_type for c in entries[-2].rows[0].after or ()]
    assert mysql_types[0] == "bit(3)"


def test_compressed_transaction_payload(tmp_path: Path) -> None:
    """MySQL 8.0.32, binlog_transaction_compression=ON: one TRANSACTION_PAYLOAD (zstd)
    holds BEGIN, the table map, the write and the XID; every entry points at it."""
    name = "rmc__transaction_compression.000001"
    entries = Run(tmp_path, [name]).until((name, 431))
    assert list(rows(entries)) == [("tb1", "INSERT", (None, {"id": 1}))]
    spans = {(e.header.offset, e.header.end_offset) for e in entries}
    assert spans == {(274, 431)}
    assert [e.type.value for e in entries] == ["TRANSACTIONBEGIN", "ROWDATA", "TRANSACTIONEND"]
    assert entries[0].header.gtid == ""  # an anonymous GTID (gtid_mode OFF)
    assert GtidSet.parse(entries[-1].gtid_state) == GtidSet.parse(
        "357df524-4139-11ee-9979-b033ee13919e:1"
    )  # the file's PREVIOUS_GTIDS


def test_entries_of_a_compressed_transaction_have_distinct_ordered_positions(
    tmp_path: Path,
) -> None:
    """The payload's events are numbered (BEGIN 1, table map 2, rows 3, XID 4): the
    entries inside it are at the payload's start with their part, its END at its end
    (a boundary, part 0); every position differs and they are in order, on the wire
    too (what a cursor and the store compare)."""
    name = "rmc__transaction_compression.000001"
    entries = Run(tmp_path, [name]).until((name, 431))
    assert [e.header.part for e in entries] == [1, 3, 4]
    positions = [e.position() for e in entries]
    assert [(p.offset, p.part) for p in positions] == [(274, 1), (274, 3), (431, 0)]
    assert sorted(positions) == positions and len(set(positions)) == 3
    wire = [Entry.from_wire(e.to_wire()).position() for e in entries]
    assert [(p.offset, p.part) for p in wire] == [(274, 1), (274, 3), (431, 0)]
    assert EntryPosition.from_dict(positions[1].to_dict()) == positions[1]
    old = positions[1].to_dict()
    assert old.pop("part") == 3  # a position written before parts existed reads as 0
    assert EntryPosition.from_dict(old).part == 0
    assert "part" not in positions[2].to_dict()
    assert entries[0].header.to_wire()["part"] == 1


def test_mysql57_without_names_uses_the_schema_and_the_binlog_ddl(tmp_path: Path) -> None:
    """MySQL 5.7.40: `a`.`b` from the schema file, `a`.`emoji` from the CREATE TABLE
    earlier in the same binlog (utf8mb4 text)."""
    name = "ape__mysql-bin.000080"
    entries = Run(tmp_path, [name]).until((name, 2454))
    assert list(rows(entries)) == [
        ("b", "DELETE", ({"id": 12}, None)),
        ("b", "DELETE", ({"id": 12}, None)),
        ("b", "DELETE", ({"id": 12}, None)),
        ("b", "DELETE", ({"id": 12}, None)),
        ("b", "INSERT", (None, {"id": 12})),
        ("b", "INSERT", (None, {"id": 12})),
        ("emoji", "INSERT", (None, {"id": 2, "value": ""})),
    ]
    ddl = [(e.header.event_type.value, e.header.table) for e in entries if e.is_ddl]
    assert ddl == [("CREATE", "aaa"), ("CREATE", "bbba"), ("ERASE", "bbba"), ("ERASE", "aaa"),
                   ("CREATE", "emoji")]  # fmt: skip


def test_mysql57_alter_table_is_followed(tmp_path: Path) -> None:
    """Canal's TSDB fixture (5.7.19): columns added and dropped between rows."""
    name = "canal__tsdb_mysql-bin.000003"
    entries = Run(tmp_path, [name]).until((name, 14377))
    wanshao = [r for r in rows(entries) if r[0] == "wanshao_test"]
    after = [r[2][1] for r in wanshao]
    assert after[0] == {"id": 35, "name": "helol", "age": 123, "col2": 123}
    assert after[1] == {"id": 36, "name": "hel33ol", "age": 123, "col2": 124, "col1": None}
    assert after[2] == {"id": 37, "name": "more2", "age": 123, "col2": 123, "col1": 555,
                        "col3": 666}  # fmt: skip
    assert after[5] == {"id": 40, "name": "more2", "age": 111, "col2": 222, "col1": 555}
    assert [a["id"] for a in after] == list(range(35, 53))
    meta = [r for r in rows(entries) if r[0] == "canal_table_meta_history"]
    first = meta[0][2][1]
    assert first["id"] == 1 and first["gmt_create"] == "2017-09-19T20:12:21"
    second = meta[1][2][1]
    assert second["binlog_file"] == "001115" and second["binlog_offest"] == 139177334
    assert second["binlog_timestamp"] == 1501660815000 and second["use_schema"] == "tddl5_00"
    assert (
        len(meta) == 2
        and len([r for r in rows(entries) if r[0] == "canal_table_meta_snapshot"]) == 1
    )


def test_table_without_names_or_schema_is_refused(tmp_path: Path) -> None:
    """MySQL 8.0.31 with MINIMAL metadata, a table whose DDL nobody gave: refused, with
    the reason and what to do, before any of its rows is delivered."""
    name = "ape__mysql-bin.000057"
    run = Run(tmp_path, [name])
    with pytest.raises(BinlogConfigError, match=r"a\.test_table_3: the binlog carries no column"):
        run.until((name, 1283))
    assert [r[0] for r in rows(run.entries)] == ["b"]  # the table before it was delivered


def test_unknown_event_type_is_skipped(tmp_path: Path) -> None:
    """Aurora 5.7.12 writes an event of type 100 that MySQL does not know: skipped,
    and the events after it are read."""
    name = "osh__mysql-bin.aurora-padding"
    shutil.copy(FIXTURES / name, tmp_path / name)
    directory = LocalBinlogDir(tmp_path)
    seen = [(at, type(ev).__name__, ev.event_type) for at, ev in
            directory.events(name, 4, directory.decoder())]  # fmt: skip
    assert seen[2:] == [(216, "AnonymousGtidEvent", 34), (281, "SkippedEvent", 100),
                        (1209, "QueryEvent", 2)]  # fmt: skip


def test_resume_from_a_position_inside_the_files(tmp_path: Path) -> None:
    """A start after the first transaction: the schema is rebuilt from the DDL before it
    and the GTID state is the file's PREVIOUS_GTIDS plus the GTIDs before the start."""
    name = "rmc__mysql-enum-string-set.000001"
    run = Run(tmp_path, [name])
    run.first = EntryPosition(name, 1560)
    entries = run.until((name, 3331))
    assert [r[1] for r in rows(entries)] == ["UPDATE", "DELETE"]
    uuid = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
    assert entries[0].type is EntryType.TRANSACTIONBEGIN
    assert entries[0].gtid_state == f"{uuid}:1-3"  # inside its transaction: the state before
    end = next(e for e in entries if e.type is EntryType.TRANSACTIONEND)
    assert end.gtid_state == f"{uuid}:1-4"


def test_partial_json_update_is_refused_with_the_reason(tmp_path: Path) -> None:
    """MySQL 8.0.22 with binlog_row_value_options=PARTIAL_JSON: the rows before it are
    delivered (names from the CREATE TABLE in the file), the partial update is refused."""
    name = "rmc__json.binlog.000001"
    run = Run(tmp_path, [name])
    with pytest.raises(BinlogConfigError, match="PARTIAL_UPDATE_ROWS_EVENT"):
        run.until((name, 4011))
    kinds = [(r[0], r[1]) for r in rows(run.entries)]
    inserts = kinds.count(("t", "INSERT"))
    assert inserts >= 4 and kinds == [("t", "INSERT")] * inserts + [("t", "UPDATE")] * (
        len(kinds) - inserts
    )  # the full UPDATE before the partial one is delivered
    first = next(rows(run.entries))[2][1]
    assert first["id"] == 1 and first["name"] == "Joe" and first["age"] == 24


@pytest.mark.parametrize(
    ("name", "data_end", "size"),
    [
        ("rmc__transaction_compression.000001", 431, 475),  # ends with a ROTATE
        ("rmc__binlog-invisible-columns.000001", 1787, 1810),  # ends with a STOP
    ],
)
def test_binlog_end_is_after_the_last_transaction_once_the_reader_read_all(
    tmp_path: Path, name: str, data_end: int, size: int
) -> None:
    """``/v1/health``'s binlog end of a ``local.dir`` destination: the newest file's size
    while the reader has not read it all; once it has, and nothing after its last
    transaction carries data (a ROTATE, a STOP), the reader's position. A Spark
    availableNow run waits for the binlog end: an end after the trailing ROTATE was
    never reached (the run waited ``availableNowStallS``)."""
    run = Run(tmp_path, [name])
    assert (tmp_path / name).stat().st_size == size
    before = run.reader.binlog_end()
    assert before is not None and (before["journal"], before["offset"]) == (name, size)
    thread = run.start(run.first)
    try:
        wait_for(lambda: (run.reader.binlog_end() or {}).get("offset") == data_end)
        last = run.reader.last_position
        assert last is not None and (last.journal, last.offset) == (name, data_end)
        end = run.reader.binlog_end()
        assert end is not None and end["journal"] == name and end["gtid"] == last.gtid
        with (tmp_path / name).open("ab") as f:  # more bytes (no whole event yet)
            f.write(b"\0" * 7)
        assert (run.reader.binlog_end() or {}).get("offset") == size + 7
    finally:
        run.reader.stop()
        thread.join(10)
    assert run.error is None
