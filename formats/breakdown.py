"""Aggregate analyses of one profile: HTA's temporal breakdown and overlap, DMA efficiency per
queue, and a bottom-up table of op kinds on the Tensor engine's roofline.

    temporal(graph)              # compute / DMA-only / collective-only / idle, Σ = device time
    dma_efficiency(graph, meta)  # per queue: transfers, bytes per transfer, small ones, achieved rate
    bottom_up(profile, con)      # per op kind across layers: time, FLOPs, HBM bytes, intensity, roofline

Definitions (docs/analyses.md):

* **Temporal breakdown** (as HTA's, with DMA and collectives for its communication): every instant of
  an execution window is *compute* when an instruction runs, else *DMA-only* when a DMA transfer is
  in flight, else *collective-only* when a collective runs, else *idle*. With I, D, C the unions of
  instruction, transfer and collective intervals: compute = |I|, DMA-only = |I∪D| − |I|,
  collective-only = |I∪D∪C| − |I∪D|, idle = T − |I∪D∪C|. **Overlap** (HTA's
  "communication overlapped with computation"): |I∩C| / |C| for collectives, |I∩D| / |D| for DMA.
* **DMA efficiency** per queue: transfers, bytes, bytes per transfer (a transfer is one descriptor
  chain, ``packet_aggregation_id``), packets, transfers under ``SMALL_DMA_BYTES`` (32 KiB, the
  findings' threshold), achieved bandwidth = bytes / |∪ of the queue's transfer intervals| and its
  fraction of ``Metadata.dma_ddr_bandwidth`` (the core's DMA ceiling).
* **Bottom-up / roofline**: per op kind (``hlo_name`` without its number, across every layer):
  instructions, Σ instruction time, PE FLOPs (Σ ``greatest(raw_flops, flops_transpose)`` on Tensor,
  the hardware-FLOPs rule of docs/figures.md), HBM bytes (Σ of the op's DMA packets'
  ``hbm_read_bytes + hbm_write_bytes``), arithmetic intensity = FLOPs / HBM bytes, op time = Σ over
  its ops of the op time (the union of the op's instructions and packets, ``HloInstruction.
  active_time_ns`` where stored, else Σ instruction time), achieved FLOP/s = FLOPs / op time, and the
  roofline bound min(PEAK, intensity × HBM_BW)
  with PEAK and HBM_BW from Metadata (``formats.figures.Hardware``); ``bound`` says which side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from formats.depgraph import DepGraph
from formats.event_order import event_order
from formats.figures import Hardware
from formats.findings import SMALL_DMA_BYTES
from formats.schema import ENGINE_NAMES
from formats.sqlsource import TableSource


def op_kind(hlo_name: str) -> str:
    """An HLO op's kind: its name without the number (``dot.3`` -> ``dot``)."""
    return re.sub(r"[.\d]+$", "", hlo_name) or hlo_name


if TYPE_CHECKING:
    import duckdb

    from formats.reader import Profile

__all__ = ["DmaQueue", "OpKind", "Temporal", "bottom_up", "dma_efficiency", "temporal"]


@njit(cache=True, nogil=True)
def _union_sorted(start: np.ndarray, end: np.ndarray, keep: np.ndarray) -> int:
    """|∪ [start, end)| of the intervals with ``keep`` set, given in start order: one pass."""
    total = 0
    reach = np.int64(-(2 ** 62))
    for i in range(start.size):
        if not keep[i]:
            continue
        s = start[i] if start[i] > reach else reach
        if end[i] > s:
            total += end[i] - s
        if end[i] > reach:
            reach = end[i]
    return total


def _union(start: np.ndarray, end: np.ndarray) -> int:
    """|∪ [start, end)| (any order)."""
    order = np.argsort(start, kind="stable")
    return int(_union_sorted(start[order], end[order], np.ones(order.size, np.bool_)))


@dataclass(frozen=True)
class Temporal:
    device_time_ns: int
    compute_ns: int
    dma_only_ns: int
    collective_only_ns: int
    idle_ns: int
    dma_overlap: float | None  # |I ∩ D| / |D|
    collective_overlap: float | None  # |I ∩ C| / |C|

    def as_dict(self) -> dict[str, Any]:
        return {"device_time_ns": self.device_time_ns, "compute_ns": self.compute_ns,
                "dma_only_ns": self.dma_only_ns, "collective_only_ns": self.collective_only_ns,
                "idle_ns": self.idle_ns, "dma_overlap": self.dma_overlap,
                "collective_overlap": self.collective_overlap}


@njit(cache=True, nogil=True)
def _unions(by_start: np.ndarray, start: np.ndarray, end: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """|I|, |D|, |C|, |I∪D|, |I∪C|, |I∪D∪C| in one pass over the events in start order: one reach
    per union (the kind sets of ``SETS``)."""
    total = np.zeros(6, np.int64)
    reach = np.full(6, np.int64(-(2 ** 62)))
    for t in range(by_start.size):
        i = by_start[t]
        k = kind[i]
        for u in range(6):
            if not _SETS[u, k]:
                continue
            s = start[i] if start[i] > reach[u] else reach[u]
            if end[i] > s:
                total[u] += end[i] - s
            if end[i] > reach[u]:
                reach[u] = end[i]
    return total


# which event kinds (INSTRUCTION, DMA, CC) each union of ``_unions`` takes
_SETS = np.array([[True, False, False], [False, True, False], [False, False, True],
                  [True, True, False], [True, False, True], [True, True, True]])


def temporal(graph: DepGraph, device_time_ns: int) -> Temporal:
    """HTA's temporal breakdown and overlap (module docstring)."""
    i, d, c, i_d, i_c, all_ = (int(v) for v in _unions(event_order(graph).by_start, graph.start, graph.end,
                                                        graph.kind))
    return Temporal(device_time_ns, i, i_d - i, all_ - i_d, max(device_time_ns - all_, 0),
                    (i + d - i_d) / d if d else None, (i + c - i_c) / c if c else None)


@dataclass(frozen=True)
class DmaQueue:
    queue: str
    transfers: int
    bytes: int
    packets: int
    small_transfers: int
    active_ns: int

    @property
    def bytes_per_transfer(self) -> float:
        return self.bytes / self.transfers if self.transfers else 0.0

    @property
    def achieved_bytes_per_s(self) -> float | None:
        return self.bytes / self.active_ns * 1e9 if self.active_ns else None

    def as_dict(self, ceiling: float | None) -> dict[str, Any]:
        rate = self.achieved_bytes_per_s
        return {"queue": self.queue, "transfers": self.transfers, "bytes": self.bytes,
                "packets": self.packets,
                "bytes_per_transfer": self.bytes_per_transfer, "small_transfers": self.small_transfers,
                "active_ns": self.active_ns, "achieved_bytes_per_s": rate,
                "of_dma_ceiling": rate / ceiling if rate is not None and ceiling else None}


def dma_efficiency(graph: DepGraph) -> list[DmaQueue]:
    """Per DMA queue (module docstring), most bytes first."""
    base = graph.n_instr
    out = []
    lanes = graph.lane[base:base + graph.n_dma]
    for code in np.unique(lanes):
        sel = np.flatnonzero(lanes == code)
        nbytes = graph.dma_bytes[sel] if graph.dma_bytes.size else np.zeros(sel.size, np.int64)
        packets = graph.dma_packets[sel] if graph.dma_packets.size else np.zeros(sel.size, np.int64)
        idx = sel + base
        out.append(DmaQueue(graph.lanes[int(code)], int(sel.size), int(nbytes.sum()), int(packets.sum()),
                            int((nbytes < SMALL_DMA_BYTES).sum()), _union(graph.start[idx], graph.end[idx])))
    out.sort(key=lambda q: (-q.bytes, q.queue))
    return out


@dataclass(frozen=True)
class OpKind:
    kind: str
    ops: int
    instructions: int
    time_ns: int
    tensor_ns: int
    op_time_ns: int  # Σ over its ops of the op time (∪ of the op's events: docs/figures.md)
    flops: int
    hbm_bytes: int
    peak_flops_per_s: float | None
    hbm_bytes_per_s: float | None

    @property
    def intensity(self) -> float | None:
        return self.flops / self.hbm_bytes if self.hbm_bytes and self.flops else None

    @property
    def achieved_flops_per_s(self) -> float | None:
        return self.flops / self.op_time_ns * 1e9 if self.op_time_ns and self.flops else None

    @property
    def roofline_flops_per_s(self) -> float | None:
        if self.peak_flops_per_s is None or self.intensity is None or self.hbm_bytes_per_s is None:
            return None
        return min(self.peak_flops_per_s, self.intensity * self.hbm_bytes_per_s)

    @property
    def bound(self) -> str | None:
        if self.roofline_flops_per_s is None or self.peak_flops_per_s is None:
            return None
        return "compute" if self.roofline_flops_per_s >= self.peak_flops_per_s else "memory"

    def as_dict(self) -> dict[str, Any]:
        roof, got = self.roofline_flops_per_s, self.achieved_flops_per_s
        return {"kind": self.kind, "ops": self.ops, "instructions": self.instructions,
                "time_ns": self.time_ns, "tensor_ns": self.tensor_ns, "op_time_ns": self.op_time_ns,
                "flops": self.flops, "hbm_bytes": self.hbm_bytes,
                "intensity": self.intensity, "achieved_flops_per_s": got, "roofline_flops_per_s": roof,
                "of_roofline": got / roof if got is not None and roof else None, "bound": self.bound}


@njit(cache=True, nogil=True)
def _op_sums(codes: np.ndarray, start: np.ndarray, end: np.ndarray, engine: np.ndarray, flops: np.ndarray,
             tensor: int, n_names: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per op (text code): instructions, Σ duration, Σ duration on Tensor, Σ PE FLOPs on Tensor, in one
    pass. The sums are float64 added in row order -- what ``np.bincount(codes, weights=...)`` gives,
    bit for bit."""
    count = np.zeros(n_names, np.int64)
    time_ns = np.zeros(n_names, np.float64)
    tensor_ns = np.zeros(n_names, np.float64)
    pe_flops = np.zeros(n_names, np.float64)
    for i in range(codes.size):
        c = codes[i]
        if c < 0:
            continue
        d = end[i] - start[i]
        count[c] += 1
        time_ns[c] += d
        if engine[i] == tensor:
            tensor_ns[c] += d
            pe_flops[c] += flops[i]
    return count, time_ns, tensor_ns, pe_flops


def bottom_up(graph: DepGraph, profile: Profile, con: duckdb.DuckDBPyConnection,
              metadata: Mapping[str, Any]) -> list[OpKind]:
    """Per op kind across layers, most instruction time first (module docstring). Instruction sums come
    from the graph's arrays (no second scan of Instruction); HBM bytes and op times from DmaPacket and
    the HloInstruction rollup when the profile has them."""
    n = graph.n_instr
    codes = graph.text_codes.get("hlo_name")
    names = graph.text_values.get("hlo_name", [])
    if not n or codes is None or not names:
        return []
    flops = graph.flops[:n] if graph.flops.size else np.zeros(n, np.int64)
    count, time_ns, tensor_ns, pe_flops = _op_sums(codes, graph.start, graph.end, graph.engine, flops,
                                                   ENGINE_NAMES.index("Tensor"), len(names))
    kinds: dict[str, list[int]] = {}
    for code in np.flatnonzero(count):
        kinds.setdefault(op_kind(names[int(code)]), []).append(int(code))
    hbm: dict[str, int] = {}
    op_time: dict[str, int] = {}
    hlo = TableSource(profile, "HloInstruction")
    packets = TableSource(profile, "DmaPacket")
    if hlo.present and hlo.has("hlo_name"):
        if hlo.has("active_time_ns"):
            for name, ns in con.execute(f"SELECT hlo_name, sum(active_time_ns)::BIGINT "
                                        f"FROM {hlo.relation()} GROUP BY 1").fetchall():
                k = op_kind(str(name))
                op_time[k] = op_time.get(k, 0) + int(ns or 0)
        if packets.present and packets.has("raw_hlo_id") and hlo.has("raw_hlo_id"):
            pc = packets.col
            for name, b in con.execute(f"""
                    WITH names AS (SELECT DISTINCT raw_hlo_id AS op, hlo_name FROM {hlo.relation()})
                    SELECT names.hlo_name, sum(coalesce({pc('hbm_read_bytes')}, 0)
                                               + coalesce({pc('hbm_write_bytes')}, 0))::BIGINT
                    FROM {packets.relation()} p JOIN names ON names.op = p.raw_hlo_id
                    GROUP BY 1""").fetchall():
                k = op_kind(str(name))
                hbm[k] = hbm.get(k, 0) + int(b or 0)
    hw = Hardware.from_metadata(metadata)
    out = []
    for k, members in kinds.items():
        t = int(time_ns[members].sum())
        out.append(OpKind(k, len(members), int(count[members].sum()), t, int(tensor_ns[members].sum()),
                          op_time.get(k, t), int(pe_flops[members].sum()), hbm.get(k, 0),
                          hw.peak_flops_per_s, hw.hbm_bytes_per_s))
    out.sort(key=lambda o: (-o.time_ns, o.kind))
    return out
