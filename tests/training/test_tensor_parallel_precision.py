"""Tensor-parallel training in bf16: ``precision="bf16"`` (bf16 auto-cast: bf16 matmul operands,
FP32 master weights, gradients and optimizer state, each rank holding its block) and ``"bf16-sr"``
(bf16 weights updated with stochastic rounding on every rank) stay within bf16 error of a single
core in the same precision and of FP32 PyTorch after several AdamW steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuroncore.dtypes import DType
from neuroncore.parallel.tp_train import TensorParallelTrainStep
from neuroncore.parallel.training import PlanError
from neuroncore.training import trace_train_step

STEPS, LR = 3, 1e-2


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16),
                               torch.nn.LayerNorm(16), torch.nn.Linear(16, 8))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(1)
    return [(torch.tensor(rng.standard_normal((8, 16)), dtype=torch.float32),
             torch.tensor(rng.standard_normal((8, 8)), dtype=torch.float32)) for _ in range(STEPS)]


@pytest.mark.parametrize("precision", ["bf16", "bf16-sr"])
def test_tp2_in_bf16_stays_within_bf16_error_of_one_core_and_pytorch(precision: str) -> None:
    single_model, tp_model, ref = _mlp(), _mlp(), _mlp()
    x0, y0 = _batches()[0]
    single = trace_train_step(single_model, torch.optim.AdamW(single_model.parameters(), lr=LR),
                              (x0, y0), loss_fn=F.mse_loss, precision=precision)
    step = TensorParallelTrainStep(tp_model, torch.optim.AdamW(tp_model.parameters(), lr=LR), (x0, y0),
                                   tp=2, loss_fn=F.mse_loss, precision=precision)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    graph = step.rank_program.graph
    # every matmul reads bf16 operands and accumulates in FP32; the weights are split as in FP32
    dots = [op for op in graph.ops if op.opcode == "dot"]
    assert dots and all(o.dtype is DType.BF16 for op in dots for o in op.operands)
    assert str(step.split_of("0.weight")) == "Split(dim=0, outer=1)"
    params = {op.name: op.dtype for op in graph.parameters if op.name.startswith("param/")}
    assert set(params.values()) == ({DType.BF16} if precision == "bf16-sr" else {DType.FP32})
    assert all(m.stochastic_rounding is (precision == "bf16-sr") for m in step.rank_models)
    for x, y in _batches():
        a, b = float(single(x, y)), float(step(x, y))
        ref_opt.zero_grad()
        expected = F.mse_loss(ref(x), y)
        expected.backward()
        ref_opt.step()
        assert b == pytest.approx(a, rel=2e-2) and b == pytest.approx(float(expected.detach()), rel=2e-2)
    # AdamW moves a weight by about lr per step: a gradient whose sign bf16 flips costs steps * lr
    for other in (single_model, ref):
        diffs = torch.cat([(p - q).detach().abs().reshape(-1)
                           for p, q in zip(tp_model.parameters(), other.parameters())])
        assert float(diffs.max()) <= STEPS * LR + 2**-8
        assert float(diffs.mean()) < 2e-3
    # a replicated weight (the LayerNorm's) stays identical on every rank, rounding included
    for name in ("param/3.weight", "param/3.bias", "state/3.weight/exp_avg"):
        np.testing.assert_array_equal(step.rank_states[0].tensors[name], step.rank_states[1].tensors[name])
    if precision == "bf16":  # the host's parameters are the FP32 masters, not their bf16 copies
        assert any(not torch.equal(p.detach(), p.detach().to(torch.bfloat16).float())
                   for p in tp_model.parameters())
    else:
        assert all(torch.equal(p.detach(), p.detach().to(torch.bfloat16).float())
                   for p in tp_model.parameters())


def test_tp_precision_is_checked_in_one_line() -> None:
    model = _mlp()
    with pytest.raises(PlanError, match="precision must be one of fp32, bf16, bf16-sr; not 'fp8'") as info:
        TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters()), _batches()[0], tp=2,
                                loss_fn=F.mse_loss, precision="fp8")
    assert "\n" not in str(info.value)


def test_tp_step_places_only_each_ranks_blocks() -> None:
    """The whole step program is never compiled nor its state placed: core 0 holds rank 0's
    program only, and the step's memory breakdown is one rank's (1/tp of the split weights)."""
    model = _mlp()
    step = TensorParallelTrainStep(model, torch.optim.AdamW(model.parameters(), lr=LR), _batches()[0],
                                   tp=2, loss_fn=F.mse_loss)
    core = step.instance.core(0)
    assert [m.program for m in core.models] == [step.rank_program]
    assert step.program is step.rank_program and not step.programs
    total = sum(p.numel() for p in model.parameters())
    assert step.memory.weights == total * 4 // 2
    assert step.memory.optimizer_state == total * 8 // 2
