"""JAX models of issue 15: a transformer block built on ``jax.nn.dot_product_attention`` (grouped
KV heads, causal, with a padding mask) and a conv net built on ``lax.conv_general_dilated``
(strides, padding, kernel and input dilation, feature groups, NHWC and NCHW layouts) and
``lax.reduce_window`` pooling, against JAX in fp32 and with bf16 matmuls."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
lax = pytest.importorskip("jax.lax")

import neuroncore as nc  # noqa: E402

D, HEADS, KV_HEADS, BATCH, SEQ = 32, 4, 2, 2, 8


def _init(rng: np.random.Generator, shape: tuple[int, ...], scale: float | None = None):
    scale = 1.0 / np.sqrt(np.prod(shape[:-1])) if scale is None else scale
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32))


def block_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    hd = D // HEADS
    return {"wq": _init(rng, (D, HEADS * hd)), "wk": _init(rng, (D, KV_HEADS * hd)),
            "wv": _init(rng, (D, KV_HEADS * hd)), "wo": _init(rng, (D, D)),
            "w1": _init(rng, (D, 2 * D)), "w2": _init(rng, (2 * D, D)),
            "gamma": jnp.asarray(1.0 + 0.1 * rng.standard_normal(D).astype(np.float32)),
            "beta": _init(rng, (D,), 0.1)}


def make_block(p: dict):
    def transformer_block(x, mask):
        b, s, d = x.shape
        hd = d // HEADS
        mean = x.mean(-1, keepdims=True)
        h = (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        h = h * p["gamma"] + p["beta"]
        q = (h @ p["wq"]).reshape(b, s, HEADS, hd)
        k = (h @ p["wk"]).reshape(b, s, KV_HEADS, hd)
        v = (h @ p["wv"]).reshape(b, s, KV_HEADS, hd)
        keep = (mask[:, None, None, :] > 0)  # [B, 1, 1, S]: padded keys masked
        o = jax.nn.dot_product_attention(q, k, v, mask=keep, is_causal=True)
        x = x + o.reshape(b, s, d) @ p["wo"]
        return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
    return transformer_block


def block_inputs(seed: int = 1) -> tuple:
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((BATCH, SEQ, D)).astype(np.float32))
    mask = np.ones((BATCH, SEQ), np.float32)
    mask[1, SEQ - 3:] = 0.0
    return x, jnp.asarray(mask)


def conv_params(seed: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    return {"c1": _init(rng, (3, 3, 3, 8)),     # HWIO
            "c2": _init(rng, (3, 3, 4, 16)),    # 2 feature groups of 4 input channels
            "c3": _init(rng, (8, 16, 2, 2)),    # OIHW, used on an NCHW activation
            "c4": _init(rng, (3, 3, 8, 8)),     # input-dilated (a transposed convolution)
            "head": _init(rng, (8, 10)), "bias": _init(rng, (8,), 0.1)}


def make_convnet(p: dict):
    nhwc = ("NHWC", "HWIO", "NHWC")

    def convnet(images):
        y = lax.conv_general_dilated(images, p["c1"], (2, 2), ((1, 1), (1, 1)),
                                     dimension_numbers=nhwc) + p["bias"]
        y = jax.nn.relu(y)
        y = lax.conv_general_dilated(y, p["c2"], (1, 1), "SAME", rhs_dilation=(2, 2),
                                     feature_group_count=2, dimension_numbers=nhwc)
        y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                              ((0, 0), (1, 1), (1, 1), (0, 0)))  # max pool 3x3 / 2, padded
        y = jnp.transpose(y, (0, 3, 1, 2))  # NCHW
        y = lax.conv_general_dilated(y, p["c3"], (1, 1), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        y = jnp.transpose(jax.nn.silu(y), (0, 2, 3, 1))
        y = lax.conv_general_dilated(y, p["c4"], (1, 1), ((2, 1), (2, 1)), lhs_dilation=(2, 2),
                                     dimension_numbers=nhwc)
        y = lax.reduce_window(y, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
        return y.mean(axis=(1, 2)) @ p["head"]
    return convnet


def conv_inputs(seed: int = 3) -> tuple:
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((2, 16, 16, 3)).astype(np.float32)),)


CASES = {"transformer_block": (block_params, make_block, block_inputs),
         "convnet": (conv_params, make_convnet, conv_inputs)}


def _error(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def _bf16(tree):
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), tree)


@pytest.mark.parametrize("name", list(CASES))
def test_fp32_and_bf16_match_jax(name):
    params_fn, make, inputs_fn = CASES[name]
    params, args = params_fn(), inputs_fn()
    fn = make(params)
    reference = fn(*args)
    model = nc.trace(fn, args)
    assert not [op for op in model.graph.ops if op.opcode not in nc.ir.graph.ALL_OPS]
    np.testing.assert_allclose(np.asarray(model(*args)), np.asarray(reference), rtol=1e-4,
                               atol=2e-5)
    framework_bf16 = _error(make(_bf16(params))(*_bf16(args)), reference)
    ours = _error(nc.trace(fn, args, dtype="bf16")(*args), reference)
    assert 0 < ours <= 2 * framework_bf16, (ours, framework_bf16)


def test_convolutions_keep_their_hlo_names_and_lines():
    fn, args = make_convnet(conv_params()), conv_inputs()
    graph = nc.trace(fn, args).graph
    convs = [op for op in graph.ops if op.name.startswith("conv_general_dilated")
             and "." not in op.name.removeprefix("conv_general_dilated.")]
    assert len(convs) == 4  # each convolution's value is the op named after its HLO instruction
    assert all(op.layer == "convnet" and "test_jax_conv_attention.py" in op.source for op in convs)
    opcodes = [op.opcode for op in graph.ops]
    assert opcodes.count("convolution") == 4  # implicit GEMM: one op per convolution
    assert opcodes.count("dot") == 1  # the head
    assert opcodes.count("reduce-window") == 2 and "slice" not in opcodes  # pools: one op each
    assert len({op.name for op in graph.ops}) == len(graph.ops)


def test_unsupported_convolution_form_is_listed():
    def batch_grouped(x, w):  # batch_group_count: a weight gradient's form
        return lax.conv_general_dilated(x, w, (1, 1), "VALID", batch_group_count=2,
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))

    x, w = jnp.ones((2, 2, 4, 4)), jnp.ones((2, 2, 3, 3))
    missing = nc.check(batch_grouped, (x, w))
    assert [m.opcode for m in missing] == ["convolution(batch_group_count)"]
    assert "test_jax_conv_attention.py" in missing[0].source


def test_the_gradient_of_dot_product_attention_matches_jax():
    """``jax.grad`` through ``jax.nn.dot_product_attention`` (a JAX training step's attention):
    the query's gradient came out 1.0-2.2 off, silently (the compiler read a ``[B, N, T, 1, S]``
    value as ``[B, N, T, S]`` batches in the wrong tiles; tests/neuroncore/test_packing.py)."""
    rng = np.random.default_rng(0)
    q, k, v, r = (jnp.asarray(rng.standard_normal((2, 8, 2, 4)), jnp.float32) for _ in range(4))
    lengths = jnp.arange(8) < jnp.array([8, 5])[:, None]
    mask = jnp.tril(jnp.ones((8, 8), bool))[None, None] & lengths[:, None, None, :]

    def loss(q, k, v):
        return (jax.nn.dot_product_attention(q, k, v, mask=mask) * r).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for got, want in zip(nc.trace(grads, (q, k, v))(q, k, v), grads(q, k, v)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
