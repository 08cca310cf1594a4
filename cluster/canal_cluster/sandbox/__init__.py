"""Private MariaDB (primary, optional GTID standby) and etcd for tests, demos and `canal-ha up`."""

from canal_cluster.sandbox.etcd import EtcdCluster, EtcdMember
from canal_cluster.sandbox.mariadb import MariaDBServer
from canal_cluster.sandbox.process import ManagedProcess, ProcessRecord
from canal_cluster.sandbox.sandbox import STATE_FILE, Sandbox

__all__ = [
    "STATE_FILE",
    "EtcdCluster",
    "EtcdMember",
    "ManagedProcess",
    "MariaDBServer",
    "ProcessRecord",
    "Sandbox",
]
