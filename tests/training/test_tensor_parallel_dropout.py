"""Dropout under tensor parallelism: the same random streams as one core, where Megatron needs them.

In a parallel region (the MLP's hidden features, attention's heads) each rank draws only its block
of the mask, counted at its place in the whole tensor, so the blocks put together are one core's
mask; in a replicated region (after a row-parallel linear's all-reduce) every rank draws the whole
mask from the same state, so the ranks agree. So a tensor-parallel step with dropout equals the
single-core step with the same seed, and the masks are checked block by block."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuroncore.dtypes import DType
from neuroncore.frontends.torch_random import RNG_STATE_INPUT
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.reference import run_reference
from neuroncore.parallel.sharding import Split, join_blocks, shard
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.training import trace_train_step

transformers = pytest.importorskip("transformers")


def test_a_ranks_block_of_a_random_tensor_is_its_block_of_the_whole() -> None:
    """A column-parallel linear's output (split features), and the same output viewed as heads
    folded into the batch (a split with ``outer`` > 1), masked by dropout: each rank's local graph
    draws only its block, and the blocks equal the one-core mask."""
    b = GraphBuilder("dropout", root_layer="")
    x = b.parameter("x", (6, 16))
    state = b.parameter(RNG_STATE_INPUT, (2,))
    w = b.parameter("w", (16, 24))  # a trained weight: the runtime feeds each rank its block
    h = b.dot(x, w, lhs_contract=1, rhs_contract=0)  # [6, 24], column-parallel: split on dim 1
    keep = b.convert(b.compare(b.rng_uniform(state, (6, 24), 1), 0.7, "LT"), DType.FP32)
    dropped = b.multiply(h, keep)
    heads = b.reshape(dropped, (6, 4, 6))  # [tokens, heads, head_dim]: split on the heads
    folded = b.reshape(b.transpose(heads, (1, 0, 2)), (4 * 6, 6))
    keep2 = b.convert(b.compare(b.rng_uniform(state, (24, 6), 2), 0.5, "LT"), DType.FP32)
    graph = b.build([dropped, b.multiply(folded, keep2)])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((6, 16)).astype(np.float32), np.array([11.0, 3.0], np.float32),
              rng.standard_normal((16, 24)).astype(np.float32)]
    whole = run_reference(graph, inputs)
    for tp in (2, 4):
        sharded = shard(graph, tp, trained=frozenset({"w"}))
        blocks = [op for op in sharded.local.ops if op.opcode == "rng"]
        assert len(blocks) == 2 and all(op.attrs.get("block") for op in blocks)
        assert blocks[0].shape == (6, 24 // tp)  # each rank draws its block only
        per_rank = [run_reference(sharded.local, sharded.rank_arrays(inputs, r)) for r in range(tp)]
        for i, split in enumerate(sharded.output_splits):
            assert isinstance(split, Split)
            got = join_blocks([outs[i] for outs in per_rank], split)
            np.testing.assert_array_equal(got != 0, whole[i] != 0)
            np.testing.assert_allclose(got, whole[i], rtol=1e-5, atol=1e-6)


class _DropoutMlp(torch.nn.Module):
    """Dropout in the parallel region (between the column- and the row-parallel linear) and in the
    replicated one (after the row-parallel linear's all-reduce)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(16, 32)
        self.inner = torch.nn.Dropout(0.3)
        self.down = torch.nn.Linear(32, 16)
        self.outer = torch.nn.Dropout(0.2)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(F.gelu(self.up(x)))
        return self.head(self.norm(self.outer(self.down(h))))


@pytest.mark.parametrize("tp", [2, 4])
def test_mlp_with_dropout_equals_one_core_with_the_same_seed(tp: int) -> None:
    single_model, tp_model = _DropoutMlp(), _DropoutMlp()
    x0, y0 = torch.zeros(8, 16), torch.zeros(8, 8)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              (x0, y0), loss_fn=F.mse_loss)
    step = TensorParallelTrainStep(tp_model, torch.optim.AdamW(tp_model.parameters(), lr=1e-2),
                                   (x0, y0), tp=tp, loss_fn=F.mse_loss)
    step.rng_seed = single.rng_seed
    graph = step.rank_program.graph
    rngs = [op for op in graph.ops if op.opcode == "rng"]
    # the inner mask is drawn per rank (its block of 32 features), the outer one whole on every rank
    assert [op.shape for op in rngs if op.attrs.get("block")] == [(8, 32 // tp)]
    assert [op.shape for op in rngs if not op.attrs.get("block")] == [(8, 16)]
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(3):
        x = torch.tensor(rng.standard_normal((8, 16)), dtype=torch.float32)
        y = torch.tensor(rng.standard_normal((8, 8)), dtype=torch.float32)
        a, b = float(single(x, y)), float(step(x, y))
        assert b == pytest.approx(a, rel=1e-5)
        losses.append(a)
    assert len(set(losses)) == 3
    for p, q in zip(single_model.parameters(), tp_model.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=0, atol=2e-6)
    # dropout really drops: without it the step moves the weights elsewhere
    plain = _DropoutMlp()
    plain.inner.p = plain.outer.p = 0.0
    ref = trace_train_step(plain, torch.optim.AdamW(plain.parameters(), lr=1e-2), (x0, y0),
                           loss_fn=F.mse_loss)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = torch.tensor(rng.standard_normal((8, 16)), dtype=torch.float32)
        y = torch.tensor(rng.standard_normal((8, 8)), dtype=torch.float32)
        ref(x, y)
    assert not torch.allclose(plain.up.weight, tp_model.up.weight, atol=1e-4)


def test_bert_attention_and_hidden_dropout_at_tp2_equal_one_core() -> None:
    """BERT's default dropout (0.1 on attention probabilities, split by heads, and on the hidden
    states, replicated): tp 2 equals one core with the same seed after 2 AdamW steps."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = transformers.BertForSequenceClassification(config)
    model.train()
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 8))
    labels = torch.tensor([0, 1])
    example = {"input_ids": ids, "labels": labels}
    single = trace_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), example)
    step = TensorParallelTrainStep(twin, torch.optim.AdamW(twin.parameters(), lr=1e-3), example, tp=2)
    step.rng_seed = single.rng_seed
    blocks = [op for op in step.rank_program.graph.ops if op.opcode == "rng" and op.attrs.get("block")]
    assert any(op.shape[1] == 2 for op in blocks)  # [b, heads / tp, s, s]: the rank's heads only
    for _ in range(2):
        assert float(step(**example)) == pytest.approx(float(single(**example)), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"
