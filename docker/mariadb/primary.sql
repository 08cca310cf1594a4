-- Users canal-ha needs on the primary (replicated to the standby).
CREATE USER IF NOT EXISTS 'repl'@'%' IDENTIFIED BY 'repl-secret';
GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%';
CREATE USER IF NOT EXISTS 'canal'@'%' IDENTIFIED BY 'canal-secret';
GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR, SLAVE MONITOR ON *.* TO 'canal'@'%';
CREATE DATABASE IF NOT EXISTS shop;
