"""ZeRO-1 against a single core, data parallelism and PyTorch: the same model trained on the same
batch (split over the ranks, gradients reduce-scattered, the optimizer on each rank's shard, the
parameters all-gathered) ends with the same losses, parameters and optimizer state."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuroncore.dtypes import DType
from neuroncore.parallel.dp_train import DataParallelTrainStep
from neuroncore.parallel.training import PlanError
from neuroncore.parallel.zero1_train import ZeroOneTrainStep
from neuroncore.training import trace_train_step

BATCH, RANKS = 8, 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 5))  # 5 outputs: 16*32+32+64+32*5+5 = 773, odd


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(1)
    return [(torch.tensor(rng.standard_normal((BATCH, 16)), dtype=torch.float32),
             torch.tensor(rng.standard_normal((BATCH, 5)), dtype=torch.float32)) for _ in range(3)]


def _adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def test_zero1_equals_single_core_dp_and_torch() -> None:
    batches = _batches()
    models = [_model() for _ in range(4)]
    opts = [_adamw(m) for m in models]
    x0, y0 = batches[0]
    single = trace_train_step(models[0], opts[0], (x0, y0), loss_fn=F.mse_loss)
    shard = BATCH // RANKS
    dp = DataParallelTrainStep(models[1], opts[1], (x0[:shard], y0[:shard]), replicas=RANKS,
                               loss_fn=F.mse_loss)
    zero = ZeroOneTrainStep(models[2], opts[2], (x0[:shard], y0[:shard]), ranks=RANKS,
                            loss_fn=F.mse_loss)
    ops = [op for per_group in zero.update_programs[0] for op in per_group[0].program.graph.ops]
    assert sum(op.opcode == "reduce-scatter" for op in ops) == 1
    assert sum(op.opcode == "all-gather" for op in ops) == 1
    for x, y in batches:
        a, b, c = float(single(x, y)), float(dp(x, y)), float(zero(x, y))
        opts[3].zero_grad()
        d = F.mse_loss(models[3](x), y)
        d.backward()
        opts[3].step()
        assert c == pytest.approx(a, rel=1e-5, abs=1e-6)
        assert c == pytest.approx(b, rel=1e-5, abs=1e-6)
        assert c == pytest.approx(float(d.detach()), rel=1e-5, abs=1e-6)
        # every rank holds the same full parameters after the all-gather
        for other in zero.rank_states[1:]:
            for name in (f"param/{n}" for n in zero.param_names):
                np.testing.assert_array_equal(other.tensors[name], zero.rank_states[0].tensors[name])
    for ref in (models[0], models[1], models[3]):
        for p, q in zip(ref.parameters(), models[2].parameters()):
            np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)
    # the optimizer state assembled on the host from the shards equals PyTorch's own
    for p, q in zip(models[3].parameters(), models[2].parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(opts[2].state[q][key].numpy(), opts[3].state[p][key].numpy(),
                                       rtol=1e-5, atol=1e-7)
        assert float(opts[2].state[q]["step"]) == 3.0
    # every rank's executions are recorded: the gradient program, then the update with its two
    # collectives timed by neuroncore.collectives (they take time and sit inside the update)
    for results in zero.rank_results:
        assert len(results) == 2
        assert results[0].end_ns <= results[1].start_ns
    update = zero.rank_results[0][1]
    program = update.program
    assert len(program.collective_nodes) == 2
    for node in program.collective_nodes:
        assert update.timeline.end_ns[node] - update.timeline.start_ns[node] > 0
    assert zero.step_time_ns >= update.end_ns - update.start_ns > 0
    assert zero.rank_results[1][1].start_ns == update.start_ns  # the ranks enter the update together
    # each rank holds only its shard of the optimizer state: m and v of ceil(773 / 2) elements
    total = sum(p.numel() for p in models[2].parameters())
    assert total == 773
    for r in range(RANKS):
        assert zero.optimizer_state_elements(r) == 2 * (-(-total // RANKS))
        assert not any(k.startswith("state/") for k in zero.rank_states[r].tensors)


def test_zero1_sgd_momentum_equals_torch() -> None:
    batches = _batches()
    ours, ref = _model(), _model()
    opt = torch.optim.SGD(ours.parameters(), lr=5e-2, momentum=0.9, weight_decay=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=5e-2, momentum=0.9, weight_decay=0.01)
    x0, y0 = batches[0]
    zero = ZeroOneTrainStep(ours, opt, (x0[:BATCH // RANKS], y0[:BATCH // RANKS]), ranks=RANKS,
                            loss_fn=F.mse_loss)
    for x, y in batches:
        loss = float(zero(x, y))
        ref_opt.zero_grad()
        want = F.mse_loss(ref(x), y)
        want.backward()
        ref_opt.step()
        assert loss == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-6)
    for p, q in zip(ref.parameters(), ours.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_zero1_errors_are_one_line() -> None:
    model = _model()
    opt = _adamw(model)
    x, y = torch.zeros(2, 16), torch.zeros(2, 5)
    with pytest.raises(PlanError, match="ranks must be a positive integer"):
        ZeroOneTrainStep(copy.deepcopy(model), opt, (x, y), ranks=0, loss_fn=F.mse_loss)
    step = ZeroOneTrainStep(model, opt, (x, y), ranks=2, loss_fn=F.mse_loss)
    with pytest.raises(PlanError, match=r"input of shape \[4, 16\] expected"):
        step(torch.zeros(2, 16), torch.zeros(2, 5))


@pytest.mark.parametrize("precision", ["bf16", "bf16-sr"])
def test_zero1_in_bf16_stays_within_bf16_error_of_one_core(precision: str) -> None:
    """bf16: bf16 parameters for the forward, FP32 master weights sharded with the optimizer state,
    bf16 all-gather; bf16-sr: bf16 parameters only, the update rounded stochastically. Against a
    single core in the same precision: bf16 error (AdamW moves a weight by about lr per step, so a
    gradient whose sign bf16 flips costs up to steps * lr)."""
    batches = _batches()
    single_model, zero_model = _model(), _model()
    single_opt, zero_opt = _adamw(single_model), _adamw(zero_model)
    x0, y0 = batches[0]
    single = trace_train_step(single_model, single_opt, (x0, y0), loss_fn=F.mse_loss, precision=precision)
    zero = ZeroOneTrainStep(zero_model, zero_opt, (x0[:BATCH // RANKS], y0[:BATCH // RANKS]),
                            ranks=RANKS, loss_fn=F.mse_loss, precision=precision)
    for x, y in batches:
        assert float(zero(x, y)) == pytest.approx(float(single(x, y)), rel=2e-2)
    diffs = torch.cat([(p - q).abs().reshape(-1)
                       for p, q in zip(single_model.parameters(), zero_model.parameters())])
    assert float(diffs.max()) <= 3 * 1e-2 + 2**-8
    assert float(diffs.mean()) < 2e-3
    update = zero.update_programs[0][0][0]
    gathers = [op for op in update.program.graph.ops if op.opcode == "all-gather"]
    assert [op.dtype for op in gathers] == [DType.BF16]  # half the bytes of an FP32 all-gather
    assert update.stochastic_rounding is (precision == "bf16-sr")
    params = [op for op in zero.grad_programs[0].program.graph.parameters if op.name.startswith("param/")]
    assert {op.dtype for op in params} == {DType.BF16}
    total = sum(p.numel() for p in zero_model.parameters())
    masters = [k for k in zero.rank_states[0].tensors if k.endswith("/master")]
    if precision == "bf16":
        assert masters and all(zero.rank_states[r].tensors[masters[0]].size == -(-total // RANKS)
                               for r in range(RANKS))
        # the host's parameters are the FP32 masters, not their bf16 copies
        rounded = [p for p in zero_model.parameters()
                   if not torch.equal(p.detach(), p.detach().to(torch.bfloat16).float())]
        assert rounded
    else:
        assert not masters
