"""Power throttling in a profile: its periods (``Throttle`` rows) and what they cost the Tensor engine.

    t = throttling(profile, con, graph)      # None when the profile recorded no throttling
    t.periods, t.duration_ns, t.limit, t.tensor_lost_ns

A ``Throttle`` row is a period [``timestamp``, ``timestamp + duration``) in which the engines may run
at most ``k / n`` of full speed (the real tool's "Active FLOPS Throttling"; our core writes them for
Trainium2, docs/execution-core.md). Its **cost** is what it took from the Tensor engine's matmuls:

    tensor_lost_ns = Σ over matmul instructions i, Σ over periods p  |i ∩ p| × (1 − k_p / n_p)

-- the time a matmul spent inside a period beyond what the same work takes at full speed (work done
at rate ρ for a time d is ρ·d at full speed). This is the same arithmetic the core throttles with, so
on our profiles it equals the core's own count up to nanosecond rounding. Matmuls are the Tensor
engine's ``TensorMatrix`` row when the profile has one (its weight loads are not throttled), else
every Tensor instruction. Periods are taken in start order and a later one ends an earlier one (a new
notification replaces the level). Periods without ``k``/``n`` count in the duration, not the cost.

Whether the lost Tensor time made the device time longer depends on what waited for those matmuls;
``neuron-profile analyze --what-if power-throttling=off`` measures that (collectors/whatif.py).

The same periods make the schema's ``ThrottleSummary`` table (``throttle_summary``, written with the
other summary tables when a capture closes), one row per throttle ``type``:

    throttle_active_time_ns       = Σ period lengths of the type (each ended by the next period)
    throttle_active_time_percent  = that / total_time (a fraction, as our Summary and OpcodeSummary
                                    write ``_percent`` columns; the reference has no observed value)
    max_achievable_util_with_throttling_percent
                                  = the time-weighted average of the utilisation cap over the
                                    execution: 1 inside no period, k/n inside one,
                                  = 1 - Σ length_p x (1 - k_p/n_p) / total_time
    nc_idx                        = Metadata.neuroncore_idx (the core the profile is of)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from formats.schema import ENGINE_NAMES, SCHEMA

if TYPE_CHECKING:
    from formats.depgraph import DepGraph
    from formats.reader import Profile

__all__ = ["MATMUL_ROW", "Throttling", "tensor_lost_ns", "throttle_summary", "throttling"]

MATMUL_ROW = "TensorMatrix"  # the Tensor engine's matmul row (timeline_track)


@dataclass(frozen=True)
class Throttling:
    """The throttling a profile recorded, and its cost (module docstring)."""

    periods: int
    duration_ns: int  # Σ duration
    limit: float | None  # the tightest k / n
    first_ns: int | None  # the first period's start
    tensor_lost_ns: int  # the cost in Tensor-engine time


def _periods(profile: Profile, con: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """(start, end, rate, type) per period, in start order, each ended by the next; None without rows."""
    from formats.sqlsource import TableSource

    source = TableSource(profile, "Throttle")
    if not source.present:
        return None
    rows = con.execute(f"""
        SELECT {source.col('timestamp')}, {source.col('duration')},
               {source.col('k')}::DOUBLE / nullif({source.col('n')}, 0),
               coalesce({source.col('type')}::VARCHAR, 'unknown')
        FROM {source.relation()} WHERE {source.col('timestamp')} IS NOT NULL
        ORDER BY 1""").fetchnumpy()
    names = list(rows)
    start = np.asarray(rows[names[0]], np.int64)
    duration = np.nan_to_num(np.asarray(rows[names[1]], np.float64)).astype(np.int64)
    rate = np.asarray(rows[names[2]], np.float64)  # NaN: level not recorded
    kinds = [str(t) for t in rows[names[3]]]
    end = start + np.maximum(duration, 0)
    if start.size > 1:
        end[:-1] = np.minimum(end[:-1], start[1:])
    return start, end, rate, kinds


def tensor_lost_ns(graph: DepGraph, start: np.ndarray, end: np.ndarray, rate: np.ndarray) -> int:
    """Σ over the Tensor engine's matmuls of their time inside each period x (1 - its rate).

    Periods must be sorted and disjoint. Vectorised with a cumulative weighted measure G(t) (the
    lost time a matmul stretching from -inf to t would have), so a matmul costs G(end) - G(start)."""
    if not start.size or not graph.n_instr:
        return 0
    n = graph.n_instr
    lanes = graph.lanes
    if MATMUL_ROW in lanes:
        keep = graph.lane[:n] == lanes.index(MATMUL_ROW)
    else:
        keep = graph.engine[:n] == ENGINE_NAMES.index("Tensor")
    s, e = graph.start[:n][keep], graph.end[:n][keep]
    if not s.size:
        return 0
    weight = np.where(np.isnan(rate), 0.0, 1.0 - np.clip(rate, 0.0, 1.0))
    length = (end - start).astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(weight * length)])

    def measure(t: np.ndarray) -> np.ndarray:
        p = np.searchsorted(start, t, side="right") - 1
        inside = np.clip(t - start[np.maximum(p, 0)], 0, length[np.maximum(p, 0)])
        return np.where(p >= 0, before[np.maximum(p, 0)] + weight[np.maximum(p, 0)] * inside, 0.0)

    return round(float((measure(e) - measure(s)).sum()))


def throttling(profile: Profile, con: Any, graph: DepGraph | None) -> Throttling | None:
    """The profile's throttling periods and their cost; None when it recorded none."""
    periods = _periods(profile, con)
    if periods is None or not periods[0].size:
        return None
    start, end, rate, _ = periods
    duration = int((end - start).sum())
    if not duration:
        return None
    limit = float(np.nanmin(rate)) if np.any(~np.isnan(rate)) else None
    lost = tensor_lost_ns(graph, start, end, rate) if graph is not None else 0
    return Throttling(int(start.size), duration, limit, int(start[0]), lost)


def throttle_summary(profile: Profile, con: Any, total_ns: float | None) -> pa.Table:
    """The ``ThrottleSummary`` rows of ``profile`` (module docstring), one per throttle type in
    order of first appearance; no rows when it recorded no throttling."""
    schema = SCHEMA.arrow_schema("ThrottleSummary")
    periods = _periods(profile, con)
    if periods is None or not periods[0].size:
        return schema.empty_table()
    start, end, rate, kinds = periods
    length = (end - start).astype(np.int64)
    lost = length * np.where(np.isnan(rate), 0.0, 1.0 - np.clip(rate, 0.0, 1.0))
    core = profile.metadata.get("neuroncore_idx")
    rows: dict[str, list[Any]] = {name: [] for name in schema.names}
    total = float(total_ns) if total_ns is not None and total_ns > 0 else None
    for kind in dict.fromkeys(kinds):
        mine = np.asarray([k == kind for k in kinds])
        active = int(length[mine].sum())
        rows["nc_idx"].append(int(core) if core is not None else 0)
        rows["throttle_type"].append(kind)
        rows["throttle_active_time_ns"].append(active)
        rows["throttle_active_time_percent"].append(None if total is None else active / total)
        rows["max_achievable_util_with_throttling_percent"].append(
            None if total is None else max(0.0, 1.0 - float(lost[mine].sum()) / total))
    return pa.table(rows, schema=schema)
