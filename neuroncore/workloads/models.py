"""The built-in models, written with the builder API in the shapes the frameworks would export."""

from __future__ import annotations

import math

import numpy as np

from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Graph, Op


def matmul(m: int, k: int, n: int, dtype: str = "bf16", transpose_lhs: bool = False) -> Graph:
    """``lhs @ rhs``; by default lhs arrives as lhsT [K, M] like the NKI matmul tutorial's kernel."""
    b = GraphBuilder("matmul")
    if transpose_lhs:
        lhs = b.parameter("lhs", (m, k), dtype)
        out = b.dot(lhs, b.parameter("rhs", (k, n), dtype))
    else:
        lhs_t = b.parameter("lhsT", (k, m), dtype)
        out = b.dot(lhs_t, b.parameter("rhs", (k, n), dtype), lhs_contract=-2)
    return b.build([out])


def _linear(b: GraphBuilder, x: Op, d_in: int, d_out: int, name: str, dtype: str,
            bias: bool = True) -> Op:
    with b.scope(name):
        y = b.matmul(x, b.weight("weight", (d_in, d_out), dtype))
        if bias:
            y = b.add(y, b.weight("bias", (d_out,), dtype, scale=0.02))
    return y


def mlp(batch: int, d_model: int, d_ff: int, dtype: str = "bf16") -> Graph:
    b = GraphBuilder("mlp")
    x = b.parameter("x", (batch, d_model), dtype)
    h = _linear(b, x, d_model, d_ff, "fc1", dtype)
    with b.scope("act"):
        h = b.gelu(h)
    y = _linear(b, h, d_ff, d_model, "fc2", dtype)
    return b.build([y])


def _layer_norm(b: GraphBuilder, x: Op, hidden: int, name: str, dtype: str) -> Op:
    with b.scope(name):
        gamma = b.weight("weight", (hidden,), dtype, init="ones")
        beta = b.weight("bias", (hidden,), dtype, scale=0.02)
        return b.layer_norm(x, gamma, beta, eps=1e-12)


def _check_heads(hidden: int, heads: int) -> None:
    if heads <= 0 or hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a positive multiple of heads ({heads})")


def bert_layer(batch: int, seq: int, hidden: int, heads: int, intermediate: int,
               dtype: str = "bf16") -> Graph:
    """BERT encoder layer (post-LN), as ``BertLayer`` computes it, with an additive attention mask."""
    _check_heads(hidden, heads)
    b = GraphBuilder("bert_layer", root_layer="encoder/layer.0")
    hd = hidden // heads
    x = b.parameter("hidden_states", (batch, seq, hidden), dtype)
    mask = b.parameter("attention_mask", (batch, seq), dtype)
    flat = b.reshape(x, (batch * seq, hidden))
    with b.scope("attention"), b.scope("self"):

        def heads_of(name: str) -> Op:
            y = _linear(b, flat, hidden, hidden, name, dtype)
            return b.transpose(b.reshape(y, (batch, seq, heads, hd)), (0, 2, 1, 3))

        q, k, v = heads_of("query"), heads_of("key"), heads_of("value")
        scores = b.multiply(b.dot(q, k, rhs_contract=-1), 1.0 / math.sqrt(hd))
        bias = b.broadcast(mask, (batch, heads, seq, seq), (0, 3))
        probs = b.softmax(b.add(scores, bias))
        ctx = b.transpose(b.dot(probs, v), (0, 2, 1, 3))
        ctx = b.reshape(ctx, (batch * seq, hidden))
    with b.scope("attention"), b.scope("output"):
        attn = _linear(b, ctx, hidden, hidden, "dense", dtype)
        attn = _layer_norm(b, b.add(attn, flat), hidden, "LayerNorm", dtype)
    with b.scope("intermediate"):
        inter = b.gelu(_linear(b, attn, hidden, intermediate, "dense", dtype))
    with b.scope("output"):
        out = _linear(b, inter, intermediate, hidden, "dense", dtype)
        out = _layer_norm(b, b.add(out, attn), hidden, "LayerNorm", dtype)
    return b.build([b.reshape(out, (batch, seq, hidden))])


def _rope_tables(positions: int, hd: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    angles = np.outer(np.arange(positions, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotate(b: GraphBuilder, x: Op, cos: Op, sin: Op) -> Op:
    """Rotary embedding, rotate-half form: [x1*cos - x2*sin, x2*cos + x1*sin]."""
    *lead, hd = x.shape
    half = hd // 2
    x1 = b.slice(x, [0] * len(x.shape), [*lead, half])
    x2 = b.slice(x, [0] * (len(x.shape) - 1) + [half], [*lead, hd])
    shape = (*lead, half)
    c = b.broadcast(cos, shape, (0, len(shape) - 1))
    s = b.broadcast(sin, shape, (0, len(shape) - 1))
    first = b.subtract(b.multiply(x1, c), b.multiply(x2, s))
    second = b.add(b.multiply(x2, c), b.multiply(x1, s))
    return b.concatenate([first, second], -1)


def llama_decode(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 vocab: int, batch: int, context: int, dtype: str = "bf16") -> Graph:
    """One decode step: ``context`` cached tokens per sequence, one new token each, logits out.

    Inputs: token ids, positions, and per layer the K/V cache [batch, kv_heads, context, head_dim].
    Outputs: logits [batch, vocab], then the new token's K and V per layer (what the cache appends).
    """
    _check_heads(hidden, heads)
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    b = GraphBuilder("llama_decode")
    hd = hidden // heads
    group = heads // kv_heads
    tokens = b.parameter("input_ids", (batch,), "int32", low=0, high=vocab)
    positions = b.parameter("position_ids", (batch,), "int32", low=context, high=context + 1)
    caches = [(b.parameter(f"past_key.{i}", (batch, kv_heads, context, hd), dtype),
               b.parameter(f"past_value.{i}", (batch, kv_heads, context, hd), dtype))
              for i in range(layers)]
    with b.scope("embed_tokens"):
        x = b.gather(b.weight("weight", (vocab, hidden), dtype, scale=0.02), tokens)
    with b.scope("rotary_emb"):
        cos_table, sin_table = _rope_tables(context + 1, hd)
        cos = b.gather(b.weight("cos_cached", cos_table.shape, dtype, array=cos_table), positions)
        sin = b.gather(b.weight("sin_cached", sin_table.shape, dtype, array=sin_table), positions)
    new_kv: list[Op] = []
    for i in range(layers):
        with b.scope(f"layers.{i}"):
            with b.scope("input_layernorm"):
                h = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
            with b.scope("self_attn"):
                q = _linear(b, h, hidden, heads * hd, "q_proj", dtype, bias=False)
                k = _linear(b, h, hidden, kv_heads * hd, "k_proj", dtype, bias=False)
                v = _linear(b, h, hidden, kv_heads * hd, "v_proj", dtype, bias=False)
                q = _rotate(b, b.reshape(q, (batch, heads, hd)), cos, sin)
                k = _rotate(b, b.reshape(k, (batch, kv_heads, hd)), cos, sin)
                k_new = b.reshape(k, (batch, kv_heads, 1, hd))
                v_new = b.reshape(v, (batch, kv_heads, 1, hd))
                keys = b.concatenate([caches[i][0], k_new], 2)
                values = b.concatenate([caches[i][1], v_new], 2)
                qg = b.reshape(q, (batch, kv_heads, group, hd))
                scores = b.multiply(b.dot(qg, keys, rhs_contract=-1), 1.0 / math.sqrt(hd))
                probs = b.softmax(scores)
                attn = b.reshape(b.dot(probs, values), (batch, hidden))
                x = b.add(x, _linear(b, attn, hidden, hidden, "o_proj", dtype, bias=False))
                new_kv += [k_new, v_new]
            with b.scope("post_attention_layernorm"):
                h = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
            with b.scope("mlp"):
                gate = _linear(b, h, hidden, intermediate, "gate_proj", dtype, bias=False)
                up = _linear(b, h, hidden, intermediate, "up_proj", dtype, bias=False)
                act = b.multiply(b.silu(gate), up)
                x = b.add(x, _linear(b, act, intermediate, hidden, "down_proj", dtype, bias=False))
    with b.scope("norm"):
        x = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
    logits = _linear(b, x, hidden, vocab, "lm_head", dtype, bias=False)
    return b.build([logits, *new_kv])
