"""Does every bench configuration compile? One JSON line; exit 1 if any program cannot be placed.

    python bench/placement_sweep.py                 # training rank programs + prefill at 2 layers
    python bench/placement_sweep.py --layers 1 --only prefill

Compiles, without running them, the rank programs of every configuration ``bench/train.py`` times
(one layer's forward and backward, embedding + head + loss: the programs are one layer whatever the
model's depth, so they are compiled at full size) and the prefill programs of ``bench/llm_decode.py``
(each model, instance and batch at the 128 / 2,048 / 4,096 / 8,192-token prompts its grid uses)
with the model cut to ``--layers`` layers: a layer compiles alike whatever the depth, so an SBUF
placement failure (``cannot place ...``) shows at two layers in a fraction of the time. Programs
with equal inputs are compiled once. Per program: instructions and CPU seconds, or the error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from neuronscope import settings

os.environ.setdefault(settings.LIVE.name, "0")

from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.errors import CompileError
from neuroncore.hardware import INSTANCE_TYPES, CoreSpec
from neuroncore.ir.graph import Graph
from neuroncore.parallel.sharding import shard
from neuroncore.workloads import get
from neuroncore.workloads.train_graphs import RankShapes, head_graph, layer_backward, layer_forward
from neuroncore.workloads.training import get_train

Program = tuple[str, CoreSpec, Callable[[], Graph]]  # (name, core, graph builder)


def training_programs() -> Iterator[Program]:
    from train import CONFIGS

    seen: set[tuple[Any, ...]] = set()
    for workload, preset, options in CONFIGS:
        model, plan = get_train(workload).configure(preset, **options)
        shapes = RankShapes.of(model, plan.micro_batch, plan.seq, plan.tp)
        core = INSTANCE_TYPES[plan.instance].chip.core
        dtype, grad = plan.compute_dtype, plan.master_dtype
        builds: dict[str, Callable[[], Graph]] = {
            "forward": functools.partial(layer_forward, model, shapes, plan.tp, dtype),
            "backward": functools.partial(layer_backward, model, shapes, plan.tp, dtype, grad),
            "head": functools.partial(head_graph, model, shapes, plan.tp, dtype),
        }
        for kind, build in builds.items():
            key = (kind, model, shapes, plan.tp, dtype, grad, core)
            if key not in seen:
                seen.add(key)
                yield f"train/{plan.key(preset)}/{kind}", core, build


def prefill_programs(layers: int) -> Iterator[Program]:
    from llm_decode import BATCHES, INSTANCES, MODELS, grid_keys

    seen: set[tuple[str, str, int, int, int]] = set()
    for key in grid_keys(list(MODELS), list(INSTANCES), list(BATCHES), None):
        shape = (key.model, key.instance, key.tp, key.batch, key.prompt)
        if shape in seen:
            continue
        seen.add(shape)
        core = INSTANCE_TYPES[key.instance].chip.core

        def build(m: str = key.model, b: int = key.batch, c: int = key.prompt, t: int = key.tp) -> Graph:
            graph = get("llama-prefill").graph(m, batch=b, context=c, tp_degree=t, layers=layers)
            return shard(graph, t).local

        yield f"prefill/{key.model}/{key.instance}/tp{key.tp}/b{key.batch}/{key.prompt}", core, build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="layers of each prefill model")
    parser.add_argument("--only", choices=("train", "prefill"), help="one family of programs")
    parser.add_argument("--match", default="", help="only programs whose name contains this")
    args = parser.parse_args()
    programs: list[Program] = []
    if args.only in (None, "train"):
        programs += list(training_programs())
    if args.only in (None, "prefill"):
        programs += list(prefill_programs(args.layers))
    out: dict[str, Any] = {}
    failed = 0
    for name, core, build in programs:
        if args.match not in name:
            continue
        c0 = time.process_time()
        try:
            program = compile_graph(build(), core)
            row: dict[str, Any] = {"instructions": program.n_instructions,
                                   "sbuf_peak": program.stats["sbuf_peak_bytes_per_partition"]}
        except CompileError as exc:
            failed += 1
            row = {"error": " ".join(str(exc).split())[:300]}
        row["cpu_s"] = round(time.process_time() - c0, 2)
        out[name] = row
        print(json.dumps({name: row}), file=sys.stderr, flush=True)
    out["failed"] = failed
    print(json.dumps(out))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
