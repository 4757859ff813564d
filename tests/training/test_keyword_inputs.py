"""Keyword inputs to a training step, the way users call transformers models:
``trace_train_step(model, opt, {"input_ids": ids, "attention_mask": mask, "labels": ids})`` and then
``step(input_ids=..., attention_mask=..., labels=...)``, on one core, tensor parallel and data
parallel, against PyTorch's own loop."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from neuroncore.frontends.tracing import TraceError
from neuroncore.parallel.dp_train import DataParallelTrainStep
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.training import trace_train_step

transformers = pytest.importorskip("transformers")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


def _batch(rows: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, 64, (rows, 8), generator=gen)
    mask = torch.ones(rows, 8, dtype=torch.int64)
    mask[0, :2] = 0  # left padding on the first row: the mask is read
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _reference(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("mode", ["single", "tp2"])
def test_keyword_step_equals_pytorch(mode: str) -> None:
    model = _llama()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    example = _batch(2)
    if mode == "single":
        step = trace_train_step(model, opt, example)
    else:
        step = TensorParallelTrainStep(model, opt, example, tp=2)
    batches = [_batch(2), {k: v.flip(0) for k, v in _batch(2).items()}]
    losses = [float(step(**{k: batch[k] for k in reversed(list(batch))})) for batch in batches]
    assert losses == pytest.approx(_reference(ref, batches), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), f"{name}: {(p - q).abs().max()}"


def test_keyword_data_parallel_equals_one_core_on_the_whole_batch() -> None:
    model, single_model = _llama(), _llama()
    step = DataParallelTrainStep(model, torch.optim.SGD(model.parameters(), lr=0.5),
                                 _batch(1), replicas=2)
    single = trace_train_step(single_model, torch.optim.SGD(single_model.parameters(), lr=0.5),
                              {k: v for k, v in _batch(2).items() if k != "attention_mask"})
    whole = _batch(2)
    whole["attention_mask"] = torch.ones_like(whole["attention_mask"])
    a = float(step(**whole))
    b = float(single(input_ids=whole["input_ids"], labels=whole["labels"]))
    # the per-row mean losses average to the whole batch's (equal token counts per row)
    assert a == pytest.approx(b, rel=1e-5)
    for p, q in zip(model.parameters(), single_model.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0)


def test_keyword_target_with_loss_fn_and_errors() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.inner(features)

    wrapped = Named()
    ref = copy.deepcopy(wrapped)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    step = trace_train_step(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1),
                            {"features": x, "target": y}, loss_fn=F.mse_loss)  # last entry: target
    loss = float(step(target=y, features=x))
    expected = F.mse_loss(ref(x), y)
    assert loss == pytest.approx(float(expected), rel=1e-6)
    with pytest.raises(TraceError, match=r"traced with keyword inputs \(features, target\): missing "
                                         r"target; unexpected labels") as info:
        step(features=x, labels=y)
    assert "\n" not in str(info.value)
    with pytest.raises(TraceError, match="call it with the same keywords"):
        step(x, y)
    with pytest.raises(TraceError, match="input 'features' of shape"):
        step(features=torch.zeros(2, 4), target=y)
    positional = trace_train_step(ref, torch.optim.SGD(ref.parameters(), lr=0.1), (x, y),
                                  loss_fn=F.mse_loss)
    with pytest.raises(TraceError, match="traced with positional inputs; got keyword inputs features"):
        positional(features=x, target=y)
