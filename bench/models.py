"""Full-size models compiled timing-only: one JSON line per model (issue 15 §1).

    python bench/models.py                   # Llama-3-8B and Mixtral-8x7B (tp 8), ViT-base,
                                             # ResNet-50, the Stable Diffusion 1.5 UNet
    python bench/models.py --only vit-base   # one model (repeatable)
    python bench/models.py --quick           # the same families cut to 2 layers / small inputs

Each model is built from its published config with its parameters on the meta device
(``neuroncore.frontends.torch_frontend.meta_parameters``: shapes, no values, nothing allocated,
buffers such as RoPE's frequencies computed as usual), traced with the defaults users get
(transformers' sdpa attention and ``use_cache=True``; diffusers' default attention processor),
auto-cast to bf16 matmuls (``dtype="bf16"``, neuronx-cc's ``--auto-cast matmult``), compiled,
and executed once with ``execute(timing_only=True)`` (the cost model alone). Figures:

* ``trace_s``: ``torch.export`` + core ATen decomposition + conversion to the IR;
* ``shard_s``: the tensor-parallel sharding pass (0 without tp);
* ``compile_s``: ``neuroncore.compile`` of the (per-rank) graph: compile wall seconds;
* ``instructions`` (per rank), ``dma_transfers``, ``ops`` (IR ops of the per-rank graph),
  ``compile_instructions_per_s``;
* ``device_ms``: simulated latency of one forward pass (prefill of ``seq`` tokens for the LLMs;
  one denoising step for the UNet), ``sim_wall_s``: wall time of that timing-only execution;
* ``weight_gib_per_core``: bf16 weights each core holds.

Nothing here is a test: full-size runs take minutes on a loaded 2-core machine, and the tests stay
small (tests/frontends). The machine load shows in every wall-clock figure; the instruction counts
and simulated latencies do not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuronscope import settings

os.environ.setdefault(settings.LIVE.name, "0")  # no live-state publisher: the core's own speed

import torch

import neuroncore as nc
from neuroncore.frontends import torch_frontend
from neuroncore.parallel import TensorParallelModel, shard


@dataclass(frozen=True)
class Case:
    """One model: how to build it (under ``meta_parameters``), its inputs, where it runs."""

    name: str
    config: str
    build: Callable[[bool], torch.nn.Module]  # quick -> model
    inputs: Callable[[bool], Any]  # quick -> example inputs (tuple or dict)
    instance: str
    tp: int = 1


def _llm_inputs(seq: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, 1000, (1, seq)),
            "attention_mask": torch.ones(1, seq, dtype=torch.int64)}


def _llama3_8b(quick: bool) -> torch.nn.Module:
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=2 if quick else 32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5)
    return transformers.LlamaForCausalLM(config)


def _mixtral_8x7b(quick: bool) -> torch.nn.Module:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=2 if quick else 32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
        max_position_embeddings=32768, rope_theta=1e6, num_local_experts=8, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def _vit_base(quick: bool) -> torch.nn.Module:
    import transformers

    return transformers.ViTModel(transformers.ViTConfig(num_hidden_layers=2 if quick else 12))


def _resnet50(quick: bool) -> torch.nn.Module:
    import transformers

    config = transformers.ResNetConfig(depths=[1, 1, 1, 1] if quick else [3, 4, 6, 3])
    return transformers.ResNetModel(config)


def _sd15_unet(quick: bool) -> torch.nn.Module:
    import diffusers

    # Stable Diffusion 1.5's unet/config.json: diffusers' defaults plus sample_size 64 and
    # cross_attention_dim 768 (CLIP ViT-L/14's width)
    layers = 1 if quick else 2
    return diffusers.UNet2DConditionModel(sample_size=64, cross_attention_dim=768,
                                          layers_per_block=layers)


def _unet_inputs(quick: bool) -> tuple[torch.Tensor, ...]:
    side = 32 if quick else 64  # 512x512 images: 64x64 latents
    return torch.randn(1, 4, side, side), torch.tensor([500]), torch.randn(1, 77, 768)


CASES = [
    Case("llama-3-8b", "Llama-3-8B, bf16, batch 1, prefill 128 tokens", _llama3_8b,
         lambda quick: _llm_inputs(128), "trn1.32xlarge", tp=8),
    Case("mixtral-8x7b", "Mixtral-8x7B (8 experts, top-2, all-experts MoE), bf16, batch 1, "
         "prefill 128 tokens", _mixtral_8x7b, lambda quick: _llm_inputs(128), "trn1.32xlarge", tp=8),
    Case("vit-base", "ViT-base/16, bf16, batch 1, 224x224", _vit_base,
         lambda quick: (torch.randn(1, 3, 224, 224),), "inf2.xlarge"),
    Case("resnet-50", "ResNet-50 (transformers), bf16, batch 1, 224x224", _resnet50,
         lambda quick: (torch.randn(1, 3, 224, 224),), "inf2.xlarge"),
    Case("sd-1.5-unet", "Stable Diffusion 1.5 UNet, bf16, batch 1, 64x64 latents, 77 text tokens, "
         "one step", _sd15_unet, _unet_inputs, "inf2.xlarge"),
]


def run(case: Case, quick: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    with torch_frontend.meta_parameters():
        model = case.build(quick).eval()
    inputs = case.inputs(quick)
    t = time.perf_counter()
    converted = torch_frontend.convert(model, inputs, autocast="bf16")
    trace_s = time.perf_counter() - t
    instance = nc.Instance(case.instance, sink=nc.EventSink())
    graph, shard_s, sharded = converted.graph, 0.0, None
    if case.tp > 1:
        t = time.perf_counter()
        sharded = shard(graph, case.tp)
        shard_s = time.perf_counter() - t
        graph = sharded.local
    t = time.perf_counter()
    program = nc.compile(graph, instance.spec.chip.core)
    compile_s = time.perf_counter() - t
    loaded: Any = TensorParallelModel(sharded, program, instance) if sharded is not None \
        else instance.core(0).load(program)
    t = time.perf_counter()
    result = loaded.execute(timing_only=True)
    sim_wall_s = time.perf_counter() - t
    n = program.n_instructions
    return {
        "model": case.name + ("-quick" if quick else ""),
        "config": case.config + (" (quick: cut down)" if quick else ""),
        "instance": case.instance, "tp": case.tp, "dtype": "bf16 (auto-cast matmuls)",
        "ops": len(graph.ops),
        "instructions": n,
        "dma_transfers": program.n_dma_transfers,
        "trace_s": round(trace_s, 1),
        "shard_s": round(shard_s, 1),
        "compile_s": round(compile_s, 1),
        "compile_instructions_per_s": round(n / compile_s) if compile_s else None,
        "device_ms": round(result.device_time_ns / 1e6, 3),
        "sim_wall_s": round(sim_wall_s, 1),
        "weight_gib_per_core": round(program.weight_bytes() / 2**30, 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared, loaded)",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers / small inputs (a smoke run)")
    parser.add_argument("--only", action="append", choices=[c.name for c in CASES],
                        help="run only this model (repeatable)")
    args = parser.parse_args(argv)
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        print(json.dumps(run(case, args.quick)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
