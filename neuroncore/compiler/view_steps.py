"""How an HBM view (``program.HbmView``) derives its elements from its sources, one record per step.

A view is read through a DMA access pattern instead of being stored; the numerics interpreter
evaluates it from its sources. The steps were ``("transpose", perm)``-style tuples dispatched on
their first element; a frozen record per kind makes a wrong field an error where it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class ApplyOp:
    """The IR op ``op_index`` (its reference semantics) applied to all the view's sources; alone."""

    op_index: int


@dataclass(frozen=True, slots=True)
class Transpose:
    """Permute the dims of the (single) source, in its stored shape."""

    perm: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Reshape:
    """Reshape to ``shape`` (row-major, no data movement)."""

    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BroadcastRows:
    """Replicate the flattened source on ``rows`` rows (a DMA with a zero partition stride)."""

    rows: int


ViewStep: TypeAlias = ApplyOp | Transpose | Reshape | BroadcastRows
"""Any step of an HBM view."""

__all__ = ["ApplyOp", "BroadcastRows", "Reshape", "Transpose", "ViewStep"]
