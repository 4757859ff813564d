"""Analysis benchmark: prints one JSON line.

    python bench/analyze.py            # 1M and 10M instructions
    python bench/analyze.py --quick    # 100k and 1M

For each size, a synthetic profile (``formats.synthetic``, ``Shape.ENGINE_CLOCKS`` with
``flows=True``: a Flow edge into every instruction, consistent with the timing, and one per DMA
transfer) is written once and cached under /tmp; then ``formats.analysis.analyze`` runs on it in
this process: graph load (Instruction, DmaPacket grouped into transfers, Flow), releasing
predecessors, the critical path, idle attribution and their sums. Figures (seconds, median of
``REPEATS`` runs after one warm-up run that also compiles the numba kernels):

* ``analyze_s_<n>``: the whole ``analyze`` call (wall); ``analyze_cpu_s_<n>``: the CPU time this
  process spent in it (all threads; on a shared machine the wall time is mostly waiting for a core);
  ``load_s_<n>`` of which loading the graph (wall);
* ``path_events_<n>``: events on the critical path; ``length_equals_device_time_<n>``: the check.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from formats import depgraph
from formats.analysis import analyze
from formats.reader import open_profile
from formats.synthetic import Shape, write_synthetic

REPEATS = 3  # median of three; one run at 10M and above (it is minutes on a loaded machine)


def profile_of(n: int) -> Path:
    path = Path(f"/tmp/neuronscope-bench-analyze-{n}")
    if not (path / "Metadata.parquet").exists():
        shutil.rmtree(path, ignore_errors=True)
        write_synthetic(str(path), n, Shape.ENGINE_CLOCKS, flows=True)
    return path


def measure(n: int) -> dict[str, object]:
    path = profile_of(n)
    profile = open_profile(path)
    analyze(profile)  # warm-up: numba kernels, page cache
    totals, loads, cpus = [], [], []
    result = None
    for _ in range(REPEATS if n < 10_000_000 else 1):
        t = time.perf_counter()
        depgraph.load_graph(profile)
        loads.append(time.perf_counter() - t)
        t, c = time.perf_counter(), time.process_time()
        result = analyze(profile)
        totals.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    assert result is not None and result.critical_path is not None
    label = f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k"
    return {f"analyze_s_{label}": round(statistics.median(totals), 3),
            f"analyze_cpu_s_{label}": round(statistics.median(cpus), 3),
            f"load_s_{label}": round(statistics.median(loads), 3),
            f"path_events_{label}": result.critical_path.events,
            f"length_equals_device_time_{label}": result.critical_path.length_ns == result.device_time_ns}


def main() -> None:
    sizes = [100_000, 1_000_000] if "--quick" in sys.argv else [1_000_000, 10_000_000]
    out: dict[str, object] = {}
    for n in sizes:
        out.update(measure(n))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
