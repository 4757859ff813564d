"""JAX models traced with neuroncore.trace and executed on the core, against JAX itself: an MLP and
an attention block in FP32 and with bf16 matmuls, and the attention block with sequence buckets."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import neuroncore as nc  # noqa: E402

D_MODEL, HIDDEN, HEADS, BATCH, SEQ = 64, 128, 4, 2, 16


def init(rng, shape, scale=None):
    scale = 1.0 / np.sqrt(shape[0]) if scale is None else scale
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32))


def mlp_params(seed=0):
    rng = np.random.default_rng(seed)
    return {"w1": init(rng, (D_MODEL, HIDDEN)), "b1": init(rng, (HIDDEN,), 0.1),
            "w2": init(rng, (HIDDEN, D_MODEL)), "b2": init(rng, (D_MODEL,), 0.1)}


def make_mlp(p):
    def mlp(x):
        h = jax.nn.gelu(x @ p["w1"] + p["b1"])
        return h @ p["w2"] + p["b2"]
    return mlp


def attention_params(seed=1):
    rng = np.random.default_rng(seed)
    p = {f"w{k}": init(rng, (D_MODEL, D_MODEL)) for k in "qkvo"}
    p.update({f"b{k}": init(rng, (D_MODEL,), 0.1) for k in "qkvo"})
    p["gamma"] = jnp.asarray(1.0 + 0.1 * rng.standard_normal(D_MODEL).astype(np.float32))
    p["beta"] = init(rng, (D_MODEL,), 0.1)
    return p


def make_attention(p):
    def attention_block(x, mask):
        b, s, d = x.shape
        hd = d // HEADS
        q = (x @ p["wq"] + p["bq"]).reshape(b, s, HEADS, hd)
        k = (x @ p["wk"] + p["bk"]).reshape(b, s, HEADS, hd)
        v = (x @ p["wv"] + p["bv"]).reshape(b, s, HEADS, hd)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd).astype(x.dtype)
        scores = jnp.where(mask[:, None, None, :] > 0, scores, jnp.asarray(-1e9, x.dtype))
        probs = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d)
        y = x + o @ p["wo"] + p["bo"]
        mean = y.mean(-1, keepdims=True)
        var = ((y - mean) ** 2).mean(-1, keepdims=True)
        return (y - mean) * jax.lax.rsqrt(var + 1e-5) * p["gamma"] + p["beta"]
    return attention_block


def inputs(seq=SEQ, seed=2):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((BATCH, seq, D_MODEL)).astype(np.float32))
    mask = np.ones((BATCH, seq), np.float32)
    mask[1, seq - seq // 4:] = 0.0  # the second sequence is shorter
    return x, jnp.asarray(mask)


def max_error(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def bf16(tree):
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), tree)


CASES = {
    "mlp": (mlp_params, make_mlp, lambda: (inputs()[0][0],)),
    "attention": (attention_params, make_attention, inputs),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model_fp32_matches_jax(name):
    params_fn, make, args_fn = CASES[name]
    fn, args = make(params_fn()), args_fn()
    model = nc.trace(fn, args)
    fused = {op.opcode for op in model.graph.ops}
    assert ("gelu" if name == "mlp" else "softmax") in fused
    got = model(*args)
    assert isinstance(got, jax.Array) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(*args)), rtol=1e-4, atol=1e-5)
    assert model.last_result is not None and model.last_result.device_time_ns > 0


@pytest.mark.parametrize("name", list(CASES))
def test_model_bf16_within_jax_own_bf16_error(name):
    params_fn, make, args_fn = CASES[name]
    params, args = params_fn(), args_fn()
    reference = make(params)(*args)
    jax_bf16 = make(bf16(params))(*bf16(args))  # what JAX itself loses running in bf16
    jax_error = max_error(jax_bf16, reference)
    model = nc.trace(make(params), args, dtype="bf16")
    assert any(op.opcode == "dot" and op.operands[0].dtype.value == "bf16" for op in model.graph.ops)
    ours = max_error(model(*args), reference)
    assert 0 < ours <= 2 * jax_error, (ours, jax_error)


def test_attention_buckets_pad_and_cut_back():
    fn = make_attention(attention_params())
    x20, mask20 = inputs(seq=20)
    model = nc.trace(fn, (x20, mask20), buckets=(16, 32))
    assert sorted(model.programs) == [16, 32]
    got = model(x20, mask20)  # padded to 32 with mask 0, cut back to 20
    assert got.shape == (BATCH, 20, D_MODEL)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(x20, mask20)), rtol=1e-4, atol=1e-5)
    assert model.last_result.program is model.programs[32]
    x12, mask12 = inputs(seq=12, seed=3)
    np.testing.assert_allclose(np.asarray(model(x12, mask12)), np.asarray(fn(x12, mask12)),
                               rtol=1e-4, atol=1e-5)
    assert model.last_result.program is model.programs[16]
    with pytest.raises(nc.TraceError, match="larger than every bucket"):
        model(*inputs(seq=40))


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", ["mlp", "attention"])
def test_tensor_parallel_trace_matches_jax(name, tp):
    """``trace(..., tp_degree=N)``: Megatron sharding of jitted JAX code gives JAX's numbers."""
    params_fn, make, args_fn = CASES[name]
    fn, args = make(params_fn()), args_fn()
    expected = np.asarray(fn(*args))
    traced = nc.trace(fn, args, instance="trn1.32xlarge", tp_degree=tp)
    np.testing.assert_allclose(np.asarray(traced(*args)), expected, rtol=1e-4, atol=1e-4)
    collectives = [op.opcode for op in traced.program.graph.ops if op.opcode.startswith("all-")]
    assert collectives and set(collectives) == {"all-reduce"}  # row-parallel outputs only
    assert len(traced.last_result.ranks) == tp
