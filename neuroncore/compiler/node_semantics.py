"""What each program node computes, as one typed record per kind, for the numerics interpreter.

The timing model never looks at these; ``neuroncore.runtime.interpreter.Machine`` executes them in
program order on NumPy copies of SBUF, PSUM and HBM. They used to be positional tuples
(``("matmul", psum, moving, accumulate, transpose)``) dispatched by their first element, so a
misplaced or missing field surfaced, if at all, deep inside a NumPy call. Now each kind is a frozen
dataclass: a wrong field name or count fails where the lowering builds the record, the emitter refuses
anything that is not one of ``SEMANTIC_KINDS``, and the interpreter dispatches on the record's type.

Adding an instruction kind: declare its record here, add it to ``NodeSemantics`` and
``SEMANTIC_KINDS``, and give ``Machine`` a handler for it (a test checks every kind has one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from neuroncore.compiler.fast_init import fast_init
from neuroncore.compiler.program import HbmAccess, OnChip, Ref

Scalar: TypeAlias = float | Ref
"""An instruction's scalar operand: an immediate, or one value per partition (``[rows, 1]`` in SBUF)."""


@dataclass(frozen=True, slots=True)
class Nop:
    """Computes nothing: DMA triggers, the second pass of an FP32 matmul (the first did the math)."""


@dataclass(frozen=True, slots=True)
class Load:
    """DMA HBM -> SBUF: ``dst`` gets the block ``src`` addresses."""

    dst: Ref
    src: HbmAccess


@dataclass(frozen=True, slots=True)
class LoadKTiled:
    """DMA of rows of a k-tiled weight: ``ktiles`` 128-row tiles side by side along the free dim."""

    dst: Ref
    src: HbmAccess
    ktiles: int


@dataclass(frozen=True, slots=True)
class Store:
    """DMA SBUF -> HBM, rounding to the HBM tensor's dtype."""

    dst: HbmAccess
    src: Ref


@dataclass(frozen=True, slots=True)
class Gather:
    """Indirect DMA: row ``idx[p]`` of ``table`` (columns ``table.c0:c1``) into partition p of ``out``."""

    out: Ref
    table: HbmAccess
    idx: Ref


@dataclass(frozen=True, slots=True)
class TensorTensor:
    """Vector TENSOR_TENSOR: ``out = alu(a, b)`` element-wise (any of them an access pattern: a
    pool combines the shifted windows of one tile)."""

    alu: str
    out: OnChip
    a: OnChip
    b: OnChip


@dataclass(frozen=True, slots=True)
class ScalarStep:
    """One ALU step of TENSOR_SCALAR: ``x = alu(x, operand)``, or ``alu(operand, x)`` if ``reverse``."""

    alu: str
    operand: Scalar
    reverse: bool


@dataclass(frozen=True, slots=True)
class TensorScalar:
    """TENSOR_SCALAR: ``inp`` through ``steps`` in order, into ``out``."""

    out: Ref
    inp: Ref
    steps: tuple[ScalarStep, ...]


@dataclass(frozen=True, slots=True)
class Activate:
    """Scalar ACTIVATE: ``out = func(inp * scale + bias)``; ``accumulate`` gets its row sums."""

    func: str
    out: Ref
    inp: Ref
    scale: Scalar
    bias: Scalar
    accumulate: Ref | None


@dataclass(frozen=True, slots=True)
class Copy:
    """TENSOR_COPY with cast (PSUM evacuation, dtype conversion, broadcast of a column; through an
    access pattern: a convolution's input placed inside its zero border)."""

    out: OnChip
    inp: OnChip


@dataclass(frozen=True, slots=True)
class Reduce:
    """TENSOR_REDUCE along the free dim: ``alu`` is ``add`` (sum) or ``max``; ``negate`` writes the
    result negated (``nki.isa.tensor_reduce(..., negate=True)``)."""

    alu: str
    out: Ref
    inp: Ref
    negate: bool = False


@dataclass(frozen=True, slots=True)
class Reciprocal:
    """RECIPROCAL: ``out = 1 / inp``."""

    out: Ref
    inp: Ref


@dataclass(frozen=True, slots=True)
class Select:
    """TENSOR_COPY_PREDICATED: ``out = a where pred != 0 else b``."""

    out: Ref
    pred: Ref
    a: Ref
    b: Ref


@dataclass(frozen=True, slots=True)
class Memset:
    """MEMSET: every element of ``out`` is ``value``."""

    out: Ref
    value: float


@dataclass(frozen=True, slots=True)
class Iota:
    """GpSimd IOTA: each element of ``out`` gets its coordinate along ``dim`` of ``shape``.

    ``first_row`` is the tile's first logical row, from which each partition's coordinates follow;
    ``first_col`` the logical column of ``out``'s first element (a column chunk of a row wider than
    SBUF: the iota of a greedy argmax over a 128k vocabulary).
    """

    out: Ref
    shape: tuple[int, ...]
    dim: int
    first_row: int
    first_col: int = 0

    def __repr__(self) -> str:  # first_col only when set: whole-row iotas print as before
        chunk = f", first_col={self.first_col}" if self.first_col else ""
        return (f"Iota(out={self.out!r}, shape={self.shape!r}, dim={self.dim!r}, "
                f"first_row={self.first_row!r}{chunk})")


@dataclass(frozen=True, slots=True)
class Random:
    """GpSimd RNG: each element of ``out`` gets a uniform in [0, 1) from the counter-based generator
    (``neuroncore.ir.philox``) keyed by the state tile ``state`` (seed, offset), its counter the
    element's linear position (``first_row`` is the tile's first logical row of ``cols`` elements)
    and ``stream``."""

    out: Ref
    state: Ref
    first_row: int
    cols: int
    stream: int
    # a tensor-parallel rank's block of a larger random tensor (``philox.block_indices``: the whole
    # shape, split dim, outer, tp); the rank is the state tile's third word
    block: tuple[tuple[int, ...], int, int, int] | None = None
    # the generator: "philox" (state: seed, offset) or "threefry2x32" (JAX's; state: the two key
    # words in 16-bit halves, ``neuroncore.ir.threefry``)
    algorithm: str = "philox"
    # threefry2x32: the two key words as expressions over the key input's words (ir.threefry)
    key: tuple[object, ...] | None = None


@dataclass(frozen=True, slots=True)
class Identity:
    """The identity matrix (for PE transposes) written into ``out``."""

    out: Ref


@dataclass(frozen=True, slots=True)
class LoadWeights:
    """LDWEIGHTS: ``stationary`` becomes the PE's weights for the next MATMULs; an FP8 double-row
    load (NC-v3) also holds ``stationary2``, the next 128 rows of K, below it."""

    stationary: Ref
    stationary2: Ref | None = None


@dataclass(frozen=True, slots=True)
class MatMul:
    """MATMUL: ``psum (+)= weights^T @ moving``; ``transpose`` marks a PE transpose (identity). An
    FP8 double-row MATMUL (NC-v3) streams ``moving2`` (the next 128 rows of K) below ``moving``."""

    psum: Ref
    moving: OnChip  # an access pattern: a convolution's kernel offset over its input tile
    accumulate: bool
    transpose: bool
    moving2: Ref | None = None


@dataclass(frozen=True, slots=True)
class Collective:
    """A CC-core collective of IR op ``op_index``: the group's exchange of ``src`` lands in ``dst``."""

    op_index: int
    src: HbmAccess
    dst: HbmAccess


@dataclass(frozen=True, slots=True)
class KernelCall:
    """An NKI kernel called inside a compiled model: its values, computed at once by running the
    kernel (``neuroncore.nki.embed``) on the HBM tensors ``inputs`` into ``output``. Carried by the
    kernel's last instruction; its other instructions only time it."""

    kernel: str  # key in ``neuroncore.nki.embed.CALLS``
    inputs: tuple[str, ...]
    output: str


NodeSemantics: TypeAlias = (
    Nop | Load | LoadKTiled | Store | Gather | TensorTensor | TensorScalar | Activate | Copy | Reduce
    | Reciprocal | Select | Memset | Iota | Random | Identity | LoadWeights | MatMul | Collective
    | KernelCall
)
"""Any node's semantics."""

SEMANTIC_KINDS: frozenset[type] = frozenset({
    Nop, Load, LoadKTiled, Store, Gather, TensorTensor, TensorScalar, Activate, Copy, Reduce,
    Reciprocal, Select, Memset, Iota, Random, Identity, LoadWeights, MatMul, Collective, KernelCall,
})
"""Every record type a node may carry; the emitter refuses anything else."""

for _kind in SEMANTIC_KINDS:  # one record per node: set the slots directly (compiler/fast_init.py)
    fast_init(_kind)

NOP = Nop()


def check_semantics(semantics: object) -> None:
    """Refuse anything that is not one of the declared records (an old-style tuple, say)."""
    if type(semantics) not in SEMANTIC_KINDS:
        raise TypeError(f"node semantics must be a record of neuroncore.compiler.node_semantics, "
                        f"not {semantics!r}")


__all__ = [
    "NOP", "SEMANTIC_KINDS", "Activate", "Collective", "Copy", "Gather", "Identity", "Iota", "KernelCall",
    "Load",
    "LoadKTiled", "LoadWeights", "MatMul", "Memset", "NodeSemantics", "Nop", "Random", "Reciprocal", "Reduce",
    "Scalar", "ScalarStep", "Select", "Store", "TensorScalar", "TensorTensor", "check_semantics",
]
