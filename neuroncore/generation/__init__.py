"""Generation with traced causal LMs, the way transformers-neuronx serves them (docs/generation.md)."""

from neuroncore.generation.buckets import (
                                           BucketError,
                                           decode_contexts,
                                           normalize_buckets,
                                           select_bucket,
                                           steps_per_bucket,
)

__all__ = ["BucketError", "decode_contexts", "normalize_buckets", "select_bucket", "steps_per_bucket"]
