"""Casts folded into the elementwise instructions that produce or read them (compiler/cast_folding.py),
and a one-hot made from broadcasts computed inside the loop that reads it (streaming.joins).

docs/execution-core.md, calibration table: engines convert on read and write (neuroncore.md §2.6),
so a cast between elementwise ops is no pass of its own; numerics are bit-identical.
"""

from __future__ import annotations

import numpy as np

import neuroncore as nc
from neuroncore.compiler.cast_folding import fold_casts
from neuroncore.compiler.lowering_state import HbmTensorKind

R, C = 256, 512


def _cross_entropy_block() -> tuple[nc.Graph, list[np.ndarray]]:
    """The gradient pass of a streamed cross-entropy over one vocabulary block, written as a
    framework exports it: BF16 logits cast to FP32, ``exp(x - max) / sum - one_hot``, cast back."""
    g = nc.GraphBuilder()
    logits = g.parameter("logits", (R, C), "bf16")
    peak = g.parameter("peak", (R,), "fp32")
    total = g.parameter("total", (R,), "fp32")
    target = g.parameter("target", (R,), "fp32")
    columns = g.convert(g.iota((C,), 0), "fp32")  # each column's index (before the loop)
    x = g.convert(logits, "fp32")
    probs = g.divide(g.exp(g.subtract(x, g.broadcast(peak, (R, C), (0,)))),
                     g.broadcast(total, (R, C), (0,)))
    one_hot = g.compare(g.broadcast(columns, (R, C), (1,)), g.broadcast(target, (R, C), (0,)), "EQ")
    grad = g.convert(g.subtract(probs, g.convert(one_hot, "fp32")), "bf16")
    graph = g.build([g.reshape(grad, (2 * R, C // 2))])  # (a cast that is an output keeps its name)
    rng = np.random.default_rng(0)
    values = rng.standard_normal((R, C)).astype(np.float32)
    inputs = [values, values.max(axis=1), np.exp(values - values.max(axis=1, keepdims=True)).sum(axis=1),
              rng.integers(0, C, R).astype(np.float32)]
    return graph, inputs


def test_casts_are_folded_into_the_elementwise_ops(run):
    graph, inputs = _cross_entropy_block()
    folded = fold_casts(graph)
    assert [op.opcode for op in folded.ops].count("convert") == 1  # the iota's (int32 -> fp32) only
    compare = next(op for op in folded.ops if op.opcode == "compare")
    assert compare.dtype.value == "fp32"  # the one-hot written as 1.0 / 0.0
    last = folded.outputs[0].operands[0]
    assert last.opcode == "subtract" and last.dtype.value == "bf16"  # the cast is its write
    result = run(graph, inputs)
    program = result.program
    # no engine pass only changes a type: one TENSOR_COPY at most (the iota's column cast)
    copies = [i for i in range(program.n_nodes) if program.queue[i] < 0
              and program.opcodes[program.opcode_id[i]] == "TENSOR_COPY"]
    assert len(copies) <= 1
    # bit-identical to the unfused graph's reference
    np.testing.assert_array_equal(result.out.astype(np.float32), result.ref.astype(np.float32))
    np.testing.assert_array_equal(result.out.astype(np.float32),
                                  nc.run_reference(folded, inputs)[0].astype(np.float32))


def test_a_one_hot_of_broadcasts_is_computed_in_the_loop_that_reads_it(run):
    """The compare reads nothing of the probabilities' fusion group, but its reader does: it
    joins the group and its value never goes to HBM."""
    graph, inputs = _cross_entropy_block()
    program = run(graph, inputs).program
    # one group: x - max, exp, / sum, the one-hot's compare, probs - one_hot
    assert program.stats["fusion_groups"] == 1 and program.stats["fused_ops"] == 5
    compare = next(op for op in program.graph.ops if op.opcode == "compare")
    stored = [t.name for t in program.hbm_tensors.values()
              if t.kind is HbmTensorKind.SCRATCH and compare.name in t.name]
    assert stored == [], f"the one-hot went through HBM: {stored}"


def test_a_cast_read_by_a_matmul_stays(run, assert_close):
    """The Tensor engine reads the types it multiplies: a widening cast a dot reads is kept, and a
    graph with nothing to fold is returned unchanged."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (128, 128), "bf16")
    w = g.parameter("w", (128, 128), "fp32")
    graph = g.build([g.dot(g.convert(x, "fp32"), w)])
    assert fold_casts(graph) is graph
