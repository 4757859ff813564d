"""Data types end to end: storage rounding, matmul numerics per dtype, per-dtype Tensor-engine costs
(FP8 double-row on NC-v3), auto-cast options and int8 weight-only quantisation.

References are independent NumPy/torch computations of the same rounding: inputs rounded to the
type (ml_dtypes / torch casts), products accumulated in FP32, the result rounded to its type.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import neuroncore as nc
from neuroncore.compiler import (
    AutoCast,
    AutoCastType,
    CompileError,
    CompilerOptions,
    OptionsError,
    Quantization,
    costs,
)
from neuroncore.compiler.lowering_state import HbmTensorKind
from neuroncore.compiler.node_semantics import Load, LoadKTiled
from neuroncore.compiler.precision import quantize_int8
from neuroncore.dtypes import DType, as_dtype, round_to, to_storage
from neuroncore.hardware import NC_V2, NC_V3
from neuroncore.workloads import WORKLOADS, random_inputs

REPO = Path(__file__).resolve().parents[2]
INSTANCES = {"trn1": "trn1.2xlarge", "trn2": "trn2.48xlarge"}
NUMPY_TYPES = {DType.BF16: ml_dtypes.bfloat16, DType.FP16: np.float16,
               DType.FP8_E4M3: ml_dtypes.float8_e4m3fn, DType.FP8_E5M2: ml_dtypes.float8_e5m2}


def _run(program, inputs, target="trn1"):
    return nc.Instance(INSTANCES[target], sink=nc.EventSink()).core(0).load(program).execute(inputs)


def _rounded(values, dtype):
    """``values`` in ``dtype`` as FP32, by a cast independent of neuroncore.dtypes."""
    if dtype is DType.FP32:
        return values.astype(np.float32)
    if dtype is DType.TF32:  # drop 13 mantissa bits, round to nearest even, by integer arithmetic
        bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) >> 13) << 13
        return rounded.astype(np.uint32).view(np.float32)
    return values.astype(NUMPY_TYPES[dtype]).astype(np.float32)


def _matmul_graph(m, k, n, dtype, out_dtype=None):
    b = nc.GraphBuilder("mm")
    out = b.dot(b.parameter("a", (m, k), dtype), b.parameter("b", (k, n), dtype), out_dtype=out_dtype)
    return b.build([out])


def _pe_ns(program):
    """PE time and count of the MultiplyMoving instructions that multiply (not PE transposes)."""
    ops = np.asarray(program.opcodes)[program.opcode_id]
    regular = np.asarray([t == "REGULAR" for t in program.tensor_instruction_type])
    chosen = (ops == "MATMUL") & regular
    return float(program.cost_ns[chosen].sum()), int(chosen.sum())


def _weight_dma_bytes(program):
    total = 0
    for node, sem in enumerate(program.semantics):
        if isinstance(sem, (Load, LoadKTiled)):
            tensor = program.hbm_tensors.get(sem.src.tensor)
            if tensor is not None and tensor.kind is HbmTensorKind.WEIGHT:
                total += int(program.dma_bytes[node])
    return total


# -- storage ---------------------------------------------------------------------------------------


def test_new_dtypes_spellings_sizes_and_storage_types():
    assert [as_dtype(s) for s in ("fp8_e4m3", "float8_e4m3fn", "fp8_e5m2", "tf32", "int8", "s8")] == [
        DType.FP8_E4M3, DType.FP8_E4M3, DType.FP8_E5M2, DType.TF32, DType.INT8, DType.INT8]
    assert [d.itemsize for d in (DType.FP8_E4M3, DType.FP8_E5M2, DType.INT8, DType.TF32)] == [1, 1, 1, 4]
    assert DType.FP8_E4M3.is_float and DType.FP8_E4M3.is_fp8 and not DType.INT8.is_float
    assert to_storage(np.array([1.0, 2.0], np.float32), DType.FP8_E4M3).dtype == ml_dtypes.float8_e4m3fn
    with pytest.raises(ValueError, match=r"supported: .*fp8_e4m3"):
        as_dtype("fp4")


def test_rounding_matches_torch_casts_and_saturates():
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 40
    for dtype, torch_dtype, limit in ((DType.FP8_E4M3, torch.float8_e4m3fn, 448.0),
                                      (DType.FP8_E5M2, torch.float8_e5m2, 57344.0)):
        clipped = torch.from_numpy(np.clip(x, -limit, limit))
        expected = clipped.to(torch_dtype).float().numpy()
        np.testing.assert_array_equal(round_to(x, dtype), expected)
    assert round_to(np.array([1e4, -1e4], np.float32), DType.FP8_E4M3).tolist() == [448.0, -448.0]
    np.testing.assert_array_equal(round_to(x, DType.TF32), _rounded(x, DType.TF32))
    assert round_to(np.array([3.6, -200.0, 126.5], np.float32), DType.INT8).tolist() == [4.0, -127.0, 126.0]
    # TF32 keeps FP32's exponent range (bf16 would too) but 10 mantissa bits (bf16 has 7)
    tf32_err = np.abs(round_to(x, DType.TF32) - x).max() / np.abs(x).max()
    bf16_err = np.abs(round_to(x, DType.BF16) - x).max() / np.abs(x).max()
    assert 0 < tf32_err < bf16_err / 4


# -- matmul numerics per dtype ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype,target", [
    (DType.FP32, "trn1"), (DType.BF16, "trn1"), (DType.FP16, "trn2"), (DType.TF32, "trn1"),
    (DType.FP8_E4M3, "trn2"), (DType.FP8_E5M2, "trn2"), (DType.FP8_E4M3, "trn1"),
])
def test_matmul_numerics_per_dtype(dtype, target):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 320)).astype(np.float32)
    w = rng.standard_normal((320, 200)).astype(np.float32)
    out_dtype = DType.FP32 if dtype.is_fp8 else None  # FP8 matmuls give a wide result (PSUM is FP32)
    program = nc.compile(_matmul_graph(16, 320, 200, dtype, out_dtype), target)
    got = _run(program, [a, w], target).outputs[0].astype(np.float32)
    product = torch.from_numpy(_rounded(a, dtype)) @ torch.from_numpy(_rounded(w, dtype))
    expected = _rounded(product.numpy(), out_dtype or dtype)
    scale = np.abs(expected).max()
    tolerance = {DType.FP32: 1e-5, DType.TF32: 1e-3}.get(out_dtype or dtype, 1e-2)
    assert np.abs(got - expected).max() <= tolerance * scale
    # and the rounding is really there: the result is not the FP32 product
    if dtype is not DType.FP32:
        assert np.abs(got - a @ w).max() > 1e-4 * scale


def test_int8_matmul_is_refused_with_one_line():
    b = nc.GraphBuilder("int8")
    out = b.add_op("dot", [b.parameter("a", (8, 128), "int8"), b.parameter("b", (128, 8), "int8")],
                   (8, 8), "fp32", lhs_contract=1, rhs_contract=0, batch_dims=0)
    with pytest.raises(CompileError, match=r"integer matmul cannot be placed.*INT8_WEIGHT_ONLY") as info:
        nc.compile(b.build([out]), "trn2")
    assert "\n" not in str(info.value)


# -- costs follow the data path per dtype -----------------------------------------------------------


def test_fp8_matmul_runs_at_twice_the_bf16_rate_on_nc_v3_only():
    """NC-v3 double-row FP8: K=256 per MultiplyMoving in the time of a K=128 BF16 one (158 vs 79
    TFLOPS); NC-v2 runs cFP8 at the BF16 rate (190 TFLOPS per chip for both); FP32 is 4x slower."""
    m, k, n = 128, 1024, 512
    pe = {}
    for target in ("trn1", "trn2"):
        for dtype in (DType.BF16, DType.FP8_E4M3, DType.FP32):
            program = nc.compile(_matmul_graph(m, k, n, dtype, DType.FP32), target)
            pe[target, dtype] = (*_pe_ns(program), int(program.raw_flops.sum()),
                                 int(program.adjusted_flops.sum()))
    flops = 2 * m * k * n
    for target in ("trn1", "trn2"):
        assert all(pe[target, d][2] == flops for d in (DType.BF16, DType.FP8_E4M3, DType.FP32))
        assert pe[target, DType.FP32][0] == pytest.approx(4 * pe[target, DType.BF16][0])
    assert pe["trn2", DType.FP8_E4M3][0] == pytest.approx(pe["trn2", DType.BF16][0] / 2)
    assert pe["trn2", DType.FP8_E4M3][1] == pe["trn2", DType.BF16][1] // 2  # half the MATMULs
    assert pe["trn1", DType.FP8_E4M3][:2] == pe["trn1", DType.BF16][:2]
    # the PE rate the program reaches on FP8 on trn2 is the 157 TFLOPS double-row peak
    assert flops / pe["trn2", DType.FP8_E4M3][0] * 1e9 == pytest.approx(NC_V3.pe_peak_fp8_flops_per_s)
    assert NC_V3.pe_peak_fp8_flops_per_s == 2 * NC_V3.pe_peak_bf16_flops_per_s
    assert NC_V2.pe_peak_fp8_flops_per_s == NC_V2.pe_peak_bf16_flops_per_s
    # adjusted (BF16-equivalent) FLOPs, neuroncore.md §3.6: FP8 x0.5 on Trn2, x1 on Trn1
    assert pe["trn2", DType.FP8_E4M3][3] == flops // 2 and pe["trn1", DType.FP8_E4M3][3] == flops
    assert costs.contraction_per_matmul(NC_V3, DType.FP8_E5M2) == 256
    assert costs.contraction_per_matmul(NC_V2, DType.FP8_E5M2) == 128


def test_fp8_double_row_pairs_k_tiles_and_shows_in_the_instruction_text():
    program = nc.compile(_matmul_graph(8, 384, 64, DType.FP8_E4M3, DType.FP32), "trn2")
    texts = [t for t, o, kind in zip(program.operands, np.asarray(program.opcodes)[program.opcode_id],
                                     program.tensor_instruction_type) if o == "MATMUL" and kind == "REGULAR"]
    assert [("double_row" in t) for t in texts] == [True, False]  # K = 384 = 256 + 128
    assert "fp8e4" in texts[0] and "256x8x64" in texts[0]


def test_dma_bytes_follow_the_element_width():
    for dtype, width in ((DType.FP32, 4), (DType.BF16, 2), (DType.FP8_E4M3, 1)):
        program = nc.compile(_matmul_graph(128, 256, 512, dtype, DType.FP32), "trn2")
        loads = sum(int(program.dma_bytes[i]) for i, s in enumerate(program.semantics)
                    if isinstance(s, (Load, LoadKTiled)))
        assert loads == (128 * 256 + 256 * 512) * width


# -- auto-cast options ---------------------------------------------------------------------------


def _mlp_graph():
    b = nc.GraphBuilder("mlp")
    x = b.parameter("x", (32, 256))
    h = b.gelu(b.matmul(x, b.weight("w1", (256, 384))))
    return b.build([b.matmul(h, b.weight("w2", (384, 128)))])


@pytest.fixture(scope="module")
def mlp_inputs():
    return [np.random.default_rng(3).standard_normal((32, 256)).astype(np.float32)]


@pytest.fixture(scope="module")
def mlp_fp32(mlp_inputs):
    graph = _mlp_graph()
    return graph, nc.run_reference(graph, mlp_inputs)[0]


@pytest.mark.parametrize("cast_type,low,high", [
    (AutoCastType.BF16, 1e-4, 3e-2), (AutoCastType.FP16, 1e-5, 4e-3), (AutoCastType.TF32, 1e-5, 4e-3),
    (AutoCastType.FP8_E4M3, 1e-2, 0.2),
])
def test_auto_cast_matmult_error_is_the_cast_types(cast_type, low, high, mlp_fp32, mlp_inputs):
    graph, exact = mlp_fp32
    options = CompilerOptions(auto_cast=AutoCast.MATMULT, auto_cast_type=cast_type)
    program = nc.compile(graph, "trn2", options)
    dots = [op for op in program.graph.ops if op.opcode == "dot"]
    assert all(op.dtype is DType.FP32 and {o.dtype for o in op.operands} == {cast_type.dtype}
               for op in dots)
    out = _run(program, mlp_inputs, "trn2").outputs[0]
    assert out.dtype == np.float32  # the interface keeps its FP32 types
    # the core computes the rewritten graph (up to one ulp of the cast type where FP32 accumulation
    # order flips a rounding of the hidden activations)
    reference = nc.run_reference(program.graph, mlp_inputs)[0]
    assert np.abs(out - reference).max() <= 1e-2 * np.abs(reference).max()
    err = np.abs(out - exact).max() / np.abs(exact).max()
    assert low < err < high
    weights = [t.dtype for t in program.hbm_tensors.values() if t.kind is HbmTensorKind.WEIGHT]
    assert weights == [cast_type.dtype] * 2  # weight casts folded: stored in the cast type


def test_auto_cast_matmult_bf16_equals_the_builders_autocast(mlp_inputs):
    b = nc.GraphBuilder("mlp", autocast="bf16")
    x = b.parameter("x", (32, 256))
    h = b.gelu(b.matmul(x, b.weight("w1", (256, 384))))
    built = b.build([b.matmul(h, b.weight("w2", (384, 128)))])
    options = CompilerOptions(auto_cast=AutoCast.MATMULT)
    ours = _run(nc.compile(_mlp_graph(), "trn1", options), mlp_inputs).outputs[0]
    np.testing.assert_array_equal(ours, _run(nc.compile(built, "trn1"), mlp_inputs).outputs[0])


def test_auto_cast_all_computes_in_the_type_and_keeps_the_interface(mlp_fp32, mlp_inputs):
    graph, exact = mlp_fp32
    program = nc.compile(graph, "trn1", CompilerOptions(auto_cast=AutoCast.ALL))
    assert program.graph.parameters[0].dtype is DType.FP32
    assert next(op for op in program.graph.ops if op.opcode == "gelu").dtype is DType.BF16
    assert program.graph.outputs[0].dtype is DType.FP32
    out = _run(program, mlp_inputs).outputs[0]
    assert out.dtype == np.float32
    err = np.abs(out - exact).max() / np.abs(exact).max()
    assert 1e-4 < err < 5e-2
    matmult = _run(nc.compile(graph, "trn1", CompilerOptions(auto_cast=AutoCast.MATMULT)),
                   mlp_inputs).outputs[0]
    assert not np.array_equal(out, matmult)  # the GELU ran in bf16 too


def test_auto_cast_costs_follow_the_cast_type(mlp_fp32):
    graph, _ = mlp_fp32
    pe = {t: _pe_ns(nc.compile(graph, "trn2", CompilerOptions(auto_cast=AutoCast.MATMULT,
                                                                auto_cast_type=t)))[0]
          for t in AutoCastType}
    fp32 = _pe_ns(nc.compile(graph, "trn2"))[0]
    assert pe[AutoCastType.BF16] == pe[AutoCastType.FP16] == pe[AutoCastType.TF32]
    assert fp32 == pytest.approx(4 * pe[AutoCastType.BF16])
    assert pe[AutoCastType.FP8_E4M3] < pe[AutoCastType.BF16]


def test_invalid_option_combinations_are_one_line_errors(mlp_fp32):
    graph, _ = mlp_fp32
    with pytest.raises(OptionsError, match="FP8 is a Tensor-engine input format"):
        CompilerOptions(auto_cast=AutoCast.ALL, auto_cast_type=AutoCastType.FP8_E4M3)
    with pytest.raises(OptionsError, match="cannot be combined with FP8 auto-cast"):
        nc.compile(graph, "trn2", CompilerOptions(auto_cast=AutoCast.MATMULT,
                                                  auto_cast_type=AutoCastType.FP8_E4M3,
                                                  quantize=Quantization.INT8_WEIGHT_ONLY))
    with pytest.raises(OptionsError, match="auto_cast must be a AutoCast"):
        CompilerOptions(auto_cast="matmult")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="must be a CompilerOptions"):
        nc.compile(graph, "trn1", {"auto_cast": "all"})  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="unknown AutoCastType 'fp4'"):
        CompilerOptions.parse(auto_cast_type="fp4")
    assert CompilerOptions.parse(auto_cast_type="fp8_e4m3") == CompilerOptions(
        auto_cast=AutoCast.MATMULT, auto_cast_type=AutoCastType.FP8_E4M3)


# -- int8 weight-only quantisation ------------------------------------------------------------------


def test_int8_weight_only_linear_matches_a_numpy_reference_of_the_same_quantisation():
    b = nc.GraphBuilder("lin")
    x = b.parameter("x", (4, 256), "bf16")
    w = b.weight("w", (256, 384), "bf16")
    graph = b.build([b.matmul(x, w)])
    options = CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY)
    program = nc.compile(graph, "trn1", options)
    xs = np.random.default_rng(4).standard_normal((4, 256)).astype(np.float32)
    got = _run(program, [xs]).outputs[0].astype(np.float32)
    weight = _rounded(w.attrs["init"].materialize(w.shape), DType.BF16)
    # the published scheme, computed independently: symmetric per output channel, 127 levels
    scale = np.abs(weight).max(axis=0) / 127
    q = np.clip(np.rint(weight / scale), -127, 127)
    assert np.array_equal(q, quantize_int8(weight, 1)[0])
    bf16 = DType.BF16
    # x in bf16, int8 weights exact in bf16, FP32 accumulation and scaling, one rounding to bf16
    expected = _rounded((_rounded(xs, bf16) @ q) * scale, bf16)
    ulp = 2.0 ** (np.floor(np.log2(np.abs(expected) + 1e-30)) - 7)
    assert np.all(np.abs(got - expected) <= ulp)  # at most one bf16 ulp (FP32 summation order)
    assert np.mean(got == expected) > 0.95
    np.testing.assert_array_equal(got, nc.run_reference(program.graph, [xs])[0].astype(np.float32))
    # quantisation error against the bf16 model: small but real
    exact = _rounded(xs, bf16) @ weight
    assert 1e-3 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2


def test_int8_weight_only_decode_moves_half_the_weight_bytes():
    workload = WORKLOADS["llama-decode"]
    graph = workload.graph(layers=1, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=512)
    bf16 = nc.compile(graph, "trn1")
    int8 = nc.compile(graph, "trn1", CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY))
    quantised = [t for t in int8.hbm_tensors.values() if t.dtype is DType.INT8]
    linears = 4 + 3 + 1  # q, k, v, o; gate, up, down; lm_head
    assert len(quantised) == linears
    linear_bytes = sum(t.nbytes for t in quantised)
    assert _weight_dma_bytes(int8) < 0.6 * _weight_dma_bytes(bf16)
    assert _weight_dma_bytes(bf16) - _weight_dma_bytes(int8) == pytest.approx(linear_bytes, rel=0.01)
    # numerics: the core computes what the rewritten graph says
    inputs = random_inputs(graph, seed=0)
    got = _run(int8, inputs).outputs[0].astype(np.float32)
    reference = nc.run_reference(int8.graph, inputs)[0].astype(np.float32)
    assert np.abs(got - reference).max() <= 2e-2 * np.abs(reference).max()
    # the scales are applied in the PSUM evacuation: no extra Vector pass over the outputs
    scaled = {op.index for op in int8.graph.ops if op.name.endswith(".scaled")}
    assert len(scaled) == linears and not scaled & set(int8.op_index.tolist())


def test_int8_weight_only_decode_step_is_faster_once_weights_dominate():
    """A decode step is a matvec per linear, bound by weight bandwidth: half the bytes, less time
    (with weights of a few MB per layer; a toy layer of 1 MB is bound by fixed DMA costs)."""
    graph = WORKLOADS["llama-decode"].graph(layers=1, hidden=1024, heads=8, kv_heads=2,
                                            intermediate=2816, vocab=1024)
    timing = {}
    for name, options in (("bf16", None), ("int8", CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY))):
        program = nc.compile(graph, "trn1", options)
        timing[name] = nc.Instance(INSTANCES["trn1"], sink=nc.EventSink()).core(0).load(program) \
            .execute(timing_only=True).device_time_ns
    assert timing["int8"] < 0.85 * timing["bf16"]


def test_int8_weight_only_with_tensor_parallel_quantises_each_rank():
    from neuroncore.parallel import TensorParallelModel

    workload = WORKLOADS["llama-decode"]
    graph = workload.graph(layers=1, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=512,
                           tp_degree=2)
    group = TensorParallelModel.load(graph, "trn1.32xlarge", tp_degree=2,
                                     options=CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY))
    assert any(t.dtype is DType.INT8 for t in group.program.hbm_tensors.values())
    inputs = random_inputs(graph, seed=1)
    out = group.execute(inputs).outputs[0].astype(np.float32)
    exact = nc.run_reference(graph, inputs)[0].astype(np.float32)
    assert np.abs(out - exact).max() / np.abs(exact).max() < 0.1


# -- the command line ----------------------------------------------------------------------------


def _neuroncore(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONSCOPE_")}
    env.update(COLUMNS="160", NEURONSCOPE_CONFIG=str(REPO / "nonexistent-test-config.toml"))
    return subprocess.run([sys.executable, "-m", "neuroncore.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_runs_fp8_auto_cast_and_int8_quantisation():
    fp8 = _neuroncore("run", "-w", "matmul", "--set", "m=128", "--set", "k=512", "--set", "n=512",
                      "--dtype", "fp32", "--auto-cast-type", "fp8_e4m3", "--instance", "trn2.48xlarge")
    assert fp8.returncode == 0, fp8.stderr
    assert "auto-cast matmult to fp8_e4m3" in fp8.stdout
    quant = _neuroncore("run", "-w", "llama-decode", "--set", "layers=1", "--quantize", "int8-weight-only",
                        "--timing-only")
    assert quant.returncode == 0, quant.stderr
    assert "quantize int8-weight-only" in quant.stdout


@pytest.mark.parametrize("args,fragment", [
    (("--auto-cast", "all", "--auto-cast-type", "fp8_e4m3"), "FP8 is a Tensor-engine input format"),
    (("--auto-cast-type", "fp8_e4m3", "--quantize", "int8-weight-only"), "cannot be combined with FP8"),
    (("--auto-cast-type", "int4"), "invalid choice: 'int4'"),
])
def test_cli_refuses_bad_precision_options_in_one_line(args, fragment):
    result = _neuroncore("run", "-w", "matmul", "--set", "m=128", "--set", "k=128", "--set", "n=128",
                         *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuroncore") and fragment in lines[0], lines


@pytest.mark.parametrize("workload,options", [
    ("bert-layer", CompilerOptions(auto_cast=AutoCast.ALL, auto_cast_type=AutoCastType.FP16)),
    ("llama-prefill", CompilerOptions(auto_cast=AutoCast.MATMULT, quantize=Quantization.INT8_WEIGHT_ONLY)),
    ("llama-decode", CompilerOptions(auto_cast=AutoCast.MATMULT, auto_cast_type=AutoCastType.FP8_E4M3)),
])
def test_fp32_workloads_under_precision_options_compute_their_rewritten_graph(workload, options):
    """Whole models (norms, softmax, RoPE gathers, masks, KV-cache writes) through each option: the
    core computes ``run_reference(program.graph)``; the error against FP32 is the option's."""
    small = dict(hidden=256, heads=4, intermediate=512)
    if workload != "bert-layer":
        small.update(layers=1, kv_heads=2, vocab=512)
    graph = WORKLOADS[workload].graph(dtype="fp32", **small, **({"seq": 64} if workload == "bert-layer"
                                                                 else {"context": 64}))
    inputs = random_inputs(graph, seed=0)
    program = nc.compile(graph, "trn2", options)
    out = _run(program, inputs, "trn2").outputs[0].astype(np.float32)
    own = nc.run_reference(program.graph, inputs)[0].astype(np.float32)
    exact = nc.run_reference(graph, inputs)[0].astype(np.float32)
    assert np.abs(out - own).max() <= 2e-3 * np.abs(own).max()
    err = np.abs(out - exact).max() / np.abs(exact).max()
    assert {AutoCastType.FP16: 1e-4, AutoCastType.BF16: 1e-3, AutoCastType.FP8_E4M3: 1e-2}[
        options.auto_cast_type] < err < {AutoCastType.FP16: 5e-3, AutoCastType.BF16: 5e-2,
                                         AutoCastType.FP8_E4M3: 0.3}[options.auto_cast_type]
