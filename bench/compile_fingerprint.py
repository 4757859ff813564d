"""Fingerprints of compiled programs: one JSON line of digests, to compare two versions of the compiler.

    python bench/compile_fingerprint.py > after.json      # in this tree
    PYTHONPATH=/path/to/other/tree python bench/compile_fingerprint.py > before.json
    diff before.json after.json
    python bench/compile_fingerprint.py --targets trn1 inf2 trn2 --big   # + full-size programs

``--big`` adds the full-size programs whose compile speed is measured (a few minutes): the 32-layer
Llama-2-7B decode (trn1), one Llama-2-70B tp32 rank (decode, context 255), the Llama-2-7B tp24
rank on inf2.48xlarge's core decoding in bucket 256 and prefilling 2048 tokens, and a ViT-base
training layer forward (micro-batch 64: 768 attention heads, large output tensors).

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
from collections.abc import Callable, Mapping

import numpy as np

from neuroncore import workloads
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.counters import COUNTER_NAMES
from neuroncore.compiler.program import CounterColumns
from neuroncore.hardware import CoreSpec
from neuroncore.ir.graph import Graph
from neuroncore.workloads import train_graphs as tg

WORKLOADS = {
    "matmul": ("matmul", None, {}),
    "mlp": ("mlp", None, {}),
    "bert-layer": ("bert-layer", None, {}),
    "llama-decode-small": ("llama-decode", None, {}),
    "llama-prefill-small": ("llama-prefill", None, {}),
    "llama-decode-7b-2layers": ("llama-decode", "llama2-7b", {"layers": 2}),
}

# training rank programs (neuroncore.workloads.train_graphs) at small sizes that still take every
# path the full-size ones do: grouped-query attention folded onto fewer KV heads, causal attention
# in several blocks, sequence parallelism, the vocabulary-parallel head and loss
_GQA = tg.Transformer("tiny-gqa", layers=2, hidden=512, heads=8, kv_heads=2, intermediate=1024, vocab=1000,
                      fused_qkv=True)
_GQA_RANK = tg.RankShapes.of(_GQA, 1, 1024, 4, sequence_parallel=True)
_BERT = tg.Transformer("tiny-bert", layers=2, hidden=256, heads=4, kv_heads=4, intermediate=1024,
                       vocab=1000, norm="layer", mlp="gelu", bias=True, causal=False, rope=False)
_BERT_RANK = tg.RankShapes.of(_BERT, 4, 128, 1)
TRAINING: dict[str, Callable[[], Graph]] = {
    "train-gqa-layer-fwd": lambda: tg.layer_forward(_GQA, _GQA_RANK, 4),
    "train-gqa-layer-bwd": lambda: tg.layer_backward(_GQA, _GQA_RANK, 4),
    "train-gqa-head": lambda: tg.head_graph(_GQA, _GQA_RANK, 4),
    "train-bert-layer-bwd": lambda: tg.layer_backward(_BERT, _BERT_RANK, 1, "bf16", "bf16"),
}


def big_workloads() -> dict[str, Callable[[], tuple[Graph, str | CoreSpec]]]:
    """The full-size programs of ``--big``: graph and target of each."""
    from neuroncore.parallel.sharding import shard
    from neuroncore.runtime import Instance
    from neuroncore.workloads.training import VIT_TRAIN

    def inf2_core() -> CoreSpec:
        return Instance("inf2.48xlarge").spec.chip.core

    def vit() -> Graph:
        model = VIT_TRAIN["vit-base"]
        return tg.layer_forward(model, tg.RankShapes.of(model, 64, 197, 1), 1)

    return {
        "llama2-7b-decode/trn1": lambda: (workloads.get("llama-decode").graph("llama2-7b"), "trn1"),
        "llama2-70b-decode-tp32-rank/trn1": lambda: (shard(workloads.get("llama-decode").graph(
            "llama2-70b", context=255, tp_degree=32), 32).local, "trn1"),
        "llama2-7b-decode-256-tp24-rank/inf2": lambda: (shard(workloads.get("llama-decode").graph(
            "llama2-7b", context=255, tp_degree=24), 24).local, inf2_core()),
        "llama2-7b-prefill-2048-tp24-rank/inf2": lambda: (shard(workloads.get("llama-prefill").graph(
            "llama2-7b", batch=1, context=2048, tp_degree=24), 24).local, inf2_core()),
        "vit-base-train-layer-fwd/trn1": lambda: (vit(), "trn1"),
    }


# columns stored narrower since session 9 (int32 where the values fit), hashed as the int64 they
# were: a digest depends on a program's values, not on how narrow its storage is, and stays
# comparable with an older tree's (the counters likewise: below)
WIDENED = frozenset({"dep_idx"})


def digest(program: object) -> str:
    """SHA-256 over every field of a Program except the graph and the core spec."""
    h = hashlib.sha256()
    for f in dataclasses.fields(program):  # type: ignore[arg-type]
        if f.name in ("graph", "spec"):
            continue
        value = getattr(program, f.name)
        if isinstance(value, CounterColumns):  # stored by record since session 12: hashed as the
            for name in COUNTER_NAMES:  # twelve int64 columns (fields of these names) they were
                h.update(name.encode())
                h.update(b"int64")
                h.update(np.ascontiguousarray(value.column(name).astype(np.int64)).tobytes())
            continue
        h.update(f.name.encode())
        if isinstance(value, np.ndarray) and f.name in WIDENED:
            value = value.astype(np.int64)
        if isinstance(value, np.ndarray):
            h.update(str(value.dtype).encode())
            h.update(np.ascontiguousarray(value).tobytes())
        elif f.name == "stats":
            h.update(repr(sorted((k, v) for k, v in value.items() if k != "layers_relocated")).encode())
        elif isinstance(value, Mapping):  # a dict, or the buffers of relocated layers (by reference)
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
    parser.add_argument("--big", action="store_true", help="add the full-size programs (minutes)")
    args = parser.parse_args()
    out = {}
    for key, (name, preset, overrides) in WORKLOADS.items():
        graph = workloads.get(name).graph(preset, **overrides)
        for target in args.targets:
            out[f"{key}/{target}"] = digest(compile_graph(graph, target))
    for key, build in TRAINING.items():
        out[f"{key}/trn1"] = digest(compile_graph(build(), "trn1"))
    if args.big:
        for key, make in big_workloads().items():
            graph, target = make()
            out[key] = digest(compile_graph(graph, target))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
