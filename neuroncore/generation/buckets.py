"""Context buckets, as transformers-neuronx compiles them.

A Neuron program has static shapes, so a decoder is compiled once per *bucket*: a KV-cache length
from ``n_positions`` (``n_positions=(128, 256, 512)``; the largest is the cache the device holds).
Each step runs the program of the smallest bucket that holds the context it attends over, so a
short conversation pays for 128 positions of attention, not 512, and the bucket grows with it.
Prompts are encoded the same way in ``context_length_estimate`` buckets (transformers-neuronx's
name; by default the ``n_positions`` buckets).

These are pure functions of sizes, shared by :class:`neuroncore.generation.NeuronCausalLM` and by
``bench/llm_decode.py`` (which times a generation step by step without running one).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence


class BucketError(ValueError):
    """A context that no bucket holds, or a bucket list that is not one."""


def normalize_buckets(n_positions: int | Iterable[int], *, name: str = "n_positions") -> tuple[int, ...]:
    """Buckets as a sorted tuple of distinct positive ints (one int is one bucket)."""
    if isinstance(n_positions, (int, str, bytes)) or not isinstance(n_positions, Iterable):
        raw: list[object] = [n_positions]  # "128" or 128.0 is one bad bucket, not an iterable of them
    else:
        raw = list(n_positions)
    if not raw:
        raise BucketError(f"{name} needs at least one bucket")
    buckets: set[int] = set()
    for value in raw:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BucketError(f"{name} must be positive integers, not {value!r}")
        buckets.add(value)
    return tuple(sorted(buckets))


def select_bucket(buckets: Sequence[int], context: int) -> int:
    """The smallest bucket that holds ``context`` positions (``buckets`` sorted ascending).

    ``context`` is the number of KV-cache positions a step attends over, the new token's included:
    after a prompt of ``L`` tokens, decode step ``k`` (k = 1, 2, ...) has context ``L + k``."""
    if context < 1:
        raise BucketError(f"a context has at least one position, not {context}")
    at = bisect.bisect_left(buckets, context)
    if at == len(buckets):
        raise BucketError(f"a context of {context} positions is larger than every bucket "
                          f"({', '.join(map(str, buckets))})")
    return int(buckets[at])


def decode_contexts(prompt_len: int, new_tokens: int) -> range:
    """The context of each decode step of a generation of ``new_tokens`` after a ``prompt_len``
    prompt: the prefill makes the first token, each of the other ``new_tokens - 1`` is a step."""
    return range(prompt_len + 1, prompt_len + new_tokens)


def steps_per_bucket(buckets: Sequence[int], prompt_len: int, new_tokens: int) -> dict[int, int]:
    """How many decode steps of the generation run in each bucket (buckets with none left out):
    the weights a mean per-token latency over the whole generation needs."""
    counts: dict[int, int] = {}
    for context in decode_contexts(prompt_len, new_tokens):
        bucket = select_bucket(buckets, context)
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts


__all__ = ["BucketError", "decode_contexts", "normalize_buckets", "select_bucket", "steps_per_bucket"]
