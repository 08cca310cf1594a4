"""The every-type table through the snapshot's chunk reader gives the same values, types
and key flags as through the binlog path (tests/test_every_type.py's table)."""

from __future__ import annotations

from reader_fixtures import db  # noqa: F401  (fixture)
from test_every_type import COLUMNS, ROWS, _read

from canal_ha.sandbox import Sandbox
from canal_protocol.positions import EntryPosition
from canal_server.parse.snapshot import ChunkReader

DB = "t_snap_types"


def test_every_type_through_the_snapshot_equals_the_binlog(db: Sandbox) -> None:  # noqa: F811
    db.primary.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    journal, offset = db.primary.master_status()
    extra = (
        "(5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        " 1.2345678, 0.30000000000000004, NULL, NULL, NULL, NULL, NULL,"
        " '1970-01-01 00:00:00', NULL, 'pad  ', NULL, NULL, NULL, x'ff', NULL, NULL, NULL,"
        " NULL, 'x,y,z', b'111111111111', NULL)"
    )
    with db.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"CREATE TABLE {DB}.t ({COLUMNS}) DEFAULT CHARSET=utf8mb4")
        cur.execute(f"INSERT INTO {DB}.t VALUES {', '.join([*ROWS, extra])}")
    entries = _read(db, EntryPosition(journal=journal, offset=offset), 5, 6203)
    (insert,) = entries
    assert insert.images is not None
    binlog = {row[0]: row for row in insert.images.after}
    with ChunkReader(db.primary.dsn()) as reader:
        shape = reader.shape(DB, "t")
        chunk = reader.read(shape, None, 1000)
    assert shape.columns == insert.images.columns  # names, mysql types, key flags
    snap = {row[0]: row for row in chunk.rows}
    assert set(snap) == set(binlog) == {1, 2, 3, 4, 5}
    for rid, row in binlog.items():
        for name, ours, theirs in zip(shape.columns.names, snap[rid], row, strict=True):
            assert (type(ours), ours) == (type(theirs), theirs), (rid, name)
    db.primary.execute(f"DROP DATABASE IF EXISTS {DB}")
