"""The `canal-ha` command line on top of the packages: `up`/`down`/`demo` (the sandbox),
`server`, `consume` and `status`; and the sandbox itself (``canal_ha.sandbox``)."""
