"""Choosing the next token from last-position logits: greedy, or top-k / top-p sampling, after
transformers' repetition penalty, n-gram blocking and minimum lengths (``Processors``).

The filters are transformers' own (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``, applied in that order, as ``generate`` chains them): top-k keeps every token
whose logit is at least the k-th largest; top-p keeps the smallest set of most likely tokens whose
probability reaches ``top_p`` (at least one). A seeded NumPy generator draws from what is left, so
a seed reproduces a generation (not torch's RNG stream: the same seed gives other tokens than
``transformers`` does, by design of two different generators).

Sampling runs on the host, from the logits each step returns; docs/generation.md says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class SamplingError(ValueError):
    """Sampling settings that are not valid (top_k < 0, top_p outside (0, 1], temperature <= 0)."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: ``do_sample=False`` is greedy (argmax, ties to the lowest id,
    as ``torch.argmax``); otherwise temperature, top-k (0: off) and top-p (1.0: off) filter the
    logits and a token is drawn from the rest."""

    do_sample: bool = False
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise SamplingError(f"top_k must be a non-negative integer, not {self.top_k!r}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not float(self.temperature) > 0.0:
            raise SamplingError(f"temperature must be positive, not {self.temperature!r}")


@dataclass(frozen=True)
class Processors:
    """transformers' logits processors that greedy search and sampling both apply, before the
    sampling filters and in transformers' order: ``repetition_penalty`` (1.0: off),
    ``no_repeat_ngram_size`` (0: off), ``min_length`` (the prompt counted) and ``min_new_tokens``
    (0: off; both need end-of-sequence ids). ``prompt_length`` is the padded prompt's length, as
    transformers counts new tokens from it."""

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    min_new_tokens: int = 0
    eos: tuple[int, ...] = ()
    prompt_length: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.repetition_penalty, bool) or not float(self.repetition_penalty) > 0.0:
            raise SamplingError(f"repetition_penalty must be a positive float, "
                                f"not {self.repetition_penalty!r}")
        for name in ("no_repeat_ngram_size", "min_length", "min_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise SamplingError(f"{name} must be a non-negative integer, not {value!r}")

    @property
    def active(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0
                or (bool(self.eos) and (self.min_length > 0 or self.min_new_tokens > 0)))


def process_logits(logits: np.ndarray, sequences: np.ndarray, processors: Processors) -> np.ndarray:
    """``logits`` [batch, vocab] after the processors, given the ``sequences`` [batch, length] so
    far (the padded prompt, then every token chosen, a finished row's padding included), as
    ``RepetitionPenaltyLogitsProcessor``, ``NoRepeatNGramLogitsProcessor``,
    ``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor`` compute them."""
    scores = np.array(logits, np.float32)
    batch, vocab = scores.shape
    length = sequences.shape[1]
    rows = np.arange(batch)[:, None]
    if processors.repetition_penalty != 1.0:  # every token seen, prompt (and its padding) included
        seen = np.minimum(sequences, vocab)  # ids past the logits: a spare column, dropped
        padded = np.concatenate([scores, np.zeros((batch, 1), np.float32)], axis=1)
        score = padded[rows, seen]
        penalty = np.float32(processors.repetition_penalty)
        padded[rows, seen] = np.where(score < 0, score * penalty, score / penalty)
        scores = padded[:, :vocab]
    n = processors.no_repeat_ngram_size
    if n > 0 and length >= n:  # the tokens that completed an earlier n-gram starting like the suffix
        prefix = sequences[:, length + 1 - n:]
        windows = np.lib.stride_tricks.sliding_window_view(sequences, n, axis=1)
        matches = (windows[..., :-1] == prefix[:, None, :]).all(axis=-1)
        banned = np.zeros((batch, vocab + 1), bool)
        banned[rows, np.where(matches, np.minimum(windows[..., -1], vocab), vocab)] = True
        scores = np.where(banned[:, :vocab], np.float32(-np.inf), scores)
    if processors.eos and (length < processors.min_length
                           or length - processors.prompt_length < processors.min_new_tokens):
        eos = [e for e in processors.eos if 0 <= e < vocab]
        scores[:, eos] = -np.inf
    return scores


def filter_logits(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """``logits`` [batch, vocab] with the tokens the filters remove set to -inf (float32)."""
    scores = np.asarray(logits, np.float32) / np.float32(sampling.temperature)
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = np.sort(scores, axis=-1)[:, vocab - sampling.top_k][:, None]
        scores = np.where(scores < kth, np.float32(-np.inf), scores)
    if sampling.top_p < 1.0:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as transformers sorts
        ascending = np.take_along_axis(scores, order, axis=-1)
        shifted = ascending - ascending.max(axis=-1, keepdims=True)
        probs = np.exp(shifted, dtype=np.float32)
        probs /= probs.sum(axis=-1, keepdims=True)
        remove = np.cumsum(probs, axis=-1, dtype=np.float32) <= np.float32(1.0 - sampling.top_p)
        remove[:, -1] = False  # the most likely token always stays
        drop = np.zeros_like(remove)
        np.put_along_axis(drop, order, remove, axis=-1)
        scores = np.where(drop, np.float32(-np.inf), scores)
    return scores


def next_tokens(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """One token id per row: argmax when greedy, else a draw from the filtered distribution."""
    if not sampling.do_sample:
        return np.argmax(np.asarray(logits, np.float32), axis=-1).astype(np.int64)
    scores = filter_logits(logits, sampling).astype(np.float64)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    cdf = np.cumsum(probs, axis=-1)
    draws = rng.random(probs.shape[0])[:, None] * cdf[:, -1:]
    picked = (cdf <= draws).sum(axis=-1)
    # a draw never lands on a removed token (probability 0: its cdf step is flat)
    return np.minimum(picked, probs.shape[-1] - 1).astype(np.int64)


__all__ = ["Processors", "Sampling", "SamplingError", "filter_logits", "next_tokens", "process_logits"]
