"""Secrets in the node's config (inline, ``{ env = ... }``, ``{ file = ... }``), the
``etcd.*`` and ``db.tls.*`` security keys, and the clients' etcd options: every bad
value names its key, and no secret shows in a ``repr``, an error or a log line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from tls_fixtures import Pki, make_pki

from canal_ha.cli import build_parser
from canal_ha.source import etcd_security
from canal_protocol.errors import ConfigError
from canal_server.config import config_from_dict, dsn_of, load_config, render_toml
from canal_server.secrets import install_log_redaction, redact, resolve_secret

SECRET = "s3cret-value-1f9e"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _config(**sections: Any) -> dict[str, Any]:
    dest = {"master": {"address": "127.0.0.1:3306"}, **sections.pop("dest", {})}
    return {"node": {"id": "n1"}, **sections, "destinations": {"example": dest}}


def test_each_form_gives_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANAL_T_DB", SECRET)
    token_file = tmp_path / "token"
    token_file.write_text("tok-from-file\n")  # one trailing newline is not part of it
    config = config_from_dict(_config(
        dest={"db": {"password": {"env": "CANAL_T_DB"}}},
        auth={"tokens": ["inline-token", {"file": str(token_file)}]},
    ))  # fmt: skip
    dest = config.destinations["example"]
    assert dsn_of(dest, dest.master)["password"] == SECRET
    assert config.auth.tokens == ["inline-token", "tok-from-file"]
    assert SECRET not in repr(config) and "tok-from-file" not in repr(config)
    assert SECRET not in str(config.model_dump())


def test_the_form_written_to_toml_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANAL_T_ETCD", SECRET)
    data = _config(
        etcd={"username": "canal", "password": {"env": "CANAL_T_ETCD"}},
        auth={"tokens": [{"env": "CANAL_T_ETCD"}]},
    )
    path = tmp_path / "node.toml"
    text = render_toml(data)
    assert 'password.env = "CANAL_T_ETCD"' in text
    assert 'tokens = [{ env = "CANAL_T_ETCD" }]' in text
    path.write_text(text)
    config = load_config(path)
    assert config.etcd.security().password == SECRET
    assert SECRET not in repr(config.etcd.security())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"env": "CANAL_T_UNSET"}, "environment variable CANAL_T_UNSET is not set"),
        ({"file": "/nonexistent/secret"}, "cannot read secret file '/nonexistent/secret'"),
        ({"vault": "x"}, 'must be a string, { env = "NAME" } or { file = "/path" }'),
        ({"env": "A", "file": "/b"}, "must be a string"),
        (42, "must be a string"),
    ],
)
def test_a_bad_secret_names_its_key_and_never_a_value(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_config(dest={"db": {"password": value}}))
    assert err.value.key == "destinations.example.db.password"
    assert message in str(err.value)
    with pytest.raises(ConfigError) as err:
        config_from_dict(_config(auth={"tokens": [value]}))
    assert err.value.key == "auth.tokens.0"


def test_etcd_security_keys(pki: Pki) -> None:
    https = ["https://127.0.0.1:2379"]
    config = config_from_dict(_config(etcd={
        "endpoints": https, "ca_file": str(pki.ca), "cert_file": str(pki.client.cert),
        "key_file": str(pki.client.key), "username": "canal", "password": SECRET,
    }))  # fmt: skip
    sec = config.etcd.security()
    assert (sec.ca_file, sec.username, sec.password) == (str(pki.ca), "canal", SECRET)
    assert SECRET not in repr(config) + repr(sec)
    bad = {
        "etcd.ca_file": {"endpoints": https, "ca_file": "/nonexistent.crt"},
        "etcd": {"endpoints": ["http://127.0.0.1:2379"], "ca_file": str(pki.ca)},
    }
    for key, etcd in bad.items():
        with pytest.raises(ConfigError) as err:
            config_from_dict(_config(etcd=etcd))
        assert err.value.key == key, err.value
    with pytest.raises(ConfigError, match="username and password must be set together"):
        config_from_dict(_config(etcd={"username": "canal"}))
    with pytest.raises(ConfigError, match="cert_file and key_file must be set together"):
        config_from_dict(_config(etcd={"endpoints": https, "cert_file": str(pki.client.cert)}))


def test_db_tls_keys(pki: Pki, tmp_path: Path) -> None:
    tls = {"enabled": True, "ca_file": str(pki.ca), "cert_file": str(pki.db.cert),
           "key_file": str(pki.db.key), "verify_identity": False}  # fmt: skip
    config = config_from_dict(_config(dest={"db": {"tls": tls}}))
    dest = config.destinations["example"]
    assert dsn_of(dest, dest.master)["tls"] == {
        "ca": str(pki.ca), "cert": str(pki.db.cert), "key": str(pki.db.key),
        "verify_identity": False,
    }  # fmt: skip
    plain = config_from_dict(_config())
    assert "tls" not in dsn_of(plain.destinations["example"], plain.destinations["example"].master)
    not_pem = tmp_path / "x.crt"
    not_pem.write_text("nope\n")
    cases = {
        "destinations.example.db.tls.ca_file": {"enabled": True, "ca_file": "/nonexistent"},
        "destinations.example.db.tls": {"ca_file": str(pki.ca)},  # not enabled
    }
    for key, value in cases.items():
        with pytest.raises(ConfigError) as err:
            config_from_dict(_config(dest={"db": {"tls": value}}))
        assert err.value.key == key, err.value
    with pytest.raises(ConfigError, match="no usable PEM"):
        config_from_dict(_config(dest={"db": {"tls": {"enabled": True, "ca_file": str(not_pem)}}}))
    with pytest.raises(ConfigError, match="no usable PEM"):  # a key that is not the cert's
        config_from_dict(_config(dest={"db": {"tls": {
            "enabled": True, "cert_file": str(pki.db.cert), "key_file": str(pki.rogue.key),
        }}}))  # fmt: skip


def test_log_redaction_hides_every_loaded_secret(caplog: pytest.LogCaptureFixture) -> None:
    resolve_secret("redact-me-8a7b")
    assert redact("x redact-me-8a7b y") == "x *** y"
    logger = logging.getLogger("canal_test_redaction")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    install_log_redaction(logger)
    try:
        record = logger.makeRecord(logger.name, logging.ERROR, __file__, 1,
                                   "dsn %s", ({"password": "redact-me-8a7b"},), None)  # fmt: skip
        for f in handler.filters:
            assert isinstance(f, logging.Filter) and f.filter(record)
        assert "redact-me-8a7b" not in record.getMessage()
    finally:
        logger.removeHandler(handler)


def test_consume_and_status_etcd_options(pki: Pki, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    parser = build_parser()
    base = ["status", "--etcd", "https://127.0.0.1:2379", "--etcd-cacert", str(pki.ca),
            "--etcd-user", "canal"]  # fmt: skip
    monkeypatch.setenv("CANAL_ETCD_PASSWORD", SECRET)
    sec = etcd_security(parser.parse_args(base))
    assert (sec.ca_file, sec.username, sec.password) == (str(pki.ca), "canal", SECRET)
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    sec = etcd_security(parser.parse_args([*base, "--etcd-password-file", str(pw)]))
    assert sec.password == "from-file"
    assert etcd_security(parser.parse_args(["status", "--etcd", "http://127.0.0.1:2379"])) is None
    monkeypatch.delenv("CANAL_ETCD_PASSWORD")
    with pytest.raises(ConfigError) as err:
        etcd_security(parser.parse_args(base))
    assert err.value.key == "$CANAL_ETCD_PASSWORD / --etcd-password-file"
    with pytest.raises(ConfigError) as err:
        etcd_security(parser.parse_args(["status", "--etcd", "https://127.0.0.1:2379",
                                         "--etcd-cert", str(pki.client.cert)]))  # fmt: skip
    assert err.value.key == "--etcd-cert"


def test_spark_etcd_options(pki: Pki, tmp_path: Path) -> None:
    from canal_client.spark import CanalOptions

    base = {"etcd": "https://127.0.0.1:2379", "destination": "d", "clientId": "c",
            "etcdCaFile": str(pki.ca), "etcdUser": "canal"}  # fmt: skip
    options = CanalOptions.parse({**base, "etcdPassword": SECRET})
    sec = options.etcd_security()
    assert (sec.ca_file, sec.username, sec.password) == (str(pki.ca), "canal", SECRET)
    assert SECRET not in repr(options) + repr(sec)
    pw = tmp_path / "pw"
    pw.write_text("file-pw\n")
    assert CanalOptions.parse({**base, "etcdPasswordFile": str(pw)}).etcd_password == "file-pw"
    with pytest.raises(ConfigError) as err:
        CanalOptions.parse(base).etcd_security()
    assert err.value.key == "etcdPassword"
    with pytest.raises(ConfigError) as err:
        CanalOptions.parse({**base, "etcdPassword": "a", "etcdPasswordFile": str(pw)})
    assert err.value.key == "etcdPasswordFile"
    with_token = CanalOptions.parse({**base, "etcdPassword": "x", "tokenFile": str(pw)})
    assert with_token.token == "file-pw"


def test_admin_and_consumer_tokens_take_the_secret_forms_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANAL_T_ADMIN", "admin-" + SECRET)
    token_file = tmp_path / "consumer"
    token_file.write_text("consumer-" + SECRET + "\n")
    config = config_from_dict(_config(auth={
        "admin": [{"token": {"env": "CANAL_T_ADMIN"}}],
        "consumer": [{"token": {"file": str(token_file)}, "destinations": ["example"]}],
    }))  # fmt: skip
    assert config.auth.admin[0].token == "admin-" + SECRET
    assert config.auth.consumer[0].token == "consumer-" + SECRET
    assert SECRET not in repr(config)
