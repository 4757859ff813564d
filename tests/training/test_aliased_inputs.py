"""One tensor passed as two example inputs — the causal-LM pattern
``trace_train_step(model, opt, {"input_ids": ids, "labels": ids})`` — must stay two inputs: traced
that way, a step called with distinct labels (``-100`` padding) trains on those labels, on one core,
tensor parallel and pipeline parallel, exactly as PyTorch does (issue 16: the tracers keyed their
placeholders on the tensor object, so the labels were fed where the ids were read)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from neuroncore.parallel.pp_train import PipelineParallelTrainStep
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.training import trace_train_step
from neuroncore.training.torch_joint import distinct_inputs

transformers = pytest.importorskip("transformers")

VOCAB = 64


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=32, use_cache=False)
    return transformers.LlamaForCausalLM(config)


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                     use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))


def _padded(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[0, :3] = -100  # ignored positions: never a row of the embedding table
    return labels


def _step(mode: str, model: torch.nn.Module, opt: torch.optim.Optimizer, example: dict[str, Any]) -> Any:
    if mode == "single":
        return trace_train_step(model, opt, example)
    if mode == "tp2":
        return TensorParallelTrainStep(model, opt, example, tp=2)
    return PipelineParallelTrainStep(model, opt, example, pp=2, micro_batches=1)


@pytest.mark.parametrize(("mode", "make"), [("single", _llama), ("tp2", _llama), ("pp2", _llama),
                                            ("single", _gpt2)])
def test_labels_traced_as_the_ids_object_stay_a_separate_input(mode: str, make: Any) -> None:
    model = make()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = _ids(0)
    step = _step(mode, model, opt, {"input_ids": ids, "labels": ids})  # one object, two inputs
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    first, second = _ids(1), _ids(2)
    batches = [{"input_ids": first, "labels": _padded(first)},  # distinct labels with -100
               {"input_ids": second, "labels": second}]  # the same object again
    for batch in batches:
        loss = float(step(**batch))
        expected = ref(**batch).loss
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-4, rtol=0), f"{name}: {(p - q).abs().max()}"


def test_positional_input_passed_twice_is_two_inputs() -> None:
    """An autoencoder's ``(x, x)``: the input and the target, then a call with another target."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 4))
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    step = trace_train_step(model, opt, (x, x), loss_fn=F.mse_loss)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x2, target = torch.randn(5, 4), torch.randn(5, 4)
    loss = float(step(x2, target))
    expected = F.mse_loss(ref(x2), target)
    expected.backward()
    ref_opt.step()
    assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0)


def test_distinct_inputs_copies_only_what_shares_memory() -> None:
    ids = torch.arange(6).reshape(2, 3)
    other = ids.clone()
    out = distinct_inputs([ids, ids, other, ids[:, 1:]])
    assert out[0] is ids and out[2] is other
    assert out[1] is not ids and torch.equal(out[1], ids)
    assert out[3].untyped_storage().data_ptr() != ids.untyped_storage().data_ptr()
    assert torch.equal(out[3], ids[:, 1:])
