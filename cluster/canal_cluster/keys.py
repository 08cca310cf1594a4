"""The etcd key layout of docs/architecture.md, under a configurable prefix (default ``/canal``).

::

    {p}/cluster/{node}                              node record, node lease
    {p}/destinations/{d}/running                    leader record, leader lease
    {p}/destinations/{d}/handover                   successor named by a handover, short lease
    {p}/destinations/{d}/cluster/{node}             nodes able to serve d, node lease
    {p}/destinations/{d}/{client}/running           active consumer of that client id
    {p}/destinations/{d}/{client}/subscription      filter
    {p}/destinations/{d}/{client}/cursor            last acked position
    {p}/destinations/{d}/{client}/mark/{batch:020}  outstanding batch
    {p}/destinations/{d}/snapshots/{id}             incremental snapshot progress

Every id is checked by the one id rule, ``canal_protocol.ids.validate_id``
(``InvalidArgument`` naming the field), so nothing a caller sends can escape its prefix.
Client ids ``cluster``, ``running`` and ``snapshots`` are refused: they would alias the
destination's own keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from canal_protocol.errors import ConfigError, InvalidArgument
from canal_protocol.ids import ID_ALPHABET, validate_id

# validate_id: the one id rule, re-exported for the layers above (canal_protocol.ids)
__all__ = ["DEFAULT_PREFIX", "Keys", "validate_id"]

DEFAULT_PREFIX = "/canal"
_PREFIX = re.compile(f"(/[{ID_ALPHABET}]+)+")
_RESERVED_CLIENT_IDS = frozenset({"cluster", "running", "snapshots"})


def _client_id(client: object) -> str:
    cid = validate_id(client, "client_id")
    if cid in _RESERVED_CLIENT_IDS:
        raise InvalidArgument("client_id", f"{cid!r} is reserved")
    return cid


@dataclass(frozen=True)
class Keys:
    """Builds every key of the layout; ``prefix`` like ``/canal`` (no trailing slash)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if _PREFIX.fullmatch(self.prefix) is None:
            raise ConfigError("etcd.prefix", f"must look like /canal (got {self.prefix!r})")

    # -- nodes --------------------------------------------------------------------

    def nodes_prefix(self) -> str:
        return f"{self.prefix}/cluster/"

    def node(self, node: str) -> str:
        return f"{self.nodes_prefix()}{validate_id(node, 'node')}"

    # -- destinations -------------------------------------------------------------

    def destination_prefix(self, destination: str) -> str:
        return f"{self.prefix}/destinations/{validate_id(destination, 'destination')}/"

    def running(self, destination: str) -> str:
        """The leader record of ``destination``."""
        return f"{self.destination_prefix(destination)}running"

    def handover(self, destination: str) -> str:
        """The successor a leader named when it handed ``destination`` over (RunningMonitor)."""
        return f"{self.destination_prefix(destination)}handover"

    def origin(self, destination: str) -> str:
        """Where the destination's history starts (the first leader's start position)."""
        return f"{self.destination_prefix(destination)}origin"

    def destination_nodes_prefix(self, destination: str) -> str:
        return f"{self.destination_prefix(destination)}cluster/"

    def destination_node(self, destination: str, node: str) -> str:
        return f"{self.destination_nodes_prefix(destination)}{validate_id(node, 'node')}"

    # -- clients ------------------------------------------------------------------

    def client_prefix(self, destination: str, client: str) -> str:
        return f"{self.destination_prefix(destination)}{_client_id(client)}/"

    def client_running(self, destination: str, client: str) -> str:
        """The active consumer record of (destination, client id)."""
        return f"{self.client_prefix(destination, client)}running"

    def subscription(self, destination: str, client: str) -> str:
        return f"{self.client_prefix(destination, client)}subscription"

    def cursor(self, destination: str, client: str) -> str:
        return f"{self.client_prefix(destination, client)}cursor"

    def marks_prefix(self, destination: str, client: str) -> str:
        return f"{self.client_prefix(destination, client)}mark/"

    def mark(self, destination: str, client: str, batch_id: int) -> str:
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise InvalidArgument("batch_id", f"must be an int >= 0, got {batch_id!r}")
        return f"{self.marks_prefix(destination, client)}{batch_id:020d}"

    # -- parsing ------------------------------------------------------------------

    def client_ids(self, destination: str, keys: list[str]) -> list[str]:
        """Client ids found among ``keys`` read under the destination prefix (sorted)."""
        base = self.destination_prefix(destination)
        found: set[str] = set()
        for key in keys:
            if not key.startswith(base):
                continue
            parts = key[len(base) :].split("/")
            if len(parts) >= 2 and parts[0] not in _RESERVED_CLIENT_IDS:
                found.add(parts[0])
        return sorted(found)

    @staticmethod
    def batch_id_of(mark_key: str) -> int:
        """The batch id at the end of a mark key."""
        tail = mark_key.rsplit("/", 1)[-1]
        if not tail.isdigit():
            raise InvalidArgument("mark_key", f"not a mark key: {mark_key!r}")
        return int(tail)
