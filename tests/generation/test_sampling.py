"""Top-k / top-p filtering against transformers' own logits warpers, on the same logits, and the
seeded draw's reproducibility and distribution."""

from __future__ import annotations

import numpy as np
import pytest

from neuroncore.generation import Sampling, SamplingError, filter_logits, next_tokens
from neuroncore.generation.sampling import Processors, process_logits


@pytest.mark.parametrize("top_k, top_p, temperature, more", [
    (50, 1.0, 1.0, {}), (5, 1.0, 1.0, {}), (0, 0.9, 1.0, {}), (20, 0.7, 0.6, {}), (1, 0.5, 2.0, {}),
    (0, 0.3, 1.5, {}), (0, 1.0, 1.0, {"min_p": 0.1}), (20, 1.0, 0.7, {"min_p": 0.5}),
    (0, 1.0, 1.0, {"typical_p": 0.5}), (0, 0.8, 1.0, {"typical_p": 0.9}),
    (0, 1.0, 1.0, {"epsilon_cutoff": 3e-3}),
    (0, 1.0, 1.0, {"eta_cutoff": 1e-3}), (0, 1.0, 2.0, {"eta_cutoff": 0.05}),
    (0, 1.0, 0.7, {"min_p": 0.05, "typical_p": 0.7, "epsilon_cutoff": 1e-3, "eta_cutoff": 2e-3})])
def test_filters_keep_exactly_what_transformers_keeps(top_k, top_p, temperature, more):
    """Every warper against transformers' own, chained in generate's order (temperature, top-k,
    top-p, min-p, typical-p, epsilon, eta) on the same logits, at several logit scales."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for seed in range(8):
        rng = np.random.default_rng(seed + top_k)
        logits = (rng.standard_normal((4, 200)) * (1 + seed)).astype(np.float32)
        scores = torch.from_numpy(logits.copy())
        for warper in (transformers.TemperatureLogitsWarper(temperature),
                       transformers.TopKLogitsWarper(top_k) if top_k else None,
                       transformers.TopPLogitsWarper(top_p) if top_p < 1.0 else None,
                       transformers.MinPLogitsWarper(more["min_p"]) if "min_p" in more else None,
                       transformers.TypicalLogitsWarper(more["typical_p"]) if "typical_p" in more else None,
                       transformers.EpsilonLogitsWarper(more["epsilon_cutoff"]) if "epsilon_cutoff" in more
                       else None,
                       transformers.EtaLogitsWarper(more["eta_cutoff"]) if "eta_cutoff" in more else None):
            if warper is not None:
                scores = warper(None, scores)
        want = scores.numpy()
        ours = filter_logits(logits, Sampling(True, top_k, top_p, temperature, **more))
        np.testing.assert_array_equal(np.isinf(ours), np.isinf(want))
        np.testing.assert_allclose(ours[~np.isinf(ours)], want[~np.isinf(want)], rtol=1e-6)


def test_processors_compute_what_transformers_processors_compute():
    """Sequence bias (one token and after a prefix), bad words (an eos one dropped), suppressed
    and begin-suppressed tokens and the repetition penalty without the prompt's left padding,
    against transformers' processors chained in generate's order, step by step."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(0)
    sequences = rng.integers(0, 12, (3, 9))
    bias = [[[4], -2.5], [[3, 5], 4.0], [[1, 2, 7], -1.0], [[3, 6], 1.5]]
    bad = [[8], [5, 9], [2]]
    options = dict(sequence_bias=bias, bad_words_ids=bad, suppress_tokens=[10, 50],
                   begin_suppress_tokens=[11], repetition_penalty=1.7, eos=(2,), prompt_length=6,
                   padding=(0, 2, 5))
    chain = transformers.LogitsProcessorList([
        transformers.SequenceBiasLogitsProcessor(bias),
        transformers.RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=torch.tensor([0, 2, 5])),
        transformers.NoBadWordsLogitsProcessor(bad, eos_token_id=2),
        transformers.SuppressTokensLogitsProcessor([10, 50]),
        transformers.SuppressTokensAtBeginLogitsProcessor([11], begin_index=6)])
    for length in range(6, 10):  # the first new token (begin suppression), then later ones
        logits = rng.standard_normal((3, 12)).astype(np.float32)
        want = chain(torch.from_numpy(sequences[:, :length]), torch.from_numpy(logits.copy())).numpy()
        ours = process_logits(logits, sequences[:, :length], Processors(**options))
        np.testing.assert_array_equal(ours, want, err_msg=f"length {length}")
def test_draws_are_seeded_and_follow_the_filtered_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 4000, np.float32))
    sampling = Sampling(True, top_k=3, top_p=1.0)
    a = next_tokens(logits, sampling, np.random.default_rng(0))
    assert np.array_equal(a, next_tokens(logits, sampling, np.random.default_rng(0)))
    counts = np.bincount(a, minlength=4) / len(a)
    assert counts[3] == 0  # outside the top 3: never drawn
    np.testing.assert_allclose(counts[:3], np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.03)
    nucleus = next_tokens(logits, Sampling(True, top_k=0, top_p=0.6), np.random.default_rng(1))
    assert set(np.unique(nucleus)) == {0, 1}  # 0.5 + 0.3 reaches 0.6: two tokens stay


def test_greedy_is_argmax_and_bad_settings_are_refused():
    logits = np.array([[0.1, 2.0, 2.0, -1.0]], np.float32)
    assert next_tokens(logits, Sampling(), np.random.default_rng(0)).tolist() == [1]  # first of a tie
    for bad in (dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(temperature=0.0)):
        with pytest.raises(SamplingError):
            Sampling(True, **bad)
