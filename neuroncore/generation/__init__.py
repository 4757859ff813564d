"""Generation with traced causal LMs, the way transformers-neuronx serves them (docs/generation.md).

The bucket and sampling helpers need only NumPy; :class:`NeuronCausalLM` (and its timing records)
need torch and transformers and are imported on first use.
"""

from typing import Any

from neuroncore.generation.buckets import (
    BucketError,
    decode_contexts,
    normalize_buckets,
    select_bucket,
    steps_per_bucket,
)
from neuroncore.generation.sampling import Sampling, SamplingError, filter_logits, next_tokens

_LAZY = ("GenerationError", "GenerationTiming", "NeuronCausalLM", "Phase", "StepTiming")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from neuroncore.generation import causal_lm

        return getattr(causal_lm, name)
    raise AttributeError(f"module 'neuroncore.generation' has no attribute {name!r}")


__all__ = ["BucketError", "GenerationError", "GenerationTiming", "NeuronCausalLM", "Phase", "Sampling",
           "SamplingError", "StepTiming", "decode_contexts", "filter_logits", "next_tokens",
           "normalize_buckets", "select_bucket", "steps_per_bucket"]
