"""Client metadata of a destination (Canal's meta role): ``memory`` holds it,
``periodic`` (``PeriodicMetaManager``, extending the memory one) flushes it to etcd."""

from canal_server.meta.memory import (
    ClientMeta,
    MemoryMetaManager,
    MetaManager,
    MetaSnapshot,
    PositionRange,
)
from canal_server.meta.periodic import PeriodicMetaManager

__all__ = [
    "ClientMeta",
    "MemoryMetaManager",
    "MetaManager",
    "MetaSnapshot",
    "PeriodicMetaManager",
    "PositionRange",
]
