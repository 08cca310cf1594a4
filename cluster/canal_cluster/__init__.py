"""canal-ha coordination: etcd, election, sandbox and the command line."""
