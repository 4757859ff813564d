"""Profile-format benchmark: prints one JSON line of figures (medians of repeated runs).

    python bench/profile_format.py            # full: 20M-instruction peak-RSS run, 3 timed runs of 4M rows
    python bench/profile_format.py --quick    # smaller runs (a smoke test)

The rows are the core's own: one execution of a compiled program (Llama-2-7B dims, one decoder
layer: ~16.5k instructions with their per-node operand text) is captured from the event sink once,
then replayed execution after execution with shifted timestamps through ``ProfileRecorder`` ->
``ProfileWriter``, exactly as a long capture would arrive. Only ``instruction`` batches are replayed,
so the figures are for the Instruction table with every column the core fills.

Figures:
* ``write_rows_per_s``: Instruction rows per wall second, batches in -> files closed. Target >= 3,000,000.
  Measured with the recorder's per-op rollups off (``rollups=False``): the Instruction table alone.
  ``write_rows_per_s_with_rollups`` is the default recorder, which also builds HloInstruction per
  execution and FrameworkNode spans and, at close, the summary tables and the timeline LOD.
* ``bytes_per_instruction``: Instruction*.parquet bytes per row on disk (zstd). Target <= 24.
* ``legacy_json_bytes_per_instruction`` / ``legacy_json_size_ratio``: the same rows as the legacy
  JSON export's ``instruction`` array (one object per row, non-null fields) against our bytes.
* ``peak_rss_mb``: peak resident memory of a process writing 20M instructions with the default
  recorder (rollups on, summary tables and the timeline LOD computed at close). Target <= 500.
* ``summary_s_10m``: the full Summary row (all 101 columns, with OpcodeSummary) computed from the event
  tables of a 10M-instruction profile (``formats.summary.compute(tables=False)``: DuckDB aggregates and
  the sliced interval sweeps). Target <= 2. ``derived_tables_s_10m`` adds ActiveTime and DmaUsage
  (what a capture writes at close).
* ``viewport_ms_20m``: median time of ``formats.tracks.TrackViewport.engine_window`` -- one engine's
  instructions overlapping [t0, t1] reduced to 2000 pixel buckets, longest event per bucket -- on a
  20M-instruction profile, over windows from the whole profile down to 0.01% of it
  (``viewport_ms_20m_by_zoom``: median per zoom). Target <= 50. ``viewport_first_ms`` is the first
  call (connection, LOD load).

The 10M/20M profiles are synthetic, written once through ``ProfileWriter`` into a temporary directory
(Instruction rows in time order over five engines and six timeline rows with gaps, one DMA packet per
eight instructions), with the derived tables a capture writes at close (``formats.derive``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from formats.recorder import ProfileRecorder
from formats.synthetic import ENGINES, Shape, write_synthetic
from formats.writer import ProfileWriter

SHIFTED = ("start_ts", "end_ts", "dma_trigger_start_ts", "dma_trigger_end_ts")


def capture(layers: int = 1) -> tuple[Any, list[Any], int]:
    """(program_loaded batch, one execution's instruction batches, execution length in ns)."""
    import neuroncore as nc
    from neuroncore import workloads

    program = nc.compile(workloads.get("llama-decode").graph("llama2-7b", layers=layers), "trn1")
    sink = nc.EventSink()
    batches: list[Any] = []
    sink.subscribe(batches.append)
    model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
    model.execute(timing_only=True)
    loaded = next(b for b in batches if b.kind == "program_loaded")
    instructions = [b for b in batches if b.kind == "instruction"]
    end = next(b for b in batches if b.kind == "execution_end")
    return loaded, instructions, int(end.meta.device_time_ns) + 2_000


def replay(out_dir: str, loaded: Any, instructions: list[Any], period_ns: int, rows: int,
           rollups: bool = True) -> int:
    """Write ``rows`` Instruction rows (whole executions) through the recorder; returns rows written.
    ``rollups=False`` is the Instruction table alone (no rollups, no summary tables at close)."""
    writer = ProfileWriter(out_dir, {"is_simulation": True})
    recorder = ProfileRecorder(writer, rollups=rollups, summaries=rollups)
    recorder(loaded)
    per_execution = sum(len(b.columns["id"]) for b in instructions)
    executions = max(1, round(rows / per_execution))
    from dataclasses import replace

    from neuroncore.events import EventBatch
    from neuroncore.record_kinds import ExecutionEndMeta, ExecutionStartMeta, RecordKind

    ids = {"model_id": loaded.meta.model_id, "core": loaded.meta.core}
    host = {"host_start_ns": 0, "pid": os.getpid(), "thread_id": 0}
    for e in range(executions):
        offset = e * period_ns
        recorder(EventBatch(RecordKind.EXECUTION_START, {}, ExecutionStartMeta(
            execution_id=e + 1, start_ns=offset, model_name=loaded.meta.model_name, rank=0, **ids, **host)))
        for batch in instructions:
            columns = dict(batch.columns)
            for name in SHIFTED:
                values = columns[name]
                columns[name] = np.where(values >= 0, values + offset, values) if name.startswith("dma") \
                    else values + offset
            recorder(EventBatch(RecordKind.INSTRUCTION, columns, replace(batch.meta, execution_id=e + 1)))
        end = offset + period_ns - 2_000
        recorder(EventBatch(RecordKind.EXECUTION_END, {}, ExecutionEndMeta(
            execution_id=e + 1, start_ns=offset, end_ns=end, device_time_ns=end - offset, timing_only=True,
            host_end_ns=0, **ids, **host)))
    recorder.close()
    return executions * per_execution


def instruction_bytes(out_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir)
               if f == "Instruction.parquet" or (f.startswith("Instruction_") and f.endswith(".parquet")))


def legacy_json_bytes_per_row(out_dir: str, sample: int = 50_000) -> float:
    """Bytes per row of the legacy JSON ``instruction`` array (objects of the non-null fields)."""
    from formats.reader import open_profile

    profile = open_profile(out_dir)
    batch = next(profile.iter_batches("Instruction", batch_size=sample))
    rows = [{k: v for k, v in row.items() if v is not None} for row in batch.to_pylist()]
    return len(json.dumps({"instruction": rows}, separators=(", ", ": "))) / len(rows)


def bench_write(rows: int, repeats: int, layers: int) -> dict[str, Any]:
    loaded, instructions, period = capture(layers)
    rates: dict[bool, list[float]] = {False: [], True: []}
    per_row = 0.0
    work = tempfile.mkdtemp(prefix="bench-formats-")
    try:
        for i in range(repeats):
            for rollups in (False, True):
                out = os.path.join(work, f"run{i}-{int(rollups)}")
                t = time.perf_counter()
                written = replay(out, loaded, instructions, period, rows, rollups)
                rates[rollups].append(written / (time.perf_counter() - t))
                per_row = instruction_bytes(out) / written
        json_per_row = legacy_json_bytes_per_row(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "write_rows_per_s": round(statistics.median(rates[False])),
        "write_rows_per_s_runs": [round(r) for r in rates[False]],
        "write_rows_per_s_with_rollups": round(statistics.median(rates[True])),
        "write_rows": written,
        "program_instructions": sum(len(b.columns["id"]) for b in instructions),
        "bytes_per_instruction": round(per_row, 2),
        "legacy_json_bytes_per_instruction": round(json_per_row, 1),
        "legacy_json_size_ratio": round(json_per_row / per_row, 1),
    }


def _status_mb(key: str) -> float:
    """VmRSS / VmHWM of this process from /proc (ru_maxrss would include the forking parent's peak)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_child(rows: int, layers: int) -> None:
    """Run in a child process: capture, then write ``rows`` instructions; print the RSS before writing
    and the peak while writing (the high-water mark is reset after the capture where Linux allows)."""
    loaded, instructions, period = capture(layers)
    gc.collect()
    before = _status_mb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")  # reset VmHWM to the current RSS: the peak below is the writing's
    except OSError:
        pass
    work = tempfile.mkdtemp(prefix="bench-formats-rss-")
    try:
        written = replay(os.path.join(work, "p"), loaded, instructions, period, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak = _status_mb("VmHWM")
    print(json.dumps({"rows": written, "rss_before_mb": round(before, 1), "peak_rss_mb": round(peak, 1)}))


def bench_peak_rss(rows: int, layers: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--rss-child", str(rows),
                          "--layers", str(layers)], capture_output=True, text=True, check=True)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    return {"peak_rss_mb": child["peak_rss_mb"], "peak_rss_rows": child["rows"],
            "rss_before_writing_mb": child["rss_before_mb"]}


def bench_summary(work: str, rows: int, repeats: int) -> dict[str, Any]:
    from formats import summary
    from formats.reader import open_profile

    path = os.path.join(work, f"synthetic-{rows}")
    t = time.perf_counter()
    write_synthetic(path, rows, Shape.ENGINE_CLOCKS)
    built = time.perf_counter() - t
    profile = open_profile(path)
    row_times, table_times = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        summary.compute(profile, tables=False)
        row_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        summary.compute(profile, tables=True)
        table_times.append(time.perf_counter() - t)
    return {"summary_s_10m": round(statistics.median(row_times), 3),
            "summary_s_10m_runs": [round(x, 3) for x in row_times],
            "derived_tables_s_10m": round(statistics.median(table_times), 3),
            "summary_rows": rows, "synthetic_write_s_10m": round(built, 1)}


def bench_viewport(work: str, rows: int, queries_per_zoom: int) -> dict[str, Any]:
    from formats.reader import open_profile
    from formats.tracks import TrackViewport

    path = os.path.join(work, f"synthetic-{rows}")
    write_synthetic(path, rows, Shape.ENGINE_CLOCKS, seed=1)
    profile = open_profile(path)
    first, last = int(profile.metadata["first_hw_timestamp"]), int(profile.metadata["last_hw_timestamp"])
    span = last - first
    view = TrackViewport(profile)
    rng = np.random.default_rng(3)
    t = time.perf_counter()
    view.engine_window("Tensor", first, last, 2000)
    first_ms = (time.perf_counter() - t) * 1e3
    by_zoom: dict[str, float] = {}
    every: list[float] = []
    for fraction in (1.0, 0.1, 0.01, 0.001, 0.0001):
        times = []
        for i in range(queries_per_zoom):
            width = max(1, int(span * fraction))
            t0 = first + int(rng.integers(0, max(1, span - width)))
            engine = ENGINES[i % len(ENGINES)]
            t = time.perf_counter()
            window = view.engine_window(engine, t0, t0 + width, 2000)
            times.append((time.perf_counter() - t) * 1e3)
            assert len(window) <= 2000
        by_zoom[f"{fraction:g}"] = round(statistics.median(times), 2)
        every += times
    view.close()
    return {"viewport_ms_20m": round(statistics.median(every), 2), "viewport_ms_20m_by_zoom": by_zoom,
            "viewport_ms_20m_p95": round(float(np.percentile(every, 95)), 2),
            "viewport_first_ms": round(first_ms, 1), "viewport_rows": rows}


def cached_synthetic(rows: int, seed: int, flows: bool) -> str:
    """A synthetic profile kept under /tmp between runs (building 20M rows takes minutes): rebuilt when
    missing or incomplete (the ``.done`` marker is written last)."""
    name = f"neuronscope-bench-synthetic-{rows}-s{seed}{'-flows' * flows}"
    path = os.path.join(tempfile.gettempdir(), name)
    if not os.path.exists(path + ".done"):
        shutil.rmtree(path, ignore_errors=True)
        write_synthetic(path, rows, Shape.ENGINE_CLOCKS, seed=seed, flows=flows)
        with open(path + ".done", "w", encoding="ascii") as done:
            done.write("ok\n")
    return path


def perfetto_child(path: str) -> None:
    """Run in a child process: export ``path`` to a Perfetto trace; print seconds and peak RSS."""
    from formats import trace_export
    from formats.reader import open_profile

    profile = open_profile(path)
    gc.collect()
    before = _status_mb("VmRSS")
    with tempfile.TemporaryDirectory(prefix="bench-perfetto-") as work:
        t = time.perf_counter()
        with open(os.path.join(work, "trace.pftrace"), "wb") as out:
            stats = trace_export.write_trace([("synthetic", profile)], out)
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": round(seconds, 1), "peak_rss_mb": round(_status_mb("VmHWM"), 1),
                      "rss_before_mb": round(before, 1), "slices": stats.slices, "flows": stats.flows,
                      "bytes": stats.bytes}))


def bench_perfetto(rows: int, label: str) -> dict[str, Any]:
    path = cached_synthetic(rows, seed=2, flows=True)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--perfetto-child", path],
                         capture_output=True, text=True, check=True)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    keys = {"seconds": "perfetto_export_s", "peak_rss_mb": "perfetto_peak_rss_mb",
            "rss_before_mb": "perfetto_rss_before_mb", "slices": "perfetto_slices", "flows": "perfetto_flows",
            "bytes": "perfetto_bytes"}
    return {f"{name}_{label}": child[key] for key, name in keys.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (smoke test)")
    parser.add_argument("--layers", type=int, default=1, help="decoder layers in the replayed program")
    parser.add_argument("--rss-child", type=int, metavar="ROWS", help=argparse.SUPPRESS)
    parser.add_argument("--perfetto-child", metavar="PROFILE", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=("write", "read", "perfetto"),
                        help="only the write, the read or the Perfetto-export figures")
    args = parser.parse_args()
    if args.rss_child:
        peak_rss_child(args.rss_child, args.layers)
        return
    if args.perfetto_child:
        perfetto_child(args.perfetto_child)
        return
    figures: dict[str, Any] = {"bench": "formats", "quick": args.quick}
    if args.only in (None, "write"):
        figures.update(bench_write(500_000 if args.quick else 4_000_000, 2 if args.quick else 3, args.layers))
        figures.update(bench_peak_rss(1_000_000 if args.quick else 20_000_000, args.layers))
    if args.only in (None, "perfetto"):
        figures.update(bench_perfetto(1_000_000 if args.quick else 20_000_000, "1m" if args.quick else "20m"))
    if args.only in (None, "read"):
        work = tempfile.mkdtemp(prefix="bench-formats-read-")
        try:
            figures.update(bench_summary(work, 1_000_000 if args.quick else 10_000_000, 3))
            figures.update(bench_viewport(work, 2_000_000 if args.quick else 20_000_000, 20))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    figures["targets"] = {"write_rows_per_s": ">= 3000000", "bytes_per_instruction": "<= 24",
                          "peak_rss_mb": "<= 500", "summary_s_10m": "<= 2", "viewport_ms_20m": "<= 50",
                          "perfetto_peak_rss_mb_20m": "<= 1000"}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
