"""Entry → row conversion, entry keys, offsets and options of the Spark source (no Spark)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from spark_fixtures import ddl_entry, make_entries

from canal_client.spark import CanalOptions, schema_ddl
from canal_client.spark.rows import FIELDS, Offset, entry_rows
from canal_protocol import Entry
from canal_protocol.errors import ConfigError
from canal_protocol.ordering import MIN_KEY, EntryKey, entry_key

COL = {name: i for i, (name, _) in enumerate(FIELDS)}


def col(name: str, value: Any, key: bool = False, mysql_type: str = "int") -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "is_key": key,
        "updated": True,
        "mysql_type": mysql_type,
        "is_null": value is None,
    }


def rowdata(event: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    entry = make_entries(1, 1)[1]
    entry["header"]["event_type"] = event
    entry["rows"] = rows
    return entry


def at(entry: dict[str, Any], **header: int) -> dict[str, Any]:
    """``entry`` with ``header`` fields set (``part``, ``snapshot``)."""
    return {**entry, "header": {**entry["header"], **header}}


def test_insert_row_has_after_map_key_json_and_position() -> None:
    entry = make_entries(1, 2, first_id=7)[1]
    rows = entry_rows(entry)
    assert len(rows) == 2
    r = rows[1]
    assert r[COL["schema"]] == "t" and r[COL["table"]] == "items"
    assert r[COL["event_type"]] == "INSERT" and r[COL["is_ddl"]] is False
    assert r[COL["before"]] is None
    assert r[COL["after"]] == {"id": "8", "val": "v8"}
    assert r[COL["primary_key"]] == '{"id":"8"}'
    assert (r[COL["logfile"]], r[COL["offset"]], r[COL["row_index"]]) == (
        "mariadb-bin.000001",
        356,
        1,
    )
    assert r[COL["gtid"]] == "0-1-7"
    assert r[COL["commit_ts"]] == datetime.fromtimestamp((1_700_000_000_000 + 356) / 1000, UTC)
    assert len(r) == len(FIELDS)


def test_update_and_delete_take_key_from_the_right_image() -> None:
    before = [col("a", 1, key=True), col("b", 2, key=True), col("c", "x", mysql_type="text")]
    after = [col("a", 1, key=True), col("b", 3, key=True), col("c", None, mysql_type="text")]
    upd = entry_rows(rowdata("UPDATE", [{"before": before, "after": after}]))[0]
    assert upd[COL["before"]] == {"a": "1", "b": "2", "c": "x"}
    assert upd[COL["after"]] == {"a": "1", "b": "3", "c": None}
    assert json.loads(upd[COL["primary_key"]]) == {"a": "1", "b": "3"}
    dele = entry_rows(rowdata("DELETE", [{"before": before, "after": []}]))[0]
    assert dele[COL["after"]] is None
    assert dele[COL["primary_key"]] == '{"a":"1","b":"2"}'


def test_values_become_lossless_text() -> None:
    cols = [
        col("u", 18446744073709551615),
        col("d", "12.3400", mysql_type="decimal(8,4)"),
        col("bin", b"\x00\xff", mysql_type="varbinary(4)"),
        col("f", 1.5, mysql_type="double"),
        col("n", None),
    ]
    r = entry_rows(rowdata("INSERT", [{"before": [], "after": cols}]))[0]
    assert r[COL["after"]] == {
        "u": "18446744073709551615",
        "d": "12.3400",
        "bin": "AP8=",
        "f": "1.5",
        "n": None,
    }
    assert r[COL["primary_key"]] is None  # no key columns


def test_ddl_is_one_row_with_sql() -> None:
    rows = entry_rows(ddl_entry("CREATE TABLE t.x (id int primary key)", 5000))
    assert len(rows) == 1
    r = rows[0]
    assert r[COL["is_ddl"]] is True and r[COL["sql"]].startswith("CREATE TABLE")
    assert r[COL["before"]] is None and r[COL["after"]] is None and r[COL["primary_key"]] is None


def test_transaction_markers_give_no_rows() -> None:
    begin, _, end = make_entries(1, 3)
    assert entry_rows(begin) == [] and entry_rows(end) == []


def test_model_entries_and_wire_dicts_give_the_same_rows() -> None:
    for wire in [*make_entries(2, 3), ddl_entry("DROP TABLE t.y", 9000)]:
        assert entry_rows(Entry.from_wire(wire)) == entry_rows(wire)
        assert entry_key(Entry.from_wire(wire)) == entry_key(wire)


def test_entry_keys_follow_binlog_order_across_files() -> None:
    a = EntryKey.of("mariadb-bin.000009", 99999)
    b = EntryKey.of("mariadb-bin.000010", 4)
    assert MIN_KEY < a < b < EntryKey.of("mariadb-bin.000010", 5)
    assert EntryKey.from_dict(b.to_dict()) == b


def test_offsets_round_trip_through_json() -> None:
    off = Offset(42, EntryKey.of("mariadb-bin.000003", 1234), (7, 8))
    assert Offset.from_dict(json.loads(json.dumps(off.to_dict()))) == off
    assert Offset.from_dict(Offset().to_dict()) == Offset()
    with pytest.raises(ValueError, match="not an offset"):
        Offset.from_dict({"total": 1})


def test_schema_ddl_names_every_field() -> None:
    ddl = schema_ddl()
    assert "`commit_ts` timestamp" in ddl and "`after` map<string,string>" in ddl
    assert ddl.count("`") == 2 * len(FIELDS)


def test_added_columns_come_last_so_every_older_column_keeps_its_place() -> None:
    """``part`` and ``snapshot`` come after every column of the first
    release, in typed mode after ``raw``: code reading rows by position is unaffected."""
    from canal_client.spark.schema import TypedTable, typed_ddl, typed_struct

    first = ["schema", "table", "event_type", "is_ddl", "sql", "gtid", "logfile", "offset",
             "row_index", "server_id", "commit_ts", "before", "after", "primary_key"]  # fmt: skip
    assert [n for n, _ in FIELDS] == [*first, "part", "snapshot"]
    table = TypedTable.from_wire({
        "schema": "t", "table": "items",
        "columns": [{"name": "id", "mysql_type": "int", "is_key": True}],
    })  # fmt: skip
    assert [f.name for f in typed_struct(table).fields] == [*first, "raw", "part", "snapshot"]
    assert typed_ddl(table).endswith("`raw` map<string,string>, `part` int, `snapshot` int")
    row = entry_rows(at(make_entries(1, 1)[1], part=2, snapshot=5))[0]
    assert row[COL["part"]] == 2 and row[COL["snapshot"]] == 5 and row[-2:] == (2, 5)


BASE = {"etcd": "http://127.0.0.1:2379", "destination": "example", "clientId": "1001"}


def test_options_defaults_and_lists() -> None:
    opts = CanalOptions.parse({**BASE, "etcd": "http://a:1, http://b:2", "batchSize": "50"})
    assert opts.etcd == ("http://a:1", "http://b:2") and opts.servers == ()
    assert opts.batch_size == 50 and opts.filter == "" and opts.token is None
    assert opts.poll_timeout_s == 1.0 and not opts.exclusive
    assert (opts.max_batches_per_trigger, opts.max_rows_per_trigger) == (100, 500_000)
    assert (opts.rows_per_partition, opts.rows_per_arrow_batch) == (250_000, 250_000)
    assert CanalOptions.parse({**BASE, "rowsPerArrowBatch": "7"}).rows_per_arrow_batch == 7
    assert CanalOptions.parse({**BASE, "maxRowsPerTrigger": "1000"}).max_rows_per_trigger == 1000
    srv = CanalOptions.parse(
        {"server": "http://127.0.0.1:8000", "destination": "d", "clientId": "c"}
    )
    assert srv.servers == ("http://127.0.0.1:8000",)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"destination": "d", "clientId": "c"}, "etcd"),
        ({**BASE, "server": "http://x:1"}, "etcd"),
        ({**BASE, "destination": " "}, "destination"),
        ({k: v for k, v in BASE.items() if k != "clientId"}, "clientId"),
        ({**BASE, "batchSize": "0"}, "batchSize"),
        ({**BASE, "batchSize": "many"}, "batchSize"),
        ({**BASE, "pollTimeoutMs": "-1"}, "pollTimeoutMs"),
        ({**BASE, "exclusive": "maybe"}, "exclusive"),
        ({**BASE, "maxRowsPerTrigger": "0"}, "maxRowsPerTrigger"),
        ({**BASE, "rowsPerArrowBatch": "0"}, "rowsPerArrowBatch"),
    ],
)
def test_bad_options_are_refused_with_their_name(options: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        CanalOptions.parse(options)
    assert info.value.key == key


def test_snapshot_read_entries_have_distinct_keys_in_stream_order() -> None:
    """READ entries of one chunk share a binlog position: their snapshot ordinal orders
    them (a ledger that kept only keys after its top would drop all but the first)."""
    entry = rowdata("READ", [{"before": [], "after": [col("id", 5, key=True)]}])
    entry["header"]["snapshot"] = 2
    first = {**entry, "header": {**entry["header"], "snapshot": 1}}
    rows = entry_rows(entry)
    assert rows[0][COL["event_type"]] == "READ" and rows[0][COL["after"]] == {"id": "5"}
    assert (rows[0][COL["snapshot"]], rows[0][COL["part"]]) == (2, 0)  # tells chunks apart
    assert rows[0][COL["primary_key"]] == '{"id":"5"}'
    k1, k2 = entry_key(first), entry_key(entry)
    assert k1 < k2 and (k1.file, k1.pos) == (k2.file, k2.pos)
    assert EntryKey.from_dict(k2.to_dict()) == k2 and f"{k2.pos}+r2" in str(k2)
    binlog = entry_key({"header": {**entry["header"], "snapshot": 0}})
    assert binlog < k1 and "snap" not in binlog.to_dict()


def test_arrow_rows_equal_entry_rows_for_every_value_form() -> None:
    """The executors' Arrow decoding (map mode) gives exactly ``entry_rows``' rows."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from spark_fixtures import arrow_rows

    from canal_client.packed import PackedBatch
    from canal_client.spark.arrow import record_batch
    from canal_client.spark.schema import generic_struct
    from canal_protocol import Batch

    def image(*values: Any) -> list[dict[str, Any]]:
        kinds = [
            ("k", "varchar(20)", True), ("b", "varbinary(4)", True),
            ("u", "bigint unsigned", False), ("f", "double", False), ("t", "text", False),
            ("y", "year", False),
        ]  # fmt: skip
        return [col(n, v, key, t) for (n, t, key), v in zip(kinds, values, strict=True)]

    odd = ['a"b\\c', b"\x00\xff", 18446744073709551615, 1e20, "héllo\n😀", 2155]
    plain = ["x", b"", 0, -0.5, None, 0]
    entries = [
        rowdata("INSERT", [{"before": [], "after": image(*odd)}]),
        rowdata("INSERT", [{"before": [], "after": image(*plain)}]),
        rowdata("UPDATE", [{"before": image(*plain), "after": image(*odd)}]),
        rowdata("DELETE", [{"before": image(*odd), "after": []}]),
        rowdata("INSERT", [{"before": [], "after": image(None, None, None, None, None, None)}]),
        ddl_entry("ALTER TABLE t.items ADD c int", 9000),
        *make_entries(2, 3),
        # the first table map again (its values gathered with the first rows'), two rows
        rowdata(
            "INSERT", [{"before": [], "after": image(*plain)}, {"before": [], "after": image(*odd)}]
        ),
        # inside a MySQL 8 compressed transaction, and a snapshot chunk's READ rows
        at(rowdata("INSERT", [{"before": [], "after": image(*odd)}]), part=3),
        at(rowdata("READ", [{"before": [], "after": image(*plain)}]), snapshot=4),
    ]
    packed = PackedBatch.of(Batch(1, [Entry.from_wire(e) for e in entries]))
    data = b"".join(e.data for e in packed.entries)
    schema = to_arrow_schema(generic_struct(), timezone="UTC")
    got = arrow_rows([record_batch(data, len(packed.entries), schema)])
    assert got == [row for e in entries for row in entry_rows(e)]
    assert [(r[COL["part"]], r[COL["snapshot"]]) for r in got[-2:]] == [(3, 0), (0, 4)]
    assert json.loads(got[0][COL["primary_key"]]) == {"k": 'a"b\\c', "b": "AP8="}


def test_a_partition_in_arrow_batches_of_whole_entries_gives_the_same_rows() -> None:
    """``record_batches`` cuts a partition after the entry that fills ``max_rows``: the
    rows, in order, are ``record_batch``'s; entries without rows give no batch."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from spark_fixtures import arrow_rows

    from canal_client.packed import PackedBatch
    from canal_client.spark.arrow import record_batch, record_batches
    from canal_client.spark.schema import generic_struct
    from canal_protocol import Batch

    entries = [*make_entries(4, 3), ddl_entry("ALTER TABLE t.items ADD c int", 9000)]
    packed = PackedBatch.of(Batch(1, [Entry.from_wire(e) for e in entries]))
    data, count = b"".join(e.data for e in packed.entries), len(packed.entries)
    schema = to_arrow_schema(generic_struct(), timezone="UTC")
    whole = arrow_rows([record_batch(data, count, schema)])
    assert len(whole) == 13
    pieces = list(record_batches(data, count, schema, max_rows=5))
    assert [b.num_rows for b in pieces] == [6, 6, 1]  # whole entries of 3 rows, then DDL
    assert arrow_rows(pieces) == whole
    assert [b.num_rows for b in record_batches(data, count, schema)] == [13]
    assert list(record_batches(b"", 0, schema)) == []


def test_keys_of_two_databases_compare_by_gtid_and_place() -> None:
    primary = EntryKey.of("mariadb-bin.000009", 5000, source="db1:3306", gtid="0-1-41", sub=2)
    replica = EntryKey.of("mariadb-bin.000001", 300, source="db2:3306", gtid="0-2-42", sub=0)
    assert primary < replica and replica > primary  # binlog order would say the opposite
    same_tx = EntryKey.of("mariadb-bin.000001", 200, source="db2:3306", gtid="0-1-41", sub=3)
    assert primary < same_tx and EntryKey.of("x.000001", 1, source="db2:3306", gtid="0-1-41",
                                             sub=1) < primary  # fmt: skip
    unknown = EntryKey.of("mariadb-bin.000001", 100, source="db2:3306", gtid="0-1-41")
    assert unknown > primary  # an unknown place: kept rather than lost
    other_domain = EntryKey.of("mariadb-bin.000001", 1, source="db2:3306", gtid="1-2-99", sub=0)
    assert other_domain < primary  # no common domain: binlog order
    assert EntryKey.of("mariadb-bin.000010", 4, source="db1:3306", gtid="0-1-1") > primary
    off = Offset(3, primary, (1,))
    assert Offset.from_dict(json.loads(json.dumps(off.to_dict()))) == off


def test_the_ledger_places_entries_in_their_transaction() -> None:
    from canal_client.packed import PackedBatch
    from canal_client.spark import Ledger
    from canal_protocol import Batch

    entries = make_entries(2, 1)  # BEGIN, ROWDATA, END twice
    packed = PackedBatch.of(Batch(1, [Entry.from_wire(e) for e in entries])).entries
    ledger = Ledger()
    assert ledger.add(1, packed, source="db:1") == 6
    assert [it.key.sub for it in ledger.items] == [0, 1, 2, 0, 1, 2]
    assert ledger.add(2, packed[1:], source="db:1") == 0  # delivered again, mid-transaction
    assert ledger.prev is not None and ledger.prev.sub == 2  # placed by the held entries
    fresh = Ledger()
    fresh.reset(ledger.items[1].key, exact=True)  # the cursor is right after entry 1
    fresh.add(3, packed[2:], source="db:1")
    assert [it.key.sub for it in fresh.items] == [2, 0, 1, 2]
    unknown = Ledger()
    unknown.reset(ledger.items[0].key)  # the cursor is somewhere before: not placed
    unknown.add(4, packed[1:], source="db:1")
    assert [it.key.sub for it in unknown.items] == [-1, -1, 0, 1, 2]


def _read_chunk(pos: int, first: int) -> list[dict[str, Any]]:
    """A snapshot chunk (BEGIN, one READ ROWDATA, END) put at ``pos``, ordinals from
    ``first``: the entries share the binlog position and carry no GTID."""
    chunk = make_entries(1, 2, first_id=100 + first, start=pos)
    for n, e in enumerate(chunk):
        e["header"].update(
            offset=pos, end_offset=pos, gtid="", event_type="READ", snapshot=first + n
        )
    return chunk


def test_the_ledger_keeps_snapshot_entries_at_one_position_once_each() -> None:
    """READ entries sit between binlog events at one position: the ledger keeps each
    once in order, drops them when delivered again, and a floor inside a chunk keeps
    only the entries after it (the cursor stops before a position's snapshot entries)."""
    from canal_client.packed import PackedBatch
    from canal_client.spark import Ledger, batch_end
    from canal_protocol import Batch

    before, after = make_entries(1, 1, start=256), make_entries(1, 1, first_id=5, start=900)
    wire = [*before, *_read_chunk(800, 1), *_read_chunk(800, 4), *after]
    batch = Batch(1, [Entry.from_wire(e) for e in wire])
    packed = PackedBatch.of(batch).entries
    ledger = Ledger()
    assert ledger.add(1, packed, source="db:1") == 12
    keys = [it.key for it in ledger.items]
    assert keys == sorted(keys) and len(set(keys)) == 12
    assert [k.snap for k in keys] == [0, 0, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0]
    assert ledger.add(2, packed[3:9], source="db:1") == 0  # delivered again
    replay = Ledger()
    replay.reset(keys[4])  # committed through the first READ ROWDATA entry
    assert replay.add(3, packed, source="db:1") == 7
    assert [it.key.snap for it in replay.items] == [3, 4, 5, 6, 0, 0, 0]
    end = batch_end(PackedBatch.of(Batch(2, [Entry.from_wire(e) for e in wire[:9]])))
    assert end.snap == 6 and keys[8] <= end < keys[9]


def test_the_ledger_keeps_every_entry_of_a_compressed_transaction(tmp_path: Any) -> None:
    """MySQL 8's compressed transaction: BEGIN, rows and END all start at its payload
    event (274); their ``part`` orders them. The ledger keeps the three once each (it kept
    only the BEGIN), a replay from a floor after the BEGIN keeps the rest, and a batch
    that ends inside the transaction reaches no further than its last entry."""
    from mysql_fixtures import Run

    from canal_client.packed import PackedBatch
    from canal_client.spark import Ledger, batch_end
    from canal_protocol import Batch

    name = "rmc__transaction_compression.000001"
    entries = Run(tmp_path, [name]).until((name, 431))
    packed = PackedBatch.of(Batch(1, entries)).entries
    ledger = Ledger()
    assert ledger.add(1, packed, source="db:1") == 3
    keys = [it.key for it in ledger.items]
    assert [(k.pos, k.part) for k in keys] == [(274, 1), (274, 3), (274, 4)]
    assert keys == sorted(keys) and not keys[0].same_event(keys[1])
    assert EntryKey.from_dict(keys[1].to_dict()) == keys[1] and "274#3" in str(keys[1])
    assert ledger.add(2, packed[1:], source="db:1") == 0  # delivered again
    replay = Ledger()
    replay.reset(keys[0])  # committed through the BEGIN
    assert replay.add(3, packed, source="db:1") == 2
    head = batch_end(PackedBatch.of(Batch(2, entries[:2])))
    assert keys[1] <= head < keys[2]
    assert [r[COL["after"]] for r in entry_rows(entries[1])] == [{"id": "1"}]
    assert [(r[COL["offset"]], r[COL["part"]]) for r in entry_rows(entries[1])] == [(274, 3)]


def test_typed_primary_keys_equal_the_map_modes() -> None:
    """Typed mode builds ``primary_key`` with Arrow over the whole partition: the same
    text as map mode (``entry_rows``), for a DELETE (its before image), NULL, binary and
    escaped values, DDL (null), and a key that changes inside the partition."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from canal_client.packed import PackedBatch
    from canal_client.spark.arrow import record_batch
    from canal_client.spark.schema import TypedTable, typed_struct
    from canal_protocol import Batch

    kinds = [("k", "varchar(20)"), ("b", "varbinary(4)"), ("u", "bigint unsigned"), ("t", "text")]

    def image(*values: Any, keys: str = "kb") -> list[dict[str, Any]]:
        return [col(n, v, n in keys, t) for (n, t), v in zip(kinds, values, strict=True)]

    odd = ['a"b\\c', b"\x00\xff", 18446744073709551615, "héllo\n😀"]
    plain = ["x", b"", 0, None]
    entries = [
        rowdata("INSERT", [{"before": [], "after": image(*odd)}]),
        rowdata("UPDATE", [{"before": image(*plain), "after": image(*odd)}]),
        rowdata("DELETE", [{"before": image(*odd), "after": []}]),
        rowdata("INSERT", [{"before": [], "after": image(None, None, 1, "n")}]),
        ddl_entry("ALTER TABLE t.items ADD PRIMARY KEY (u)", 9000),
        rowdata("DELETE", [{"before": image(*plain, keys="u"), "after": []}]),
        rowdata("UPDATE", [{"before": image(*plain, keys="u"), "after": image(*odd, keys="u")}]),
    ]
    columns = [{"name": n, "mysql_type": t, "is_key": n in "kb"} for n, t in kinds]
    wire = {"schema": "t", "table": "items", "columns": columns}
    table = TypedTable.from_wire(wire)
    packed = PackedBatch.of(Batch(1, [Entry.from_wire(e) for e in entries]))
    data = b"".join(e.data for e in packed.entries)
    schema = to_arrow_schema(typed_struct(table), timezone="UTC")
    got = record_batch(data, len(packed.entries), schema, table).column("primary_key")
    want = [row[COL["primary_key"]] for e in entries for row in entry_rows(e)]
    assert got.to_pylist() == want
    assert want[2] == '{"k":"a\\"b\\\\c","b":"AP8="}' and want[4] is None
    assert want[5] == '{"u":"0"}' and want[6] == '{"u":"18446744073709551615"}'
