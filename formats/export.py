"""``neuron-profile view --output-format summary-text | summary-json | json``: the real tool's text formats.

* **summary-json** (profile-schema §6.4): one key per program -> a flat dict of the ``Summary``
  columns plus the legacy extras (``nc_idx``, ``nd_idx``, ``instance_type``, ``compiler_version``,
  ``runtime_version``, ``profiler_version``); ``_percent`` values are fractions, as theirs are, so
  scripts that read it as ``list(d.values())[0]`` work unchanged.
* **summary-text**: a headline first (``formats.headline``: device time, MFU, busiest engine, top
  problems; a dataset: one row per profile and the aggregate), then the full table: the same metrics,
  one block per program, a fixed order grouped by topic. Each line is ``name  value`` (the value
  exactly as in the JSON, so a script can split on whitespace) followed by a readable form in
  parentheses, in the units of every view (``formats.units``: %, µs/ms, KiB/MiB, GFLOP).
* **json** (legacy device-profile JSON, §6.2): ``{"summary": [ {...} ], "instruction": [ {...} ]}``,
  one object per executed instruction in time order with the legacy keys (``timestamp``,
  ``duration``, ``label`` = timeline row, ``opcode``, ``operands``, ``hlo_name``, ...). Times are
  nanoseconds. Streamed: rows are rendered by DuckDB (``to_json``) batch by batch, never held whole.

Profiles that carry a ``Summary`` (ours, the real tool's) are shown as stored; others are summarised
on demand from their event tables (``formats.summary``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

from formats import sqlsource, summary
from formats.jsonsafe import json_value
from formats.reader import Profile
from formats.sqlsource import TableSource, ident
from formats.units import fmt_bytes, fmt_flops, fmt_pct, fmt_seconds

# Legacy extras of summary-json / summary-text (§4.9) and where they come from in Metadata.
LEGACY_EXTRAS = {"nc_idx": "neuroncore_idx", "nd_idx": "neuron_device_idx", "instance_type": "instance_type",
                 "compiler_version": "compiler_version", "runtime_version": "runtime_version",
                 "profiler_version": "explorer_version"}

SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("time", ("total_time", "total_exec_time", "total_active_time", "total_active_time_percent",
              "neuroncore_cycle_count")),
    ("flops and utilisation", (
        "model_flops", "hardware_flops", "transpose_flops", "adjusted_hardware_flops",
        "adjusted_transpose_flops", "mfu_estimated_percent", "mfu_inst_estimated_percent",
        "mfu_hlo_estimated_percent", "hfu_estimated_percent", "mbu_estimated_percent",
        "mbu_min_read_util_percent", "mm_arithmetic_intensity",
        "peak_flops_bandwidth_ratio", "mfu_max_achievable_estimated_percent",
        "mfu_inst_max_achievable_estimated_percent", "mfu_hlo_max_achievable_estimated_percent")),
)
_TOPICS = (("engines", ("_engine_", "matmul_", "activate_")), ("dma", ("dma",)),
           ("memory", ("_bytes", "_size_bytes")), ("collectives", ("cc_",)))


def _topic_order() -> list[tuple[str, list[str]]]:
    """Every Summary column in a fixed, topic-grouped order (the rest under 'counts')."""
    placed = {c for _, cols in SECTIONS for c in cols}
    out = [(name, list(cols)) for name, cols in SECTIONS]
    for topic, needles in _TOPICS:
        cols = [c for c in summary.SUMMARY_COLUMNS if c not in placed and any(n in c for n in needles)]
        placed.update(cols)
        out.append((topic, cols))
    out.append(("counts", [c for c in summary.SUMMARY_COLUMNS if c not in placed]))
    return out


def program_name(profile: Profile) -> str:
    """The key of a profile in summary-json: its program (NEFF) name, else its profile name or folder."""
    info = TableSource(profile, "ExecutionInfo")
    if info.present and info.has("neff_name"):
        con = sqlsource.connect(threads=1)
        try:
            row = con.execute(f"SELECT first(neff_name) FROM {info.relation()} WHERE neff_name IS NOT NULL"
                              ).fetchall()[0]
        finally:
            con.close()
        if row and row[0]:
            return str(row[0])
    return str(profile.metadata.get("profile_name") or profile.path.name)


def metrics(profile: Profile, *, recompute: bool = False) -> dict[str, Any]:
    """Summary columns (stored, or computed) followed by the legacy extras from Metadata."""
    row = dict(summary.summary_row(profile, recompute=recompute))
    for key, column in LEGACY_EXTRAS.items():
        row[key] = profile.metadata.get(column)
    return {k: json_value(v) for k, v in row.items()}


def summary_json(programs: Mapping[str, Mapping[str, Any]]) -> str:
    return json.dumps(programs, indent=2)


def _readable(name: str, value: Any) -> str:
    """The readable form of one Summary value, in the units of every view (``formats.units``)."""
    if value is None or isinstance(value, bool | str):
        return ""
    if name.endswith("_percent"):
        return fmt_pct(float(value))
    if name.endswith("_time") or name in ("total_time",):
        return fmt_seconds(float(value))
    if name.endswith("_bytes") or name.endswith("_size") or name == "dma_transfer_average_bytes":
        return fmt_bytes(float(value), digits=2)
    if name.endswith("_flops"):
        return fmt_flops(float(value))
    return ""


def summary_text(programs: Mapping[str, Mapping[str, Any]]) -> str:
    """One block per program: extras first, then the Summary columns by topic."""
    lines: list[str] = []
    for key, values in programs.items():
        lines.append(f"== {key} ==")
        for extra in LEGACY_EXTRAS:
            if values.get(extra) is not None:
                lines.append(f"{extra:<44}{values[extra]}")
        for topic, columns in _topic_order():
            lines.append(f"-- {topic}")
            for column in columns:
                value = values.get(column)
                text = "null" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
                readable = _readable(column, value)
                lines.append(f"{column:<44}{text}" + (f"  ({readable})" if readable else ""))
        lines.append("")
    return "\n".join(lines)


# -- legacy JSON ---------------------------------------------------------------------------------

# legacy key -> Instruction column (§6.2)
LEGACY_INSTRUCTION_KEYS = {
    "timestamp": "start_ts", "duration": "duration_ns", "evt_wait_time": "evt_wait_time_ns",
    "label": "timeline_track",
    **{k: k for k in ("opcode", "compiler_opcode", "operands", "compiler_operands", "hlo_name",
                      "hbm_read_bytes", "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes",
                      "bir_debug_info_source_location", "nki_source_location", "hlo_attrs", "layer",
                      "stack_frame_ids")},
}


def legacy_rows(profile: Profile, batch_size: int = 65_536) -> Iterator[str]:
    """Instruction rows as legacy JSON objects (text), in time order, rendered by DuckDB. Columns that
    are null in every row are left out of every object (as the legacy export omitted empty fields)."""
    source = TableSource(profile, "Instruction")
    if not source.present:
        return
    con = sqlsource.connect(memory_limit="1GB")
    try:
        present = [k for k, c in LEGACY_INSTRUCTION_KEYS.items() if source.has(c) and k != "label"]
        counted = ", ".join(f"count({ident(LEGACY_INSTRUCTION_KEYS[k])})" for k in present)
        counts = con.execute(f"SELECT {counted} FROM {source.relation()}").fetchall()[0]
        keys = [k for k, n in zip(present, counts) if n]
        keys.insert(min(len(keys), 3), "label")  # the timeline row: track, else engine (always known)
        label = f"coalesce({source.col('timeline_track')}, {source.col('engine')})"
        fields = []
        for key in keys:
            expr = label if key == "label" else source.col(LEGACY_INSTRUCTION_KEYS[key])
            fields.append(f"{ident(key)} := {expr}")
        fields.append(f"subgraph := 'sg' || right(split_part({source.col('bir_id')}, ':', 1), 2)")
        reader = con.sql(f"SELECT to_json(struct_pack({', '.join(fields)}))::VARCHAR AS j "
                         f"FROM {source.relation()} ORDER BY start_ts, id").to_arrow_reader(batch_size)
        for batch in reader:
            yield from batch.column(0).to_pylist()
    finally:
        con.close()


def write_legacy_json(profile: Profile, out: IO[str], *, summary_values: Mapping[str, Any]) -> int:
    """Stream ``{"summary": [...], "instruction": [...]}`` to ``out``; returns the instruction count."""
    out.write('{"summary": [')
    out.write(json.dumps({k: json_value(v) for k, v in summary_values.items() if v is not None}))
    out.write('],\n"instruction": [')
    count = 0
    for text in legacy_rows(profile):
        out.write(("\n" if count == 0 else ",\n") + text)
        count += 1
    out.write("\n]}\n")
    return count


def collect(programs: Iterable[tuple[str, Profile]], *, recompute: bool = False) -> dict[str, dict[str, Any]]:
    """summary-json's object: program key -> metrics (keys made unique if two programs share one)."""
    out: dict[str, dict[str, Any]] = {}
    for key, profile in programs:
        name, n = key, 1
        while name in out:
            n += 1
            name = f"{key} ({n})"
        out[name] = metrics(profile, recompute=recompute)
    return out
