"""canal-ha server: ``parse`` (binlog → entries, position finding), ``sink``, ``store``,
``meta``, ``embedded`` (batches), ``instance``/``node`` and the REST API
(docs/architecture.md, "Package map")."""
