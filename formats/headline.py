"""What a person reads first in ``summary-text``: a headline per profile, a table per dataset.

    lines = headline_lines(Program(name, profile, row))      # one profile: device time, MFU, busiest
                                                             # engine, DMA/HBM, CC, top problems
    lines = dataset_lines(programs)                          # many: one row per profile + aggregate

Every figure comes from ``formats.figures`` (the Summary row read as the whole-execution window,
``from_summary``) and prints with ``formats.units`` (docs/figures.md); problems from
``formats.findings``. A profile of one rank of a parallel group says which rank it is
(:func:`rank_labels`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from formats.figures import Figures, collective_overlap, from_summary
from formats.schema import ENGINE_NAMES
from formats.units import fmt_bytes, fmt_count, fmt_flops, fmt_gbps, fmt_ns, fmt_pct

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = ["MAX_PROBLEMS", "Program", "dataset_lines", "headline_lines", "longest", "rank_labels",
           "training_lines"]

MAX_PROBLEMS = 3
AGGREGATE = "all"
# A key starts a path segment or follows a non-word character: without the look-behind, a long
# segment with no "=" is rescanned from every one of its characters (quadratic: a 10^5-character
# name took a minute); with it, each segment is scanned once.
_PARTITION = re.compile(r"(?<![\w-])(?P<key>[A-Za-z_][\w-]*)=(?P<value>[^/]+)")


@dataclass(frozen=True)
class Program:
    """One profile as summary-text shows it: its key (summary-json's), the profile, its Summary row."""

    name: str
    profile: Profile
    row: Mapping[str, Any]

    @property
    def figures(self) -> Figures:
        return from_summary(self.row, self.profile.metadata)


def _partitions(name: str) -> dict[str, str]:
    return {m["key"]: m["value"] for m in _PARTITION.finditer(name)}


def rank_labels(programs: Sequence[Program]) -> dict[str, str]:
    """``name -> "rank 1 of 2 (core 1)"`` for profiles of one model and execution on several cores
    (the ranks of a parallel group, in core order; a ``rank=`` partition or ``Metadata.rank`` wins);
    ``"core N"`` for a profile alone on its core; '' when nothing is known."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    out: dict[str, str] = {}
    for p in programs:
        parts = _partitions(p.name)
        rank = parts.get("rank", p.profile.metadata.get("rank"))
        core = parts.get("core", p.profile.metadata.get("neuroncore_idx"))
        if rank is not None:
            out[p.name] = f"rank {rank}" + (f" (core {core})" if core is not None else "")
            continue
        if core is None:
            out[p.name] = ""
            continue
        key = (parts.get("model", ""), parts.get("execution", ""))
        groups.setdefault(key, []).append((int(core) if str(core).isdigit() else 0, p.name))
        out[p.name] = f"core {core}"
    for members in groups.values():
        if len(members) > 1:
            for index, (core, name) in enumerate(sorted(members)):
                out[name] = f"rank {index} of {len(members)} (core {core})"
    return out


def _engine_line(figs: Figures) -> str:
    busiest = figs.busiest
    if busiest is None:
        return "-"
    others = [f"{name} {fmt_pct(b.fraction)}" for name in ENGINE_NAMES
              if (b := figs.engines.get(name)) is not None and name != busiest.name]
    tensor = " (both Tensor rows)" if busiest.name == "Tensor" else ""
    rest = f"  · {' · '.join(others)}" if others else ""
    return f"{busiest.name} {fmt_pct(busiest.fraction)}{tensor}{rest}"


def headline_lines(program: Program, label: str = "", problems: Sequence[Any] = (),
                   notes: Sequence[str] = ()) -> list[str]:
    """The headline block of one profile (``problems``: ``formats.findings.Finding``, biggest first)."""
    figs = program.figures
    title = program.name + (f" · {label}" if label else "")
    lines = [f"== {title} =="]
    lines += [f"note            {n}" for n in notes]
    lines.append(f"device time     {fmt_ns(figs.length_ns)}")
    lines.append(f"utilisation     MFU {fmt_pct(figs.mfu)}   HFU {fmt_pct(figs.hfu)}   "
                 f"MBU {fmt_pct(figs.mbu)}   (model FLOPs {fmt_flops(figs.flops.model)})")
    lines.append(f"busiest engine  {_engine_line(figs)}")
    dma = figs.dma
    lines.append(f"DMA             {fmt_bytes(dma.bytes)} in {dma.count_text}, "
                 f"{fmt_gbps(dma.throughput_bytes_per_s)} average, active {fmt_pct(dma.active_fraction)}")
    lines.append(f"HBM             {fmt_bytes(figs.hbm.read)} read, {fmt_bytes(figs.hbm.write)} written")
    cc = figs.collectives
    if cc.count:
        lines.append(f"collectives     {fmt_count(cc.count)} ops, {fmt_ns(cc.time_ns)}, active "
                     f"{fmt_pct(cc.active_fraction)}")
    lines += training_lines(program.profile)
    if problems:
        for index, finding in enumerate(list(problems)[:MAX_PROBLEMS], start=1):
            lead = "problems        " if index == 1 else " " * 16
            where = f" → {finding.where}" if finding.where else ""
            lines.append(f"{lead}{index}. {finding.title}: {finding.detail}{where}")
    else:
        lines.append("problems        none found by the rules in docs/figures.md")
    return lines


def training_lines(profile: Profile) -> list[str]:
    """The training-step block of a profile that recorded a step (TrainingStep, TrainingCollective):
    step time, throughput, training MFU, time per level, gradient-synchronisation overlap."""
    from formats.summary import TRAINING_LEVELS, training_summary

    found = training_summary(profile)
    if found is None:
        return []
    fig = found.figures
    # a model without a sequence axis (an MLP on feature vectors: seq 0) has samples, not tokens
    tokens = f"{fig.tokens_per_s:,.0f} tokens/s · " if found.seq else ""
    lines = [f"training step   {fmt_ns(found.step_ns)} · {fig.seq_per_s:,.1f} seq/s · "
             f"{tokens}training MFU {fmt_pct(fig.mfu)}  ({found.layout}, {found.steps_text})",
             "step levels     " + " · ".join(
                 f"{level.replace('_', ' ')} {fmt_ns(found.levels_ns[level])}" for level in TRAINING_LEVELS)]
    if profile.has("TrainingCollective"):
        rows = profile.table("TrainingCollective").to_pylist()
        # pipeline sends/receives last from their start to the transfer's end: a receive's wait
        # for its peer stage is in its duration (the bubble)
        for kind, what in (("dp", "grad sync cc"), ("tp", "tp cc"), ("pp", "pipeline cc")):
            mine = [r for r in rows if r["replica_group_kind"] == kind]
            if mine:
                durations = [r["duration_ns"] for r in mine]
                overlap = collective_overlap(durations, [r["overlap_ns"] for r in mine])
                lines.append(f"{what:<16}{fmt_count(len(mine))} ops, {fmt_ns(sum(durations))}, "
                             f"{fmt_pct(overlap)} overlapped with compute")
    return lines


def _total(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def dataset_lines(programs: Sequence[Program], labels: Mapping[str, str]) -> list[str]:
    """One row per profile, then the aggregate: Σ device time, time-weighted MFU and engine busy
    (Σ numerators / Σ denominators), Σ bytes. The rows' figures are each profile's Summary."""
    figs = [p.figures for p in programs]
    # every name whole (summary-text is read by scripts and grep; two programs' names may differ
    # only at the start, e.g. model=<m>.context_encoding vs .token_generation)
    width = max([len(p.name) for p in programs] + [len(AGGREGATE)])
    rank_width = max([len(labels.get(p.name, "")) for p in programs] + [4])
    header = (f"{'profile':<{width}} {'rank':<{rank_width}} {'device time':>11} {'MFU':>6} "
              f"{'busiest engine':<16} {'DMA act.':>8} {'HBM bytes':>10} {'CC act.':>7}")
    lines = [f"== {len(programs)} profiles ==", header]

    def row(name: str, label: str, f: Figures, busiest: str) -> str:
        return (f"{name:<{width}} {label:<{rank_width}} {fmt_ns(f.length_ns):>11} {fmt_pct(f.mfu):>6} "
                f"{busiest[:16]:<16} {fmt_pct(f.dma.active_fraction):>8} {fmt_bytes(f.hbm.total):>10} "
                f"{fmt_pct(f.collectives.active_fraction):>7}")

    for program, f in zip(programs, figs):
        top = f.busiest
        lines.append(row(program.name, labels.get(program.name, ""), f,
                         f"{top.name} {fmt_pct(top.fraction)}" if top else "-"))
    lengths = [f.length_ns or 0.0 for f in figs]
    total_ns = sum(lengths)
    peak_time = _total([f.hardware.peak_flops_per_s * (f.length_ns or 0) * 1e-9
                        if f.hardware.peak_flops_per_s else None for f in figs])
    model = _total([f.flops.model for f in figs])
    busy: dict[str, float] = {}
    for f in figs:
        for name, b in f.engines.items():
            busy[name] = busy.get(name, 0.0) + b.busy_ns
    top_engine = max(busy, key=lambda k: busy[k], default=None)
    mfu = None if model is None or not peak_time else model / peak_time
    dma_active = sum(f.dma.active_ns for f in figs)
    cc_active = sum(f.collectives.active_ns for f in figs)
    hbm = _total([f.hbm.total for f in figs])

    def share(x: float) -> str:
        return fmt_pct(x / total_ns) if total_ns else "-"

    busiest = f"{top_engine} {share(busy[top_engine])}" if top_engine else "-"
    lines.append(f"{AGGREGATE:<{width}} {'':<{rank_width}} {fmt_ns(total_ns):>11} {fmt_pct(mfu):>6} "
                 f"{busiest[:16]:<16} {share(dma_active):>8} {fmt_bytes(hbm):>10} {share(cc_active):>7}")
    lines.append("(all: Σ device time; MFU, busy and active as fractions of Σ device time; Σ bytes)")
    return lines


def longest(programs: Sequence[Program]) -> Program:
    """The profile with the longest device time (the first of equals): the one whose headline a
    dataset's summary shows."""
    return max(programs, key=lambda p: p.figures.length_ns or 0.0)
