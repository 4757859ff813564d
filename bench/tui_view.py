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

The profile is synthetic, written once through ``formats.writer.ProfileWriter`` (as
``bench/formats.py`` does) with the tables a capture of ours has: Instruction (with layer, HLO op,
stack frames, FLOPs, bytes), HloInstruction (one row per op and execution), FrameworkNode, the
StackFrame tables, and the derived tables written at close (Summary, OpcodeSummary, ActiveTime,
DmaUsage, InstructionLod). 32 layers x (attention, mlp) x 4 ops, repeated over executions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa

LAYERS = 32
BLOCKS = (
    ("self_attn", ("dot.q", "dot.qk", "softmax", "dot.pv")),
    ("mlp", ("dot.gate", "dot.up", "silu", "dot.down")),
)
ENGINES = ["Tensor", "Vector", "Scalar", "GpSimd", "Sync"]
OPCODES = ["MATMUL", "LDWEIGHTS", "TENSOR_TENSOR", "ACTIVATE", "IOTA", "WRITE"]
PER_OP = 400  # instructions of one op in one execution
VERSION = 1  # bump when the synthetic profile changes (the cache is keyed by it)


def _ops() -> list[tuple[str, str, int]]:
    """(layer path, hlo name, op id) of one execution, in execution order."""
    out = []
    for layer in range(LAYERS):
        for block, names in BLOCKS:
            for name in names:
                out.append((f"model/layers.{layer}/{block}", f"{name}.{layer}", len(out) + 1))
    return out


def _hardware() -> dict[str, Any]:
    """The core's NC-v2 constants, as a capture on trn1 writes them."""
    from formats.recorder import metadata_from_spec
    from neuroncore.hardware import NC_V2

    return {**metadata_from_spec(NC_V2), "is_simulation": True, "profile_name": "synthetic 10M"}


def synthetic_profile(path: str, n: int, seed: int = 0) -> None:
    """An ``n``-instruction profile with a full hierarchy, written through ProfileWriter."""
    from formats.derive import write_derived
    from formats.writer import ProfileWriter

    rng = np.random.default_rng(seed)
    ops = _ops()
    executions = max(1, -(-n // (len(ops) * PER_OP)))  # at least n instructions
    layers = sorted({layer for layer, _, _ in ops})
    layer_index = {layer: i for i, layer in enumerate(layers)}
    hlo_names = pa.array([name for _, name, _ in ops])
    layer_names = pa.array(layers)
    stacks = pa.array([f"[1, 2, {3 + i % 8}]" for i in range(len(ops))])
    engine_names, opcode_names = pa.array(ENGINES), pa.array(OPCODES)
    tracks = pa.array(["Tensor", "Vector", "Scalar", "GpSimd", "Sync", "TensorMatrix"])
    hlo_rows: dict[str, list[Any]] = {}
    node_spans: dict[str, list[tuple[int, int]]] = {}
    node_sums: dict[str, np.ndarray] = {}  # per layer: instructions per engine (5), hbm bytes
    t = 0
    next_id = 0
    with ProfileWriter(path, _hardware()) as writer:
        for execution in range(executions):
            columns: dict[str, list[np.ndarray]] = {}
            for op_index, (layer, _name, op_id) in enumerate(ops):
                engine = rng.choice(5, PER_OP, p=[0.4, 0.3, 0.15, 0.05, 0.1]).astype(np.int8)
                duration = rng.integers(40, 400, PER_OP)
                gap = rng.integers(0, 60, PER_OP)
                start = t + np.cumsum(duration // 3 + gap) - duration // 3
                end = start + duration
                # Tensor alternates LDWEIGHTS/MATMUL; the others run one opcode each
                opcode = np.where(
                    (engine == 0) & (np.arange(PER_OP) % 2 == 1),
                    1,
                    np.array([0, 2, 3, 4, 5], np.int8)[engine],
                ).astype(np.int8)
                flops = np.where(opcode == 0, 2 * 128 * 128 * 128, 0).astype(np.int64)
                hbm = np.where(opcode == 1, 32768, 0).astype(np.int64)
                part = {
                    "start": start,
                    "end": end,
                    "dur": duration,
                    "engine": engine,
                    "opcode": opcode,
                    "op": np.full(PER_OP, op_index, np.int16),
                    "flops": flops,
                    "hbm": hbm,
                    "wait": np.where(engine == 0, gap, 0),
                }
                for key, value in part.items():
                    columns.setdefault(key, []).append(value)
                s, e = int(start.min()), int(end.max())
                for key, value in (
                    ("id", next_id),
                    ("raw_bir_id", next_id),
                    ("raw_penguin_id", op_id),
                    ("raw_hlo_id", op_id),
                    ("raw_framework_id", op_id),
                    ("hlo_name", ops[op_index][1]),
                    ("modular_flow_invocation_idx", execution),
                    ("start_ts", s),
                    ("end_ts", e),
                    ("time_intervals", f"[[{s}, {e}]]"),
                    ("element_count_per_interval", [None]),
                    ("transpose_element_count_per_interval", [None]),
                    ("hbm_transfer_size_per_interval", [int(hbm.sum())]),
                    ("hbm_read_bytes", int(hbm.sum())),
                    ("hbm_write_bytes", 0),
                    ("instruction_count", PER_OP),
                    ("active_time_ns", e - s),
                    ("raw_flops", int(flops.sum())),
                ):
                    hlo_rows.setdefault(key, []).append(value)
                path_parts = layer.split("/")
                for depth in range(1, len(path_parts) + 1):
                    node = "/".join(path_parts[:depth])
                    node_spans.setdefault(node, []).append((s, e))
                    sums = node_sums.setdefault(node, np.zeros(7, np.int64))
                    sums[:5] += np.bincount(engine, minlength=5)
                    sums[5] += int(hbm.sum())
                    sums[6] += int(flops.sum())
                next_id += PER_OP
                t = e + 20
            cat = {k: np.concatenate(v) for k, v in columns.items()}
            m = cat["start"].size
            ids = np.arange(next_id - m, next_id, dtype=np.int64)
            op = cat["op"]
            writer.write(
                "Instruction",
                {
                    "start_ts": cat["start"],
                    "end_ts": cat["end"],
                    "duration_ns": cat["dur"],
                    "engine": pa.DictionaryArray.from_arrays(pa.array(cat["engine"]), engine_names),
                    "timeline_track": pa.DictionaryArray.from_arrays(
                        pa.array(np.where(cat["opcode"] == 0, 5, cat["engine"]).astype(np.int8)), tracks
                    ),
                    "opcode": pa.DictionaryArray.from_arrays(pa.array(cat["opcode"]), opcode_names),
                    "operands": pa.DictionaryArray.from_arrays(
                        pa.array(np.zeros(m, np.int8)), pa.array(["S[5] (Tensor)++@complete"])
                    ),
                    "id": ids,
                    "pc": ids % 50_000,
                    "bir_id": pa.DictionaryArray.from_arrays(
                        pa.array((ids % 1024).astype(np.int16)),
                        pa.array([f"sg0000:{i}" for i in range(1024)]),
                    ),
                    "hlo_name": pa.DictionaryArray.from_arrays(pa.array(op), hlo_names),
                    "raw_hlo_id": op.astype(np.int64) + 1,
                    "raw_framework_id": op.astype(np.int64) + 1,
                    "layer": pa.DictionaryArray.from_arrays(
                        pa.array(np.array([layer_index[ops[i][0]] for i in range(len(ops))], np.int16)[op]),
                        layer_names,
                    ),
                    "stack_frame_ids": pa.DictionaryArray.from_arrays(pa.array(op), stacks),
                    "raw_flops": cat["flops"],
                    "adjusted_flops": cat["flops"],
                    "hbm_read_bytes": cat["hbm"],
                    "hbm_write_bytes": np.zeros(m, np.int64),
                    "evt_wait_time_ns": cat["wait"],
                    "pcore_idx": np.zeros(m, np.int64),
                },
            )
        writer.write("HloInstruction", hlo_rows)
        writer.write("FrameworkNode", _framework_rows(node_spans, node_sums, ops))
        _stack_frames(writer)
        writer.update_metadata(first_hw_timestamp=0, last_hw_timestamp=t)
        write_derived(writer)


def _framework_rows(
    spans: dict[str, list[tuple[int, int]]], sums: dict[str, np.ndarray], ops: list[tuple[str, str, int]]
) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {}
    peak = 2 * 128 * 128 * 2.8e9
    for node, node_spans in spans.items():
        parent = node.rpartition("/")[0]
        children = sorted(n for n in spans if n.rpartition("/")[0] == node)
        merged: list[list[int]] = []
        for s, e in sorted(node_spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        busy = sum(e - s for s, e in merged)
        total = sums[node]
        values = {
            "node_name": node,
            "children_names": "[" + ", ".join(children) + "]",
            "parent_name": parent,
            "children_ids": "[" + ", ".join(str(i) for layer, _, i in ops if layer == node) + "]",
            "start_ts": merged[0][0],
            "end_ts": merged[-1][1],
            "time_intervals": json.dumps(merged),
            "hbm_read_bytes": int(total[5]),
            "hbm_write_bytes": 0,
            "tensor_engine_instruction_count": int(total[0]),
            "vector_engine_instruction_count": int(total[1]),
            "scalar_engine_instruction_count": int(total[2]),
            "gpsimd_engine_instruction_count": int(total[3]),
            "sync_engine_instruction_count": int(total[4]),
            "instruction_count": int(total[:5].sum()),
            "active_time_ns": busy,
            "mfu": round(100 * total[6] / (peak * busy * 1e-9), 3) if busy else None,
        }
        for key, value in values.items():
            rows.setdefault(key, []).append(value)
    return rows


def _stack_frames(writer: Any) -> None:
    """Frames: run.py:10 -> model.py:20 -> model.py:30..37 (one line per op kind)."""
    files = {"id": ["1", "2"], "name": ["run.py", "model.py"]}
    functions = {"id": ["1", "2"], "name": ["main", "forward"]}
    lines = [(1, 1, 10), (2, 2, 20)] + [(2, 2, 30 + i) for i in range(8)]
    writer.write("StackFrameFileName", files)
    writer.write("StackFrameFunctionName", functions)
    writer.write(
        "StackFrameFileLocation",
        {
            "id": [str(i + 1) for i in range(len(lines))],
            "file_name_id": pa.array([f for f, _, _ in lines], pa.int32()),
            "function_name_id": pa.array([g for _, g, _ in lines], pa.int32()),
            "line_number": pa.array([n for _, _, n in lines], pa.int32()),
        },
    )
    writer.write(
        "StackFrame",
        {
            "id": [str(i + 1) for i in range(len(lines))],
            "file_location_id": pa.array(list(range(1, len(lines) + 1)), pa.int32()),
            "parent_frame_id": ["0", "1"] + ["2"] * 8,
        },
    )


def cached_profile(n: int) -> Path:
    """The synthetic profile of ``n`` instructions, built on first use into the temp directory."""
    path = Path(tempfile.gettempdir()) / f"neuronscope-bench-view-v{VERSION}-{n}"
    if not (path / "Summary.parquet").exists():
        shutil.rmtree(path, ignore_errors=True)
        synthetic_profile(str(path), n)
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
