# The standby is a GTID replica of the primary (MASTER_USE_GTID=slave_pos); the
# replication password comes from the mounted secret file. Sourced by the mariadb
# image's entrypoint on the first start.
repl_password=$(cat "${SECRETS_DIR:-/run/secrets}/repl_password")
docker_process_sql <<EOSQL
CHANGE MASTER TO MASTER_HOST='mariadb-primary', MASTER_PORT=3306,
  MASTER_USER='repl', MASTER_PASSWORD='${repl_password}',
  MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1;
START SLAVE;
EOSQL
unset repl_password
