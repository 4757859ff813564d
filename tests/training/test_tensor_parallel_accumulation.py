"""Gradient accumulation in tensor-parallel training, and the rank's memory check:
``TensorParallelTrainStep(..., accumulation_steps=K)`` takes K micro-batches stacked along dim 0, as
``trace_train_step`` does, runs
the sharded accumulate program K-1 times (each rank adding its block of the gradients to resident
buffers split like the weights) and the sharded update program once; the step equals one core's
accumulation and PyTorch's ``(loss / K).backward()`` loop after several AdamW steps."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuroncore.frontends.tracing import TraceError
from neuroncore.parallel.sharding import Split
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.parallel.training import PlanError
from neuroncore.training import trace_train_step
from neuroncore.training.memory import program_saved_activations
from neuroncore.training.torch_step import ProgramKind

transformers = pytest.importorskip("transformers")

K = 3


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16),
                               torch.nn.LayerNorm(16), torch.nn.Linear(16, 8))


def test_mlp_accumulation_equals_single_core_and_pytorch() -> None:
    tp_model, single_model = _mlp(), _mlp()
    ref = copy.deepcopy(tp_model)
    example = (torch.zeros(4, 16), torch.zeros(4, 8))
    step = TensorParallelTrainStep(tp_model, torch.optim.AdamW(tp_model.parameters(), lr=1e-2), example,
                                   tp=2, loss_fn=F.mse_loss, accumulation_steps=K)
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2), example,
                              loss_fn=F.mse_loss, accumulation_steps=K)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    # both programs are split alike: a gradient buffer is split like its weight
    assert set(step.rank_programs) == {ProgramKind.UPDATE, ProgramKind.ACCUMULATE}
    assert step.input_split["grad/0.weight"] == step.split_of("0.weight") == Split(0)
    assert step.input_split["grad/2.weight"] == step.split_of("2.weight") == Split(1)
    assert step.rank_states[1].tensors["grad/0.weight"].shape == (16, 16)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = torch.tensor(rng.standard_normal((4 * K, 16)), dtype=torch.float32)
        y = torch.tensor(rng.standard_normal((4 * K, 8)), dtype=torch.float32)
        loss, one = float(step(x, y)), float(single(x, y))
        expected = 0.0
        for xm, ym in zip(x.chunk(K), y.chunk(K)):
            part = F.mse_loss(ref(xm), ym) / K
            part.backward()
            expected += float(part.detach())
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(one, rel=1e-5) and loss == pytest.approx(expected, rel=1e-5)
        # the buffers are zeroed after the update, on every rank
        assert all(not state.tensors["grad/0.weight"].any() for state in step.rank_states)
    for (name, p), q, r in zip(tp_model.named_parameters(), single_model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(p.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-6, err_msg=name)
    # K executions per rank per step (K-1 accumulate, then the update), each on its rank's core
    assert len(step.last_results) == K * 2
    assert sorted(r.core for r in step.last_results) == [0] * K + [1] * K


def test_llama_accumulation_with_keywords_equals_pytorch() -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=32, use_cache=False)
    model = transformers.LlamaForCausalLM(config)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    micro = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), micro, tp=2,
                                   accumulation_steps=2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for _ in range(2):
        ids = torch.randint(0, 64, (4, 8), generator=gen)
        loss = float(step(input_ids=ids, labels=ids))
        expected = 0.0
        for chunk in ids.chunk(2):
            part = ref(input_ids=chunk, labels=chunk).loss / 2
            part.backward()
            expected += float(part.detach())
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(expected, rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"


def test_accumulation_errors_are_one_line() -> None:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    example = (torch.zeros(4, 16), torch.zeros(4, 8))
    with pytest.raises(PlanError, match="accumulation_steps must be a positive integer, not 0"):
        TensorParallelTrainStep(model, opt, example, tp=2, loss_fn=F.mse_loss, accumulation_steps=0)
    step = TensorParallelTrainStep(model, opt, example, tp=2, loss_fn=F.mse_loss, accumulation_steps=2)
    with pytest.raises(Exception, match=r"\(2 micro-batches of 4\)") as info:
        step(torch.zeros(4, 16), torch.zeros(4, 8))
    assert "\n" not in str(info.value)


def _wide() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.GELU(), torch.nn.Linear(256, 16))


def test_memory_check_counts_each_ranks_own_activations() -> None:
    """The memory check of a tensor-parallel step counts the saved activations of the rank's own
    sharded program (the column-parallel hidden layer's quarter at tp 4), not the unsplit graph's."""
    example = (torch.zeros(8, 16), torch.zeros(8, 16))
    one_model, tp_model = _wide(), _wide()
    single = trace_train_step(one_model, torch.optim.AdamW(one_model.parameters()), example,
                              loss_fn=F.mse_loss)
    step = TensorParallelTrainStep(tp_model, torch.optim.AdamW(tp_model.parameters()), example, tp=4,
                                   loss_fn=F.mse_loss)
    assert step.memory.activations == program_saved_activations(step.rank_program.graph)
    whole = program_saved_activations(single.program.graph)
    # the [8, 256] hidden values (before and after GELU) are held as [8, 64] blocks on each rank
    assert whole - step.memory.activations >= 2 * 8 * (256 - 64) * 4
    assert 0 < step.memory.activations < whole


def test_a_rank_whose_activations_do_not_fit_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import neuroncore.parallel.tp_train as tp_train
    monkeypatch.setattr(tp_train, "program_saved_activations", lambda graph: 10**12)
    model = _wide()
    with pytest.raises(TraceError) as info:
        TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters()),
                                (torch.zeros(8, 16), torch.zeros(8, 16)), tp=2, loss_fn=F.mse_loss)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("Sequential training step does not fit: it needs ")
    assert "per rank but core 0 of trn1.32xlarge has" in message
    assert "activations 1000.0 GB" in message and "weights " in message and "optimizer state " in message
