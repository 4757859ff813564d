"""Whole training steps on trn1 clusters, the configurations AWS publishes: prints one JSON line.

    python bench/train.py              # every configuration (a few minutes on 2 cores)
    python bench/train.py --quick      # the two calibration points only

Keys: ``"<model>/<nodes>x<instance>/tp<T>pp<P>dp<D>/seq<S>/gbs<G>": {"seq_per_s", "step_s", "mfu",
"sim_wall_s"}``, plus ``sim_cpu_s`` (the simulation's CPU time: its wall time on an idle machine),
``sim_compile_s`` and ``sim_schedule_s`` (wall seconds compiling and timing the rank programs),
``programs_reused`` (of the four rank programs, those an earlier key had compiled: a program is
cached by what it is built from, so BERT on 16 nodes reuses the 1-node programs and only re-times
their collectives), per key the step's parts (forward, backward, pipeline bubble and sends, exposed gradient
synchronisation, optimizer) and how much of the gradient collectives overlapped the backward.
The configurations are those of the Neuron training-performance tables for trn1
(about-neuron/benchmarks/trn1/training_data_*.csv): NxD Llama-2/Llama-3.1 (BF16 auto-cast, FP32
optimizer, micro-batch 1, global batch 1,024), BERT-large phase 1 (BF16 + stochastic rounding,
micro-batch 16) on 1 and 16 nodes, ViT-base fine-tuning (micro-batch 64, global batch 2,048), and
GPT-3 6.7B with NeMo-Megatron's layout (TP 8 on 16 nodes, seq 2048, global batch 1,024: our stated
assumption; the tables list GPT-3 23B/46B/175B rows).

Each step is the execution core's simulation of one rank's programs (a layer's forward and
backward, head and loss, AdamW) composed with the collectives timed on the cluster topology
(``neuroncore.parallel.training``). ``calibration`` reports the error on the two public points the
issue allows: BERT-large phase 1 on 1x trn1.32xlarge (3,826.6 seq/s) and Llama-2-7B on 16x
trn1.32xlarge TP 8 DP 64 (95.14 seq/s). Simulations, not measurements; the machine was shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from neuronscope import settings

os.environ.setdefault(settings.LIVE.name, "0")  # the core's own speed: no live publisher

from formats.figures import training_step_figures
from neuroncore.compiler.errors import CompileError
from neuroncore.parallel.training import overlap_fraction, time_training_step
from neuroncore.workloads.training import get_train

# (workload, preset, options) -- the published layouts
CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("llama-train", "llama2-7b", dict(nodes=16, tp=8, pp=1, dp=64, zero1=True, seq=4096, global_batch=1024)),
    ("llama-train", "llama2-13b", dict(nodes=32, tp=8, pp=4, dp=32, zero1=True, seq=4096, global_batch=1024)),
    ("llama-train", "llama2-70b", dict(nodes=32, tp=32, pp=4, dp=8, zero1=True, seq=4096, global_batch=1024)),
    ("llama-train", "llama3.1-8b",
     dict(nodes=32, tp=32, pp=1, dp=32, zero1=True, seq=8192, global_batch=1024)),
    ("llama-train", "llama3.1-70b",
     dict(nodes=32, tp=32, pp=8, dp=4, zero1=True, seq=8192, global_batch=1024)),
    ("gpt-train", "gpt3-6.7b", dict(nodes=16, tp=8, pp=1, dp=64, zero1=True, seq=2048, global_batch=1024)),
    ("bert-pretrain", "bert-large", dict(nodes=1, dp=32, seq=128, micro_batch=16, global_batch=16384)),
    ("bert-pretrain", "bert-large", dict(nodes=16, dp=512, seq=128, micro_batch=16, global_batch=1048576)),
    ("vit-finetune", "vit-base", dict(nodes=1, dp=32, seq=197, micro_batch=64, global_batch=2048)),
]
CALIBRATION = {  # key -> published seq/s (issue 16's two calibration points)
    "bert-large/1xtrn1.32xlarge/tp1pp1dp32/seq128/gbs16384": 3826.6,
    "llama2-7b/16xtrn1.32xlarge/tp8pp1dp64/seq4096/gbs1024": 95.14,
}


def run(workload: str, preset: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    model, plan = get_train(workload).configure(preset, **options)
    t0, c0 = time.perf_counter(), time.process_time()
    step = time_training_step(model, plan)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    fig = training_step_figures(step.step_ns, plan.global_batch, plan.seq, step.model_flops,
                                plan.world, step.peak_flops_per_core)
    return plan.key(model.name), {
        "seq_per_s": round(fig.seq_per_s, 3),
        "step_s": round(fig.step_s, 4),
        "mfu": None if fig.mfu is None else round(fig.mfu, 4),
        "sim_wall_s": round(wall, 2),
        "sim_cpu_s": round(cpu, 2),  # this process's CPU time: wall on a machine shared with others
        # where the wall time went: compiling the rank programs, scheduling them (timing pass with
        # the collectives timed on the topology); programs an earlier key compiled are reused
        "sim_compile_s": round(sum(p.compile_s for p in step.programs), 2),
        "sim_schedule_s": round(sum(p.sim_s for p in step.programs), 2),
        "programs_reused": step.programs_reused,
        "parts_ms": {k: round(v / 1e6, 2) for k, v in step.parts.items()},
        "grad_sync_overlap": round(overlap_fraction(step.sync), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two calibration points only")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for workload, preset, options in CONFIGS:
        key = get_train(workload).configure(preset, **options)[1].key(preset)
        if args.quick and key not in CALIBRATION:
            continue
        try:
            key, row = run(workload, preset, options)
        except CompileError as exc:  # one configuration that cannot compile does not hide the rest
            row = {"error": " ".join(str(exc).split())[:300]}
        out[key] = row
        print(json.dumps({key: row}), file=sys.stderr, flush=True)  # progress; the line is stdout
    out["calibration"] = {key: {"published_seq_per_s": ref,
                                "simulated_seq_per_s": out[key]["seq_per_s"],
                                "error": round(out[key]["seq_per_s"] / ref - 1, 3)}
                          for key, ref in CALIBRATION.items() if "seq_per_s" in out.get(key, {})}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
