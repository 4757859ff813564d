"""End-to-end generation on the core with numerics: one JSON line.

    python bench/generation.py            # batch 1 and 4, tp 1 and 2
    python bench/generation.py --quick    # batch 1, tp 1

README's random-weight Llama (hidden 256, 2 layers, vocabulary 1000, default settings) generates
greedily through ``neuroncore.generation.NeuronCausalLM`` (prompt 32 tokens, 64 new, buckets
``n_positions=(64, 128)``): prefill, then decode steps with the KV cache resident on the device.
Per configuration ``"llama-tiny/trn1.2xlarge/tp<N>/b<B>"``:

* ``ttft_ms`` / ``tpot_ms``: simulated, as the host sees a step (``GenerationTiming``: launch +
  host copies + device time; TPOT is the mean over the decode steps, each in its bucket);
* ``compile_s``: wall seconds to trace and compile the three programs (prompt, two buckets);
* ``wall_per_token_ms``: wall milliseconds the simulator takes per generated token (numerics and
  timing of every step), the cost of generating on the core;
* ``matches_transformers``: the tokens equal ``model.generate(do_sample=False)``'s;
* ``host_bytes_per_step``: bytes a decode step moves host -> device (the KV cache stays resident).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from neuronscope import settings

os.environ.setdefault(settings.LIVE.name, "0")  # the core's own speed: no live-state publisher

import torch
import transformers

from neuroncore.generation import NeuronCausalLM

PROMPT, NEW = 32, 64


def run(model: Any, batch: int, tp: int) -> dict:
    torch.manual_seed(batch)
    ids = torch.randint(3, 1000, (batch, PROMPT))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1:, :5] = 0  # left padding
    gen = NeuronCausalLM(model, n_positions=(64, 128), context_length_estimate=32, batch_size=batch,
                         tp_degree=tp, instance="trn1.2xlarge")
    t0 = time.perf_counter()
    gen.to_neuron()
    t1 = time.perf_counter()
    out = gen.generate(ids, mask, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    t2 = time.perf_counter()
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    timing = gen.last_timing
    assert timing is not None
    return {"ttft_ms": round(timing.ttft_ns / 1e6, 4), "tpot_ms": round(timing.tpot_ns / 1e6, 4),
            "compile_s": round(t1 - t0, 2), "wall_per_token_ms": round((t2 - t1) / NEW * 1e3, 1),
            "matches_transformers": bool(torch.equal(out, want)),
            "host_bytes_per_step": timing.token_steps[-1].host_to_device_bytes,
            "buckets": sorted(set(timing.buckets[1:]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 on one core only")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)
    model = transformers.LlamaForCausalLM(config).eval()
    grid = [(1, 1)] if args.quick else [(1, 1), (4, 1), (1, 2)]
    out: dict = {"prompt_tokens": PROMPT, "new_tokens": NEW}
    for batch, tp in grid:
        out[f"llama-tiny/trn1.2xlarge/tp{tp}/b{batch}"] = run(model, batch, tp)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
