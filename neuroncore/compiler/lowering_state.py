"""The closed sets of lowering state: tile layouts, operand forms, dot operand modes, matmul
accumulation positions and the compiler's DMA queues.

These were bare strings (``"row"``, ``"col"``, ``"imm"``, ``"qSyncData0"`` ...) compared all over the
lowerings, so a typo was a silent wrong branch. Each set is an enum here; a type checker rejects a
string where one is expected, and ``Layout("rwo")`` raises. Sets whose values appear in what the
compiler writes (buffer names, instruction text, queue names in profiles) are ``StrEnum`` with those
exact values, so the output is unchanged; the others are plain ``Enum``.

Where a value lives (SBUF, PSUM, HBM) and which engine runs a node are not here: those are shared
with the recorder (``neuroncore.hardware``).
"""

from __future__ import annotations

from enum import Enum, StrEnum


class Layout(StrEnum):
    """How a value is cut into tiles of at most 128 partitions (``neuroncore.compiler.tiling``)."""

    ROW = "row"  # (*batch, R, C): tiles of [rows, C], rows on partitions
    COL = "col"  # (*batch, R): tiles of [rows, 1], one value per partition (reductions, scalars)


class OperandForm(Enum):
    """How an elementwise operand reaches its instruction (``lower_elementwise.classify``)."""

    IMMEDIATE = "imm"  # a scalar constant folded into the instruction
    PER_PARTITION = "col"  # a [rows, 1] column: a per-partition scalar operand of TENSOR_SCALAR
    REPLICATED = "rep"  # a one-element value on every partition: one [rows, 1] load per op
    TILE = "tile"  # a full tile of the operand


class DotOperandMode(Enum):
    """How a dot operand's ``[k, x]`` tiles (K on partitions) are served (``lower_matmul``)."""

    DIRECT = "direct"  # resident in SBUF, K already on partitions: use its tiles as they are
    LOAD = "load"  # load K-row blocks from HBM (weights are stored pre-transposed, k-tiled)
    TRANSPOSE = "transpose"  # K is the free dim: transpose 128x128 blocks on the PE


class Accumulation(StrEnum):
    """A MATMUL's place in its PSUM accumulation group; shown as ``acc=`` in its instruction text."""

    WHOLE = "whole"  # the only matmul of its group: overwrites PSUM
    FIRST = "first"  # starts a group: overwrites PSUM
    MIDDLE = "middle"  # adds to PSUM
    LAST = "last"  # adds to PSUM and ends the group

    @property
    def accumulates(self) -> bool:
        """Whether the matmul adds to what PSUM holds (rather than overwriting it)."""
        return self is Accumulation.MIDDLE or self is Accumulation.LAST

    @staticmethod
    def of(index: int, count: int) -> Accumulation:
        """The position of matmul ``index`` of ``count`` accumulating into one PSUM region."""
        if count == 1:
            return Accumulation.WHOLE
        if index == 0:
            return Accumulation.FIRST
        return Accumulation.LAST if index == count - 1 else Accumulation.MIDDLE


class HbmTensorKind(StrEnum):
    """What an HBM tensor of a program holds; the keys of ``Program.hbm_bytes_by_kind`` (in this order)."""

    WEIGHT = "weight"  # a weight, stored once when the program is loaded (k-tiled, maybe pre-transposed)
    INPUT = "input"  # a model input, written by the host before each execution
    OUTPUT = "output"  # a model output, read by the host after each execution
    SCRATCH = "scratch"  # compiler scratch: spills, relayouts, HBM-home intermediate values


class QueueName(StrEnum):
    """The compiler's DMA queues (profile-schema §2.9: ``q<Engine><Purpose><n>``).

    Stores triggered from another engine use a derived queue of the same purpose named for that
    engine (``qVectorSpillReload0``); those are made on demand by ``Context``.
    """

    IO = "qSyncIO0"  # model inputs
    WEIGHT = "qSyncWeight0"  # weights
    OUT = "qSyncOut0"  # model outputs
    SPILL_RELOAD = "qSyncSpillReload0"  # spills, reloads, HBM-home scratch values
    DATA = "qSyncData0"  # relayouts and other compiler traffic
    DYNAMIC_SW = "qGpSimdDynamicSW0"  # gathers: descriptors built by GpSimd from indices
    RELOAD = "qGpSimdSpillReload0"  # reloads of spilled and HBM-home values (their stores: SPILL_RELOAD)
    DATA_LOAD = "qGpSimdData0"  # loads of relayouts and other compiler traffic (stores: DATA)


__all__ = ["Accumulation", "DotOperandMode", "HbmTensorKind", "Layout", "OperandForm", "QueueName"]
