"""canal-ha client: connectors, CLI consumer and the Spark source.

::

    from canal_client import ClusterConnector

    with ClusterConnector("example", "1001", etcd=["http://127.0.0.1:2379"]) as conn:
        conn.subscribe("shop\\..*")
        batch = conn.get_without_ack(1000, timeout_s=1.0)
        ...  # process batch.entries
        conn.ack(batch.id)

Importing this package pulls none of the server's dependencies (mysql-replication,
FastAPI, uvicorn). The wire model (``Batch``, ``Entry``, ...) is ``canal_protocol``'s,
re-exported here.
"""

from canal_client.connector import ClusterConnector, Connector, SimpleConnector
from canal_client.stream import BatchStream
from canal_protocol import Batch, Column, Entry, EntryType, Header, RowChange

__all__ = [
    "Batch",
    "BatchStream",
    "ClusterConnector",
    "Column",
    "Connector",
    "Entry",
    "EntryType",
    "Header",
    "RowChange",
    "SimpleConnector",
]
