"""A program's operand strings, each made when it is first read.

An operand string is the node's own text (relocated layers: their template's, renamed) prefixed
with the semaphores it waits for (``$S[3]>=17``) and, for a producer, the one it increments
(``S[3] (qSyncIO)++@complete``). Making ~400,000 such strings cost as much as lowering several
layers, and timing-only runs (benchmarks, what-if, generation timing) never read them; profiles and
the numerics checks do. So :class:`OperandTexts` keeps the waits as flat columns and makes each
string on first access, then keeps it. Reading every string gives exactly the list an eager join
would have built.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuroncore.compiler.lazy_sequence import LazySequence


class OperandTexts(LazySequence[str]):
    """Node ``i``'s operand string: its waits ``sems[ptr[i]:ptr[i+1]]`` (``>= values``), its
    completion text if it is a producer, then ``texts[i]``."""

    def __init__(self, texts: Sequence[str], ptr: list[int], sems: list[int], values: list[int],
                 completion: list[str | None]) -> None:
        self._texts = texts
        self._ptr = ptr
        self._sems = sems
        self._values = values
        self._completion = completion  # per node: "S[s] (owner)++@complete" or None
        self._made: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._texts)

    def _item(self, i: int) -> str:
        made = self._made.get(i)
        if made is not None:
            return made
        a, b = self._ptr[i], self._ptr[i + 1]
        done = self._completion[i]
        text = self._texts[i]
        if a == b and done is None:
            made = text
        else:
            parts = [f"$S[{s}]>={v}" for s, v in zip(self._sems[a:b], self._values[a:b], strict=True)]
            if done is not None:
                parts.append(done)
            parts.append(text)
            made = " ".join(parts)
        self._made[i] = made
        return made


__all__ = ["OperandTexts"]
