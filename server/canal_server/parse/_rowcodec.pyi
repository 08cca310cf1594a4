"""Type stub of the C row decoder (server/canal_server/_rowcodec.c)."""

from collections.abc import Callable

Spec = tuple[tuple[int, int, int, tuple[str, ...]], ...]
Value = int | float | str | bytes | None

def compile(spec: Spec, /) -> object: ...
def decode(
    codec: object,
    data: bytes,
    pos: int,
    end: int,
    images_per_row: int,
    slow: Callable[[int, bytes], Value],
    /,
) -> list[tuple[Value, ...]]: ...
def pack(
    codec: object,
    data: bytes,
    pos: int,
    end: int,
    images_per_row: int,
    after: bool,
    release_gil: bool,
    /,
) -> tuple[int, bytes, bytes] | None: ...
