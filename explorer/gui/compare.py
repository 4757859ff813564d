"""Two profiles side by side: the Summary metrics that matter, with deltas.

    rows = summary_deltas(a, b)
    rows[0]  # DeltaRow("total time", 0.00011, 0.00009, -0.00002, 0.82, "s")

Each profile's Summary is its stored row (ours and the real tool's carry one) or is computed on
demand (``formats.summary.summary_row``). Percent fields are fractions in the profile and shown as
percent here. Profiles of different instances are compared as they are -- the labels say which
instance each is and ``instance_note`` says they differ, since e.g. a trn2 core's peak differs from a
trn1 core's and a utilisation delta then means something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explorer.gui.session import LoadedProfile
from formats.summary import summary_row

METRICS: tuple[tuple[str, str, str], ...] = (
    ("total_time", "total time", "s"),
    ("total_active_time_percent", "active", "%"),
    ("tensor_engine_active_time_percent", "Tensor active", "%"),
    ("vector_engine_active_time_percent", "Vector active", "%"),
    ("scalar_engine_active_time_percent", "Scalar active", "%"),
    ("gpsimd_engine_active_time_percent", "GpSimd active", "%"),
    ("sync_engine_active_time_percent", "Sync active", "%"),
    ("dma_active_time_percent", "DMA active", "%"),
    ("mfu_estimated_percent", "MFU", "%"),
    ("hfu_estimated_percent", "HFU", "%"),
    ("mbu_estimated_percent", "MBU", "%"),
    ("tensor_engine_instruction_count", "Tensor instructions", ""),
    ("vector_engine_instruction_count", "Vector instructions", ""),
    ("scalar_engine_instruction_count", "Scalar instructions", ""),
    ("gpsimd_engine_instruction_count", "GpSimd instructions", ""),
    ("sync_engine_instruction_count", "Sync instructions", ""),
    ("hardware_flops", "hardware FLOPs", ""),
    ("model_flops", "model FLOPs", ""),
    ("hbm_read_bytes", "HBM read", "B"),
    ("hbm_write_bytes", "HBM write", "B"),
    ("dma_transfer_total_bytes", "DMA bytes", "B"),
    ("dma_transfer_count", "DMA transfers", ""),
    ("cc_op_count", "collectives", ""),
    ("cc_op_active_time", "collective time", "s"),
)


@dataclass(frozen=True)
class DeltaRow:
    metric: str
    a: float | None
    b: float | None
    delta: float | None
    ratio: float | None
    unit: str


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def summary_deltas(a: LoadedProfile, b: LoadedProfile) -> list[DeltaRow]:
    """One row per metric present in either Summary: A, B, B - A, B / A."""
    sa, sb = summary_row(a.profile), summary_row(b.profile)
    out = []
    for key, label, unit in METRICS:
        va, vb = _number(sa.get(key)), _number(sb.get(key))
        if va is None and vb is None:
            continue
        if unit == "%":
            va, vb = (None if va is None else va * 100), (None if vb is None else vb * 100)
        delta = None if va is None or vb is None else vb - va
        ratio = None if va in (None, 0) or vb is None else vb / va  # type: ignore[operator]
        out.append(DeltaRow(label, va, vb, delta, ratio, unit))
    return out


def instance_note(a: LoadedProfile, b: LoadedProfile) -> str:
    """A warning when the two profiles come from different instance types (allowed, but say so)."""
    if a.instance != b.instance:
        return f"different instances: A is {a.instance}, B is {b.instance} -- peaks and bandwidths differ"
    return ""


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "%":
        return f"{value:.2f} %"
    if unit == "s":
        from explorer.gui.timeaxis import format_ns

        return format_ns(value * 1e9)
    if unit == "B":
        return f"{value:,.0f} B"
    return f"{value:,.0f}" if abs(value) >= 1 or value == 0 else f"{value:.4g}"


def format_delta(row: DeltaRow) -> tuple[str, str]:
    if row.delta is None:
        return "–", "–"
    sign = "+" if row.delta > 0 else ""
    delta = sign + format_value(row.delta, row.unit) if row.unit != "%" else f"{sign}{row.delta:.2f} pp"
    ratio = "–" if row.ratio is None else f"×{row.ratio:.3f}"
    return delta, ratio
