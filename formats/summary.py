"""Summary metrics (profile-schema §4): ``Summary``, ``OpcodeSummary``, ``ActiveTime``, ``DmaUsage``
and ``ThrottleSummary`` (``formats.throttling``) computed from a profile's event tables.

    derived = compute(open_profile("out/bert"))
    derived.summary["mfu_estimated_percent"]       # a fraction in [0, 1], as the real tool writes it
    derived.opcode_summary, derived.active_time    # Arrow tables in the schema's columns

    summary_row(profile)          # the profile's own Summary row if it has one, else computed

The Summary is the whole-execution window of the figures ``formats.figures`` defines (docs/figures.md):
``formats.figures.figures(p, whole(p))`` equals ``from_summary(row)``; this module computes all of
them in one pass at capture close, the window functions compute any of them for a region.

How, and why this way:

* **Sums, counts and spans are DuckDB aggregates** over the Parquet parts (``Profile.files``): one
  grouped scan of ``Instruction`` by (engine, opcode) gives every per-engine and per-opcode count,
  instruction time, byte and FLOP total; one of ``DmaPacket`` by queue type gives the DMA classes.
* **Unions ("active time") are swept in time slices** (``formats.intervals``): DuckDB reads the rows
  whose ``start_ts`` falls in one slice (row groups pruned by their statistics) as NumPy columns,
  and the sweep carries open segments across slices. A DuckDB window over 10M rows costs seconds;
  this costs one scan, and memory is one slice's, whatever the profile's size.
* **Hardware constants come from Metadata**: ``PEAK = 2 x tensor_engine_num_rows x
  tensor_engine_num_cols x tensor_engine_clock_freq x 1e9`` FLOP/s, ``HBM_BW = hbm_ddr_bandwidth``.
* **Null, never a made-up 0** (§4): a column the tables cannot determine (a byte counter the writer
  left empty, sizes only the NEFF knows and nobody passed in ``ProgramFacts``) is None. A table that
  is absent means the activity is (§1.1: "tables exist only when the activity does"): no ``CcOp``
  file gives ``cc_op_count = 0``.

Formulas, choices where the reference leaves a gap (all in docs/profiles.md):

* ``total_time`` = sum over ``ExecutionInfo`` rows of ``execution_end_ts - execution_start_ts`` (the
  runtime's start/stop of each run; idle gaps inside a run count, host gaps between runs do not);
  without ExecutionInfo, ``Metadata.last_hw_timestamp - first_hw_timestamp``; failing that, the span
  of all events. It is T, the denominator of every ``_percent`` and of MFU/HFU/MBU.
* Per instruction, PE FLOPs = ``greatest(raw_flops, flops_transpose)``: the real tool's
  ``raw_flops`` may or may not include a transpose's FLOPs, ours are 0 with the count in
  ``flops_transpose``; either way ``hardware_flops`` counts each PE instruction once.
  ``transpose_flops`` = Σ ``flops_transpose`` (or ``raw_flops`` of ``TRANSPOSE``-typed instructions).
* ``model_flops`` = non-transpose PE FLOPs of instructions attributed to an HLO op (``raw_hlo_id``):
  the work the graph asked for as the trace saw it (the HLO graph's own statistics are not in the
  tables, so ``mfu_hlo_*`` stay null).
* ``*_max_achievable_*`` = arithmetic intensity ÷ ridge point, capped at 1.0.
* ``total_active_time_percent`` divides by ``total_time`` (§9.4); ``OpcodeSummary.active_time_percent``
  is a fraction of ``total_time`` like the Summary's.
* HBM bytes: Σ of ``DmaPacket.hbm_read_bytes``/``hbm_write_bytes`` (our extension) when present, else
  of the ``Instruction`` columns. SBUF bytes: instructions' plus each DMA packet's on-chip side
  (bytes that did not touch HBM on that side).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa

from formats import sqlsource
from formats.intervals import UnionAccumulator
from formats.lod import LodBuilder
from formats.nullable import add_known
from formats.reader import ProfileError
from formats.schema import ENGINE_NAMES, SCHEMA
from formats.summary_scan import (
    _DYNAMIC,
    _TOTAL,
    ACTIVATE_OPCODES,
    ENGINE_STEMS,
    HARDWARE_DYNAMIC,
    OTHER_ENGINE,
    ROWS_PER_SLICE,
    SETUP_OPCODES,
    SOFTWARE_DYNAMIC,
    STATIC,
    Hardware,
    ProgramFacts,
    _Computation,
    _DmaUsage,
    _usage_period,
)
from formats.throttling import throttle_summary

if TYPE_CHECKING:
    from formats.figures import TrainingStepFigures
    from formats.reader import Profile

__all__ = ["ENGINE_STEMS", "SETUP_OPCODES", "SUMMARY_COLUMNS", "Derived", "Hardware", "ProgramFacts",
           "compute", "opcode_summary", "stored_summary", "summary_row"]

SUMMARY_COLUMNS: tuple[str, ...] = tuple(SCHEMA.tables["Summary"].names)


@dataclass
class Derived:
    """The summary tables of one profile (each ready for ``ProfileWriter.write``)."""

    summary: dict[str, Any]
    opcode_summary: pa.Table
    active_time: pa.Table
    dma_usage: pa.Table
    notes: list[str] = field(default_factory=list)
    lod: pa.Table | None = None  # InstructionLod, when asked for
    throttle_summary: pa.Table | None = None  # ThrottleSummary (formats.throttling), with the tables

    def tables(self) -> Iterator[tuple[str, pa.Table]]:
        yield "Summary", pa.Table.from_pylist([self.summary])
        throttled = self.throttle_summary if self.throttle_summary is not None else _empty("ThrottleSummary")
        for name, table in (("OpcodeSummary", self.opcode_summary), ("ActiveTime", self.active_time),
                            ("DmaUsage", self.dma_usage), ("ThrottleSummary", throttled)):
            if table.num_rows:
                yield name, table


# -- small helpers ---------------------------------------------------------------------------------


def _ratio(num: float | None, den: float | None, cap: float | None = None) -> float | None:
    if num is None or den is None or den <= 0 or (isinstance(num, float) and math.isnan(num)):
        return None
    value = float(num) / float(den)
    return min(value, cap) if cap is not None else value


def _seconds(ns: float | None) -> float | None:
    return None if ns is None else float(ns) * 1e-9


def _sum(values: Sequence[Any]) -> int | None:
    """Sum ignoring nulls; None when every value is null (the column was never filled)."""
    present = [v for v in values if v is not None]
    return int(sum(present)) if present else None


def compute(profile: Profile, facts: ProgramFacts | None = None, *,
            con: duckdb.DuckDBPyConnection | None = None, rows_per_slice: int = ROWS_PER_SLICE,
            extra_rows: int = 0, tables: bool = True,
            active_time_sink: Callable[[pa.Table], None] | None = None, lod: bool = False,
            prefetch: bool = True) -> Derived:
    """Summary, OpcodeSummary, ActiveTime and DmaUsage of ``profile`` from its event tables.

    ``tables=False`` computes the Summary row and OpcodeSummary only (no ActiveTime segments, no
    DmaUsage samples): what ``summary_row`` needs. ``active_time_sink`` receives the ActiveTime rows
    slice by slice instead (``Derived.active_time`` is then empty): a capture's close writes them as
    they come, so memory stays bounded on a 100M-instruction profile. ``extra_rows``: rows the caller
    will add besides these tables (for ``total_row_count``). ``lod`` also builds ``InstructionLod``
    from the same slices (``Derived.lod``). ``prefetch=False`` holds one slice at a time instead of
    reading the next while sweeping this one (less memory, a little slower).
    """
    own = con is None
    con = con or sqlsource.connect(memory_limit="1GB")
    try:
        work = _Computation(profile, facts, con, rows_per_slice, extra_rows, prefetch)
        return _assemble(work, tables, active_time_sink, lod)
    except OverflowError as exc:  # sums past int64: times or counts near 2^63 (a corrupt profile)
        raise ProfileError(f"{profile.path}: cannot compute the summary: values in its event tables "
                           f"add up past int64 (times or counts near 2^63 ns; corrupt data?): "
                           f"{exc}") from None
    finally:
        if own:
            con.close()


@dataclass
class _Measured:
    """Everything the scans measured, handed to the per-section formulas."""

    groups: list[dict[str, Any]]
    packets: list[dict[str, Any]]
    transfers: dict[str, Any]
    cc: dict[str, dict[str, Any]]
    acc: dict[str, UnionAccumulator]
    total_ns: float | None
    first_packet: int | None
    last_packet: int | None
    hw: Hardware
    facts: ProgramFacts
    cc_instr_recorded: bool


def _assemble(work: _Computation, want_tables: bool,
              sink: Callable[[pa.Table], None] | None = None, want_lod: bool = False) -> Derived:
    engines, opcodes, pcores, first, last = work.instruction_keys()
    pool = ThreadPoolExecutor(1, thread_name_prefix="summary-sums") if work.prefetch else None
    with pool if pool is not None else contextlib.nullcontext():
        # the big grouped aggregate runs beside the sweep (DuckDB's threads and NumPy's share the
        # cores); a capture's close (prefetch off) runs them one after the other to spare memory
        pending = pool.submit(work.instruction_groups) if pool is not None else None
        packets = work.packet_groups()
        cc = {"cc_op": work.cc_totals(work.cc_ops), "cc_instr": work.cc_totals(work.cc_instr)}
        first_packet = min((p["first"] for p in packets if p["first"] is not None), default=None)
        last_packet = max((p["last"] for p in packets if p["last"] is not None), default=None)
        usage = None
        if want_tables and first_packet is not None and last_packet is not None:
            origin, period = _usage_period(work.profile, work.con, first_packet, last_packet)
            usage = _DmaUsage(origin, last_packet, period)
        streamed = [0]

        def pass_on(keys: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
            table = _active_time_table(keys, start, end)
            if table.num_rows and sink is not None:
                sink(table)
                streamed[0] += table.num_rows

        lod = None
        if want_lod and first is not None and last is not None:
            lod = LodBuilder(first, last, ["?", *opcodes])
        acc = work.sweep(engines, opcodes, pcores,
                         sorted({p["raw_type"] for p in packets if p["raw_type"] is not None}, key=str),
                         usage, want_tables or sink is not None, pass_on if sink is not None else None, lod)
        groups = pending.result() if pending is not None else work.instruction_groups()
    spans = [(g["first"], g["last"]) for g in groups] + [(first_packet, last_packet)] + \
        [(c["first"], c["last"]) for c in cc.values()]
    total_ns, basis = work.total_time_ns(spans)
    m = _Measured(groups, packets, work.transfer_totals(), cc, acc, total_ns, first_packet, last_packet,
                  work.hw, work.facts, work.cc_instr.present)
    row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS)
    for section in (_time_bases, _engines, _flops_and_memory, _dma, _collectives):
        section(m, row)
    profile = work.profile
    _training(profile, row)
    row["event_count"] = profile.num_rows("SemaphoreUpdate")
    row["trace_count"] = profile.num_rows("Instruction") + profile.num_rows("DmaPacket") + row["event_count"]

    opcode_table = _opcode_table(groups, opcodes, acc["opcode"].lengths(), total_ns)
    active_table = _active_time_table(*acc["engine"].segments()) if want_tables and sink is None \
        else _empty("ActiveTime")
    usage_table = usage.table() if usage is not None else _empty("DmaUsage")
    throttle_table = throttle_summary(profile, work.con, total_ns) if want_tables or sink is not None \
        else _empty("ThrottleSummary")
    derived_rows = 1 + opcode_table.num_rows + active_table.num_rows + usage_table.num_rows + streamed[0] \
        + throttle_table.num_rows
    stored = sum(t.num_rows for name, t in profile.tables.items()
                 if name not in ("Summary", "OpcodeSummary", "ActiveTime", "DmaUsage", "ThrottleSummary"))
    row["total_row_count"] = stored + derived_rows + work.extra_rows
    unknown = set(row) - set(SUMMARY_COLUMNS)
    assert not unknown, f"not Summary columns: {sorted(unknown)}"
    return Derived(row, opcode_table, active_table, usage_table, [f"total_time from {basis}"],
                   lod.table() if lod is not None else None, throttle_table)


def _time_bases(m: _Measured, row: dict[str, Any]) -> None:
    """§4.1: total_time (T), total_exec_time (non-setup span), total_active_time (∪ of everything)."""
    T = m.total_ns
    row["total_time"] = _seconds(T)
    if T is not None and m.hw.clock_hz:
        row["neuroncore_cycle_count"] = round(T * 1e-9 * m.hw.clock_hz)
    firsts = [g["exec_first"] for g in m.groups if g["exec_first"] is not None]
    lasts = [g["exec_last"] for g in m.groups if g["exec_last"] is not None]
    if m.first_packet is not None and m.last_packet is not None:
        firsts.append(m.first_packet)
        lasts.append(m.last_packet)
    if firsts and lasts:
        row["total_exec_time"] = _seconds(max(lasts) - min(firsts))
    active = m.acc["total"].lengths().get(_TOTAL, 0)
    row["total_active_time"] = _seconds(active)
    row["total_active_time_percent"] = _ratio(active, T)


def _engines(m: _Measured, row: dict[str, Any]) -> None:
    """§4.3: per engine Σ instruction time, ∪ active time, counts; MATMUL and ACTIVATE totals."""
    lengths: dict[int, int] = {}
    for key, length in m.acc["engine"].lengths().items():  # key = engine code + 8 x pcore
        lengths[key % 8] = lengths.get(key % 8, 0) + length
    for code, name in enumerate(ENGINE_NAMES):
        stem = ENGINE_STEMS[name]
        mine = [g for g in m.groups if g["engine"] == name]
        row[f"{stem}_engine_instruction_count"] = sum(g["n"] for g in mine)
        row[f"{stem}_engine_instruction_time"] = _seconds(sum(int(g["instruction_ns"] or 0) for g in mine))
        row[f"{stem}_engine_active_time"] = _seconds(lengths.get(code, 0))
        row[f"{stem}_engine_active_time_percent"] = _ratio(lengths.get(code, 0), m.total_ns)
    row["matmul_instruction_count"] = sum(g["n"] for g in m.groups
                                          if g["engine"] == "Tensor" and g["opcode"] == "MATMUL")
    activate = [g for g in m.groups if g["opcode"] in ACTIVATE_OPCODES]
    row["activate_instruction_count"] = sum(g["n"] for g in activate)
    row["activate_instruction_time"] = _seconds(sum(int(g["instruction_ns"] or 0) for g in activate))


def _flops_and_memory(m: _Measured, row: dict[str, Any]) -> None:
    """§4.2 and §4.5: FLOP totals, HBM/SBUF/PSUM/spill bytes, queue bytes, sizes, MFU/HFU/MBU."""
    groups, hw, facts, T = m.groups, m.hw, m.facts, m.total_ns
    hardware = _sum([g["pe_flops"] for g in groups])
    transpose = _sum([g["transpose_flops"] for g in groups])
    row["hardware_flops"] = hardware
    row["transpose_flops"] = transpose if transpose is not None else (0 if hardware is not None else None)
    row["adjusted_hardware_flops"] = _sum([g["adj_pe_flops"] for g in groups])
    row["adjusted_transpose_flops"] = _sum([g["adj_transpose_flops"] for g in groups])
    row["model_flops"] = _sum([g["model_flops"] for g in groups])
    inst_flops = None if hardware is None else hardware - (transpose or 0)

    def instr_sum(column: str) -> int | None:
        return _sum([g[column] for g in groups])

    dma_read, dma_write = _sum([p["hbm_read"] for p in m.packets]), _sum([p["hbm_write"] for p in m.packets])
    if dma_read is not None or dma_write is not None:
        row["hbm_read_bytes"], row["hbm_write_bytes"] = dma_read or 0, dma_write or 0
        packet_bytes = sum(int(p["nbytes"] or 0) for p in m.packets)
        # a packet's other side is on-chip: bytes read from HBM were written to SBUF, and vice versa
        row["sbuf_write_bytes"] = add_known(instr_sum("sbuf_write_bytes"), packet_bytes - (dma_write or 0))
        row["sbuf_read_bytes"] = add_known(instr_sum("sbuf_read_bytes"), packet_bytes - (dma_read or 0))
    else:
        for column in ("hbm_read_bytes", "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes"):
            row[column] = instr_sum(column)
    for column in ("psum_read_bytes", "psum_write_bytes", "spill_save_bytes", "spill_reload_bytes",
                   "psum_read_sbuf_write_bytes"):
        row[column] = instr_sum(column)
    if any(g["psum_sbuf_known"] for g in groups):
        row["psum_read_sbuf_write_count"] = sum(g["psum_sbuf_n"] for g in groups)
    if m.packets or m.transfers["count"]:
        row["input_queue_bytes"] = m.transfers["input"]
        row["output_queue_bytes"] = m.transfers["output"]
        row["weight_queue_bytes"] = m.transfers["data"]
    else:
        for column in ("input_queue_bytes", "output_queue_bytes", "weight_queue_bytes"):
            row[column] = instr_sum(column)
    row["weight_size_bytes"] = facts.weight_size_bytes
    if facts.weight_size_bytes is not None and facts.input_size_bytes is not None:
        row["inputs_and_weights_size_bytes"] = facts.weight_size_bytes + facts.input_size_bytes
        if facts.output_size_bytes is not None:
            row["inputs_outputs_weights_size_bytes"] = row["inputs_and_weights_size_bytes"] + \
                facts.output_size_bytes
    row["dma_queue_count"] = facts.dma_queue_count

    hbm_total = None
    if row["hbm_read_bytes"] is not None and row["hbm_write_bytes"] is not None:
        hbm_total = row["hbm_read_bytes"] + row["hbm_write_bytes"]
    peak_time = hw.peak_flops_per_s * T * 1e-9 if hw.peak_flops_per_s and T else None
    row["mfu_estimated_percent"] = _ratio(row["model_flops"], peak_time)
    row["mfu_inst_estimated_percent"] = _ratio(inst_flops, peak_time)
    row["hfu_estimated_percent"] = _ratio(hardware, peak_time)
    row["mm_arithmetic_intensity"] = _ratio(inst_flops, hbm_total)
    if hw.peak_flops_per_s and hw.hbm_bytes_per_s:
        ridge = hw.peak_flops_per_s / hw.hbm_bytes_per_s
        row["peak_flops_bandwidth_ratio"] = ridge
        for column, flops in (("mfu_max_achievable_estimated_percent", row["model_flops"]),
                              ("mfu_inst_max_achievable_estimated_percent", inst_flops)):
            row[column] = _ratio(_ratio(flops, hbm_total), ridge, 1.0)
    if hw.hbm_bytes_per_s and T:
        hbm_capacity = T * 1e-9 * hw.hbm_bytes_per_s
        row["mbu_estimated_percent"] = _ratio(hbm_total, hbm_capacity)
        row["mbu_min_read_util_percent"] = _ratio(row["inputs_and_weights_size_bytes"], hbm_capacity)


def _dma(m: _Measured, row: dict[str, Any]) -> None:
    """§4.4: DMA active time (∪ of packets), packet and transfer totals, static/dynamic classes."""
    lengths, T = m.acc["dma"].lengths(), m.total_ns
    all_packets = sum(p["n"] for p in m.packets)
    all_bytes = sum(int(p["nbytes"] or 0) for p in m.packets)
    row["dma_active_time"] = _seconds(lengths.get(_TOTAL, 0))
    row["dma_active_time_percent"] = _ratio(lengths.get(_TOTAL, 0), T)
    if m.hw.clock_hz:
        row["dma_active_cycles"] = round(lengths.get(_TOTAL, 0) * 1e-9 * m.hw.clock_hz)
    row["dma_packet_time"] = _seconds(sum(int(p["packet_ns"] or 0) for p in m.packets))
    row["dma_transfer_time"] = _seconds(m.transfers["time_ns"])
    row["dma_transfer_count"] = m.transfers["count"]
    row["dma_transfer_total_bytes"] = m.transfers["bytes"]
    row["dma_transfer_average_bytes"] = _ratio(m.transfers["bytes"], m.transfers["count"])
    for prefix, klass in (("static", STATIC), ("software_dynamic", SOFTWARE_DYNAMIC),
                          ("hardware_dynamic", HARDWARE_DYNAMIC)):
        mine = [p for p in m.packets if p["dma_class"] == klass]
        count, size = sum(p["n"] for p in mine), sum(int(p["nbytes"] or 0) for p in mine)
        row[f"{prefix}_dma_active_time"] = _seconds(lengths.get(klass + 1, 0))
        row[f"{prefix}_dma_active_time_percent"] = _ratio(lengths.get(klass + 1, 0), T)
        row[f"{prefix}_dma_packet_count"] = count
        row[f"{prefix}_dma_size"] = size
        row[f"{prefix}_dma_packet_percent"] = _ratio(count, all_packets)
        row[f"{prefix}_dma_size_percent"] = _ratio(size, all_bytes)
    dynamic = [p for p in m.packets if p["dma_class"] in (SOFTWARE_DYNAMIC, HARDWARE_DYNAMIC)]
    row["dynamic_dma_packet_percent"] = _ratio(sum(p["n"] for p in dynamic), all_packets)
    row["dynamic_dma_size_percent"] = _ratio(sum(int(p["nbytes"] or 0) for p in dynamic), all_bytes)
    row["dynamic_dma_active_time_percent"] = _ratio(lengths.get(_DYNAMIC, 0), T)


def _collectives(m: _Measured, row: dict[str, Any]) -> None:
    """§4.6: Σ / ∪ / ∪÷T / count over CcOp and over CcInstruction."""
    for prefix, name, time_key in (("cc_op", "cc_op", "cc_op_time"),
                                   ("cc_cores_instruction", "cc_instr", "cc_cores_instruction_time")):
        if name == "cc_instr" and not m.cc_instr_recorded and m.cc["cc_op"]["count"]:
            continue  # collectives ran but CC-core instructions were not recorded: unknown, not 0
        active = m.acc[name].lengths().get(_TOTAL, 0)
        active_key = "cc_op_active_time" if name == "cc_op" else "cc_cores_instruction_active_time"
        row[time_key] = _seconds(m.cc[name]["time_ns"])
        row[active_key] = _seconds(active)
        row[f"{active_key}_percent"] = _ratio(active, m.total_ns)
        row[f"{prefix}_count"] = m.cc[name]["count"]


TRAINING_LEVELS = ("forward", "backward", "gradient_sync", "optimizer")


@dataclass(frozen=True)
class TrainingSummary:
    """A profile's training steps as every view shows them: the figures of their mean step
    (``formats.figures.training_step_figures``), the mean time per level, the layout and the steps."""

    step_ns: float
    figures: TrainingStepFigures
    levels_ns: dict[str, float]  # forward, backward, gradient_sync, optimizer
    layout: str
    seq: int
    steps: tuple[int, ...]

    @property
    def steps_text(self) -> str:
        if len(self.steps) == 1:
            return f"step {self.steps[0]}"
        return f"mean of {len(self.steps)} steps {self.steps[0]}-{self.steps[-1]}"


def training_summary(profile: Profile) -> TrainingSummary | None:
    """The one definition behind the Summary's training columns and summary-text's training block:
    the mean over the profile's TrainingStep rows (None when it recorded no step)."""
    if not profile.has("TrainingStep"):
        return None
    from formats.figures import training_step_figures

    steps = profile.table("TrainingStep").to_pylist()
    if not steps:
        return None
    numbers = ("step_time_ns", "global_batch", "seq", "model_flops", "ranks", "peak_flops_per_rank",
               *(f"{level}_ns" for level in TRAINING_LEVELS))
    mean = {k: sum(float(s.get(k) or 0) for s in steps) / len(steps) for k in numbers}
    fig = training_step_figures(mean["step_time_ns"], round(mean["global_batch"]), round(mean["seq"]),
                                mean["model_flops"], round(mean["ranks"]), mean["peak_flops_per_rank"])
    return TrainingSummary(mean["step_time_ns"], fig, {lv: mean[f"{lv}_ns"] for lv in TRAINING_LEVELS},
                           str(steps[0].get("layout") or ""), round(mean["seq"]),
                           tuple(sorted(int(s["step"]) for s in steps)))


def _training(profile: Profile, row: dict[str, Any]) -> None:
    """Our extension: a training step's figures (``training_summary``, one definition with
    summary-text, the bench and neuron-top) from the profile's TrainingStep rows, their mean step."""
    found = training_summary(profile)
    if found is None:
        return
    fig = found.figures
    row["training_step_time"] = fig.step_s
    row["training_seq_per_s"] = fig.seq_per_s
    row["training_tokens_per_s"] = fig.tokens_per_s
    row["training_mfu_percent"] = fig.mfu


def _opcode_table(groups: list[dict[str, Any]], opcodes: list[str], lengths: Mapping[int, int],
                  total_ns: float | None) -> pa.Table:
    """OpcodeSummary rows, most instruction time first (engine names lowercase, §9.3)."""
    n_ops = len(opcodes) + 1
    merged: dict[tuple[str, str], dict[str, int]] = {}
    for g in groups:
        name = g["engine"] or "unknown"
        entry = merged.setdefault((name, g["opcode"]), {"n": 0, "ns": 0})
        entry["n"] += int(g["n"])
        entry["ns"] += int(g["instruction_ns"] or 0)
    rows: dict[str, list[Any]] = {k: [] for k in SCHEMA.tables["OpcodeSummary"].names}
    for (name, opcode), entry in sorted(merged.items(), key=lambda kv: (-kv[1]["ns"], kv[0])):
        code = ENGINE_NAMES.index(name) if name in ENGINE_NAMES else OTHER_ENGINE
        # the sweep keys an opcode by its 1-based place in ``opcodes``; a null or unlisted one is 0
        position = opcodes.index(opcode) + 1 if opcode in opcodes else 0
        active = lengths.get(code * n_ops + position, 0)
        rows["engine"].append(ENGINE_STEMS.get(name, str(name).lower()))
        rows["opcode"].append(opcode)
        rows["instruction_count"].append(entry["n"])
        rows["instruction_time_ns"].append(entry["ns"])
        rows["active_time_ns"].append(active)
        rows["active_time_percent"].append(_ratio(active, total_ns) or 0.0)
    return pa.table(rows, schema=SCHEMA.arrow_schema("OpcodeSummary"))


def _empty(name: str) -> pa.Table:
    return SCHEMA.arrow_schema(name).empty_table()


def _active_time_table(keys: np.ndarray, s: np.ndarray, e: np.ndarray) -> pa.Table:
    """ActiveTime rows from merged segments (key = engine code + 8 x pcore): each engine's busy
    stretches, lowercase engine names (§2.5), in time slices as the sweep produced them (sort by
    start_ts when order matters)."""
    code = keys % 8
    known = code < len(ENGINE_NAMES)
    if not known.all():
        keys, s, e, code = keys[known], s[known], e[known], code[known]
    stems = pa.array([ENGINE_STEMS[n] for n in ENGINE_NAMES])
    return pa.table({
        "start_ts": pa.array(s), "end_ts": pa.array(e),
        "engine": pa.DictionaryArray.from_arrays(pa.array(code.astype(np.int8)), stems),
        "pcore_idx": pa.array(keys // 8), "duration_ns": pa.array(e - s),
    })


# -- reading back --------------------------------------------------------------------------------


def stored_summary(profile: Profile) -> dict[str, Any] | None:
    """The profile's own Summary row (the first one), or None if it has none."""
    if not profile.num_rows("Summary"):
        return None
    rows = profile.table("Summary").slice(0, 1).to_pylist()
    return rows[0] if rows else None


def summary_row(profile: Profile, *, recompute: bool = False) -> dict[str, Any]:
    """The Summary of ``profile``: the stored row (real-layout profiles and ours carry one), or one
    computed from the event tables when the profile has none or ``recompute`` is set. A recomputed
    row keeps the NEFF-only fields (sizes, queue count) of the stored one."""
    stored = stored_summary(profile)
    if stored is not None and not recompute:
        return stored
    facts = None
    if stored is not None:
        inputs = stored.get("inputs_and_weights_size_bytes")
        weights = stored.get("weight_size_bytes")
        both = stored.get("inputs_outputs_weights_size_bytes")
        facts = ProgramFacts(weights, None if inputs is None or weights is None else inputs - weights,
                             None if both is None or inputs is None else both - inputs,
                             stored.get("dma_queue_count"))
    return compute(profile, facts, tables=False).summary


def opcode_summary(profile: Profile, *, recompute: bool = False) -> pa.Table:
    """``OpcodeSummary`` of ``profile``: stored, or computed when absent (or ``recompute``)."""
    if profile.num_rows("OpcodeSummary") and not recompute:
        return profile.table("OpcodeSummary")
    return compute(profile, tables=False).opcode_summary
