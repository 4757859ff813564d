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
from neuroncore.training import trace_train_step

transformers = pytest.importorskip("transformers")

HIDDEN, SEQ = 32, 8


def _llama(layers: int, **extra: float) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=HIDDEN, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=32, use_cache=False,
                                      **extra)
    return transformers.LlamaForCausalLM(config)


def _batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [{"input_ids": ids, "labels": ids}
            for ids in (torch.randint(0, 64, (2, SEQ), generator=gen) for _ in range(2))]


@pytest.mark.parametrize(("tp", "layers"), [(2, 2), (4, 1)])
def test_llama_sequence_parallel_equals_pytorch(tp: int, layers: int) -> None:
    model, plain_model = _llama(layers), _llama(layers)
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
    assert forward == Counter({"all-gather": 2 * layers + 1, "reduce-scatter": 2 * layers + 1})
    activations = [op for op in ops if op.opcode == "all-reduce" and len(op.shape) == 3]
    assert not activations  # no all-reduce of [batch, seq, hidden] anywhere, backward included
    scattered = [op for op in ops if op.opcode == "reduce-scatter"]
    assert {op.shape for op in scattered} == {(2, SEQ // tp, HIDDEN)}
    backward = Counter(op.opcode for op in ops if op.layer.startswith("model/backward/")
                       and op.opcode in ("all-gather", "reduce-scatter"))
    assert backward["reduce-scatter"] == 2 * layers + 1 and backward["all-gather"] >= 2 * layers
    # the norms' weights are replicated: their gradients (sums over each rank's tokens) all-reduced
    norms = [op for op in ops if op.opcode == "all-reduce" and op.shape == (HIDDEN,)]
    assert len(norms) == 2 * layers + 1
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


def test_everything_at_once_equals_one_core_in_bf16() -> None:
    """bf16 auto-cast, sequence parallelism, the vocabulary-parallel loss and attention dropout
    (drawn per rank on its heads) together at tp 2: the same numbers as one core in bf16 with the
    same seed, so the pieces compose."""
    model, one_model = _llama(1, attention_dropout=0.2), _llama(1, attention_dropout=0.2)
    example = _batches()[0]
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), example, tp=2,
                                   precision="bf16", sequence_parallel=True)
    one = trace_train_step(one_model, torch.optim.AdamW(one_model.parameters(), lr=1e-3), example,
                           precision="bf16")
    step.rng_seed = one.rng_seed
    ops = step.rank_program.graph.ops
    assert any(op.opcode == "rng" and op.attrs.get("block") for op in ops)
    assert any(op.opcode == "reduce-scatter" for op in ops)
    assert any(op.opcode == "all-reduce" and op.attrs["reduction"] == "max" for op in ops)
    for batch in _batches():
        assert float(step(**batch)) == pytest.approx(float(one(**batch)), rel=1e-4)
    for (name, p), q in zip(model.named_parameters(), one_model.parameters()):
        assert torch.allclose(p, q, atol=1e-4, rtol=0), f"{name}: {(p - q).abs().max()}"
