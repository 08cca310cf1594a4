"""canal-ha coordination: the abstract ``Coordinator`` and its etcd implementation, the
etcd key layout, the running monitors (elections, epochs, fencing) and ``RetryPolicy``.
Imports only ``canal_protocol`` of ours (docs/architecture.md, "Package map")."""
