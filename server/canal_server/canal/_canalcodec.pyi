"""Type stub of the C encoder of Canal's entries (server/canal_server/canal/_canalcodec.c)."""

from collections.abc import Callable, Sequence
from typing import Any

KINDS: int

class Plan:
    def __init__(self, spec: tuple[tuple[Any, ...], ...], /) -> None: ...

class Encoder:
    def __init__(
        self,
        begin: object,
        rowdata: object,
        end: object,
        heartbeat: object,
        entry_codes: dict[Any, int],
        event_codes: dict[Any, int],
        rows_heads: dict[Any, bytes],
        canal_gtid: Callable[[str, str], str],
        plan_of: Callable[[Any], Plan],
        packed_type: type,
        fallback: Callable[[Any], bytes | None],
        unpackb: Callable[[bytes], Any],
    ) -> None: ...
    def encode(self, entries: Sequence[Any], /) -> list[bytes]: ...
