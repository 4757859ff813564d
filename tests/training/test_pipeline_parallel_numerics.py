"""Pipeline-parallel training against one core: a Sequential cut into stages on their own cores,
micro-batches in the 1F1B schedule, activations and gradients sent between the stages, equals one
core's gradient accumulation over the same micro-batches (and PyTorch's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuroncore.parallel.pp_train import Pass, PipelineParallelTrainStep, one_f_one_b
from neuroncore.parallel.training import PlanError
from neuroncore.training import trace_train_step

MB = 4  # rows per micro-batch


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.LayerNorm(32), torch.nn.Tanh(), torch.nn.Linear(32, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 8))


def test_one_f_one_b_order() -> None:
    F_, B_ = Pass.FORWARD, Pass.BACKWARD
    assert one_f_one_b(0, 2, 4) == [(F_, 0), (F_, 1), (B_, 0), (F_, 2), (B_, 1), (F_, 3), (B_, 2), (B_, 3)]
    assert one_f_one_b(1, 2, 4) == [(F_, 0), (B_, 0), (F_, 1), (B_, 1), (F_, 2), (B_, 2), (F_, 3), (B_, 3)]
    assert one_f_one_b(0, 4, 2) == [(F_, 0), (F_, 1), (B_, 0), (B_, 1)]


@pytest.mark.parametrize(("pp", "micro_batches"), [(2, 4), (4, 3)])
def test_pipeline_equals_single_core_accumulation(pp: int, micro_batches: int) -> None:
    single_model, pp_model, ref = _model(), _model(), _model()
    example = (torch.zeros(MB, 16), torch.zeros(MB, 8))
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=1e-2),
                              example, loss_fn=F.mse_loss, accumulation_steps=micro_batches)
    step = PipelineParallelTrainStep(pp_model, torch.optim.AdamW(pp_model.parameters(), lr=1e-2),
                                     example, pp=pp, micro_batches=micro_batches, loss_fn=F.mse_loss)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = torch.tensor(rng.standard_normal((MB * micro_batches, 16)), dtype=torch.float32)
        y = torch.tensor(rng.standard_normal((MB * micro_batches, 8)), dtype=torch.float32)
        a, b = float(single(x, y)), float(step(x, y))
        ref_opt.zero_grad()
        for k in range(micro_batches):
            rows = slice(k * MB, (k + 1) * MB)
            (F.mse_loss(ref(x[rows]), y[rows]) / micro_batches).backward()
        ref_opt.step()
        assert b == pytest.approx(a, rel=1e-6)
    for p, q, r in zip(single_model.parameters(), pp_model.parameters(), ref.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(q.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-5)
    # each stage on its own core, in 1F1B order, waiting for what it receives
    for s in range(pp):
        results = step.stage_results[s]
        assert {r.core for r in results} == {s}
        kinds = [r.program.graph.name.rsplit("_", 1)[-1] for r in results]
        last = s == pp - 1  # the last stage runs forward + loss + backward as one program
        want = ["backward" if p is Pass.BACKWARD or last else "forward"
                for p, _ in one_f_one_b(s, pp, micro_batches) if not (last and p is Pass.BACKWARD)]
        assert kinds[:-1] == want and kinds[-1] == "optimizer"
    sends = [t for t in step.transfers if t.kind is Pass.FORWARD]
    assert len(sends) == (pp - 1) * micro_batches
    assert len([t for t in step.transfers if t.kind is Pass.BACKWARD]) == (pp - 1) * micro_batches
    first_forward = step.stage_results[1][0]
    arrival = next(t for t in sends if t.micro_batch == 0 and t.target == 1)
    sender = step.stage_results[0][0]  # the send is the sending program's collective-permute
    assert sender.start_ns < arrival.start_ns < arrival.end_ns <= sender.end_ns
    assert first_forward.start_ns >= arrival.end_ns  # stage 1 idles until its activation is there


def test_pipeline_errors_are_one_line() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    example = (torch.zeros(MB, 16), torch.zeros(MB, 8))
    cases = [
        (dict(pp=1, micro_batches=2), "pp must be an integer of at least 2"),
        (dict(pp=2, micro_batches=0), "micro_batches must be a positive integer"),
        (dict(pp=2, micro_batches=2, boundaries=[9]), "2 stages of 8 modules need 1 increasing cut"),
    ]
    for kwargs, message in cases:
        with pytest.raises(PlanError, match=message) as info:
            PipelineParallelTrainStep(model, opt, example, loss_fn=F.mse_loss, **kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)
    with pytest.raises(PlanError, match=r"Linear has no ModuleList of layers to cut into pipeline stages"):
        PipelineParallelTrainStep(torch.nn.Linear(16, 8), opt, example, pp=2, micro_batches=2,
                                  loss_fn=F.mse_loss)
    step = PipelineParallelTrainStep(model, opt, example, pp=2, micro_batches=2, loss_fn=F.mse_loss)
    with pytest.raises(PlanError, match=r"inputs of shapes \[\[8, 16\], \[8, 8\]\] expected"):
        step(torch.zeros(4, 16), torch.zeros(4, 8))
