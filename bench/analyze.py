"""Analysis benchmark: prints one JSON line.

    python bench/analyze.py            # 1M and 10M instructions
    python bench/analyze.py --quick    # 100k and 1M

For each size, a synthetic profile (``formats.synthetic``, ``Shape.ENGINE_CLOCKS`` with
``flows=True``: a Flow edge into every instruction, consistent with the timing, and one per DMA
transfer) is written once and cached under /tmp; then ``formats.analysis.analyze`` runs on it in
this process: graph load (Instruction, DmaPacket grouped into transfers, Flow), releasing
predecessors, the critical path, idle attribution, the temporal breakdown, DMA queues and the
bottom-up table. Figures (seconds, median of ``REPEATS`` runs after one warm-up run that also loads
the compiled numba kernels and fills the page cache):

* ``analyze_s_<n>``: the whole ``analyze`` call (wall); ``analyze_cpu_s_<n>``: the CPU time this
  process spent in it (all threads: the part readers run on every core); on a shared machine the
  wall time is mostly waiting for a core, so compare CPU times across runs;
* ``load_s_<n>`` / ``load_cpu_s_<n>``: of which loading the graph (a separate load, same profile);
* ``cli_s_<n>``: one ``neuron-profile analyze DIR --output-format json`` in a fresh process (imports,
  compiled kernels from numba's cache, the profile's footers: what a user waits for), wall;
* ``path_events_<n>``: events on the critical path; ``length_equals_device_time_<n>``: the check;
* ``load_avg``: the machine's 1-minute load average at the end (2 cores here: above 2, runs queue).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from formats import depgraph
from formats.analysis import Analysis, analyze
from formats.reader import open_profile
from formats.synthetic import Shape, write_synthetic

REPEATS = 3  # median of three
T = TypeVar("T")


def profile_of(n: int) -> Path:
    path = Path(f"/tmp/neuronscope-bench-analyze-{n}")
    if not (path / "Metadata.parquet").exists():
        shutil.rmtree(path, ignore_errors=True)
        write_synthetic(str(path), n, Shape.ENGINE_CLOCKS, flows=True)
    return path


def _timed(call: Callable[[], T]) -> tuple[float, float, T]:
    """(wall seconds, CPU seconds of the whole process, result) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(n: int) -> dict[str, object]:
    path = profile_of(n)
    profile = open_profile(path)
    analyze(profile)  # warm-up: numba kernels, page cache
    totals, cpus, loads, load_cpus = [], [], [], []
    result: Analysis | None = None
    for _ in range(REPEATS):
        wall, cpu, _graph = _timed(lambda: depgraph.load_graph(profile))
        loads.append(wall)
        load_cpus.append(cpu)
        wall, cpu, result = _timed(lambda: analyze(profile))
        totals.append(wall)
        cpus.append(cpu)
    assert result is not None and result.critical_path is not None
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "explorer.profile_cli", "analyze", str(path), "--output-format",
                    "json"], check=True, stdout=subprocess.DEVNULL)
    cli = time.perf_counter() - started
    label = f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k"
    return {f"analyze_s_{label}": round(statistics.median(totals), 3),
            f"analyze_cpu_s_{label}": round(statistics.median(cpus), 3),
            f"load_s_{label}": round(statistics.median(loads), 3),
            f"load_cpu_s_{label}": round(statistics.median(load_cpus), 3),
            f"cli_s_{label}": round(cli, 3),
            f"path_events_{label}": result.critical_path.events,
            f"length_equals_device_time_{label}": result.critical_path.length_ns == result.device_time_ns}


def main() -> None:
    sizes = [100_000, 1_000_000] if "--quick" in sys.argv else [1_000_000, 10_000_000]
    out: dict[str, object] = {}
    for n in sizes:
        out.update(measure(n))
    out["load_avg"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
