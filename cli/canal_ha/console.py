"""Printing that never breaks cleanup: a closed stdout (e.g. `| tee` killed by the same
Ctrl-C) must not stop a command from stopping what it started."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["say"]


def say(*args: Any, **kwargs: Any) -> None:
    """``print`` that, once stdout is gone, sends the rest to /dev/null."""
    try:
        print(*args, **kwargs)
    except (BrokenPipeError, OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
