"""Bounded, checked values from a neuron-monitor stream: one set of rules for every reader.

A stream may come from anywhere (``ssh host neuron-monitor | ...``, a file someone sent), so every
value is checked where it is read, never where it is drawn or exported: JSON lines have a length
limit and nesting that Python's decoder cannot take is a clear error, not a RecursionError; numbers
are finite and inside the range a real tool can send (NaN, ±Inf, ``1e400`` and integers of thousands
of digits are refused); counts of devices, cores and applications have ceilings far above any
instance, so no hostile count makes a reader's time or memory grow with it; text loses lone
surrogates and control characters (which could not be written to a UTF-8 terminal, or would drive
it) and is cut to a fixed length. A bad value raises ``BadValue`` (a ``ValueError``) whose message
says what was wrong, so the caller can skip that line or group, count it and name it.

Used by neuron-top's stream parser (``explorer.top.report``) and ``neuron-monitor-prometheus``.
"""

from __future__ import annotations

import json
import math
from typing import Any, TextIO

MAX_LINE_CHARS = 8 << 20  # a trn2.48xlarge report with hundreds of applications is well under 1 MiB
MAX_INT = 2**63 - 1  # the real tool's counters and byte counts are Go int64/uint64 in practice
MAX_PID = 2**31 - 1  # pid_t
MAX_DEVICES = 128  # the largest instance has 16 devices
MAX_CORES_PER_DEVICE = 64  # the largest device has 8 logical (16 physical) cores
MAX_CORES = MAX_DEVICES * MAX_CORES_PER_DEVICE
MAX_APPLICATIONS = 4096  # neuron_runtime_data entries in one report
MAX_ITEMS = 4096  # entries of any one per-core or per-model mapping or list
MAX_TEXT = 256  # tags are at most 255 characters (the runtime's limit)
MAX_PERIOD_S = 86400.0


TOO_LONG = "\0too long"  # read_bounded_line's stand-in for a line over the limit


class BadValue(ValueError):
    """A value from a stream that is not what the schema allows; the message says which and why."""


def brief(value: Any) -> str:
    """A short, printable description of a value for a message (never the whole of a big one)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(text(value, 40))
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # str() of a huge int is slow or refused
    return text(repr(value), 40)


def read_bounded_line(stream: TextIO, limit: int | None = None) -> str:
    """The next line of a text stream, or ``TOO_LONG`` for one over ``limit`` characters (its rest is
    read and dropped, never held); "" at the end of the stream."""
    limit = limit or MAX_LINE_CHARS
    line = stream.readline(limit + 1)
    if len(line) <= limit or line.endswith("\n"):
        return line
    while line and not line.endswith("\n"):
        line = stream.readline(limit)
    return TOO_LONG


def loads(line: str) -> Any:
    """One JSON line, decoded; BadValue if it is too long, too deeply nested or not JSON."""
    if len(line) > MAX_LINE_CHARS:
        raise BadValue(f"line of {len(line):,} characters is over the {MAX_LINE_CHARS:,} limit")
    try:
        return json.loads(line)
    except RecursionError:
        raise BadValue("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers over the interpreter's digit limit
        raise BadValue(f"not JSON ({text(str(exc), 80)})") from None


def number(value: Any, what: str, *, lo: float = -float(MAX_INT), hi: float = float(MAX_INT)) -> float:
    """A finite number in [lo, hi]; NaN, ±Inf, booleans and non-numbers are BadValue."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue(f"{what} is not a number: {brief(value)}")
    if isinstance(value, int):
        if not lo <= value <= hi:  # compare as int: float(10**400) would overflow
            raise BadValue(f"{what} {brief(value)} is out of range")
        return float(value)
    if not math.isfinite(value):
        raise BadValue(f"{what} is {value} (not a finite number)")
    if not lo <= value <= hi:
        raise BadValue(f"{what} {value:g} is out of range")
    return value


def integer(value: Any, what: str, *, lo: int = 0, hi: int = MAX_INT) -> int:
    """A whole number in [lo, hi] (a float with no fraction is accepted, as Go may send ``3e9``)."""
    as_float = number(value, what, lo=lo, hi=hi)
    if isinstance(value, int):
        return value
    if not as_float.is_integer():
        raise BadValue(f"{what} {as_float:g} is not a whole number")
    return int(as_float)


def index(key: Any, what: str, limit: int) -> int:
    """A mapping key that names an index (``"3"``) below ``limit``."""
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12:
        value = int(key)
        if value < limit:
            return value
    elif isinstance(key, int) and not isinstance(key, bool) and 0 <= key < limit:
        return key
    raise BadValue(f"{what} {brief(key)} is not an index below {limit}")


def sized(value: Any, what: str, limit: int = MAX_ITEMS) -> Any:
    """A dict or list of at most ``limit`` entries (the caller says which kind it expects)."""
    if isinstance(value, dict | list) and len(value) > limit:
        raise BadValue(f"{what} has {len(value):,} entries (limit {limit:,})")
    return value


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """Printable text of at most ``limit`` characters: lone surrogates and control characters
    become ``?``, containers are named rather than dumped."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    raw = value if isinstance(value, str) else brief(value) if isinstance(value, int | float) else str(value)
    cut = raw[:limit]
    if cut.isprintable() and cut.isascii():
        return cut
    return "".join(ch if ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF else "?" for ch in cut)


def period(value: Any) -> float | None:
    """A group's ``period`` in seconds, or None if it is missing or not a sensible duration."""
    try:
        return number(value, "period", lo=0.0, hi=MAX_PERIOD_S)
    except BadValue:
        return None


__all__ = ["MAX_APPLICATIONS", "MAX_CORES", "MAX_CORES_PER_DEVICE", "MAX_DEVICES", "MAX_INT", "MAX_ITEMS",
           "MAX_LINE_CHARS", "MAX_PERIOD_S", "MAX_PID", "MAX_TEXT", "TOO_LONG", "BadValue", "brief", "index",
           "integer", "loads", "number", "period", "read_bounded_line", "sized", "text"]
