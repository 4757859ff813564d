"""Fingerprints of compiled programs: one JSON line of digests, to compare two versions of the compiler.

    python bench/compile_fingerprint.py > after.json      # in this tree
    PYTHONPATH=/path/to/other/tree python bench/compile_fingerprint.py > before.json
    diff before.json after.json

Each digest covers every column of the program (engines, costs, dependencies, semaphores, counters),
every operand string, every node record, the buffers, HBM tensors and views, and the stats: two
programs with the same digest are the same program. Used to show that a compile-speed change
leaves programs bit-identical where it means to (docs/execution-core.md "Compile speed").
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json

import numpy as np

from neuroncore import workloads
from neuroncore.compiler import compile as compile_graph

WORKLOADS = {
    "matmul": ("matmul", None, {}),
    "mlp": ("mlp", None, {}),
    "bert-layer": ("bert-layer", None, {}),
    "llama-decode-small": ("llama-decode", None, {}),
    "llama-prefill-small": ("llama-prefill", None, {}),
    "llama-decode-7b-2layers": ("llama-decode", "llama2-7b", {"layers": 2}),
}


def digest(program: object) -> str:
    """SHA-256 over every field of a Program except the graph and the core spec."""
    h = hashlib.sha256()
    for f in dataclasses.fields(program):  # type: ignore[arg-type]
        if f.name in ("graph", "spec"):
            continue
        value = getattr(program, f.name)
        h.update(f.name.encode())
        if isinstance(value, np.ndarray):
            h.update(str(value.dtype).encode())
            h.update(np.ascontiguousarray(value).tobytes())
        elif f.name == "stats":
            h.update(repr(sorted((k, v) for k, v in value.items() if k != "layers_relocated")).encode())
        elif isinstance(value, dict):
            h.update(repr(sorted(value.items(), key=lambda kv: str(kv[0]))).encode())
        elif isinstance(value, (list, tuple)) or hasattr(value, "__getitem__"):
            h.update(repr(list(value)).encode())
        elif isinstance(value, (str, int, float, type(None))):
            h.update(repr(value).encode())
        # anything else is a cache derived from the fields above (Program.derived)
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["trn1", "inf2"])
    args = parser.parse_args()
    out = {}
    for key, (name, preset, overrides) in WORKLOADS.items():
        graph = workloads.get(name).graph(preset, **overrides)
        for target in args.targets:
            out[f"{key}/{target}"] = digest(compile_graph(graph, target))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
