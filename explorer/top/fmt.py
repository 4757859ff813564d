"""Number formats of neuron-top (sys-tools.md §3.5), shared by the TUI and ``--once``.

Kept apart from any widget so the screen and the plain-text frame print the same characters, and so
the formats the real tool uses (which scripts and eyes are used to) are tested in one place.
"""

from __future__ import annotations

import math

UNITS = ("B", "KB", "MB", "GB", "TB", "PB", "EB")
SPARK = "▁▂▃▄▅▆▇█"


def percent(value: float) -> str:
    """``%5.2f%%``; anything above 99.995 prints as ``  100%`` (6 characters), as the real tool."""
    text = f"{max(value, 0.0):5.2f}"
    if value > 99.995 or text == "100.00":  # 99.995 itself rounds up: never print 7 characters
        return "  100%"
    return text + "%"


def size(n: float | None) -> str:
    """Bytes in base 1024 with one decimal: ``0.0B``, ``256.0KB``, ``17.5GB``; ``-`` if unknown."""
    if n is None:
        return "-"
    value = float(max(n, 0))
    unit = 0
    while value >= 1024.0 and unit < len(UNITS) - 1:
        value /= 1024.0
        unit += 1
    text = f"{value:.1f}"
    if text == "1024.0" and unit < len(UNITS) - 1:  # 1023.96 KB rounds up: say 1.0MB, not 1024.0KB
        text, unit = "1.0", unit + 1
    return f"{text}{UNITS[unit]}"


def rate(bytes_per_s: float | None) -> str:
    """A throughput as ``size`` per second (``12.3GB/s``)."""
    return "-" if bytes_per_s is None else f"{size(bytes_per_s)}/s"


def tflops(flops: float, width: int = 0) -> str:
    """FLOP/s as TFLOPS with 3 decimals plus ``TF``; ``width`` pads the number (grid cells use 7)."""
    return f"{flops / 1e12:{width}.3f}TF"


def age(seconds: float | None) -> str:
    """A duration in at most two units: ``42s``, ``3m07s``, ``2h05m``, ``4d03h``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def core_ranges(cores: list[int] | tuple[int, ...]) -> str:
    """Core ids as ranges, ``0-7,16``: what ``NEURON_RT_VISIBLE_CORES`` accepts."""
    ids = sorted(set(cores))
    if not ids:
        return "-"
    parts = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def sparkline(values: tuple[float, ...] | list[float], width: int, top: float | None = None) -> str:
    """The last ``width`` values as block characters, scaled to ``top`` (default: their maximum).

    Missing history (fewer values than the width) is left blank on the left, so time always runs
    to the right edge, like a strip chart."""
    if width <= 0:
        return ""
    tail = list(values)[-width:]
    peak = top if top is not None else max(tail, default=0.0)
    chars = []
    for v in tail:
        if peak <= 0 or v <= 0:
            chars.append(SPARK[0] if peak > 0 or v == 0 else " ")
            continue
        level = min(int(v / peak * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)
        chars.append(SPARK[max(level, 0)])
    return " " * (width - len(tail)) + "".join(chars)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` with an ellipsis instead of silently (the real tool's hint cells
    lose letters on narrow terminals; a visible ``…`` says something is missing)."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if width > 1 else text[:width]


def tail(text: str, width: int) -> str:
    """The last ``width`` characters (model names: the file name is at the end, as the real tool)."""
    return text if len(text) <= width else text[len(text) - width:]


__all__ = ["SPARK", "UNITS", "age", "core_ranges", "fit", "percent", "rate", "size", "sparkline", "tail",
           "tflops"]
