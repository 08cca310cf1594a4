"""Synthetic Entries for the unit tests of the filter, store and embedded server."""

from __future__ import annotations

from canal_protocol.entry import Column, Entry, EntryType, EventType, Header, RowChange, RowImages
from canal_protocol.positions import LogIdentity, LogPosition

__all__ = ["IDENTITY", "EntryFactory", "position_of"]

IDENTITY = LogIdentity("127.0.0.1:3306", 1001)


class EntryFactory:
    """Entries with strictly increasing binlog offsets, like a reader produces."""

    def __init__(self, journal: str = "mariadb-bin.000001", server_id: int = 1) -> None:
        self.journal = journal
        self.server_id = server_id
        self.offset = 4
        self.gtid_seq = 0
        self.timestamp_ms = 1_700_000_000_000

    def entry(
        self,
        type: EntryType = EntryType.ROWDATA,
        schema: str = "db",
        table: str = "t",
        event_type: EventType = EventType.INSERT,
        *,
        value: str = "v",
        is_ddl: bool = False,
        sql: str = "",
    ) -> Entry:
        start = self.offset
        self.offset += 100
        self.timestamp_ms += 1000
        rows: tuple[RowChange, ...] = ()
        if type is EntryType.ROWDATA and not is_ddl:
            cols = (
                Column("id", start, True, True, "int", False),
                Column("v", value, False, True, "varchar(255)", False),
            )
            rows = (RowChange(after=cols),)
        header = Header(
            self.journal,
            start,
            self.offset,
            self.server_id,
            self.timestamp_ms,
            f"0-{self.server_id}-{self.gtid_seq}",
            schema if type is EntryType.ROWDATA else "",
            table if type is EntryType.ROWDATA else "",
            event_type,
        )
        images = RowImages.from_changes(rows)
        return Entry(type, header, is_ddl, sql, images, f"0-{self.server_id}-{self.gtid_seq}")

    def tx(self, schema: str = "db", table: str = "t", rows: int = 1) -> list[Entry]:
        """BEGIN, ``rows`` ROWDATA entries on schema.table, END."""
        self.gtid_seq += 1
        begin = self.entry(EntryType.TRANSACTIONBEGIN, event_type=EventType.GTID)
        body = [self.entry(schema=schema, table=table, value=f"r{i}") for i in range(rows)]
        end = self.entry(EntryType.TRANSACTIONEND, event_type=EventType.XACOMMIT)
        return [begin, *body, end]

    def ddl(self, schema: str = "db", table: str = "t", sql: str = "ALTER TABLE t") -> Entry:
        self.gtid_seq += 1
        return self.entry(
            schema=schema, table=table, event_type=EventType.ALTER, is_ddl=True, sql=sql
        )

    def rows(self, n: int, schema: str = "db", table: str = "t") -> list[Entry]:
        """``n`` bare ROWDATA entries (for store tests that ignore transactions)."""
        return [self.entry(schema=schema, table=table, value=f"x{i}") for i in range(n)]


def position_of(entry: Entry) -> LogPosition:
    return LogPosition(IDENTITY, entry.position())
