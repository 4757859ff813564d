"""LLM generation timing on whole instances, tensor-parallel, against the published tables: one JSON line.

    python bench/llm_decode.py            # the whole grid below (slow: see bench/README.md)
    python bench/llm_decode.py --quick    # the two LLM calibration configurations only
    python bench/llm_decode.py --models llama2-7b --batches 1 --lengths 128-128
    python bench/llm_decode.py --models llama2-7b --batches 1 --lengths 128-128 --quantize int8-weight-only

The grid is the one AWS publishes for transformers-neuronx (Neuron 2.18 decoder tables): Llama-2
7B/13B/70B, Llama-3 8B/70B and Mistral-7B, on inf2.48xlarge (tp 24) and trn1.32xlarge (tp 32),
batch 1/4/8, input/output tokens 128/128, 128/3968 (inf2) or 128/8064 (trn1), 2048/2048, 4096/4096
and 8192/8192, each where input + output fits the model's max positions (``MAX_POSITIONS``).
Every model is the full-size graph (random weights, timing only: no weight is ever allocated), its
heads laid out for the ranks as transformers-neuronx does, sharded Megatron-style and compiled once
per shape.

Per key ``"<model>/<instance>/tp<N>/b<B>/<in>-<out>"``:

Both latencies are what the host sees (``neuroncore.runtime.host_io.request_latency_ns``): the
runtime's per-execution overhead, the inputs copied in (the hidden states transformers-neuronx
embeds on the host, written to every rank: ``host_input_bytes``), the execution, the logits copied
out (the KV cache stays on the device, as transformers-neuronx keeps it).

* ``ttft_ms``: context encoding of the ``in``-token prompt (causal attention, all layers, last-token
  logits). transformers-neuronx compiles prompt buckets of half each token bucket, so every
  published input (128, 2048, 4096, 8192) is a bucket of its own: the prefill runs at exactly ``in``.
* ``tpot_ms``: the mean over the generation's decode steps (every output token after the first,
  which the prefill makes) with the context growing, each step run in its context bucket: the
  smallest of the compiled buckets that holds its context (``neuroncore.generation.select_bucket``).
  The buckets are transformers-neuronx's default for ``n_positions = in + out``: powers of two from
  128, then ``n_positions`` itself (``bucket.token_sizes`` -> ``power_of_two_bucket_sizes(128, n)``),
  e.g. 128/3968 -> 128, 256, ..., 2048, 4096. Each bucket's decode step is simulated once (timing
  only, its KV cache the bucket's length) and weighted by how many steps run in it
  (``steps_per_bucket``). A step's simulated time depends only on its program, i.e. on its bucket
  (the cache the program reads is the bucket's length whatever the live context), so this weighted
  mean equals the mean over all tokens exactly.
* ``tokens_per_s``: generated tokens over the generation's time, ``B * out / (ttft + (out-1)*tpot)``.
* ``heads``: the query and KV heads each program stores for the ranks (transformers-neuronx's
  rule, ``neuroncore.parallel.heads``): the 8 KV heads of Llama-2-70B, Llama-3 and Mistral-7B are
  replicated to one per rank (24 at tp 24, 32 at tp 32; queries padded 32 -> 48 or 64 -> 72 at tp
  24), Llama-2-7B/13B (MHA) are padded to 48 (or 64) heads; ``kv_cache_mib_per_rank`` is the cache
  one rank holds for ``in + out`` positions (bf16).
* ``sim_wall_s``: wall seconds simulating the executions this key uses (its prefill and each
  bucket's decode step; compilation excluded, it is in ``compile_wall_s`` once per program).
* ``key_wall_s``, ``key_cpu_s``, ``programs_new``: what the key cost in this run, i.e. compiling
  and timing the programs no earlier key of the run had made (a program is made once per
  (phase, model, instance, batch, context) and shared by every key that needs it: 128/128 and
  128/3968 share their prefill and their first decode buckets). The run's totals are
  ``bench_wall_s`` and ``bench_cpu_s``; ``--progress`` prints each key's line on stderr as it
  finishes, so a run stopped part way still gives its per-key times.

The numbers come from the execution core's cost model (neuroncore.md: engine rates, HBM and DMA
costs, per-execution overheads) and the collective model (NeuronLink topology, algorithms, hop
latency), not from hardware. ``calibration`` gives the error on each public calibration point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

from neuronscope import settings

# the core's own speed: no live-state publisher attached (it would make the core build records)
os.environ.setdefault(settings.LIVE.name, "0")

from neuroncore.compiler import CompilerOptions, Quantization
from neuroncore.generation import normalize_buckets, steps_per_bucket
from neuroncore.ir.graph import Graph
from neuroncore.parallel import TensorParallelModel
from neuroncore.parallel.heads import head_counts
from neuroncore.runtime import Instance
from neuroncore.runtime.host_io import request_latency_ns
from neuroncore.workloads import LLAMA_PRESETS, MAX_POSITIONS, get

MODELS = ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "mistral-7b")
INSTANCES = {"inf2.48xlarge": 24, "trn1.32xlarge": 32}  # instance -> tp degree of the tables
LONG_OUTPUT = {"inf2.48xlarge": 3968, "trn1.32xlarge": 8064}  # 128 + out = 4096 / 8192
BATCHES = (1, 4, 8)

# public calibration points (ms): key -> {figure: published}
CALIBRATION = {
    "llama2-7b/inf2.48xlarge/tp24/b1/128-3968": {"ttft_ms": 27.6, "tpot_ms": 6.47},
    "llama2-70b/trn1.32xlarge/tp32/b1/128-128": {"ttft_ms": 53.9, "tpot_ms": 25.18},
}


def host_input_bytes(graph: Graph, batch: int, tokens: int, hidden: int, ranks_per_chip: int) -> int:
    """Bytes the host copies to one chip for one execution (``request_latency_ns``'s input copy,
    on the chip's one host-to-device DMA engine; the chips copy in parallel).

    transformers-neuronx (Neuron 2.18) embeds the tokens on the host: with ``on_device_embedding``
    off (the default then; its 2.18 samples set it off explicitly) ``forward`` runs
    ``chkpt_model.model.embed_tokens(input_ids)`` on the CPU and the decoder writes the hidden
    states into an input buffer that ``ParallelTensorManipulator.duplicate`` made on *every* rank,
    so each chip receives ``batch x tokens x hidden`` FP16 values once per rank it holds (a 128-token
    Llama-2-7B prompt: 1 MiB per rank, 2 MiB per inf2 chip). The integer inputs (positions, cache
    ids; our program's token ids stand in for them) are counted as they are. The program still
    gathers its embedding rows on the device: a few microseconds counted twice [assumption: the
    gather is not worth a second program shape]."""
    integers = sum(p.nbytes for p in graph.parameters if not p.dtype.is_float)
    return integers + batch * tokens * hidden * 2 * ranks_per_chip


def lengths_for(instance: str) -> list[tuple[int, int]]:
    return [(128, 128), (128, LONG_OUTPUT[instance]), (2048, 2048), (4096, 4096), (8192, 8192)]


def token_buckets(n_positions: int) -> tuple[int, ...]:
    """transformers-neuronx's default token-generation buckets for ``n_positions`` (bucket.py)."""
    sizes, size = [], 128
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return normalize_buckets([*sizes, n_positions])


@dataclass(frozen=True)
class Key:
    model: str
    instance: str
    tp: int
    batch: int
    prompt: int
    output: int

    def __str__(self) -> str:
        return f"{self.model}/{self.instance}/tp{self.tp}/b{self.batch}/{self.prompt}-{self.output}"


@dataclass
class Timed:
    device_ms: float  # the execution on the device
    request_ms: float  # as the host sees it: + launch overhead, token ids in, logits out
    wall_s: float
    compile_s: float
    cc_ms: float
    collectives: int


class Grid:
    """Simulates each (phase, model, instance, batch, length) program once, whatever keys share it."""

    def __init__(self, options: CompilerOptions | None = None) -> None:
        self.cache: dict[tuple[str, str, str, int, int], Timed] = {}
        self.options = options  # precision of every program (e.g. int8 weight-only)

    def run(self, workload: str, key: Key, context: int) -> Timed:
        cache_key = (workload, key.model, key.instance, key.batch, context)
        if cache_key not in self.cache:
            graph = get(workload).graph(key.model, batch=key.batch, context=context, tp_degree=key.tp)
            t0 = time.perf_counter()
            group = TensorParallelModel.load(graph, Instance(key.instance), tp_degree=key.tp,
                                             options=self.options)
            t1 = time.perf_counter()
            result = group.execute(timing_only=True)
            t2 = time.perf_counter()
            program = group.program
            # the KV cache stays on the device: the hidden states (embedded on the host) and the
            # positions go in, the logits out
            tokens = context if workload == "llama-prefill" else 1
            host_in = host_input_bytes(program.graph, key.batch, tokens, LLAMA_PRESETS[key.model]["hidden"],
                                       group.topology.cores_per_device)
            host_out = program.graph.outputs[0].nbytes
            request = request_latency_ns(program.spec, result.device_time_ns, host_in, host_out)
            self.cache[cache_key] = Timed(result.device_time_ns / 1e6, request / 1e6, t2 - t1, t1 - t0,
                                          result.collective_ns / 1e6, len(result.collectives))
        return self.cache[cache_key]

    def figures(self, key: Key) -> dict[str, float | int | dict[str, int]]:
        prefill = self.run("llama-prefill", key, key.prompt)
        per_bucket = steps_per_bucket(token_buckets(key.prompt + key.output), key.prompt, key.output)
        # a bucket-b step attends over b positions: b - 1 cached plus the new token's
        decode = {b: self.run("llama-decode", key, b - 1) for b in per_bucket}
        steps = sum(per_bucket.values())
        tpot = sum(decode[b].request_ms * n for b, n in per_bucket.items()) / steps
        total_ms = prefill.request_ms + tpot * steps
        return {
            "tpot_ms": round(tpot, 3),
            "ttft_ms": round(prefill.request_ms, 3),
            "tokens_per_s": round(key.batch * key.output / (total_ms / 1e3), 1),
            "sim_wall_s": round(prefill.wall_s + sum(t.wall_s for t in decode.values()), 3),
            "compile_wall_s": round(prefill.compile_s + sum(t.compile_s for t in decode.values()), 2),
            "decode_cc_ms_by_bucket": {str(b): round(t.cc_ms, 3) for b, t in decode.items()},
            "decode_device_ms_by_bucket": {str(b): round(t.device_ms, 3) for b, t in decode.items()},
            "steps_by_bucket": {str(b): n for b, n in per_bucket.items()},
            "heads": head_figures(key),
        }


def head_figures(key: Key) -> dict[str, int | float]:
    """The heads each program stores for ``key.tp`` ranks (transformers-neuronx's rule,
    ``neuroncore.parallel.heads``: KV heads replicated when tp does not divide them, query heads
    padded) and the KV cache one rank holds for the whole generation (bf16, in + out positions):
    the decode graphs' cache inputs have exactly these heads."""
    dims = LLAMA_PRESETS[key.model]
    heads, kv, copies = head_counts(dims["heads"], dims["kv_heads"], key.tp)
    head_dim = dims["hidden"] // dims["heads"]
    cache = 2 * dims["layers"] * key.batch * (kv // key.tp) * (key.prompt + key.output) * head_dim * 2
    return {"q_heads": heads, "kv_heads": kv, "kv_copies": copies,
            "kv_cache_mib_per_rank": round(cache / 2**20, 1)}


def grid_keys(models: list[str], instances: list[str], batches: list[int],
              lengths: list[tuple[int, int]] | None) -> list[Key]:
    keys = []
    for model in models:
        for instance in instances:
            for batch in batches:
                for prompt, output in lengths_for(instance):
                    if lengths is not None and (prompt, output) not in lengths:
                        continue
                    if prompt + output <= MAX_POSITIONS[model]:
                        keys.append(Key(model, instance, INSTANCES[instance], batch, prompt, output))
    return keys


def calibration_errors(out: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Simulated vs published on every calibration point the run covered; error = sim / pub - 1."""
    errors: dict[str, dict[str, dict[str, float]]] = {}
    for key, published in CALIBRATION.items():
        if key in out:
            errors[key] = {figure: {"published": value, "simulated": out[key][figure],
                                    "error": round(out[key][figure] / value - 1.0, 4)}
                           for figure, value in published.items()}
    return errors


def _length(text: str) -> tuple[int, int]:
    prompt, _, output = text.partition("-")
    return int(prompt), int(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the LLM calibration configurations only")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--instances", nargs="+", choices=list(INSTANCES), default=list(INSTANCES))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--lengths", nargs="+", type=_length, metavar="IN-OUT",
                        help="input-output token pairs of the grid, e.g. 128-128 2048-2048")
    parser.add_argument("--quantize", choices=[q.value for q in Quantization], default="none",
                        help="int8-weight-only: transformers-neuronx's quantized configuration (int8 "
                             "linear weights, per-channel scales); calibration points are bf16 runs")
    parser.add_argument("--progress", action="store_true",
                        help="one JSON line per finished key on stderr (its wall and CPU seconds)")
    args = parser.parse_args()
    options = CompilerOptions(quantize=Quantization(args.quantize))
    if args.quick:
        keys = [k for k in grid_keys(list(MODELS), list(INSTANCES), list(BATCHES), None)
                if str(k) in CALIBRATION]
    else:
        keys = grid_keys(args.models, args.instances, args.batches, args.lengths)
    out: dict = {"dtype": "bf16", "quantize": args.quantize,
                 "bucket_rule": "powers of two from 128 up to in+out, then in+out"}
    grid = Grid(options)
    started, started_cpu = time.perf_counter(), time.process_time()
    for n, key in enumerate(keys, 1):
        wall, cpu, programs = time.perf_counter(), time.process_time(), len(grid.cache)
        out[str(key)] = grid.figures(key)
        # what this key cost in this run: the programs no earlier key had compiled, and timing them
        out[str(key)]["key_wall_s"] = round(time.perf_counter() - wall, 2)
        out[str(key)]["key_cpu_s"] = round(time.process_time() - cpu, 2)
        out[str(key)]["programs_new"] = len(grid.cache) - programs
        if args.progress:  # a run stopped part way still leaves each finished key's cost
            print(json.dumps({"key": str(key), "done": n, "of": len(keys),
                              **{k: out[str(key)][k] for k in ("key_wall_s", "key_cpu_s", "programs_new")},
                              "bench_wall_s": round(time.perf_counter() - started, 1)}),
                  file=sys.stderr, flush=True)
    out["calibration"] = calibration_errors(out)
    out["programs_simulated"] = len(grid.cache)
    out["compile_wall_s"] = round(sum(t.compile_s for t in grid.cache.values()), 1)
    out["bench_wall_s"] = round(time.perf_counter() - started, 1)
    out["bench_cpu_s"] = round(time.process_time() - started_cpu, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
