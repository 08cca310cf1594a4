"""The C encoder of Canal's entries (canal_server.canal._canalcodec) writes the Python
encoder's bytes, byte for byte, or raises its error: on random tables of every column
type with random values (edge values, NULLs, values of the wrong type), row images as
tuples and as the store's msgpack bytes, random headers, GTIDs, forms and time zones."""

from __future__ import annotations

import datetime
import os
import threading
import time
import zoneinfo
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canal_protocol.entry import Entry, EntryType, EventType, Header, RowImages, TableColumns
from canal_server.canal import _native, convert
from canal_server.canal.convert import encode_entries, encode_entries_python
from canal_server.canal.types import CanalForm
from canal_server.packed import PackedRows, pack_columns

pytestmark = pytest.mark.skipif(not _native.HAVE_NATIVE, reason="the C encoder is not built")

UUID = "93e95066-a2f4-11ec-9b69-9657f0ae95e2"
FORMS = [
    CanalForm(datetime.UTC),
    CanalForm(datetime.timezone(datetime.timedelta(hours=8))),
    CanalForm(datetime.timezone(datetime.timedelta(hours=-3, minutes=-30)), widths=False),
    CanalForm(zoneinfo.ZoneInfo("America/New_York")),  # the text function per value
    CanalForm(),  # the process's local zone
]

# -- values ---------------------------------------------------------------------------------


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [lo, hi, 0, 1, -1, hi // 2, hi // 2 + 1]
    return st.one_of(st.sampled_from([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))


def _texts(fraction: int) -> st.SearchStrategy[str]:
    """canal-ha's ``HH:MM:SS[.f]`` / date texts are passed through: any text will do."""
    return st.one_of(
        st.text(max_size=12), st.sampled_from(["-838:59:59", "00:00:00.5" + "0" * fraction])
    )


def _datetime_text(zone_suffix: str) -> st.SearchStrategy[str]:
    """``YYYY-MM-DDTHH:MM:SS[.f]`` (+ ``Z`` for TIMESTAMP), years unpadded below 1000 as
    the reader may give them, zero dates, out-of-range fields, odd shapes."""

    @st.composite
    def make(draw: st.DrawFn) -> str:
        year = draw(st.one_of(st.integers(1, 9999), st.integers(1969, 2039), st.just(0)))
        month, day = draw(st.integers(0, 13)), draw(st.integers(0, 32))
        hms = [draw(st.integers(0, 60)) for _ in range(3)]
        text = draw(st.sampled_from([f"{year:04d}", str(year)]))
        text += f"-{month:02d}-{day:02d}T{hms[0]:02d}:{hms[1]:02d}:{hms[2]:02d}"
        frac = draw(st.sampled_from(["", ".5", ".000100", ".123456"]))
        return draw(
            st.sampled_from(
                [text + frac + zone_suffix, "0000-00-00T00:00:00" + frac + zone_suffix,
                 text + frac + "ZZ", text + "xyz" + frac + zone_suffix]
            )
        )  # fmt: skip

    return st.one_of(make(), st.text(max_size=25))


_LATIN1 = st.binary(max_size=40) | st.just(bytes(range(256)))
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=10,
)
# a value of the wrong type for its column: the two encoders agree on it, or on the error
_JUNK = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(), st.booleans(), st.text(max_size=6),
    st.binary(max_size=6), st.lists(st.integers(), max_size=2), st.just("a\ud800"),
)  # fmt: skip

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "tinyint": _ints(-128, 127),
    "tinyint unsigned": _ints(0, 255),
    "smallint": _ints(-32768, 32767),
    "smallint unsigned": _ints(0, 65535),
    "mediumint": _ints(-8388608, 8388607),
    "mediumint unsigned": _ints(0, 16777215),
    "int": _ints(-(2**31), 2**31 - 1),
    "int unsigned": _ints(0, 2**32 - 1),
    "bigint": _ints(-(2**63), 2**63 - 1),
    "bigint unsigned": _ints(0, 2**64 - 1),
    "decimal(10,2)": st.sampled_from(["-0.00", "0.00", "-0.50", "12345678.90", "-.0", "-"])
    | st.decimals(allow_nan=False, allow_infinity=False, places=2).map(str),
    "decimal(65,30)": st.just("0.000000000000000000000000000001"),
    "float": st.floats(width=32),
    "double": st.floats(),
    "bit(1)": _ints(0, 1),
    "bit(64)": _ints(0, 2**64 - 1),
    "date": _texts(0),
    "time(6)": _texts(6),
    "datetime": _datetime_text(""),
    "datetime(6)": _datetime_text(""),
    "timestamp": _datetime_text("Z"),
    "timestamp(3)": _datetime_text("Z"),
    "year": st.sampled_from([0, 1901, 2155, 99]),
    "char(10)": st.text(max_size=10),
    "varchar(300)": st.text(max_size=80) | st.just("é" * 200),
    "text": st.text(),
    "longtext": st.text(),  # MariaDB's JSON
    "binary(4)": st.binary(min_size=4, max_size=4) | st.just(b"A\x00\x00\x00"),
    "varbinary(16)": _LATIN1,
    "blob": _LATIN1,
    "geometry": _LATIN1,
    "point": _LATIN1,
    "enum('a','b','it''s','é','a')": st.sampled_from(["a", "b", "it's", "é", "", "zz", "A"]),
    "set('x','y','z','é')": st.lists(
        st.sampled_from(["x", "y", "z", "é", "", "q"]), max_size=5
    ).map(",".join),
    "type245": st.text(max_size=20) | _JSON,  # MySQL's JSON: text or the reader's structure
    "some_new_type": st.text(max_size=5) | st.integers(),
}
TYPES = sorted(VALUES)


def _value(draw: st.DrawFn, mysql_type: str, junk: bool) -> Any:
    roll = draw(st.integers(0, 19))
    if roll < 3:
        return None
    if roll == 3 and junk:
        return draw(_JUNK)
    return draw(VALUES[mysql_type])


# -- entries --------------------------------------------------------------------------------


@st.composite
def tables(draw: st.DrawFn) -> TableColumns:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=24))
    names = tuple(draw(st.sampled_from(["id", "c", "nâme", "x" * 130, ""])) + str(i)
                  for i in range(len(types)))  # fmt: skip
    keys = tuple(draw(st.booleans()) for _ in types)
    return TableColumns(names, tuple(types), keys)


def _gtid_pair(draw: st.DrawFn) -> tuple[str, str]:
    """(the entry's gtid, the state before it): MariaDB one and several domains, MySQL."""
    n = draw(st.integers(1, 2**40))
    return draw(st.sampled_from([
        (f"0-1-{n}", f"0-1-{n - 1}"), (f"0-1-{n}", f"0-1-{n - 1},1-2-3"), (f"0-1-{n}", ""),
        ("", f"0-1-{n}"), (f"0-1-{n}", f"0-1-{n}"), (f"{UUID}:{n}", f"{UUID}:1-{n - 1}"),
        (f"{UUID}:{n}", ""), ("", ""), ("1-1-1", "0-1-5"),
    ]))  # fmt: skip


def _header(draw: st.DrawFn, event_type: EventType, gtid: str) -> Header:
    offset = draw(st.integers(0, 2**40))
    return Header(
        draw(st.sampled_from(["mariadb-bin.000001", "binlog.000042", "bïn.1", ""])),
        offset,
        draw(st.sampled_from([offset + 57, offset, 0, offset + 2**20])),
        draw(st.sampled_from([0, 1, 2**32 - 1])),
        draw(st.sampled_from([0, 1_700_000_000_000, 2**45])),
        gtid,
        draw(st.sampled_from(["shop", "", "schéma"])),
        draw(st.sampled_from(["t", "", "tâble"])),
        event_type,
        draw(st.sampled_from([0, 0, 0, 3, 2**40])),
    )


def _images(
    draw: st.DrawFn, columns: TableColumns, kind: EventType, packed: bool, junk: bool
) -> Any:
    n = draw(st.integers(0, 5))

    def image() -> tuple[Any, ...]:
        if junk and draw(st.integers(0, 40)) == 0:  # a row of the wrong width
            return tuple(_value(draw, t, junk) for t in columns.mysql_types[:-1])
        return tuple(_value(draw, t, junk) for t in columns.mysql_types)

    before: tuple[tuple[Any, ...], ...] = ()
    after: tuple[tuple[Any, ...], ...] = ()
    if kind in (EventType.UPDATE, EventType.DELETE):
        before = tuple(image() for _ in range(n))
    if kind is not EventType.DELETE:
        extra = 1 if junk and kind is EventType.UPDATE and draw(st.integers(0, 9)) == 0 else 0
        after = tuple(image() for _ in range(n + extra))
    unchanged: bool = draw(st.booleans())  # columns left as they were
    if kind is EventType.UPDATE and len(after) > 0 and unchanged:
        kept: list[tuple[Any, ...]] = []
        for a_row, b_row in zip(after, before + after, strict=False):
            keep: bool = draw(st.booleans())
            kept.append(tuple(b if keep else a for a, b in zip(a_row, b_row, strict=False)))
        after = tuple(kept)
    if not packed:
        return RowImages(columns, before, after)
    pack = msgpack.Packer(use_bin_type=True).pack
    try:
        return PackedRows(columns, max(len(before), len(after)), pack(list(before)),
                          pack(list(after)), pack_columns(columns))  # fmt: skip
    except (TypeError, ValueError, OverflowError):  # msgpack cannot hold this value
        return RowImages(columns, before, after)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[Entry], bool]:
    """Entries of one table, and whether values of the wrong type (junk) are among them."""
    columns = draw(tables())
    junk = draw(st.integers(0, 3)) == 0
    out = []
    for _ in range(draw(st.integers(1, 6))):
        gtid, state = _gtid_pair(draw)
        which = draw(st.integers(0, 9))
        if which == 0:
            thread_id = draw(st.sampled_from([0, 8, 2**32, 2**63, -1]))
            header = _header(draw, EventType.GTID, gtid)
            out.append(Entry(EntryType.TRANSACTIONBEGIN, header, gtid_state=state,
                             thread_id=thread_id))  # fmt: skip
        elif which == 1:
            xid = draw(st.sampled_from([0, 77, 2**64 - 1, 2**70, -5]))
            header = _header(draw, EventType.QUERY, gtid)
            out.append(Entry(EntryType.TRANSACTIONEND, header, gtid_state=state, xid=xid))
        elif which == 2:
            kind = draw(st.sampled_from([EventType.ALTER, EventType.QUERY, EventType.HEARTBEAT]))
            ddl = kind is not EventType.HEARTBEAT
            out.append(Entry(EntryType.ROWDATA, _header(draw, kind, gtid), is_ddl=ddl,
                             sql="ALTER TABLE t ADD c INT", gtid_state=state))  # fmt: skip
        else:
            kind = draw(st.sampled_from([EventType.INSERT, EventType.UPDATE, EventType.DELETE,
                                         EventType.READ]))  # fmt: skip
            packed = draw(st.booleans())
            images = None if which == 3 else _images(draw, columns, kind, packed, junk)
            out.append(Entry(EntryType.ROWDATA, _header(draw, kind, gtid), images=images,
                             gtid_state=state))  # fmt: skip
    return out, junk


def _outcome(encode: Callable[[list[Entry], CanalForm], list[bytes]], entries: list[Entry],
             form: CanalForm) -> Any:  # fmt: skip
    try:
        return encode(entries, form)
    except Exception as exc:  # the same error from both is the claim
        return (type(exc).__name__, str(exc))


@contextmanager
def _local_zone(name: str) -> Iterator[None]:
    """The process's local zone (TZ), as a node's: restored after."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


@contextmanager
def _handed_back() -> Iterator[list[Entry]]:
    """The entries the C encoder hands the Python encoder (new encoders, recording)."""
    seen: list[Entry] = []
    original = convert._encode_entry

    def record(entry: Entry, form: CanalForm) -> bytes | None:
        seen.append(entry)
        return original(entry, form)

    convert._encode_entry = record
    convert._encoders.clear()
    try:
        yield seen
    finally:
        convert._encode_entry = original
        convert._encoders.clear()


def _python_only(entry: Entry) -> bool:
    """An entry the C encoder leaves to the Python one though it is valid: a statement,
    a thread id or XID outside int64."""
    if entry.type is EntryType.ROWDATA:
        return entry.is_ddl or entry.header.event_type not in _ROWS
    return not -(2**63) <= (entry.thread_id or entry.xid) < 2**63


_ROWS = {EventType.INSERT, EventType.UPDATE, EventType.DELETE, EventType.READ}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches(), st.sampled_from(FORMS), st.sampled_from(["UTC", "America/New_York", "Asia/Kolkata"])
)
def test_the_c_encoder_writes_the_python_encoders_bytes(
    batch: tuple[list[Entry], bool], form: CanalForm, zone: str
) -> None:
    entries, junk = batch
    assert _native.use_native()
    with _local_zone(zone):
        with _handed_back() as handed:
            fast = _outcome(encode_entries, entries, form)
        reference = _outcome(encode_entries_python, entries, form)
    assert fast == reference
    if isinstance(reference, list) and not junk:
        # the C code wrote every entry it can: values of every type of the table
        assert [e for e in handed if not _python_only(e)] == []


def test_every_column_kind_is_written_in_c() -> None:
    """The plan gives every type of the property test a kind the C code writes itself
    (none calls the text function for every value), so the property test covers the C
    code of each; a TIMESTAMP's zone is the C library's, a fixed offset, or the text
    function's."""
    cols = TableColumns(tuple(TYPES), tuple(TYPES), (False,) * len(TYPES))
    kinds = {t: spec[0] for t, spec in zip(TYPES, _native.plan_spec(_wire_plan(cols)), strict=True)}
    called = {t for t, k in kinds.items() if k == _native.K_CALL}
    assert called == set()
    assert set(kinds.values()) == set(range(1, 16)) - {_native.K_CALL}
    zone_modes = {
        _native.plan_spec(_wire_plan(TableColumns(("t",), ("timestamp",), (False,)), f))[0][4]
        for f in FORMS
    }
    assert zone_modes == {_native.ZONE_LOCAL, _native.ZONE_FIXED, _native.ZONE_CALL}


def _wire_plan(columns: TableColumns, form: CanalForm = FORMS[0]) -> Any:
    from canal_server.canal import _wire

    return _wire.plan(columns, form)


def test_values_of_every_kind_from_msgpack_and_tuples() -> None:
    """A fixed row of edge values, as tuples and as msgpack bytes: the same bytes as the
    Python encoder, and the tuples and the msgpack the same as each other."""
    row: tuple[Any, ...] = (
        255, 2**64 - 1, -(2**63), "-0.00", 16777216.0, -0.0, 2**64 - 1, "0000-00-00",
        "-838:59:59.000000", "999-01-02T03:04:05", "2024-03-10T07:30:05.5Z", 0, "héllo 😀",
        b"A\x00\x00\x00", bytes(range(256)), "it's", "x,z,x", '{"a": 1}',
        {"k": [1, 2.5, None, True]}, Decimal("1.50"),
    )  # fmt: skip
    types = (
        "tinyint unsigned", "bigint unsigned", "bigint", "decimal(10,2)", "float", "double",
        "bit(64)", "date", "time(6)", "datetime", "timestamp(1)", "year", "varchar(10)",
        "binary(4)", "blob", "enum('a','it''s')", "set('x','y','z')", "type245", "type245",
        "decimal(10,2)",
    )  # fmt: skip
    cols = TableColumns(
        tuple(f"c{i}" for i in range(len(types))), types, (True,) + (False,) * (len(types) - 1)
    )
    header = Header("bin.000001", 4, 100, 1, 1_700_000_000_000, "0-1-8", "s", "t", EventType.INSERT)
    tuples = Entry(
        EntryType.ROWDATA, header, images=RowImages(cols, (), (row,)), gtid_state="0-1-7"
    )
    packable = (*row[:-1], "1.50")
    packed = PackedRows(cols, 1, b"\x90", msgpack.packb([packable], use_bin_type=True))
    as_text = Entry(
        EntryType.ROWDATA, header, images=RowImages(cols, (), (packable,)), gtid_state="0-1-7"
    )
    msg = Entry(EntryType.ROWDATA, header, images=packed, gtid_state="0-1-7")
    for form in FORMS:
        with _local_zone("America/New_York"):
            assert encode_entries([tuples], form) == encode_entries_python([tuples], form)
            assert encode_entries([msg], form) == encode_entries_python([msg], form)
            assert encode_entries([msg], form) == encode_entries([as_text], form)


def test_the_python_encoder_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_native.ENV, "python")
    assert not _native.use_native()
    monkeypatch.delenv(_native.ENV)
    assert _native.use_native()


def test_threads_encode_at_once() -> None:
    """Encoders shared by threads (a listener's connections): text functions called back
    (a tzinfo zone) let other threads run mid-entry; every result is the reference's."""
    cols = TableColumns(("id", "ts", "name", "f"), ("int", "timestamp(3)", "varchar(20)", "double"),
                        (True, False, False, False))  # fmt: skip
    rows = tuple((i, f"2024-07-0{i % 9 + 1}T12:00:0{i % 10}.123Z", "é" * (i % 5), i / 7)
                 for i in range(200))  # fmt: skip
    header = Header("bin.000001", 4, 100, 1, 1_700_000_000_000, "0-1-8", "s", "t", EventType.UPDATE)
    entries = [
        Entry(EntryType.ROWDATA, header, images=RowImages(cols, rows[:100], rows[100:])),
        Entry(EntryType.ROWDATA, header, is_ddl=True, sql="ALTER TABLE t ADD c INT"),
    ]
    form = FORMS[3]
    expected = encode_entries_python(entries, form)
    results: list[Any] = []

    def work() -> None:
        for _ in range(20):
            results.append(encode_entries(entries, form))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80 and all(r == expected for r in results)
