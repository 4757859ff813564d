"""Linear-layer orientation (compiler.orientation, docs/execution-core.md "Fusion"): a linear whose
readers all take its result feature-major writes it so (weight stationary), and the next matmul
reads it in place instead of transposing it; numerics do not change."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler import orientation

S, E = 128, 128


def _transposes(program) -> int:
    return sum(1 for t in program.tensor_instruction_type if t == "TRANSPOSE")


def _swiglu(dtype: str, expose: bool) -> nc.Graph:
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E), dtype)
    gate = g.dot(x, g.weight("wg", (E, 2 * E), dtype))
    up = g.dot(x, g.weight("wu", (E, 2 * E), dtype))
    out = g.dot(g.multiply(g.silu(gate), up), g.weight("wd", (2 * E, E), dtype))
    return g.build([out, up] if expose else [out])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_swiglu_intermediate_is_feature_major_and_read_in_place(run, assert_close, dtype):
    inputs = [np.random.default_rng(5).standard_normal((S, E)).astype(np.float32)]
    oriented = run(_swiglu(dtype, expose=False), inputs)
    # ``up`` as a graph output must stay token-major: nothing of the chain is oriented
    plain = run(_swiglu(dtype, expose=True), inputs)
    assert oriented.program.stats["oriented_dots"] == 2  # gate and up
    assert "oriented_dots" not in plain.program.stats
    # the down projection no longer transposes its [S, 2E] input (2 blocks); x is transposed per
    # oriented dot (x the moving operand of each), once for both token-major dots of ``plain``
    # (lower_matmul.shared_stationary: 1 + 2 there)
    assert _transposes(oriented.program) == _transposes(plain.program) - 1 == 2
    assert_close(oriented.out, oriented.ref, dtype)
    np.testing.assert_allclose(oriented.out, plain.outputs[0], rtol=1e-5 if dtype == "fp32" else 2e-2,
                               atol=1e-5 if dtype == "fp32" else 2e-2)


def test_bias_is_a_per_partition_column_not_a_replicated_row(run, assert_close):
    """dot -> + bias -> gelu -> dot: the bias reaches the evacuation as one value per partition
    (no DMA replicating the bias row on 128 partitions), applied by the evacuation's ACTIVATE."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E))
    h = g.gelu(g.add(g.dot(x, g.weight("w", (E, 4 * E))), g.weight("b", (4 * E,), scale=0.5)))
    graph = g.build([g.dot(h, g.weight("w2", (4 * E, E)))])
    inputs = [np.random.default_rng(6).standard_normal((S, E)).astype(np.float32)]
    result = run(graph, inputs)
    program = result.program
    assert program.stats["oriented_dots"] == 1
    once = 4 * (S * E + E * 4 * E + 4 * E * E + 4 * E)  # x, w, w2 and the bias, each read once
    assert int(program.hbm_read_bytes.sum()) == once, "the bias row was replicated on partitions"
    gelus = [i for i in range(program.n_nodes) if program.activation_fn[i] == "Gelu_apprx_tanh"]
    assert len(gelus) == 4  # one ACTIVATE per 128 output features, bias and gelu together
    assert_close(result.out, result.ref)


def test_a_chain_read_by_a_norm_or_an_output_stays_token_major():
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E))
    y = g.dot(x, g.weight("w", (E, E)))
    z = g.dot(g.exp(y), g.weight("w2", (E, E)))  # would be oriented...
    n = g.layer_norm(g.add(z, x), g.weight("gamma", (E,)), g.weight("beta", (E,)))
    graph = g.build([n, g.dot(g.tanh(n), g.weight("w3", (E, E))), g.exp(g.tanh(z))])
    plan = orientation.plan(graph, 48 * 1024)
    y_op, z_op = [op for op in graph.ops if op.opcode == "dot"][:2]
    assert y_op.index in plan.heads and z_op.index not in plan.heads
    # the norm's input and the graph output are token-major; tanh(n) is read by a dot but n is not
    assert all(graph.ops[i].opcode in ("exponential",) or i == y_op.index for i in plan.members)


def test_a_value_too_large_for_sbuf_stays_token_major():
    g = nc.GraphBuilder()
    x = g.parameter("x", (4096, E), "bf16")
    y = g.dot(x, g.weight("w", (E, 8192), "bf16"))
    graph = g.build([g.dot(g.exp(y), g.weight("w2", (8192, E), "bf16"))])
    assert orientation.plan(graph, 48 * 1024).members == frozenset()


def test_a_decode_step_stays_token_major():
    """One token: weight-stationary matmuls would cost a LoadStationary per 128 x 128 weight block
    to save the transpose of one row (Llama-2-70B tp32 decode: 25.7 vs 29.0 ms)."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (1, E), "bf16")
    y = g.dot(x, g.weight("w", (E, 4 * E), "bf16"))
    graph = g.build([g.dot(g.silu(y), g.weight("w2", (4 * E, E), "bf16"))])
    assert orientation.plan(graph, 48 * 1024).members == frozenset()
    assert orientation.plan(graph, 48 * 1024).heads == {}
