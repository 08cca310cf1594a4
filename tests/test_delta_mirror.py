"""The Delta mirror's logic on hand-made micro-batches of the typed stream, with real
Delta tables (deltalake) in a temp dir, read back with deltalake and with DuckDB alone:
the latest change per key, delete-then-insert, an update of a key column, TRUNCATE /
DROP / RENAME, replayed batches (also after a crash between two tables' commits), every
type, the schema evolution rules, and the MERGE touching only the files of the changed
keys. No Spark here (tests/test_spark_delta.py runs the sink in real streams)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta_fixtures import by_key, delta_rows, duckdb_rows, typed_batch
from deltalake import DeltaTable

from canal_client.spark.delta import Applied, DeltaMirror, plan_changes
from canal_protocol.errors import ConfigError, IncompatibleChange

APP = "canal-ha-mirror:test-query"
ORDERS = pa.struct([("id", pa.int32()), ("qty", pa.int32()), ("note", pa.string())])


def order(i: int, qty: int = 1, note: str | None = "n") -> dict[str, Any]:
    return {"id": i, "qty": qty, "note": note}


def ins(row: dict[str, Any]) -> tuple[Any, ...]:
    return ("INSERT", None, row)


def upd(old: dict[str, Any], new: dict[str, Any]) -> tuple[Any, ...]:
    return ("UPDATE", old, new)


def dele(row: dict[str, Any]) -> tuple[Any, ...]:
    return ("DELETE", row, None)


def mirror(tmp_path: Path, **kw: Any) -> DeltaMirror:
    return DeltaMirror(tmp_path / "lake", report=lambda applied: None, **kw)


def rows_of(sink: DeltaMirror, table: str = "shop.orders") -> list[dict[str, Any]]:
    """The table read by deltalake and by DuckDB alone: the same rows, sorted by id."""
    path = sink.root + "/" + table
    a = sorted(delta_rows(path), key=lambda r: tuple(map(str, r.values())))
    b = sorted(duckdb_rows(path), key=lambda r: tuple(map(str, r.values())))
    assert _norm(a) == _norm(b)
    return a


def _norm(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:  # DuckDB gives a TIMESTAMP WITH TIME ZONE in its own tz object
        out.append({k: v.astimezone(UTC) if isinstance(v, datetime) and v.tzinfo else v
                    for k, v in r.items()})  # fmt: skip
    return out


def test_latest_change_per_key_wins_and_snapshot_reads_upsert(tmp_path: Path) -> None:
    sink = mirror(tmp_path)
    sink.apply(typed_batch(ORDERS, [ins(order(1)), ins(order(2)), ins(order(3))]), 0, APP)
    batch = typed_batch(ORDERS, [
        upd(order(1), order(1, 2)), upd(order(1, 2), order(1, 3, "last")),
        dele(order(2)), ins(order(4)), dele(order(4)),  # a key the mirror never had
        ("READ", None, order(5, 5, "snap")), ("READ", None, order(3, 9, None)),
    ])  # fmt: skip
    plan = plan_changes(batch)[0]
    assert plan.keys == ("id",) and plan.rows == 7
    assert sorted(plan.deletes.column("id").to_pylist()) == [2, 4]
    (applied,) = sink.apply(batch, 1, APP)
    assert (applied.upserts, applied.deletes, applied.skipped) == (3, 2, False)
    assert rows_of(sink) == [order(1, 3, "last"), order(3, 9, None), order(5, 5, "snap")]


def test_delete_then_insert_of_one_key_in_one_batch(tmp_path: Path) -> None:
    sink = mirror(tmp_path)
    sink.apply(typed_batch(ORDERS, [ins(order(1, 1, "old"))]), 0, APP)
    batch = typed_batch(ORDERS, [dele(order(1, 1, "old")), ins(order(1, 7, "new"))])
    sink.apply(batch, 1, APP)
    assert rows_of(sink) == [order(1, 7, "new")]
    # and the reverse: inserted then deleted within the batch leaves nothing
    sink.apply(
        typed_batch(ORDERS, [ins(order(2)), dele(order(2)), dele(order(1, 7, "new"))]), 2, APP
    )
    assert rows_of(sink) == []


def test_an_update_of_the_key_moves_the_row(tmp_path: Path) -> None:
    image = pa.struct([("cid", pa.string()), ("region", pa.int32()), ("name", pa.string())])
    keys = ("cid", "region")
    sink = mirror(tmp_path)

    def c(cid: str, region: int, name: str) -> dict[str, Any]:
        return {"cid": cid, "region": region, "name": name}

    first = [ins(c("a", 1, "x")), ins(c("b", 1, "y"))]
    sink.apply(typed_batch(image, first, keys), 0, APP)
    moves = [
        upd(c("a", 1, "x"), c("a", 2, "x")),  # one key column changes
        upd(c("b", 1, "y"), c("a", 1, "y")),  # b moves onto a's old key, in the same batch
        upd(c("a", 2, "x"), c("z", 9, "x2")),  # and a moves on again
    ]
    sink.apply(typed_batch(image, moves, keys), 1, APP)
    got = rows_of(sink)
    assert by_key(got, keys) == {("a", 1): c("a", 1, "y"), ("z", 9): c("z", 9, "x2")}


def test_truncate_drop_and_rename_empty_the_table(tmp_path: Path) -> None:
    sink = mirror(tmp_path)
    sink.apply(typed_batch(ORDERS, [ins(order(i)) for i in range(1, 6)]), 0, APP)
    batch = typed_batch(ORDERS, [
        ins(order(10)), ("TRUNCATE", "TRUNCATE TABLE shop.orders"), ins(order(11)),
        upd(order(11), order(11, 2)), dele(order(3)),
    ])  # fmt: skip
    (applied,) = sink.apply(batch, 1, APP)
    assert applied.emptied == "TRUNCATE" and rows_of(sink) == [order(11, 2)]
    for n, (kind, sql) in enumerate([
        ("ERASE", "DROP TABLE shop.orders"),
        ("RENAME", "RENAME TABLE shop.orders TO shop.old_orders"),
        ("ALTER", "ALTER TABLE shop.orders RENAME TO shop.o2"),
        ("ALTER", "alter table `orders` rename as o3"),
    ]):  # fmt: skip
        sink.apply(
            typed_batch(ORDERS, [ins(order(1)), (kind, sql), ins(order(20 + n))]), 2 + n, APP
        )
        assert rows_of(sink) == [order(20 + n)], sql
    # an ALTER that renames a column (or changes nothing of the rows) empties nothing
    for n, sql in enumerate(("ALTER TABLE shop.orders RENAME COLUMN note TO memo",
                             "ALTER TABLE shop.orders ADD INDEX qty (qty)")):  # fmt: skip
        sink.apply(typed_batch(ORDERS, [ins(order(30)), ("ALTER", sql)]), 10 + 2 * n, APP)
        assert [r["id"] for r in rows_of(sink)] == [23, 30]
        sink.apply(typed_batch(ORDERS, [dele(order(30))]), 11 + 2 * n, APP)


def test_a_replayed_batch_changes_nothing(tmp_path: Path) -> None:
    sink = mirror(tmp_path)
    sink.apply(typed_batch(ORDERS, [ins(order(1))]), 0, APP)
    sink.apply(typed_batch(ORDERS, [upd(order(1), order(1, 2)), ins(order(2))]), 1, APP)
    path = sink.root + "/shop.orders"
    version = DeltaTable(path).version()
    assert DeltaTable(path).transaction_version(APP) == 1
    # Spark replays batch 1 (or an older one): whatever it holds, the log has it already
    for batch_id in (1, 0):
        (applied,) = sink.apply(typed_batch(ORDERS, [dele(order(1))]), batch_id, APP)
        assert applied.skipped and "already in the Delta table" in str(applied)
    assert DeltaTable(path).version() == version
    assert rows_of(sink) == [order(1, 2), order(2)]
    # another query (app id) is not fooled by this one's versions; a fresh sink object
    # (a restarted driver) reads the versions from the log
    other = mirror(tmp_path)
    (applied,) = other.apply(typed_batch(ORDERS, [ins(order(3))]), 1, "canal-ha-mirror:other")
    assert not applied.skipped and len(rows_of(sink)) == 3
    (applied,) = other.apply(typed_batch(ORDERS, [ins(order(4))]), 1, APP)
    assert applied.skipped


def test_a_crash_between_two_tables_commits_ends_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = mirror(tmp_path)
    both = typed_batch(ORDERS, [
        ("shop", "a", "INSERT", None, order(1)), ("shop", "b", "INSERT", None, order(1)),
        ("shop", "a", "INSERT", None, order(2)),
    ])  # fmt: skip
    real = DeltaMirror._apply
    calls: list[str] = []

    def crash_on_b(self: DeltaMirror, plan: Any, *args: Any) -> Applied:
        calls.append(plan.name)
        if plan.name == "shop.b":
            raise RuntimeError("driver died")
        return real(self, plan, *args)

    monkeypatch.setattr(DeltaMirror, "_apply", crash_on_b)
    with pytest.raises(RuntimeError, match="driver died"):
        sink.apply(both, 0, APP)
    monkeypatch.setattr(DeltaMirror, "_apply", real)
    assert calls == ["shop.a", "shop.b"] and len(rows_of(sink, "shop.a")) == 2
    done = {a.table: a for a in mirror(tmp_path).apply(both, 0, APP)}  # the replay
    assert done["shop.a"].skipped and not done["shop.b"].skipped
    assert rows_of(sink, "shop.b") == [order(1)]
    assert DeltaTable(sink.root + "/shop.a").version() == 0  # written once


EVERY = pa.struct([
    ("id", pa.decimal128(20, 0)), ("ti", pa.int8()), ("si", pa.int16()), ("i", pa.int32()),
    ("bi", pa.int64()), ("d", pa.decimal128(30, 10)), ("dw", pa.string()), ("f", pa.float32()),
    ("dbl", pa.float64()), ("dt", pa.date32()), ("tm", pa.duration("us")),
    ("dtm", pa.timestamp("us")), ("ts", pa.timestamp("us", tz="UTC")), ("vc", pa.string()),
    ("b", pa.binary()), ("e", pa.string()), ("s", pa.list_(pa.string())), ("j", pa.string()),
])  # fmt: skip


def test_every_type_is_exact_in_the_mirror(tmp_path: Path) -> None:
    full = {
        "id": Decimal(2**64 - 1), "ti": -128, "si": 32767, "i": -(2**31), "bi": 2**63 - 1,
        "d": Decimal("-12345678901234567890.0123456789"),
        "dw": "-99999999999999999999999999999999999.999999999999999999999999999999",
        "f": 1.5, "dbl": -1.7976931348623157e308, "dt": date(9999, 12, 31),
        "tm": -timedelta(hours=838, minutes=59, seconds=59),
        "dtm": datetime(2024, 2, 29, 12, 34, 56, 789012),
        "ts": datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC), "vc": "héllo 😀 'q'",
        "b": b"\x00\xff\x00", "e": "c", "s": ["x", "z"], "j": '{"a": [1, 2.5], "b": null}',
    }  # fmt: skip
    empty = {k: None for k in full} | {"id": Decimal(0), "s": [], "b": b"", "vc": ""}
    sink = mirror(tmp_path)
    (applied,) = sink.apply(typed_batch(EVERY, [ins(full), ins(empty)]), 0, APP)
    got = by_key(rows_of(sink), ["id"])
    want = dict(full, tm=-(838 * 3600 + 59 * 60 + 59) * 1_000_000)  # TIME: microseconds
    assert got[(Decimal(2**64 - 1),)] == want
    assert got[(Decimal(0),)] == empty
    types = {f.name: str(f.type) for f in DeltaTable(applied.path).schema().fields}
    assert types["id"] == 'PrimitiveType("decimal(20,0)")'
    assert (
        types["tm"] == 'PrimitiveType("long")' and types["dtm"] == 'PrimitiveType("timestamp_ntz")'
    )


def test_merge_rewrites_only_the_files_of_the_changed_keys(tmp_path: Path) -> None:
    sink = mirror(tmp_path, target_file_size=64 * 1024)
    rows = [ins(order(i, i, "x" * 40)) for i in range(1, 40_001)]
    sink.apply(typed_batch(ORDERS, rows), 0, APP)
    path = sink.root + "/shop.orders"
    files = len(DeltaTable(path).file_uris())
    assert files >= 4
    tail = [upd(order(i, i, "x" * 40), order(i, 0, "u")) for i in range(39_990, 40_001)]
    (applied,) = sink.apply(typed_batch(ORDERS, [*tail, ins(order(50_000))]), 1, APP)
    assert applied.metrics["num_target_files_removed"] <= 2 < files
    assert applied.metrics["num_target_rows_updated"] == 11
    back = by_key(delta_rows(path), ["id"])
    assert len(back) == 40_001 and back[(40_000,)]["qty"] == 0 and back[(1,)]["qty"] == 1


def test_key_bounds_hold_for_strings_decimals_and_quotes(tmp_path: Path) -> None:
    image = pa.struct([("k", pa.string()), ("amount", pa.decimal128(12, 2)), ("v", pa.int32())])
    keys = ("k", "amount")
    sink = mirror(tmp_path)
    names = ["", "a'b", "Z", "é", "😀", "zz`"]
    first = [ins({"k": n, "amount": Decimal(f"{i}.25"), "v": 0}) for i, n in enumerate(names)]
    sink.apply(typed_batch(image, first, keys), 0, APP)
    edges = [  # the smallest and the largest keys, the quote, the backtick
        upd(r[2], dict(r[2], v=1)) for r in (first[0], first[1], first[4], first[5])
    ]
    sink.apply(typed_batch(image, edges, keys), 1, APP)
    got = by_key(rows_of(sink), keys)
    assert len(got) == len(names)
    assert sorted(k for (k, _), r in got.items() if r["v"] == 1) == sorted(["", "a'b", "😀", "zz`"])


def test_decimal_keys_with_a_zero_of_many_fraction_digits(tmp_path: Path) -> None:
    image = pa.struct([("k", pa.decimal128(30, 10)), ("v", pa.int32())])
    sink = mirror(tmp_path)
    keys = [Decimal("0E-10"), Decimal("-1.5"), Decimal("99999999999999999999.9999999999")]
    sink.apply(typed_batch(image, [ins({"k": k, "v": 0}) for k in keys], ("k",)), 0, APP)
    moved = [upd({"k": k, "v": 0}, {"k": k, "v": 1}) for k in keys[:2]]
    sink.apply(typed_batch(image, moved, ("k",)), 1, APP)
    got = by_key(rows_of(sink), ["k"])
    assert {k: r["v"] for (k,), r in got.items()} == {keys[0]: 1, keys[1]: 1, keys[2]: 0}


def test_added_dropped_and_widened_columns_evolve_the_table(tmp_path: Path) -> None:
    sink = mirror(tmp_path)
    v1 = pa.struct([
        ("id", pa.int32()), ("qty", pa.int16()), ("price", pa.decimal128(10, 2)),
        ("gone", pa.string()),
    ])  # fmt: skip
    sink.apply(
        typed_batch(v1, [ins({"id": 1, "qty": 7, "price": Decimal("1.50"), "gone": "g"})]), 0, APP
    )
    path = sink.root + "/shop.orders"
    # ADD COLUMN: metadata only; the rows the mirror has get null
    v2 = pa.struct([*v1, pa.field("vip", pa.int8())])
    new = {"id": 2, "qty": 1, "price": None, "gone": None, "vip": 1}
    (applied,) = sink.apply(typed_batch(v2, [ins(new)]), 1, APP)
    assert applied.evolved == "added vip (byte)"
    assert rows_of(sink)[0] == {
        "id": 1,
        "qty": 7,
        "price": Decimal("1.50"),
        "gone": "g",
        "vip": None,
    }
    # DROP COLUMN and widening MODIFY (smallint -> bigint, decimal(10,2) -> decimal(14,3),
    # int -> a decimal key would be too, here kept): one rewrite, the values converted
    v3 = pa.struct([
        ("id", pa.int32()), ("qty", pa.int64()), ("price", pa.decimal128(14, 3)),
        ("vip", pa.int8()),
    ])  # fmt: skip
    old, new = {"id": 2, "qty": 1, "price": None, "vip": 1}, {"id": 2, "qty": 2**40, "vip": 0}
    (applied,) = sink.apply(typed_batch(v3, [upd(old, dict(new, price=None))]), 2, APP)
    assert "dropped gone" in applied.evolved and "converted qty: short -> long" in applied.evolved
    assert rows_of(sink) == [
        {"id": 1, "qty": 7, "price": Decimal("1.500"), "vip": None},
        {"id": 2, "qty": 2**40, "price": None, "vip": 0},
    ]
    types = {f.name: str(f.type) for f in DeltaTable(path).schema().fields}
    assert types == {
        "id": 'PrimitiveType("integer")', "qty": 'PrimitiveType("long")',
        "price": 'PrimitiveType("decimal(14,3)")', "vip": 'PrimitiveType("byte")',
    }  # fmt: skip


def test_an_incompatible_change_stops_before_anything_is_written(tmp_path: Path) -> None:
    sink = mirror(tmp_path)
    v1 = pa.struct([("id", pa.int32()), ("qty", pa.int64()), ("note", pa.string())])
    two: list[tuple[Any, ...]] = [
        ("shop", "a", "INSERT", None, {"id": 1, "qty": 1, "note": "x"}),
        ("shop", "b", "INSERT", None, {"id": 1, "qty": 1, "note": "x"}),
    ]
    sink.apply(typed_batch(v1, two), 0, APP)
    versions = {t: DeltaTable(f"{sink.root}/shop.{t}").version() for t in "ab"}
    for bad, column, what in [
        (pa.struct([("id", pa.int32()), ("qty", pa.int32()), ("note", pa.string())]), "qty",
         "long -> integer"),
        (pa.struct([("id", pa.int32()), ("qty", pa.int64()), ("note", pa.binary())]), "note",
         "string -> binary"),
    ]:  # fmt: skip
        rows = [(*t[:3], None, {"id": 2, "qty": 2, "note": None}) for t in two]
        with pytest.raises(
            IncompatibleChange, match=f"shop.a: column {column} changed type {what}"
        ):
            sink.apply(typed_batch(bad, rows), 1, APP)
        assert {t: DeltaTable(f"{sink.root}/shop.{t}").version() for t in "ab"} == versions
    # a mirror without rows takes any change (after a DROP TABLE and a new CREATE)
    v2 = pa.struct([("id", pa.string()), ("qty", pa.binary())])
    gone: list[tuple[Any, ...]] = [("shop", "a", "DELETE", two[0][4], None)]
    sink.apply(typed_batch(v1, gone), 1, APP)
    sink.apply(typed_batch(v2, [ins({"id": "k", "qty": b"\x01"})], table=("shop", "a")), 2, APP)
    assert rows_of(sink, "shop.a") == [{"id": "k", "qty": b"\x01"}]


def test_key_columns_come_from_the_rows_or_are_given(tmp_path: Path) -> None:
    batch = typed_batch(ORDERS, [ins(order(1)), dele(order(2))])
    assert plan_changes(batch)[0].keys == ("id",)
    assert plan_changes(batch, keys=("id", "qty"))[0].keys == ("id", "qty")
    mixed = pa.concat_tables([batch, typed_batch(ORDERS, [ins(order(3))], keys=("id", "qty"))])
    with pytest.raises(ConfigError, match="different primary keys"):
        plan_changes(mixed)
    no_key = batch.set_column(7, "primary_key", pa.nulls(2, pa.string()))
    with pytest.raises(ConfigError, match=r"shop\.orders has no primary key"):
        plan_changes(no_key)
    with pytest.raises(ConfigError, match="typed mode"):
        plan_changes(batch.drop_columns(["after"]))
    assert plan_changes(typed_batch(ORDERS, [("TRUNCATE", "TRUNCATE t")]))[0].keys == ()
