"""Profile viewer benchmark (``neuron-profile view``): prints one JSON line.

    python bench/tui_view.py            # 10M-instruction profile (built once, cached in the temp dir)
    python bench/tui_view.py --quick    # 1M instructions (a smoke test)

``measure_view()`` is what ``bench/tui.py`` (the terminal tools' combined benchmark) imports.

Figures, measured in-process with the real app running headless (``App.run_test``, 160x50):

* ``view_open_s``: open-to-interactive on a 10M-instruction profile -- from opening the directory
  (``open_profile``) to the summary and the hierarchy drawn and the tree taking keys. Target <= 3.
* ``view_expand_ms``: expanding an HLO op to its instructions -- the first page of 100 rows queried
  from the 10M-row Instruction table (DuckDB, in a worker) and drawn; median over ops. Target <= 200.
* ``view_expand_layer_ms``: expanding a framework layer (children already in the snapshot; a redraw).
* ``view_analysed_s``: until the full Instruction scan is in (per-engine counts, MFU per op, code
  linking, problems): the UI is interactive long before this.

The profile is synthetic (``formats.synthetic``, ``Shape.HIERARCHY``), written once through
``formats.writer.ProfileWriter`` with the tables a capture of ours has: Instruction (with layer, HLO op,
stack frames, FLOPs, bytes), HloInstruction (one row per op and execution), FrameworkNode, the
StackFrame tables, and the derived tables written at close (Summary, OpcodeSummary, ActiveTime,
DmaUsage, InstructionLod). 32 layers x (attention, mlp) x 4 ops, repeated over executions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from formats.synthetic import Shape, write_synthetic

VERSION = 1  # bump when the synthetic profile changes (the cache is keyed by it)


def cached_profile(n: int) -> Path:
    """The synthetic profile of ``n`` instructions, built on first use into the temp directory."""
    path = Path(tempfile.gettempdir()) / f"neuronscope-bench-view-v{VERSION}-{n}"
    if not (path / "Summary.parquet").exists():
        shutil.rmtree(path, ignore_errors=True)
        write_synthetic(str(path), n, Shape.HIERARCHY)
    return path


async def _measure(path: Path) -> dict[str, Any]:
    from explorer.viewer.data import ProfileData
    from explorer.viewer.treetable import HierarchyTable
    from explorer.viewer.viewer_app import ViewerApp, profile_name
    from formats.dataset import find_profiles
    from formats.reader import open_profile

    async def until(pilot: Any, done: Any, timeout: float = 120.0) -> None:
        deadline = time.perf_counter() + timeout
        while not done():
            if time.perf_counter() > deadline:
                raise TimeoutError("the viewer did not get there in time")
            await pilot.pause(0.002)

    async def idle(pilot: Any) -> None:
        """No worker running (exclusive ones are cancelled, not completed: poll, do not gather)."""
        await until(pilot, lambda: not any(w.is_running for w in app.workers))
        await pilot.pause()

    t0 = time.perf_counter()
    entries, _ = find_profiles(path)
    profile = open_profile(entries[0].path)
    app = ViewerApp(entries, first=ProfileData(profile, profile_name(entries[0], profile.metadata)))
    figures: dict[str, Any] = {"view_rows": profile.num_rows("Instruction")}
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one("#tree", HierarchyTable)
        await until(pilot, lambda: app.overview is not None and table.rows_shown)
        figures["view_open_s"] = round(time.perf_counter() - t0, 3)
        await until(pilot, lambda: app.analysis is not None)
        figures["view_analysed_s"] = round(time.perf_counter() - t0, 3)
        await idle(pilot)

        async def expand(kind: str, limit: int) -> list[float]:
            times = []
            for _ in range(limit):
                rows = table.rows_shown
                index = next((i for i, r in enumerate(rows) if r.node.kind == kind and not r.expanded), None)
                if index is None:
                    break
                key = rows[index].node.key
                table.move_cursor(row=index)
                await idle(pilot)
                start = time.perf_counter()
                table.action_expand()
                if kind == "hlo":
                    await until(
                        pilot,
                        lambda k=key: any(
                            r.node.kind == "instr" and r.node.parent == k for r in table.rows_shown
                        ),
                    )
                else:
                    await until(pilot, lambda k=key: any(r.node.parent == k for r in table.rows_shown))
                times.append((time.perf_counter() - start) * 1e3)
            return times

        layer_times = await expand("layer", 6)
        hlo_times = await expand("hlo", 8)
    figures["view_expand_ms"] = round(statistics.median(hlo_times), 1) if hlo_times else None
    figures["view_expand_ms_max"] = round(max(hlo_times), 1) if hlo_times else None
    figures["view_expand_layer_ms"] = round(statistics.median(layer_times), 1) if layer_times else None
    return figures


def measure_view(rows: int = 10_000_000) -> dict[str, Any]:
    """The viewer's figures on a ``rows``-instruction synthetic profile (built once, then cached)."""
    t = time.perf_counter()
    path = cached_profile(rows)
    built = time.perf_counter() - t
    figures = asyncio.run(_measure(path))
    figures["view_profile_build_s"] = round(built, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M instructions instead of 10M")
    args = parser.parse_args()
    figures: dict[str, Any] = {"bench": "tui_view", "quick": args.quick}
    figures.update(measure_view(1_000_000 if args.quick else 10_000_000))
    figures["targets"] = {"view_open_s": "<= 3", "view_expand_ms": "<= 200"}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
