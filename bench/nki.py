"""NKI tutorial kernels on the simulated NeuronCore-v2, timing-only, against AWS's published figures.

    python bench/nki.py [--tutorials DIR] [--quick]

Runs the four stages of the NKI matrix-multiplication tutorial on lhsT [8192, 4096] (that is
[4096, 8192] @ [8192, 8192]) in bf16 on one trn1 NeuronCore and prints, per stage, the simulated
latency, HFU and the error against the tutorial's published latency (51.80 / 42.96 / 22.07 / 6.97 ms);
then the layernorm tutorial's two kernels at its published shape (300 x 1000, fp32: v1 2,311 us, v2
1,969 us) and the fused Mamba tutorial's three kernels at its published shape (batch 1, 256 channels,
sequence 512, state 16, fp32: 172.93 us for the tutorial's fused kernel, compared with each of the three
versions), with the error against each. One JSON line.

Kernel source: the tutorial files themselves (AWS nki-samples, ``matrix_multiplication_nki_kernels.py``,
``layernorm_nki_kernel.py``, ``mamba_nki_kernels.py``) from ``--tutorials DIR`` or
``NEURONSCOPE_NKI_TUTORIALS``, searched recursively, run unchanged; otherwise the project's own
restatements in ``neuroncore/nki/examples`` (same loop nests, tiles and blocking). ``source`` in the
output says which. Timing comes from the cost model alone (no per-kernel factor); the machine load
does not change simulated times, only ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

# ``python bench/nki.py`` puts bench/ first on sys.path, where this very file would answer
# ``import nki`` (the newer tutorials' import): take bench/ off so the NKI shim answers it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from neuroncore.nki import ShapeSpec, run_kernel, shim  # noqa: E402
from neuronscope import settings  # noqa: E402

PUBLISHED_MS = {"tiled": 51.80, "hoisted_loads": 42.96, "blocked_free_dim": 22.07, "fully_optimized": 6.97}
TUTORIAL = {
    "matmul": (
        "matrix_multiplication_nki_kernels.py",
        {
            "tiled": "nki_matmul_tiled_",
            "hoisted_loads": "nki_matmul_hoist_load_",
            "blocked_free_dim": "nki_matmul_block_free_dimension_",
            "fully_optimized": "nki_matmul_fully_optimized_",
        },
    ),
    "layernorm": (
        "layernorm_nki_kernel.py",
        {"v1": "nki_layernorm_kernel_v1", "v2": "nki_layernorm_kernel_v2"},
    ),
    "mamba": ("mamba_nki_kernels.py", {"v1": "mamba_v1", "v2": "mamba_v2", "v3": "mamba_v3"}),
}
OURS = {
    "matmul": (
        "neuroncore.nki.examples.matmul",
        {
            "tiled": "matmul_tiled",
            "hoisted_loads": "matmul_hoisted",
            "blocked_free_dim": "matmul_blocked_free",
            "fully_optimized": "matmul_fully_optimized",
        },
    ),
    "layernorm": ("neuroncore.nki.examples.layernorm", {"v1": "layernorm_v1", "v2": "layernorm_v2"}),
    "mamba": ("neuroncore.nki.examples.mamba", {"v1": "mamba_v1", "v2": "mamba_v2", "v3": "mamba_v3"}),
}


def kernels(family: str, tutorials: Path | None) -> tuple[dict[str, Any], str]:
    """The family's kernels by stage name, and where they came from."""
    shim.install()
    filename, names = TUTORIAL[family]
    if tutorials is not None:
        found = sorted(tutorials.rglob(filename))
        if found:
            namespace = runpy.run_path(str(found[0]), run_name="__nki_tutorial__")
            return {stage: namespace[name] for stage, name in names.items()}, str(found[0])
    import importlib

    module_name, ours = OURS[family]
    module = importlib.import_module(module_name)
    return {stage: getattr(module, name) for stage, name in ours.items()}, "restated"


def timed(kernel: Any, args: list[Any]) -> dict[str, Any]:
    fn = getattr(kernel, "fn", kernel)
    t = time.perf_counter()
    run = run_kernel(fn, args, {}, timing_only=True)
    return {
        "latency_ms": round(run.latency_us / 1000.0, 3),
        "hfu": round(run.hfu, 4),
        "instructions": run.program.n_instructions,
        "dma_transfers": run.program.n_dma_transfers,
        "wall_s": round(time.perf_counter() - t, 1),
    }


LAYERNORM_SHAPE = (300, 1000)  # the tutorial's published run (round2-facts.md)
PUBLISHED_LAYERNORM_MS = {"v1": 2.311, "v2": 1.969}
MAMBA_SHAPE = (1, 256, 512, 16)  # batch, channels, sequence, state
PUBLISHED_MAMBA_MS = 0.17293  # the tutorial's fused kernel; the three versions are each compared with it


def with_error(row: dict[str, Any], published_ms: float) -> dict[str, Any]:
    """``row`` with the published latency and the relative error against it."""
    return {**row, "published_ms": published_ms, "error": round(row["latency_ms"] / published_ms - 1.0, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tutorials",
        type=Path,
        default=None,
        help="folder holding the nki-samples tutorial files (default: NEURONSCOPE_NKI_TUTORIALS)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="matmul at a quarter of the size (no comparison)",
    )
    args = parser.parse_args()
    tutorials = args.tutorials or settings.NKI_TUTORIALS.get()
    start = time.perf_counter()
    out: dict[str, Any] = {"bench": "nki", "core": "NeuronCore-v2 (trn1)"}

    mm, source = kernels("matmul", tutorials)
    K, M, N = (8192, 4096, 8192) if not args.quick else (4096, 2048, 4096)
    rows: dict[str, Any] = {}
    for stage, kernel in mm.items():
        row = timed(kernel, [ShapeSpec((K, M), "bfloat16"), ShapeSpec((K, N), "bfloat16")])
        if not args.quick:
            row["published_ms"] = PUBLISHED_MS[stage]
            row["error"] = round(row["latency_ms"] / PUBLISHED_MS[stage] - 1.0, 3)
        rows[stage] = row
    out["matmul"] = {"shape": f"[{M},{K}]@[{K},{N}] bf16", "source": source, "stages": rows}

    ln, source = kernels("layernorm", tutorials)
    r, c = LAYERNORM_SHAPE
    out["layernorm"] = {
        "shape": f"[{r},{c}] fp32",
        "source": source,
        "kernels": {
            name: with_error(timed(
                k,
                [ShapeSpec((r, c), "float32"), 1e-5, ShapeSpec((c,), "float32"), ShapeSpec((c,), "float32")],
            ), PUBLISHED_LAYERNORM_MS[name])
            for name, k in ln.items()
        },
    }

    mb, source = kernels("mamba", tutorials)
    b, ch, sl, st = MAMBA_SHAPE
    shapes = [(b, ch, sl), (b, ch, sl), (ch, st), (b, st, sl), (b, st, sl)]
    out["mamba"] = {
        "shape": f"batch {b}, channels {ch}, seq {sl}, state {st} fp32",
        "source": source,
        "kernels": {name: with_error(timed(k, [ShapeSpec(s, "float32") for s in shapes]), PUBLISHED_MAMBA_MS)
                    for name, k in mb.items()},
    }
    out["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
