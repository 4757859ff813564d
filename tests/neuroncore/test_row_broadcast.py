"""1-D weights read by every row (a linear's bias when its result stays token-major, a LayerNorm's
scale and shift) are loaded once, d elements, and replicated on chip by one Scalar-engine
PARTITION_BROADCAST (compiler.lower_reduce.row_params), not by a DMA that moves the row 128 times."""

from __future__ import annotations

import numpy as np

import neuroncore as nc

S, E = 128, 128


def _bert_sublayer() -> nc.Graph:
    """x -> x @ w + b -> + x -> layer_norm(gamma, beta): the dot's reader is a norm, so it stays
    token-major and its bias is a row read by every partition."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E))
    h = g.add(g.dot(x, g.weight("w", (E, E))), g.weight("b", (E,), scale=0.5))
    out = g.layer_norm(g.add(h, x), g.weight("gamma", (E,)), g.weight("beta", (E,)))
    return g.build([out])


def test_bias_and_norm_rows_are_loaded_once_and_broadcast_on_chip(run, assert_close):
    inputs = [np.random.default_rng(7).standard_normal((S, E)).astype(np.float32)]
    result = run(_bert_sublayer(), inputs)
    program = result.program
    assert "oriented_dots" not in program.stats
    itemsize = 4
    rows = 3  # b, gamma, beta
    row_loads = [int(program.hbm_read_bytes[i]) for i in range(program.n_nodes)
                 if program.hbm_read_bytes[i] and ".rows" in program.operands[i]]
    assert row_loads == [E * itemsize] * rows, "a 1-D weight row was replicated by DMA"
    # x (twice: the dot and the residual), w and the three rows: nothing else is read
    assert int(program.hbm_read_bytes.sum()) == itemsize * (2 * S * E + E * E + rows * E)
    opcodes = [program.opcodes[k] for k in program.opcode_id]
    assert opcodes.count("PARTITION_BROADCAST") == rows
    assert_close(result.out, result.ref)
