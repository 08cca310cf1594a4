"""Fixtures for the binlog reader tests (test_binlog_stream, test_reader, test_every_type)."""

from __future__ import annotations

import gc
import warnings

import pytest

from canal_ha.sandbox import Sandbox

__all__ = ["collect_leaked_sockets", "db"]


@pytest.fixture
def db(sandbox: Sandbox) -> Sandbox:
    """The session sandbox, after collecting sockets its start-up leaked.

    Starting the standby leaves unclosed unix sockets in reference cycles; if the
    garbage collector finds them during a test, their ResourceWarning (an error under
    ``filterwarnings = error``) fails that test. Collect them here, quietly.
    """
    collect_leaked_sockets()
    return sandbox


def collect_leaked_sockets() -> None:
    """Collect garbage with ResourceWarnings silenced (see ``db``); call it at the
    end of a test that started a private sandbox."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
