"""The on-chip view analysis answers the same from a tile's first row as from every element.

``onchip_views._tile_blocks`` decides, for a view (slice / transpose / reshape / broadcast chain) of
an SBUF value, whether each output tile is one block of a root tile (read in place), a few column
runs (engine copies) or neither (the HBM path). With the ``arange`` the index map was pushed from it
checks a strided view on its row stride and each tile's first row only; otherwise (a copy on the
way) it checks each row against the row above. These tests compare both with a reference that
locates every element (root tile, partition, column) on many views, including ones each answer
applies to.
"""

from __future__ import annotations

import random
from itertools import pairwise
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from neuroncore.compiler import onchip_views
from neuroncore.compiler.lowering_state import Layout
from neuroncore.compiler.tiling import P, tile_grid
from neuroncore.ir.graph import Op


def _every_element(root: Op, index: np.ndarray, shape: tuple[int, ...]) -> Any:
    """``_tile_blocks`` by locating every element: its root tile, partition and column must be
    its output row's partition and one place per column for all the tile's rows."""
    _, root_rows, root_cols = tile_grid(root.shape, Layout.ROW)
    tiles_per_batch = -(-root_rows // P)
    out_batches, out_rows, out_cols = tile_grid(shape, Layout.ROW)
    spans = [(b * out_rows + r0, b * out_rows + min(out_rows, r0 + P))
             for b in range(out_batches) for r0 in range(0, out_rows, P)]
    flat = index.reshape(-1, out_cols).astype(np.int64)
    rowflat, col = np.divmod(flat, root_cols)
    rb, rr = np.divmod(rowflat, root_rows)
    stile = rb * tiles_per_batch + rr // P
    local = np.concatenate([np.arange(hi - lo) for lo, hi in spans])
    if not (rr % P == local[:, None]).all():
        return None, None
    starts = [lo for lo, _ in spans]
    for lo, hi in spans:
        if not ((stile[lo:hi] == stile[lo]).all() and (col[lo:hi] == col[lo]).all()):
            return None, None
    first_st, first_cl = stile[starts], col[starts]
    contiguous = (first_st[:, 1:] == first_st[:, :-1]) & (first_cl[:, 1:] == first_cl[:, :-1] + 1)
    if contiguous.all():
        return [(int(first_st[i, 0]), 0, hi - lo, int(first_cl[i, 0]), int(first_cl[i, 0]) + out_cols)
                for i, (lo, hi) in enumerate(spans)], None
    copies = []
    for i, (lo, hi) in enumerate(spans):
        cuts = [0, *(np.flatnonzero(~contiguous[i]) + 1).tolist(), out_cols]
        if (len(cuts) - 1 > onchip_views.MAX_COPIES_PER_TILE
                or min(np.diff(cuts)) < onchip_views.MIN_COPY_COLUMNS):
            return None, None
        copies.append([(c0, (int(first_st[i, c0]), 0, hi - lo, int(first_cl[i, c0]),
                             int(first_cl[i, c0]) + c1 - c0)) for c0, c1 in pairwise(cuts)])
    return None, copies


def _views(rng: random.Random, base: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Views of ``base.reshape(shape)`` the way attention graphs make them (and some that copy)."""
    a = base.reshape(shape)
    out: list[np.ndarray] = [a]
    b, r, c = shape
    for _ in range(12):
        r0 = rng.choice([x for x in (0, 0, 128, 64) if x < r] + [rng.randrange(r)])
        r1 = rng.randrange(r0 + 1, r + 1)
        c0 = rng.choice([x for x in (0, 0, 16) if x < c] + [rng.randrange(c)])
        c1 = rng.choice([c, rng.randrange(c0 + 1, c + 1)])
        b0 = rng.randrange(b)
        out.append(a[b0:, r0:r1, c0:c1])  # a rows / columns slice
        out.append(a[:, r0:r1:2, :])  # rows two apart
        out.append(a.transpose(1, 0, 2)[:, b0:, c0:c1])  # batch and rows swapped
        out.append(a.transpose(0, 2, 1))  # the last two swapped
        if c % 4 == 0:  # heads split out of the columns and moved before the rows
            heads = a.reshape(b, r, 4, c // 4).transpose(0, 2, 1, 3)
            out.append(heads)
            out.append(heads[:, 1:3, r0:r1, :])
            out.append(heads.transpose(0, 2, 1, 3).reshape(b, r, c))  # merged back: a copy
            out.append(heads[:, ::-1].transpose(0, 2, 1, 3).reshape(b, r, c))  # heads reordered
        out.append(np.broadcast_to(a[:, :, :1], (b, r, c)))  # a column broadcast along the row
        out.append(np.broadcast_to(a[:, :1, :], (b, r, c)))  # a row broadcast down the partitions
        out.append(a[:, ::-1, :])  # reversed rows
        merged = a.reshape(b * r, c)  # batches' rows end to end: a tile may run into the next batch
        out.append(merged)
        out.append(merged[r0:])
        k = rng.randrange(-(-b * r // 128)) * 128  # one tile of it, which may cross a batch's end
        out.append(merged[k:k + 128])
    return out


@pytest.mark.parametrize("shape", [(1, 256, 128), (2, 300, 64), (3, 128, 96), (2, 64, 32), (1, 1024, 16),
                                   (4, 200, 48)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_first_row_analysis_equals_every_element(shape: tuple[int, int, int], dtype: Any) -> None:
    rng = random.Random(hash(shape) & 0xFFFF)
    base = np.arange(int(np.prod(shape)), dtype=dtype)
    root = cast(Op, SimpleNamespace(shape=shape))
    answers: dict[str, int] = {"slices": 0, "copies": 0, "neither": 0}
    for view in _views(rng, base, shape):
        expected: Any = _every_element(root, view, view.shape)
        rows: Any = onchip_views._tile_blocks(root, view, view.shape)  # row by row
        fast: Any = onchip_views._tile_blocks(root, view, view.shape, base)  # a view: its stride
        copied = np.ascontiguousarray(view)  # a copy on the way: row by row again
        assert rows == expected, (view.shape, view.strides)
        assert fast == expected, (view.shape, view.strides)
        assert onchip_views._tile_blocks(root, copied, copied.shape, base) == expected
        answers["slices" if expected[0] is not None else "copies" if expected[1] is not None
                else "neither"] += 1
    assert answers["slices"] > 0 and answers["neither"] > 0
    # heads reordered are copies where a head's columns are wide enough to copy
    assert answers["copies"] > 0 or shape[2] // 4 < onchip_views.MIN_COPY_COLUMNS


def test_views_of_every_kind_are_met() -> None:
    """The comparison above meets slices, copies and the HBM path (so it compares something)."""
    shape = (1, 256, 128)
    base = np.arange(int(np.prod(shape)), dtype=np.int64)
    root = cast(Op, SimpleNamespace(shape=shape))
    a = base.reshape(shape)
    heads = a.reshape(1, 256, 4, 32).transpose(0, 2, 1, 3)  # head split: each head a column block
    assert onchip_views._tile_blocks(root, heads, heads.shape, base)[0] == [
        (t, 0, 128, 32 * h, 32 * h + 32) for h in range(4) for t in range(2)]
    swapped = np.ascontiguousarray(a[:, :, ::-1][:, :, ::-1])  # a copy: not a view, every element
    assert onchip_views._tile_blocks(root, swapped, swapped.shape, base)[0] is not None
    odd = a[:, 1:, :]  # rows off their partitions
    assert onchip_views._tile_blocks(root, odd, odd.shape, base) == (None, None)
