"""Colours: one fixed colour per engine (the rows a user learns to read at a glance), and a stable
colour per opcode / layer / HLO op (a hash of the name, so the same op has the same colour in every
session, every profile and both halves of a comparison).

Colours are RGBA ``uint8`` arrays so the raster can index them with NumPy; ``qcolor`` converts one
for Qt code.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

BACKGROUND = (255, 255, 255, 255)
ROW_STRIPE = (246, 247, 250, 255)
HEADER_FILL = (226, 230, 238, 255)
GRID = (214, 218, 226, 255)
UNKNOWN = (170, 170, 170, 255)

ENGINE_COLORS: dict[str, tuple[int, int, int, int]] = {
    "Tensor": (78, 121, 167, 255),  # blue
    "TensorMatrix": (31, 72, 130, 255),  # dark blue: the PE array's moving stream
    "Vector": (89, 161, 79, 255),  # green
    "Scalar": (242, 142, 43, 255),  # orange
    "GpSimd": (176, 122, 161, 255),  # purple
    "Sync": (118, 183, 178, 255),  # teal
    "DMA": (156, 117, 95, 255),  # brown
    "CC": (225, 87, 89, 255),  # red
    "Counter": (237, 201, 72, 255),  # yellow
}

COUNTER_COLORS: dict[str, tuple[int, int, int, int]] = {
    "HBM": (237, 201, 72, 255),
    "DMA": (156, 117, 95, 255),
    "NeuronLink": (225, 87, 89, 255),
    "EFA": (225, 87, 89, 255),
    "on-chip": (255, 157, 167, 255),
    "PSUM": (186, 176, 172, 255),
    "SBUF": (186, 176, 172, 255),
    "Pending": (140, 140, 140, 255),
}

# Tableau-20-like categorical palette for names (opcodes, layers, HLO ops).
PALETTE = np.array(
    [
        (31, 119, 180),
        (174, 199, 232),
        (255, 127, 14),
        (255, 187, 120),
        (44, 160, 44),
        (152, 223, 138),
        (214, 39, 40),
        (255, 152, 150),
        (148, 103, 189),
        (197, 176, 213),
        (140, 86, 75),
        (196, 156, 148),
        (227, 119, 194),
        (247, 182, 210),
        (127, 127, 127),
        (188, 189, 34),
        (219, 219, 141),
        (23, 190, 207),
        (158, 218, 229),
        (57, 59, 121),
    ],
    dtype=np.uint8,
)

COLOR_MODES = ("engine", "opcode", "layer", "hlo")
MODE_LABELS = {"engine": "Engine", "opcode": "Opcode", "layer": "Layer", "hlo": "HLO op"}
MODE_ATTR = {"opcode": "opcode", "layer": "layer", "hlo": "hlo_name"}


def name_color(name: str | None) -> tuple[int, int, int, int]:
    """A stable colour for a name (grey for None)."""
    if name is None:
        return UNKNOWN
    r, g, b = PALETTE[zlib.crc32(str(name).encode()) % len(PALETTE)]
    return int(r), int(g), int(b), 255


def name_colors(names: Sequence[object] | np.ndarray) -> np.ndarray:
    """RGBA (n, 4) for an array of names; the hash is computed once per distinct name."""
    values = np.asarray(names, dtype=object)
    out = np.empty((values.size, 4), np.uint8)
    if values.size == 0:
        return out
    keyed = np.array(["\x00" if v is None else str(v) for v in values.tolist()], dtype=object)
    uniq, inverse = np.unique(keyed, return_inverse=True)
    table = np.array([UNKNOWN if u == "\x00" else name_color(u) for u in uniq.tolist()], np.uint8)
    out[:] = table[inverse.reshape(-1)]
    return out


def row_color(kind: str, track: str | None) -> tuple[int, int, int, int]:
    """The fixed colour of a row in ``engine`` mode (``track``: the engine track, or a counter's label)."""
    if kind == "instruction":
        return ENGINE_COLORS.get(track or "", ENGINE_COLORS.get("Tensor" if track is None else "", UNKNOWN))
    if kind == "active":  # an engine's busy stretches: its own colour
        return ENGINE_COLORS.get(track or "", UNKNOWN)
    if kind == "dma":
        return ENGINE_COLORS["DMA"]
    if kind == "cc":
        return ENGINE_COLORS["CC"]
    for prefix, color in COUNTER_COLORS.items():
        if (track or "").startswith(prefix):
            return color
    return ENGINE_COLORS["Counter"]


def dim(colors: np.ndarray, amount: float = 0.75) -> np.ndarray:
    """Blend towards the background (highlight mode draws everything else faded)."""
    bg = np.array(BACKGROUND, np.float32)
    out = colors.astype(np.float32) * (1 - amount) + bg * amount
    return out.astype(np.uint8)


def qcolor(rgba: Sequence[int]) -> object:
    """A QColor (imported lazily: this module is used without Qt)."""
    from PySide6.QtGui import QColor

    return QColor(int(rgba[0]), int(rgba[1]), int(rgba[2]), int(rgba[3]) if len(rgba) > 3 else 255)
