"""The engine timeline strip: how busy each engine is in each character cell of a time range.

Exact, not a level-of-detail lower bound: each cell is ``busy_rows`` (docs/figures.md: the union of
the row's instruction intervals within the cell, over the cell's width; every row in one call), and
each row's figure on the right is ``formats.figures``' busy fraction over the same range
(``engine_busy`` / ``track_busy``): the Summary's "Tensor active" is that figure over the whole
execution, so the strip and the Summary say the same thing. ``mean(cells) == figure``, which the tests check.

The Tensor engine runs two timeline rows (profile-schema §2.5): ``Tensor`` (LoadStationary: weight
loads, transposes) and ``TensorMatrix`` (MATMUL streaming). Where a profile has both, the strip shows
the engine's union first (``Tensor∪``, what the Summary's Tensor figure measures) and the two rows
under it, labelled; a short strip keeps only the union. The opcode named per row is the one with the
most instruction time in the range (``busiest_opcodes``: one grouped scan). All from
``formats.read_api``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.viewer.view_model import ENGINES, EngineStrip, StripRow
from formats.read_api import RowSelect, Window, busiest_opcodes, busy_rows, engine_busy, track_busy

if TYPE_CHECKING:
    from formats.read_api import Profile

LEVELS = " ▁▂▃▄▅▆▇█"
UNION_LABEL = "Tensor∪"

SPLIT_ROWS = (("╰LoadSt", "Tensor"), ("╰MATMUL", "TensorMatrix"))  # (label, timeline track)


def rows_for(split_tensor: bool) -> list[tuple[RowSelect, bool]]:
    """The strip's rows and whether each is a detail row (dropped when the strip is short)."""
    out: list[tuple[RowSelect, bool]] = []
    for engine in ENGINES:
        if engine == "Tensor" and split_tensor:
            out.append((RowSelect(UNION_LABEL, engines=("Tensor",)), False))
            out += [(RowSelect(label, tracks=(track,)), True) for label, track in SPLIT_ROWS]
        else:
            out.append((RowSelect(engine, engines=(engine,)), False))
    return out


def strip(profile: Profile, t0: int, t1: int, cells: int, *, split_tensor: bool = False) -> EngineStrip:
    """Occupancy rows over [t0, t1): the five engines, the Tensor engine's two rows too if split."""
    t1 = max(t1, t0 + 1)
    cells = max(1, cells)
    rows = rows_for(split_tensor)
    window = Window.span(t0, t1)
    engines = engine_busy(profile, window)
    tracks = track_busy(profile, window) if split_tensor else {}
    opcodes = busiest_opcodes(profile, t0, t1, [r for r, _ in rows])
    per_cell = busy_rows(profile, t0, t1, cells, [r for r, _ in rows])
    out = []
    for select, detail in rows:
        name = select.engines[0] if select.engines else select.tracks[0]
        busy = (engines if select.engines else tracks).get(name)
        fraction = busy.fraction if busy is not None and busy.fraction is not None else 0.0
        cells_busy = tuple(float(x) for x in per_cell[select.label].fraction)
        out.append(StripRow(select.label, cells_busy, float(fraction), opcodes[select.label], detail))
    return EngineStrip(t0, t1, tuple(out), "exact")


def bar(values: tuple[float, ...]) -> str:
    """Occupancy as block characters: blank idle, full block busy the whole cell; any busy time at
    all shows at least the lowest block."""
    top = len(LEVELS) - 1
    return "".join(LEVELS[0] if v <= 0 else LEVELS[max(1, min(top, round(v * top)))] for v in values)
