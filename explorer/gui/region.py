"""The summary of a box-selected region: busy time per row, opcode breakdown, bytes moved, MFU.

    summary = region_summary(loaded, rows, t0, t1)      # absolute ns, [t0, t1)

Definitions (docs/neuron-explorer.md, and the test checks them against its own DuckDB queries):

* **busy** of an instruction row = length of the union of its instructions' intervals clipped to
  [t0, t1), divided by t1 - t0. Computed in DuckDB: sorted by start, each interval adds
  ``max(0, end - max(start, running max of the ends before it))`` -- exact, one window pass. For
  regions holding more than ``UNION_ROWS_LIMIT`` instructions the engine's precomputed ``ActiveTime``
  stretches are clipped instead (per engine: the Tensor row then covers both PE streams).
* **opcode breakdown**: per opcode of the selected instruction rows, the instructions overlapping
  the region and their time inside it (clipped).
* **bytes moved**: DMA packets starting in the region on the selected queues (all queues if the box
  holds none): count and ``transfer_bytes``; plus the instructions' HBM/SBUF byte columns.
* **MFU** = model FLOPs of the Tensor instructions starting in the region ÷ (PEAK × (t1 - t0)),
  model FLOPs as the Summary defines them (PE FLOPs attributed to an HLO op, transposes excluded),
  PEAK from Metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from explorer.gui.rows import DMA, INSTRUCTION, Row
from explorer.gui.session import LoadedProfile
from formats.sqlsource import TableSource
from formats.summary_scan import Hardware
from formats.tracks import key_condition

UNION_ROWS_LIMIT = 5_000_000


@dataclass
class RowBusy:
    label: str
    busy_ns: int
    fraction: float
    instructions: int
    source: str  # "instructions" or "ActiveTime"


@dataclass
class OpcodeLine:
    opcode: str
    count: int
    time_ns: int


@dataclass
class RegionSummary:
    t0: int
    t1: int
    busy: list[RowBusy] = field(default_factory=list)
    opcodes: list[OpcodeLine] = field(default_factory=list)
    dma_packets: int = 0
    dma_bytes: int = 0
    instruction_bytes: dict[str, int] = field(default_factory=dict)
    model_flops: int | None = None
    mfu: float | None = None
    instructions: int = 0

    @property
    def length_ns(self) -> int:
        return self.t1 - self.t0


def _instruction_condition(source: TableSource, rows: Sequence[Row]) -> str:
    keys = [k for r in rows for k in r.keys]
    return key_condition(source, ("pcore_idx", "timeline_track", "engine"), keys)


def busy_of_row(loaded: LoadedProfile, row: Row, t0: int, t1: int, count: int) -> RowBusy:
    source = TableSource(loaded.profile, "Instruction")
    condition = _instruction_condition(source, [row])
    if count > UNION_ROWS_LIMIT and loaded.profile.num_rows("ActiveTime") and row.engine:
        active = TableSource(loaded.profile, "ActiveTime")
        found = loaded.queries.rows(
            f"""
            SELECT sum(least(end_ts, ?) - greatest(start_ts, ?)) AS busy FROM {active.relation()}
            WHERE {active.col("engine")} = ? AND coalesce({active.col("pcore_idx")}, 0) = ?
              AND start_ts < ? AND end_ts > ?""",
            [t1, t0, row.engine, row.pcore or 0, t1, t0],
        )
        busy = int(found[0]["busy"] or 0)
        return RowBusy(row.label, busy, busy / (t1 - t0), count, "ActiveTime")
    found = loaded.queries.rows(
        f"""
        SELECT sum(greatest(0, e - greatest(s, coalesce(reach, s)))) AS busy FROM (
            SELECT s, e, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM (SELECT greatest(start_ts, ?) AS s, least(end_ts, ?) AS e FROM {source.relation()}
                  WHERE {condition} AND start_ts < ? AND end_ts > ? AND start_ts >= ?))""",
        [t0, t1, t1, t0, t0 - _longest(loaded)],
    )
    busy = int(found[0]["busy"] or 0)
    return RowBusy(row.label, busy, busy / (t1 - t0), count, "instructions")


def _longest(loaded: LoadedProfile) -> int:
    """The longest instruction (bounds the lookback so row groups far before t0 are skipped)."""
    cached = getattr(loaded, "_longest_instruction", None)
    if cached is None:
        source = TableSource(loaded.profile, "Instruction")
        found = loaded.queries.rows(f"SELECT max(end_ts - start_ts) AS d FROM {source.relation()}")
        cached = int(found[0]["d"] or 0) if found else 0
        loaded._longest_instruction = cached  # type: ignore[attr-defined]
    return cached


def region_summary(loaded: LoadedProfile, rows: Sequence[Row], t0: int, t1: int) -> RegionSummary:
    """Summary of [t0, t1) (absolute ns) over the selected rows of one profile."""
    summary = RegionSummary(int(t0), int(t1))
    if t1 <= t0:
        return summary
    instr_rows = [r for r in rows if r.kind == INSTRUCTION]
    dma_rows = [r for r in rows if r.kind == DMA]
    source = TableSource(loaded.profile, "Instruction")
    if source.present and instr_rows:
        condition = _instruction_condition(source, instr_rows)
        lookback = t0 - _longest(loaded)
        for line in loaded.queries.rows(
            f"""
                SELECT opcode, count(*) AS n, sum(least(end_ts, ?) - greatest(start_ts, ?)) AS t
                FROM {source.relation()}
                WHERE {condition} AND start_ts < ? AND end_ts > ? AND start_ts >= ?
                GROUP BY opcode ORDER BY t DESC, opcode""",
            [t1, t0, t1, t0, lookback],
        ):
            summary.opcodes.append(OpcodeLine(str(line["opcode"]), int(line["n"]), int(line["t"] or 0)))
        per_row = _counts_per_row(loaded, source, instr_rows, t0, t1, lookback)
        summary.busy = [busy_of_row(loaded, r, t0, t1, per_row.get(i, 0)) for i, r in enumerate(instr_rows)]
        _bytes_and_flops(loaded, source, condition, summary)
    _dma(loaded, dma_rows, summary)
    hw = Hardware.from_metadata(loaded.metadata)
    if summary.model_flops is not None and hw.peak_flops_per_s:
        summary.mfu = summary.model_flops / (hw.peak_flops_per_s * (t1 - t0) * 1e-9)
    return summary


def _counts_per_row(
    loaded: LoadedProfile, source: TableSource, rows: Sequence[Row], t0: int, t1: int, lookback: int
) -> dict[int, int]:
    out = {}
    for i, row in enumerate(rows):
        found = loaded.queries.rows(
            f"""
            SELECT count(*) AS n FROM {source.relation()}
            WHERE {_instruction_condition(source, [row])}
              AND start_ts < ? AND end_ts > ? AND start_ts >= ?""",
            [t1, t0, lookback],
        )
        out[i] = int(found[0]["n"])
    return out


def _bytes_and_flops(
    loaded: LoadedProfile, source: TableSource, condition: str, summary: RegionSummary
) -> None:
    c = source.col
    byte_columns = ("hbm_read_bytes", "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes")
    sums = ", ".join(f"sum({c(b)}) AS {b}" for b in byte_columns)
    transpose = (
        f"coalesce({c('flops_transpose')}, CASE WHEN {c('tensor_instruction_type')} = 'TRANSPOSE' "
        f"THEN {c('raw_flops')} END, 0)"
    )
    model = (
        f"sum(greatest(coalesce({c('raw_flops')}, 0), coalesce({c('flops_transpose')}, 0)) - {transpose}) "
        f"FILTER (WHERE {c('engine')} = 'Tensor' AND {c('raw_hlo_id')} IS NOT NULL "
        f"AND ({c('raw_flops')} IS NOT NULL OR {c('flops_transpose')} IS NOT NULL))"
    )
    found = loaded.queries.rows(
        f"""
        SELECT count(*) AS n, {sums}, {model} AS model_flops FROM {source.relation()}
        WHERE {condition} AND start_ts >= ? AND start_ts < ?""",
        [summary.t0, summary.t1],
    )[0]
    summary.instructions = int(found["n"])
    summary.instruction_bytes = {b: int(found[b]) for b in byte_columns if found[b] is not None}
    summary.model_flops = None if found["model_flops"] is None else int(found["model_flops"])


def _dma(loaded: LoadedProfile, rows: Sequence[Row], summary: RegionSummary) -> None:
    source = TableSource(loaded.profile, "DmaPacket")
    if not source.present:
        return
    keys = [k for r in rows for k in r.keys]
    condition = key_condition(source, ("pcore_idx", "queue_name", "queue_idx"), keys) if keys else "true"
    found = loaded.queries.rows(
        f"""
        SELECT count(*) AS n, sum(transfer_bytes) AS nbytes FROM {source.relation()}
        WHERE {condition} AND start_ts >= ? AND start_ts < ?""",
        [summary.t0, summary.t1],
    )[0]
    summary.dma_packets = int(found["n"])
    summary.dma_bytes = int(found["nbytes"] or 0)


def as_text(summary: RegionSummary, origin: int = 0) -> list[tuple[str, str]]:
    """The summary as (name, value) lines (the panel and the clipboard)."""
    from explorer.gui.timeaxis import format_ns

    lines = [
        (
            "region",
            f"{format_ns(summary.t0 - origin)} → {format_ns(summary.t1 - origin)} "
            f"({format_ns(summary.length_ns)})",
        )
    ]
    for b in summary.busy:
        lines.append(
            (
                f"busy {b.label}",
                f"{b.fraction * 100:.1f} %  ({format_ns(b.busy_ns)}, "
                f"{b.instructions:,} instr.{', ActiveTime' if b.source != 'instructions' else ''})",
            )
        )
    lines.append(("instructions starting", f"{summary.instructions:,}"))
    lines.append(("DMA moved", f"{summary.dma_bytes:,} B in {summary.dma_packets:,} packets"))
    for name, value in summary.instruction_bytes.items():
        lines.append((name.replace("_", " "), f"{value:,} B"))
    lines.append(("model FLOPs", "–" if summary.model_flops is None else f"{summary.model_flops:,}"))
    lines.append(("MFU", "–" if summary.mfu is None else f"{summary.mfu * 100:.2f} %"))
    return lines


__all__ = ["OpcodeLine", "RegionSummary", "RowBusy", "as_text", "region_summary"]
