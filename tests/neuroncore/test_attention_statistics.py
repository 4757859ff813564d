"""Softmax and attention's row statistics as the NKI kernels lower them (docs/execution-core.md,
"Fusion"): the row max is negated by the reduction itself, the normalisation runs on the Scalar
engine, and a reduction's per-head results stored to HBM do not wait for each other."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

import neuroncore as nc

HEADS, SEQ, D = 16, 128, 64


def _heads_graph() -> nc.Graph:
    g = nc.GraphBuilder()
    q = g.parameter("q", (HEADS, SEQ, D), "bf16")
    k = g.parameter("k", (HEADS, SEQ, D), "bf16")
    v = g.parameter("v", (HEADS, SEQ, D), "bf16")
    scores = g.dot(q, k, rhs_contract=-1)
    lse = g.reduce(scores, [2], kind="max")  # a row statistic per head, kept for a backward
    return g.build([g.dot(g.softmax(scores), v), lse])


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((HEADS, SEQ, D)).astype(np.float32) for _ in range(3)]


def test_softmax_negates_its_max_in_the_reduction_and_scales_on_the_scalar_engine(run) -> None:
    result = run(_heads_graph(), _inputs())
    program = result.program
    softmax = next(op for op in program.graph.ops if op.opcode == "softmax")
    nodes = np.flatnonzero(program.op_index == softmax.index)
    opcodes = [program.opcodes[program.opcode_id[i]] for i in nodes]
    assert "TENSOR_SCALAR" not in opcodes  # neither the -max nor the 1/sum scale on the Vector engine
    reduces = [i for i in nodes if program.opcodes[program.opcode_id[i]] == "TENSOR_REDUCE"]
    assert len(reduces) == HEADS and all("negate" in program.operands[i] for i in reduces)
    assert opcodes.count("ACTIVATE") == 2 * HEADS  # exp(x - max) summed, then x * (1 / sum)
    for out, ref in zip(result.outputs, result.reference):
        np.testing.assert_array_equal(out, ref)  # the same FP32 products, rounded once


def test_a_reductions_column_stores_do_not_wait_for_each_other(run) -> None:
    """Each head's ``[rows, 1]`` statistic is its own region of the output: the stores are
    triggered one after another without waiting for the previous one to land."""
    result = run(_heads_graph(), _inputs())
    program = result.program
    lse = next(op for op in program.graph.ops if op.opcode == "reduce")
    stores = [i for i in np.flatnonzero(program.op_index == lse.index)
              if program.queue[i] >= 0 and program.hbm_write_bytes[i] > 0]
    assert len(stores) == HEADS
    for before, after in pairwise(stores):
        trigger = int(program.trigger[after])
        assert before not in set(program.deps(trigger).tolist()), "a column store waited for the last"
    # and nothing else about them changed: the statistic is the reference's
    np.testing.assert_array_equal(result.outputs[1], result.reference[1])
