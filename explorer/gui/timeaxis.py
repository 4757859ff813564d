"""Time labels in ns / µs / ms / s, the unit chosen from the tick spacing so every label is short.

Timeline coordinates are nanoseconds relative to the profile's origin (``session``); the axis only
formats them. ``format_ns`` and ``parse_time`` are shared with the details panel and ``--range``.
"""

from __future__ import annotations

import re

import pyqtgraph as pg

UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))
_DISPLAY = {"us": "µs"}
_TIME_RE = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)?\s*$")


def unit_for(spacing_ns: float) -> tuple[str, float]:
    for name, scale in UNITS:
        if spacing_ns >= scale:
            return name, scale
    return "ns", 1.0


def format_ns(value: float, *, digits: int = 3) -> str:
    """``1234567`` -> ``1.235 ms``: the largest unit in which the value is at least 1."""
    magnitude = abs(value)
    name, scale = unit_for(magnitude if magnitude else 1.0)
    text = f"{value / scale:.{digits}f}".rstrip("0").rstrip(".") if scale > 1 else f"{value:.0f}"
    return f"{text} {_DISPLAY.get(name, name)}"


def parse_time(text: str) -> int:
    """``"12.5us"`` -> 12500 ns; a bare number is nanoseconds. ValueError on anything else."""
    match = _TIME_RE.match(text)
    if not match:
        raise ValueError(f"not a time: {text!r} (a number with an optional unit ns, us, ms or s)")
    unit = (match.group(2) or "ns").replace("µs", "us")
    return round(float(match.group(1)) * dict(UNITS)[unit])


class TimeAxis(pg.AxisItem):
    """Bottom axis of the timeline: relative time with an adaptive unit."""

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        name, unit = unit_for(spacing)
        decimals = 0
        step = spacing / unit
        while step < 1 and decimals < 6:
            step *= 10
            decimals += 1
        label = _DISPLAY.get(name, name)
        return [f"{v / unit:.{decimals}f} {label}" for v in values]
