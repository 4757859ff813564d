"""The "top problems" of a profile, each pointing at where it happens *in aggregate*.

    from formats.findings import find
    for f in find(profile, figs, attribution):      # biggest first
        f.title, f.detail, f.kind, f.layer, f.op, f.share

A problem points at the **module kind** that carries most of it -- ``down_proj`` across every decoder
layer, as XProf's op profile aggregates an op across layers -- then at the largest layer of that kind
and its largest op, with the kind's share of the problem. (Pointing at the single op with the largest
wait says "1.4 % of the waiting is here": true, and useless.) Ops without a layer count under their
HLO op name without its number (``dot``).

Rules (thresholds from the real Summary Viewer's recommendation triggers, profile-schema §4.9, where it
states them; ours otherwise):

* **Tensor engine blocked on semaphores** -- Tensor instructions blocked on semaphores (Σ
  ``evt_wait_time_ns``) >= 10 % of T. Not "idle": idle time by what it waited for (a DMA queue,
  another engine) is ``formats.analysis`` (``neuron-profile analyze``), a different figure.
* **Memory-bound** (no wait column) -- Tensor busy < 30 % of T while DMA is active more than twice
  as long; measure: HBM bytes per op.
* **Small DMA transfers** -- average transfer (``dma_transfer_average_bytes``) < 32 KiB; measure:
  data packets under 32 KiB per op (not descriptor-queue packets nor semaphore writes of <= 4 B).
* **Spill reloads** -- ``spill_reload_bytes`` > 25 % of HBM reads (§4.9).
* **Transposes dominating** -- transpose FLOPs > 10 % of hardware FLOPs; measure: per op.
* **Collectives** -- CcOps active >= 20 % of T (ours); points at the longest operation.

Figures come from ``formats.figures`` (docs/figures.md); the per-op measures from one grouped scan of
``Instruction`` and one of ``DmaPacket``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb

from formats import sqlsource
from formats.attribution import Attribution, module_kind
from formats.figures import Figures
from formats.sqlsource import TableSource
from formats.units import fmt_bytes, fmt_ns, fmt_pct

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = ["SMALL_DMA_BYTES", "Finding", "find"]

SMALL_DMA_BYTES = 32 * 1024


@dataclass(frozen=True)
class Finding:
    """One problem: what, how bad (1-3), and where most of it is (module kind, its largest layer,
    that layer's largest op, the kind's share of the measure)."""

    title: str
    detail: str
    severity: int
    kind: str | None = None
    layer: str | None = None
    op: str | None = None
    share: float | None = None
    t0: int | None = None
    t1: int | None = None

    @property
    def where(self) -> str:
        """``down_proj (64% of it; largest model/layers.1/mlp/down_proj, op dot.45)`` or ''."""
        if self.kind is None:
            return ""
        parts = [f"{fmt_pct(self.share)} of it"] if self.share is not None else []
        if self.layer and self.layer != self.kind:
            parts.append(f"largest {self.layer}")
        if self.op:
            parts.append(f"op {self.op}")
        return f"{self.kind} ({', '.join(parts)})" if parts else self.kind


@dataclass(frozen=True)
class _OpMeasures:
    tensor_wait: dict[str, int]
    transpose: dict[str, int]
    hbm: dict[str, int]
    small_packets: dict[str, int]
    packets: int
    small: int
    spill_by_op: dict[str, int]
    spill_reload: int


def _measures(profile: Profile, con: duckdb.DuckDBPyConnection, key_column: str) -> _OpMeasures:
    waits: dict[str, int] = {}
    transpose: dict[str, int] = {}
    spill: dict[str, int] = {}
    instr = TableSource(profile, "Instruction")
    if instr.present:
        col = instr.col
        ft = (f"coalesce({col('flops_transpose')}, CASE WHEN {col('tensor_instruction_type')} = 'TRANSPOSE' "
              f"THEN {col('raw_flops')} END)")
        for key, wait, flops, reload in con.execute(f"""
                SELECT {col(key_column)}::VARCHAR, sum({col('evt_wait_time_ns')})
                           FILTER (WHERE {col('engine')} = 'Tensor')::HUGEINT,
                       sum({ft}) FILTER (WHERE {col('engine')} = 'Tensor')::HUGEINT,
                       sum({col('spill_reload_bytes')})::HUGEINT
                FROM {instr.relation()} WHERE {col(key_column)} IS NOT NULL GROUP BY 1""").fetchall():
            waits[str(key)] = int(wait or 0)
            transpose[str(key)] = int(flops or 0)
            spill[str(key)] = int(reload or 0)
    hbm: dict[str, int] = {}
    small: dict[str, int] = {}
    packets = TableSource(profile, "DmaPacket")
    n_packets = n_small = 0
    if packets.present:
        col = packets.col
        n_packets, n_small = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE transfer_bytes < {SMALL_DMA_BYTES}) "
            f"FROM {packets.relation()} WHERE {_useful(packets)}").fetchall()[0]
        if key_column == "raw_hlo_id" and packets.has("raw_hlo_id"):
            for key, nbytes, count in con.execute(f"""
                    SELECT {col('raw_hlo_id')}::VARCHAR,
                           sum(coalesce({col('hbm_read_bytes')}, 0)
                               + coalesce({col('hbm_write_bytes')}, 0))::HUGEINT,
                           count(*) FILTER (WHERE transfer_bytes < {SMALL_DMA_BYTES} AND {_useful(packets)})
                    FROM {packets.relation()} WHERE {col('raw_hlo_id')} IS NOT NULL GROUP BY 1""").fetchall():
                hbm[str(key)] = int(nbytes or 0)
                small[str(key)] = int(count or 0)
    return _OpMeasures(waits, transpose, hbm, small, int(n_packets), int(n_small), spill,
                       sum(spill.values()))


def _useful(packets: TableSource) -> str:
    """Data packets: not the descriptor queue's, not a semaphore write (<= 4 bytes)."""
    return f"coalesce({packets.col('queue_type')}, '') <> 'instruction' AND transfer_bytes > 4"


def _kind_of(attribution: Attribution, key: str) -> str:
    op = attribution.ops.get(key)
    if op is None:
        return key
    if op.parent:
        return module_kind(op.parent)
    return re.sub(r"\.\d+$", "", op.name)


@dataclass(frozen=True)
class _Pointer:
    kind: str
    share: float | None
    layer: str | None
    op: str
    t0: int | None = None
    t1: int | None = None


def _point(attribution: Attribution, measure: Mapping[str, int]) -> _Pointer | None:
    """The module kind with the largest Σ measure, its largest layer and op, and its share."""
    total = sum(v for v in measure.values() if v > 0)
    if total <= 0:
        return None
    by_kind: dict[str, int] = {}
    for key, value in measure.items():
        if value > 0:
            kind = _kind_of(attribution, key)
            by_kind[kind] = by_kind.get(kind, 0) + value
    kind = min(by_kind, key=lambda k: (-by_kind[k], k))  # ties: the first by name
    mine = {k: v for k, v in measure.items() if v > 0 and _kind_of(attribution, k) == kind}
    by_layer: dict[str, int] = {}
    for key, value in mine.items():
        layer = attribution.ops[key].parent if key in attribution.ops else ""
        by_layer[layer] = by_layer.get(layer, 0) + value
    layer = min(by_layer, key=lambda k: (-by_layer[k], _natural(k)))
    op_key = min((k for k in mine if (attribution.ops[k].parent if k in attribution.ops else "") == layer),
                 key=lambda k: (-mine[k], _natural(k)))
    op = attribution.ops.get(op_key)
    return _Pointer(kind, by_kind[kind] / total, layer or None, op.name if op else op_key)


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key with numbers compared as numbers (``layers.2`` before ``layers.10``)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def find(profile: Profile, figures: Figures, attribution: Attribution,
         con: duckdb.DuckDBPyConnection | None = None) -> tuple[Finding, ...]:
    """The problems of the whole execution, biggest first (see the module docstring for the rules)."""
    own = con is None
    con = con or sqlsource.connect(memory_limit="1GB")
    try:
        instr = TableSource(profile, "Instruction")
        by_id = instr.has("raw_hlo_id") and any(k.lstrip("-").isdigit() for k in attribution.ops)
        measures = _measures(profile, con, "raw_hlo_id" if by_id else "hlo_name")
        return _rules(figures, attribution, measures, profile, con)
    finally:
        if own:
            con.close()


def _finding(title: str, detail: str, severity: int, pointer: _Pointer | None) -> Finding:
    if pointer is None:
        return Finding(title, detail, severity)
    return Finding(title, detail, severity, pointer.kind, pointer.layer, pointer.op, pointer.share,
                   pointer.t0, pointer.t1)


def _rules(figs: Figures, attribution: Attribution, m: _OpMeasures, profile: Profile,
           con: duckdb.DuckDBPyConnection) -> tuple[Finding, ...]:
    found: list[Finding] = []
    T = figs.length_ns or 0.0
    tensor = figs.engines.get("Tensor")
    tensor_busy = tensor.fraction if tensor is not None else None
    dma_active = figs.dma.active_fraction
    wait = sum(m.tensor_wait.values())
    if T > 0 and wait >= 0.10 * T:
        found.append(_finding(  # what each wait was for is neuron-profile analyze's idle by cause
            "Tensor engine blocked on semaphores",
            f"Tensor instructions blocked on semaphores for {fmt_ns(wait)} ({fmt_pct(wait / T)} of device "
            f"time); DMA active {fmt_pct(dma_active)}; what they waited for: neuron-profile analyze",
            3 if wait >= 0.3 * T else 2, _point(attribution, m.tensor_wait)))
    elif tensor_busy is not None and dma_active is not None and tensor_busy < 0.3 \
            and dma_active > 2 * tensor_busy:
        found.append(_finding(
            "Memory-bound: Tensor engine idle while DMA is busy",
            f"Tensor busy {fmt_pct(tensor_busy)}, DMA active {fmt_pct(dma_active)}", 2,
            _point(attribution, m.hbm)))
    average = figs.dma.average_transfer_bytes
    if average is not None and 0 < average < SMALL_DMA_BYTES:
        share = f", {fmt_pct(m.small / m.packets)} of packets under 32 KiB" if m.packets else ""
        found.append(_finding(
            "Small DMA transfers", f"average transfer {fmt_bytes(average)} (target >= 32 KiB){share}",
            2 if average < SMALL_DMA_BYTES / 4 else 1, _point(attribution, m.small_packets)))
    reload_bytes, hbm_read = m.spill_reload, figs.hbm.read
    if reload_bytes and hbm_read and reload_bytes > 0.25 * hbm_read:
        found.append(_finding(
            "Spill reloads", f"{fmt_bytes(reload_bytes)} reloaded from HBM = "
            f"{fmt_pct(reload_bytes / hbm_read)} of HBM reads (> 25%)",
            3 if reload_bytes > 0.5 * hbm_read else 2, _point(attribution, m.spill_by_op)))
    transpose, hardware = figs.flops.transpose, figs.flops.hardware
    if transpose and hardware and transpose > 0.10 * hardware:
        found.append(_finding(
            "Transposes dominating",
            f"transposes are {fmt_pct(transpose / hardware)} of hardware FLOPs (> 10%)",
            2 if transpose > 0.25 * hardware else 1, _point(attribution, m.transpose)))
    cc = figs.collectives.active_fraction
    if cc is not None and cc >= 0.2:
        pointer = None
        source = TableSource(profile, "CcOp")
        if source.present:
            row = con.execute(f"SELECT start_ts, end_ts, operation FROM {source.relation()} "
                              f"ORDER BY end_ts - start_ts DESC, start_ts LIMIT 1").fetchall()[0]
            pointer = _Pointer(str(row[2]), None, None, f"longest {fmt_ns(row[1] - row[0])}",
                               int(row[0]), int(row[1]))
        found.append(_finding("Collectives take a large share",
                              f"CC ops active {fmt_pct(cc)} of device time", 2 if cc >= 0.4 else 1,
                              pointer))
    return tuple(sorted(found, key=lambda f: -f.severity))
