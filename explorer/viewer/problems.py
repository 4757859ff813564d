"""The summary panel's "top problems": rule-based findings, each pointing at where it happens.

Every finding points at the op *kind* (``bottomup.kind_of``) with the largest share of what it
measures, and at that kind's biggest instance. Rules and thresholds follow the real Summary Viewer's
recommendation triggers (profile-schema §4.9)
where it states them, and say so in the finding where they are ours:

* **Tensor engine idle, waiting** -- Tensor instructions blocked on semaphores (``evt_wait_time_ns``)
  for >= 10 % of the run. When DMA is busier than the Tensor engine the waits are most likely on DMA.
  Points at where the waiting is: the op kind across layers that waited longest (all
  ``mlp/down_proj › dot``), and its biggest instance.
* **Memory-bound** (no wait column) -- Tensor engine active < 30 % while DMA is active more than twice
  as long. Points at the op moving the most HBM bytes.
* **Small DMA transfers** -- average transfer below 32 KiB (the Summary Viewer's ``average_dma_size``
  target). Points at the op with the most small packets when packets carry ``raw_hlo_id``.
* **Spill reloads** -- ``spill_reload_bytes`` > 25 % of HBM reads (§4.9). Points at the op reloading most.
* **Transposes dominating** -- ``transpose_flops`` > 10 % of ``hardware_flops`` (§4.9). Points at the
  op with the most transpose FLOPs.
* **Collectives** -- CC ops active >= 20 % of the run (ours). Points at the time range of the longest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from explorer.viewer.bottomup import Kind, kind_of
from explorer.viewer.hierarchy import OpAggregate, hlo_key
from explorer.viewer.model import Problem
from explorer.viewer.text import fmt_bytes, fmt_ns, fmt_pct

SMALL_DMA_BYTES = 32 * 1024


def _f(summary: Mapping[str, Any], key: str) -> float | None:
    value = summary.get(key)
    return None if value is None else float(value)


def _worst(ops: Sequence[OpAggregate], value: Callable[[OpAggregate], int | None]) -> OpAggregate | None:
    """The op with the largest ``value`` (ties: the earliest, then by name), None if all are 0."""
    ranked = sorted(
        (op for op in ops if (value(op) or 0) > 0),
        key=lambda o: (-(value(o) or 0), o.start_ts if o.start_ts is not None else 0, o.name),
    )
    return ranked[0] if ranked else None


def _where(
    ops: Sequence[OpAggregate], value: Callable[[OpAggregate], int | None]
) -> tuple[str, dict[str, Any]]:
    """Where a finding's ``value`` (waiting, bytes, FLOPs) is: the op *kind* across layers with the
    largest sum (``bottomup.kind_of``: all ``mlp/down_proj › dot``), then its biggest instance. A
    cost spread over 32 layers is named as the kind that has it, not as the one op with the most."""
    total = sum(value(op) or 0 for op in ops)
    if total <= 0:
        return "", {}
    kinds: dict[str, tuple[Kind, list[OpAggregate]]] = {}
    for op in ops:
        if (value(op) or 0) > 0:
            kind = kind_of(op.layer, op.name)
            kinds.setdefault(kind.key, (kind, []))[1].append(op)
    key, (kind, members) = max(
        kinds.items(), key=lambda kv: (sum(value(o) or 0 for o in kv[1][1]), kv[0])
    )
    share = sum(value(o) or 0 for o in members) / total
    biggest = _worst(members, value)
    assert biggest is not None
    layer = f", {biggest.layer}" if biggest.layer else ""
    text = (
        f"; {fmt_pct(share)} of it in {kind.label} ({len(members)} op{'s' if len(members) > 1 else ''}); "
        f"biggest {biggest.name}{layer}: {fmt_pct((value(biggest) or 0) / total)}"
    )
    link = {"node": hlo_key(biggest.ref), "t0": biggest.start_ts, "t1": biggest.end_ts, "kind": key}
    return text, link


def find_problems(
    summary: Mapping[str, Any],
    ops: Sequence[OpAggregate],
    total_ns: int | None,
    *,
    small_dma: Mapping[int, int] | None = None,
    small_dma_share: float | None = None,
    longest_cc: tuple[int, int, str] | None = None,
) -> tuple[Problem, ...]:
    """Findings, biggest first. ``small_dma``: raw_hlo_id -> packets under 32 KiB; ``small_dma_share``:
    fraction of packets under 32 KiB; ``longest_cc``: (start, end, operation) of the longest CC op."""
    found: list[Problem] = []
    total = float(total_ns or 0)
    tensor_active = _f(summary, "tensor_engine_active_time_percent")
    dma_active = _f(summary, "dma_active_time_percent")
    waits = [op.tensor_wait_ns for op in ops if op.tensor_wait_ns is not None]
    if waits and total > 0:
        wait = sum(waits)
        if wait >= 0.10 * total:
            likely = dma_active is not None and (tensor_active is None or dma_active >= tensor_active)
            where, link = _where(ops, lambda o: o.tensor_wait_ns)
            title = (
                "Tensor engine idle waiting on DMA"
                if likely
                else "Tensor engine idle waiting on other engines"
            )
            found.append(
                Problem(
                    title,
                    f"Tensor instructions blocked on semaphores for {fmt_ns(wait)} ({fmt_pct(wait / total)} "
                    f"of the run) while DMA was active {fmt_pct(dma_active)}{where}",
                    3 if wait >= 0.3 * total else 2,
                    **link,
                )
            )
    elif (
        tensor_active is not None
        and dma_active is not None
        and tensor_active < 0.3
        and dma_active > 2 * tensor_active
    ):
        where, link = _where(ops, lambda o: o.hbm_bytes)
        found.append(
            Problem(
                "Memory-bound: Tensor engine idle while DMA is busy",
                f"Tensor active {fmt_pct(tensor_active)}, DMA active {fmt_pct(dma_active)}{where}",
                2,
                **link,
            )
        )
    average = _f(summary, "dma_transfer_average_bytes")
    if average is not None and 0 < average < SMALL_DMA_BYTES:
        small = dict(small_dma or {})
        where, link = _where(
            ops, lambda o: small.get(int(o.ref[1])) if o.ref and o.ref[0] == "raw_hlo_id" else None
        )
        share = f", {fmt_pct(small_dma_share)} of packets under 32 KiB" if small_dma_share is not None else ""
        found.append(
            Problem(
                "Small DMA transfers",
                f"average transfer {fmt_bytes(average)} (target >= 32 KiB){share}{where}",
                2 if average < SMALL_DMA_BYTES / 4 else 1,
                **link,
            )
        )
    reload_bytes, hbm_read = _f(summary, "spill_reload_bytes"), _f(summary, "hbm_read_bytes")
    if reload_bytes and hbm_read and reload_bytes > 0.25 * hbm_read:
        where, link = _where(ops, lambda o: o.spill_reload_bytes)
        found.append(
            Problem(
                "Spill reloads",
                f"{fmt_bytes(reload_bytes)} reloaded from HBM = "
                f"{fmt_pct(reload_bytes / hbm_read)} of HBM reads (> 25 %){where}",
                3 if reload_bytes > 0.5 * hbm_read else 2,
                **link,
            )
        )
    transpose, hardware = _f(summary, "transpose_flops"), _f(summary, "hardware_flops")
    if transpose and hardware and transpose > 0.10 * hardware:
        where, link = _where(ops, lambda o: o.transpose_flops)
        found.append(
            Problem(
                "Transposes dominating",
                f"transposes are {fmt_pct(transpose / hardware)} of hardware FLOPs (> 10 %){where}",
                2 if transpose > 0.25 * hardware else 1,
                **link,
            )
        )
    cc = _f(summary, "cc_op_active_time_percent")
    if cc is not None and cc >= 0.2:
        extra: dict[str, Any] = {}
        text = ""
        if longest_cc is not None:
            extra = {"t0": longest_cc[0], "t1": longest_cc[1]}
            text = f"; longest: {longest_cc[2]} ({fmt_ns(longest_cc[1] - longest_cc[0])})"
        found.append(
            Problem(
                "Collectives take a large share",
                f"CC ops active {fmt_pct(cc)} of the run{text}",
                2 if cc >= 0.4 else 1,
                **extra,
            )
        )
    return tuple(sorted(found, key=lambda p: -p.severity))
