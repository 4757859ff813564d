"""bf16 auto-cast of matmuls (FP32 result, FP32 accumulation) and compile-time folding of weight casts."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.dtypes import DType


def _graph(autocast):
    b = nc.GraphBuilder("ac", autocast=autocast)
    x = b.parameter("x", (64, 256))
    w = b.weight("w", (256, 300))
    return b.build([b.gelu(b.matmul(x, w))])


def test_autocast_casts_matmul_operands_and_keeps_fp32_result():
    g = _graph("bf16")
    dot = next(op for op in g.ops if op.opcode == "dot")
    assert dot.dtype is DType.FP32
    assert all(o.opcode == "convert" and o.dtype is DType.BF16 for o in dot.operands)
    assert next(op for op in g.ops if op.opcode == "gelu").dtype is DType.FP32


def test_autocast_numerics_bf16_operands_fp32_accumulation():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((64, 256)).astype(np.float32)]
    g16, g32 = _graph("bf16"), _graph(None)
    out16 = nc.Instance(sink=nc.EventSink()).core(0).load(nc.compile(g16, "trn1")).execute(xs).outputs[0]
    np.testing.assert_allclose(out16, nc.run_reference(g16, xs)[0], rtol=1e-5, atol=1e-5)
    # against the FP32 model the error is bf16 operand rounding only (not bf16 accumulation)
    exact = nc.run_reference(g32, xs)[0]
    err = np.abs(out16 - exact).max() / np.abs(exact).max()
    assert 1e-4 < err < 2e-2


def test_weight_cast_is_folded_into_a_bf16_weight_in_hbm():
    program = nc.compile(_graph("bf16"), "trn1")
    weights = [t for t in program.hbm_tensors.values() if t.kind == "weight"]
    assert len(weights) == 1 and weights[0].dtype is DType.BF16
    # no on-chip conversion of the weight: the only TENSOR_COPYs convert the activation
    converts = [i for i in range(program.n_nodes)
                if program.opcodes[program.opcode_id[i]] in ("TENSOR_COPY",)
                and program.graph.ops[program.op_index[i]].opcode == "convert"]
    assert all(program.graph.ops[program.op_index[i]].operands[0].opcode == "parameter"
               for i in converts)
    # bf16 weights: half the HBM bytes of the fp32 model's weights
    fp32 = nc.compile(_graph(None), "trn1")
    assert program.weight_bytes() * 2 == fp32.weight_bytes()


def _broadcast_weight_bmm(batch: int = 4, autocast: str | None = None) -> nc.Graph:
    """torch's export of a ``Linear`` on a non-contiguous ``[B, S, H]`` input: a ``bmm`` with the
    weight broadcast over the batch (BERT's attention output at batch > 1)."""
    b = nc.GraphBuilder("bmm", autocast=autocast)
    x = b.parameter("x", (batch, 128, 64))
    w = b.weight("w", (64, 96))
    out = b.dot(x, b.broadcast(w, (batch, 64, 96), (1, 2)), lhs_contract=-1, rhs_contract=1)
    return b.build([out]).pruned()  # as the frontends build theirs


@pytest.mark.parametrize("where", ["compiler option", "traced auto-cast"])
def test_a_broadcast_weight_is_cast_once_at_compile_time(where):
    """Under matmul auto-cast the broadcast of a weight is cast at its weight (folded at compile
    time, stored BF16) and broadcast after: no per-execution pass over ``B`` copies of the weight,
    and the same values (rounding commutes with a view). Both ways to auto-cast: the compiler's
    option (``compiler.precision``) and the frontends' (``GraphBuilder(autocast=)``)."""
    if where == "compiler option":
        options = nc.CompilerOptions(auto_cast=nc.AutoCast.MATMULT)
        program = nc.compile(_broadcast_weight_bmm(), "trn1", options)
    else:
        program = nc.compile(_broadcast_weight_bmm(autocast="bf16"), "trn1")
    converts = [op for op in program.graph.ops if op.opcode == "convert"]
    assert sorted(op.operands[0].opcode for op in converts) == ["constant", "parameter"]
    weights = [t for t in program.hbm_tensors.values() if t.kind == "weight"]
    assert [t.dtype for t in weights] == [DType.BF16]
    scratch = [t.name for t in program.hbm_tensors.values() if t.kind == "scratch"]
    assert scratch == [], f"the broadcast weight was materialised: {scratch}"
    xs = [np.random.default_rng(5).standard_normal((4, 128, 64)).astype(np.float32)]
    out = nc.Instance(sink=nc.EventSink()).core(0).load(program).execute(xs).outputs[0]
    np.testing.assert_allclose(out, nc.run_reference(program.graph, xs)[0], rtol=1e-5, atol=1e-5)
