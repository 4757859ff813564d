"""The figures the GUI lists (Summary tab, region summary, compare), and two profiles' deltas.

    rows = summary_deltas(a, b)
    rows[0]  # DeltaRow("total time", 110_000.0, 90_000.0, -20_000.0, 0.82, Unit.TIME)

Every value is a ``formats.figures.Figures`` figure (docs/figures.md): a profile's whole execution
comes from its Summary row (``figures.from_summary``: stored, or computed by ``formats.summary``), a
region from ``figures.figures(profile, Window.span(t0, t1))`` -- so the GUI shows the same number as
summary-text, the terminal viewer and the Perfetto export. Each is printed by ``formats.units``
(sizes in KiB/MiB/GiB, throughput in GB/s, fractions as percentages). Profiles of different
instances are compared as they are -- the labels say which instance each is and ``instance_note``
says they differ, since e.g. a trn2 core's peak differs from a trn1 core's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from explorer.gui.session import LoadedProfile
from formats.read_api import (
    ENGINE_NAMES,
    UNKNOWN,
    Busy,
    Figures,
    fmt_bytes,
    fmt_count,
    fmt_flops,
    fmt_gbps,
    fmt_ns,
    fmt_pct,
    from_summary,
    summary_row,
)


class Unit(Enum):
    """How a figure is printed (``formats.units``) and how its delta reads."""

    TIME = "ns"
    FRACTION = "fraction"  # shown as a percentage; deltas in percentage points
    COUNT = "count"
    BYTES = "bytes"
    FLOPS = "flops"
    RATE = "B/s"


@dataclass(frozen=True)
class Metric:
    """One figure: its number (compared between profiles) and how the Summary and region lists
    print it (``text``, when that is not just the number: the DMA count names transfers and packets
    as every other view does, ``DmaFigures.count_text``). ``listed=False``: compared only, because
    another metric's line already prints it."""

    label: str
    value: Callable[[Figures], float | None]
    unit: Unit
    text: Callable[[Figures], str] | None = None
    listed: bool = True

    def shown(self, figs: Figures) -> str | None:
        """The printed line's value, or None when the figure is unknown."""
        if self.text is not None:
            return self.text(figs)
        value = self.value(figs)
        return None if value is None else format_value(value, self.unit)


def _fraction(busy: Busy | None) -> float | None:
    return None if busy is None else busy.fraction


def _engine_fraction(engine: str, f: Figures) -> float | None:
    return _fraction(f.engines.get(engine))


def _engine_instructions(engine: str, f: Figures) -> float | None:
    return None if engine not in f.engines else f.engines[engine].instructions


def _engine_label(engine: str) -> str:
    return "Tensor active (both rows)" if engine == "Tensor" else f"{engine} active"


METRICS: tuple[Metric, ...] = (
    Metric("total time", lambda f: f.length_ns, Unit.TIME),
    Metric("active", lambda f: f.active_fraction, Unit.FRACTION),
    *(
        Metric(_engine_label(e), functools.partial(_engine_fraction, e), Unit.FRACTION)
        for e in ENGINE_NAMES
    ),
    Metric("DMA active", lambda f: f.dma.active_fraction, Unit.FRACTION),
    Metric("MFU", lambda f: f.mfu, Unit.FRACTION),
    Metric("HFU", lambda f: f.hfu, Unit.FRACTION),
    Metric("MBU", lambda f: f.mbu, Unit.FRACTION),
    *(
        Metric(f"{e} instructions", functools.partial(_engine_instructions, e), Unit.COUNT)
        for e in ENGINE_NAMES
    ),
    Metric("hardware FLOPs", lambda f: f.flops.hardware, Unit.FLOPS),
    Metric("model FLOPs", lambda f: f.flops.model, Unit.FLOPS),
    Metric("HBM read", lambda f: f.hbm.read, Unit.BYTES),
    Metric("HBM write", lambda f: f.hbm.write, Unit.BYTES),
    Metric("DMA bytes", lambda f: f.dma.bytes, Unit.BYTES),
    Metric("DMA throughput", lambda f: f.dma.throughput_bytes_per_s, Unit.RATE),
    Metric("DMA transfers", lambda f: f.dma.transfers, Unit.COUNT, text=lambda f: f.dma.count_text),
    Metric("DMA packets", lambda f: f.dma.packets, Unit.COUNT, listed=False),
    Metric("collectives", lambda f: f.collectives.count, Unit.COUNT),
    Metric("collective time", lambda f: f.collectives.active_ns, Unit.TIME),
)


def profile_figures(loaded: LoadedProfile) -> Figures:
    """The whole execution's figures of a profile (its Summary row, stored or computed)."""
    return from_summary(summary_row(loaded.profile), loaded.metadata)


def format_value(value: float | None, unit: Unit) -> str:
    """One figure as every view prints it (``formats.units``)."""
    if value is None:
        return UNKNOWN
    if unit is Unit.TIME:
        return fmt_ns(value)
    if unit is Unit.FRACTION:
        return fmt_pct(value)
    if unit is Unit.BYTES:
        return fmt_bytes(value)
    if unit is Unit.FLOPS:
        return fmt_flops(value)
    if unit is Unit.RATE:
        return fmt_gbps(value)
    return fmt_count(value)


def figure_lines(figs: Figures) -> list[tuple[str, str]]:
    """(label, printed value) of every known listed figure, in ``METRICS`` order."""
    out = []
    for metric in METRICS:
        shown = metric.shown(figs) if metric.listed else None
        if shown is not None:
            out.append((metric.label, shown))
    return out


@dataclass(frozen=True)
class DeltaRow:
    metric: str
    a: float | None
    b: float | None
    delta: float | None
    ratio: float | None
    unit: Unit


def deltas(fa: Figures, fb: Figures) -> list[DeltaRow]:
    """One row per figure known on either side: A, B, B - A, B / A."""
    out = []
    for metric in METRICS:
        va, vb = metric.value(fa), metric.value(fb)
        if va is None and vb is None:
            continue
        va = None if va is None else float(va)
        vb = None if vb is None else float(vb)
        delta = None if va is None or vb is None else vb - va
        ratio = None if not va or vb is None else vb / va  # no ratio to nothing or to zero
        out.append(DeltaRow(metric.label, va, vb, delta, ratio, metric.unit))
    return out


def summary_deltas(a: LoadedProfile, b: LoadedProfile) -> list[DeltaRow]:
    """The two profiles' whole-execution figures side by side."""
    return deltas(profile_figures(a), profile_figures(b))


def instance_note(a: LoadedProfile, b: LoadedProfile) -> str:
    """A warning when the two profiles come from different instance types (allowed, but say so)."""
    if a.instance != b.instance:
        return f"different instances: A is {a.instance}, B is {b.instance} -- peaks and bandwidths differ"
    return ""


def format_delta(row: DeltaRow) -> tuple[str, str]:
    """(B - A, B / A) as printed: percentage points for fractions."""
    if row.delta is None:
        return UNKNOWN, UNKNOWN
    sign = "+" if row.delta > 0 else "-" if row.delta < 0 else ""
    if row.unit is Unit.FRACTION:
        delta = f"{sign}{abs(row.delta) * 100:.2f} pp"
    else:
        delta = sign + format_value(abs(row.delta), row.unit)
    ratio = UNKNOWN if row.ratio is None else f"×{row.ratio:.3f}"
    return delta, ratio


__all__ = [
    "METRICS", "DeltaRow", "Metric", "Unit", "deltas", "figure_lines", "format_delta", "format_value",
    "instance_note", "profile_figures", "summary_deltas",
]
