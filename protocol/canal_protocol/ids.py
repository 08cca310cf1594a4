"""The one rule for ids: destination, client, node and snapshot ids.

An id is 1 to ``ID_MAX_LEN`` characters of ``ID_ALPHABET`` (letters, digits, ``_``,
``.``, ``-``) and is neither ``.`` nor ``..`` (URLs and key paths resolve those away:
no client could name such an id). Every layer checks ids with ``validate_id``: the etcd
key layout (``canal_cluster.keys``), the config, the REST API (and its OpenAPI schema,
``ID_JSON_PATTERN``) and the command line.
"""

from __future__ import annotations

import re

from canal_protocol.errors import InvalidArgument

__all__ = [
    "ID_ALPHABET",
    "ID_JSON_PATTERN",
    "ID_MAX_LEN",
    "ID_RULE",
    "is_id",
    "validate_id",
]

ID_ALPHABET = "A-Za-z0-9_.-"  # as a regex character class's body
ID_MAX_LEN = 64
ID_RULE = f"[{ID_ALPHABET}]{{1,{ID_MAX_LEN}}}, not . or .."
# The rule as a JSON Schema pattern (ECMA-262, which has look-ahead) for the OpenAPI.
ID_JSON_PATTERN = rf"^(?!\.\.?$)[{ID_ALPHABET}]{{1,{ID_MAX_LEN}}}$"

_ID = re.compile(f"[{ID_ALPHABET}]{{1,{ID_MAX_LEN}}}")
_DOT_IDS = frozenset({".", ".."})


def is_id(value: object) -> bool:
    """``value`` follows the id rule."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None and value not in _DOT_IDS


def validate_id(value: object, field: str) -> str:
    """``value`` if it is a valid id, else ``InvalidArgument(field, ...)``."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        shown = value[:80] if isinstance(value, str) else value  # a bounded, escaped echo
        raise InvalidArgument(field, f"must match [{ID_ALPHABET}]{{1,{ID_MAX_LEN}}}, got {shown!r}")
    if value in _DOT_IDS:  # path segments that URLs and key paths resolve away
        raise InvalidArgument(field, f"must not be {value!r}")
    return value
