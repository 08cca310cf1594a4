"""Canal's TCP protocol on a node: what an existing Canal client talks to.

``convert`` turns canal-ha's entries (``canal_protocol.entry``) into Canal's protobuf
``Entry`` bytes (``canal_protocol.canal.entry_pb2``), with ``types`` (a column's
``java.sql.Types`` code and ``mysqlType`` text) and ``values`` (a value's text form)
following Canal's ``LogEventConvert`` / ``RowsLogBuffer``. The rules are written down
in docs/canal-protocol.md ("Entries and values").
"""
