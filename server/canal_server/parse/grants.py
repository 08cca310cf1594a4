"""The database privileges a node's user needs, and the check that names a missing one.

``REQUIRED_GRANTS`` (MariaDB 10.5+ names; MySQL and older MariaDB say REPLICATION
CLIENT for BINLOG MONITOR), all on ``*.*``:

- ``REPLICATION SLAVE``: the binlog dump (``COM_BINLOG_DUMP``) of the reader and of the
  position finder's search by time.
- ``BINLOG MONITOR``: ``SHOW MASTER STATUS`` and ``SHOW BINARY LOGS`` (the finder, the
  binlog end in ``/v1/health``, the consumers' lag).

Nothing else is read with privileges: ``SHOW GLOBAL VARIABLES``, ``@@gtid_binlog_pos``
and ``BINLOG_GTID_POS()`` need none. A snapshot of tables needs ``SELECT`` on them
(which tables is known only from the filter, so it is not checked here).

``missing_grants(cursor)`` lists what the connected user lacks: REPLICATION SLAVE from
``SHOW GRANTS`` (a user holding roles is given the benefit of the doubt), BINLOG
MONITOR by trying ``SHOW MASTER STATUS`` (error 1227). ``grants_error`` words the
``BinlogConfigError`` with the ``GRANT`` statement that fixes it. ``SHOW GRANTS`` lines
carry password hashes: they are parsed, never repeated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pymysql

from canal_protocol.errors import BinlogConfigError

__all__ = [
    "ER_ACCESS_DENIED",
    "ER_PARSE_ERROR",
    "ER_SPECIFIC_ACCESS_DENIED",
    "REQUIRED_GRANTS",
    "binary_log_status",
    "grants_error",
    "missing_grants",
]

ER_ACCESS_DENIED = 1045  # wrong user/password (MariaDB also: insecure transport refused)
ER_SPECIFIC_ACCESS_DENIED = 1227  # "you need (at least one of) the X privilege(s)"
ER_PARSE_ERROR = 1064  # MySQL 8.4: SHOW MASTER STATUS is gone

REQUIRED_GRANTS: Mapping[str, str] = {
    "REPLICATION SLAVE": "the binlog dump",
    "BINLOG MONITOR": "SHOW MASTER STATUS / SHOW BINARY LOGS",
}
_REPLICATION = {"REPLICATION SLAVE", "REPLICATION REPLICA", "ALL PRIVILEGES", "ALL"}
_GLOBAL = re.compile(r"^GRANT (?P<privs>.+?) ON \*\.\* TO ", re.IGNORECASE)
_ROLE = re.compile(r"^GRANT [`'\"][^`'\"]+[`'\"] TO ", re.IGNORECASE)


def binary_log_status(cur: Any) -> tuple[Any, ...] | None:
    """The row of ``SHOW BINARY LOG STATUS`` (MySQL 8.2+), else of ``SHOW MASTER STATUS``
    (MariaDB, MySQL before 8.4): File, Position, ... and on MySQL Executed_Gtid_Set."""
    try:
        cur.execute("SHOW BINARY LOG STATUS")
    except pymysql.err.ProgrammingError as exc:
        if not exc.args or exc.args[0] != ER_PARSE_ERROR:
            raise
        cur.execute("SHOW MASTER STATUS")
    row = cur.fetchone()
    return tuple(row) if row else None


def _user_of(cur: Any) -> str:
    cur.execute("SELECT CURRENT_USER()")
    name, _, host = str(cur.fetchone()[0]).rpartition("@")
    return f"'{name}'@'{host}'"


def missing_grants(cur: Any) -> list[str]:
    """The required privileges the connected user lacks (names as this server says)."""
    cur.execute("SELECT VERSION()")
    mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
    cur.execute("SHOW GRANTS")
    privileges: set[str] = set()
    roles = False
    for row in cur.fetchall():
        line = str(row[0])
        m = _GLOBAL.match(line)
        if m is not None:
            privileges.update(p.strip().upper() for p in m.group("privs").split(","))
        elif _ROLE.match(line):
            roles = True
    missing = []
    if not privileges & _REPLICATION and not roles:
        missing.append("REPLICATION SLAVE")
    try:
        binary_log_status(cur)
    except pymysql.err.OperationalError as exc:
        if not exc.args or exc.args[0] != ER_SPECIFIC_ACCESS_DENIED:
            raise
        missing.append("BINLOG MONITOR" if mariadb else "REPLICATION CLIENT")
    return missing


def grants_error(cur: Any, missing: list[str], address: str) -> BinlogConfigError:
    """The error naming the user, what it lacks, why, and the GRANT that fixes it."""
    user = _user_of(cur)
    lacks = " and ".join(
        f"{p} (for {REQUIRED_GRANTS.get(p, REQUIRED_GRANTS['BINLOG MONITOR'])})" for p in missing
    )
    return BinlogConfigError(
        f"database user {user} on {address} lacks {lacks}: run "
        f"GRANT {', '.join(missing)} ON *.* TO {user} (docs/security.md)"
    )
