"""MariaDB GTID states (canal_protocol.gtid.MariadbGtidState): parsing, text form,
inclusion and the order across databases, checked against a plain {domain: (server,
seq)} model with hypothesis; and ``gtid_state_covers`` over both kinds of GTID text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canal_protocol.gtid import (
    MariadbGtid,
    MariadbGtidState,
    gtid_state_covers,
    is_mariadb_gtid_state,
)
from canal_protocol.ordering import EntryKey, gtid_order

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "5a9ba3a4-1b1c-11ee-8bfb-0242ac110002"

gtids = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(0, 50)), max_size=6)


def text_of(parts: list[tuple[int, int, int]]) -> str:
    return ",".join(f"{d}-{s}-{n}" for d, s, n in parts)


def model(parts: list[tuple[int, int, int]]) -> dict[int, tuple[int, int]]:
    """{domain: (server, seq)}: of a domain given twice, the later GTID."""
    return {d: (s, n) for d, s, n in parts}


@given(gtids)
def test_parse_keeps_the_last_gtid_of_each_domain_in_domain_order(
    parts: list[tuple[int, int, int]],
) -> None:
    state = MariadbGtidState.parse(text_of(parts))
    want = model(parts)
    assert [(g.domain, g.server_id, g.seq) for g in state] == [(d, *want[d]) for d in sorted(want)]
    assert str(state) == text_of([(d, *want[d]) for d in sorted(want)])
    assert MariadbGtidState.parse(str(state)) == state
    assert bool(state) == bool(parts) and len(state) == len(want)
    assert state.seqs == {d: n for d, (_, n) in want.items()}
    assert is_mariadb_gtid_state(str(state)) == bool(parts)


@given(gtids, gtids)
def test_covers_is_a_higher_sequence_number_in_every_domain(
    mine: list[tuple[int, int, int]], theirs: list[tuple[int, int, int]]
) -> None:
    a, b = MariadbGtidState.parse(text_of(mine)), MariadbGtidState.parse(text_of(theirs))
    have, want = model(mine), model(theirs)
    expected = all(d in have and have[d][1] >= n for d, (_, n) in want.items())
    assert a.covers(b) == expected
    assert gtid_state_covers(str(a), str(b)) == expected
    assert all((str(g) in a) == a.covers(MariadbGtidState((g,))) for g in b)


@given(gtids, gtids)
def test_order_compares_one_common_domain_or_the_same_several(
    mine: list[tuple[int, int, int]], theirs: list[tuple[int, int, int]]
) -> None:
    a, b = model(mine), model(theirs)
    got = MariadbGtidState.parse(text_of(mine)).order(MariadbGtidState.parse(text_of(theirs)))
    if not a or not b:
        assert got is None
    elif len(a) > 1 and len(b) > 1:
        same = a.keys() == b.keys()
        assert got == (
            (tuple(a[d][1] for d in sorted(a)), tuple(b[d][1] for d in sorted(a))) if same else None
        )
    else:
        (domain,) = a if len(a) == 1 else b
        both = domain in a and domain in b
        assert got == (((a[domain][1],), (b[domain][1],)) if both else None)
    assert gtid_order(text_of(mine), text_of(theirs)) == got


def test_with_gtid_and_with_state_replace_their_domains() -> None:
    state = MariadbGtidState.parse("1-2-7,0-1-42")
    assert str(state) == "0-1-42,1-2-7"
    assert str(state.with_gtid(MariadbGtid.parse("0-3-43"))) == "0-3-43,1-2-7"
    assert str(state.with_gtid(MariadbGtid(5, 1, 1))) == "0-1-42,1-2-7,5-1-1"
    assert str(MariadbGtidState.parse("0-1-9").with_gtid(MariadbGtid(0, 1, 10))) == "0-1-10"
    assert str(state.with_state(MariadbGtidState.parse("1-9-9,2-1-1"))) == "0-1-42,1-9-9,2-1-1"
    assert str(MariadbGtidState.parse(" 0-1-42 , ,1-2-7")) == "0-1-42,1-2-7"
    assert MariadbGtidState.parse("") == MariadbGtidState() and not MariadbGtidState()


@pytest.mark.parametrize("bad", ["0-1", "0-1-x", f"{U1}:1-5", "0-1-2-3", "a"])
def test_what_is_not_a_mariadb_state_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad)):
        MariadbGtidState.parse(f"0-1-42,{bad}")
    assert MariadbGtidState.read(f"0-1-42,{bad}") is None
    assert MariadbGtid.read(bad) is None
    assert not is_mariadb_gtid_state(bad)


def test_covers_across_both_kinds_of_gtid_text() -> None:
    assert gtid_state_covers("0-1-42,1-2-7", "0-9-40")
    assert not gtid_state_covers("0-1-42", "0-1-40,1-5-7")  # domain 1 missing
    assert gtid_state_covers("0-1-42", "") and not gtid_state_covers("", "0-1-1")
    # MySQL sets compare as sets (a single-number interval included)
    assert gtid_state_covers(f"{U1}:1-5:7,{U2}:1-3", f"{U1}:1-3:7")
    assert not gtid_state_covers(f"{U1}:1-5", f"{U1}:6")
    assert not gtid_state_covers(f"{U1}:1-5:7", f"{U1}:1-7")  # 6 is missing
    assert gtid_state_covers(f"{U1}:1-5", "") and not gtid_state_covers("", f"{U1}:1")
    # a state of the other kind (the reader switched databases): nothing included
    assert not gtid_state_covers("0-1-42", f"{U1}:1") and not gtid_state_covers(f"{U1}:1", "0-1-1")


def test_entry_keys_of_two_databases_order_by_their_gtids() -> None:
    a = EntryKey.of("b.000009", 5000, source="db1:3306", gtid="0-1-41", sub=2)
    b = EntryKey.of("b.000001", 300, source="db2:3306", gtid="0-2-42", sub=0)
    assert a < b  # binlog order would say the opposite
    mysql = EntryKey.of("b.000001", 300, source="db2:3306", gtid=f"{U1}:42", sub=0)
    assert mysql < a  # no MariaDB GTID on one side: binlog order
