"""neuron-explorer benchmark (offscreen): prints one JSON line of figures.

    python bench/gui.py                 # 10M and 100M instructions (profiles built once, then cached)
    python bench/gui.py --quick         # 1M only (a smoke test)
    python bench/gui.py --sizes 10m     # chosen sizes

Profiles: synthetic, written through ``ProfileWriter`` (``formats.synthetic``, ``Shape.SIDE_BY_SIDE``:
six timeline rows incl. TensorMatrix advancing side by side as in a real trace, HLO ops and layers
contiguous in time, six DMA queues with one packet per 8 instructions, a collective stream, an HBM
counter, and the derived tables a capture writes at close) into ``$NEURONSCOPE_BENCH_CACHE`` (default
``$TMPDIR/neuronscope-bench-gui``), once; later runs reuse them.

Each size is measured in a fresh child process (so its peak RSS is its own), three times; medians:

* ``open_s``: from opening the profile to the first frame with every visible row drawn (the window is
  built, the rows discovered, levels of detail built in the background, the first window fetched and
  painted).
* ``frame_ms_p50`` / ``frame_ms_p95``: UI-thread time of each frame while panning and zooming across
  the whole range at 60 steps per second (1 s for the whole profile down to 1e-5 of it and back, pans
  of a fifth of the view): the range change, the image of whatever window has arrived, and the
  repaint -- what decides whether the interface keeps up. Queries run on the fetch thread meanwhile.
* ``window_ms_p50`` / ``window_ms_p95``: from a view change to its window drawn (the fetch thread's
  DuckDB latency plus the draw); the picture lags by this much, the interface does not.
* ``peak_rss_mb``: the child's peak resident memory (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from formats.synthetic import Shape, write_synthetic
from neuronscope import settings

SIZES = {"1m": 1_000_000, "10m": 10_000_000, "100m": 100_000_000}
STEPS = 240  # 4 s of interaction at 60 steps/s
STEP_S = 1 / 60
REPEATS = 3


def cache_dir() -> Path:
    path = settings.BENCH_CACHE.get() or Path(tempfile.gettempdir(), "neuronscope-bench-gui")
    path.mkdir(parents=True, exist_ok=True)
    return path


def ensure_profile(rows: int) -> tuple[Path, float | None]:
    """The cached synthetic profile of ``rows`` instructions (built now if missing) and the build time."""
    path = cache_dir() / f"synthetic-{rows}"
    done = path / ".complete"
    if done.exists():
        return path, None
    if path.exists():
        import shutil

        shutil.rmtree(path)
    started = time.perf_counter()
    write_synthetic(str(path), rows, Shape.SIDE_BY_SIDE)
    took = time.perf_counter() - started
    done.write_text(f"{rows} instructions, built in {took:.1f} s\n")
    return path, took


def _vm(key: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _steps(span: tuple[int, int], rng: np.random.Generator) -> list[tuple[float, float]]:
    """View ranges: zoom from the whole profile to 1e-5 of it around a random point, panning on the way,
    and back out, twice."""
    lo, hi = span
    width = float(hi - lo)
    views: list[tuple[float, float]] = []
    while len(views) < STEPS:
        center = lo + width * float(rng.uniform(0.05, 0.95))
        current = width
        for i in range(60):
            if i % 6 == 5:  # a pan of a fifth of the view every sixth step
                center += current * 0.2 * (1 if i % 12 == 5 else -1)
            else:
                current *= 0.83 if i < 30 else 1 / 0.83
            current = min(width, max(width * 1e-5, current))
            views.append((center - current / 2, center + current / 2))
    return views[:STEPS]


def child(path: str) -> None:
    """Measure one size in this process and print its figures as JSON."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from explorer.gui.qtapp import application

    app = application()
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.session import open_session

    started = time.perf_counter()
    window = MainWindow(open_session([path]))
    window.resize(1600, 900)
    window.show()
    timeline = window.timeline

    def complete() -> bool:
        frame = timeline.frame
        return (
            frame is not None
            and not frame.pending
            and set(frame.request.rows) == set(timeline.visible_rows())
        )

    while not complete():
        app.processEvents()
        time.sleep(0.002)
        if time.perf_counter() - started > 600:
            raise SystemExit("no complete frame after 600 s")
    app.processEvents()
    timeline.plot.viewport().repaint()
    open_s = time.perf_counter() - started
    while window.fetcher.lods_building() or window.hierarchy is None or window._callbacks:  # all built
        app.processEvents()
        time.sleep(0.01)
    lod_s = time.perf_counter() - started

    frame_ms: list[float] = []
    original = timeline.show_frame

    def timed_show(frame: Any) -> None:
        t = time.perf_counter()
        original(frame)
        timeline.plot.viewport().repaint()
        frame_ms.append((time.perf_counter() - t) * 1e3)

    timeline.fetcher.ready.disconnect(original)
    timeline.fetcher.ready.connect(timed_show)
    timeline.latencies_ms.clear()
    rng = np.random.default_rng(7)
    for view in _steps(timeline.span, rng):
        step_started = time.perf_counter()
        timeline.set_range(*view)
        timeline.plot.viewport().repaint()
        frame_ms.append((time.perf_counter() - step_started) * 1e3)
        while time.perf_counter() - step_started < STEP_S:
            app.processEvents()  # delivers windows that arrived (timed_show) while the step lasts
            time.sleep(0.001)
    settle = time.perf_counter()
    while not window.fetcher.idle and time.perf_counter() - settle < 60:
        app.processEvents()
        time.sleep(0.005)
    app.processEvents()
    latencies = list(timeline.latencies_ms)
    figures = {
        "open_s": round(open_s, 3),
        "lod_s": round(lod_s, 3),
        "frame_ms_p50": round(float(np.percentile(frame_ms, 50)), 2),
        "frame_ms_p95": round(float(np.percentile(frame_ms, 95)), 2),
        "frames": len(frame_ms),
        "window_ms_p50": round(float(np.percentile(latencies, 50)), 1) if latencies else None,
        "window_ms_p95": round(float(np.percentile(latencies, 95)), 1) if latencies else None,
        "windows": len(latencies),
        "rows_drawn": len(timeline.frame.request.rows) if timeline.frame else 0,
        "peak_rss_mb": round(_vm("VmHWM"), 1),
    }
    window.release()
    print(json.dumps(figures))


def measure(path: Path) -> list[dict[str, Any]]:
    runs = []
    for _ in range(REPEATS):
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", str(path)],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )
        if done.returncode != 0:
            raise SystemExit(
                f"bench child failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}"
            )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M instructions only (smoke test)")
    parser.add_argument("--sizes", default=None, help="comma-separated: 1m, 10m, 100m (default 10m,100m)")
    parser.add_argument("--child", metavar="PROFILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    sizes = ["1m"] if args.quick else (args.sizes or "10m,100m").split(",")
    figures: dict[str, Any] = {
        "bench": "gui",
        "quick": args.quick,
        "cache": str(cache_dir()),
        "runs_per_size": REPEATS,
        "steps": STEPS,
    }
    for size in sizes:
        rows = SIZES[size]
        path, built = ensure_profile(rows)
        if built is not None:
            figures[f"synthetic_build_s_{size}"] = round(built, 1)
        runs = measure(path)
        for key in (
            "open_s",
            "frame_ms_p50",
            "frame_ms_p95",
            "window_ms_p50",
            "window_ms_p95",
            "peak_rss_mb",
            "lod_s",
        ):
            values = [r[key] for r in runs if r[key] is not None]
            if values:
                figures[f"{key}_{size}"] = round(statistics.median(values), 3)
        figures[f"frames_{size}"] = runs[0]["frames"]
        figures[f"rows_drawn_{size}"] = runs[0]["rows_drawn"]
        figures[f"open_s_{size}_runs"] = [r["open_s"] for r in runs]
    figures["targets"] = {
        "open_s_10m": "<= 3",
        "frame_ms_p50_10m": "<= 16",
        "frame_ms_p95_10m": "<= 33",
        "frame_ms_p50_100m": "<= 33",
        "frame_ms_p95_100m": "<= 66",
        "peak_rss_mb_100m": "<= 1500",
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
