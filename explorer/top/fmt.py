"""Number formats of neuron-top (sys-tools.md §3.5), shared by the TUI and ``--once``.

Sizes, rates and percentages are ``formats.units`` (the one convention of every view:
docs/figures.md); what is only neuron-top's (TFLOPS cells, ages, core ranges, sparklines) is here.

Kept apart from any widget so the screen and the plain-text frame print the same characters, and so
the formats the real tool uses (which scripts and eyes are used to) are tested in one place.
"""

from __future__ import annotations

import math
from functools import partial

from formats.read_api import fmt_bytes, fmt_rate, percent_cell

SPARK = "▁▂▃▄▅▆▇█"

# the one convention (formats.units), in the no-space spelling of table cells: no second copy here
percent = percent_cell  # ``%5.2f%%`` in 6 cells, ``  100%`` from 99.995 on (the real tool's cells)
size = partial(fmt_bytes, space=False)  # ``0B``, ``256.0KiB``, ``17.5GiB``; ``-`` if unknown
rate = partial(fmt_rate, space=False)  # ``12.3GB/s``; ``-`` if unknown


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


__all__ = ["SPARK", "age", "core_ranges", "fit", "percent", "rate", "size", "sparkline", "tail",
           "tflops"]
