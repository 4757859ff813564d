"""How tensors map onto the 128 partitions: tiles, packing of small batches, row locations.

A value of shape ``(*batch, R, C)`` in ``row`` layout is tiles of at most 128 partitions by ``C``
free elements, one run of tiles per batch index; in ``col`` layout a ``(*batch, R)`` tensor is
``[rows, 1]`` tiles. These functions are pure: the compiler and the numerics interpreter both use
them, so the two always agree on where a row lives.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from neuroncore.compiler.lowering_state import Layout
from neuroncore.compiler.program import HbmAccess

P = 128


def _logical_grid(shape: tuple[int, ...], layout: Layout) -> tuple[int, int, int]:
    if layout == Layout.COL:
        rows = shape[-1] if shape else 1
        return math.prod(shape[:-1]) if shape else 1, rows, 1
    if len(shape) == 0:
        return 1, 1, 1
    if len(shape) == 1:
        return 1, 1, shape[0]
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def is_packed(shape: tuple[int, ...], layout: Layout) -> bool:
    """Batches of fewer than 128 rows (dividing 128) share tiles: ``128 / rows`` batches per tile.

    Without packing, 32 attention heads of one decode row each would be 32 single-partition tiles
    and every elementwise op would run 32 times on one lane of 128.
    """
    batches, rows, _ = _logical_grid(shape, layout)
    return batches > 1 and rows < P and P % rows == 0


def tile_grid(shape: tuple[int, ...], layout: Layout) -> tuple[int, int, int]:
    """(batches, rows per batch, cols) of the tiling: packed tensors are one batch of all rows."""
    batches, rows, cols = _logical_grid(shape, layout)
    if is_packed(shape, layout):
        return 1, batches * rows, cols
    return batches, rows, cols


def locate(shape: tuple[int, ...], layout: Layout, batch: int, row: int) -> tuple[int, int]:
    """(tile index, partition) of row ``row`` of logical batch ``batch``."""
    _, rows, _ = _logical_grid(shape, layout)
    if is_packed(shape, layout):
        flat = batch * rows + row
        return flat // P, flat % P
    return batch * math.ceil(rows / P) + row // P, row % P


def batch_rows_access(name: str, shape: tuple[int, ...], batch: int, r0: int, r1: int, c0: int,
                      c1: int) -> HbmAccess:
    """HBM access to rows [r0, r1) of logical batch ``batch`` of a row-layout tensor."""
    if is_packed(shape, Layout.ROW):
        _, rows, _ = _logical_grid(shape, Layout.ROW)
        return HbmAccess(name, 0, batch * rows + r0, batch * rows + r1, c0, c1)
    return HbmAccess(name, batch, r0, r1, c0, c1)


@dataclass(frozen=True, slots=True)
class Tile:
    batch: int
    r0: int
    r1: int

    @property
    def rows(self) -> int:
        return self.r1 - self.r0


def tiles_of(shape: tuple[int, ...], layout: Layout) -> list[Tile]:
    """The tiles of a value, in order (a new list each call: callers keep it as a value's own)."""
    return list(_tiles(tuple(shape), layout))


@functools.lru_cache(maxsize=4096)
def _tiles(shape: tuple[int, ...], layout: Layout) -> tuple[Tile, ...]:
    """:func:`tiles_of`, made once per shape: a batched attention value (ViT's 64 x 12 heads) has
    ~1,500 tiles and the lowering asks for them again at every reader (tiles are frozen)."""
    batches, rows, _ = tile_grid(shape, layout)
    return tuple(Tile(b, r, min(r + P, rows)) for b in range(batches) for r in range(0, rows, P))


