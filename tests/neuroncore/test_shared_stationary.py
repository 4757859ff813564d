"""Dots that read one activation share its PE transposes (lower_matmul.shared_stationary,
docs/execution-core.md "Dots that read one activation"): q, k and v projections of the same
normalised hidden states transpose each of its 128 x 128 blocks once, not once per projection;
each output is computed by the same instructions as alone, so results are bit-identical."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc


def _transposes(program) -> int:
    return sum(1 for t in program.tensor_instruction_type if t == "TRANSPOSE")


def _projections(dtype: str, rows: int, e: int, widths: tuple[int, ...], *, copies: bool) -> nc.Graph:
    """``x @ W_i`` for each width, each with a bias and (the last) a gelu; ``copies``: each dot
    reads its own parameter (the same values fed to each), so nothing is shared."""
    g = nc.GraphBuilder()
    xs = [g.parameter(f"x{i}", (rows, e), dtype) for i in range(len(widths) if copies else 1)]
    outs = []
    with g.scope("layers.0"):
        for i, n in enumerate(widths):
            x = xs[i if copies else 0]
            y = g.add(g.dot(x, g.weight(f"w{i}", (e, n), dtype)), g.weight(f"b{i}", (n,), dtype, scale=0.5))
            outs.append(g.gelu(y) if i == len(widths) - 1 else y)
    return g.build(outs)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(("rows", "e", "widths"), [(256, 384, (256, 128, 128)),
                                                   (200, 320, (200, 72, 520))])  # odd sizes
def test_projections_of_one_activation_transpose_it_once(run, assert_close, dtype, rows, e, widths):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, e)).astype(np.float32)
    shared = run(_projections(dtype, rows, e, widths, copies=False), [x])
    apart = run(_projections(dtype, rows, e, widths, copies=True), [x] * len(widths))
    blocks = -(-rows // 128) * -(-e // 128)
    assert shared.program.stats["shared_stationary_dots"] == len(widths) - 1
    assert "shared_stationary_dots" not in apart.program.stats
    assert _transposes(apart.program) == len(widths) * blocks
    assert _transposes(shared.program) == blocks  # x's blocks once, not once per projection
    for out, ref, alone in zip(shared.outputs, shared.reference, apart.outputs):
        assert_close(out, ref, dtype)
        np.testing.assert_array_equal(out, alone)  # the same instructions per output


def _pair(second: dict, second_shape: tuple[int, int] = (256, 192), dtype: str = "fp32") -> nc.Graph:
    g = nc.GraphBuilder()
    x = g.parameter("x", (256, 256), dtype)
    with g.scope("layers.0"):
        a = g.dot(x, g.weight("w0", (256, 192), dtype))
        b = g.dot(x, g.weight("w1", second_shape, dtype), **second)
    return g.build([a, b])


@pytest.mark.parametrize(("second", "shape"), [
    ({"out_dtype": "bf16"}, (256, 192)),  # another result type
    ({"lhs_contract": -2}, (256, 192)),  # x^T @ w: contracts over x's rows, reads x in place
])
def test_dots_that_differ_do_not_share(run, assert_close, second, shape):
    rng = np.random.default_rng(12)
    result = run(_pair(second, shape), [rng.standard_normal((256, 256)).astype(np.float32)])
    assert "shared_stationary_dots" not in result.program.stats
    for out, ref in zip(result.outputs, result.reference):
        assert_close(out, ref, out.dtype.name if out.dtype != np.float32 else "fp32")


def test_dots_of_different_layers_do_not_share(run):
    """A layer is lowered (and relocated) as a whole: a value read by the dots of several layers
    (an encoder's output read by each decoder layer's cross-attention) is transposed per layer."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (256, 256))
    outs = []
    for layer in range(2):
        with g.scope(f"layers.{layer}"):
            outs.append(g.dot(x, g.weight("w", (256, 128))))
    result = run(g.build(outs), [np.random.default_rng(13).standard_normal((256, 256)).astype(np.float32)])
    assert "shared_stationary_dots" not in result.program.stats
    assert _transposes(result.program) == 2 * 4


def _autocast_projections(copies: bool) -> nc.Graph:
    """As a torch ``Linear`` traced with auto-cast: each matmul reshapes ``x [2, 100, 320]`` to
    rows and casts it to bf16 itself, so the three projections read three casts of three views."""
    g = nc.GraphBuilder(autocast="bf16")
    xs = [g.parameter(f"x{i}", (2, 100, 320)) for i in range(3 if copies else 1)]
    with g.scope("layers.0"):
        outs = [g.matmul(xs[i if copies else 0], g.weight(f"w{i}", (320, n)))
                for i, n in enumerate((192, 72, 136))]
    return g.build(outs)


def test_copies_of_one_activation_share_its_transposes(run, assert_close):
    """The same reshape and cast of the same value, once per linear, are one value to a compiler
    that eliminates common subexpressions: the linears share its transposes, and the copies are
    not made (``copies_of``)."""
    x = np.random.default_rng(14).standard_normal((2, 100, 320)).astype(np.float32)
    shared = run(_autocast_projections(copies=False), [x])
    apart = run(_autocast_projections(copies=True), [x] * 3)
    blocks = -(-200 // 128) * -(-320 // 128)
    assert shared.program.stats["shared_stationary_dots"] == 2
    assert _transposes(apart.program) == 3 * blocks and _transposes(shared.program) == blocks
    def casts(p) -> int:
        return sum(1 for i in range(p.n_nodes)
                   if p.op_index[i] >= 0 and p.graph.ops[p.op_index[i]].opcode == "convert")

    assert 0 < casts(shared.program) < casts(apart.program)  # the two later casts are not made
    for out, ref, alone in zip(shared.outputs, shared.reference, apart.outputs):
        assert_close(out, ref, "bf16")
        np.testing.assert_array_equal(out, alone)
