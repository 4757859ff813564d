"""Number formatting shared by the viewer's panes: short, fixed-ish width, "-" for unknown.

Fractions are shown as percentages (profile-schema §2.3: Summary ``_percent`` fields are fractions;
interfaces show them x100). Unknown values print as "-", never as 0.
"""

from __future__ import annotations

UNKNOWN = "-"


def fmt_ns(ns: float | None) -> str:
    """1234 -> '1.23 µs'; durations in the unit that keeps three significant digits."""
    if ns is None:
        return UNKNOWN
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_pct(fraction: float | None) -> str:
    if fraction is None:
        return UNKNOWN
    value = 100.0 * float(fraction)
    if value != 0 and abs(value) < 0.1:
        return "<0.1 %"
    return f"{value:.1f} %"


def fmt_bytes(count: float | None) -> str:
    if count is None:
        return UNKNOWN
    count = float(count)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def fmt_count(count: int | None) -> str:
    if count is None:
        return UNKNOWN
    if count >= 10_000_000:
        return f"{count / 1e6:.0f}M"
    if count >= 100_000:
        return f"{count / 1e3:.0f}k"
    return str(count)


def ellipsize(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
