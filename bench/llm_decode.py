"""Whole-model LLM timing on whole instances, tensor-parallel: prints one JSON line.

    python bench/llm_decode.py            # every configuration of issue 4 (about 5-10 min on 2 cores)
    python bench/llm_decode.py --quick    # Llama-2-7B only

For each model / instance / tp_degree / batch it builds the full-size Llama-2 graph (random weights,
timing only: no weight is ever allocated), lays the heads out for the ranks (padded query heads,
replicated KV heads, padded MLP and vocabulary, as transformers-neuronx does), shards it Megatron-
style, compiles the rank program once, loads it on every rank and runs:

* ``tpot_ms``: one decode step (one new token per sequence, 128 tokens of context in the KV cache):
  the simulated device time per output token;
* ``ttft_ms``: context encoding of a 128-token prompt (causal attention, all layers, last-token
  logits): the simulated time to the first token;
* ``sim_wall_s``: wall seconds to simulate the decode step plus the prefill (execution only; the
  one-off shard + compile + load is ``compile_wall_s``); ``decode_wall_s``: the decode step alone.

Per key it also reports the collective time inside a decode step and the number of collectives.
The numbers come from the execution core's cost model (neuroncore.md: engine rates, HBM and DMA
costs) and the collective model (NeuronLink topology, ring/mesh, hop latency), not from hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from neuronscope import settings

# the core's own speed: no live-state publisher attached (it would make the core build records)
os.environ.setdefault(settings.LIVE.name, "0")

from neuroncore.parallel import TensorParallelModel
from neuroncore.runtime import Instance
from neuroncore.workloads import get

CONTEXT = 128
CONFIGS = [  # (model preset, instance, tp_degree)
    ("llama2-7b", "inf2.48xlarge", 24),
    ("llama2-7b", "trn1.32xlarge", 32),
    ("llama2-13b", "inf2.48xlarge", 24),
    ("llama2-70b", "inf2.48xlarge", 24),
    ("llama2-70b", "trn1.32xlarge", 32),
    ("llama2-7b", "inf2.xlarge", 2),
]
BATCHES = (1, 8)


def run_phase(workload: str, model: str, instance: str, tp: int, batch: int) -> dict:
    graph = get(workload).graph(model, batch=batch, context=CONTEXT, tp_degree=tp)
    t0 = time.perf_counter()
    group = TensorParallelModel.load(graph, Instance(instance), tp_degree=tp)
    t1 = time.perf_counter()
    result = group.execute(timing_only=True)
    t2 = time.perf_counter()
    return {"device_ms": result.device_time_ns / 1e6, "compile_s": t1 - t0, "wall_s": t2 - t1,
            "cc_ms": result.collective_ns / 1e6, "collectives": len(result.collectives),
            "rank_nodes": group.program.n_nodes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Llama-2-7B configurations only")
    args = parser.parse_args()
    configs = [c for c in CONFIGS if not args.quick or c[0] == "llama2-7b"]
    out: dict = {"context_tokens": CONTEXT, "prompt_tokens": CONTEXT, "dtype": "bf16"}
    started = time.perf_counter()
    for model, instance, tp in configs:
        for batch in BATCHES:
            decode = run_phase("llama-decode", model, instance, tp, batch)
            prefill = run_phase("llama-prefill", model, instance, tp, batch)
            out[f"{model}/{instance}/tp{tp}/b{batch}"] = {
                "tpot_ms": round(decode["device_ms"], 3),
                "ttft_ms": round(prefill["device_ms"], 3),
                "sim_wall_s": round(decode["wall_s"] + prefill["wall_s"], 3),
                "decode_wall_s": round(decode["wall_s"], 3),
                "compile_wall_s": round(decode["compile_s"] + prefill["compile_s"], 2),
                "decode_cc_ms": round(decode["cc_ms"], 3),
                "decode_collectives": decode["collectives"],
                "tokens_per_s": round(batch * 1e3 / decode["device_ms"], 1),
            }
    out["max_decode_wall_s"] = max(v["decode_wall_s"] for v in out.values() if isinstance(v, dict))
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
