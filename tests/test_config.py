"""The node config: the documented example parses; bad values are refused naming the key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from canal_protocol.errors import ConfigError
from canal_server.config import config_from_dict, dsn_of, load_config, render_toml

EXAMPLE = """
[node]
id = "node1"
listen = "127.0.0.1:11112"

[etcd]
endpoints = ["http://127.0.0.1:2379", "127.0.0.1:2479"]
prefix = "/canal"

[election]
ttl_s = 10
switch_delay_s = 5

[meta]
flush_period_ms = 1000

[auth]
tokens = ["t1"]

[destinations.example]
master.address = "127.0.0.1:3306"
master.journal_name = "mariadb-bin.000001"
master.position = 4
standby.address = "127.0.0.1:3307"
db.username = "canal"
db.password = "pw"
gtid_mode = true
filter.regex = "shop\\\\..*"
filter.black_regex = "shop\\\\.tmp_.*"
memory.buffer_size = 1024
detecting.enable = true

[destinations.other]
master.address = "127.0.0.1:3306"
"""


def minimal(**dest: Any) -> dict[str, Any]:
    return {
        "node": {"id": "n1"},
        "destinations": {"d": {"master": {"address": "127.0.0.1:3306"}, **dest}},
    }


def test_example_config_parses(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(EXAMPLE)
    cfg = load_config(path)
    assert cfg.advertise_url == "http://127.0.0.1:11112"
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 11112)
    ex = cfg.destinations["example"]
    assert ex.name == "example" and ex.gtid_mode and ex.standby is not None
    assert ex.master.journal_name == "mariadb-bin.000001" and ex.master.position == 4
    assert ex.filter.regex == "shop\\..*" and ex.memory.buffer_size == 1024
    assert dsn_of(ex, ex.master) == {
        "host": "127.0.0.1", "port": 3306, "user": "canal", "password": "pw"
    }  # fmt: skip
    assert ex.effective_slave_id == cfg.destinations["example"].effective_slave_id > 0
    assert cfg.destinations["other"].effective_slave_id != ex.effective_slave_id


def test_render_toml_round_trips() -> None:
    data = minimal(filter={"regex": 'a\\.b"c'}, gtid_mode=True)
    data["auth"] = {"tokens": ["x", "y"]}
    assert tomllib.loads(render_toml(data)) == data
    assert config_from_dict(tomllib.loads(render_toml(data))).auth.tokens == ["x", "y"]


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"node": {"id": "n1"}}, "destinations"),
        ({"node": {"id": "bad id"}, "destinations": {}}, "node.id"),
        ({**minimal(), "node": {"id": "n", "listen": "nowhere"}}, "node.listen"),
        ({**minimal(), "node": {"id": "n", "advertise_url": "ftp://x"}}, "node.advertise_url"),
        ({**minimal(), "node": {"id": "n", "http": "fast"}}, "node.http"),
        ({**minimal(), "node": {"id": "n", "loop": "trio"}}, "node.loop"),
        (minimal(master={"address": "127.0.0.1"}), "destinations.d.master.address"),
        (minimal(master={"address": "h:1", "position": -1}), "destinations.d.master.position"),
        (minimal(filter={"regex": "(unclosed"}), "destinations.d.filter"),
        (minimal(memory={"buffer_size": 0}), "destinations.d.memory.buffer_size"),
        (minimal(transaction_size=1), "destinations.d.transaction_size"),
        (minimal(surprise=1), "destinations.d.surprise"),
        ({**minimal(), "meta": {"flush_period_ms": 0}}, "meta.flush_period_ms"),
        ({**minimal(), "etcd": {"prefix": "canal"}}, "etcd.prefix"),
        ({**minimal(), "etcd": {"endpoints": []}}, "etcd.endpoints"),
        ({**minimal(), "auth": {"tokens": [""]}}, "auth.tokens"),
        ({**minimal(), "tls": {"cert_file": "/nonexistent.pem"}}, "tls"),
        ({**minimal(), "election": {"ttl_s": 3}}, "election.ttl_s"),
        ({**minimal(), "election": {"switch_delay_s": -1}}, "election.switch_delay_s"),
        (
            {"node": {"id": "n"}, "destinations": {"bad/d": {"master": {"address": "h:1"}}}},
            "destinations",
        ),
        ({"node": {"id": "n"}, "destinations": {".": {"master": {"address": "h:1"}}}}, "dest"),
        ({"node": {"id": "n"}, "destinations": {"..": {"master": {"address": "h:1"}}}}, "dest"),
        ({"node": {"id": ".."}, "destinations": {}}, "node.id"),
    ],
)
def test_bad_values_name_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert err.value.key.startswith(key), err.value


def test_unreadable_files_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[node\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_fast_test_timings_are_accepted() -> None:
    cfg = config_from_dict(
        {
            **minimal(),
            "etcd": {"timeout_s": 0.5},
            "election": {
                "ttl_s": 3,
                "switch_delay_s": 1,
                "safety_margin_s": 1,
                "loop_interval_s": 0.5,
            },
        }
    )
    assert cfg.election.election_config().ttl_s == 3


@pytest.mark.parametrize(
    ("data", "key", "port"),
    [
        ({**minimal(), "node": {"id": "n", "listen": "127.0.0.1:99999"}}, "node.listen", 99999),
        (minimal(master={"address": "127.0.0.1:70000"}), "destinations.d.master.address", 70000),
        (minimal(standby={"address": "127.0.0.1:0"}), "destinations.d.standby.address", 0),
        (
            {**minimal(), "node": {"id": "n", "advertise_url": "http://127.0.0.1:99999"}},
            "node.advertise_url",
            99999,
        ),
        ({**minimal(), "etcd": {"endpoints": ["http://127.0.0.1:65536"]}}, "etcd.endpoints", 65536),
    ],
)
def test_an_out_of_range_port_is_named(data: dict[str, Any], key: str, port: int) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert err.value.key.startswith(key), err.value
    assert f"port {port} out of range 1-65535" in str(err.value)
