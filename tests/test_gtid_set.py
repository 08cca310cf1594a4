"""MySQL GTID sets (canal_protocol.gtid): parsing, union, containment and the subset order,
checked against a plain set of (uuid, number) pairs with hypothesis."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canal_protocol.gtid import GtidSet, is_mysql_gtid_set

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "5a9ba3a4-1b1c-11ee-8bfb-0242ac110002"
U3 = "ffffffff-0000-0000-0000-000000000001"

model_sets = st.frozensets(
    st.tuples(st.sampled_from([U1, U2, U3]), st.integers(1, 40)), max_size=30
)


def from_model(model: frozenset[tuple[str, int]]) -> GtidSet:
    return GtidSet.of(_group(model))


def _group(model: frozenset[tuple[str, int]]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for u, n in model:
        out.setdefault(u, []).append((n, n))
    return out


@given(model_sets)
def test_text_round_trip_and_canonical_form(model: frozenset[tuple[str, int]]) -> None:
    s = from_model(model)
    assert GtidSet.parse(str(s)) == s
    assert set(s) == set(model)
    assert len(s) == len(model)
    for _, ivs in s.sets:  # sorted, disjoint, not adjacent
        assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(ivs))


@given(model_sets, model_sets)
def test_union_is_the_set_union(
    a: frozenset[tuple[str, int]], b: frozenset[tuple[str, int]]
) -> None:
    sa, sb = from_model(a), from_model(b)
    assert set(sa | sb) == a | b
    assert sa | sb == sb | sa
    assert sa | sa == sa
    assert set(sa - sb) == a - b


@given(model_sets, model_sets, model_sets)
def test_union_is_associative(a: frozenset[tuple[str, int]], b: frozenset[tuple[str, int]],
                              c: frozenset[tuple[str, int]]) -> None:  # fmt: skip
    sa, sb, sc = from_model(a), from_model(b), from_model(c)
    assert (sa | sb) | sc == sa | (sb | sc)


@given(model_sets, st.sampled_from([U1, U2, U3]), st.integers(1, 45))
def test_containment_of_one_gtid(model: frozenset[tuple[str, int]], uuid: str, n: int) -> None:
    s = from_model(model)
    assert (f"{uuid}:{n}" in s) == ((uuid, n) in model)
    assert (f"{uuid.upper()}:{n}" in s) == ((uuid, n) in model)
    assert f"{uuid}:{n}" in s.add(uuid, n)


@settings(max_examples=300)
@given(model_sets, model_sets)
def test_order_is_set_inclusion(
    a: frozenset[tuple[str, int]], b: frozenset[tuple[str, int]]
) -> None:
    sa, sb = from_model(a), from_model(b)
    assert (sa <= sb) == (a <= b)
    assert (sa < sb) == (a < b)
    assert (sa >= sb) == (a >= b)
    assert (sa > sb) == (a > b)
    assert sa <= sa | sb and sb <= sa | sb
    assert (sa <= sb) == (sa | sb == sb)
    if sa < sb:
        assert sa.sort_key() < sb.sort_key()


def test_parse_what_mysql_prints() -> None:
    text = f"{U2.upper()}:1-3:5,\n{U1}:7:1-5:6"
    s = GtidSet.parse(text)
    assert str(s) == f"{U1}:1-7,{U2}:1-3:5"
    assert GtidSet.parse("") == GtidSet() and not GtidSet.parse("  ")
    assert GtidSet.parse(U1.replace("-", "") + ":3") == GtidSet.parse(f"{U1}:3")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nouuid:1-2", "not a server uuid"),
        (f"{U1}", "has no interval"),
        (f"{U1}:5-3", "empty or out of range"),
        (f"{U1}:0", "empty or out of range"),
        (f"{U1}:tag:1-3", "not N or N-M"),
        (f"{U1}:1-2-3", "not N or N-M"),
    ],
)
def test_parse_names_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        GtidSet.parse(text)


def test_mysql_and_mariadb_states_are_told_apart() -> None:
    assert is_mysql_gtid_set(f"{U1}:1-5")
    assert not is_mysql_gtid_set("0-1-42,1-2-7")
    assert not is_mysql_gtid_set("")
