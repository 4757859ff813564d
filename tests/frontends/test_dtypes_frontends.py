"""Data types through the frontends: torch and JAX programs in fp16/bf16/fp8, with auto-cast and int8
weight-only quantisation given to ``neuroncore.trace`` (``options=CompilerOptions(...)``).

References are the frameworks' own computations of the same rounding (torch casts, JAX float8).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import neuroncore as nc
from neuroncore.compiler import AutoCast, AutoCastType, CompilerOptions, Quantization
from neuroncore.dtypes import DType
from neuroncore.frontends import TraceError


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.GELU(), torch.nn.Linear(384, 128)).eval()


@pytest.fixture(scope="module")
def mlp_and_input():
    return _mlp(), torch.randn(4, 256, generator=torch.Generator().manual_seed(1))


def _quantised_linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """int8 weight-only as transformers-neuronx runs it: symmetric per-output-channel scales,
    int8 weights dequantised for a bf16 matmul with FP32 accumulation, then the scales and bias."""
    w = layer.weight.detach()
    scale = w.abs().amax(dim=1) / 127
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127)
    return (x.bfloat16().float() @ q.T) * scale + layer.bias.detach()


def test_torch_int8_weight_only_matches_torch_of_the_same_quantisation(mlp_and_input):
    model, x = mlp_and_input
    options = CompilerOptions(auto_cast=AutoCast.MATMULT, quantize=Quantization.INT8_WEIGHT_ONLY)
    traced = nc.trace(model, (x,), options=options)
    got = traced(x)
    with torch.no_grad():
        expected = _quantised_linear(torch.nn.functional.gelu(_quantised_linear(x, model[0])), model[2])
        exact = model(x)
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() < 2e-3 * scale
    assert 1e-3 * scale < (got - exact).abs().max().item() < 5e-2 * scale  # the quantisation shows
    weights = [t.dtype.value for t in traced.program.hbm_tensors.values() if t.kind == "weight"]
    assert weights.count("int8") == 2


def test_torch_fp16_model_matches_torch_fp16():
    model = _mlp().half()
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(2)).half()
    traced = nc.trace(model, (x,))
    got = traced(x)
    assert got.dtype == torch.float16
    with torch.no_grad():
        expected = model(x).float()
        exact = _mlp()(x.float())
    own_error = (expected - exact).abs().max().item()
    assert (got.float() - exact).abs().max().item() <= 2 * own_error + 1e-3


@pytest.mark.parametrize("cast_type", [AutoCastType.FP16, AutoCastType.BF16, AutoCastType.TF32])
def test_torch_auto_cast_all_keeps_fp32_interface_with_the_cast_error(cast_type, mlp_and_input):
    model, x = mlp_and_input
    traced = nc.trace(model, (x,), options=CompilerOptions(auto_cast=AutoCast.ALL, auto_cast_type=cast_type))
    got = traced(x)
    assert got.dtype == torch.float32
    with torch.no_grad():
        exact = model(x)
    err = (got - exact).abs().max().item() / exact.abs().max().item()
    bound = {AutoCastType.BF16: 5e-2, AutoCastType.FP16: 5e-3, AutoCastType.TF32: 5e-3}[cast_type]
    assert 1e-6 < err < bound


def test_trace_refuses_bad_options(mlp_and_input):
    model, x = mlp_and_input
    with pytest.raises(TraceError, match="options must be a CompilerOptions"):
        nc.trace(model, (x,), options="int8-weight-only")  # type: ignore[arg-type]
    with pytest.raises(TraceError, match="auto-cast already"):
        nc.trace(model, (x,), dtype="bf16", options=CompilerOptions(auto_cast=AutoCast.MATMULT))
    # dtype="fp16" (a user's first guess) points at the option that gives it
    with pytest.raises(TraceError, match=r"not 'fp16'; other precisions: options=CompilerOptions\("
                                         r"auto_cast=AutoCast.MATMULT, auto_cast_type=AutoCastType.FP16"):
        nc.trace(model, (x,), dtype="fp16")


@pytest.mark.parametrize("fp8", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_jax_fp8_matmul_runs_double_row_on_trn2_exactly(fp8):
    def f(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32)

    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((8, 384)), fp8)
    b = jnp.asarray(rng.standard_normal((384, 128)), fp8)
    traced = nc.trace(f, (a, b), instance="trn2.48xlarge")
    got = np.asarray(traced(a, b))
    expected = np.asarray(jax.jit(f)(a, b))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    texts = traced.program.operands
    assert any("perf_mode=double_row" in t for t in texts)


def test_jax_auto_cast_fp8_matmult_on_trn2():
    w = np.random.default_rng(4).standard_normal((256, 128)).astype(np.float32)

    def f(x):
        return jax.nn.relu(x @ w)

    x = jnp.asarray(np.random.default_rng(5).standard_normal((16, 256)), jnp.float32)
    options = CompilerOptions(auto_cast=AutoCast.MATMULT, auto_cast_type=AutoCastType.FP8_E4M3)
    traced = nc.trace(f, (x,), instance="trn2.48xlarge", options=options)
    got = np.asarray(traced(x))
    xq = np.asarray(jnp.asarray(x, jnp.float8_e4m3fn), np.float32)
    wq = np.asarray(jnp.asarray(w, jnp.float8_e4m3fn), np.float32)
    np.testing.assert_allclose(got, np.maximum(xq @ wq, 0), rtol=1e-5, atol=1e-4)
    exact = np.maximum(np.asarray(x) @ w, 0)
    assert np.abs(got - exact).max() > 1e-2 * np.abs(exact).max()  # fp8's error is there


def test_jax_bf16_and_fp16_functions_match_jax():
    for dtype in (jnp.bfloat16, jnp.float16):
        w = jnp.asarray(np.random.default_rng(6).standard_normal((128, 64)), dtype)

        def f(x, w=w):
            return jax.nn.gelu(x @ w)

        x = jnp.asarray(np.random.default_rng(7).standard_normal((8, 128)), dtype)
        got = np.asarray(nc.trace(f, (x,))(x), np.float32)
        expected = np.asarray(jax.jit(f)(x), np.float32)
        assert np.abs(got - expected).max() <= 2e-2 * np.abs(expected).max()


@pytest.mark.parametrize("cast_type", [AutoCastType.BF16, AutoCastType.FP16, AutoCastType.TF32])
def test_torch_auto_cast_matmult_casts_convolutions_as_dtype_bf16_does(cast_type):
    """A convolution with a trained kernel is one implicit-GEMM ``convolution`` op: Tensor-engine
    matmuls, which ``--auto-cast matmult`` casts. ``CompilerOptions(auto_cast=MATMULT)`` left them
    in FP32 (a conv net's FP32 result and time at a quarter of the PE rate), while
    ``dtype="bf16"`` cast them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 16, 3, stride=2, padding=1)).eval()
    x = torch.randn(2, 8, 16, 16)
    options = CompilerOptions(auto_cast=AutoCast.MATMULT, auto_cast_type=cast_type)
    traced = nc.trace(model, (x,), options=options)
    convs = [o for o in traced.program.graph.ops if o.opcode == "convolution"]
    assert len(convs) == 2 and all(
        o.dtype is DType.FP32 and [v.dtype for v in o.operands[:2]] == [cast_type.dtype] * 2 for o in convs)
    got = traced(x)
    exact = model(x)
    narrow = {AutoCastType.BF16: torch.bfloat16, AutoCastType.FP16: torch.float16}.get(cast_type)
    if narrow is not None:  # torch: the same convolutions on operands rounded to the type
        def rounded(t: torch.Tensor) -> torch.Tensor:
            return t.to(narrow).float()

        conv2d = torch.nn.functional.conv2d
        with torch.no_grad():
            h = torch.relu(conv2d(rounded(x), rounded(model[0].weight), model[0].bias, padding=1))
            want = conv2d(rounded(h), rounded(model[2].weight), model[2].bias, stride=2, padding=1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert 0 < (got - exact).abs().max() < 0.05
    cast_time = traced.last_result.device_time_ns
    fp32 = nc.trace(model, (x,))
    fp32(x)
    assert cast_time < fp32.last_result.device_time_ns  # 16-bit PE inputs: the full PE rate
    if cast_type is AutoCastType.BF16:
        torch.testing.assert_close(nc.trace(model, (x,), dtype="bf16")(x), got, rtol=0, atol=0)
