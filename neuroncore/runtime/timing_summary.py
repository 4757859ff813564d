"""Per-engine timing summary of one execution (what the CLI prints; the profile Summary is formats')."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuroncore.compiler.program import RES_CC, RES_DMA
from neuroncore.hardware import Engine
from neuroncore.runtime.device import ExecutionResult


def union_ns(start: np.ndarray, end: np.ndarray) -> float:
    """Total length of the union of intervals [start, end)."""
    if start.size == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    seg_start = s[new]
    seg_end = np.maximum.reduceat(reach, np.flatnonzero(new))
    return float(np.sum(seg_end - seg_start))


@dataclass(frozen=True)
class EngineRow:
    name: str
    instructions: int
    active_ns: float
    semaphore_wait_ns: float

    def utilisation(self, total_ns: float) -> float:
        return self.active_ns / total_ns if total_ns > 0 else 0.0


@dataclass(frozen=True)
class ExecutionSummary:
    device_time_ns: int
    engines: list[EngineRow]
    dma_transfers: int
    dma_bytes: int
    dma_active_ns: float
    hbm_bytes: int
    flops: int
    mfu: float
    spill_bytes: int
    collectives: int = 0
    collective_ns: float = 0.0  # time the CC-core was busy (union of collective intervals)

    @property
    def dma_throughput_bytes_per_s(self) -> float:
        return self.dma_bytes / (self.device_time_ns * 1e-9) if self.device_time_ns else 0.0


def summarize(result: ExecutionResult) -> ExecutionSummary:
    program, tl = result.program, result.timeline
    is_dma = program.resource == RES_DMA
    is_cc = program.resource == RES_CC
    rows: list[EngineRow] = []
    for engine in Engine:
        sel = (program.resource < RES_DMA) & (program.engine == int(engine))
        rows.append(EngineRow(engine.label, int(sel.sum()), union_ns(tl.start_ns[sel], tl.end_ns[sel]),
                              float(tl.wait_ns[sel].sum())))
    total = float(result.device_time_ns)
    flops = int(program.raw_flops.sum())
    peak = program.spec.pe_peak_bf16_flops_per_s
    adjusted = int(program.adjusted_flops.sum())
    return ExecutionSummary(
        device_time_ns=result.device_time_ns,
        engines=rows,
        dma_transfers=int(is_dma.sum()),
        dma_bytes=int(program.dma_bytes.sum()),
        dma_active_ns=union_ns(tl.packet_start_ns.astype(np.float64), tl.packet_end_ns.astype(np.float64)),
        hbm_bytes=int(program.hbm_read_bytes.sum() + program.hbm_write_bytes.sum()),
        flops=flops,
        mfu=adjusted / (peak * total * 1e-9) if total else 0.0,
        spill_bytes=int(program.spill_save_bytes.sum() + program.spill_reload_bytes.sum()),
        collectives=int(is_cc.sum()),
        collective_ns=union_ns(tl.start_ns[is_cc], tl.end_ns[is_cc]),
    )
