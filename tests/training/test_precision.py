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


def _weighted_sum(out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (out * weights).sum()


SIXTEEN_BIT_OPTIMIZERS = {
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, eps=1e-4), 0),
    "adam_l2": (lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, eps=1e-4), 0),
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=1e-2), 0),
    # torch's CPU add computes ``a + alpha * b`` fused (one rounding), the core in two: a tie in
    # the last place can round the other way (a few of 144 elements, one 16-bit gap)
    "sgd_nesterov_wd": (lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True,
                                                   weight_decay=0.1), 12),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(SIXTEEN_BIT_OPTIMIZERS))
def test_a_model_in_bf16_or_fp16_is_updated_as_pytorch_updates_it(dtype: torch.dtype, name: str) -> None:
    """``model.to(torch.bfloat16)`` (or fp16) trained without FP32 master weights: torch keeps the
    optimizer state in the parameters' type and rounds every in-place op of its update to it, and
    its ``add`` rounds ``alpha`` (SGD's ``-lr``) to that type too. The step does the same (before:
    ``GraphError: multiply: dtypes differ (bf16 vs fp32)`` while the step was built). The
    gradients here are exact in 16 bits (integer inputs and loss weights), so only the update
    rounds: AdamW, Adam and SGD give torch's bits after 4 steps (an FP32 update rounded once
    differs in most elements), the state is of the parameters' type on the host and the device,
    and the memory counts 2-byte weights, gradients and state."""
    make, allowed = SIXTEEN_BIT_OPTIMIZERS[name]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 16).to(dtype)
    ref = copy.deepcopy(model)
    opt, ref_opt = make(model.parameters()), make(ref.parameters())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(-3, 4, (4, 8), generator=g).to(dtype),
                torch.randint(-2, 3, (4, 16), generator=g).to(dtype)) for _ in range(4)]
    step = neuroncore.trace_train_step(model, opt, batches[0], loss_fn=_weighted_sum)
    for x, w in batches:
        loss = step(x, w)
        expected = _weighted_sum(ref(x), w)
        magnitude = float((ref(x) * w).abs().float().sum())  # the sum cancels: bound by its terms
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert float(loss) == pytest.approx(float(expected), abs=2 ** -7 * magnitude)
    differ = sum(int((p != q).sum()) for p, q in zip(model.parameters(), ref.parameters()))
    assert differ <= allowed, differ
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.dtype == dtype
        for got, want_value in [(p, q), *((opt.state[p][k], v) for k, v in ref_opt.state[q].items()
                                          if k != "step")]:
            assert got.dtype == dtype
            # at most one 16-bit gap of the tensor's largest value (bf16: 2^-7 relative)
            torch.testing.assert_close(got, want_value, rtol=0, atol=2 ** -7 * float(want_value.abs().max()))
    want = DType.BF16 if dtype is torch.bfloat16 else DType.FP16
    held = {op.name: op.dtype for op in step.graph.parameters}
    assert {d for n, d in held.items() if n.startswith("state/")} <= {want}
    n = sum(p.numel() for p in model.parameters())
    state_bytes = 0 if name == "sgd" else (2 if name.startswith("adam") else 1) * 2 * n
    memory = step.memory
    assert (memory.weights, memory.gradients, memory.optimizer_state) == (2 * n, 2 * n, state_bytes)


def test_a_bf16_model_accumulates_its_gradients_in_bf16() -> None:
    """With ``accumulation_steps=2`` the bf16 model's gradient buffers are bf16, as ``.grad`` is
    (before: the FP32 buffer and the bf16 gradient could not be added)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = model.to(torch.bfloat16)
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 16, generator=g).bfloat16(), torch.randint(0, 4, (16,), generator=g)
    step = neuroncore.trace_train_step(model, opt, (x[:8], y[:8]), loss_fn=F.cross_entropy,
                                       accumulation_steps=2)
    loss = step(x, y)
    total = 0.0
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        part = F.cross_entropy(ref(xm), ym) / 2
        part.backward()
        total += float(part)
    ref_opt.step()
    assert float(loss) == pytest.approx(total, rel=2e-2)
    held = {op.name: op.dtype for op in step.graph.parameters}
    assert {d for n, d in held.items() if n.startswith("grad/")} == {DType.BF16}
    for p, q in zip(model.parameters(), ref.parameters()):
        assert float((p.float() - q.float()).abs().max()) < 2e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_clipping_a_16_bit_models_gradients_gives_torchs_bits(dtype: torch.dtype) -> None:
    """``max_grad_norm`` on a bf16/fp16 model scales its gradients as
    ``torch.nn.utils.clip_grad_norm_`` does on them: per-gradient norms, their norm, the
    coefficient and the products each rounded to the 16-bit type. Before, the norm, coefficient and
    products stayed FP32: hundreds of the 2,336 elements here one 16-bit step off."""
    from neuroncore.training.torch_step import clip_grad_norm

    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    for seed, max_norm in ((0, 0.5), (1, 3.0), (2, 100.0)):  # 100: the coefficient clamps to 1
        g = torch.Generator().manual_seed(seed)
        grads = [(torch.randn(shape, generator=g) * scale).to(dtype)
                 for shape, scale in (((64, 32), 0.3), ((32,), 2.0), ((16, 8), 0.05))]
        b = GraphBuilder("clip")
        ops = [b.parameter(f"g{i}", tuple(t.shape), name) for i, t in enumerate(grads)]
        outs = clip_grad_norm(b, ops, max_norm)
        assert all(o.dtype is DType(name) for o in outs)
        program = neuroncore.compile(b.build(outs), "trn1")
        result = neuroncore.Instance("trn1.2xlarge").core(0).load(program).execute(
            [t.float().numpy() for t in grads])
        params = [torch.nn.Parameter(torch.zeros_like(t)) for t in grads]
        for p, t in zip(params, grads):
            p.grad = t.clone()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        for out, p in zip(result.outputs, params):
            got = torch.from_numpy(np.asarray(out, np.float32)).to(dtype)
            assert torch.equal(got, p.grad), (seed, max_norm)
