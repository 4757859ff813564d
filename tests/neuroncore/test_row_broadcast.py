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


def _row_constant_graph(experts: int, rows: int, cols: int) -> nc.Graph:
    """Operands constant along each row: a select on ``iota == e``-style per-expert predicates
    (``[E, 1, 1] -> [E, R, C]``, select_backward's mask), per-expert scales (a multiply, a
    subtraction with the scale on the left, an add of a scale and a constant) and ALiBi-style
    per-head slopes ``[H, 1, 1] -> [B, H, R, C]``."""
    g = nc.GraphBuilder()
    shape = (experts, rows, cols)
    x = g.parameter("x", shape)
    m = g.parameter("m", (experts,))
    s = g.parameter("s", (experts, 1, 1))
    pred = g.broadcast(g.compare(g.reshape(m, (experts, 1, 1)), 0.0, "GT"), shape, (0, 1, 2))
    scale = g.broadcast(s, shape, (0, 1, 2))
    picked = g.select(pred, x, 0.0)
    scaled = g.subtract(scale, g.multiply(picked, scale))
    shifted = g.multiply(g.add(scale, g.broadcast(g.constant(1.5), shape, ())), scaled)
    slopes = g.broadcast(g.reshape(s, (experts,)), (2, experts, rows, cols), (1,))
    alibi = g.multiply(g.broadcast(shifted, (2, experts, rows, cols), (1, 2, 3)), slopes)
    return g.build([shifted, alibi])


def test_row_constant_operands_are_read_one_column_per_tile(run, assert_close):
    """A broadcast constant along each row (its last dim broadcast) is read as the first column of
    each tile and used as a per-partition operand; read whole, every element of its broadcast view
    was a descriptor of its own (a Mixtral step's select_backward masks: 500 us per [4, 512, 128]
    select). 160 rows: a partial tile; 48 rows: tiles holding rows of several experts."""
    for experts, rows, cols in ((4, 160, 128), (3, 48, 64)):
        rng = np.random.default_rng(3)
        inputs = [rng.standard_normal((experts, rows, cols)).astype(np.float32),
                  np.array([1.0, -1.0, 2.0, -0.5][:experts], np.float32),
                  rng.standard_normal((experts, 1, 1)).astype(np.float32)]
        result = run(_row_constant_graph(experts, rows, cols), inputs)
        for out, ref in zip(result.outputs, result.reference):
            assert_close(out, ref)
        program = result.program
        wide = [program.operands[i] for i in range(program.n_nodes)
                if program.dma_bytes[i] and "broadcast" in program.operands[i]
                and int(program.dma_bytes[i]) > 128 * 4]
        assert not wide, wide[:3]
