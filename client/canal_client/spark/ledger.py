"""The Spark reader's ledger: entries taken from the leader but not yet committed by
Spark, in binlog order, with the server batches they came in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from canal_client.packed import PackedEntry
from canal_client.spark.rows import entry_timestamp_ms
from canal_protocol.ordering import MIN_KEY, READ_PLACE, EntryKey, entry_key, gtid_order

__all__ = ["Classify", "Item", "Ledger", "all_rows"]


@dataclass(frozen=True)
class Item:
    key: EntryKey
    timestamp_ms: int
    rows: int = 0  # Spark rows the entry gives in this query's mode
    data: memoryview | None = None  # its msgpack bytes, when it gives rows
    change: str = ""  # typed mode: how its table map differs from the query's schema
    loose: bool = False  # a snapshot entry or a BEGIN (``Offset.loose``)


Classify = Callable[[PackedEntry], tuple[int, str]]  # (Spark rows, schema change or "")


def all_rows(entry: PackedEntry) -> tuple[int, str]:
    """Map mode: every ROWDATA entry (a DDL is one row)."""
    if entry.type != "ROWDATA":
        return 0, ""
    return (1 if entry.is_ddl else entry.rows if entry.columns else 0), ""


def _event(key: EntryKey) -> tuple[str, str, int, int, int]:
    """What ``EntryKey.same_event`` compares: the database, binlog place, snapshot ordinal."""
    return key.source, key.file, key.pos, key.part, key.snap


@dataclass
class Ledger:
    """Entries after ``floor`` in binlog order, and the server batches they came in.

    Each entry's key gets the database of its batch (``source``) and its place in its
    transaction (``sub``): 0 for a BEGIN, the previous entry's + 1 when that one came
    just before it from the same database in the same transaction, the known place of
    an event seen before (an entry still held, or the floor), else unknown (-1)."""

    floor: EntryKey = MIN_KEY
    items: list[Item] = field(default_factory=list)
    batches: list[tuple[int, EntryKey]] = field(default_factory=list)  # fetch order
    prev: EntryKey | None = None  # the entry that arrived last (kept or not)
    _places: dict[tuple[str, str, int, int, int], int] | None = field(default=None, repr=False)

    @property
    def top(self) -> EntryKey:
        return self.items[-1].key if self.items else self.floor

    def covers(self, lo: EntryKey, hi: EntryKey) -> bool:
        return self.floor <= lo and hi <= self.top

    def _place(self, entry: PackedEntry, source: str) -> EntryKey:
        key = entry_key(entry, source)
        prev, sub = self.prev, -1
        if key.same_event(self.floor):
            sub = self.floor.sub
        elif (known := self._held(key)) is not None:
            sub = known
        elif key.snap:
            sub = self._read_place(key, source)
        elif entry.type == "TRANSACTIONBEGIN":
            sub = 0
        elif prev is not None and prev.sub >= 0 and key.gtid and prev.gtid == key.gtid:
            sub = prev.sub + 1 if prev.source == source and not prev.snap else -1
        if sub != key.sub:  # as ``replace(key, sub=sub)``, cheaper
            k = key
            key = EntryKey(
                k.base, k.number, k.pos, k.file, k.source, k.gtid, sub, k.end, k.snap, k.part
            )
        self.prev = key
        return key

    def _read_place(self, key: EntryKey, source: str) -> int:
        """A snapshot entry's place (across databases it sorts by its GTID state, then
        this, then its ordinal): after every entry of its state's transactions, as the
        entry before it when that one is of its chunk; one further than a snapshot entry
        of another database at the same state that it follows (a chunk read again after
        a switch: the ordinals of two databases' positions say nothing of each other, so
        it is kept, READ rows twice rather than lost)."""
        prev, top = self.prev, self.top
        if prev is not None and prev.snap and prev.source == source and prev.gtid == key.gtid:
            return prev.sub
        if top.snap and top.source and source and top.source != source:
            seqs = gtid_order(top.gtid, key.gtid)
            if seqs is not None and seqs[0] == seqs[1]:
                return max(top.sub, READ_PLACE) + 1
        return READ_PLACE

    def _held(self, key: EntryKey) -> int | None:
        """The place of the same event among the entries held (a delivery again)."""
        if not self.items or not key.source or key > self.top:
            return None
        if self._places is None:  # after a release or a reset
            self._places = {_event(i.key): i.key.sub for i in self.items}
        return self._places.get(_event(key))

    def add(
        self,
        batch_id: int,
        entries: Sequence[PackedEntry],
        classify: Classify = all_rows,
        source: str = "",
    ) -> int:
        """Append the entries after ``top`` (others were delivered before); count them.
        ``source``: the database the batch was read from (its ``end``'s identity)."""
        added, last = 0, MIN_KEY
        for entry in entries:
            key = self._place(entry, source)
            last = max(last, key)
            if key > self.top:
                rows, change = classify(entry)
                data = entry.data if rows else None
                loose = key.snap > 0 or entry.type == "TRANSACTIONBEGIN"
                self.items.append(Item(key, entry_timestamp_ms(entry), rows, data, change, loose))
                if self._places is not None:
                    self._places[_event(key)] = key.sub
                added += 1
        self.batches = [b for b in self.batches if b[0] != batch_id] + [(batch_id, last)]
        return added

    def between(self, lo: EntryKey, hi: EntryKey) -> list[Item]:
        return [it for it in self.items if lo < it.key <= hi]

    def batch_ids(self, lo: EntryKey, hi: EntryKey) -> list[int]:
        """Ids of the tracked batches ending in ``(lo, hi]``, fetch order."""
        return [bid for bid, last in self.batches if lo < last <= hi]

    def release(self, upto: EntryKey) -> int | None:
        """Forget everything at or before ``upto``; the batch id to ack, if any."""
        done = [bid for bid, last in self.batches if last <= upto]
        self.batches = [b for b in self.batches if b[1] > upto]
        self.items = [it for it in self.items if it.key > upto]
        self._places = None
        self.floor = max(self.floor, upto)
        return done[-1] if done else None

    def reset(self, floor: EntryKey, exact: bool = False) -> None:
        """Forget everything; ``floor`` is committed. ``exact``: the next entry delivered
        is the one right after ``floor`` (the cursor was moved to it)."""
        self.floor, self.items, self.batches, self._places = floor, [], [], None
        self.prev = floor if exact else None
