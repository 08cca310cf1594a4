"""Canal's login check (``canal_server.canal.auth``) and the ``[canal]`` config keys."""

from __future__ import annotations

import os
from typing import Any

import pytest
from canal_java_client import scramble411 as client_scramble

from canal_protocol.errors import ConfigError
from canal_server.api.access import Grant
from canal_server.canal.auth import CanalUser, passwd_of, scramble411, upstream_password
from canal_server.config import config_from_dict

SEED = bytes(range(1, 9))
ANY = Grant("consumer")


def user(password: str = "", name: str = "", plaintext: bool = False) -> CanalUser:
    hashed = bytes.fromhex(passwd_of(password)) if password else b""
    return CanalUser(name, hashed, plaintext, ANY)


def scrambled(password: str, seed: bytes = SEED) -> bytes:
    return client_scramble(password.encode(), seed).hex().encode()


def test_passwd_is_canals_documented_hash() -> None:
    # Canal's canal-template.properties: "canal.passwd = E3619321C1A937C46A0D8BD1DAC39F93B27D4458"
    assert passwd_of("canal") == "E3619321C1A937C46A0D8BD1DAC39F93B27D4458"
    assert scramble411(b"canal", SEED) == client_scramble(b"canal", SEED)


def test_the_scramble_of_the_right_password_logs_in() -> None:
    u = user("s3cret", "canal")
    cred = u.check("canal", scrambled("s3cret"), SEED)
    assert cred is not None and cred.username == "canal"
    assert u.check("canal", scrambled("s3cret").upper(), SEED) is not None  # hex in any case


@pytest.mark.parametrize(
    ("username", "password"),
    [
        ("canal", "wrong"),  # wrong password
        ("other", "s3cret"),  # wrong user
    ],
)
def test_refused(username: str, password: str) -> None:
    assert user("s3cret", "canal").check(username, scrambled(password), SEED) is None


def test_a_scramble_for_other_seeds_is_refused() -> None:
    assert user("s3cret").check("x", scrambled("s3cret", bytes(8)), SEED) is None


def test_an_empty_password_is_refused_when_one_is_configured() -> None:
    assert user("s3cret").check("", b"", SEED) is None


def test_no_configured_password_takes_any_and_no_user_any_name() -> None:
    open_user = user()
    assert open_user.check("anyone", b"", SEED) is not None
    assert open_user.check("anyone", scrambled("whatever"), SEED) is not None
    assert open_user.check("anyone", b"not hex at all", SEED) is not None


def test_plaintext_only_when_allowed() -> None:
    assert user("s3cret").check("", b"s3cret", SEED) is None
    assert user("s3cret", plaintext=True).check("", b"s3cret", SEED) is not None
    assert user("s3cret", plaintext=True).check("", b"wrong", SEED) is None
    # a scramble still works with plaintext allowed
    assert user("s3cret", plaintext=True).check("", scrambled("s3cret"), SEED) is not None


def test_a_checked_login_can_log_in_again_elsewhere_without_the_password() -> None:
    """A relaying node logs in at the leader with the scramble for the leader's seeds."""
    u = user("s3cret")
    for password in (scrambled("s3cret"), b"s3cret"):
        cred = CanalUser(u.name, u.passwd_hash, True, ANY).check("", password, SEED)
        assert cred is not None and cred.stage1 is not None
        other_seed = os.urandom(8)
        assert u.check("", upstream_password(cred.stage1, other_seed), other_seed) is not None
    assert upstream_password(None, SEED) == b""


def _config(**canal: Any) -> dict[str, Any]:
    return {
        "node": {"id": "n1"},
        "canal": canal,
        "destinations": {"d": {"master": {"address": "127.0.0.1:3306"}}},
    }


def test_canal_config_defaults_and_keys() -> None:
    default = config_from_dict(_config())
    assert default.canal.enable and default.canal.listen == "127.0.0.1:11111"
    assert default.node.listen == "127.0.0.1:11112"  # the REST API's default
    assert default.canal.advertised == "127.0.0.1:11111" and default.canal.passwd_hash == b""
    cfg = config_from_dict(
        _config(
            listen="0.0.0.0:7000", advertise="canal1:7000", user="canal",
            passwd="*e3619321c1a937c46a0d8bd1dac39f93b27d4458", destinations=["d"],
        )
    )  # fmt: skip
    assert cfg.canal.advertised == "canal1:7000"
    assert cfg.canal.passwd_hash == bytes.fromhex(passwd_of("canal"))
    assert CanalUser.of(cfg.canal).grant == Grant("consumer", frozenset({"d"}), None)


@pytest.mark.parametrize(
    ("canal", "node", "key"),
    [
        ({"passwd": "canal"}, {}, "canal.passwd"),
        ({"listen": "nowhere"}, {}, "canal.listen"),
        ({"destinations": []}, {}, "canal.destinations"),
        ({"clients": ["bad id"]}, {}, "canal.clients"),
        ({}, {"listen": "127.0.0.1:11111"}, "canal.listen"),  # the REST API's port too
        ({"listen": "127.0.0.1:9000"}, {"listen": "0.0.0.0:9000"}, "canal.listen"),
    ],
)
def test_bad_canal_config_names_the_key(
    canal: dict[str, Any], node: dict[str, Any], key: str
) -> None:
    data = _config(**canal)
    data["node"].update(node)
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert err.value.key == key


def test_a_disabled_listener_may_share_nothing() -> None:
    rest_on_11111 = {"id": "n", "listen": "127.0.0.1:11111"}
    cfg = config_from_dict({**_config(enable=False), "node": rest_on_11111})
    assert not cfg.canal.enable
