"""Mixed precision as Trainium trains: bf16 auto-cast (FP32 master weights and optimizer state)
within bf16 error of FP32 PyTorch, and bf16 weights updated with stochastic rounding, whose
expected value is the FP32 update (seeded statistics, so the test repeats exactly)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neuroncore
from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.training.precision import Precision, parse_precision


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("precision", ["bf16", "bf16-sr"])
def test_bf16_steps_stay_within_bf16_error_of_fp32_pytorch(precision: str) -> None:
    model = _mlp()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    step = neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy, precision=precision)
    for _ in range(3):
        loss = float(step(x, y))
        expected = F.cross_entropy(ref(x), y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected), rel=2e-2)  # bf16 has 8 bits of mantissa
    # AdamW moves a weight by about lr per step whatever its gradient's size, so a gradient whose
    # sign bf16 flips moves it the other way: bounded by steps * lr (+ one bf16 gap), rare on average
    diffs = torch.cat([(p - q).abs().reshape(-1) for p, q in zip(model.parameters(), ref.parameters())])
    assert float(diffs.max()) <= 3 * 1e-2 + 2**-8
    assert float(diffs.mean()) < 2e-3
    weights = [op for op in step.graph.parameters if op.name.startswith("param/")]
    held = DType.BF16 if precision == "bf16-sr" else DType.FP32  # master weights stay FP32 in bf16
    assert {op.dtype for op in weights} == {held}
    state = [op for op in step.graph.parameters if op.name.startswith("state/")]
    assert {op.dtype for op in state} == {DType.FP32}
    assert any(op.opcode == "dot" and op.operands[0].dtype is DType.BF16 for op in step.graph.ops)


def test_precision_names() -> None:
    assert parse_precision("bf16+sr") is Precision.BF16_SR and parse_precision("FP32") is Precision.FP32
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, bf16-sr"):
        parse_precision("fp8")


def test_stochastic_rounding_is_unbiased() -> None:
    """x = 1 + 2^-10 lies between the bf16 neighbours 1 and 1 + 2^-7: round-to-nearest always gives
    1; stochastic rounding gives 1 + 2^-7 with probability 1/8, so the mean is x."""
    b = GraphBuilder("sr")
    x = b.parameter("x", (128, 64))
    program = neuroncore.compile(b.build([b.convert(x, DType.BF16)]), neuroncore.NC_V2)
    model = neuroncore.Instance("trn1.2xlarge").core(0).load(program)
    value = np.float32(1 + 2**-10)
    inputs = [np.full((128, 64), value, np.float32)]
    nearest = np.asarray(model.execute(inputs).outputs[0], np.float32)
    assert np.all(nearest == 1.0)
    model.stochastic_rounding = True
    rounded = np.asarray(model.execute(inputs).outputs[0], np.float32)
    assert set(np.unique(rounded)) == {1.0, np.float32(1 + 2**-7)}
    n = rounded.size
    sigma = 2**-7 * np.sqrt(0.125 * 0.875 / n)
    assert abs(rounded.mean() - value) < 4 * sigma  # the mean is the FP32 value
    assert abs(nearest.mean() - value) > 20 * sigma  # round-to-nearest: biased by 2^-10, 34 sigma


class Drift(torch.nn.Module):
    """loss = sum(w * x): with x = 1 every weight's gradient is 1."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum()


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_small_bf16_updates_survive_only_with_stochastic_rounding(enabled: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SGD steps of 2^-10 on weights at 1.0, a quarter of bf16's gap below 1 (2^-8): rounded to
    nearest every update is lost; rounded stochastically the weights follow FP32 on average."""
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_EN", enabled)
    model = Drift()
    opt = torch.optim.SGD(model.parameters(), lr=2**-10)
    x = torch.ones(32, 32)
    step = neuroncore.trace_train_step(model, opt, (x,), precision="bf16-sr")
    for _ in range(8):
        step(x)
    w = model.w.detach().numpy()
    fp32 = 1 - 8 * 2**-10
    if enabled == "1":
        assert abs(w.mean() - fp32) < 5e-4  # per-weight spread ~2^-8 / sqrt(1024)
        assert len(np.unique(w)) > 1
    else:
        assert np.all(w == 1.0)


def test_compiler_auto_cast_options_apply_to_a_step() -> None:
    """The model-coverage work's compiler options (auto-cast mode and type) reach the step program:
    matmuls in fp16 stay within fp16 error of FP32 PyTorch; weight quantisation is refused."""
    from neuroncore.compiler.options import AutoCast, AutoCastType, CompilerOptions, Quantization
    from neuroncore.frontends.tracing import TraceError

    model = _mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    fp16 = CompilerOptions(auto_cast=AutoCast.MATMULT, auto_cast_type=AutoCastType.FP16)
    step = neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy, options=fp16)
    assert any(op.opcode == "dot" and op.operands[0].dtype is DType.FP16 for op in step.program.graph.ops)
    for _ in range(2):
        loss = float(step(x, y))
        expected = F.cross_entropy(ref(x), y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss == pytest.approx(float(expected), rel=2e-3)
    with pytest.raises(TraceError, match="quantize=int8-weight-only is for inference"):
        neuroncore.trace_train_step(model, opt, (x, y), loss_fn=F.cross_entropy,
                                    options=CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY))
