-- The standby is a GTID replica of the primary (MASTER_USE_GTID=slave_pos).
CHANGE MASTER TO MASTER_HOST='mariadb-primary', MASTER_PORT=3306,
  MASTER_USER='repl', MASTER_PASSWORD='repl-secret',
  MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1;
START SLAVE;
