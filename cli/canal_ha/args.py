"""Argument types and exit codes shared by the command modules."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["EXIT_OK", "EXIT_RUNTIME", "EXIT_USAGE", "positive_int"]

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be >= 0, not {value}")
        return value

    return parse
