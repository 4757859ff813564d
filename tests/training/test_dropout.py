"""Dropout with p > 0 in traced training steps: the core's counter-based RNG (Philox4x32-10).

torch's generator cannot be matched bit for bit, so the law is tested: the keep rate, the 1/(1-p)
scale, the output's expectation equal to the input, the backward reading the forward's mask, new
masks every step; and the device's random numbers equal the IR's reference semantics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import neuroncore
from neuroncore.compiler import compile as compile_graph
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.philox import philox4x32
from neuroncore.ir.reference import run_reference
from neuroncore.runtime import Instance

P = 0.25
N = 8192
Steps = tuple[list[float], list[np.ndarray], list[np.ndarray]]  # losses, masks, weights before


def test_philox_known_answers() -> None:
    """Random123's known-answer vectors for philox4x32_10."""
    zero, ones = np.zeros(1, np.uint32), np.full(1, 0xFFFFFFFF, np.uint32)
    assert [int(w[0]) for w in philox4x32((zero,) * 4, (0, 0))] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert [int(w[0]) for w in philox4x32((ones,) * 4, (0xFFFFFFFF, 0xFFFFFFFF))] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


@pytest.mark.parametrize("shape", [(300, 70), (6, 8, 33), (5,)])
def test_device_random_numbers_equal_the_reference(shape: tuple[int, ...]) -> None:
    """Every tile (several tiles, small batches packed into one tile, a vector) draws the
    elements the reference draws for the same positions."""
    b = GraphBuilder("rng")
    state = b.parameter("rng/state", (2,), "fp32")
    graph = b.build([b.rng_uniform(state, shape, 3)])
    loaded = Instance("trn1.2xlarge").core(0).load(compile_graph(graph, "trn1"))
    seed = np.array([12345, 6], np.float32)
    got = np.asarray(loaded.compute([seed])[0]).reshape(shape)
    np.testing.assert_array_equal(got, np.asarray(run_reference(graph, [seed])[0]))
    assert got.min() >= 0.0 and got.max() < 1.0


class Dropped(torch.nn.Module):
    """loss = mean(dropout(w * x)): with x = 1 and SGD at lr = N the update of w is the scaled
    mask, so the parameters after a step show which elements the backward kept."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(N))
        self.drop = torch.nn.Dropout(P)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.w * x).sum() / N


@pytest.fixture(scope="module")
def two_steps() -> tuple[list[float], list[np.ndarray], list[np.ndarray]]:
    torch.manual_seed(0)
    model = Dropped().train()
    opt = torch.optim.SGD(model.parameters(), lr=float(N))
    x = torch.ones(N)
    step = neuroncore.trace_train_step(model, opt, (x,))
    assert any(op.opcode == "rng" for op in step.graph.ops)
    losses, masks, weights = [], [], []
    before = model.w.detach().numpy().copy()
    for _ in range(2):
        weights.append(before)
        losses.append(float(step(x)))
        after = model.w.detach().numpy().copy()
        masks.append((before - after) * (1 - P))  # the backward's mask, 0 or 1
        before = after
    return losses, masks, weights


def test_mask_is_binary_and_scaled_by_one_over_keep(two_steps: Steps) -> None:
    _, masks, _ = two_steps
    for mask in masks:
        assert np.all(np.isclose(mask, 0.0, atol=1e-5) | np.isclose(mask, 1.0, atol=1e-5))


def test_keep_rate_and_expectation(two_steps: Steps) -> None:
    losses, masks, _ = two_steps
    sigma = math.sqrt(P * (1 - P) / N)
    for mask in masks:
        assert abs(float(np.round(mask).mean()) - (1 - P)) < 4 * sigma
    # E[dropout(x)] = x: the first step's mean output (w = x = 1) is 1 within 4 standard
    # deviations of its estimate
    assert abs(losses[0] - 1.0) < 4 * math.sqrt(P / (1 - P) / N)


def test_backward_uses_the_forward_mask(two_steps: Steps) -> None:
    """The loss (forward mask) equals the kept count the gradient (backward mask) shows."""
    losses, masks, weights = two_steps
    for loss, mask, w in zip(losses, masks, weights):
        assert loss == pytest.approx(float((np.round(mask) * w).sum()) / (N * (1 - P)), rel=1e-5)


def test_masks_differ_between_steps(two_steps: Steps) -> None:
    _, (first, second), _ = two_steps
    a, b = np.round(first).astype(bool), np.round(second).astype(bool)
    assert (a != b).any()
    both = float((a & b).mean())  # independent draws: P(kept twice) = (1 - p)^2
    assert abs(both - (1 - P) ** 2) < 4 * math.sqrt((1 - P) ** 2 * (1 - (1 - P) ** 2) / N)


def test_bert_trains_with_its_default_dropout() -> None:
    """A transformers model with the config's default dropout (hidden and attention 0.1) traces
    and trains in train mode without setting p = 0; each step draws new masks."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=4,
                                     max_position_embeddings=32, num_labels=3)
    assert config.hidden_dropout_prob == 0.1 and config.attention_probs_dropout_prob == 0.1

    class Labelled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.BertForSequenceClassification(config)

        def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, labels=labels).loss

    model = Labelled().train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # parameters fixed: only the masks move
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 3, (2,))
    step = neuroncore.trace_train_step(model, opt, (ids, labels))
    assert sum(op.opcode == "rng" for op in step.graph.ops) >= 3  # embeddings, attention, outputs
    losses = [float(step(ids, labels)) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    assert len(set(losses)) == 3
    model.eval()
    with torch.no_grad():
        deterministic = float(model(ids, labels))
    assert all(abs(x - deterministic) < 0.5 for x in losses)  # the same model, masked


def test_accumulated_micro_batches_draw_different_masks() -> None:
    """Gradient accumulation runs two programs (accumulate, update) once each per step: each
    execution gets its own offset, so the two micro-batches' masks are independent."""
    torch.manual_seed(1)
    model = Dropped().train()
    opt = torch.optim.SGD(model.parameters(), lr=float(N))
    x = torch.ones(N)
    step = neuroncore.trace_train_step(model, opt, (x,), accumulation_steps=2)
    step(torch.ones(2 * N))
    kept = np.round((1.0 - model.w.detach().numpy()) * (1 - P) * 2)  # 0, 1 or 2 of the masks
    assert set(np.unique(kept)) <= {0.0, 1.0, 2.0}
    once = float((kept == 1).mean())  # kept by exactly one micro-batch: 2 p (1 - p)
    assert abs(once - 2 * P * (1 - P)) < 4 * math.sqrt(2 * P * (1 - P) * (1 - 2 * P * (1 - P)) / N)
