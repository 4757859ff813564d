"""The JAX frontend: HLO names, layer paths and source lines on the IR; op mappings against JAX;
unsupported ops listed by check(); errors for untraceable functions and wrong inputs."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import neuroncore as nc  # noqa: E402
from neuroncore.frontends import jax_frontend as jf  # noqa: E402
from neuroncore.ir.graph import ALL_OPS  # noqa: E402

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((16, 32)).astype(np.float32) / 4
W2 = RNG.standard_normal((32, 16)).astype(np.float32) / 4
EMBED = RNG.standard_normal((10, 16)).astype(np.float32)


def line_of(fn, marker: str) -> int:
    """Line number (in this file) of the line of ``fn`` that contains ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


@jax.jit
def ffn(x, w):
    return jnp.tanh(x @ w)  # marker: ffn dot


def scoped_model(x, w):
    with jax.named_scope("encoder"):
        h = ffn(x, w)
    return h @ W2 * 2.0  # marker: scoped_model dot


def hlo_names(fn, *args) -> set[str]:
    text = jax.jit(fn, keep_unused=True).lower(*args).compiler_ir("hlo").as_hlo_text()
    return set(re.findall(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", text, re.MULTILINE))


def test_ir_ops_keep_hlo_names_layers_and_source_lines():
    x = jnp.asarray(RNG.standard_normal((4, 16)).astype(np.float32))
    w = jnp.asarray(W1)
    graph = jf.convert(scoped_model, (x, w), autocast=None).graph
    names = hlo_names(scoped_model, x, w)
    assert len({op.name for op in graph.ops}) == len(graph.ops), "IR op names are unique"
    dots = [op for op in graph.ops if op.opcode == "dot"]
    assert len(dots) == 2 and all(op.name in names for op in dots)
    for op in graph.ops:
        # an HLO instruction's own name, or <hlo name>.<role> for a helper op of its mapping
        assert op.name in names or op.name.rsplit(".", 1)[0] in names, op.name
    inner, outer = dots
    assert inner.layer == "scoped_model/encoder/ffn"
    assert outer.layer == "scoped_model"
    assert inner.frames[-1].file == __file__ and inner.frames[-1].function == "ffn"
    assert inner.frames[-1].line == line_of(ffn, "marker: ffn dot")
    assert inner.frames[-2].line == line_of(scoped_model, "h = ffn(x, w)")
    assert outer.source == f"{__file__}:{line_of(scoped_model, 'marker: scoped_model dot')}"
    # the closed-over W2 is a weight located at its use; the parameters at the function
    weight = outer.operands[1]
    assert weight.opcode == "constant" and weight.attrs["init"].kind == "array"
    np.testing.assert_array_equal(weight.attrs["init"].materialize(weight.shape), W2)
    assert weight.source == outer.source
    assert [p.name for p in graph.parameters] == ["x.1", "w.1"]
    assert graph.parameters[0].source == f"{__file__}:{line_of(scoped_model, 'def scoped_model')}"


def test_layer_path_rule():
    assert jf.layer_path(["jit(attention)", "jit(main)"]) == "attention"
    assert jf.layer_path(["jit(attention)", "bqhd,bkhd->bhqk"]) == "attention/bqhd,bkhd->bhqk"
    assert jf.layer_path(["jit(f)", "jit(_where)"]) == "f"
    assert jf.layer_path(["transpose(jvp(f))", "encoder", "jit(ffn)"]) == "f/encoder/ffn"


def test_stack_frame_table_from_text_matches_proto():
    lowered = jf.lower(scoped_model, (jnp.ones((4, 16)), jnp.asarray(W1)))
    text, proto = jf.hlo_text(lowered)
    from_proto = jf.frames_from_proto(proto)
    assert from_proto and jf.frames_from_text(text) == from_proto


def mixed_ops(x, ids):
    table = jnp.asarray(EMBED)
    return (
        jnp.pad(x, ((0, 0), (1, 2))), x[:, ::2], jnp.concatenate([x, -x], axis=1), jnp.clip(x, -0.5, 0.5),
        jnp.arange(16) + x, jnp.abs(x) ** 0.5, x ** 3, 1.0 / (x ** 2 + 1.0), jnp.sign(x),
        jnp.expm1(x), jnp.log1p(jnp.abs(x)), jax.scipy.special.erf(x), jax.nn.logsumexp(x, axis=-1),
        jnp.max(x, axis=0), jnp.min(x, axis=1), jnp.any(x > 1.0, axis=1), jnp.all(x > -1.0, axis=1),
        x.T @ x, jnp.mean(x), table[ids], jnp.take(table, ids, axis=0),
        jax.nn.gelu(x), jax.nn.gelu(x, approximate=False), jax.nn.silu(x), jax.nn.softmax(x),
        jax.nn.softmax(x, axis=0), jnp.einsum("bij,bjk->bik", x.reshape(2, 2, 16), x.reshape(2, 16, 2)),
        jnp.einsum("ij,ijk->k", x, x.reshape(4, 16, 1) * x.reshape(4, 1, 16)),
        x @ x[0], jnp.outer(x[0], x[1]), jnp.where(ids[0, :4] > 4, x.sum(1), 0.0),
    )


def test_op_mappings_match_jax():
    x = jnp.asarray(RNG.standard_normal((4, 16)).astype(np.float32))
    ids = jnp.asarray(RNG.integers(0, 10, (3, 5)).astype(np.int32))
    converted = jf.convert(mixed_ops, (x, ids), autocast=None)
    opcodes = {op.opcode for op in converted.graph.ops}
    assert {"softmax", "gelu", "silu", "gather", "reduce", "dot", "concatenate"} <= opcodes
    assert opcodes <= ALL_OPS
    model = nc.trace(mixed_ops, (x, ids))
    got = model(x, ids)
    want = mixed_ops(x, ids)
    assert isinstance(got, tuple) and len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, jax.Array) and g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=1e-4, atol=1e-5, err_msg=f"output {k}")


def test_pytrees_in_and_out_bf16_and_python_scalars():
    params = {"w": jnp.asarray(W1).astype(jnp.bfloat16), "b": jnp.ones(32, jnp.bfloat16)}

    def fn(p, x, scale):
        y = x.astype(jnp.bfloat16) @ p["w"] + p["b"]
        return {"y": y, "pair": (y.astype(jnp.float32) * scale, x)}

    x = jnp.asarray(RNG.standard_normal((4, 16)).astype(np.float32))
    model = nc.trace(fn, (params, x, 3.0))
    assert [p.dtype.value for p in model.graph.parameters] == ["bf16", "bf16", "fp32", "fp32"]
    got = model(params, x, 3.0)
    want = fn(params, x, 3.0)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert got["y"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got["y"], np.float32), np.asarray(want["y"], np.float32),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(np.asarray(got["pair"][1]), np.asarray(x))


def loop_sort_cholesky(x):
    y = jax.lax.while_loop(lambda v: v.sum() < 1e3, lambda v: v * 2.0, x)  # marker: while
    s = jax.lax.sort((y > 1.0, x), num_keys=1)[1]  # marker: sort (a boolean key; numeric ones map)
    pair = jax.lax.reduce((x, x), (0.0, -jnp.inf),  # a variadic reduce that is not an argmax
                          lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])), (1,))
    return jnp.linalg.cholesky(s @ s.T + 4.0 * jnp.eye(4)), pair  # marker: chol


def test_check_lists_unsupported_ops_with_layer_and_line():
    ops = nc.check(loop_sort_cholesky, (jnp.ones((4, 16)),))
    by_opcode = {op.opcode: op for op in ops}
    assert {"while", "sort", "custom-call", "reduce(variadic)"} <= set(by_opcode)
    assert by_opcode["while"].source == f"{__file__}:{line_of(loop_sort_cholesky, 'marker: while')}"
    assert by_opcode["sort"].source == f"{__file__}:{line_of(loop_sort_cholesky, 'marker: sort')}"
    assert by_opcode["sort"].layer == "loop_sort_cholesky"  # lax.sort: no jnp scope of its own
    chol = by_opcode["custom-call"]
    assert chol.layer == "loop_sort_cholesky/cholesky" and chol.name.startswith("cholesky")
    assert chol.source == f"{__file__}:{line_of(loop_sort_cholesky, 'marker: chol')}"
    with pytest.raises(nc.UnsupportedOpsError, match=r"while while\.\d+ at loop_sort_cholesky"):
        nc.trace(loop_sort_cholesky, (jnp.ones((4, 16)),))


def scanned_rnn(params, xs):
    def cell(h, x):
        h = jnp.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        return h, h * 2.0

    return jax.lax.scan(cell, jnp.zeros((xs.shape[1], params["wh"].shape[0])), xs)


def scanned_layers(params, x):
    """Transformer-style stacked weights, one ``scan`` step per layer."""
    def layer(h, p):
        y = jnp.tanh(h @ p["w"] + p["b"])
        return h + y, (y ** 2).mean()

    return jax.lax.scan(layer, x, params)


def scanned_train_step(params, x, y):
    def loss(p):
        h, aux = scanned_layers(p, x)
        return jnp.mean((h - y) ** 2) + 0.1 * aux.sum()

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)


def loops_and_updates(x):
    reverse = jax.lax.scan(lambda c, r: (c * 0.9 + r, c), jnp.zeros(x.shape[1:]), x, reverse=True)
    unrolled = jax.lax.scan(lambda c, r: (c + r, c * 2.0), jnp.zeros(x.shape[1:]), x, unroll=2)
    counted = jax.lax.fori_loop(1, 4, lambda i, v: v * 0.5 + i, x)
    mapped = jax.lax.map(lambda r: r * r.sum(), x)
    placed = jax.lax.dynamic_update_slice(x, jnp.full((2, 2), 7.0), (5, 1))  # start clamped to 4
    return reverse, unrolled, counted, mapped, placed, x.at[2].set(-1.0)


def test_scan_and_counted_loops_unroll_and_match_jax():
    """``lax.scan`` (an RNN, stacked layers, reverse, ``unroll=``), ``fori_loop`` and ``lax.map``
    lower to an HLO ``while`` whose trip count is known at trace time: it is unrolled, the loop
    counter folded, and the per-step ``dynamic-slice`` / ``dynamic-update-slice`` become slices
    and concatenations at constant offsets (before: ``while`` unsupported; a scanned training step
    too). A loop whose condition reads data stays an unsupported ``while``
    (test_check_lists_unsupported_ops_with_layer_and_line)."""
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    rnn = {"wx": jax.random.normal(k1, (8, 16)) * 0.3, "wh": jax.random.normal(k2, (16, 16)) * 0.3,
           "b": jnp.zeros(16)}
    stacked = {"w": jax.random.normal(k3, (3, 16, 16)) * 0.2, "b": jax.random.normal(k4, (3, 16)) * 0.1}
    cases = [
        (scanned_rnn, (rnn, jax.random.normal(key, (5, 2, 8)))),
        (scanned_layers, (stacked, jax.random.normal(key, (4, 16)))),
        (scanned_train_step, (stacked, jax.random.normal(k1, (4, 16)), jax.random.normal(k2, (4, 16)))),
        (loops_and_updates, (jax.random.normal(key, (6, 3)),)),
    ]
    for fn, args in cases:
        traced = nc.trace(fn, args)
        assert not [op for op in traced.graph.ops if op.opcode == "while"]
        for got, want in zip(jax.tree_util.tree_leaves(traced(*args)), jax.tree_util.tree_leaves(fn(*args))):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=2e-6,
                                       err_msg=fn.__name__)


def data_dependent(x):
    if x.sum() > 0:  # marker: python if
        return x
    return -x


def test_untraceable_control_flow_is_one_clear_line():
    with pytest.raises(nc.TraceError) as info:
        nc.trace(data_dependent, (jnp.ones((4, 16)),))
    message = str(info.value)
    assert "\n" not in message and "data_dependent" in message
    assert f"{__file__}:{line_of(data_dependent, 'marker: python if')}" in message
    assert "jnp.where" in message


def test_trace_errors_for_bad_functions_and_inputs():
    with pytest.raises(nc.TraceError, match=r"cannot trace .*dot_general"):
        nc.trace(lambda x: x @ jnp.ones((3, 3)), (jnp.ones((4, 16)),))
    model = nc.trace(lambda x, y: x * y, (jnp.ones((4, 16)), jnp.ones((4, 16))))
    with pytest.raises(nc.TraceError, match=r"shapes \[\(4, 8\), \(4, 16\)\] given"):
        model(jnp.ones((4, 8)), jnp.ones((4, 16)))
    with pytest.raises(nc.TraceError, match="traced with 2 input array"):
        model(jnp.ones((4, 16)))
    np.testing.assert_array_equal(np.asarray(model(jnp.ones((4, 16)), jnp.full((4, 16), 3.0))), 3.0)


def rounding(x, ids):
    return (jnp.floor(x * 3.0), jnp.ceil(x * 3.0), x % 0.75, jnp.fmod(x, 0.75), ids % 4, ids // 3,
            jnp.floor(jnp.asarray([2.0**30, -2.0**40, jnp.inf, -jnp.inf, jnp.nan, -0.5, 7.0])))


def test_floor_ceil_and_remainder_match_jax():
    """``jax.image.resize(..., "nearest")`` (flax's UNet upsampling) floors its source indices and
    ``%`` on arrays is HLO ``remainder``: both stopped as unsupported ops."""
    x = jnp.asarray(RNG.standard_normal((4, 16)).astype(np.float32) * 4)
    ids = jnp.asarray(RNG.integers(-20, 20, (3, 5)).astype(np.int32))
    got, want = nc.trace(rounding, (x, ids))(x, ids), rounding(x, ids)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-5, err_msg=f"output {k}")
    img = jnp.asarray(RNG.standard_normal((1, 5, 7, 3)).astype(np.float32))

    def upsample(v):
        return jax.image.resize(v, (1, 10, 14, 3), "nearest")

    np.testing.assert_array_equal(np.asarray(nc.trace(upsample, (img,))(img)), np.asarray(upsample(img)))


def test_top_k_matches_jax_and_routes_experts():
    """``jax.lax.top_k`` (HLO ``topk``, a tuple of values and indices) stopped as unsupported: the
    expert choice of JAX mixture-of-experts routers."""
    logits = jnp.asarray(RNG.standard_normal((2, 6, 8)).astype(np.float32))
    logits = logits.at[0, 0, 5].set(logits[0, 0, 2])  # a tie: the lower index first

    def route(x):
        values, experts = jax.lax.top_k(jax.nn.softmax(x, axis=-1), 2)
        return values / values.sum(-1, keepdims=True), experts, jax.lax.top_k(-x, 1)[1]

    got, want = nc.trace(route, (logits,))(logits), route(logits)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
