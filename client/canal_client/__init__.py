"""canal-ha client: connectors, CLI consumer and the Spark source."""
