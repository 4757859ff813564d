"""neuron-ls ``--topology`` drawings (sys-tools.md §4.6), character for character.

The 4x4 torus (trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge) is the documented drawing: rows of
``[%2d ]`` cells joined by ``◄––►`` (U+25C4, two U+2013 EN DASHes, U+25BA) with ``*––►`` / ``◄––*``
wrap-around markers, and ``*``/``│``/``▼``/``▲`` columns on the cell centres, padded to the row
width. The inf2 ring has no published drawing; it is drawn as the natural reading of the same
vocabulary: one row whose ends wrap to each other. A single device is its cell alone, with no
legend (it has no links). Anything else is drawn as a chain, like the documented inf1 line.
"""

from __future__ import annotations

LINK = "◄––►"
WRAP_LEFT = "*––►"
WRAP_RIGHT = "◄––*"
LEGEND = ("", "Legend:", "", "        *––► = Wrap-around link")
HEADING = "Neuron Device Topology"


def cell(index: int) -> str:
    return f"[{index:2d} ]"


def _row(indices: list[int], wrap: bool) -> str:
    body = LINK.join(cell(i) for i in indices)
    return f"{WRAP_LEFT}{body}{WRAP_RIGHT}" if wrap else body


def _markers(symbol: str, columns: int, width: int) -> str:
    line = [" "] * width
    for c in range(columns):
        line[len(WRAP_LEFT) + 2 + c * (len(cell(0)) + len(LINK))] = symbol
    return "".join(line)


def torus(rows: int, cols: int) -> list[str]:
    """The wrap-around 2D torus of ``rows`` x ``cols`` devices (device = cols * r + c)."""
    width = len(_row(list(range(cols)), wrap=True))
    lines = [_markers(s, cols, width) for s in ("*", "│", "▼")]
    for r in range(rows):
        if r:
            lines += [_markers(s, cols, width) for s in ("▲", "│", "▼")]
        lines.append(_row([r * cols + c for c in range(cols)], wrap=True))
    lines += [_markers(s, cols, width) for s in ("▲", "│", "*")]
    return [*lines, *LEGEND]


def ring(devices: int) -> list[str]:
    return [_row(list(range(devices)), wrap=True), *LEGEND]


def chain(devices: int) -> list[str]:
    return [_row(list(range(devices)), wrap=False)]


def drawing(topology: str, devices: int) -> list[str]:
    """The lines after the heading for an inventory's topology name and device count."""
    if topology == "torus-4x4" and devices == 16:
        return torus(4, 4)
    if devices == 1:
        return [cell(0)]
    if topology == "ring":
        return ring(devices)
    return chain(devices)


__all__ = ["HEADING", "LEGEND", "chain", "drawing", "ring", "torus"]
