"""A column value's text as Canal writes it into ``Column.value``.

canal-ha's values are lossless Python values (docs/api.md, "Values"); Canal's are the
text that ``LogEventConvert`` makes of ``RowsLogBuffer``'s Java values. These functions
go from the first to the second, one per kind of column:

- FLOAT / DOUBLE: Java's ``Float.toString`` / ``Double.toString`` (``1.0E10``, ``0.1``,
  ``-0.0``, ``4.9E-324``): the shortest decimal that reads back as the same float32 /
  double (Java 19+'s rule, a second digit allowed where it is closer), plain between
  1e-3 and 1e7, else ``d.dddE±n``.
- DECIMAL: ``BigDecimal.toPlainString``: plain, the column's scale kept, no ``-0``.
- DATETIME ``yyyy-MM-dd HH:mm:ss[.f]``; TIMESTAMP the same in a time zone (Canal: its
  JVM's default zone; here the node's local zone unless one is given), zero dates as
  ``0000-00-00 00:00:00``; DATE and TIME as canal-ha has them (the same text).
- YEAR ``0000`` for zero; ENUM the member's 1-based index (0: the empty error value);
  SET the members' bitmask as a number; BIT the number.
- BINARY / VARBINARY / BLOB / GEOMETRY: the bytes as ISO-8859-1 text, one character
  per byte; BINARY(n) without the trailing 0x00 bytes the binlog does not store.
"""

from __future__ import annotations

import calendar
import datetime
import re
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

__all__ = [
    "EnumIndex",
    "SetBits",
    "binary_text",
    "bit_text",
    "datetime_text",
    "decimal_text",
    "enum_index_text",
    "fixed_binary_text",
    "java_double",
    "java_float",
    "json_text",
    "members",
    "set_bits_text",
    "string_text",
    "timestamp_text",
    "year_text",
]

_F32 = struct.Struct("<f")
_ZERO_DATETIME = "0000-00-00 00:00:00"


# -- floating point ----------------------------------------------------------------------


def _java_text(negative: bool, digits: str, exp: int) -> str:
    """``d.ddd × 10^exp`` in Java's ``Double.toString`` layout."""
    if -3 <= exp < 7:
        if exp >= 0:
            whole = digits[: exp + 1].ljust(exp + 1, "0")
            frac = digits[exp + 1 :] or "0"
        else:
            whole, frac = "0", "0" * (-exp - 1) + digits
        text = f"{whole}.{frac}"
    else:
        text = f"{digits[0]}.{digits[1:] or '0'}E{exp}"
    return "-" + text if negative else text


def _split(sci: str) -> tuple[str, int]:
    """``"1.2500e+03"`` (Python's ``e`` format) → significant digits and exponent."""
    mantissa, _, exp = sci.partition("e")
    digits = mantissa.replace(".", "").rstrip("0") or "0"
    return digits, int(exp)


def _two_digits(x: float, digits: str, exp: int, same: Callable[[float], bool]) -> tuple[str, int]:
    """Java's rule for a one-digit shortest decimal: a two-digit one that reads back as
    ``x`` and is closer to it wins (``Double.MIN_VALUE`` is ``4.9E-324``, not ``5E-324``)."""
    if len(digits) != 1:
        return digits, exp
    two, two_exp = _split(f"{x:.1e}")
    if two != digits and same(float(f"{two[0]}.{two[1:]}e{two_exp}")):
        exact = Decimal(x)
        one = Decimal(f"{digits}e{exp}")
        if abs(Decimal(f"{two[0]}.{two[1:]}e{two_exp}") - exact) < abs(one - exact):
            return two, two_exp
    return digits, exp


def _integral_digits(x: float, significand_bits: int) -> tuple[str, int] | None:
    """Java 8-18's digits for a whole number below 2^63 too large to be exact in the
    type (Java 19+ prints the shortest digits there): the integer's own digits, rounded
    half up at the last place its 2^(exponent - significand bits - 1) unit reaches,
    trailing zeros dropped (a float 2915093760 prints as ``2.91509376E9``, not
    ``2.9150938E9``). None where the shortest digits are Java 8-18's too."""
    if x >= 9.223372036854775808e18 or x < 2.0**significand_bits or x != int(x):
        return None
    value = int(x)
    p2 = value.bit_length() - 1 - significand_bits - 1
    drop = len(str(1 << p2)) - 1 if p2 > 1 else 0  # the decimal digits of 2^p2, less one
    if drop:
        unit = 10**drop
        value, rest = divmod(value, unit)
        if rest >= unit // 2:
            value += 1
    text = str(value)
    digits = text.rstrip("0")
    return digits, len(text) - 1 + drop


def java_double(x: float) -> str:
    """Java's ``Double.toString(x)``."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    negative = x < 0 or (x == 0 and str(x).startswith("-"))
    x = abs(x)
    if x == 0:
        return "-0.0" if negative else "0.0"
    whole = _integral_digits(x, 53)
    if whole is not None:
        return _java_text(negative, *whole)
    digits, exp = _split(_sci(repr(x)))
    digits, exp = _two_digits(x, digits, exp, lambda y: y == x)
    return _java_text(negative, digits, exp)


def _sci(shortest: str) -> str:
    """Python's shortest ``repr`` of a positive float as ``d.ddde±n``."""
    if "e" in shortest:
        mantissa, _, exp = shortest.partition("e")
        return f"{mantissa}e{int(exp)}"
    whole, _, frac = shortest.partition(".")
    if whole != "0":
        return f"{whole[0]}.{whole[1:]}{frac}e{len(whole) - 1}"
    stripped = frac.lstrip("0")
    return f"{stripped[0]}.{stripped[1:]}e{-(len(frac) - len(stripped) + 1)}"


def _as_float32(x: float) -> float:
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:  # a decimal rounded up past the largest float32
        return float("inf")


def java_float(x: float) -> str:
    """Java's ``Float.toString`` of the float32 nearest ``x`` (canal-ha's FLOAT values
    are the float32's shortest decimal already)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    negative = x < 0 or (x == 0 and str(x).startswith("-"))
    f = _as_float32(abs(x))
    if f == 0:
        return "-0.0" if negative else "0.0"
    whole = _integral_digits(f, 24)
    if whole is not None:
        return _java_text(negative, *whole)

    def same(y: float) -> bool:
        return _as_float32(y) == f

    for n in range(1, 10):  # a float32 needs at most 9 significant digits
        sci = f"{f:.{n - 1}e}"
        digits, exp = _split(sci)
        if same(float(sci)):
            break
    digits, exp = _two_digits(f, digits, exp, same)
    return _java_text(negative, digits, exp)


# -- exact numbers ------------------------------------------------------------------------


def decimal_text(v: Any) -> str:
    """``BigDecimal.toPlainString`` of a DECIMAL (canal-ha: plain text with its scale)."""
    text = v if isinstance(v, str) else format(Decimal(v), "f")
    if text.startswith("-") and not text.strip("-0."):
        return text[1:]  # BigDecimal has no negative zero
    return text


def bit_text(v: Any) -> str:
    return str(int(v))


def year_text(v: Any) -> str:
    year = int(v)
    return "0000" if year == 0 else str(year)


# -- temporal -----------------------------------------------------------------------------


def datetime_text(v: Any) -> str:
    """DATETIME: canal-ha's ``YYYY-MM-DDTHH:MM:SS[.f]`` with a space for the ``T``."""
    text = str(v).replace("T", " ", 1)
    year, dash, rest = text.partition("-")
    return text if len(year) == 4 else f"{int(year):04d}{dash}{rest}"


def timestamp_text(v: Any, zone: datetime.tzinfo | None = None) -> str:
    """TIMESTAMP: canal-ha's UTC ``...Z`` text as local time in ``zone`` (None: the
    process's local zone, as a Canal server prints it in its JVM's default zone)."""
    text = str(v).rstrip("Z")
    whole, dot, frac = text.partition(".")
    if whole.startswith("0000-00-00"):
        return _ZERO_DATETIME + dot + frac
    moment = calendar.timegm(
        (int(whole[0:4]), int(whole[5:7]), int(whole[8:10]),
         int(whole[11:13]), int(whole[14:16]), int(whole[17:19]), 0, 0, 0)
    )  # fmt: skip
    if zone is None:
        local = datetime.datetime.fromtimestamp(moment)
    else:
        local = datetime.datetime.fromtimestamp(moment, zone)
    return (
        f"{local.year:04d}-{local.month:02d}-{local.day:02d} "
        f"{local.hour:02d}:{local.minute:02d}:{local.second:02d}{dot}{frac}"
    )


# -- strings and bytes --------------------------------------------------------------------


def string_text(v: Any) -> str:
    """CHAR / VARCHAR / TEXT / JSON: the text (canal-ha has it decoded already)."""
    return v if v.__class__ is str else bytes(v).decode("utf-8")


def binary_text(v: Any) -> str:
    """Binary bytes as Canal keeps them: ISO-8859-1 text, a character per byte."""
    return bytes(v).decode("latin-1")


def fixed_binary_text(v: Any) -> str:
    """BINARY(n): the binlog stores it without its trailing 0x00 padding (canal-ha pads
    it back to n as SELECT returns it; Canal gives the stored bytes)."""
    return bytes(v).rstrip(b"\0").decode("latin-1")


def _json_escape(text: str) -> str:
    """A JSON string's characters as Canal's ``JsonConversion`` escapes them."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[ch])
        elif code < 32 or 0x7F <= code <= 0xA0:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


_JSON_ESCAPES = {'"': '\\"', "\n": "\\n", "\r": "\\r", "\\": "\\\\", "\t": "\\t"}


def _json(v: Any) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f'"{_json_escape(_str(k))}": {_json(x)}' for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_json(x) for x in v) + "]"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return java_double(v)
    if isinstance(v, Decimal):
        return decimal_text(v)
    if isinstance(v, datetime.datetime | datetime.date):
        if not isinstance(v, datetime.datetime):
            v = datetime.datetime(v.year, v.month, v.day)
        return f'"{v.year:04d}-{v.month:02d}-{v.day:02d} {v:%H:%M:%S}.{v.microsecond:06d}"'
    if isinstance(v, datetime.timedelta | datetime.time):
        if isinstance(v, datetime.time):
            v = datetime.timedelta(hours=v.hour, minutes=v.minute, seconds=v.second,
                                   microseconds=v.microsecond)  # fmt: skip
        micro = (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
        if micro == 0:
            return '"00:00:00"'  # Canal: a zero TIME without its fraction
        sign = "-" if micro < 0 else ""
        secs, frac = divmod(abs(micro), 1_000_000)
        return f'"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}.{frac:06d}"'
    return f'"{_json_escape(_str(v))}"'


def _str(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)


def json_text(v: Any) -> str:
    """MySQL's JSON: its text, as Canal's ``JsonConversion`` writes the binary form
    (``{"k": 1, "a": [1, 2.5]}``: ``", "`` and ``": "``, doubles as Java prints them,
    DECIMAL plain, DATETIME and TIME quoted with six fraction digits); a value canal-ha
    has as text already is given as it is."""
    if isinstance(v, str):
        return v
    return _json(v)


_MEMBER = re.compile(r"'((?:[^']|'')*)'")


def members(mysql_type: str) -> tuple[str, ...]:
    """The members of ``enum('a','b')`` / ``set('x','y')`` in definition order."""
    inner = mysql_type[mysql_type.index("(") + 1 : mysql_type.rindex(")")]
    return tuple(m.replace("''", "'") for m in _MEMBER.findall(inner))


class EnumIndex:
    """ENUM's text: Canal gives the member's 1-based index, 0 for the empty error value.
    ``names``: the members (the C encoder reads them)."""

    __slots__ = ("_index", "names")

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._index = {name: str(i) for i, name in enumerate(self.names, start=1)}

    def __call__(self, v: Any) -> str:
        return self._index.get(str(v), "0")


class SetBits:
    """SET's text: Canal gives the bitmask of the members (bit i for the i-th member).
    ``names``: the members (the C encoder reads them)."""

    __slots__ = ("_bit", "names")

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._bit = {name: 1 << i for i, name in enumerate(self.names)}

    def __call__(self, v: Any) -> str:
        bit = self._bit
        return str(sum(bit.get(m, 0) for m in str(v).split(",") if m))


def enum_index_text(names: Sequence[str]) -> Callable[[Any], str]:
    """ENUM: Canal gives the member's 1-based index, 0 for the empty error value."""
    return EnumIndex(names)


def set_bits_text(names: Sequence[str]) -> Callable[[Any], str]:
    """SET: Canal gives the bitmask of the members (bit i for the i-th member)."""
    return SetBits(names)
