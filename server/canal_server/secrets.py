"""Secrets in the node's config: inline, from the environment, or from a file.

Every secret key (``etcd.password``, ``destinations.*.db.password``, each of
``auth.tokens``) takes one of::

    db.password = "inline"                          # in the file, in clear
    db.password = { env = "CANAL_DB_PASSWORD" }      # an environment variable
    db.password = { file = "/run/secrets/db_password" }  # a file (Docker/Kubernetes secrets)

A file's content is the secret minus one trailing newline; both are read once, when
the config is loaded. A missing variable or unreadable file is a config error naming
the key (and the variable or path, never the value). The value is kept as a pydantic
``SecretStr`` (``**********`` in every ``repr``/``str``) and given out only where it
is used (``Secret.get_secret_value()``).

``redact(text)`` replaces every secret value loaded so far by ``***``;
``install_log_redaction()`` puts a filter doing that on the root logger's handlers, a
last guard should a library ever print one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr

__all__ = [
    "MIN_REDACTED_LEN",
    "Secret",
    "SecretText",
    "install_log_redaction",
    "redact",
    "resolve_secret",
]

MIN_REDACTED_LEN = 4  # shorter values would mangle every log line; too weak to hide anyway
FORMS = 'a string, { env = "NAME" } or { file = "/path" }'

_known: set[str] = set()
_known_lock = threading.Lock()


def _remember(value: str) -> str:
    if len(value) >= MIN_REDACTED_LEN:
        with _known_lock:
            _known.add(value)
    return value


def _from_env(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("env must name an environment variable")
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"environment variable {name} is not set")
    return value


def _from_file(path: object) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError("file must be a path")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"cannot read secret file {path!r}: {reason}") from None
    return text[:-1] if text.endswith("\n") else text


def resolve_secret(value: Any) -> str:
    """The secret's value from any of the three forms (ValueError naming what is wrong)."""
    if isinstance(value, SecretStr):
        return _remember(value.get_secret_value())
    if isinstance(value, str):
        return _remember(value)
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, arg),) = value.items()
        if kind == "env":
            return _remember(_from_env(arg))
        if kind == "file":
            return _remember(_from_file(arg))
    raise ValueError(f"must be {FORMS}")


Secret = Annotated[SecretStr, BeforeValidator(resolve_secret)]
"""A config field holding a secret (any of the three forms), hidden in every repr."""

SecretText = Annotated[str, BeforeValidator(resolve_secret)]
"""The same forms, resolved to a plain ``str`` (``auth.tokens``, compared as bytes)."""


def redact(text: str) -> str:
    """``text`` with every secret value loaded so far replaced by ``***``."""
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, "***")
    return text


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Redact secret values in every record the logger's handlers write."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, _RedactFilter) for f in handler.filters):
            handler.addFilter(_RedactFilter())
