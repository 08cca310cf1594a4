"""canal-ha server: binlog reading, store, batches, REST API and the node."""
