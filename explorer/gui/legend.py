"""The colour legend: what each colour on the timeline means, for the current colour mode and frame.

    entries = legend_entries(frame, rows, "opcode")   # [LegendEntry("MATMUL", (31, 119, 180, 255), 246), ...]

In *engine* mode the colours are fixed per row kind (engines, DMA, collectives, counters), so the
legend lists the kinds the visible rows have. In *opcode / layer / HLO op* mode a colour is a hash of
the name, so the legend lists the names drawn in the current frame, the most frequent first (events
counted per pixel bucket), at most ``MAX_NAMES``; grey is "no name". The height of a bar is how busy
the row is in that pixel, whatever the mode (``formats.tracks``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from explorer.gui import colors
from explorer.gui.frames import FrameData
from explorer.gui.rows import ACTIVE, CC, COUNTER, DMA, INSTRUCTION, Row

MAX_NAMES = 12
BAR_NOTE = "bar height = share of the pixel the row is busy"


@dataclass(frozen=True)
class LegendEntry:
    name: str
    rgba: tuple[int, int, int, int]
    events: int = 0  # events of that colour in the frame (name modes)


def legend_entries(frame: FrameData | None, rows: Sequence[Row], mode: str) -> tuple[list[LegendEntry], int]:
    """(entries, names not listed) for the rows of ``frame`` (all rows when there is no frame)."""
    visible = [rows[i] for i in frame.request.rows] if frame is not None else list(rows)
    if mode == "engine" or mode not in colors.MODE_ATTR:
        out: list[LegendEntry] = []
        seen: set[str] = set()
        for row in visible:
            if row.kind in (INSTRUCTION, ACTIVE):
                name = row.shown
            elif row.kind == DMA:
                name = "DMA queue"
            elif row.kind == CC:
                name = "collective"
            elif row.kind == COUNTER:
                name = row.label.split(" (")[0]
            else:
                continue
            if name not in seen:
                seen.add(name)
                out.append(LegendEntry(name, colors.row_color(row.kind, row.track if row.kind != COUNTER
                                                              else row.label)))
        return out, 0
    attr = colors.MODE_ATTR[mode]
    counts: Counter[str | None] = Counter()
    if frame is not None:
        for index, window in frame.spans.items():
            if rows[index].kind != INSTRUCTION:
                continue
            names = window.attrs.get(attr)
            if names is None:
                counts[None] += int(window.count.sum())
                continue
            for name, n in zip(names.tolist(), window.count.tolist()):
                counts[name] += int(n)
    ranked = counts.most_common()
    shown = [(name, n) for name, n in ranked if name is not None][:MAX_NAMES]
    entries = [LegendEntry(str(name), colors.name_color(name), n) for name, n in shown]
    if counts.get(None):
        entries.append(LegendEntry(f"no {colors.MODE_LABELS[mode].lower()}", colors.UNKNOWN, counts[None]))
    hidden = len([name for name, _ in ranked if name is not None]) - len(shown)
    return entries, hidden


def legend_html(entries: Sequence[LegendEntry], hidden: int) -> str:
    """One line of coloured squares and names (rich text for a QLabel)."""
    parts = [
        f'<span style="color: rgb({e.rgba[0]},{e.rgba[1]},{e.rgba[2]}); font-size: 14px;">■</span>'
        f"&nbsp;{_escape(e.name)}"
        for e in entries
    ]
    if hidden:
        parts.append(f"… {hidden} more")
    parts.append(f'<span style="color: #777;">({BAR_NOTE})</span>')
    return " &nbsp; ".join(parts)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["LegendEntry", "legend_entries", "legend_html"]
