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

A node's own text may be given in pieces (:data:`Text`: strings, on-chip refs and HBM accesses) and
is joined when read (:class:`RefTexts`): the lowering gave each instruction a string made from its
operands' buffers (one ``ref_text`` per operand, ~6 % of a long prefill's compile) that timing-only
runs never read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import numpy as np

from neuroncore.compiler.lazy_sequence import LazySequence
from neuroncore.compiler.program import ApRef, Buffer, HbmAccess, Ref
from neuroncore.enums import Memory

# A node's own text: a string, or its pieces (strings, on-chip refs, HBM accesses) joined when read
Text: TypeAlias = "str | tuple[str | Ref | ApRef | HbmAccess, ...]"


def ref_text(ref: Ref | ApRef, buffers: Mapping[int, Buffer], known: dict[int, tuple[str, int, int]],
             psum_bank_bytes: int) -> str:
    """An on-chip operand's text (``bf16@sb:0x1a00[0:128,128]``, ``psum[3]@fp32[0:128,0:64]``);
    ``known`` caches each buffer's text prefix, byte address and element size (-1 address: a
    PSUM bank), a buffer never changing once made."""
    if not isinstance(ref, ApRef):  # one or more per operand of every instruction
        prefix_of = known.get(ref.buf)
        if prefix_of is None:
            buf = buffers[ref.buf]
            if buf.memory is Memory.PSUM:
                prefix_of = (f"psum[{buf.address // psum_bank_bytes}]@fp32[", -1, 0)
            else:
                prefix_of = (f"{buf.dtype.profile_name}@sb:0x", buf.address, buf.dtype.itemsize)
            known[ref.buf] = prefix_of
        prefix, address, itemsize = prefix_of
        if address < 0:
            return f"{prefix}{ref.p0}:{ref.p1},{ref.f0}:{ref.f1}]"
        f0 = ref.f0
        return f"{prefix}{address + f0 * itemsize:x}[{ref.p0}:{ref.p1},{ref.f1 - f0}]"
    buf = buffers[ref.buf]
    pattern = ",".join(f"[{stride},{count}]" for stride, count in ref.pattern)
    base = "sb" if buf.memory is Memory.SBUF else "psum"
    return (f"{buf.dtype.profile_name}@{base}:0x{buf.address + ref.offset * buf.dtype.itemsize:x}"
            f"[{ref.p0}:{ref.p1},{pattern}]")


def hbm_text(access: HbmAccess) -> str:
    """An HBM operand's text (``hbm:name(view)[batch][r0:r1,c0:c1]``)."""
    view = f"({access.view})" if access.view else ""
    return (f"hbm:{access.tensor}{view}[{access.batch}][{access.r0}:{access.r1},"
            f"{access.c0}:{access.c1}]")


class RefTexts:
    """Joins texts given in pieces (:data:`Text`) from a program's buffer table: each piece as
    ``ref_text`` or ``hbm_text`` made it when the node was lowered (the buffers never change)."""

    __slots__ = ("buffers", "known", "psum_bank_bytes")

    def __init__(self, buffers: Mapping[int, Buffer], psum_bank_bytes: int) -> None:
        self.buffers = buffers
        self.psum_bank_bytes = psum_bank_bytes
        self.known: dict[int, tuple[str, int, int]] = {}

    def render(self, text: Text) -> str:
        if isinstance(text, str):
            return text
        return "".join([self._piece(p) for p in text])

    def _piece(self, piece: str | Ref | ApRef | HbmAccess) -> str:
        if isinstance(piece, str):
            return piece
        if isinstance(piece, HbmAccess):
            return hbm_text(piece)
        return ref_text(piece, self.buffers, self.known, self.psum_bank_bytes)


class RenderedTexts(LazySequence[str]):
    """``texts`` with each text given in pieces joined when read (``RefTexts.render``)."""

    def __init__(self, texts: list[Text], render: RefTexts) -> None:
        self._texts = texts
        self._render = render

    def __len__(self) -> int:
        return len(self._texts)

    def _item(self, i: int) -> str:
        return self._render.render(self._texts[i])


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


__all__ = ["OperandTexts", "RefTexts", "RenderedTexts", "Text", "hbm_text", "ref_text"]
