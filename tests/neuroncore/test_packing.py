"""Small batches share tiles: `[*batch, R, C]` with R < 128 dividing 128 packs 128/R batches per tile.

Checked end to end: numerics against the NumPy reference (both core generations) and the lowering
(one tile's worth of instructions where unpacked tiling would need one per batch).
"""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.node_semantics import MatMul
from neuroncore.compiler.tiling import is_packed, locate, tile_grid, tiles_of

TARGETS = [("trn1", "trn1.2xlarge"), ("trn2", "trn2.48xlarge")]


def _run(graph, inputs, target, instance):
    program = nc.compile(graph, target)
    result = nc.Instance(instance, sink=nc.EventSink()).core(0).load(program).execute(inputs)
    return program, result.outputs


def _inputs(graph, seed=0, high=None):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.shape).astype(np.float32) if p.dtype.is_float
            else rng.integers(0, high, size=p.shape).astype(np.int32) for p in graph.parameters]


def _close(outputs, graph, inputs):
    for out, ref in zip(outputs, nc.run_reference(graph, inputs)):
        ref = ref.astype(np.float32)
        np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-5,
                                   atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def _count(program, opcode):
    return sum(1 for i in range(program.n_nodes) if program.opcodes[program.opcode_id[i]] == opcode)


def test_tiling_rule():
    assert is_packed((32, 1, 2049), "row") and tile_grid((32, 1, 2049), "row") == (1, 32, 2049)
    assert is_packed((4, 8, 16), "row") and len(tiles_of((40, 8, 16), "row")) == 3  # 320 rows
    assert not is_packed((4, 3, 16), "row")  # 3 does not divide 128: one tile per batch
    assert not is_packed((1, 8, 16), "row") and not is_packed((4, 128, 16), "row")
    assert is_packed((16, 8), "col")  # reductions of [16, 8, C]
    assert locate((32, 4, 10), "row", 5, 2) == (0, 22)
    assert locate((64, 4, 10), "row", 40, 1) == (1, 33)
    assert locate((2, 300, 10), "row", 1, 129) == (4, 1)  # unpacked: 3 tiles per batch


@pytest.mark.parametrize("target,instance", TARGETS)
def test_decode_attention_heads_share_one_tile(target, instance):
    b = nc.GraphBuilder("attn")
    q = b.parameter("q", (2, 8, 1, 64), "fp32")
    k = b.parameter("k", (2, 8, 300, 64), "fp32")
    probs = b.softmax(b.multiply(b.dot(q, k, rhs_contract=-1), 0.125))
    g = b.build([probs])
    xs = _inputs(g)
    program, outputs = _run(g, xs, target, instance)
    _close(outputs, g, xs)
    # 16 heads x 1 row are one 16-partition tile: one softmax, one scale
    assert _count(program, "TENSOR_REDUCE") == 1
    assert _count(program, "RECIPROCAL") == 1
    # each head's scores land on its own partition of the PSUM bank
    psum_rows = {sem.psum.p0 for sem in program.semantics
                 if isinstance(sem, MatMul) and not sem.transpose}
    assert psum_rows == set(range(16))


@pytest.mark.parametrize("target,instance", TARGETS)
@pytest.mark.parametrize("case", ["small_m", "small_k_on_rows", "small_n_rows"])
def test_batched_dots_with_packed_operands(case, target, instance):
    b = nc.GraphBuilder(case)
    if case == "small_m":
        x, y = b.parameter("x", (8, 4, 64)), b.parameter("y", (8, 64, 96))
        out = b.dot(x, y)
    elif case == "small_k_on_rows":  # K rows per batch < 128: operands are packed, read via HBM
        x, y = b.parameter("x", (8, 16, 32)), b.parameter("y", (8, 16, 40))
        out = b.dot(b.exp(x), b.exp(y), lhs_contract=-2)
    else:
        x, y = b.parameter("x", (4, 2, 32)), b.parameter("y", (4, 32, 8))
        out = b.dot(b.exp(x), b.exp(y))
    g = b.build([out])
    xs = _inputs(g)
    _, outputs = _run(g, xs, target, instance)
    _close(outputs, g, xs)


@pytest.mark.parametrize("target,instance", TARGETS)
def test_packed_elementwise_reduce_iota_gather_transpose(target, instance):
    b = nc.GraphBuilder("mixed")
    x = b.parameter("x", (6, 4, 40))
    table = b.parameter("table", (50, 40))
    ids = b.parameter("ids", (6, 4), "int32", high=50)
    outs = [
        b.reduce(x, [2]), b.reduce(x, [1]), b.softmax(x),
        *[b.add(x, b.convert(b.iota((6, 4, 40), d), "fp32")) for d in range(3)],
        b.add(b.gather(table, ids), x),
        b.transpose(b.exp(x), (0, 2, 1)),
    ]
    g = b.build(outs)
    xs = _inputs(g, high=50)
    program, outputs = _run(g, xs, target, instance)
    _close(outputs, g, xs)
    # 24 rows: one tile per iota, plus the identity of the packed transpose, which runs on the PE
    # (each head's block transposed at its partition offset) rather than as an element-strided DMA
    assert _count(program, "IOTA") == 3 + 1
    assert _count(program, "MATMUL") > 0


@pytest.mark.parametrize("target, instance", TARGETS)
@pytest.mark.parametrize("side, contract_rows", [("lhs", False), ("lhs", True), ("rhs", False),
                                                 ("rhs", True)])
def test_a_dot_reads_a_view_that_merges_packed_batches_in_its_own_batches(side, contract_rows,
                                                                          target, instance):
    """An on-chip ``[2, 8, 1, 8]`` value (16 one-row batches, packed in one tile) read by a dot as
    ``[2, 8, 8]`` (2 batches of 8 rows: the same tile, so the reshape aliases it). The dot located
    its batch 1 as the root's batch 1, one row, not eight: silently wrong (JAX's
    ``jax.nn.dot_product_attention`` gradient of the query, 1.0 off)."""
    b = nc.GraphBuilder("merged_batches")
    x = b.parameter("x", (2, 8, 1, 8), "fp32")
    view = b.reshape(b.multiply(x, 0.5), (2, 8, 8))
    other = b.parameter("other", (2, 16, 8), "fp32")
    rows = -2 if contract_rows else -1
    y = (b.dot(view, other, lhs_contract=rows, rhs_contract=-1) if side == "lhs"
         else b.dot(other, view, lhs_contract=-1, rhs_contract=rows))
    graph = b.build([y])
    inputs = _inputs(graph)
    _close(_run(graph, inputs, target, instance)[1], graph, inputs)
