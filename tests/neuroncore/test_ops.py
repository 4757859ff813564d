"""Every IR op: numerics (vs ``run_reference`` and vs plain NumPy) and lowering (opcodes, engines).

Shapes are small but chosen to cross the 128-partition tile boundary (130 rows) so that every op is
also checked on a partial tile. Helpers (``run``, ``assert_close``, ``nodes_of``) are in conftest.
"""

from __future__ import annotations

import math
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.node_semantics import Gather, Load, MatMul, Store
from neuroncore.dtypes import DType, as_dtype
from neuroncore.hardware import Engine

TENSOR, VECTOR, SCALAR, GPSIMD, SYNC = (int(e) for e in Engine)
R, C = 130, 48  # two partition tiles, the second one partial
THIS_FILE = os.path.abspath(__file__)
DMA_OPCODES = {"WRITE", "DMA_DIRECT2D", "DMA_DESCRIPTOR_GEN"}
NP_TYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` as the ``dtype`` tensor the device would hold (returned in that NumPy type)."""
    return np.asarray(x, np.float32).astype(NP_TYPES[dtype])


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32).astype(np.float64)


def compute(nodes) -> list:
    """Engine instructions that compute (not DMA transfers or their triggers)."""
    return [n for n in nodes if n.opcode not in DMA_OPCODES]


def kinds(nodes) -> set[tuple[str, int]]:
    return {(n.opcode, n.engine) for n in nodes}


def n_tiles(rows: int) -> int:
    return math.ceil(rows / 128)


def _line() -> int:
    """Line number of the caller (to check that errors point at the test's own source line)."""
    return sys._getframe(1).f_lineno


def check_names(graph: nc.Graph, nodes, op, layer: str) -> None:
    """Nodes record their IR op: its HLO name (``opcode.n``), layer and this file as source."""
    assert nodes, f"no nodes for {op.name}"
    for node in nodes:
        recorded = graph.ops[node.op_index]
        assert recorded is op
        assert recorded.name == op.name
        assert recorded.name.split(".")[0] == op.opcode
        assert recorded.layer == layer
        assert recorded.source.startswith(THIS_FILE + ":")


# ---------------------------------------------------------------------------------------------
# leaves: parameter, constant (immediate, splat, weight), iota
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_parameter_passthrough(run, rng, dtype):
    b = nc.GraphBuilder("param")
    x = b.parameter("x", (R, C), dtype)
    g = b.build([x])
    data = rng.standard_normal((R, C)).astype(np.float32) * 3
    res = run(g, [data])
    expected = rounded(data, dtype)
    assert res.out.dtype == expected.dtype
    np.testing.assert_array_equal(res.out, expected)
    np.testing.assert_array_equal(res.out, res.ref)
    # inputs given as the storage type and by name give the same result
    res2 = run(g, {"x": expected})
    np.testing.assert_array_equal(res2.out, expected)
    nodes = res.nodes()
    assert not compute(nodes), "a parameter output is only moved, never computed"
    queues = [n.queue for n in nodes if n.is_dma]
    assert queues.count("qSyncIO0") == n_tiles(R)
    assert queues.count("qSyncOut0") == n_tiles(R)
    assert all(n.engine == SYNC for n in nodes)
    assert res.program.hbm_tensors[res.program.input_tensors[0]].kind == "input"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_scalar_constant_is_an_immediate(run, rng, dtype):
    b = nc.GraphBuilder("imm")
    x = b.parameter("x", (R, C), dtype)
    with b.scope("scale"):
        y = b.multiply(x, 0.375)
    g = b.build([y])
    const = next(op for op in g.ops if op.opcode == "constant")
    bcast = next(op for op in g.ops if op.opcode == "broadcast")
    data = rng.standard_normal((R, C)).astype(np.float32)
    res = run(g, [data])
    np.testing.assert_array_equal(res.out, res.ref)
    np.testing.assert_array_equal(res.out, rounded(f64(rounded(data, dtype)) * 0.375, dtype))
    # the constant and its broadcast are folded into the instruction: no nodes, no HBM tensor
    assert res.nodes(const) == [] and res.nodes(bcast) == []
    assert not any(t.op_index == const.index for t in res.program.hbm_tensors.values())
    ys = compute(res.nodes(y))
    assert kinds(ys) == {("TENSOR_SCALAR", VECTOR)}
    assert len(ys) == n_tiles(R)
    assert all("op0=mult" in n.operands and "operand0=0.375" in n.operands for n in ys)
    check_names(g, res.nodes(y), y, "model/scale")


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("value", [0.1, 1 / 3, 0.1767766952966369])
def test_inexact_scalar_constant_is_held_in_its_dtype(run, rng, dtype, value):
    """A bf16 constant 0.1 is bf16(0.1) = 0.10009765625: the immediate must be that value too."""
    b = nc.GraphBuilder("imm_round")
    x = b.parameter("x", (R, C), dtype)
    y = b.multiply(x, value)
    z = b.add(value, x)
    g = b.build([y, z])
    data = (rng.standard_normal((R, C)) * 50).astype(np.float32)
    res = run(g, [data])
    xs = rounded(data, dtype).astype(np.float32)
    c = rounded(np.float32(value), dtype).astype(np.float32)
    np.testing.assert_array_equal(res.outputs[0], rounded(xs * c, dtype))
    np.testing.assert_array_equal(res.outputs[1], rounded(c + xs, dtype))
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    assert any(f"operand0={float(c):g}" in n.operands for n in compute(res.nodes(y)))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_splat_constant_output_is_memset(run, dtype):
    b = nc.GraphBuilder("splat")
    k = b.constant(2.5, dtype, shape=(R, 16))
    g = b.build([k])
    res = run(g, [])
    np.testing.assert_array_equal(res.out, np.full((R, 16), 2.5, NP_TYPES[dtype]))
    np.testing.assert_array_equal(res.out, res.ref)
    memsets = [n for n in res.nodes(k) if n.opcode == "MEMSET"]
    assert len(memsets) == n_tiles(R)
    assert all(n.engine == VECTOR and "value=2.5" in n.operands for n in memsets)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_weight_constant(run, rng, dtype):
    table = rng.standard_normal((R, C)).astype(np.float32)
    b = nc.GraphBuilder("weights")
    x = b.parameter("x", (R, C), dtype)
    with b.scope("bias"):
        w = b.weight("w", (R, C), dtype, array=table)
        y = b.add(x, w)
        seeded = b.weight("seeded", (R, C), dtype)
    g = b.build([y, w, seeded])
    data = rng.standard_normal((R, C)).astype(np.float32)
    res = run(g, [data])
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(res.outputs[1], rounded(table, dtype))
    expected = rounded(f64(rounded(data, dtype)) + f64(rounded(table, dtype)), dtype)
    np.testing.assert_array_equal(res.outputs[0], expected)
    # an initializer-made weight: seeded normal with std 1/sqrt(fan_in), the same on every run
    seeded_values = res.outputs[2].astype(np.float32)
    assert 0.5 / math.sqrt(R) < seeded_values.std() < 2.0 / math.sqrt(R)
    np.testing.assert_array_equal(run(g, [data]).outputs[2], res.outputs[2])
    program = res.program
    weights = {n: t for n, t in program.hbm_tensors.items() if t.kind == "weight"}
    assert set(weights) == {"weight.model/bias/w", "weight.model/bias/seeded"}
    assert program.weight_bytes() == 2 * R * C * as_dtype(dtype).itemsize
    assert "qSyncWeight0" in {n.queue for n in res.nodes() if n.is_dma}
    assert kinds(compute(res.nodes(y))) == {("TENSOR_TENSOR", VECTOR)}


@pytest.mark.parametrize("dtype", ["int32", "fp32", "bf16"])
@pytest.mark.parametrize("shape,dimension", [
    ((3, R, 40), 0), ((3, R, 40), 1), ((3, R, 40), 2), ((R, 20), 0), ((R, 20), 1), ((50,), 0),
])
def test_iota(run, shape, dimension, dtype):
    b = nc.GraphBuilder("iota")
    with b.scope("pos"):
        i = b.iota(shape, dimension, dtype)
    g = b.build([i])
    res = run(g, [])
    expected = np.indices(shape)[dimension]
    assert res.out.dtype == as_dtype(dtype).numpy
    np.testing.assert_array_equal(res.out.astype(np.float64), expected)
    np.testing.assert_array_equal(res.out, res.ref)
    nodes = compute(res.nodes(i))
    assert kinds(nodes) == {("IOTA", GPSIMD)}
    row_tiles = math.prod(shape[:-2]) * n_tiles(shape[-2]) if len(shape) >= 2 else 1
    assert len(nodes) == row_tiles
    check_names(g, res.nodes(i), i, "model/pos")


# ---------------------------------------------------------------------------------------------
# elementwise: unary (ACTIVATE on Scalar), binary (Vector), compare + select, convert
# ---------------------------------------------------------------------------------------------

UNARY = {
    # name: (builder method, independent NumPy, activation_fn, input generator)
    "exponential": ("exp", np.exp, "Exp", lambda r, s: r.standard_normal(s) * 2),
    "tanh": ("tanh", np.tanh, "Tanh", lambda r, s: r.standard_normal(s) * 2),
    "logistic": ("logistic", lambda x: 1 / (1 + np.exp(-x)), "Sigmoid",
                 lambda r, s: r.standard_normal(s) * 3),
    "rsqrt": ("rsqrt", lambda x: 1 / np.sqrt(x), "Rsqrt", lambda r, s: r.uniform(0.1, 4.0, s)),
    "sqrt": ("sqrt", np.sqrt, "Sqrt", lambda r, s: r.uniform(0.0, 4.0, s)),
    "log": ("log", np.log, "Ln", lambda r, s: r.uniform(0.05, 4.0, s)),
    "negate": ("negate", np.negative, "Copy", lambda r, s: r.standard_normal(s)),
    "abs": ("abs", np.abs, "Abs", lambda r, s: r.standard_normal(s)),
    # RoPE angles: positions x inverse frequencies, well outside [-pi, pi]
    "cosine": ("cosine", np.cos, "Cos", lambda r, s: r.uniform(-40.0, 40.0, s)),
    "sine": ("sine", np.sin, "Sin", lambda r, s: r.uniform(-40.0, 40.0, s)),
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(run, assert_close, rng, name, dtype):
    method, numpy_fn, act_fn, gen = UNARY[name]
    b = nc.GraphBuilder("unary")
    x = b.parameter("x", (R, C), dtype)
    with b.scope("act"):
        y = getattr(b, method)(x)
    g = b.build([y])
    data = gen(rng, (R, C)).astype(np.float32)
    res = run(g, [data])
    assert res.out.dtype == as_dtype(dtype).numpy
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_fn(f64(rounded(data, dtype))), dtype)
    nodes = compute(res.nodes(y))
    assert kinds(nodes) == {("ACTIVATE", SCALAR)}
    assert len(nodes) == n_tiles(R)
    assert {n.activation_fn for n in nodes} == {act_fn}
    assert all(f"func={act_fn}" in n.operands for n in nodes)
    if name == "negate":
        assert all("scale=-1" in n.operands for n in nodes)
    check_names(g, res.nodes(y), y, "model/act")
    # the result is stored to its output tensor on an output queue, ordered after the ACTIVATE:
    # triggered by the Scalar engine itself, or by another engine waiting on Scalar's semaphore
    program = res.program
    stores = [n for n in res.nodes(y) if n.is_dma and isinstance(n.semantics, Store)]
    assert len(stores) == n_tiles(R)
    for n in stores:
        assert program.queues[program.queue[n.index]].queue_type == "output"
        trig = int(program.trigger[n.index])
        assert program.engine[trig] == SCALAR or f"$S[{SCALAR}]>=" in program.operands[trig]


@pytest.mark.parametrize("name", ["exponential", "tanh", "rsqrt"])
def test_unary_fp16(run, assert_close, rng, name):
    method, numpy_fn, act_fn, gen = UNARY[name]
    b = nc.GraphBuilder("unary16")
    x = b.parameter("x", (R, C), "fp16")
    y = getattr(b, method)(x)
    g = b.build([y])
    data = gen(rng, (R, C)).astype(np.float32)
    res = run(g, [data])
    assert res.out.dtype == np.float16
    assert_close(res.out, res.ref, "fp16")
    assert_close(res.out, numpy_fn(f64(rounded(data, "fp16"))), "fp16")
    assert {n.activation_fn for n in compute(res.nodes(y))} == {act_fn}


BINARY = {
    "add": (np.add, "add"),
    "subtract": (np.subtract, "subtract"),
    "multiply": (np.multiply, "mult"),
    "divide": (np.divide, "divide"),
    "maximum": (np.maximum, "max"),
    "minimum": (np.minimum, "min"),
}


def _divisor_safe(rng, shape):
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_tensor_tensor(run, assert_close, rng, name, dtype):
    numpy_fn, alu = BINARY[name]
    b = nc.GraphBuilder("binary")
    x = b.parameter("x", (R, C), dtype)
    z = b.parameter("z", (R, C), dtype)
    with b.scope("ew"):
        y = getattr(b, name)(x, z)
    g = b.build([y])
    xs = rng.standard_normal((R, C)).astype(np.float32)
    zs = _divisor_safe(rng, (R, C)).astype(np.float32)
    res = run(g, [xs, zs])
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_fn(f64(rounded(xs, dtype)), f64(rounded(zs, dtype))), dtype)
    nodes = compute(res.nodes(y))
    assert kinds(nodes) == {("TENSOR_TENSOR", VECTOR)}
    assert len(nodes) == n_tiles(R)
    assert all(n.operands.split(" src0=")[0].endswith(f"op={alu}") for n in nodes)
    check_names(g, res.nodes(y), y, "model/ew")


@pytest.mark.parametrize("scalar_first", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_scalar(run, assert_close, rng, name, dtype, scalar_first):
    numpy_fn, alu = BINARY[name]
    b = nc.GraphBuilder("binary_scalar")
    x = b.parameter("x", (R, C), dtype)
    s = 1.75
    y = getattr(b, name)(s, x) if scalar_first else getattr(b, name)(x, s)
    g = b.build([y])
    data = _divisor_safe(rng, (R, C)).astype(np.float32)
    res = run(g, [data])
    xs = f64(rounded(data, dtype))
    expected = numpy_fn(s, xs) if scalar_first else numpy_fn(xs, s)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, expected, dtype)
    nodes = compute(res.nodes(y))
    assert kinds(nodes) == {("TENSOR_SCALAR", VECTOR)}
    assert len(nodes) == n_tiles(R)
    reversed_ = scalar_first and name in ("subtract", "divide")
    assert all(f"op0={alu}{'(rev)' if reversed_ else ''} operand0=1.75" in n.operands for n in nodes)


@pytest.mark.parametrize("name", ["add", "multiply", "divide"])
def test_binary_fp16(run, assert_close, rng, name):
    numpy_fn, _ = BINARY[name]
    b = nc.GraphBuilder("binary16")
    x = b.parameter("x", (R, C), "fp16")
    z = b.parameter("z", (R, C), "fp16")
    y = getattr(b, name)(x, z)
    g = b.build([y])
    xs = rng.standard_normal((R, C)).astype(np.float32)
    zs = _divisor_safe(rng, (R, C)).astype(np.float32)
    res = run(g, [xs, zs])
    assert res.out.dtype == np.float16
    assert_close(res.out, res.ref, "fp16")
    assert_close(res.out, numpy_fn(f64(rounded(xs, "fp16")), f64(rounded(zs, "fp16"))), "fp16")


COMPARE = {"EQ": (np.equal, "is_equal"), "NE": (np.not_equal, "not_equal"),
           "LT": (np.less, "is_lt"), "LE": (np.less_equal, "is_le"),
           "GT": (np.greater, "is_gt"), "GE": (np.greater_equal, "is_ge")}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("direction", list(COMPARE))
def test_compare_and_select(run, rng, direction, dtype):
    numpy_fn, alu = COMPARE[direction]
    b = nc.GraphBuilder("compare")
    x = b.parameter("x", (R, C), dtype)
    z = b.parameter("z", (R, C), dtype)
    with b.scope("mask"):
        pred = b.compare(x, z, direction)
        picked = b.select(pred, x, z)
        pred_s = b.compare(x, 0.5, direction)   # against an immediate
        pred_r = b.compare(0.5, x, direction)   # immediate first: the compare is mirrored
        relu_like = b.select(pred_s, x, 0.0)    # a splat on_false
    g = b.build([pred, picked, pred_s, pred_r, relu_like])
    # small integers (and halves) so that ties exercise EQ/LE/GE
    xs = (rng.integers(-3, 4, (R, C)) / 2).astype(np.float32)
    zs = (rng.integers(-3, 4, (R, C)) / 2).astype(np.float32)
    res = run(g, [xs, zs])
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    assert res.outputs[0].dtype == np.bool_
    expected_pred = numpy_fn(xs, zs)
    np.testing.assert_array_equal(res.outputs[0], expected_pred)
    np.testing.assert_array_equal(res.outputs[1].astype(np.float32), np.where(expected_pred, xs, zs))
    np.testing.assert_array_equal(res.outputs[2], numpy_fn(xs, 0.5))
    np.testing.assert_array_equal(res.outputs[3], numpy_fn(0.5, xs))
    np.testing.assert_array_equal(res.outputs[4].astype(np.float32), np.where(numpy_fn(xs, 0.5), xs, 0.0))
    assert 0 < expected_pred.sum() < expected_pred.size
    tt = compute(res.nodes(pred))
    assert kinds(tt) == {("TENSOR_TENSOR", VECTOR)} and all(f"op={alu} " in n.operands for n in tt)
    sel = compute(res.nodes(picked))
    assert kinds(sel) == {("TENSOR_COPY_PREDICATED", VECTOR)} and len(sel) == n_tiles(R)
    ts = compute(res.nodes(pred_s))
    assert kinds(ts) == {("TENSOR_SCALAR", VECTOR)} and all(f"op0={alu} " in n.operands for n in ts)
    mirrored = {"is_lt": "is_gt", "is_gt": "is_lt", "is_le": "is_ge", "is_ge": "is_le"}.get(alu, alu)
    tr = compute(res.nodes(pred_r))
    assert kinds(tr) == {("TENSOR_SCALAR", VECTOR)}
    assert all(f"op0={mirrored} " in n.operands and "(rev)" not in n.operands for n in tr)
    assert "TENSOR_COPY_PREDICATED" in {n.opcode for n in res.nodes(relu_like)}


CONVERSIONS = [("fp32", "bf16"), ("bf16", "fp32"), ("fp32", "fp16"), ("fp16", "fp32"),
               ("bf16", "fp16"), ("fp16", "bf16")]


@pytest.mark.parametrize("src,dst", CONVERSIONS)
def test_convert(run, rng, src, dst):
    b = nc.GraphBuilder("convert")
    x = b.parameter("x", (R, C), src)
    with b.scope("cast"):
        y = b.convert(x, dst)
    g = b.build([y])
    # values with more mantissa bits than any 16-bit type keeps, and some exact ones
    data = (rng.standard_normal((R, C)) * 10).astype(np.float32)
    data[0, :8] = [0.0, -0.0, 1.0, -2.5, 0.1, 1 / 3, 1000.0, 1e-3]
    res = run(g, [data])
    expected = rounded(data, src).astype(np.float32).astype(NP_TYPES[dst])
    assert res.out.dtype == np.dtype(NP_TYPES[dst])
    np.testing.assert_array_equal(res.out, expected)
    np.testing.assert_array_equal(res.out, res.ref)
    nodes = compute(res.nodes(y))
    assert kinds(nodes) == {("TENSOR_COPY", VECTOR)}
    assert len(nodes) == n_tiles(R)
    names = {"fp32": "fp32", "bf16": "bfloat16", "fp16": "fp16"}
    assert all(f"dst={names[dst]}@sb" in n.operands for n in nodes)
    check_names(g, res.nodes(y), y, "model/cast")


# ---------------------------------------------------------------------------------------------
# layout: broadcast, reshape, transpose, slice, concatenate
# ---------------------------------------------------------------------------------------------

BROADCASTS = [
    # (source shape, output shape, dims, classification of the source by the consumer)
    ((), (R, C), (), "replicated"),
    ((1,), (R, C), (1,), "replicated"),
    ((1, 1), (2, R, C), (1, 2), "replicated"),
    ((R,), (R, C), (0,), "per-row"),
    ((C,), (R, C), (1,), "view"),
    ((C,), (3, R, C), (2,), "view"),
    ((R, C), (2, R, C), (1, 2), "view"),
    ((R,), (2, R, C), (1,), "row-constant"),
    ((2, R), (2, R, C), (0, 1), "per-row"),
    ((2, 1, 1), (2, R, C), (0, 1, 2), "row-constant"),
]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("src_shape,out_shape,dims,kind", BROADCASTS)
def test_broadcast(run, assert_close, rng, src_shape, out_shape, dims, kind, dtype):
    b = nc.GraphBuilder("bcast")
    s = b.parameter("s", src_shape, dtype)
    x = b.parameter("x", out_shape, dtype)
    with b.scope("bc"):
        bc = b.broadcast(s, out_shape, dims)
        y = b.subtract(x, bc)
    g = b.build([y, bc])
    sd = rng.standard_normal(src_shape).astype(np.float32)
    xd = rng.standard_normal(out_shape).astype(np.float32)
    res = run(g, [sd, xd])
    expanded = [1] * len(out_shape)
    for i, d in enumerate(dims):
        expanded[d] = src_shape[i]
    expected_bc = np.broadcast_to(rounded(sd, dtype).reshape(expanded), out_shape)
    np.testing.assert_array_equal(res.outputs[1], expected_bc)
    np.testing.assert_array_equal(res.outputs[1], res.reference[1])
    assert_close(res.outputs[0], res.reference[0], dtype)
    assert_close(res.outputs[0], f64(rounded(xd, dtype)) - f64(expected_bc), dtype)
    # a broadcast is a view: it computes nothing itself
    assert not compute(res.nodes(bc))
    ys = compute(res.nodes(y))
    if kind in ("per-row", "replicated"):
        # the [rows] operand is a per-partition scalar of TENSOR_SCALAR: never expanded
        assert kinds(ys) == {("TENSOR_SCALAR", VECTOR)}
        assert all("operand0=" in n.operands and "@sb:" in n.operands.split("operand0=")[1]
                   for n in ys)
    if kind == "replicated":
        # a one-element value: ONE load per op puts it on every partition (one element per
        # partition), not a load of every element of every tile through the broadcast view
        loads = [n for n in res.nodes(y) if n.is_dma]
        rep = [n for n in loads if ".rep" in n.operands]
        assert len(rep) == 1, [n.operands for n in loads]
        assert res.program.dma_bytes[rep[0].index] == 128 * s.dtype.itemsize
        assert not [n for n in loads if f"hbm:{bc.name}.view" in n.operands]
    elif kind == "row-constant":
        # constant along each row (the last dim broadcast): TENSOR_SCALAR's per-partition operand
        # is the first column of each tile of the view, one element per partition, never the whole
        # tile (every element its own descriptor)
        assert kinds(ys) == {("TENSOR_SCALAR", VECTOR)}
        view_loads = [n for n in res.nodes(y) if n.is_dma and f"hbm:{bc.name}.view" in n.operands]
        assert view_loads and all(res.program.dma_bytes[n.index] <= 128 * s.dtype.itemsize
                                  for n in view_loads), [n.operands for n in view_loads]
    elif kind == "view":
        assert kinds(ys) == {("TENSOR_TENSOR", VECTOR)}
        view_loads = [n for n in res.nodes(y) if n.is_dma and f"hbm:{bc.name}.view" in n.operands]
        assert view_loads, "the consumer reads the broadcast through a DMA access pattern"


def test_rank_expanding_broadcast_via_builder(run, assert_close, rng):
    """NumPy-style implicit broadcasting inserts broadcast ops with the right dims."""
    b = nc.GraphBuilder("implicit")
    x = b.parameter("x", (2, R, C), "fp32")
    col = b.parameter("col", (C,), "fp32")
    y = b.multiply(x, col)
    g = b.build([y])
    bc = next(op for op in g.ops if op.opcode == "broadcast")
    assert bc.attrs["dims"] == (2,) and bc.shape == (2, R, C)
    xd = rng.standard_normal((2, R, C)).astype(np.float32)
    cd = rng.standard_normal((C,)).astype(np.float32)
    res = run(g, [xd, cd])
    assert_close(res.out, res.ref)
    assert_close(res.out, f64(xd) * f64(cd))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("src_shape,dst_shape", [((2, 128, C), (256, C)), ((R, C), (1, R, C))])
def test_reshape_alias_is_free(run, assert_close, rng, dtype, src_shape, dst_shape):
    b = nc.GraphBuilder("reshape")
    x = b.parameter("x", src_shape, dtype)
    e = b.exp(x)
    with b.scope("view"):
        r = b.reshape(e, dst_shape)  # the same 128-row tiles: an alias of e's SBUF tiles
    y = b.add(r, 1.0)
    g = b.build([y])
    data = rng.standard_normal(src_shape).astype(np.float32)
    res = run(g, [data])
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, np.exp(f64(rounded(data, dtype))).reshape(dst_shape) + 1, dtype)
    assert res.nodes(r) == [], "an aliasing reshape emits nothing"
    # y reads e's tiles in place: no store of e and no reload through a view
    assert not any(n.is_dma for n in res.nodes(y) if isinstance(n.semantics, Load))
    assert not any(isinstance(n.semantics, Store) and n.semantics.dst.tensor.startswith(e.name)
                   for n in res.nodes())
    assert kinds(compute(res.nodes(y))) == {("TENSOR_SCALAR", VECTOR)}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("on_chip", [False, True])
def test_reshape_view(run, assert_close, rng, dtype, on_chip):
    b = nc.GraphBuilder("reshape")
    x = b.parameter("x", (R, C), dtype)
    src = b.exp(x) if on_chip else x
    with b.scope("view"):
        r = b.reshape(src, (C // 2, 2 * R))  # changes the row length: a relayout through HBM
    y = b.negate(r)
    g = b.build([y, r])
    data = rng.standard_normal((R, C)).astype(np.float32)
    res = run(g, [data])
    xs = f64(rounded(data, dtype))
    base = rounded(np.exp(xs.astype(np.float32)), dtype) if on_chip else rounded(xs, dtype)
    np.testing.assert_array_equal(res.outputs[1], base.reshape(C // 2, 2 * R))
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(res.outputs[0], -base.reshape(C // 2, 2 * R))
    assert not compute(res.nodes(r))
    assert any(n.is_dma and f"hbm:{r.name}.view" in n.operands for n in res.nodes(y))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(R, 200), (2, R, 40), (7, 5)])
def test_transpose_last_two_on_pe(run, rng, shape, dtype):
    b = nc.GraphBuilder("transpose")
    x = b.parameter("x", shape, dtype)
    e = b.abs(x)  # an on-chip value: its transpose runs on the PE
    perm = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
    with b.scope("t"):
        t = b.transpose(e, perm)
    g = b.build([t])
    data = rng.standard_normal(shape).astype(np.float32)
    res = run(g, [data])
    expected = np.transpose(np.abs(rounded(data, dtype)), perm)
    np.testing.assert_array_equal(res.out, expected)
    np.testing.assert_array_equal(res.out, res.ref)
    nodes = res.nodes(t)
    mm = [n for n in nodes if n.opcode == "MATMUL"]
    assert mm and all(n.engine == TENSOR and n.tensor_instruction_type == "TRANSPOSE" for n in mm)
    assert all("transpose" in n.operands for n in mm)
    batches = math.prod(shape[:-2])
    blocks = batches * n_tiles(shape[-1]) * n_tiles(shape[-2])
    assert len(mm) == blocks
    assert len([n for n in nodes if n.opcode == "LDWEIGHTS" and n.engine == TENSOR]) == blocks
    # the identity is made once on GpSimd; PSUM evacuation alternates Scalar and Vector
    assert [n.opcode for n in nodes if n.engine == GPSIMD] == ["IOTA"]
    evac = [n for n in nodes if n.opcode in ("ACTIVATE", "TENSOR_COPY")]
    assert len(evac) == blocks and all("src=psum[" in n.operands for n in evac)
    if blocks > 1:
        assert {n.engine for n in evac} == {SCALAR, VECTOR}
    check_names(g, nodes, t, "model/t")
    # the transpose waits for the identity (GpSimd semaphore) and for abs (Scalar semaphore)
    waits = " ".join(n.operands for n in mm)
    assert "$S[3]>=" in waits
    assert any("$S[2]>=" in n.operands for n in nodes if n.opcode == "LDWEIGHTS")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("on_chip", [False, True])
def test_transpose_4d_is_a_dma_view(run, rng, dtype, on_chip):
    shape = (2, 3, 20, 16)
    b = nc.GraphBuilder("transpose4d")
    x = b.parameter("x", shape, dtype)
    src = b.abs(x) if on_chip else x
    with b.scope("heads"):
        t = b.transpose(src, (0, 2, 1, 3))
    y = b.multiply(t, 2.0)
    g = b.build([y, t])
    data = rng.standard_normal(shape).astype(np.float32)
    res = run(g, [data])
    base = np.abs(rounded(data, dtype)) if on_chip else rounded(data, dtype)
    expected = np.transpose(base, (0, 2, 1, 3))
    np.testing.assert_array_equal(res.outputs[1], expected)
    np.testing.assert_array_equal(res.outputs[0], (expected.astype(np.float32) * 2).astype(NP_TYPES[dtype]))
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    assert not any(n.engine == TENSOR for n in res.nodes()), "not a PE transpose"
    assert not compute(res.nodes(t))
    assert any(n.is_dma and f"hbm:{t.name}.view" in n.operands for n in res.nodes(y))
    view = res.program.hbm_views[f"{t.name}.view"]
    assert view.shape == (2, 20, 3, 16) and view.run_elements == 16


def test_transpose_of_parameter_runs_on_the_pe(run, rng):
    # NC-v2 DMA cannot transpose: read as a view, the transpose would move one element per
    # descriptor; the compiler loads the rows and transposes them on the PE instead
    b = nc.GraphBuilder("transpose_param")
    x = b.parameter("x", (R, C), "fp32")
    t = b.transpose(x, (1, 0))
    y = b.add(t, 0.5)
    g = b.build([y])
    data = rng.standard_normal((R, C)).astype(np.float32)
    res = run(g, [data])
    np.testing.assert_array_equal(res.out, data.T + np.float32(0.5))
    assert any(n.opcode == "MATMUL" and "transpose" in n.operands for n in res.nodes(t))
    assert f"{t.name}.view" not in res.program.hbm_views


def test_packed_transpose_of_a_view_runs_on_the_pe(run, rng):
    # K^T of attention heads: [h, s, d] (a view of the projection) -> [h, d, s]; the 64-row
    # outputs of two heads share a tile, each transposed block landing at its partition offset
    b = nc.GraphBuilder("packed_transpose")
    x = b.parameter("x", (128, 4 * 64), "fp32")
    heads = b.transpose(b.reshape(x, (128, 4, 64)), (1, 0, 2))  # [4, 128, 64], a view
    t = b.transpose(heads, (0, 2, 1))  # [4, 64, 128]: packed, two heads per tile
    y = b.multiply(t, 0.125)
    g = b.build([y])
    data = rng.standard_normal((128, 256)).astype(np.float32)
    res = run(g, [data])
    expected = data.reshape(128, 4, 64).transpose(1, 2, 0) * np.float32(0.125)
    np.testing.assert_array_equal(res.out, expected)
    assert any(n.opcode == "MATMUL" and "transpose" in n.operands for n in res.nodes(t))


SLICES = [
    ((R, C), (3, 5), (R, 40), None),
    ((R, C), (0, 0), (R, C), (2, 3)),
    ((R, C), (1, 2), (129, 47), (4, 5)),
    ((3, R, C), (1, 0, 8), (3, 128, 24), (1, 1, 1)),
    ((3, R, C), (0, 1, 0), (3, R, C), (2, 3, 7)),
]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape,starts,limits,strides", SLICES)
def test_slice(run, rng, shape, starts, limits, strides, dtype):
    b = nc.GraphBuilder("slice")
    x = b.parameter("x", shape, dtype)
    e = b.negate(x)
    with b.scope("sl"):
        s = b.slice(e, starts, limits, strides)
    y = b.abs(s)
    g = b.build([y, s])
    data = rng.standard_normal(shape).astype(np.float32)
    res = run(g, [data])
    steps = strides or (1,) * len(shape)
    index = tuple(slice(a, z, st) for a, z, st in zip(starts, limits, steps))
    expected = -rounded(data, dtype)[index]
    np.testing.assert_array_equal(res.outputs[1], expected)
    np.testing.assert_array_equal(res.outputs[0], np.abs(expected))
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    assert not compute(res.nodes(s))
    view = res.program.hbm_views.get(f"{s.name}.view")
    if view is None:  # one block of each tile of an on-chip value: read in place (on-chip view)
        assert steps[-1] == 1 and res.program.stats["on_chip_views"] >= 1
    else:
        assert view.run_elements == (s.shape[-1] if steps[-1] == 1 else 1)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_concatenate_last_axis(run, rng, dtype):
    b = nc.GraphBuilder("concat")
    x1 = b.parameter("x1", (R, 16), dtype)
    x2 = b.parameter("x2", (R, 24), dtype)
    e = b.exp(x1)
    with b.scope("cat"):
        c = b.concatenate([x1, e, x2], -1)
    y = b.multiply(c, 0.5)
    g = b.build([y, c])
    d1 = rng.standard_normal((R, 16)).astype(np.float32)
    d2 = rng.standard_normal((R, 24)).astype(np.float32)
    res = run(g, [d1, d2])
    a1, a2 = rounded(d1, dtype), rounded(d2, dtype)
    expected = np.concatenate([a1, rounded(np.exp(a1.astype(np.float32)), dtype), a2], axis=1)
    assert c.shape == (R, 56) and c.attrs["dimension"] == 1
    np.testing.assert_array_equal(res.outputs[1], expected)
    for out, ref in zip(res.outputs, res.reference):
        np.testing.assert_array_equal(out, ref)
    assert not compute(res.nodes(c))
    assert res.program.hbm_views[f"{c.name}.view"].run_elements == 16


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_concatenate_leading_axis(run, rng, dtype):
    b = nc.GraphBuilder("concat0")
    x1 = b.parameter("x1", (2, R, C), dtype)
    x2 = b.parameter("x2", (1, R, C), dtype)
    with b.scope("cat"):
        c = b.concatenate([x1, b.abs(x2)], 0)
    y = b.add(c, c)
    g = b.build([y])
    d1 = rng.standard_normal((2, R, C)).astype(np.float32)
    d2 = rng.standard_normal((1, R, C)).astype(np.float32)
    res = run(g, [d1, d2])
    expected = np.concatenate([rounded(d1, dtype), np.abs(rounded(d2, dtype))], axis=0)
    np.testing.assert_array_equal(res.out, (expected.astype(np.float32) * 2).astype(NP_TYPES[dtype]))
    np.testing.assert_array_equal(res.out, res.ref)
    assert not compute(res.nodes(c))
    assert res.program.hbm_views[f"{c.name}.view"].run_elements == C


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_view_chain_over_an_aliased_on_chip_value(run, assert_close, rng, dtype):
    """Attention-head split: slice -> reshape -> transpose views of a matmul result (itself reached
    through an aliasing reshape) are read only by later ops; the result must stay alive until then.
    """
    s, d, heads = 40, 64, 4
    b = nc.GraphBuilder("heads")
    x = b.parameter("x", (1, s, d), dtype)
    with b.scope("qkv"):
        qkv = b.matmul(x, b.weight("w", (d, 3 * d), dtype))  # dot + aliasing reshape
    parts = []
    for i in range(3):
        part = b.slice(qkv, (0, 0, i * d), (1, s, (i + 1) * d))
        parts.append(b.transpose(b.reshape(part, (1, s, heads, d // heads)), (0, 2, 1, 3)))
    q, k, v = parts
    with b.scope("attn"):
        p = b.softmax(b.multiply(b.dot(q, k, rhs_contract=-1), 0.25))
        o = b.dot(p, v)
    y = b.reshape(b.transpose(o, (0, 2, 1, 3)), (1, s, d))
    g = b.build([y])
    data = rng.standard_normal((1, s, d)).astype(np.float32)
    res = run(g, [data])
    assert_close(res.out, res.ref, dtype)
    w = rounded(g.ops[[op.opcode for op in g.ops].index("constant")].attrs["init"].materialize((d, 3 * d)),
                dtype)
    h = (f64(rounded(data, dtype)) @ f64(w)).reshape(s, 3, heads, d // heads).transpose(1, 2, 0, 3)
    scores = h[0] @ h[1].transpose(0, 2, 1) * 0.25
    e = np.exp(scores - scores.max(-1, keepdims=True))
    expected = ((e / e.sum(-1, keepdims=True)) @ h[2]).transpose(1, 0, 2).reshape(1, s, d)
    assert_close(res.out, expected, dtype, rtol=5e-2 if dtype == "bf16" else 1e-4)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_reduce_result_as_dot_operand(run, assert_close, rng, dtype):
    """A reduction's result is column-laid-out on chip; dot reads it as either operand."""
    b = nc.GraphBuilder("reduce_dot")
    x = b.parameter("x", (3, R, 40), dtype)
    z = b.parameter("z", (R, 3, 40), dtype)
    w = b.parameter("w", (R, 20), dtype)
    a = b.parameter("a", (20, R), dtype)
    rx = b.reduce(x, [2])  # [3, R]
    rz = b.reduce(z, [2], "max")  # [R, 3]
    lhs = b.dot(rx, w)  # contracts rx's last dim: rx is transposed on the PE
    rhs = b.dot(a, rz)  # contracts rz's rows: rz is loaded as [K, N] tiles
    g = b.build([lhs, rhs])
    xd, zd, wd, ad = (rng.standard_normal(op.shape).astype(np.float32) for op in g.parameters)
    res = run(g, [xd, zd, wd, ad])
    for out, ref, dt in zip(res.outputs, res.reference, (dtype, dtype)):
        assert_close(out, ref, dt)
    rxv = rounded(f64(rounded(xd, dtype)).sum(-1), dtype)
    rzv = rounded(f64(rounded(zd, dtype)).max(-1), dtype)
    assert_close(res.outputs[0], f64(rxv) @ f64(rounded(wd, dtype)), dtype,
                 scale=float(np.abs(f64(rxv)).sum(1).max() * np.abs(wd).max()))
    assert_close(res.outputs[1], f64(rounded(ad, dtype)) @ f64(rzv), dtype)


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------

REDUCTIONS = [
    ((R, C), (1,)),
    ((3, R, C), (2,)),
    ((R, C), (0,)),
    ((3, R, C), (1,)),
    ((3, 20, C), (0, 2)),
    ((R, C), (0, 1)),
    ((3, 20, C), (0, 1, 2)),
]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("shape,dims", REDUCTIONS)
def test_reduce(run, assert_close, rng, shape, dims, kind, dtype):
    b = nc.GraphBuilder("reduce")
    x = b.parameter("x", shape, dtype)
    with b.scope("red"):
        r = b.reduce(x, dims, kind)
    g = b.build([r])
    data = rng.standard_normal(shape).astype(np.float32)
    res = run(g, [data])
    xs = f64(rounded(data, dtype))
    expected = xs.sum(axis=dims) if kind == "sum" else xs.max(axis=dims)
    assert res.out.shape == tuple(n for i, n in enumerate(shape) if i not in dims)
    if kind == "max":
        np.testing.assert_array_equal(res.out.astype(np.float64), expected)
        np.testing.assert_array_equal(res.out, res.ref)
    else:
        # error bound of an FP32 sum: relative to the sum of magnitudes, not to the result
        scale = float(np.abs(xs).sum(axis=dims).max())
        assert_close(res.out, res.ref, dtype, scale=scale)
        assert_close(res.out, expected, dtype, scale=scale)
    nodes = compute(res.nodes(r))
    assert kinds(nodes) == {("TENSOR_REDUCE", VECTOR)}
    alu = "add" if kind == "sum" else "max"
    assert all(f"op={alu} axis=X" in n.operands for n in nodes)
    # one instruction per [rows <= 128, 1] tile of the (column-layout) result
    out_shape = res.out.shape
    col_tiles = math.prod(out_shape[:-1]) * n_tiles(out_shape[-1]) if out_shape else 1
    assert len(nodes) == col_tiles
    if dims != (len(shape) - 1,):
        # other dims are moved last by a strided DMA before the free-dim reduction
        assert any(n.is_dma and f"{r.name}.reduce_view" in n.operands for n in res.nodes(r))
    check_names(g, res.nodes(r), r, "model/red")


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("shape,dims", [((64, 1024), (0, 1)), ((3, 130, 300), (1, 2))])
def test_reduce_wider_than_a_partition_holds(run, assert_close, rng, shape, dims, kind):
    """``F.mse_loss`` over a [64, 1024] output is a reduction of 65,536 elements into one value:
    the view put them on one partition (256 KiB, more than SBUF's 192 KiB) and the compile stopped
    with 'cannot place reduce' (found by the user trials). Column chunks are reduced and combined."""
    b = nc.GraphBuilder("wide_reduce")
    x = b.parameter("x", shape, "fp32")
    g = b.build([b.reduce(x, dims, kind)])
    data = rng.standard_normal(shape).astype(np.float32)
    res = run(g, [data])
    xs = f64(data)
    expected = xs.sum(axis=dims) if kind == "sum" else xs.max(axis=dims)
    assert_close(res.out, expected, "fp32", scale=float(np.abs(xs).sum()))
    if kind == "max":
        np.testing.assert_array_equal(res.out, res.ref)


def test_wide_reduction_through_a_view_keeps_its_partials_in_fp32(run):
    """A bf16 ``x.sum()`` of a [64, 1024] tensor is reduced per column chunk; the chunks' sums stay
    FP32 until the one combine, so the total is rounded to bf16 once (262, the reference's). Before,
    a running total in the bf16 output was rounded after every chunk: 256 + 1 -> 256, five times."""
    b = nc.GraphBuilder("wide_bf16_sum")
    x = b.parameter("x", (64, 1024), "bf16")
    g = b.build([b.reduce(x, (0, 1), "sum")])
    data = np.zeros(65536, np.float32)
    data[0], data[1] = 256.0, 1.0
    data[12288::12288] = 1.0  # a 1.0 every 12,288 elements (the chunk width before)
    res = run(g, [data.reshape(64, 1024).astype(DType.BF16.numpy)])
    assert float(res.out) == float(res.ref) == 262.0


def test_reduce_result_feeds_per_partition_scalar(run, assert_close, rng):
    """x - max(x) along rows: the reduction's column result is a TENSOR_SCALAR operand."""
    b = nc.GraphBuilder("center")
    x = b.parameter("x", (R, C), "fp32")
    m = b.reduce(x, [1], "max")
    y = b.subtract(x, b.broadcast(m, (R, C), (0,)))
    g = b.build([y])
    data = rng.standard_normal((R, C)).astype(np.float32)
    res = run(g, [data])
    np.testing.assert_array_equal(res.out, data - data.max(axis=1, keepdims=True))
    assert kinds(compute(res.nodes(y))) == {("TENSOR_SCALAR", VECTOR)}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_ops_reading_a_reduction_result_along_its_last_dim(run, assert_close, rng, dtype):
    """A reduction leaves a column-layout value; a later free-dim reduction, softmax or norm of it
    must still reduce along its logical last dim."""
    b = nc.GraphBuilder("reduce_chain")
    x = b.parameter("x", (3, 20, 64), dtype)
    r = b.reduce(x, [0])  # [20, 64], one value per partition
    s = b.reduce(b.reduce(x, [2]), [1])  # [3, 20] -> [3]
    total = b.reduce(b.reduce(x, [2], "max"), [0, 1], "max")  # [3, 20] -> []
    gamma = b.weight("gamma", (64,), dtype, array=np.linspace(0.5, 1.5, 64))
    outs = [s, total, b.softmax(r), b.layer_norm(r, gamma, gamma), b.rms_norm(r, gamma)]
    g = b.build(outs)
    data = rng.standard_normal((3, 20, 64)).astype(np.float32)
    res = run(g, [data])
    xs = f64(rounded(data, dtype))
    sum_scale = float(np.abs(xs).sum(axis=(1, 2)).max())  # error bound of the [3] sums
    assert_close(res.outputs[0], res.reference[0], dtype, scale=sum_scale)
    assert_close(res.outputs[0], xs.sum(axis=(1, 2)), dtype, scale=sum_scale)
    for out, ref in zip(res.outputs[1:], res.reference[1:]):
        assert_close(out, ref, dtype)
    np.testing.assert_array_equal(res.outputs[1].astype(np.float64), xs.max())
    rv = f64(rounded(xs.sum(axis=0), dtype))
    assert_close(res.outputs[2], _softmax(rv), dtype)
    gv = f64(rounded(np.linspace(0.5, 1.5, 64), dtype))
    assert_close(res.outputs[3], _layer_norm(rv, gv, gv, 1e-5), dtype)


# ---------------------------------------------------------------------------------------------
# dot
# ---------------------------------------------------------------------------------------------

DOTS = {
    # name: (lhs shape, rhs shape, lhs_contract, rhs_contract)
    "plain": ((20, 48), (48, 36), -1, -2),
    "lhs_contract_-2": ((48, 20), (48, 36), -2, -2),
    "rhs_contract_-1": ((20, 48), (36, 48), -1, -1),
    "both_transposed": ((48, 20), (36, 48), -2, -1),
    "batched_4d": ((2, 3, 16, 32), (2, 3, 32, 24), -1, -2),
    "batched_4d_qkT": ((2, 2, 16, 32), (2, 2, 24, 32), -1, -1),
}


def _dot_numpy(a, w, lc, rc):
    a = f64(a)
    w = f64(w)
    a = a if lc % a.ndim == a.ndim - 1 else np.swapaxes(a, -1, -2)
    w = w if rc % w.ndim == w.ndim - 2 else np.swapaxes(w, -1, -2)
    return np.einsum("...mk,...kn->...mn", a, w)


@pytest.mark.parametrize("case,dtype", [(c, d) for c in sorted(DOTS) for d in ("fp32", "bf16")]
                         + [("plain", "fp16"), ("batched_4d", "fp16")])
def test_dot(run, assert_close, rng, case, dtype):
    lshape, rshape, lc, rc = DOTS[case]
    b = nc.GraphBuilder("dot")
    a = b.parameter("a", lshape, dtype)
    w = b.parameter("w", rshape, dtype)
    with b.scope("proj"):
        y = b.dot(a, w, lhs_contract=lc, rhs_contract=rc)
    g = b.build([y])
    ad = rng.standard_normal(lshape).astype(np.float32)
    wd = rng.standard_normal(rshape).astype(np.float32)
    res = run(g, [ad, wd])
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, _dot_numpy(rounded(ad, dtype), rounded(wd, dtype), lc, rc), dtype)
    nodes = res.nodes(y)
    regular = [n for n in nodes if n.opcode == "MATMUL" and n.tensor_instruction_type == "REGULAR"]
    ldw = [n for n in nodes if n.opcode == "LDWEIGHTS"]
    assert regular and ldw
    assert {n.engine for n in regular + ldw} == {TENSOR}
    batches = math.prod(y.shape[:-2])
    if dtype == "fp32":
        # FP32 runs as two passes (lo, hi); only the first carries the numerics
        assert len(regular) == 2 * batches
        passes = sorted(n.operands.split("fp32_pass=")[1][:2] for n in regular)
        assert passes == sorted(["hi", "lo"] * batches)
        assert sum(isinstance(n.semantics, MatMul) for n in regular) == batches
    else:
        assert len(regular) == batches and not any("fp32_pass" in n.operands for n in regular)
    # operands whose contracting dim is the free dim go through PE transposes
    transposes = [n for n in nodes if n.opcode == "MATMUL" and n.tensor_instruction_type == "TRANSPOSE"]
    expected_transposes = batches * ((lc % len(lshape) == len(lshape) - 1)
                                     + (rc % len(rshape) == len(rshape) - 1))
    assert len(transposes) == expected_transposes
    # PSUM is evacuated to SBUF by Scalar or Vector
    evac = [n for n in compute(nodes) if "src=psum[" in n.operands]
    assert evac and {n.engine for n in evac} <= {SCALAR, VECTOR}
    check_names(g, nodes, y, "model/proj")
    # the matmul waits for its operands' DMA queue semaphores
    assert all("$S[" in n.operands for n in regular[:1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dot_with_weight_operands(run, assert_close, rng, dtype):
    """A weight read only as ``rhs`` contracted on its last dim is stored pre-transposed."""
    b = nc.GraphBuilder("linear")
    x = b.parameter("x", (R, 64), dtype)
    with b.scope("fc"):
        w = b.weight("w", (32, 64), dtype)  # [out, in], used as x @ w^T
        y = b.dot(x, w, rhs_contract=-1)
    g = b.build([y])
    data = rng.standard_normal((R, 64)).astype(np.float32)
    res = run(g, [data])
    wv = rounded(w.attrs["init"].materialize(w.shape), dtype)
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, f64(rounded(data, dtype)) @ f64(wv).T, dtype)
    tensor = res.program.hbm_tensors["weight.model/fc/w"]
    assert tensor.pretransposed and tensor.shape == (64, 32)
    transposes = [n for n in res.nodes(y) if n.tensor_instruction_type == "TRANSPOSE"]
    assert len(transposes) == n_tiles(R), "only x is transposed on the PE, never the weight"


def test_matmul_helper_flattens_leading_dims(run, assert_close, rng):
    b = nc.GraphBuilder("mm")
    x = b.parameter("x", (2, 5, 40), "bf16")
    y = b.matmul(x, b.weight("w", (40, 24), "bf16"))
    g = b.build([y])
    data = rng.standard_normal((2, 5, 40)).astype(np.float32)
    res = run(g, [data])
    assert res.out.shape == (2, 5, 24)
    assert_close(res.out, res.ref, "bf16")


# ---------------------------------------------------------------------------------------------
# gather
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("ids_shape", [(R,), (2, 70), (1,)])
@pytest.mark.parametrize("table_kind", ["parameter", "weight"])
def test_gather(run, rng, ids_shape, dtype, table_kind):
    vocab, dim = 50, 24
    table_values = rng.standard_normal((vocab, dim)).astype(np.float32)
    b = nc.GraphBuilder("embed")
    if table_kind == "parameter":
        table = b.parameter("table", (vocab, dim), dtype)
    ids = b.parameter("ids", ids_shape, "int32", low=0, high=vocab)
    with b.scope("embed_tokens"):
        if table_kind == "weight":
            table = b.weight("table", (vocab, dim), dtype, array=table_values)
        e = b.gather(table, ids)
    g = b.build([e])
    idx = rng.integers(0, vocab, ids_shape).astype(np.int32)
    idx.flat[0] = vocab - 1
    inputs = [table_values, idx] if table_kind == "parameter" else [idx]
    res = run(g, inputs)
    expected = rounded(table_values, dtype)[idx]
    assert res.out.shape == (*ids_shape, dim)
    np.testing.assert_array_equal(res.out, expected)
    np.testing.assert_array_equal(res.out, res.ref)
    nodes = res.nodes(e)
    transfers = [n for n in nodes if n.is_dma and n.queue == "qGpSimdDynamicSW0"]
    rows = math.prod(ids_shape[:-1]) * n_tiles(ids_shape[-1]) if len(ids_shape) > 1 else n_tiles(ids_shape[0])
    assert len(transfers) == rows
    program = res.program
    for n in transfers:
        assert n.opcode == "DMA_DIRECT2D" and isinstance(n.semantics, Gather)
        trig = int(program.trigger[n.index])
        assert program.opcodes[program.opcode_id[trig]] == "DMA_DESCRIPTOR_GEN"
        assert program.engine[trig] == GPSIMD
        assert program.queues[program.queue[n.index]].queue_type == "software_dynamic"
    check_names(g, nodes, e, "model/embed_tokens")


def test_gather_index_out_of_range_fails_at_run_time(rng):
    b = nc.GraphBuilder("embed")
    table = b.parameter("table", (10, 8), "fp32")
    ids = b.parameter("ids", (4,), "int32")
    g = b.build([b.gather(table, ids)])
    model = nc.Instance("trn1.2xlarge").core(0).load(nc.compile(g))
    with pytest.raises(nc.ExecutionError, match="gather index 10 outside table of 10 rows"):
        model.execute([np.zeros((10, 8), np.float32), np.array([0, 1, 10, 2], np.int32)])


# ---------------------------------------------------------------------------------------------
# fusions: softmax, layer_norm, rms_norm, gelu, silu
# ---------------------------------------------------------------------------------------------


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_softmax(run, assert_close, rng, dtype):
    shape = (2, R, 96)
    b = nc.GraphBuilder("softmax")
    x = b.parameter("x", shape, dtype)
    with b.scope("attn"):
        s = b.softmax(x)
    g = b.build([s])
    # large logits: exp would overflow without the max subtraction (fp16 keeps a smaller range)
    offset = 10.0 if dtype == "fp16" else 100.0
    data = (rng.standard_normal(shape) * 4 + offset).astype(np.float32)
    res = run(g, [data])
    assert np.isfinite(res.out.astype(np.float32)).all()
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, _softmax(f64(rounded(data, dtype))), dtype)
    np.testing.assert_allclose(res.out.astype(np.float64).sum(axis=-1), 1.0,
                               rtol=TOL_SUM[dtype])
    nodes = compute(res.nodes(s))
    # the NKI way: -max from the reduction itself, exp summed on ACT, 1/sum, the scale on ACT
    seq = [(n.opcode, n.engine) for n in nodes[:4]]
    assert seq == [("TENSOR_REDUCE", VECTOR), ("ACTIVATE", SCALAR), ("RECIPROCAL", VECTOR),
                   ("ACTIVATE", SCALAR)]
    assert len(nodes) == 4 * 2 * n_tiles(R)
    assert all("negate" in n.operands for n in nodes if n.opcode == "TENSOR_REDUCE")
    exps = [n for n in nodes if n.opcode == "ACTIVATE" and n.activation_fn == "Exp"]
    assert len(exps) == 2 * n_tiles(R)
    assert all(" bias=" in n.operands and " acc=" in n.operands for n in exps)
    scales = [n for n in nodes if n.opcode == "ACTIVATE" and n.activation_fn != "Exp"]
    assert len(scales) == 2 * n_tiles(R) and all(" scale=" in n.operands for n in scales)
    assert all("op=max" in n.operands for n in nodes if n.opcode == "TENSOR_REDUCE")
    check_names(g, res.nodes(s), s, "model/attn")
    # Vector -> Scalar -> Vector hand-offs are semaphores
    assert all("$S[1]>=" in n.operands for n in exps + scales)


TOL_SUM = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 3e-3}


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("params", ["parameter", "weight"])
def test_layer_norm(run, assert_close, rng, dtype, params):
    shape, d = (R, 64), 64
    gd = rng.uniform(0.5, 1.5, d).astype(np.float32)
    bd = rng.standard_normal(d).astype(np.float32)
    b = nc.GraphBuilder("ln")
    x = b.parameter("x", shape, dtype)
    with b.scope("norm"):
        if params == "parameter":
            gamma = b.parameter("gamma", (d,), dtype)
            beta = b.parameter("beta", (d,), dtype)
        else:
            gamma = b.weight("gamma", (d,), dtype, array=gd)
            beta = b.weight("beta", (d,), dtype, array=bd)
        y = b.layer_norm(x, gamma, beta, eps=1e-5)
    g = b.build([y])
    data = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    inputs = [data, gd, bd] if params == "parameter" else [data]
    res = run(g, inputs)
    assert_close(res.out, res.ref, dtype)
    expected = _layer_norm(f64(rounded(data, dtype)), f64(rounded(gd, dtype)), f64(rounded(bd, dtype)), 1e-5)
    assert_close(res.out, expected, dtype)
    nodes = compute(res.nodes(y))
    assert {n.activation_fn for n in nodes if n.opcode == "ACTIVATE"} == {"Square", "Rsqrt"}
    assert {"TENSOR_REDUCE", "TENSOR_SCALAR", "TENSOR_TENSOR", "ACTIVATE"} <= {n.opcode for n in nodes}
    assert {n.engine for n in nodes} == {VECTOR, SCALAR}
    # gamma and beta are each replicated over partitions by one DMA
    param_loads = [n for n in res.nodes(y) if n.is_dma and n.queue == "qSyncWeight0"]
    assert len(param_loads) == 2
    check_names(g, res.nodes(y), y, "model/norm")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_rms_norm(run, assert_close, rng, dtype):
    shape, d = (2, R, 64), 64
    gd = rng.uniform(0.5, 1.5, d).astype(np.float32)
    b = nc.GraphBuilder("rms")
    x = b.parameter("x", shape, dtype)
    with b.scope("norm"):
        y = b.rms_norm(x, b.weight("gamma", (d,), dtype, array=gd), eps=1e-6)
    g = b.build([y])
    data = (rng.standard_normal(shape) * 2).astype(np.float32)
    res = run(g, [data])
    assert_close(res.out, res.ref, dtype)
    xs = f64(rounded(data, dtype))
    expected = xs / np.sqrt((xs * xs).mean(axis=-1, keepdims=True) + 1e-6) * f64(rounded(gd, dtype))
    assert_close(res.out, expected, dtype)
    nodes = compute(res.nodes(y))
    assert {n.activation_fn for n in nodes if n.opcode == "ACTIVATE"} == {"Square", "Rsqrt"}
    assert "TENSOR_REDUCE" not in {n.opcode for n in nodes}, "no mean is subtracted"
    assert len([n for n in res.nodes(y) if n.is_dma and n.queue == "qSyncWeight0"]) == 1


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_exact(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name,act_fn,numpy_fn", [
    ("gelu_tanh", "Gelu_apprx_tanh", _gelu_tanh),
    ("gelu_exact", "Gelu", _gelu_exact),
    ("silu", "Silu", lambda x: x / (1 + np.exp(-x))),
])
def test_activation_fusions(run, assert_close, rng, name, act_fn, numpy_fn, dtype):
    b = nc.GraphBuilder("fused")
    x = b.parameter("x", (R, C), dtype)
    with b.scope("mlp"):
        if name == "silu":
            y = b.silu(x)
        else:
            y = b.gelu(x, approximate="tanh" if name == "gelu_tanh" else "none")
    g = b.build([y])
    data = (rng.standard_normal((R, C)) * 3).astype(np.float32)
    res = run(g, [data])
    assert_close(res.out, res.ref, dtype)
    assert_close(res.out, numpy_fn(f64(rounded(data, dtype))), dtype)
    nodes = compute(res.nodes(y))
    assert kinds(nodes) == {("ACTIVATE", SCALAR)} and len(nodes) == n_tiles(R)
    assert {n.activation_fn for n in nodes} == {act_fn}
    check_names(g, res.nodes(y), y, "model/mlp")


def test_gelu_variants_differ():
    """The exact and tanh GELUs are different functions (so the tests above can tell them apart)."""
    x = np.linspace(-4, 4, 101)
    assert np.abs(_gelu_exact(x) - _gelu_tanh(x)).max() > 1e-4


# ---------------------------------------------------------------------------------------------
# a small block mixing everything: cross-engine semaphores
# ---------------------------------------------------------------------------------------------


def test_cross_engine_dependencies_are_semaphores(run, assert_close, rng):
    b = nc.GraphBuilder("block")
    x = b.parameter("x", (R, 64), "bf16")
    with b.scope("fc"):
        h = b.gelu(b.matmul(x, b.weight("w", (64, 96), "bf16")))
    with b.scope("out"):
        y = b.softmax(b.add(h, 1.0))
    g = b.build([y])
    res = run(g, [rng.standard_normal((R, 64)).astype(np.float32)])
    assert_close(res.out, res.ref, "bf16")
    program = res.program
    engines_used = {int(e) for e in program.engine[program.resource != 6]}
    assert {TENSOR, VECTOR, SCALAR, SYNC} <= engines_used
    cross = 0
    for i in range(program.n_nodes):
        for d in program.deps(i):
            cross += 1
            assert f"$S[{program.sem_increment[d]}]>=" in program.operands[i]
            assert "++@complete" in program.operands[d]
    assert cross > 0
    assert any("$S[" in t for t in program.operands)
    assert len(program.semaphore_names) >= 5 + len(program.queues)


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


def test_unsupported_ops_are_all_listed():
    b = nc.GraphBuilder("unsupported")
    x = b.parameter("x", (8, 8), "fp32")
    with b.scope("encoder"):
        c1, line1 = b.add_op("cholesky", [x], x.shape, "fp32"), _line()
    y = b.exp(c1)
    with b.scope("decoder"):
        c2, line2 = b.add_op("cholesky", [y], y.shape, "fp32"), _line()
    g = b.build([c2])
    with pytest.raises(nc.UnsupportedOpsError) as info:
        nc.compile(g, "trn1")
    err = info.value
    assert isinstance(err, nc.CompileError)
    assert [op.name for op in err.ops] == [c1.name, c2.name]
    assert err.ops[0] is c1 and err.ops[1] is c2
    text = str(err)
    assert text.startswith("unsupported ops:")
    for op, layer, line in ((c1, "model/encoder", line1), (c2, "model/decoder", line2)):
        entry = f"cholesky {op.name} at {layer} [{THIS_FILE}:{line}]"
        assert entry in text
    assert text.index(c1.name) < text.index(c2.name)
    assert "exponential" not in text


def test_dot_on_int32_is_a_compile_error():
    b = nc.GraphBuilder("intdot")
    a = b.parameter("a", (4, 8), "int32")
    w = b.parameter("w", (8, 4), "int32")
    with b.scope("proj"):
        y, line = b.dot(a, w), _line()
    g = b.build([y])
    with pytest.raises(nc.CompileError) as info:
        nc.compile(g, "trn1")
    assert not isinstance(info.value, nc.UnsupportedOpsError)
    assert info.value.op is y
    text = str(info.value)
    assert y.name in text and "int32" in text and "model/proj" in text
    assert f"{THIS_FILE}:{line}" in text


def test_zero_size_shape_is_a_compile_error():
    b = nc.GraphBuilder("empty")
    x = b.parameter("x", (0, 4), "fp32")
    y = b.exp(x)
    g = b.build([y])
    with pytest.raises(nc.CompileError, match=r"shape \[0, 4\]") as info:
        nc.compile(g, "trn1")
    assert info.value.op is x
    assert x.name in str(info.value)


def test_wrong_input_shape_is_a_value_error(rng):
    b = nc.GraphBuilder("shapes")
    x = b.parameter("x", (4, 8), "fp32")
    g = b.build([b.exp(x)])
    model = nc.Instance("trn1.2xlarge").core(0).load(nc.compile(g))
    bad = rng.standard_normal((3, 8)).astype(np.float32)
    for call in (lambda: model.execute([bad]), lambda: model.execute([bad], timing_only=True),
                 lambda: model.execute({"x": bad}), lambda: nc.run_reference(g, [bad])):
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert "'x'" in text and "[3, 8]" in text and "[4, 8]" in text
        assert text.index("[3, 8]") < text.index("given") < text.index("[4, 8]")
    with pytest.raises(ValueError, match="expected 1 inputs, got 2"):
        model.execute([bad, bad])
    with pytest.raises(ValueError, match="missing inputs: x"):
        model.execute({"y": bad})


def test_builder_rejects_bad_graphs():
    b = nc.GraphBuilder("bad")
    x = b.parameter("x", (4, 8), "fp32")
    i = b.parameter("i", (4, 8), "int32")
    with pytest.raises(nc.GraphError, match="needs a float tensor"):
        b.exp(i)
    with pytest.raises(nc.GraphError, match="do not broadcast"):
        b.add(x, b.parameter("z", (3, 8), "fp32"))
    with pytest.raises(nc.GraphError, match="contracting sizes differ"):
        b.dot(x, x)
    with pytest.raises(nc.GraphError, match="direction"):
        b.compare(x, x, "XX")
    assert DType.PRED.numpy == np.bool_


def test_matmul_reads_a_column_view_reshape_as_its_rows() -> None:
    """Regression: ``reshape([N, C, 1, 1] -> [N, C])`` of an on-chip value aliases it as a column
    view (COL layout); a dot contracting the reshape's rows read the alias's source tile directly
    ([N*C, 1]) and the run failed with a shape mismatch (a CNN's weight gradient when the last
    feature map is 1x1)."""
    b = nc.GraphBuilder("column_view")
    a, g = b.parameter("a", (2, 8)), b.parameter("g", (2, 4))
    r = b.reshape(b.maximum(b.reshape(a, (2, 8, 1, 1)), 0.0), (2, 8))
    program = nc.compile(b.build([b.dot(g, r, lhs_contract=0, rhs_contract=0)]), nc.NC_V2)
    rng = np.random.default_rng(0)
    av, gv = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    out = nc.Instance("trn1.2xlarge").core(0).load(program).execute([av, gv]).outputs[0]
    np.testing.assert_allclose(out, gv.T @ np.maximum(av, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opcode", ["divide", "subtract", "maximum"])
def test_replicated_scalar_first_operand(run, assert_close, rng, opcode):
    """A run-time scalar broadcast as the FIRST operand of a non-commutative op (``s / x``) is the
    per-partition operand with the order reversed; one load of it serves every tile of the op."""
    b = nc.GraphBuilder("rep_first")
    s = b.parameter("s", (3,), "fp32")
    x = b.parameter("x", (3 * R, C), "fp32")
    with b.scope("y"):
        one = b.slice(s, [1], [2], [1])
        y = getattr(b, opcode)(b.broadcast_to(one, (3 * R, C)), x)
    g = b.build([y])
    sd = np.array([5.0, 1.5, -2.0], np.float32)
    xd = (rng.random((3 * R, C)) + 0.5).astype(np.float32)
    res = run(g, [sd, xd])
    assert_close(res.out, res.ref)
    expected = {"divide": np.divide, "subtract": np.subtract, "maximum": np.maximum}[opcode](
        f64(sd[1]), f64(xd))
    assert_close(res.out, expected)
    ys = compute(res.nodes(y))
    assert kinds(ys) == {("TENSOR_SCALAR", VECTOR)} and len(ys) >= 4  # 4 row tiles
    rep = [n for n in res.nodes(y) if n.is_dma and ".rep" in n.operands]
    assert len(rep) == 1


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("column_first", [True, False])
def test_per_row_value_with_a_constant(run, assert_close, rng, dtype, column_first):
    """``broadcast(row statistic) / broadcast(64)`` (RMSNorm's backward): computed once per row on
    the column and widened on chip, never read through the broadcast view one element per
    descriptor."""
    b = nc.GraphBuilder("col_imm")
    s = b.parameter("s", (2, R, 1), dtype)
    x = b.parameter("x", (2, R, C), dtype)
    with b.scope("y"):
        bc = b.broadcast(s, (2, R, C), (0, 1, 2))
        k = b.broadcast(b.constant(3.0, dtype), (2, R, C), ())
        y = b.divide(bc, k) if column_first else b.divide(k, bc)
    g = b.build([b.add(y, x)])
    sd = (rng.random((2, R, 1)) + 0.5).astype(np.float32)
    xd = rng.standard_normal((2, R, C)).astype(np.float32)
    res = run(g, [sd, xd])
    assert_close(res.out, res.ref, dtype)
    loads = [n for n in res.nodes(y) if n.is_dma]
    assert not [n for n in loads if f"hbm:{bc.name}.view" in n.operands], [n.operands for n in loads]
    assert {n.opcode for n in compute(res.nodes(y))} == {"TENSOR_SCALAR", "TENSOR_COPY"}
