"""The engine timeline strip: per-engine occupancy of a time range, one character cell per bucket.

Built on ``formats.viewport.engine_window`` (the longest instruction per pixel bucket, from the raw
table when zoomed in and from ``InstructionLod`` when zoomed out), asked for ``SUBCELLS`` buckets per
character cell. Each returned instruction is painted over the sub-buckets it covers, and a cell's
occupancy is the covered fraction of its sub-buckets. Zoomed in (a node's range), sub-buckets are
about an instruction long and the figure is close to exact; zoomed out it is a lower bound (only the
longest instruction of each sub-bucket is known), which the strip says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from explorer.viewer.model import ENGINES, Timeline, TimelineRow

if TYPE_CHECKING:
    from formats.reader import Profile

SUBCELLS = 8
LEVELS = " ▁▂▃▄▅▆▇█"


def occupancy(starts: np.ndarray, ends: np.ndarray, t0: int, t1: int, cells: int) -> np.ndarray:
    """Fraction of each of ``cells`` equal cells of [t0, t1) covered by the given intervals, measured
    on a grid of ``cells * SUBCELLS`` sub-buckets (a sub-bucket counts as covered in proportion)."""
    buckets = cells * SUBCELLS
    width = (t1 - t0) / buckets
    covered = np.zeros(buckets + 1, np.float64)
    if starts.size:
        s = np.clip((starts.astype(np.float64) - t0) / width, 0, buckets)
        e = np.clip((ends.astype(np.float64) - t0) / width, 0, buckets)
        # difference array over sub-bucket edges: whole sub-buckets between ceil(s) and floor(e) ...
        first, last = np.ceil(s).astype(np.int64), np.floor(e).astype(np.int64)
        whole = last > first
        np.add.at(covered, first[whole], 1.0)
        np.add.at(covered, last[whole], -1.0)
        dense = np.minimum(np.cumsum(covered)[:buckets], 1.0)
        # ... plus the partial sub-buckets at each end
        partial = np.zeros(buckets, np.float64)
        lo = np.minimum(np.floor(s).astype(np.int64), buckets - 1)
        same = lo == np.floor(np.minimum(e, buckets - 1e-9)).astype(np.int64)
        np.add.at(partial, lo[same], (e - s)[same])
        head = ~same
        np.add.at(partial, lo[head], (first - s)[head])
        tail = head & (last < buckets)
        np.add.at(partial, last[tail], (e - last)[tail])
        dense = np.minimum(dense + partial, 1.0)
    else:
        dense = np.zeros(buckets)
    return dense.reshape(cells, SUBCELLS).mean(axis=1)


def strip(profile: Profile, t0: int, t1: int, cells: int) -> Timeline:
    """Occupancy rows for the five engines over [t0, t1)."""
    from formats.viewport import engine_window

    t1 = max(t1, t0 + 1)
    cells = max(1, cells)
    rows = []
    source = "instructions"
    for engine in ENGINES:
        window = engine_window(profile, engine, t0, t1, buckets=cells * SUBCELLS)
        source = window.source if window.source != "instructions" else source
        occ = occupancy(window.start_ts, window.end_ts, t0, t1, cells)
        top = ""
        if len(window):
            counts: dict[str, int] = {}
            for op, d in zip(window.opcode, window.duration_ns.tolist()):
                counts[op] = counts.get(op, 0) + int(d)
            top = max(counts.items(), key=lambda kv: kv[1])[0]
        rows.append(TimelineRow(engine, tuple(float(x) for x in occ), float(occ.mean()), top))
    return Timeline(t0, t1, tuple(rows), source)


def bar(values: tuple[float, ...]) -> str:
    """Occupancy as block characters: blank idle, full block busy the whole cell."""
    top = len(LEVELS) - 1
    return "".join(LEVELS[0] if v <= 0 else LEVELS[max(1, min(top, round(v * top)))] for v in values)
