"""Number formatting of the viewer's panes: re-exported from ``formats.units``, the one convention
every view uses (docs/figures.md, "Units"): binary sizes (KiB/MiB/GiB), decimal GB/s, fractions as
percentages, ns/µs/ms/s, counts that never run together. Unknown values print as "-", never as 0.

Kept as a module so the viewer's imports stay as they were; new code imports ``formats.units``.
"""

from __future__ import annotations

from formats.read_api import UNKNOWN, fmt_bytes, fmt_count, fmt_ns, fmt_pct

__all__ = ["UNKNOWN", "ellipsize", "fmt_bytes", "fmt_count", "fmt_ns", "fmt_pct"]


def ellipsize(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
