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


@pytest.mark.parametrize("precision", ["bf16", "bf16-sr"])
def test_pipeline_in_bf16_is_within_bf16_error_of_one_core(precision: str) -> None:
    """bf16 auto-cast (FP32 master weights and optimizer state) and bf16 weights with stochastic
    rounding, in pipeline stages, against one core's accumulation in the same precision."""
    micro_batches, steps, lr = 2, 3, 1e-2
    single_model, pp_model = _model(), _model()
    example = (torch.zeros(MB, 16), torch.zeros(MB, 8))
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=lr),
                              example, loss_fn=F.mse_loss, accumulation_steps=micro_batches,
                              precision=precision)
    step = PipelineParallelTrainStep(pp_model, torch.optim.AdamW(pp_model.parameters(), lr=lr),
                                     example, pp=2, micro_batches=micro_batches, loss_fn=F.mse_loss,
                                     precision=precision)
    # the matmuls read bf16 operands; the resident weights are FP32 masters (bf16) or bf16 (bf16-sr)
    dots = [op for prog in step.backward_programs for op in prog.loaded.program.graph.ops
            if op.opcode == "dot"]
    assert dots and all(o.dtype.value == "bf16" for op in dots for o in op.operands)
    params = [op for op in step.optimizer_programs[0].loaded.program.graph.parameters
              if op.name.startswith("param/")]
    assert {p.dtype.value for p in params} == {"fp32" if precision == "bf16" else "bf16"}
    assert all(p.loaded.stochastic_rounding == (precision == "bf16-sr")
               for p in step.backward_programs + step.optimizer_programs)
    rng = np.random.default_rng(2)
    for _ in range(steps):
        x = torch.tensor(rng.standard_normal((MB * micro_batches, 16)), dtype=torch.float32)
        y = torch.tensor(rng.standard_normal((MB * micro_batches, 8)), dtype=torch.float32)
        a, b = float(single(x, y)), float(step(x, y))
        assert b == pytest.approx(a, rel=2e-2)
    for p, q in zip(single_model.parameters(), pp_model.parameters()):
        # bf16 error: a flipped gradient sign costs at most 2 lr per AdamW step
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=0, atol=2 * steps * lr)


def test_dropout_in_pipeline_stages_draws_per_micro_batch_and_backward_reuses_the_mask() -> None:
    """Dropout p=0.5 on the first stage: each micro-batch (the same rows every time) draws its own
    mask, a new step draws new ones, and the backward, which recomputes the stage's forward, applies
    exactly the mask the forward sent on: the weight update equals the one computed by hand from
    the sent activations and the received gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Dropout(0.5), torch.nn.Linear(256, 32),
                                torch.nn.Dropout(0.5), torch.nn.Linear(32, 8)).train()
    micro_batches, lr = 3, 0.1
    example = (torch.zeros(MB, 16), torch.zeros(MB, 8))
    step = PipelineParallelTrainStep(model, torch.optim.SGD(model.parameters(), lr=lr), example, pp=2,
                                     micro_batches=micro_batches, loss_fn=F.mse_loss, boundaries=[2])
    rng = np.random.default_rng(3)
    x_mb = torch.tensor(rng.standard_normal((MB, 16)), dtype=torch.float32)
    x = x_mb.repeat(micro_batches, 1)  # every micro-batch the same rows
    y = torch.tensor(rng.standard_normal((MB * micro_batches, 8)), dtype=torch.float32)
    masks = []
    first = model[0]
    assert isinstance(first, torch.nn.Linear)
    for _ in range(2):
        w, bias = first.weight.detach().clone(), first.bias.detach().clone()
        step(x, y)
        pre = (x_mb @ w.T + bias).numpy()
        grad_w = np.zeros(w.shape, np.float64)
        for k in range(micro_batches):
            (sent,) = step.received[(Pass.FORWARD, 1, k)]
            (back,) = step.received[(Pass.BACKWARD, 0, k)]
            kept = sent != 0
            masks.append(kept)
            np.testing.assert_allclose(sent[kept], 2 * pre[kept], rtol=1e-5, atol=1e-6)  # scaled 1/(1-p)
            grad_w += (back * kept * 2).T.astype(np.float64) @ x_mb.numpy()
        np.testing.assert_allclose(first.weight.detach().numpy(), w.numpy() - lr * grad_w, rtol=0,
                                   atol=1e-5)
    stacked = np.stack(masks)
    assert abs(stacked.mean() - 0.5) < 4 * np.sqrt(0.25 / stacked.size)  # keep rate 1 - p within 4 sigma
    for i in range(len(masks)):
        for j in range(i):  # independent masks: every micro-batch of every step differs
            assert 0.35 < (masks[i] == masks[j]).mean() < 0.65
