"""A program's operand strings, each made when it is first read.

An operand string is the node's own text (relocated layers: their template's, renamed) prefixed
with the semaphores it waits for (``$S[3]>=17``) and, for a producer, the one it increments
(``S[3] (qSyncIO)++@complete``). Making ~400,000 such strings cost as much as lowering several
layers, and timing-only runs (benchmarks, what-if, generation timing) never read them; profiles and
the numerics checks do. So :class:`OperandTexts` makes each string on first access, then keeps it.
Reading every string gives exactly the list an eager join would have built.

The waits are not stored: a node waits for each of its dependencies' semaphores, and every
dependency is a producer, so the program's own columns hold them (``dep_idx``, ``sem_increment``,
``sem_value``). Keeping them as separate flat columns cost ~12 bytes per dependency (~120 bytes per
node of a big prefill), and finding them for all nodes at once several times that while the
program was assembled (docs/execution-core.md "Program memory").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neuroncore.compiler.lazy_sequence import LazySequence


class OperandTexts(LazySequence[str]):
    """Node ``i``'s operand string: per semaphore its dependencies ``deps[ptr[i]:ptr[i+1]]``
    increment (``increments[d]``), in increasing order, the highest value among them
    (``$S[s]>=v``); its completion text ``completes[increments[i]]`` if it is a producer
    (``increments[i] >= 0``); then ``texts[i]``. The columns are the program's NumPy arrays and
    become lists only when a string is first read (a timing-only run never pays for the
    conversion)."""

    def __init__(self, texts: Sequence[str], ptr: np.ndarray, deps: np.ndarray, increments: np.ndarray,
                 values: np.ndarray, completes: dict[int, str]) -> None:
        self._texts = texts
        self._arrays: tuple[np.ndarray, ...] | None = (ptr, deps, increments, values)
        self._ptr: list[int] = []
        self._deps: list[int] = []
        self._increments: list[int] = []
        self._values: list[int] = []
        self._completes = completes  # semaphore -> "S[s] (owner)++@complete"
        self._made: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._texts)

    def _columns(self) -> None:
        assert self._arrays is not None
        self._ptr, self._deps, self._increments, self._values = (a.tolist() for a in self._arrays)
        self._arrays = None

    def _waits(self, a: int, b: int) -> list[str]:
        increments, values = self._increments, self._values
        highest: dict[int, int] = {}
        for d in self._deps[a:b]:
            s, v = increments[d], values[d]
            if highest.get(s, -1) < v:
                highest[s] = v
        return [f"$S[{s}]>={highest[s]}" for s in sorted(highest)]

    def _item(self, i: int) -> str:
        made = self._made.get(i)
        if made is not None:
            return made
        if self._arrays is not None:
            self._columns()
        a, b = self._ptr[i], self._ptr[i + 1]
        increment = self._increments[i]
        text = self._texts[i]
        if a == b and increment < 0:
            made = text
        else:
            parts = self._waits(a, b)
            if increment >= 0:
                parts.append(self._completes[increment])
            parts.append(text)
            made = " ".join(parts)
        self._made[i] = made
        return made


__all__ = ["OperandTexts"]
