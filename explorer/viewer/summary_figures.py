"""The summary panel's figures from a Summary row (profile-schema §4), with the formula each uses.

Only reads the row; ``None`` stays "-" (a profile that cannot tell, e.g. no FLOP columns for MFU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from explorer.viewer.text import fmt_bytes, fmt_count, fmt_ns, fmt_pct
from explorer.viewer.view_model import ENGINES, Figure
from formats.read_api import from_summary


def _get(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    return None if value is None else float(value)


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def total_ns(row: Mapping[str, Any]) -> int | None:
    seconds = _get(row, "total_time")
    return None if seconds is None else round(seconds * 1e9)


def figures(row: Mapping[str, Any]) -> tuple[Figure, ...]:
    """Total time, utilisation, DMA, bytes and collectives, in the order the panel shows them."""
    seconds = _get(row, "total_time")
    hbm = _sum(_get(row, "hbm_read_bytes"), _get(row, "hbm_write_bytes"))
    cc_time = _get(row, "cc_op_active_time")
    return (
        Figure("Total time", fmt_ns(None if seconds is None else seconds * 1e9), "Summary.total_time"),
        Figure("MFU", fmt_pct(_get(row, "mfu_estimated_percent")), "model FLOPs / (PE peak x T)"),
        Figure("HFU", fmt_pct(_get(row, "hfu_estimated_percent")), "hardware FLOPs / (PE peak x T)"),
        Figure("MBU", fmt_pct(_get(row, "mbu_estimated_percent")), "HBM bytes / T / HBM bandwidth"),
        Figure("Active", fmt_pct(_get(row, "total_active_time_percent")), "union of all busy time / T"),
        Figure("DMA active", fmt_pct(_get(row, "dma_active_time_percent")), "union of DMA packets / T"),
        Figure("HBM moved", fmt_bytes(hbm), "hbm_read_bytes + hbm_write_bytes"),
        Figure(
            "DMA moved",
            f"{fmt_bytes(_get(row, 'dma_transfer_total_bytes'))} in {from_summary(row).dma.count_text}",
            "dma_transfer_total_bytes",
        ),
        Figure(
            "CC time",
            f"{fmt_ns(None if cc_time is None else cc_time * 1e9)} "
            f"({fmt_pct(_get(row, 'cc_op_active_time_percent'))}, "
            f"{fmt_count(None if row.get('cc_op_count') is None else int(row['cc_op_count']))} ops)",
            "cc_op_active_time",
        ),
        *training(row),
    )


def training(row: Mapping[str, Any]) -> tuple[Figure, ...]:
    """A training step's figures (the Summary's training columns, the numbers summary-text's
    "training step" line prints); none for a profile that recorded no step."""
    step = _get(row, "training_step_time")
    if step is None:
        return ()
    seq_per_s = _get(row, "training_seq_per_s") or 0.0
    return (
        Figure("Step", f"{fmt_ns(step * 1e9)} · {seq_per_s:,.1f} seq/s",
               "Summary.training_step_time, global batch / step time"),
        Figure("Train MFU", fmt_pct(_get(row, "training_mfu_percent")),
               "(6N + 12Lhs) x tokens / (step time x ranks x peak)"),
    )


def engine_active(row: Mapping[str, Any]) -> tuple[tuple[str, float | None], ...]:
    """Per-engine active time as a fraction of total time, DMA last."""
    out = [(e, _get(row, f"{e.lower()}_engine_active_time_percent")) for e in ENGINES]
    out.append(("DMA", _get(row, "dma_active_time_percent")))
    return tuple(out)
