"""Node records of relocated layers, made when the numerics interpreter first asks for them.

A relocated layer's records are its template's with buffer ids, tensor names and op indices moved
(``layer_replay``). Timing-only runs never read records, so the program keeps the template's and
the relocation to apply, and makes each moved record on first access (then keeps it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from neuroncore.compiler.lazy_sequence import LazySequence

Move = Callable[[Any], Any]


class RelocatedSemantics(LazySequence[Any]):
    """``records`` where each ``(start, stop, move)`` range holds template records to move."""

    def __init__(self, records: Sequence[Any], moves: list[tuple[int, int, Move]]) -> None:
        self._records = records
        self._moves = sorted(moves, key=lambda m: m[0])
        self._starts = [m[0] for m in self._moves]
        self._made: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self._records)

    def _item(self, i: int) -> Any:
        made = self._made.get(i)
        if made is not None:
            return made
        k = bisect.bisect_right(self._starts, i) - 1
        if k >= 0 and i < self._moves[k][1]:
            made = self._made[i] = self._moves[k][2](self._records[i])
            return made
        return self._records[i]


__all__ = ["RelocatedSemantics"]
