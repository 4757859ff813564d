"""The summary of a box-selected region: busy time per boxed row, the device's figures over the same
window, and the opcode breakdown.

    summary = region_summary(loaded, rows, t0, t1)      # absolute ns, [t0, t1)

Every figure is ``formats.figures`` over ``Window.span(t0, t1)`` (docs/figures.md), the same
definitions summary-text, the terminal viewer and the Perfetto export use:

* **busy** of a boxed instruction row = ``row_busy``: length of the union of the row's instructions
  clipped to [t0, t1), divided by t1 - t0. When a Tensor row is boxed, the Tensor engine's union
  across its two rows (LoadStationary and MATMUL: what the Summary's "Tensor active" means) is
  listed too.
* **the device in the window** = ``figures``: every engine's busy %, DMA packets, bytes, active %
  and throughput, HBM bytes read and written (the DMA packets' HBM columns: HBM traffic is DMA
  traffic), FLOPs, MFU/HFU/MBU, collectives -- amounts count what starts in the window.
* **opcode breakdown**: per opcode of the boxed instruction rows, the instructions overlapping the
  region and their time inside it (clipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from explorer.gui.rows import INSTRUCTION, Row
from explorer.gui.session import LoadedProfile
from formats.read_api import Busy, Figures, TableSource, Window, figures, key_condition, row_busy

TENSOR_UNION = "Tensor engine (both rows)"


@dataclass
class OpcodeLine:
    opcode: str
    count: int
    time_ns: int


@dataclass
class RegionSummary:
    t0: int
    t1: int
    busy: list[Busy] = field(default_factory=list)  # per boxed instruction row (+ the Tensor union)
    opcodes: list[OpcodeLine] = field(default_factory=list)
    device: Figures | None = None  # every figure of the profile over [t0, t1)

    @property
    def length_ns(self) -> int:
        return self.t1 - self.t0

    @property
    def dma_packets(self) -> int:
        return 0 if self.device is None else self.device.dma.packets

    @property
    def dma_bytes(self) -> int:
        return 0 if self.device is None else self.device.dma.bytes

    @property
    def model_flops(self) -> int | None:
        return None if self.device is None else self.device.flops.model

    @property
    def mfu(self) -> float | None:
        return None if self.device is None else self.device.mfu


def _instruction_condition(source: TableSource, rows: Sequence[Row]) -> str:
    keys = [k for r in rows for k in r.keys]
    return key_condition(source, ("pcore_idx", "timeline_track", "engine"), keys)


def region_summary(loaded: LoadedProfile, rows: Sequence[Row], t0: int, t1: int) -> RegionSummary:
    """Summary of [t0, t1) (absolute ns) over the selected rows of one profile."""
    summary = RegionSummary(int(t0), int(t1))
    if t1 <= t0:
        return summary
    window = Window.span(t0, t1)
    instr_rows = [r for r in rows if r.kind == INSTRUCTION]
    queries = loaded.queries
    with queries.lock:
        con = queries.con
        for row in instr_rows:
            busy = row_busy(
                loaded.profile, window, tracks=[row.label], pcore=row.pcore or 0, label=row.shown, con=con
            )
            summary.busy.append(busy)
        tensor_cores = sorted({r.pcore or 0 for r in instr_rows if r.engine == "Tensor"})
        for pcore in tensor_cores:
            label = TENSOR_UNION if len(tensor_cores) == 1 else f"{TENSOR_UNION}, pcore {pcore}"
            summary.busy.append(row_busy(loaded.profile, window, engines=["Tensor"], pcore=pcore,
                                              label=label, con=con))
        summary.device = figures(loaded.profile, window, con)
    source = TableSource(loaded.profile, "Instruction")
    if source.present and instr_rows:
        condition = _instruction_condition(source, instr_rows)
        lookback = t0 - _longest(loaded)
        for line in queries.rows(
            f"""
                SELECT opcode, count(*) AS n, sum(least(end_ts, ?) - greatest(start_ts, ?)) AS t
                FROM {source.relation()}
                WHERE {condition} AND start_ts < ? AND end_ts > ? AND start_ts >= ?
                GROUP BY opcode ORDER BY t DESC, opcode""",
            [t1, t0, t1, t0, lookback],
        ):
            summary.opcodes.append(OpcodeLine(str(line["opcode"]), int(line["n"]), int(line["t"] or 0)))
    return summary


def _longest(loaded: LoadedProfile) -> int:
    """The longest instruction (bounds the lookback so row groups far before t0 are skipped)."""
    cached = loaded.longest_instruction_ns
    if cached is None:
        source = TableSource(loaded.profile, "Instruction")
        found = loaded.queries.rows(f"SELECT max(end_ts - start_ts) AS d FROM {source.relation()}")
        cached = int(found[0]["d"] or 0) if found else 0
        loaded.longest_instruction_ns = cached
    return cached


def as_text(summary: RegionSummary, origin: int = 0) -> list[tuple[str, str]]:
    """The summary as (name, value) lines (the panel and the clipboard), printed by ``formats.units``."""
    from explorer.gui.compare import figure_lines
    from formats.read_api import fmt_count, fmt_ns, fmt_pct

    lines = [
        (
            "region",
            f"{fmt_ns(summary.t0 - origin)} → {fmt_ns(summary.t1 - origin)} ({fmt_ns(summary.length_ns)})",
        )
    ]
    for b in summary.busy:
        lines.append(
            (
                f"busy {b.name}",
                f"{fmt_pct(b.fraction)}  ({fmt_ns(b.busy_ns)}, "
                f"{fmt_count(b.instructions)} starting)",
            )
        )
    if summary.device is not None:
        lines.append(("— the device in this window —", ""))
        lines += [(label, value) for label, value in figure_lines(summary.device) if label != "total time"]
    return lines


__all__ = ["TENSOR_UNION", "OpcodeLine", "RegionSummary", "as_text", "region_summary"]
