"""The small closed vocabularies shared by the core and the profile formats, declared once.

Engines, the timing model's resources (the rows an instruction or transfer occupies), on-chip and
off-chip memories and DMA queue types travel between ``neuroncore`` and ``formats`` as small integer
codes in NumPy columns or as short strings in metadata. Both sides read the codes and their display
names from here, so a name is never spelled twice and a code is never a bare number.

``formats`` may import this module (it imports nothing but the standard library); ``neuroncore``
never imports ``formats``. Display names are the profile schema's spelling (``Instruction.engine``,
``Instruction.timeline_track``, ``DmaPacket.queue_type``); ``formats.schema`` derives its canonical
engine names from :data:`ENGINE_LABELS`.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Engine(IntEnum):
    """The five instruction sequencers of a NeuronCore (neuroncore.md §2.1), in profile order."""

    TENSOR = 0
    VECTOR = 1
    SCALAR = 2
    GPSIMD = 3
    SYNC = 4

    @property
    def label(self) -> str:
        """Capitalised name as the real profiler writes ``Instruction.engine`` (``GpSimd``)."""
        return ENGINE_LABELS[self]

    @property
    def stem(self) -> str:
        """Lower-case name used in column and key names (``gpsimd`` in ``n_gpsimd``)."""
        return self.label.lower()


ENGINE_LABELS: dict[Engine, str] = {
    Engine.TENSOR: "Tensor",
    Engine.VECTOR: "Vector",
    Engine.SCALAR: "Scalar",
    Engine.GPSIMD: "GpSimd",
    Engine.SYNC: "Sync",
}

ENGINE_NAMES: tuple[str, ...] = tuple(ENGINE_LABELS[e] for e in Engine)
"""Engine display names in code order: ``ENGINE_NAMES[code]`` is the label of ``Engine(code)``."""


class Resource(IntEnum):
    """What one program node occupies in the timing model (``Program.resource``, int8 codes).

    Codes 0..4 are the engines' instruction streams (the same numbers as :class:`Engine`); the Tensor
    engine has a second stream, MultiplyMoving, drawn as its own ``TensorMatrix`` row; every DMA
    transfer is ``DMA`` (its queue is a separate column) and every collective ``CC`` (run by the
    CC-core over NeuronLink, timed at run time from the topology). Codes below ``DMA`` are engine
    instructions: ``resource < Resource.DMA`` selects them.
    """

    TENSOR_LS = 0  # LoadStationary stream ("Tensor" row)
    VECTOR = 1
    SCALAR = 2
    GPSIMD = 3
    SYNC = 4
    TENSOR_MM = 5  # MultiplyMoving stream ("TensorMatrix" row), same PE array
    DMA = 6
    CC = 7

    @property
    def is_instruction(self) -> bool:
        """An engine instruction (one of the six instruction tracks), not a transfer or collective."""
        return self < Resource.DMA

    @property
    def track_label(self) -> str:
        """``Instruction.timeline_track`` of an instruction on this resource."""
        return TRACK_LABELS[self]


N_TRACKS = int(Resource.DMA)
"""Instruction tracks (resources 0..5): the five engines plus the Tensor engine's second stream."""

TRACK_LABELS: tuple[str, ...] = (*ENGINE_NAMES, "TensorMatrix")
"""Display name of each instruction track, by resource code (``TRACK_LABELS[Resource.TENSOR_MM]``)."""

SEMAPHORE_BUS_SOURCE = len(Engine)
"""``SemaphoreUpdate.update_source`` code of an update made by a DMA completion over the bus (after
the engine codes 0..4); its display name is the schema's ``AXI``."""


class Memory(StrEnum):
    """Where a value or buffer lives: the two on-chip memories and the device's HBM."""

    SBUF = "sbuf"  # state buffer, 128 partitions (neuroncore.md §3.1)
    PSUM = "psum"  # matmul accumulation banks (§3.2)
    HBM = "hbm"  # device memory, reached by DMA only

    @property
    def label(self) -> str:
        """Upper-case name as the documentation and profile columns spell it (``SBUF``)."""
        return self.value.upper()


class DmaQueueType(StrEnum):
    """``DmaPacket.queue_type``: the profile schema's ``DmaQueueType`` enum (profile-schema §2.9)."""

    INSTRUCTION = "instruction"
    INPUT = "input"
    OUTPUT = "output"
    DATA = "data"
    SOFTWARE_DYNAMIC = "software_dynamic"
    HARDWARE_DYNAMIC = "hardware_dynamic"
    UNKNOWN = "unknown"


__all__ = [
    "ENGINE_LABELS", "ENGINE_NAMES", "N_TRACKS", "SEMAPHORE_BUS_SOURCE", "TRACK_LABELS", "DmaQueueType",
    "Engine", "Memory", "Resource",
]
