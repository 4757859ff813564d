"""Choosing the next token from last-position logits: greedy, or sampling after transformers'
warpers, both after transformers' logits processors (``Processors``: sequence bias, repetition
penalty, n-gram blocking, bad words, minimum lengths, suppressed tokens).

The filters are transformers' own (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``, ``MinPLogitsWarper``, ``TypicalLogitsWarper``, ``EpsilonLogitsWarper``,
``EtaLogitsWarper``, applied in that order, as ``generate`` chains them): top-k keeps every token
whose logit is at least the k-th largest; top-p keeps the smallest set of most likely tokens whose
probability reaches ``top_p`` (at least one); min-p keeps the tokens at least ``min_p`` times as
likely as the most likely one; typical-p keeps the tokens whose surprise is closest to the
distribution's entropy until their mass reaches ``typical_p``; epsilon and eta cut the tokens less
likely than a fixed (eta: entropy-scaled) floor. A seeded NumPy generator draws from what is left, so
a seed reproduces a generation (not torch's RNG stream: the same seed gives other tokens than
``transformers`` does, by design of two different generators).

Sampling runs on the host, from the logits each step returns; docs/generation.md says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class SamplingError(ValueError):
    """Sampling or processor settings that are not valid (top_k < 0, top_p outside (0, 1],
    temperature <= 0, a bad words list that is not lists of token ids, ...)."""


def _fraction(value: object, name: str, low: float, high: float, closed_low: bool, closed_high: bool) -> None:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = (v >= low if closed_low else v > low) and (v <= high if closed_high else v < high)
    if not ok:
        raise SamplingError(f"{name} must be in {'[' if closed_low else '('}{low:g}, {high:g}"
                            f"{']' if closed_high else ')'}, not {value!r}")


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: ``do_sample=False`` is greedy (argmax, ties to the lowest id,
    as ``torch.argmax``); otherwise temperature, top-k (0: off), top-p (1.0: off), min-p (0.0:
    off), typical-p (1.0: off), epsilon and eta cutoffs (0.0: off) filter the logits and a token
    is drawn from the rest."""

    do_sample: bool = False
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise SamplingError(f"top_k must be a non-negative integer, not {self.top_k!r}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not float(self.temperature) > 0.0:
            raise SamplingError(f"temperature must be positive, not {self.temperature!r}")
        _fraction(self.min_p, "min_p", 0.0, 1.0, True, True)  # as transformers' warpers check them
        _fraction(self.typical_p, "typical_p", 0.0, 1.0, False, True)
        _fraction(self.epsilon_cutoff, "epsilon_cutoff", 0.0, 1.0, True, False)
        _fraction(self.eta_cutoff, "eta_cutoff", 0.0, 1.0, True, False)


def _token_lists(value: Any, name: str) -> tuple[tuple[int, ...], ...]:
    """``[[id, ...], ...]`` as tuples of non-negative ids, each list non-empty."""
    try:
        lists = tuple(tuple(ids) for ids in value)
    except TypeError:
        lists = ()
    if not lists or any(not ids or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                           and t >= 0 for t in ids) for ids in lists):
        raise SamplingError(f"{name} must be a non-empty list of non-empty lists of token ids, not {value!r}")
    return tuple(tuple(int(t) for t in ids) for ids in lists)


def _biases(value: Any) -> tuple[tuple[tuple[int, ...], float], ...]:
    """transformers' ``sequence_bias``: ``[[ids, bias], ...]`` or ``{(ids...): bias}``."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    try:
        ids = _token_lists([p[0] for p in pairs], "sequence_bias")
        biases = [float(p[1]) for p in pairs if len(p) == 2 and not isinstance(p[1], bool)]
    except (TypeError, ValueError, IndexError, KeyError, SamplingError):
        ids, biases = (), []
    if not ids or len(biases) != len(ids):
        raise SamplingError(f"sequence_bias must be a non-empty list of [token ids, bias] pairs "
                            f"(or a dict of id tuples to biases), not {value!r}")
    return tuple(dict(zip(ids, biases)).items())  # a repeated sequence: the last bias, as transformers


@dataclass(frozen=True)
class Processors:
    """transformers' logits processors that greedy search and sampling both apply, before the
    sampling filters and in transformers' order: ``sequence_bias`` (token sequences and the bias
    added to their last token's logit once the rest has been generated), ``repetition_penalty``
    (1.0: off), ``no_repeat_ngram_size`` (0: off), ``bad_words_ids`` (sequences whose last token
    is banned once the rest has been generated; a one-token sequence equal to an end-of-sequence
    id is dropped, as transformers drops it), ``min_length`` (the prompt counted) and
    ``min_new_tokens`` (0: off; both need end-of-sequence ids), ``suppress_tokens`` (never
    chosen), ``begin_suppress_tokens`` (not chosen as the first new token). ``prompt_length`` is
    the padded prompt's length, as transformers counts new tokens from it. ``padding`` (one per
    row: its left padding) is what the repetition penalty leaves out, as transformers does. The
    lists take transformers' forms (``sequence_bias``: ``[[ids, bias], ...]`` or a dict) and are
    kept as tuples."""

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    min_new_tokens: int = 0
    sequence_bias: Any = ()
    bad_words_ids: Any = ()
    suppress_tokens: Any = ()
    begin_suppress_tokens: Any = ()
    eos: tuple[int, ...] = ()
    prompt_length: int = 0
    padding: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.repetition_penalty, bool) or not float(self.repetition_penalty) > 0.0:
            raise SamplingError(f"repetition_penalty must be a positive float, "
                                f"not {self.repetition_penalty!r}")
        for name in ("no_repeat_ngram_size", "min_length", "min_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise SamplingError(f"{name} must be a non-negative integer, not {value!r}")
        if _given(self.sequence_bias):
            object.__setattr__(self, "sequence_bias", _biases(self.sequence_bias))
        if _given(self.bad_words_ids):
            banned = [ids for ids in _token_lists(self.bad_words_ids, "bad_words_ids")
                      if not (len(ids) == 1 and ids[0] in self.eos)]
            object.__setattr__(self, "bad_words_ids", tuple(banned))
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            value = getattr(self, name)
            if _given(value):
                object.__setattr__(self, name, _token_lists([value], name)[0])

    @property
    def token_ids(self) -> list[int]:
        """Every token id the lists name (to check against the vocabulary)."""
        named = [t for ids, _ in self.sequence_bias for t in ids]
        named += [t for ids in self.bad_words_ids for t in ids]
        return named

    @property
    def active(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0
                or (bool(self.eos) and (self.min_length > 0 or self.min_new_tokens > 0))
                or any(_given(getattr(self, name)) for name in (
                    "sequence_bias", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens")))


def _given(value: Any) -> bool:
    """A list setting that is set (None and empty lists are off)."""
    return value is not None and not (hasattr(value, "__len__") and len(value) == 0)


def _add_sequence_bias(scores: np.ndarray, sequences: np.ndarray,
                       pairs: tuple[tuple[tuple[int, ...], float], ...]) -> np.ndarray:
    """``SequenceBiasLogitsProcessor``: one-token sequences' biases on every row, longer ones' on
    their last token in the rows whose tokens end with the rest (grouped by that prefix's length,
    in order, summed, as its ``index_add``), then added to the scores."""
    batch, vocab = scores.shape
    bias = np.zeros((batch, vocab), np.float32)
    for ids, value in pairs:
        if len(ids) == 1:
            bias[:, ids[0]] = np.float32(value)
    groups: dict[int, list[tuple[tuple[int, ...], float]]] = {}
    for ids, value in pairs:
        if len(ids) > 1:
            groups.setdefault(len(ids) - 1, []).append((ids, value))
    for prefix_length, group in groups.items():
        if prefix_length > sequences.shape[1]:
            continue
        tail = sequences[:, sequences.shape[1] - prefix_length:]
        for ids, value in group:
            matching = (tail == np.asarray(ids[:-1])[None, :]).all(axis=1)
            bias[:, ids[-1]] += np.where(matching, np.float32(value), np.float32(0.0))
    return scores + bias


def process_logits(logits: np.ndarray, sequences: np.ndarray, processors: Processors) -> np.ndarray:
    """``logits`` [batch, vocab] after the processors, given the ``sequences`` [batch, length] so
    far (the padded prompt, then every token chosen, a finished row's padding included), as
    ``SequenceBiasLogitsProcessor``, ``RepetitionPenaltyLogitsProcessor``,
    ``NoRepeatNGramLogitsProcessor``, ``NoBadWordsLogitsProcessor``, ``MinLengthLogitsProcessor``,
    ``MinNewTokensLengthLogitsProcessor``, ``SuppressTokensLogitsProcessor`` and
    ``SuppressTokensAtBeginLogitsProcessor`` compute them, in that order."""
    scores = np.array(logits, np.float32)
    batch, vocab = scores.shape
    length = sequences.shape[1]
    rows = np.arange(batch)[:, None]
    if processors.sequence_bias:
        scores = _add_sequence_bias(scores, sequences, processors.sequence_bias)
    if processors.repetition_penalty != 1.0:  # every token seen but the prompt's left padding
        seen = np.minimum(sequences, vocab)  # ids past the logits: a spare column, dropped
        if processors.padding:
            padding = np.asarray(processors.padding)[:, None]
            seen = np.where(np.arange(length)[None, :] < padding, vocab, seen)
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
    if processors.bad_words_ids:
        scores = _add_sequence_bias(scores, sequences,
                                    tuple((ids, -np.inf) for ids in dict.fromkeys(processors.bad_words_ids)))
    if processors.eos and (length < processors.min_length
                           or length - processors.prompt_length < processors.min_new_tokens):
        eos = [e for e in processors.eos if 0 <= e < vocab]
        scores[:, eos] = -np.inf
    suppressed = [t for t in processors.suppress_tokens if t < vocab]
    if length == processors.prompt_length:
        suppressed += [t for t in processors.begin_suppress_tokens if t < vocab]
    if suppressed:
        scores[:, suppressed] = -np.inf
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
    if sampling.min_p > 0.0:  # MinPLogitsWarper: below min_p times the top probability (the top stays)
        probs = _softmax(scores)
        top = probs.max(axis=-1, keepdims=True)
        remove = probs < np.float32(sampling.min_p) * top
        remove[np.arange(len(scores)), np.argmax(probs, axis=-1)] = False
        scores = np.where(remove, np.float32(-np.inf), scores)
    if sampling.typical_p < 1.0:  # TypicalLogitsWarper
        shifted = scores - scores.max(axis=-1, keepdims=True)
        normalized = shifted - np.log(np.exp(shifted, dtype=np.float32).sum(axis=-1, keepdims=True))
        p = np.exp(normalized, dtype=np.float32)
        with np.errstate(invalid="ignore"):
            entropy = -np.nansum(normalized * p, axis=-1, keepdims=True, dtype=np.float32)
        surprise = np.abs(-normalized - entropy)  # how far from the expected surprise
        order = np.argsort(surprise, axis=-1, kind="stable")
        closest = np.take_along_axis(surprise, order, axis=-1)
        mass = np.cumsum(_softmax(np.take_along_axis(scores, order, axis=-1)), axis=-1, dtype=np.float32)
        last = np.minimum((mass < np.float32(sampling.typical_p)).sum(axis=-1), vocab - 1)
        remove = closest > np.take_along_axis(closest, last[:, None], axis=-1)
        remove[:, :1] = False
        drop = np.zeros_like(remove)
        np.put_along_axis(drop, order, remove, axis=-1)
        scores = np.where(drop, np.float32(-np.inf), scores)
    for cutoff, eta in ((sampling.epsilon_cutoff, False), (sampling.eta_cutoff, True)):
        if cutoff > 0.0:  # EpsilonLogitsWarper / EtaLogitsWarper (the most likely token stays)
            probs = _softmax(scores)
            floor = np.full((len(scores), 1), np.float32(cutoff))
            if eta:  # min(eta, sqrt(eta) * exp(-entropy)), the entropy as torch's Categorical's
                top = scores.max(axis=-1, keepdims=True)
                total = np.exp(scores - top, dtype=np.float32).sum(axis=-1, keepdims=True)
                logp = scores - (top + np.log(total))
                logp = np.maximum(logp, np.finfo(np.float32).min)
                entropy = -(logp * probs).sum(axis=-1, keepdims=True, dtype=np.float32)
                floor = np.minimum(floor, np.sqrt(floor) * np.exp(-entropy, dtype=np.float32))
            remove = (probs < floor) & (scores < scores.max(axis=-1, keepdims=True))
            scores = np.where(remove, np.float32(-np.inf), scores)
    return scores


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True), dtype=np.float32)
    return shifted / shifted.sum(axis=-1, keepdims=True, dtype=np.float32)


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
