"""EventFilter: Canal's regex syntax, put-time transactions, get-time narrowing."""

from __future__ import annotations

from typing import Any

import pytest
from serving_fixtures import IDENTITY, EntryFactory, position_of

from canal_protocol.entry import EntryType
from canal_protocol.errors import InvalidArgument
from canal_server.filter import MAX_PROGRAM, NAME_MEMO, EventFilter, NameFilter
from canal_server.parse.logposition import MemoryLogPositionManager
from canal_server.sink import EventSink
from canal_server.store import EventStore


def test_empty_include_matches_everything_and_empty_exclude_nothing() -> None:
    f = EventFilter()
    assert f.accepts_name("a.b") and f.accepts_name("x.y")
    assert not NameFilter("", "f", if_empty=False).matches("a.b")


def test_everything_pattern_whole_name_and_case_insensitive() -> None:
    assert NameFilter(".*\\..*", "f", True).matches("Shop.Orders")
    f = NameFilter("shop\\.orders, shop\\.item.*", "f", True)
    assert f.matches("SHOP.ORDERS")
    assert f.matches("shop.items_2024")
    assert not f.matches("shop.orders_old"), "a pattern must match the whole name"
    assert not f.matches("xshop.orders")


def test_exclude_wins_over_include() -> None:
    f = EventFilter("shop\\..*", "shop\\.secret.*")
    assert f.accepts_name("shop.orders")
    assert not f.accepts_name("shop.secrets")
    assert not f.accepts_name("other.t")


@pytest.mark.parametrize(
    ("include", "exclude", "field"),
    [
        ("db\\.(t", "", "filter.regex"),
        ("", "ok\\..*,[z", "filter.black_regex"),
    ],
)
def test_bad_regex_names_the_field(include: str, exclude: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        EventFilter(include, exclude)
    assert info.value.field == field
    assert field in str(info.value)


def test_bad_client_regex_names_filter() -> None:
    with pytest.raises(InvalidArgument) as info:
        EventFilter.for_client("*bad")
    assert info.value.field == "filter"


def test_boundaries_pass_and_heartbeat_table_is_dropped() -> None:
    fac = EntryFactory()
    f = EventFilter(heartbeat_table="canal.HEARTBEAT")
    begin, row, end = fac.tx("canal", "heartbeat")
    assert f.accepts(begin) and f.accepts(end)
    assert not f.accepts(row)
    assert not f.accepts(fac.ddl("Canal", "Heartbeat"))
    assert f.accepts(fac.ddl("canal", "other"))


def test_ddl_is_filtered_by_its_table_and_database_ddl_by_schema() -> None:
    fac = EntryFactory()
    f = EventFilter("shop\\..*")
    assert f.accepts(fac.ddl("shop", "orders"))
    assert not f.accepts(fac.ddl("other", "orders"))
    assert f.accepts(fac.ddl("shop", "", sql="CREATE DATABASE shop"))
    assert EventFilter(".*\\..*").accepts(fac.ddl("x", "", sql="CREATE DATABASE x"))


def test_filter_transaction_keeps_boundaries_around_surviving_rows() -> None:
    fac = EntryFactory()
    tx = fac.tx("shop", "orders", rows=2)
    mixed = [*tx[:-1], fac.entry(schema="other", table="t"), tx[-1]]
    out = EventFilter("shop\\..*").filter_transaction(mixed)
    assert out == tx


def test_empty_transactions_dropped_but_one_let_through_per_interval() -> None:
    now = [0.0]
    f = EventFilter("shop\\..*", empty_tx_interval_s=5.0, clock=lambda: now[0])
    fac = EntryFactory()
    assert f.filter_transaction(fac.tx("other", "t")) == []
    now[0] = 4.9
    assert f.filter_transaction(fac.tx("other", "t")) == []
    now[0] = 5.0
    passed = f.filter_transaction(fac.tx("other", "t"))
    assert [e.type for e in passed] == [EntryType.TRANSACTIONBEGIN, EntryType.TRANSACTIONEND]
    assert f.filter_transaction(fac.tx("other", "t")) == []


def test_empty_transactions_let_through_after_threshold() -> None:
    f = EventFilter("shop\\..*", empty_tx_threshold=3, clock=lambda: 0.0)
    fac = EntryFactory()
    results = [len(f.filter_transaction(fac.tx("other", "t"))) for _ in range(6)]
    assert results == [0, 0, 2, 0, 0, 2]


def test_chunk_without_both_boundaries_keeps_them() -> None:
    fac = EntryFactory()
    tx = fac.tx("other", "t", rows=2)
    f = EventFilter("shop\\..*")
    assert f.filter_transaction(tx[:2]) == [tx[0]]
    assert f.filter_transaction(tx[2:]) == [tx[-1]]


def test_narrow_drops_empty_transactions_within_a_batch_only() -> None:
    fac = EntryFactory()
    keep = fac.tx("shop", "orders")
    drop = fac.tx("other", "t", rows=3)
    tail = fac.tx("shop", "orders")
    f = EventFilter.for_client("shop\\..*")
    assert f.narrow([*keep, *drop, *tail]) == [*keep, *tail]
    # a BEGIN at the end of a batch is kept; the same raw entries give the same result
    window = [*keep, tail[0]]
    assert f.narrow(window) == window
    assert f.narrow(window) == f.narrow(list(window))
    # a window starting mid-transaction: rows filtered, END kept
    assert f.narrow(drop[1:]) == [drop[-1]]


def test_sink_filters_stores_and_persists_raw_position_at_boundaries() -> None:
    fac = EntryFactory()
    store = EventStore("d")
    positions = MemoryLogPositionManager()
    sink = EventSink("d", EventFilter("shop\\..*"), store, positions)
    kept = fac.tx("shop", "orders", 2)
    sink.sink(kept, IDENTITY)
    assert [e.entry for e in store.get(None, 100)] == kept
    assert positions.get_latest("d") == position_of(kept[-1])
    dropped = fac.tx("other", "t", 1)
    sink.sink(dropped, IDENTITY)
    assert store.stats()[0] == len(kept)
    assert positions.get_latest("d") == position_of(dropped[-1]), "filtered tx still advances"
    big = fac.tx("shop", "orders", 3)
    sink.sink(big[:2], IDENTITY)
    assert positions.get_latest("d") == position_of(dropped[-1]), "not inside a transaction"
    sink.sink(big[2:], IDENTITY)
    assert positions.get_latest("d") == position_of(big[-1])
    ddl = fac.ddl("shop", "orders")
    sink.sink([ddl], IDENTITY)
    assert positions.get_latest("d") == position_of(ddl)
    assert [e.entry for e in store.get(None, 100)] == [*kept, *big, ddl]


# -- the engine: RE2, linear time whatever the pattern (issue 37: ReDoS) ---------------------


@pytest.mark.parametrize(
    "pattern",
    [
        "(a)\\1",  # a backreference
        "(?=db)db\\..*",  # look-ahead
        "(?<!x)db\\..*",  # look-behind
        "db\\.t\\Z",  # \Z (RE2 has \z)
        "(.*){1000}(.*){1000}(.*){1000}!",  # over MAX_PROGRAM instructions
    ],
)
def test_a_pattern_outside_the_linear_engine_is_refused_naming_the_field(pattern: str) -> None:
    """A backtracking engine took seconds per name on such patterns; the filters'
    engine refuses what it cannot match in linear time."""
    with pytest.raises(InvalidArgument) as info:
        EventFilter.for_client(f"ok\\..*, {pattern}")
    assert info.value.field == "filter"
    with pytest.raises(InvalidArgument) as info:
        EventFilter(exclude=pattern)
    assert info.value.field == "filter.black_regex"


def test_pathological_patterns_run_on_re2_and_each_name_is_matched_once() -> None:
    """``(.*){50}!`` and friends compile on RE2 (matching time linear in the name, the
    program bounded by MAX_PROGRAM), and a filter matches a name once however many
    entries carry it: a batch's cost is bounded by construction."""
    calls: list[str] = []
    for pattern in ("(.*){50}!", "(a+)+$", "(\\w+\\s?)*$", "(.*){1000}!", "((a|aa)+)+b"):
        f = NameFilter(pattern, "filter", if_empty=True)
        regex = f._regex
        assert regex is not None and type(regex._re).__module__.startswith("re2")
        assert regex._re.programsize <= MAX_PROGRAM
        original = regex.fullmatch

        def counted(name: str, original: Any = original) -> bool:
            calls.append(name)
            return bool(original(name))

        regex.fullmatch = counted  # type: ignore[method-assign]
        name = "a" * 64 + "." + "a" * 64
        assert [f.matches(name) for _ in range(1000)] == [False] * 1000
        assert f.matches(name[:-1] + "!") is (pattern == "(.*){50}!" or pattern == "(.*){1000}!")
    assert len(calls) == 10  # two names per filter, each matched once


def test_the_name_memo_is_bounded() -> None:
    f = NameFilter("db\\..*", "filter", if_empty=True)
    for i in range(NAME_MEMO * 2 + 5):
        assert f.matches(f"db.t{i}")
    assert len(f._memo) <= NAME_MEMO


def test_canal_filter_syntax_keeps_working_on_re2() -> None:
    f = NameFilter("canal\\..*, mysql\\.slave_.*, shop\\.order_\\d{4}, (?i)MiXed\\.T", "f", True)
    assert f.matches("canal.t1") and f.matches("mysql.slave_x") and f.matches("shop.order_2024")
    assert f.matches("mixed.t") and not f.matches("shop.order_24") and not f.matches("other.t")
    assert NameFilter(".*\\..*", "f", True).matches("d.")  # a database DDL
    assert NameFilter("日本\\..*", "f", True).matches("日本.表")
