"""Data parallel against a single core: the same model trained on the same batch (split over the
replicas, gradients all-reduced and averaged) ends with the same losses and parameters."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuroncore.parallel.dp_train import DataParallelTrainStep
from neuroncore.parallel.training import PlanError
from neuroncore.training import trace_train_step


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


@pytest.mark.parametrize("replicas", [2, 4])
def test_data_parallel_equals_single_core(replicas: int) -> None:
    single_model, dp_model = _model(), _model()
    single_opt = torch.optim.AdamW(single_model.parameters(), lr=1e-2)
    dp_opt = torch.optim.AdamW(dp_model.parameters(), lr=1e-2)
    rng = np.random.default_rng(1)
    batch = 8
    xs = [torch.tensor(rng.standard_normal((batch, 16)), dtype=torch.float32) for _ in range(3)]
    ys = [torch.tensor(rng.standard_normal((batch, 4)), dtype=torch.float32) for _ in range(3)]
    single = trace_train_step(single_model, single_opt, (xs[0], ys[0]), loss_fn=F.mse_loss)
    shard = batch // replicas
    dp = DataParallelTrainStep(dp_model, dp_opt, (xs[0][:shard], ys[0][:shard]), replicas=replicas,
                               loss_fn=F.mse_loss)
    ops = dp.graph.ops
    assert sum(op.opcode == "all-reduce" for op in ops) == len(list(dp_model.parameters()))
    assert any(op.layer.startswith("model/gradient_sync/") for op in ops)
    for x, y in zip(xs, ys):
        a, b = float(single(x, y)), float(dp(x, y))
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
        # every rank holds the same parameters after the update
        for other in dp.rank_outputs[1:]:
            for u, v in zip(dp.rank_outputs[0][1:], other[1:]):
                np.testing.assert_array_equal(u, v)
    for p, q in zip(single_model.parameters(), dp_model.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_data_parallel_errors_are_one_line() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.zeros(2, 16), torch.zeros(2, 4)
    with pytest.raises(PlanError, match="replicas must be a positive integer"):
        DataParallelTrainStep(copy.deepcopy(model), opt, (x, y), replicas=0, loss_fn=F.mse_loss)
    step = DataParallelTrainStep(model, opt, (x, y), replicas=2, loss_fn=F.mse_loss)
    with pytest.raises(PlanError, match=r"input of shape \[4, 16\] expected"):
        step(torch.zeros(2, 16), torch.zeros(2, 4))


def test_a_data_parallel_step_is_timed_and_recorded_on_every_replica(tmp_path) -> None:
    """Each replica's execution is timed (its all-reduces from the instance topology) and recorded,
    with a train_step record whose gradient-sync level is the all-reduces' time. Before, the step
    computed numerics only: no device time, and a wrapped capture said the program ran no compiled
    model (found by the user trials)."""
    from collectors.device_profile import profile
    from formats import open_profile

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    step = DataParallelTrainStep(model, opt, (x[:4], y[:4]), replicas=2, loss_fn=F.mse_loss)
    with profile(tmp_path / "run", sink=step.core.sink) as collector:
        step(x, y)
    assert len(step.rank_results) == 2 and all(r[0].device_time_ns > 0 for r in step.rank_results)
    assert sorted(p.core for p in collector.profiles) == [0, 1]
    rank0 = open_profile(next(p.path for p in collector.profiles if p.core == 0))
    assert rank0.table("CcOp").num_rows == sum(op.opcode == "all-reduce" for op in step.graph.ops)
    row = rank0.table("TrainingStep").to_pylist()[0]
    assert row["gradient_sync_ns"] > 0 and row["global_batch"] == 8
    assert "dp2" in row["layout"]
