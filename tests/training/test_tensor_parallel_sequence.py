"""Sequence parallelism in tensor-parallel training (Megatron, Korthikanti et al. 2022): norms and
residuals run on seq / tp tokens per rank, each TP block starts with an all-gather along the
sequence and ends with a reduce-scatter (no all-reduce of activations left), and the step still
equals PyTorch and the plain tensor-parallel step."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from neuroncore.parallel.tp_train import TensorParallelTrainStep

transformers = pytest.importorskip("transformers")

HIDDEN, SEQ = 32, 8


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=HIDDEN, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=32, use_cache=False)
    return transformers.LlamaForCausalLM(config)


def _batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [{"input_ids": ids, "labels": ids}
            for ids in (torch.randint(0, 64, (2, SEQ), generator=gen) for _ in range(2))]


@pytest.mark.parametrize("tp", [2, 4])
def test_llama_sequence_parallel_equals_pytorch(tp: int) -> None:
    model, plain_model = _llama(), _llama()
    ref = copy.deepcopy(model)
    example = _batches()[0]
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), example, tp=tp,
                                   sequence_parallel=True)
    plain = TensorParallelTrainStep(plain_model, torch.optim.AdamW(plain_model.parameters(), lr=1e-3),
                                    example, tp=tp)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    ops = step.rank_program.graph.ops
    forward = Counter(op.opcode for op in ops if op.opcode in ("all-reduce", "all-gather", "reduce-scatter")
                      and op.layer.startswith("model/forward/"))
    # per layer: all-gather into attention and into the MLP, reduce-scatter out of o_proj and
    # down_proj; the embedding's lookup is reduce-scattered, the LM head's input all-gathered
    assert forward == Counter({"all-gather": 2 * 2 + 1, "reduce-scatter": 2 * 2 + 1})
    activations = [op for op in ops if op.opcode == "all-reduce" and len(op.shape) == 3]
    assert not activations  # no all-reduce of [batch, seq, hidden] anywhere, backward included
    scattered = [op for op in ops if op.opcode == "reduce-scatter"]
    assert {op.shape for op in scattered} == {(2, SEQ // tp, HIDDEN)}
    backward = Counter(op.opcode for op in ops if op.layer.startswith("model/backward/")
                       and op.opcode in ("all-gather", "reduce-scatter"))
    assert backward["reduce-scatter"] == 2 * 2 + 1 and backward["all-gather"] >= 2 * 2
    # the norms' weights are replicated: their gradients (sums over each rank's tokens) all-reduced
    norms = [op for op in ops if op.opcode == "all-reduce" and op.shape == (HIDDEN,)]
    assert len(norms) == 2 * 2 + 1
    for batch in _batches():
        loss, other = float(step(**batch)), float(plain(**batch))
        expected = ref(**batch).loss
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
        assert loss == pytest.approx(other, rel=1e-5)
    for (name, p), q, r in zip(model.named_parameters(), ref.parameters(), plain_model.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"
        assert torch.allclose(p, r, atol=1e-5, rtol=0), f"{name}: {(p - r).abs().max()}"
