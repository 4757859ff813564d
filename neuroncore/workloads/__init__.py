"""Built-in workloads: programs made from configs with seeded random weights (nothing downloaded).

Each workload builds a :class:`~neuroncore.ir.Graph` from keyword options and makes matching random
inputs. ``WORKLOADS`` is the registry the CLIs list and capture from.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuroncore.ir.graph import Graph
from neuroncore.workloads import models


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[..., Graph]
    defaults: dict[str, Any]
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def options(self, preset: str | None = None, **overrides: Any) -> dict[str, Any]:
        """Defaults, then the preset's values, then explicit overrides (``None`` means unset)."""
        if preset is not None and preset not in self.presets:
            known = ", ".join(sorted(self.presets)) or "none"
            raise ValueError(f"workload {self.name} has no preset {preset!r}; presets: {known}")
        opts = dict(self.defaults)
        if preset:
            opts.update(self.presets[preset])
        unknown = [k for k in overrides if k not in opts]
        if unknown:
            raise ValueError(f"workload {self.name} has no option {', '.join(unknown)}; "
                             f"options: {', '.join(sorted(opts))}")
        for key, value in overrides.items():
            if value is not None and not _same_kind(opts[key], value):
                raise ValueError(f"workload {self.name} option {key} expects "
                                 f"{type(opts[key]).__name__}, got {value!r}")
        opts.update({k: v for k, v in overrides.items() if v is not None})
        return opts

    def graph(self, preset: str | None = None, **overrides: Any) -> Graph:
        return self.build(**self.options(preset, **overrides))


def _same_kind(default: Any, value: Any) -> bool:
    """An override must have its option's type: 1.5 or "abc" is not a size, "maybe" not a flag."""
    if isinstance(default, bool):
        return isinstance(value, (bool, np.bool_))
    if isinstance(default, int):
        return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if isinstance(default, float):
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    return isinstance(value, type(default))


LLAMA_SMALL = dict(layers=2, hidden=512, heads=8, kv_heads=2, intermediate=1376, vocab=4096)
LLAMA_PRESETS = {
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, intermediate=11008, vocab=32000),
    "llama2-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, intermediate=13824, vocab=32000),
    "llama2-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=32000),
    # Llama-3 and Mistral-7B (v0.2: no sliding window) share the architecture; dims from their
    # Hugging Face configs. Their max positions (RoPE theta differs; timing does not depend on it)
    # are in MAX_POSITIONS.
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=128256),
    "mistral-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
}
# max_position_embeddings of each preset's Hugging Face config: the longest sequence it serves
MAX_POSITIONS = {"llama2-7b": 4096, "llama2-13b": 4096, "llama2-70b": 4096, "llama3-8b": 8192,
                 "llama3-70b": 8192, "mistral-7b": 32768}

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("matmul", "one [M,K] x [K,N] matmul, lhs given transposed like the NKI tutorial",
                 models.matmul, dict(m=512, k=1024, n=1024, dtype="bf16", transpose_lhs=False),
                 {"nki-tutorial": dict(m=4096, k=8192, n=8192, dtype="bf16")}),
        Workload("mlp", "two-layer GELU MLP with biases", models.mlp,
                 dict(batch=128, d_model=1024, d_ff=4096, dtype="bf16")),
        Workload("bert-layer", "BERT encoder layer (BERT-base dims by default)", models.bert_layer,
                 dict(batch=1, seq=128, hidden=768, heads=12, intermediate=3072, dtype="bf16")),
        Workload("llama-decode", "Llama decoder: one decode step with a KV cache (RoPE, GQA, SwiGLU)",
                 models.llama_decode, dict(LLAMA_SMALL, batch=1, context=128, dtype="bf16", tp_degree=1),
                 {name: dict(dims, context=2048) for name, dims in LLAMA_PRESETS.items()}),
        Workload("llama-prefill", "Llama context encoding: a causal prompt pass that fills the KV cache",
                 models.llama_prefill, dict(LLAMA_SMALL, batch=1, context=128, dtype="bf16", tp_degree=1),
                 LLAMA_PRESETS),
    ]
}


def get(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    return WORKLOADS[name]


def _parse_value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_overrides(pairs: Sequence[str]) -> dict[str, object]:
    """Command-line ``KEY=VALUE`` workload options (ints, floats, true/false, else text)."""
    result: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {pair!r}")
        result[key.replace("-", "_")] = _parse_value(value)
    return result


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Inputs for every parameter: floats ~N(0,1), int32 ids within the range the graph states."""
    rng = np.random.default_rng(seed)
    values: list[np.ndarray] = []
    for param in graph.parameters:
        if param.dtype.is_float:
            values.append(rng.standard_normal(param.shape).astype(np.float32))
        else:
            high = int(param.attrs.get("high", 2))
            low = int(param.attrs.get("low", 0))
            values.append(rng.integers(low, high, size=param.shape).astype(np.int32))
    return values


__all__ = ["MAX_POSITIONS", "WORKLOADS", "Workload", "get", "parse_overrides", "random_inputs"]
