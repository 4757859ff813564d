"""Training memory per rank: the guides' arithmetic, sharding, activations, and the one-line refusal
a step that does not fit gets before anything is compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neuroncore
from neuroncore.frontends.tracing import TraceError
from neuroncore.training.memory import (
    GB,
    MemoryCheckError,
    check_fits,
    training_memory,
    transformer_activations,
)
from neuroncore.training.optimizers import OptimizerKind
from neuroncore.training.precision import Precision


def test_seven_billion_in_bf16_is_the_guides_arithmetic() -> None:
    need = training_memory(7e9, Precision.BF16, OptimizerKind.ADAMW)
    assert need.weights == 14 * GB  # 2 B/param
    assert need.optimizer_state == 56 * GB  # FP32 m + v: 8 B/param
    assert need.master_weights == 28 * GB  # FP32 master copy: 4 B/param
    assert need.gradients == 28 * GB
    assert "weights 14.0 GB" in need.line() and "optimizer state 56.0 GB" in need.line()


def test_seventy_billion_needs_about_700_gb_before_activations() -> None:
    # bf16 weights + FP32 master + FP32 grads + Adam: 2 + 4 + 4 + 8 = 18 B/param ~ the guides' 700 GB+
    assert training_memory(70e9, Precision.BF16, OptimizerKind.ADAMW).total / GB == pytest.approx(1260)
    sr = training_memory(70e9, Precision.BF16_SR, OptimizerKind.ADAMW)  # no master, bf16 grads
    assert sr.total / GB == pytest.approx(840)


def test_sharding_divides_what_it_shards() -> None:
    full = training_memory(7e9, Precision.BF16, OptimizerKind.ADAMW)
    tp = training_memory(7e9, Precision.BF16, OptimizerKind.ADAMW, tp=8)
    assert tp.weights == full.weights // 8 and tp.optimizer_state == full.optimizer_state // 8
    z = training_memory(7e9, Precision.BF16, OptimizerKind.ADAMW, tp=8, dp=4, zero1=True)
    assert z.optimizer_state == pytest.approx(full.optimizer_state / 32, rel=1e-9)
    assert z.master_weights == pytest.approx(full.master_weights / 32, rel=1e-9)
    assert z.weights == tp.weights and z.gradients == tp.gradients  # ZeRO-1 shards only state
    cast = training_memory(1e9, Precision.BF16, OptimizerKind.ADAMW, master_copy=False)
    assert cast.weights == 4 * GB and cast.master_weights == 0  # FP32 weights are the master
    sgd = training_memory(1e9, Precision.FP32, OptimizerKind.SGD, momentum=False)
    assert sgd.optimizer_state == 0 and sgd.weights == 4 * GB


def test_activation_checkpointing_keeps_only_layer_inputs() -> None:
    kw = {"seq_len": 4096, "micro_batch": 1, "hidden": 4096, "layers": 32, "heads": 32}
    full = transformer_activations(**kw)
    ckpt = transformer_activations(**kw, checkpointing=True)
    s, h = 4096, 4096
    assert full == int(32 * s * h * (34 + 5 * 32 * s / h))  # Korthikanti et al. per layer
    assert ckpt < full / 20
    assert ckpt >= 32 * 2 * s * h
    tp_sp = transformer_activations(**kw, tp=8, sequence_parallel=True)
    assert tp_sp == pytest.approx(full / 8, rel=1e-9)
    assert transformer_activations(**kw, pp=4) == pytest.approx(full, rel=0.01)  # 8 layers x 4 in flight


def test_check_fits_is_one_line_with_the_breakdown() -> None:
    need = training_memory(7e9, Precision.BF16, OptimizerKind.ADAMW)
    check_fits(training_memory(1e6, Precision.FP32, OptimizerKind.ADAMW), hbm_bytes=16 * 2**30, what="x")
    with pytest.raises(MemoryCheckError) as info:
        check_fits(need, hbm_bytes=16 * 2**30, what="llama2-7b")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("llama2-7b does not fit: it needs 126.0 GB per rank")
    assert "weights 14.0 GB + master weights 28.0 GB + gradients 28.0 GB + optimizer state 56.0 GB" in message


def test_a_step_that_does_not_fit_stops_before_tracing() -> None:
    with torch.device("meta"):  # 1.6 B parameters, never allocated
        model = torch.nn.Sequential(torch.nn.Linear(40_000, 40_000))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(2, 40_000), torch.randint(0, 4, (2,))
    with pytest.raises(TraceError) as info:
        neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy, instance="trn1.2xlarge")
    message = str(info.value)
    assert "\n" not in message
    assert "Sequential training step does not fit" in message
    assert "optimizer state 12.8 GB" in message and "16.0 GB of HBM" not in message
    assert "of trn1.2xlarge has 17.2 GB of HBM" in message


def test_a_step_that_fits_records_its_breakdown() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    step = neuroncore.trace_train_step(model, torch.optim.AdamW(model.parameters()), (x, y),
                                       loss_fn=F.cross_entropy)
    n = sum(p.numel() for p in model.parameters())
    assert step.memory.weights == 4 * n and step.memory.optimizer_state == 8 * n
    # the backward reads the input, the hidden layer (before and after ReLU) and the log-softmax
    assert step.memory.activations >= 4 * (6 * 8 + 6 * 16)
