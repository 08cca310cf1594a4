"""rowcodec: the C and the generated-Python row decoders give exactly the reference's
values (mysql-replication's rows + decoding.row_changes) on the same rows events, raise
RowDecodeError on truncated or corrupt bodies, and step aside where they do not apply.
``decode_packed`` (C straight to msgpack) gives exactly msgpack.packb of ``decode``'s
images wherever it gives bytes, on the same events and bodies."""

from __future__ import annotations

import json
import random
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import msgpack
import pymysql.protocol
import pytest
from pymysqlreplication.column import Column
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
from test_every_type import COLUMNS, ROWS

from canal_ha.sandbox import Sandbox
from canal_protocol.errors import RowDecodeError
from canal_server.parse import decoding, rowcodec
from canal_server.parse.binlog_stream import next_event, open_stream

KINDS = {WriteRowsEvent: "INSERT", UpdateRowsEvent: "UPDATE", DeleteRowsEvent: "DELETE"}
Sig = list[list[tuple[str, str]]]
Codecs = tuple[rowcodec.TableCodec, rowcodec.TableCodec]


def sig(rows: Any) -> Sig:
    """Rows as (type, repr) per value: equal only when type and value are identical
    (repr tells -0.0 from 0.0 and compares NaN)."""
    return [[(type(v).__name__, repr(v)) for v in row] for row in rows]


def outcome(codec: rowcodec.TableCodec, data: bytes, pos: int, end: int, per_row: int) -> Sig | str:
    """The decoded rows' signature, or "RowDecodeError" (any other exception fails)."""
    try:
        return sig(codec.decode(data, pos, end, per_row))
    except RowDecodeError:
        return "RowDecodeError"


def agreed(codecs: Codecs, data: bytes, pos: int, end: int, per_row: int) -> Sig | str:
    """The outcome of both codecs, which must be the same (and decode_packed agrees)."""
    got = outcome(codecs[0], data, pos, end, per_row)
    assert got == outcome(codecs[1], data, pos, end, per_row), (pos, end, data[pos:end].hex())
    check_packed(codecs[0], data, pos, end, per_row)
    return got


# -- decode_packed against decode ---------------------------------------------------------------


def packb(images: Any) -> bytes:
    return bytes(msgpack.packb(images, use_bin_type=True))


def decode_noting_slow(
    codec: rowcodec.TableCodec, data: bytes, pos: int, end: int, per_row: int
) -> tuple[list[rowcodec.Row], bool]:
    """decode's images, and whether decode_packed leaves them to decode: a value that
    needed the reference (decode asked codec._slow), or a FLOAT NaN (corrupt data)."""
    calls = []
    slow = codec._slow

    def noting(index: int, raw: bytes) -> Any:
        calls.append(index)
        return slow(index, raw)

    vars(codec)["_slow"] = noting
    try:
        rows = codec.decode(data, pos, end, per_row)
    finally:
        del vars(codec)["_slow"]
    floats = [k for k, t in enumerate(codec.mysql_types) if t == "float"]
    nan = any(row[k] != row[k] for row in rows for k in floats)
    return rows, bool(calls) or nan


def check_packed(codec: rowcodec.TableCodec, data: bytes, pos: int, end: int, per_row: int) -> int:
    """decode_packed agrees with decode on these arguments: the same images as msgpack
    bytes (both sides, both ways round for one image per row); None exactly where decode
    needs the reference or the codec is not packable; RowDecodeError or None where decode
    raises. The number of images it gave as bytes."""
    try:
        rows, slow = decode_noting_slow(codec, data, pos, end, per_row)
    except RowDecodeError:
        rows, slow = [], True
        failed = True
    else:
        failed = False
    for side in ("after", "before") if per_row == 1 else ("after",):
        try:
            got = codec.decode_packed(data, pos, end, per_row, side)
        except RowDecodeError:
            assert failed, ("decode_packed raised, decode did not", pos, end, data[pos:end].hex())
            continue
        if slow or not codec.packable:
            assert got is None, (pos, end, data[pos:end].hex())
            continue
        if per_row == 2:
            before, after = rows[0::2], rows[1::2]
        else:
            before, after = ([], rows) if side == "after" else (rows, [])
        assert got == (len(rows) // per_row, packb(before), packb(after)), data[pos:end].hex()
        for images, packed in ((before, got[1]), (after, got[2])):
            assert sig(msgpack.unpackb(packed, raw=False, use_list=False)) == sig(images)
    return 0 if slow or not codec.packable else len(rows)


def image_bounds(columns: Any, data: bytes, pos: int, end: int) -> list[tuple[int, int]]:
    """Where each row image of a body starts and ends (read with the codec's plan)."""
    plan = rowcodec._plan(columns)
    assert plan is not None
    widths = [f.width if (f := rowcodec._fixed(i, c, {})) else 0 for i, c in enumerate(plan)]
    nbytes = (len(plan) + 7) // 8
    out, p = [], pos
    while p < end:
        nulls, q = int.from_bytes(data[p : p + nbytes], "little"), p + nbytes
        for i, col in enumerate(plan):
            if not nulls >> i & 1:
                q += widths[i] or col.a + int.from_bytes(data[q : q + col.a], "little")
        out.append((p, q))
        p = q
    assert p == end
    return out


def assert_packed(events: list[Captured]) -> int:
    """decode_packed agrees with decode on every event, and on every image of it alone
    (an event with one value for the reference gives None: its other images are
    checked this way); the number of images given as bytes."""
    packed = 0
    for e in events:
        native = codecs_of(e.columns)[0]
        check_packed(native, *e.body, e.per_row)
        for start, stop in image_bounds(e.columns, *e.body):
            packed += check_packed(native, e.body[0], start, stop, 1)
    return packed


def reference_outcome(column: Any, raw: bytes) -> Sig | str:
    spec = decoding.column_specs([column])[0]
    try:
        return sig([(rowcodec._reference_value(column, spec, raw),)])
    except RowDecodeError:
        return "RowDecodeError"


@pytest.fixture(scope="module", autouse=True)
def _native_built() -> None:
    assert rowcodec.HAVE_NATIVE, "build the C decoder: pip install -e . (see setup.py)"


# -- reading real events -------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    """A rows event: its columns, kind, raw body (taken before the library read it) and
    the reference's row images (before, after per row for UPDATE)."""

    columns: Any
    kind: str
    body: tuple[bytes, int, int]
    reference: list[tuple[Any, ...]]

    @property
    def per_row(self) -> int:
        return 2 if self.kind == "UPDATE" else 1


def reference_images(kind: str, columns: Any, rows: Any) -> list[tuple[Any, ...]]:
    out = []
    for change in decoding.row_changes(kind, decoding.column_specs(columns), rows):
        if change.before:
            out.append(tuple(c.value for c in change.before))
        if change.after:
            out.append(tuple(c.value for c in change.after))
    return out


def capture(box: Sandbox, journal: str, offset: int, server_id: int) -> Iterator[Any]:
    """Every rows event from journal/offset to the end of the binlog (non-blocking)."""
    stream = open_stream(
        box.primary.dsn(), server_id, journal=journal, offset=offset, blocking=False,
        only_events=list(KINDS),
    )  # fmt: skip
    try:
        while (ev := next_event(stream)) is not None:
            yield ev, stream
    finally:
        stream.close()


def captured_events(box: Sandbox, journal: str, offset: int, server_id: int) -> list[Captured]:
    out = []
    for ev, _ in capture(box, journal, offset, server_id):
        body = rowcodec.rows_body(ev)
        assert body is not None, ev
        assert rowcodec.rows_body(ev) == body  # nothing consumed
        kind = KINDS[type(ev)]
        out.append(Captured(ev.columns, kind, body, reference_images(kind, ev.columns, ev.rows)))
    return out


def codecs_of(columns: Any) -> Codecs:
    native = rowcodec.table_codec(columns, native=True)
    python = rowcodec.table_codec(columns, native=False)
    assert native is not None and python is not None
    assert native.native and not python.native
    specs = decoding.column_specs(columns)
    for codec in (native, python):
        assert codec.names == tuple(s.name for s in specs)
        assert codec.mysql_types == tuple(s.mysql_type for s in specs)
        assert codec.keys == tuple(s.is_key for s in specs)
    return native, python


def assert_identical(events: list[Captured]) -> int:
    """Both codecs give the reference's values on every event; the number of images."""
    images = 0
    for e in events:
        for codec in codecs_of(e.columns):
            got = codec.decode(*e.body, e.per_row)
            assert sig(got) == sig(e.reference), (codec.native, e.kind)
        images += len(e.reference)
    return images


def write(box: Sandbox, *statements: tuple[str, Any]) -> tuple[str, int]:
    """Run (sql, params) statements (params None, a tuple or a list for executemany)
    with sql_mode '' and UTC; the binlog position before them."""
    journal, offset = box.primary.master_status()
    with box.primary.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION sql_mode = ''")
        for sql, params in statements:
            if isinstance(params, list):
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params)
    return journal, offset


# -- random values -----------------------------------------------------------------------------

TEXT = "aZ 0é中文😀'\"\\%_\t"


def r_int(rng: random.Random, bits: int, unsigned: bool) -> int:
    lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return rng.choice([lo, hi, 0, 1, rng.randint(lo, hi), rng.randint(lo, hi)])


def r_decimal(rng: random.Random, prec: int, scale: int) -> str:
    intd = prec - scale
    whole = rng.choice(["9" * intd, "0", str(rng.randint(0, 10**intd - 1))]) if intd else "0"
    frac = "".join(rng.choice("0123456789") for _ in range(scale))
    frac = rng.choice([frac, "0" * scale, "9" * scale, frac])
    return rng.choice(["", "-"]) + whole + ("." + frac if scale else "")


def r_fraction(rng: random.Random, fsp: int) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(fsp))
    return "." + rng.choice([digits, "9" * fsp, "0" * (fsp - 1) + "1"]) if fsp else ""


def r_time(rng: random.Random, fsp: int) -> str:
    h = rng.choice([0, 838, 1, rng.randint(0, 838), rng.randint(0, 30)])
    sign = rng.choice(["", "-"])
    return f"{sign}{h}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}{r_fraction(rng, fsp)}"


def r_date(rng: random.Random) -> str:
    y = rng.choice([0, 1, 999, 1000, 2024, 9999, rng.randint(1000, 9999), rng.randint(1, 999)])
    m, d = rng.choice([(0, 0), (1, 1), (12, 31), (2, 29), (rng.randint(0, 12), rng.randint(0, 28))])
    return f"{y:04d}-{m:02d}-{d:02d}"


def r_datetime(rng: random.Random, fsp: int) -> str:
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
    return rng.choice([f"{r_date(rng)} {clock}{r_fraction(rng, fsp)}", "0000-00-00 00:00:00"])


def r_timestamp(rng: random.Random, fsp: int) -> str:
    sec = rng.choice([1, 2**31 - 1, rng.randint(1, 2**31 - 1), 86400 * rng.randint(0, 24000)])
    if sec == 0 or rng.random() < 0.05:
        return "0000-00-00 00:00:00"
    text = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return text + (r_fraction(rng, fsp) if sec < 2**31 - 1 else "")


def r_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(TEXT) for _ in range(rng.randint(0, n)))


def r_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, n)))


def r_float(rng: random.Random, single: bool) -> float:
    big = 3.4e38 if single else 1.7976931348623157e308
    tiny = 1.2e-38 if single else 2.2250738585072014e-308
    return rng.choice([0.0, big, -big, tiny, 1.1, rng.uniform(-1e6, 1e6),
                       rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)])  # fmt: skip


def maybe(rng: random.Random, value: Any, nulls: float = 0.15) -> Any:
    return None if rng.random() < nulls else value


# -- the every-type table ------------------------------------------------------------------------


def every_type_row(rng: random.Random, rid: int) -> tuple[Any, ...]:
    ints = [r_int(rng, b, u) for b in (8, 16, 24, 32, 64) for u in (False, True)]
    doc = {"k": r_text(rng, 8), "n": rng.randint(-5, 5), "a": [1.5, None, True]}
    values = [
        *ints, r_decimal(rng, 30, 10), r_decimal(rng, 65, 30), r_float(rng, True),
        r_float(rng, False), r_date(rng), r_time(rng, 6), r_time(rng, 0), r_datetime(rng, 6),
        r_datetime(rng, 3), r_timestamp(rng, 6), rng.choice([0, 1901, 2155, 2024]),
        r_text(rng, 10), r_text(rng, 40), r_text(rng, 300),
        rng.choice([r_text(rng, 20), "😀" * 20000]) if rid % 50 == 0 else r_text(rng, 30),
        r_bytes(rng, 4), r_bytes(rng, 16), r_bytes(rng, 300),
        r_bytes(rng, 70000) if rid % 60 == 0 else r_bytes(rng, 40),
        rng.choice(["a", "b", "c", ""]), ",".join(rng.sample(["x", "y", "z"], rng.randint(0, 3))),
        rng.randrange(4096), json.dumps(doc, ensure_ascii=rng.random() < 0.5),
    ]  # fmt: skip
    return (rid, *(maybe(rng, v) for v in values))


def test_every_type_table_identical_to_reference(db: Sandbox) -> None:
    rng = random.Random(20261121)
    rows = [every_type_row(rng, rid) for rid in range(10, 310)]
    marks = ", ".join(["%s"] * len(rows[0]))
    table = "t_rowcodec.t"
    db.primary.execute("DROP DATABASE IF EXISTS t_rowcodec", "CREATE DATABASE t_rowcodec")
    journal, offset = write(
        db,
        (f"CREATE TABLE t_rowcodec.t ({COLUMNS}) DEFAULT CHARSET=utf8mb4", None),
        (f"INSERT INTO t_rowcodec.t VALUES {', '.join(ROWS)}", None),
        (f"INSERT INTO t_rowcodec.t VALUES ({marks})", rows),
        (f"UPDATE {table} SET tiu = 255 - tiu, vc = REVERSE(vc), tm = NULL WHERE id % 3 = 0", None),
        *[
            (f"UPDATE {table} SET d = %s, tm = %s, dtm = %s, ts = %s, c = %s, b = %s, s = %s"
             " WHERE id = %s",
             (r_decimal(rng, 30, 10), r_time(rng, 6), r_datetime(rng, 6), r_timestamp(rng, 6),
              r_text(rng, 10), r_bytes(rng, 4), "z,x", rid))
            for rid in range(10, 60)
        ],
        ("DELETE FROM t_rowcodec.t WHERE id % 4 = 1", None),
    )  # fmt: skip
    events = captured_events(db, journal, offset, 7711)
    assert {e.kind for e in events} == {"INSERT", "UPDATE", "DELETE"}
    assert assert_identical(events) > 300 + 100 + 50 + 70
    assert assert_packed(events) > 300  # (rows with a DATETIME before 1000 stay for decode)


WIDTHS = """
  id INT PRIMARY KEY,
  i8 TINYINT, u8 TINYINT UNSIGNED, i16 SMALLINT, u16 SMALLINT UNSIGNED,
  i24 MEDIUMINT, u24 MEDIUMINT UNSIGNED, i32 INT, u32 INT UNSIGNED, i64 BIGINT, u64 BIGINT UNSIGNED,
  d1_0 DECIMAL(1,0), d5_5 DECIMAL(5,5), d10_2 DECIMAL(10,2), d18_9 DECIMAL(18,9),
  d65_30 DECIMAL(65,30), d12_2 DECIMAL(12,2), d65_0 DECIMAL(65,0), d38_38 DECIMAL(38,38),
  dt0 DATETIME, dt1 DATETIME(1), dt2 DATETIME(2), dt3 DATETIME(3), dt4 DATETIME(4),
  dt5 DATETIME(5), dt6 DATETIME(6),
  tm0 TIME, tm1 TIME(1), tm2 TIME(2), tm3 TIME(3), tm4 TIME(4), tm5 TIME(5), tm6 TIME(6),
  ts0 TIMESTAMP NULL, ts1 TIMESTAMP(1) NULL, ts2 TIMESTAMP(2) NULL, ts3 TIMESTAMP(3) NULL,
  ts4 TIMESTAMP(4) NULL, ts5 TIMESTAMP(5) NULL, ts6 TIMESTAMP(6) NULL,
  dd DATE, yy YEAR, vc300 VARCHAR(300), ch100 CHAR(100), bin20 BINARY(20),
  l1 VARCHAR(20) CHARACTER SET latin1, l1c CHAR(5) CHARACTER SET latin1,
  bt1 BIT(1), bt8 BIT(8), bt9 BIT(9), bt64 BIT(64), e2 ENUM({enum}), s9 SET({members}),
  g GEOMETRY
"""
ENUM_VALUES = [f"v{k}" for k in range(300)]
SET_MEMBERS = [f"m{k}" for k in range(9)]


def widths_row(rng: random.Random, rid: int) -> tuple[Any, ...]:
    ints = [r_int(rng, b, u) for b in (8, 16, 24, 32, 64) for u in (False, True)]
    decimals = [r_decimal(rng, p, s) for p, s in ((1, 0), (5, 5), (10, 2), (18, 9), (65, 30),
                                                   (12, 2), (65, 0), (38, 38))]  # fmt: skip
    values = [
        *ints, *decimals, *(r_datetime(rng, f) for f in range(7)),
        *(r_time(rng, f) for f in range(7)), *(r_timestamp(rng, f) for f in range(7)),
        r_date(rng), rng.choice([0, 1901, 2155]), r_text(rng, 300), r_text(rng, 100),
        r_bytes(rng, 20), rng.choice(["café €", "naïve", "", "x" * 20]), rng.choice(["é", "a  "]),
        rng.randrange(2), rng.randrange(256), rng.randrange(512), rng.randrange(2**64),
        rng.choice(ENUM_VALUES), ",".join(rng.sample(SET_MEMBERS, rng.randint(0, 9))),
    ]  # fmt: skip
    return (rid, *(maybe(rng, v) for v in values), maybe(rng, f"POINT({rid} {rng.random()})"))


def write_widths(
    db: Sandbox, schema: str, columns: str, rows: list[Any], also_set: str, server_id: int
) -> list[Captured]:
    """The widths table (``columns``) in ``schema``: ``rows`` inserted, every second one
    updated (negated d65_30, tm6 NULL, plus ``also_set``), every third deleted."""
    ddl = columns.format(
        enum=",".join(f"'{v}'" for v in ENUM_VALUES),
        members=",".join(f"'{m}'" for m in SET_MEMBERS),
    )
    marks = ", ".join(["%s"] * (len(rows[0]) - 1) + ["ST_GeomFromText(%s)"])
    db.primary.execute(f"DROP DATABASE IF EXISTS {schema}", f"CREATE DATABASE {schema}")
    journal, offset = write(
        db,
        (f"CREATE TABLE {schema}.t ({ddl}) DEFAULT CHARSET=utf8mb4", None),
        (f"INSERT INTO {schema}.t VALUES ({marks})", rows),
        (f"UPDATE {schema}.t SET d65_30 = -d65_30, tm6 = NULL{also_set} WHERE id % 2 = 0", None),
        (f"DELETE FROM {schema}.t WHERE id % 3 = 0", None),
    )  # fmt: skip
    return captured_events(db, journal, offset, server_id)


def test_widths_precisions_and_fsp_identical_to_reference(db: Sandbox) -> None:
    rng = random.Random(77)
    rows = [widths_row(rng, rid) for rid in range(1, 301)]
    ncols = len(rows[0])
    events = write_widths(db, "t_rowcodec_w", WIDTHS, rows, ", l1 = 'ü'", 7712)
    assert len(events[0].columns) == ncols
    assert assert_identical(events) > 300 + 200 + 90
    assert assert_packed(events) == 0  # latin1 columns: the text is decoded in Python


LATIN1 = "  l1 VARCHAR(20) CHARACTER SET latin1, l1c CHAR(5) CHARACTER SET latin1,\n"


def test_packed_widths_precisions_and_fsp_identical(db: Sandbox) -> None:
    """The widths table without its latin1 columns: decode_packed gives packb(decode)."""
    assert LATIN1 in WIDTHS
    rng = random.Random(78)
    names = [d.split()[0] for d in re.split(r",(?![^(]*\))", WIDTHS) if d.strip()]
    latin1 = [names.index("l1"), names.index("l1c")]
    rows = [widths_row(rng, rid) for rid in range(1, 301)]
    rows = [tuple(v for k, v in enumerate(row) if k not in latin1) for row in rows]
    events = write_widths(db, "t_rowcodec_p", WIDTHS.replace(LATIN1, ""), rows, "", 7717)
    assert {e.kind for e in events} == {"INSERT", "UPDATE", "DELETE"}
    assert all(codecs_of(e.columns)[0].packable for e in events)
    assert assert_identical(events) > 300 + 200 + 90
    assert assert_packed(events) > 200  # (7 DATETIMEs a row: often one before year 1000)


# -- corrupt and truncated bodies -----------------------------------------------------------------


def small_events(db: Sandbox, server_id: int) -> list[Captured]:
    db.primary.execute("DROP DATABASE IF EXISTS t_rowcodec_c", "CREATE DATABASE t_rowcodec_c")
    journal, offset = write(
        db,
        (f"CREATE TABLE t_rowcodec_c.t ({COLUMNS}) DEFAULT CHARSET=utf8mb4", None),
        (f"INSERT INTO t_rowcodec_c.t VALUES {', '.join(ROWS)}", None),
        ("UPDATE t_rowcodec_c.t SET vc = 'changed', tiu = tiu + 1 WHERE id IN (1, 2)", None),
    )
    return captured_events(db, journal, offset, server_id)


def test_truncated_bodies_raise_or_give_a_prefix(db: Sandbox) -> None:
    for e in small_events(db, 7713):
        data, pos, end = e.body
        codecs = codecs_of(e.columns)
        full = sig(e.reference)
        for cut in range(pos, end):  # (data ends at the cut: out-of-bounds reads would show)
            got = agreed(codecs, data[:cut], pos, cut, e.per_row)
            if got != "RowDecodeError":  # cut between two complete images
                assert len(got) < len(full) and got == full[: len(got)], cut
        assert agreed(codecs, data[:end], pos, end, e.per_row) == full  # nothing after `end` read


def test_corrupt_bodies_raise_row_decode_error_or_agree(db: Sandbox) -> None:
    rng = random.Random(5)
    for e in small_events(db, 7714):
        data, pos, end = e.body
        codecs = codecs_of(e.columns)
        errors = 0
        for k in range(pos, end):
            for byte in {0x00, 0xFF, data[k] ^ 0x80, data[k] ^ 0x01, rng.randrange(256)}:
                bad = data[:k] + bytes([byte]) + data[k + 1 :]
                errors += agreed(codecs, bad, pos, end, e.per_row) == "RowDecodeError"
        assert errors > (end - pos) // 2  # most flips break the body (lengths, bitmaps...)
        for _ in range(300):  # real images, then garbage
            junk = data[: pos + rng.randrange(end - pos)] + r_bytes(rng, 200)
            agreed(codecs, junk, pos, len(junk), 1)
        for codec in codecs:
            for bad_end in (end + 1, len(data) + 1):
                with pytest.raises(RowDecodeError):
                    codec.decode(data, pos, bad_end, 1)


# -- single values: random bit patterns against the reference reader ----------------------------


def fake_column(type_: int, **kw: Any) -> Column:
    base = {
        "type": type_, "name": "c", "unsigned": False, "is_primary": False, "charset_id": None,
        "character_set_name": None, "collation_name": None, "enum_values": None,
        "set_values": None, "visibility": False,
    }  # fmt: skip
    return Column(**{**base, **kw})


def text_column(type_: int, charset: str, collation: str, **kw: Any) -> Column:
    """A text column as the library describes it (charset = its Python encoding name)."""
    return fake_column(type_, character_set_name=charset, collation_name=collation, **kw)


def fixed_columns() -> list[tuple[Column, int]]:
    """(column, value width) for every fixed-width kind."""
    out = [(fake_column(t, unsigned=u), w) for t, w in
           ((FIELD_TYPE.TINY, 1), (FIELD_TYPE.SHORT, 2), (FIELD_TYPE.INT24, 3),
            (FIELD_TYPE.LONG, 4), (FIELD_TYPE.LONGLONG, 8)) for u in (False, True)]  # fmt: skip
    out += [(fake_column(FIELD_TYPE.FLOAT), 4), (fake_column(FIELD_TYPE.DOUBLE), 8)]
    out += [(fake_column(FIELD_TYPE.DATE), 3), (fake_column(FIELD_TYPE.YEAR), 1)]
    for fsp in range(7):
        extra = (fsp + 1) // 2
        out += [(fake_column(FIELD_TYPE.TIME2, fsp=fsp), 3 + extra),
                (fake_column(FIELD_TYPE.DATETIME2, fsp=fsp), 5 + extra),
                (fake_column(FIELD_TYPE.TIMESTAMP2, fsp=fsp), 4 + extra)]  # fmt: skip
    for prec, scale in ((1, 0), (5, 5), (10, 2), (18, 9), (65, 30), (12, 2), (9, 0), (20, 1)):
        groups = rowcodec._decimal_groups(prec, scale)
        dec = fake_column(FIELD_TYPE.NEWDECIMAL, precision=prec, decimals=scale)
        out.append((dec, sum(g[0] for g in groups)))
    out += [(fake_column(FIELD_TYPE.ENUM, size=s, enum_values=["", "a", "b"]), s) for s in (1, 2)]
    members = [f"m{k}" for k in range(12)]
    out += [(fake_column(FIELD_TYPE.SET, size=s, set_values=members[: s * 6]), s) for s in (1, 2)]
    for bits in (1, 8, 9, 12, 64):
        out.append((fake_column(FIELD_TYPE.BIT, bits=bits, bytes=(bits + 7) // 8), (bits + 7) // 8))
    return out


def valid_decimal(rng: random.Random, prec: int, scale: int) -> bytes:
    groups = rowcodec._decimal_groups(prec, scale)
    raw = b"".join(rng.randrange(10**digits).to_bytes(n, "big") for n, digits, _ in groups)
    if rng.random() < 0.5:
        raw = bytes(b ^ 0xFF for b in raw)
    return bytes([raw[0] ^ 0x80]) + raw[1:]


def valid_datetime(rng: random.Random, fsp: int) -> bytes:
    y, mo, d = rng.choice(
        [(0, 0, 0), (rng.randint(0, 9999), rng.randint(0, 12), rng.randint(0, 31))]
    )
    clock = rng.randint(0, 23) << 12 | rng.randint(0, 59) << 6 | rng.randint(0, 59)
    size = (fsp + 1) // 2
    frac = rng.randrange(10 ** (2 * size)).to_bytes(size, "big") if size else b""
    return (((y * 13 + mo) << 22 | d << 17 | clock) + (1 << 39)).to_bytes(5, "big") + frac


def patterns(rng: random.Random, column: Any, width: int) -> list[bytes]:
    special = [b"\x00" * width, b"\xff" * width, b"\x80" + b"\x00" * (width - 1),
               b"\x7f" + b"\xff" * (width - 1), b"\x80" * width, b"\x01" * width]  # fmt: skip
    out = special + [bytes(rng.randrange(256) for _ in range(width)) for _ in range(400)]
    if column.type == FIELD_TYPE.NEWDECIMAL:
        out += [valid_decimal(rng, column.precision, column.decimals) for _ in range(400)]
    if column.type == FIELD_TYPE.DATETIME2:
        out += [valid_datetime(rng, column.fsp) for _ in range(400)]
    return out


def test_every_fixed_width_kind_matches_the_reference_reader_on_any_bytes() -> None:
    rng = random.Random(11)
    for column, width in fixed_columns():
        codecs = codecs_of([column])
        for raw in patterns(rng, column, width):
            body = b"\x00" + raw
            assert agreed(codecs, body, 0, len(body), 1) == reference_outcome(column, raw), raw


def test_text_columns_follow_the_charset_like_the_reference() -> None:
    rng = random.Random(3)
    cases = [
        text_column(FIELD_TYPE.VARCHAR, "utf8", "utf8mb4_general_ci", max_length=80),
        text_column(FIELD_TYPE.VARCHAR, "cp1252", "latin1_swedish_ci", max_length=300),
        text_column(FIELD_TYPE.STRING, "binary", "binary", max_length=8),
        text_column(FIELD_TYPE.BLOB, "swe7", "swe7_swedish_ci", length_size=3),
        fake_column(FIELD_TYPE.BLOB, length_size=4),
    ]
    for column in cases:
        codecs = codecs_of([column])
        prefix = 2 if column.type != FIELD_TYPE.BLOB and column.max_length > 255 else 1
        prefix = column.length_size if column.type == FIELD_TYPE.BLOB else prefix
        for _ in range(300):
            value = rng.choice(
                [r_bytes(rng, 12), r_text(rng, 12).encode(), "café €".encode("cp1252")]
            )
            raw = len(value).to_bytes(prefix, "little") + value
            body = b"\x00" + raw
            assert agreed(codecs, body, 0, len(body), 1) == reference_outcome(column, raw), raw


# -- where the fast path does not apply ----------------------------------------------------------


def test_unsupported_columns_give_no_codec() -> None:
    ok = fake_column(FIELD_TYPE.LONG, name="id")
    assert rowcodec.table_codec([ok]) is not None
    for bad in (fake_column(FIELD_TYPE.JSON, name="j", length_size=4),
                fake_column(FIELD_TYPE.TIME, name="t"), fake_column(FIELD_TYPE.DATETIME, name="t"),
                fake_column(FIELD_TYPE.DECIMAL, name="d"),
                fake_column(FIELD_TYPE.TIME2, name="t", fsp=7)):  # fmt: skip
        assert rowcodec.table_codec([ok, bad]) is None
    assert rowcodec.table_codec([ok, fake_column(FIELD_TYPE.LONG, name=None)]) is None
    assert rowcodec.table_codec([ok, fake_column(FIELD_TYPE.LONG, name="id")]) is None


def test_codecs_are_shared_by_tables_that_look_the_same() -> None:
    def table(scale: int) -> list[Column]:
        return [
            fake_column(FIELD_TYPE.LONG, name="id", is_primary=True),
            fake_column(FIELD_TYPE.NEWDECIMAL, name="d", precision=10, decimals=scale),
            fake_column(FIELD_TYPE.SET, name="s", size=1, set_values=["a", "b"]),
        ]

    first = rowcodec.table_codec(table(2), native=True)
    assert first is not None and first.keys == (True, False, False)
    assert rowcodec.table_codec(table(2), native=True) is first  # new objects, same table
    assert rowcodec.table_codec(table(3), native=True) is not first
    python = rowcodec.table_codec(table(2), native=False)
    assert python is not None and python is not first and not python.native


def test_codec_selection_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    columns = [fake_column(FIELD_TYPE.LONG, name="id")]
    codec = rowcodec.table_codec(columns)
    assert codec is not None and codec.native
    monkeypatch.setenv(rowcodec.ENV, "python")
    codec = rowcodec.table_codec(columns)
    assert codec is not None and not codec.native
    assert codec.decode(b"\x00\x07\x00\x00\x00", 0, 5, 1) == [(7,)]


def test_minimal_images_and_consumed_events_have_no_body(db: Sandbox) -> None:
    db.primary.execute(
        "DROP DATABASE IF EXISTS t_rowcodec_m", "CREATE DATABASE t_rowcodec_m",
        "CREATE TABLE t_rowcodec_m.t (id INT PRIMARY KEY, a VARCHAR(10), b INT)",
    )  # fmt: skip
    journal, offset = write(
        db,
        ("INSERT INTO t_rowcodec_m.t VALUES (1, 'x', 1), (2, 'y', 2)", None),
        ("SET SESSION binlog_row_image = 'MINIMAL'", None),
        ("UPDATE t_rowcodec_m.t SET b = 5 WHERE id = 1", None),
        ("DELETE FROM t_rowcodec_m.t WHERE id = 2", None),
    )
    seen = []
    for ev, _ in capture(db, journal, offset, 7715):
        body = rowcodec.rows_body(ev)
        seen.append((KINDS[type(ev)], body is not None))
        assert ev.rows  # the library can still read it: nothing was consumed
        assert rowcodec.rows_body(ev) is None  # its rows are read now
    assert seen == [("INSERT", True), ("UPDATE", False), ("DELETE", False)]


def as_v2(packet: bytes, extra: bytes) -> bytes:
    """A v1 rows event packet (OK byte, header, body, checksum) rewritten as v2."""
    header = bytearray(packet[:20])
    header[5] += 0x1E - 0x17  # WRITE/UPDATE/DELETE_ROWS_EVENT_V1 -> _V2
    size = struct.unpack_from("<I", header, 10)[0] + 2 + len(extra)
    struct.pack_into("<I", header, 10, size)
    post = packet[20:28] + struct.pack("<H", 2 + len(extra)) + extra
    return bytes(header) + post + packet[28:]


def test_v2_rows_events_give_the_same_body(db: Sandbox) -> None:
    db.primary.execute("DROP DATABASE IF EXISTS t_rowcodec_v", "CREATE DATABASE t_rowcodec_v")
    journal, offset = write(
        db,
        ("CREATE TABLE t_rowcodec_v.t (id INT PRIMARY KEY, a VARCHAR(10), d DECIMAL(8,3))", None),
        ("INSERT INTO t_rowcodec_v.t VALUES (1, 'x', -1.5), (2, NULL, 2)", None),
        ("UPDATE t_rowcodec_v.t SET a = 'z'", None),
    )
    checked = 0
    for ev, stream in capture(db, journal, offset, 7716):
        first = rowcodec.rows_body(ev)
        assert first is not None
        data, pos, end = first
        codec = rowcodec.table_codec(ev.columns)
        assert codec is not None
        per_row = 2 if isinstance(ev, UpdateRowsEvent) else 1
        want = sig(codec.decode(data, pos, end, per_row))
        extra_partition = b"\x01" + (b"\x03\x00" * per_row)
        for extra in (b"", extra_partition):
            v2 = rebuild(as_v2(data, extra), stream)
            body = rowcodec.rows_body(v2)
            assert body is not None and body[2] - body[1] == end - pos
            assert sig(codec.decode(*body, per_row)) == want
            assert sig(reference_images(KINDS[type(v2)], v2.columns, v2.rows)) == want
            checked += 1
    assert checked == 4


def rebuild(packet: bytes, stream: Any) -> Any:
    """The library's event object of a raw packet, with the stream's table map."""
    connection = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mariadb")
    wrapper = BinLogPacketWrapper(
        pymysql.protocol.MysqlPacket(packet, "utf8"), stream.table_map, connection, (10, 11, 0),
        True, frozenset(KINDS), None, None, None, None, False, False, False, True, False,
    )  # fmt: skip
    assert wrapper.event is not None and wrapper.event.event_type in (0x1E, 0x1F, 0x20)
    return wrapper.event


# -- decode_packed: formats, where it steps aside, threads ---------------------------------------


def int_column(type_: int, unsigned: bool) -> Column:
    return fake_column(type_, name=f"c{type_}{'u' if unsigned else ''}", unsigned=unsigned)


def test_packed_int_formats_and_array_headers() -> None:
    """Every msgpack int format at its bounds; fixarray/array16/array32 headers."""
    edges = [0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]
    edges += [-1, -31, -32, -33, -127, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1]
    edges += [-(2**63)]
    signed = [int_column(FIELD_TYPE.LONGLONG, False)]
    body = b"".join(b"\x00" + struct.pack("<q", v) for v in edges)
    assert check_packed(codecs_of(signed)[0], body, 0, len(body), 1) == len(edges)
    unsigned = [int_column(FIELD_TYPE.LONGLONG, True), int_column(FIELD_TYPE.TINY, False)]
    values = [(v, t) for v in edges if v >= 0 for t in (-128, -33, -32, 0, 127)] + [(2**64 - 1, 5)]
    body = b"".join(b"\x00" + struct.pack("<Qb", v, t) for v, t in values)
    assert check_packed(codecs_of(unsigned)[0], body, 0, len(body), 2) == len(values)
    tiny = codecs_of([int_column(FIELD_TYPE.TINY, True)])[0]
    for count in (0, 1, 15, 16, 17, 65535, 65536, 70001):  # images: fixarray, array16, array32
        body = b"\x00\x07" * (count - count % 3) + b"\x01" * (count % 3)  # (NULLs too)
        assert check_packed(tiny, body, 0, len(body), 1) == count
    wide = [fake_column(FIELD_TYPE.TINY, name=f"c{k}") for k in range(16)]  # array16 rows
    body = (b"\x00\x80" + bytes(range(15))) * 3
    assert check_packed(codecs_of(wide)[0], body, 0, len(body), 1) == 3


def test_packed_needs_the_c_decoder_and_utf8_text() -> None:
    utf8 = text_column(FIELD_TYPE.VARCHAR, "utf8", "utf8mb4_general_ci", name="u", max_length=9)
    latin1 = text_column(FIELD_TYPE.VARCHAR, "cp1252", "latin1_swedish_ci", name="l", max_length=9)
    key = fake_column(FIELD_TYPE.LONG, name="id")
    body = b"\x00\x01\x00\x00\x00\x02ab"
    for columns, packable in (([key, utf8], True), ([key, latin1], False)):
        native, python = codecs_of(columns)
        assert native.packable is packable and not python.packable
        assert python.decode_packed(body, 0, len(body), 1) is None
        got = native.decode_packed(body, 0, len(body), 1, "before")
        assert got == ((1, packb([(1, "ab")]), rowcodec.EMPTY_IMAGES) if packable else None)
    with pytest.raises(RowDecodeError):  # bounds are checked first, like decode
        codecs_of([key, latin1])[0].decode_packed(body, 0, len(body) + 1, 1)
    with pytest.raises(ValueError):
        codecs_of([key, utf8])[0].decode_packed(body, 0, len(body), 1, "both")  # type: ignore[arg-type]


def datetime2(year: int, fsp: int = 0) -> bytes:
    ymd = (year * 13 + 1) << 5 | 2
    return ((ymd << 17 | 3 << 12 | 4 << 6 | 5) + (1 << 39)).to_bytes(5, "big") + b"\x00" * (
        (fsp + 1) // 2
    )


def test_packed_leaves_values_for_the_reference_to_decode() -> None:
    """A DATETIME before year 1000, a DECIMAL group out of range, a FLOAT NaN: None for
    the whole body (decode gives them); the images around them pack."""
    columns = [fake_column(FIELD_TYPE.LONG, name="id"), fake_column(FIELD_TYPE.DATETIME2, fsp=0)]
    native = codecs_of(columns)[0]
    good, old = b"\x00\x01\x00\x00\x00" + datetime2(2024), b"\x00\x02\x00\x00\x00" + datetime2(999)
    body = good + old + good
    assert native.decode(body, 0, len(body), 1)[1] == (2, "999-01-02T03:04:05")  # (strftime)
    assert native.decode_packed(body, 0, len(body), 1) is None
    assert check_packed(native, body, 0, len(body), 1) == 0
    assert check_packed(native, body, 0, len(good), 1) == 1
    assert check_packed(native, body, len(good) + len(old), len(body), 1) == 1
    decimal = codecs_of([fake_column(FIELD_TYPE.NEWDECIMAL, precision=4, decimals=0)])[0]
    out_of_range = b"\xa7\x10"  # 10000 in a 4-digit group
    for raws, packs in (([b"\x80\x10", b"\x7f\xff"], True), ([b"\x80\x10", out_of_range], False)):
        body = b"".join(b"\x00" + raw for raw in raws)
        assert check_packed(decimal, body, 0, len(body), 1) == (2 if packs else 0)
    floats = codecs_of([fake_column(FIELD_TYPE.FLOAT)])[0]
    body = b"\x00" + struct.pack("<f", 1.1) + b"\x00\x00\x00\xc0\x7f"
    assert floats.decode_packed(body, 0, len(body), 1) is None
    assert check_packed(floats, body, 0, 5, 1) == 1


UTF8_VALID = [
    b"a", b"\x00", b"\x7f", b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf",
    b"\xee\x80\x80", b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", "😀é中".encode(),
    b"abcdefghij",
]  # fmt: skip
UTF8_INVALID = [
    b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xe0\x80\x80", b"\xe0\x9f\xbf",
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xe2\x82", b"\xf0\x9f\x98",
]  # fmt: skip


def test_packed_accepts_exactly_the_utf8_python_decodes() -> None:
    """Well-formed UTF-8 only: no overlong forms, surrogates, values above U+10FFFF or
    cut sequences (decode raises RowDecodeError there: so does decode_packed)."""
    rng = random.Random(8)
    column = text_column(FIELD_TYPE.BLOB, "utf8", "utf8mb4_general_ci", length_size=2)
    native = codecs_of([column])[0]
    valid = 0
    for _ in range(4000):
        pieces = [rng.choice(UTF8_VALID) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5:
            pieces.insert(rng.randint(0, len(pieces)), rng.choice(UTF8_INVALID))
        text = b"".join(pieces)
        if rng.random() < 0.2:
            text = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
        body = b"\x00" + struct.pack("<H", len(text)) + text
        valid += check_packed(native, body, 0, len(body), 1)
    assert 1000 < valid < 3000  # both kinds were tried


def test_packed_from_threads_at_once() -> None:
    """Several threads packing the same body (the GIL released) get the same bytes."""
    columns = [
        fake_column(FIELD_TYPE.LONG, name="id"), fake_column(FIELD_TYPE.DATETIME2, fsp=6),
        text_column(FIELD_TYPE.VARCHAR, "utf8", "utf8mb4_general_ci", name="s", max_length=40),
        fake_column(FIELD_TYPE.SET, name="m", size=1, set_values=["x", "yé", "z"]),
    ]  # fmt: skip
    native = codecs_of(columns)[0]
    image = b"\x00\x07\x00\x00\x00" + datetime2(2024, 6) + b"\x06h\xc3\xa9llo" + b"\x07"
    body = image * 20000
    want = native.decode_packed(body, 0, len(body), 2)
    assert want is not None and check_packed(native, body, 0, len(body), 2) == 20000
    assert msgpack.unpackb(want[1])[0] == [7, "2024-01-02T03:04:05.000000", "héllo", "x,yé,z"]
    results: list[Any] = []

    def work() -> None:
        results.extend(
            native.decode_packed(body, 0, len(body), 2, release_gil=True) for _ in range(10)
        )

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 40
    assert native.decode_packed(body, 0, len(body), 2, release_gil=False) == want
    big = body * 3  # released by default
    assert len(body) < rowcodec.NOGIL_MIN_BYTES <= len(big)
    assert native.decode_packed(big, 0, len(big), 2) == native.decode_packed(
        big, 0, len(big), 2, release_gil=False
    )
