"""The per-node counters a lowering reports with each instruction or transfer, as one closed record.

Every node of a program carries the same twelve integer counters (FLOPs, bytes read and written per
memory, spill traffic, DMA bytes); they become the ``Program`` columns of the same names and the
profile's per-instruction counters. They used to travel as ``**kwargs`` read with ``.get(name, 0)``,
so a misspelt name (``sbuf_writes_bytes=...``) was accepted and recorded 0. A frozen dataclass makes
the set closed: an unknown name is a ``TypeError`` where the lowering builds the record.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

from neuroncore.compiler.fast_init import fast_init


@dataclass(frozen=True, slots=True)
class NodeCounters:
    """What one node computes and moves; every field is a count (FLOPs or bytes), 0 if not used."""

    raw_flops: int = 0  # multiply-adds x 2 of a MATMUL (per FP32 pass: half)
    adjusted_flops: int = 0  # raw_flops scaled to the dtype's peak (bf16 = 1, fp32 = 1/4 ...)
    transpose_flops: int = 0  # FLOPs of PE transposes (a matmul against an identity)
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    sbuf_read_bytes: int = 0
    sbuf_write_bytes: int = 0
    psum_read_bytes: int = 0
    psum_write_bytes: int = 0
    spill_save_bytes: int = 0  # of hbm_write_bytes: a tile evicted from SBUF
    spill_reload_bytes: int = 0  # of hbm_read_bytes: an evicted tile brought back
    dma_bytes: int = 0  # bytes a DMA transfer moves (0 for instructions)

    def __add__(self, other: NodeCounters) -> NodeCounters:
        """Field-wise sum (an instruction reading several operands adds their bytes)."""
        return NodeCounters(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))

    def spill_part(self) -> NodeCounters:
        """Only the spill counters: what a DMA's trigger instruction reports (it starts the spill)."""
        if not (self.spill_save_bytes or self.spill_reload_bytes):
            return NO_COUNTERS
        return NodeCounters(spill_save_bytes=self.spill_save_bytes,
                            spill_reload_bytes=self.spill_reload_bytes)

    def transfer_part(self) -> NodeCounters:
        """Everything but the spill counters: what the DMA transfer itself reports."""
        if not (self.spill_save_bytes or self.spill_reload_bytes):
            return self
        return NodeCounters(self.raw_flops, self.adjusted_flops, self.transpose_flops,
                            self.hbm_read_bytes, self.hbm_write_bytes, self.sbuf_read_bytes,
                            self.sbuf_write_bytes, self.psum_read_bytes, self.psum_write_bytes,
                            0, 0, self.dma_bytes)

    def as_tuple(self) -> tuple[int, ...]:
        """The values in ``COUNTER_NAMES`` order."""
        return _values(self)


COUNTER_NAMES: tuple[str, ...] = tuple(f.name for f in fields(NodeCounters))
"""The counter columns of a ``Program``, in declaration order."""

fast_init(NodeCounters)  # made once or more per node: set its slots directly (compiler/fast_init.py)
NO_COUNTERS = NodeCounters()

_SHARED: dict[tuple[int, ...], NodeCounters] = {}
_SHARED_LIMIT = 1 << 14  # distinct records kept (a compile makes a few hundred)


def shared_counters(*values: int) -> NodeCounters:
    """``NodeCounters(*values)``, the same record for the same values: records are frozen and a
    program's counter columns read each distinct record once (``Emitter.counter_columns``), so
    nodes that count alike (every MultiplyMoving of a block) share one instead of each making its
    own (a record per node was ~10 % of a decode compile)."""
    record = _SHARED.get(values)
    if record is None:
        if len(_SHARED) >= _SHARED_LIMIT:
            _SHARED.clear()
        record = _SHARED[values] = NodeCounters(*values)
    return record


_values: attrgetter[tuple[int, ...]] = attrgetter(*COUNTER_NAMES)
counter_values = _values
"""``counter_values(c)``: the values of ``c`` in ``COUNTER_NAMES`` order (a C-level getter: the
emitter calls it once per node)."""

__all__ = ["COUNTER_NAMES", "NO_COUNTERS", "NodeCounters", "counter_values", "shared_counters"]
