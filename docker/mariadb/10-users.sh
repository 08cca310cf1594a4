# canal-ha's users on the primary (and, the same, on the standby before it replicates),
# passwords from the mounted secret files. Sourced by the mariadb image's entrypoint on
# the first start (docker_process_sql runs SQL as root). The grants are exactly what a
# canal-ha node needs (docs/security.md): REPLICATION SLAVE and BINLOG MONITOR, plus
# SELECT on the captured schema for snapshots.
repl_password=$(cat "${SECRETS_DIR:-/run/secrets}/repl_password")
canal_password=$(cat "${SECRETS_DIR:-/run/secrets}/canal_db_password")
docker_process_sql <<EOSQL
CREATE USER IF NOT EXISTS 'repl'@'%' IDENTIFIED BY '${repl_password}';
GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%';
CREATE USER IF NOT EXISTS 'canal'@'%' IDENTIFIED BY '${canal_password}';
GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'canal'@'%';
CREATE DATABASE IF NOT EXISTS shop;
GRANT SELECT ON shop.* TO 'canal'@'%';
EOSQL
unset repl_password canal_password
