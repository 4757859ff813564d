"""Top-k / top-p filtering against transformers' own logits warpers, on the same logits, and the
seeded draw's reproducibility and distribution."""

from __future__ import annotations

import numpy as np
import pytest

from neuroncore.generation import Sampling, SamplingError, filter_logits, next_tokens


@pytest.mark.parametrize("top_k, top_p, temperature", [(50, 1.0, 1.0), (5, 1.0, 1.0), (0, 0.9, 1.0),
                                                        (20, 0.7, 0.6), (1, 0.5, 2.0), (0, 0.3, 1.5)])
def test_filters_keep_exactly_what_transformers_keeps(top_k, top_p, temperature):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    logits = np.random.default_rng(top_k).standard_normal((4, 200)).astype(np.float32) * 3
    scores = torch.from_numpy(logits.copy())
    for warper in (transformers.TemperatureLogitsWarper(temperature),
                   transformers.TopKLogitsWarper(top_k) if top_k else None,
                   transformers.TopPLogitsWarper(top_p) if top_p < 1.0 else None):
        if warper is not None:
            scores = warper(None, scores)
    want = scores.numpy()
    ours = filter_logits(logits, Sampling(True, top_k, top_p, temperature))
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(want))
    np.testing.assert_allclose(ours[~np.isinf(ours)], want[~np.isinf(want)], rtol=1e-6)


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
