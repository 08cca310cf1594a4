"""Private MariaDB (primary, optional GTID standby) and etcd for tests, demos and `canal-ha up`."""

from canal_ha.sandbox.etcd import EtcdCluster, EtcdMember
from canal_ha.sandbox.mariadb import MariaDBServer
from canal_ha.sandbox.process import ManagedProcess, ProcessRecord
from canal_ha.sandbox.sandbox import STATE_FILE, Sandbox
from canal_ha.sandbox.tls import ServerTls

__all__ = [
    "STATE_FILE",
    "EtcdCluster",
    "EtcdMember",
    "ManagedProcess",
    "MariaDBServer",
    "ProcessRecord",
    "Sandbox",
    "ServerTls",
]
