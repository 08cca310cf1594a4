"""The etcd key layout of docs/architecture.md and id validation."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from canal_cluster.keys import Keys, validate_id
from canal_protocol.errors import ConfigError, InvalidArgument


def test_layout_under_default_prefix() -> None:
    k = Keys()
    assert k.node("n1") == "/canal/cluster/n1"
    assert k.running("d1") == "/canal/destinations/d1/running"
    assert k.destination_node("d1", "n1") == "/canal/destinations/d1/cluster/n1"
    assert k.client_running("d1", "c1") == "/canal/destinations/d1/c1/running"
    assert k.subscription("d1", "c1") == "/canal/destinations/d1/c1/subscription"
    assert k.cursor("d1", "c1") == "/canal/destinations/d1/c1/cursor"
    assert k.mark("d1", "c1", 42) == "/canal/destinations/d1/c1/mark/00000000000000000042"
    assert k.marks_prefix("d1", "c1") == "/canal/destinations/d1/c1/mark/"


def test_prefix_is_configurable() -> None:
    k = Keys("/test/x")
    assert k.running("d") == "/test/x/destinations/d/running"
    assert k.nodes_prefix() == "/test/x/cluster/"


@pytest.mark.parametrize("prefix", ["", "canal", "/canal/", "/ca nal", "//canal"])
def test_bad_prefix_is_a_config_error(prefix: str) -> None:
    with pytest.raises(ConfigError) as err:
        Keys(prefix)
    assert err.value.key == "etcd.prefix"


def test_mark_keys_sort_like_batch_ids() -> None:
    k = Keys()
    ids = [1, 9, 10, 100, 2**40]
    keys = [k.mark("d", "c", i) for i in ids]
    assert sorted(keys) == keys
    assert [Keys.batch_id_of(x) for x in keys] == ids


@pytest.mark.parametrize(
    "bad", ["", "a/b", "../x", "a b", "x" * 65, "é", "a\x00", "a*", "a\n", ".", ".."]
)
def test_ids_that_could_escape_are_rejected_naming_the_field(bad: str) -> None:
    k = Keys()
    cases: list[tuple[Callable[[], str], str]] = [
        (lambda: k.running(bad), "destination"),
        (lambda: k.node(bad), "node"),
        (lambda: k.cursor("d", bad), "client_id"),
        (lambda: k.mark(bad, "c", 1), "destination"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidArgument) as err:
            call()
        assert err.value.field == field


def test_dots_are_plain_characters() -> None:
    assert validate_id("a.b-c_9", "x") == "a.b-c_9"
    assert validate_id("x" * 64, "x") == "x" * 64


def test_non_string_ids_are_rejected() -> None:
    with pytest.raises(InvalidArgument):
        validate_id(5, "destination")


@pytest.mark.parametrize("reserved", ["cluster", "running"])
def test_client_ids_that_alias_destination_keys_are_refused(reserved: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        Keys().cursor("d", reserved)
    assert err.value.field == "client_id"


def test_bad_batch_id() -> None:
    with pytest.raises(InvalidArgument) as err:
        Keys().mark("d", "c", -1)
    assert err.value.field == "batch_id"


def test_client_ids_found_under_a_destination() -> None:
    k = Keys()
    keys = [
        k.running("d"),
        k.destination_node("d", "n1"),
        k.cursor("d", "c2"),
        k.mark("d", "c1", 3),
        k.subscription("d", "c1"),
    ]
    assert k.client_ids("d", keys) == ["c1", "c2"]
