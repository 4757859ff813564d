"""Profile-format benchmark: prints one JSON line of figures (medians of repeated runs).

    python bench/formats.py            # full: 20M-instruction peak-RSS run, 3 timed runs of 4M rows
    python bench/formats.py --quick    # smaller runs (a smoke test)

The rows are the core's own: one execution of a compiled program (Llama-2-7B dims, one decoder
layer: ~16.5k instructions with their per-node operand text) is captured from the event sink once,
then replayed execution after execution with shifted timestamps through ``ProfileRecorder`` ->
``ProfileWriter``, exactly as a long capture would arrive. Only ``instruction`` batches are replayed,
so the figures are for the Instruction table with every column the core fills.

Figures:
* ``write_rows_per_s``: Instruction rows per wall second, batches in -> files closed. Target >= 3,000,000.
  Measured with the recorder's per-op rollups off (``rollups=False``): the Instruction table alone.
  ``write_rows_per_s_with_rollups`` is the default recorder, which also builds HloInstruction per
  execution and FrameworkNode spans.
* ``bytes_per_instruction``: Instruction*.parquet bytes per row on disk (zstd). Target <= 24.
* ``legacy_json_bytes_per_instruction`` / ``legacy_json_size_ratio``: the same rows as the legacy
  JSON export's ``instruction`` array (one object per row, non-null fields) against our bytes.
* ``peak_rss_mb``: peak resident memory of a process writing 20M instructions with the default
  recorder (rollups on). Target <= 500.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from formats.recorder import ProfileRecorder
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
    return loaded, instructions, int(end.meta["device_time_ns"]) + 2_000


class _Batch:
    """An event batch lookalike (kind, columns, meta) for replaying."""

    __slots__ = ("columns", "kind", "meta")

    def __init__(self, kind: str, columns: dict[str, Any], meta: dict[str, Any]) -> None:
        self.kind, self.columns, self.meta = kind, columns, meta


def replay(out_dir: str, loaded: Any, instructions: list[Any], period_ns: int, rows: int,
           rollups: bool = True) -> int:
    """Write ``rows`` Instruction rows (whole executions) through the recorder; returns rows written."""
    writer = ProfileWriter(out_dir, {"is_simulation": True})
    recorder = ProfileRecorder(writer, rollups=rollups)
    recorder(loaded)
    per_execution = sum(len(b.columns["id"]) for b in instructions)
    executions = max(1, round(rows / per_execution))
    meta = {k: loaded.meta[k] for k in ("model_id", "core")}
    for e in range(executions):
        offset = e * period_ns
        run = {**meta, "execution_id": e + 1, "start_ns": offset}
        recorder(_Batch("execution_start", {}, run))
        for batch in instructions:
            columns = dict(batch.columns)
            for name in SHIFTED:
                values = columns[name]
                columns[name] = np.where(values >= 0, values + offset, values) if name.startswith("dma") \
                    else values + offset
            recorder(_Batch("instruction", columns, {**batch.meta, **run}))
        recorder(_Batch("execution_end", {}, {**run, "end_ns": offset + period_ns - 2_000}))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (smoke test)")
    parser.add_argument("--layers", type=int, default=1, help="decoder layers in the replayed program")
    parser.add_argument("--rss-child", type=int, metavar="ROWS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        peak_rss_child(args.rss_child, args.layers)
        return
    figures: dict[str, Any] = {"bench": "formats", "quick": args.quick}
    figures.update(bench_write(500_000 if args.quick else 4_000_000, 2 if args.quick else 3, args.layers))
    figures.update(bench_peak_rss(1_000_000 if args.quick else 20_000_000, args.layers))
    figures["targets"] = {"write_rows_per_s": ">= 3000000", "bytes_per_instruction": "<= 24",
                          "peak_rss_mb": "<= 500"}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
