"""Cost of recording: prints one JSON line.

    python bench/capture.py

* ``capture_overhead_ratio``: wall time of a simulated workload (bert-layer, BERT-base dims, numerics +
  timing, 6 executions) with the device profile collector attached as ``neuron-profile capture``
  attaches it (only the 2nd execution profiled; Parquet written, summarised and closed) over the
  same without it; median of 3 runs each, interleaved. ``capture_overhead_ratio_every_exec``: every
  execution profiled (6 profiles: the fixed cost of opening, summarising and closing a profile
  counts 6 times). ``..._timing_only``: the same in timing-only mode, where the simulation is
  cheapest and the recorder's share largest.
* ``system_collector_cpu_percent``: CPU used by the system collector (psutil samples of every CPU and
  of memory, written as Parquet) at 10 Hz over 5 s, as % of one core.

Live-state publishing is turned off (``NEURONSCOPE_LIVE=0``) so the baseline has no listener at all.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from neuronscope import settings

os.environ[settings.LIVE.name] = "0"

import neuroncore as nc
from collectors.device_profile import profile
from collectors.system import system_profile
from neuroncore.workloads import get, random_inputs

EXECUTIONS = 6


def run(model, inputs, timing_only: bool, out: Path | None, nth: int | None) -> float:
    start = time.perf_counter()
    if out is None:
        for _ in range(EXECUTIONS):
            model.execute(inputs, timing_only=timing_only)
    else:
        with profile(out, nth_exec=nth):
            for _ in range(EXECUTIONS):
                model.execute(inputs, timing_only=timing_only)
    return time.perf_counter() - start


def overhead(model, inputs, timing_only: bool, nth: int | None, scratch: Path) -> tuple[float, float, float]:
    run(model, inputs, timing_only, None, nth)  # warm up (numba, weights)
    bare, recorded = [], []
    for i in range(3):
        bare.append(run(model, inputs, timing_only, None, nth))
        recorded.append(run(model, inputs, timing_only, scratch / f"{timing_only}-{nth}-{i}", nth))
    b, r = statistics.median(bare), statistics.median(recorded)
    return r / b, b, r


def system_cpu(scratch: Path, seconds: float = 5.0) -> tuple[float, int]:
    me = psutil.Process()
    before = me.cpu_times()
    start = time.perf_counter()
    with system_profile(scratch / "system", interval_s=0.1) as collector:
        time.sleep(seconds)
    wall = time.perf_counter() - start
    after = me.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100 * used / wall, collector.samples


def main() -> None:
    graph = get("bert-layer").graph()
    model = nc.Instance("trn1.2xlarge").core(0).load(nc.compile(graph, "trn1"))
    inputs = random_inputs(graph)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ratio, bare, recorded = overhead(model, inputs, False, 2, scratch)
        every, _, every_s = overhead(model, inputs, False, None, scratch)
        ratio_t, bare_t, recorded_t = overhead(model, inputs, True, 2, scratch)
        every_t, _, _ = overhead(model, inputs, True, None, scratch)
        cpu, samples = system_cpu(scratch)
    print(json.dumps({
        "bench": "capture", "workload": "bert-layer (batch 1, seq 128, hidden 768), trn1 core",
        "executions": EXECUTIONS, "instructions_per_execution": model.program.n_instructions,
        "capture_overhead_ratio": round(ratio, 3), "bare_s": round(bare, 3), "captured_s": round(recorded, 3),
        "capture_overhead_ratio_every_exec": round(every, 3), "captured_every_exec_s": round(every_s, 3),
        "capture_overhead_ratio_timing_only": round(ratio_t, 3), "bare_timing_only_s": round(bare_t, 4),
        "captured_timing_only_s": round(recorded_t, 4),
        "capture_overhead_ratio_every_exec_timing_only": round(every_t, 3),
        "system_collector_cpu_percent": round(cpu, 2), "system_samples": samples,
        "targets": {"capture_overhead_ratio": "<= 1.5"},
    }))


if __name__ == "__main__":
    main()
