"""The built-in models, written with the builder API in the shapes the frameworks would export."""

from __future__ import annotations

import functools
import math

import numpy as np

from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Graph, Op
from neuroncore.parallel.heads import HeadLayout, head_layout


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


def _rotate(b: GraphBuilder, x: Op, cos: Op, sin: Op, rows_dim: int = 0) -> Op:
    """Rotary embedding, rotate-half form: [x1*cos - x2*sin, x2*cos + x1*sin].

    ``cos``/``sin`` are [positions, hd/2]; their positions run along ``rows_dim`` of ``x``."""
    *lead, hd = x.shape
    half = hd // 2
    x1 = b.slice(x, [0] * len(x.shape), [*lead, half])
    x2 = b.slice(x, [0] * (len(x.shape) - 1) + [half], [*lead, hd])
    shape = (*lead, half)
    c = b.broadcast(cos, shape, (rows_dim, len(shape) - 1))
    s = b.broadcast(sin, shape, (rows_dim, len(shape) - 1))
    first = b.subtract(b.multiply(x1, c), b.multiply(x2, s))
    second = b.add(b.multiply(x2, c), b.multiply(x1, s))
    return b.concatenate([first, second], -1)


@functools.lru_cache(maxsize=64)
def _columns(source: tuple[int, ...], hd: int) -> tuple[int, ...]:
    """Per-element index of stored heads' columns (or rows) into the original ones (one tuple per
    layout, shared by every layer's weights: ``GraphBuilder.weight`` converts it once)."""
    return tuple(h * hd + t if h >= 0 else -1 for h in source for t in range(hd))


@functools.lru_cache(maxsize=64)
def _pad_index(size: int, stored: int) -> tuple[int, ...]:
    """The index that stores ``size`` entries padded with zeros (-1) to ``stored``."""
    return (*range(size), *([-1] * (stored - size)))


def _attention_weights(b: GraphBuilder, hidden: int, heads: int, kv_heads: int, hd: int,
                       layout: HeadLayout, dtype: str) -> tuple[Op, Op, Op, Op]:
    """q/k/v/o projection weights [in, out] in ``layout`` (same trained values as the original)."""
    def weight(name: str, shape: tuple[int, int], axis: int, source: tuple[int, ...], n: int) -> Op:
        with b.scope(name):
            relayout = None if source == tuple(range(n)) else (axis, _columns(source, hd))
            return b.weight("weight", shape, dtype, relayout=relayout)

    wq = weight("q_proj", (hidden, heads * hd), 1, layout.q_source, heads)
    wk = weight("k_proj", (hidden, kv_heads * hd), 1, layout.kv_source, kv_heads)
    wv = weight("v_proj", (hidden, kv_heads * hd), 1, layout.kv_source, kv_heads)
    wo = weight("o_proj", (heads * hd, hidden), 0, layout.q_source, heads)
    return wq, wk, wv, wo


def _padded(n: int, tp: int) -> int:
    return -(-n // tp) * tp


def _mlp(b: GraphBuilder, h: Op, hidden: int, intermediate: int, dtype: str, tp: int) -> Op:
    """SwiGLU MLP; for ``tp`` ranks the intermediate size is padded to a multiple of ``tp`` with zero
    columns (gate/up) and zero rows (down), which adds exactly nothing (silu(0) * 0 = 0)."""
    stored = _padded(intermediate, tp)
    pad = None if stored == intermediate else _pad_index(intermediate, stored)
    with b.scope("mlp"):
        def linear(name: str, x: Op, shape: tuple[int, int], axis: int) -> Op:
            with b.scope(name):
                w = b.weight("weight", shape, dtype, relayout=None if pad is None else (axis, pad))
                return b.matmul(x, w)

        gate = linear("gate_proj", h, (hidden, intermediate), 1)
        up = linear("up_proj", h, (hidden, intermediate), 1)
        return linear("down_proj", b.multiply(b.silu(gate), up), (intermediate, hidden), 0)


def _embedding(b: GraphBuilder, ids: Op, vocab: int, hidden: int, dtype: str, tp: int) -> Op:
    """Token embedding; padded to a multiple of ``tp`` rows (never looked up) so ranks split it."""
    stored = _padded(vocab, tp)
    pad = None if stored == vocab else (0, _pad_index(vocab, stored))
    with b.scope("embed_tokens"):
        return b.gather(b.weight("weight", (vocab, hidden), dtype, scale=0.02, relayout=pad), ids)


def _lm_head(b: GraphBuilder, x: Op, hidden: int, vocab: int, dtype: str, tp: int) -> Op:
    """LM head; for ``tp`` ranks padded to a multiple of ``tp`` columns, the logits cut back."""
    stored = _padded(vocab, tp)
    pad = None if stored == vocab else (1, _pad_index(vocab, stored))
    with b.scope("lm_head"):
        logits = b.matmul(x, b.weight("weight", (hidden, vocab), dtype, relayout=pad))
        if stored != vocab:
            logits = b.slice(logits, (0, 0), (logits.shape[0], vocab))
    return logits


def _check_llama(hidden: int, heads: int, kv_heads: int) -> None:
    _check_heads(hidden, heads)
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")


def llama_decode(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 vocab: int, batch: int, context: int, dtype: str = "bf16", tp_degree: int = 1) -> Graph:
    """One decode step: ``context`` cached tokens per sequence, one new token each, logits out.

    Inputs: token ids, positions, and per layer the K/V cache [batch, kv_heads, context, head_dim].
    Outputs: logits [batch, vocab], then the new token's K and V per layer (what the cache appends).
    ``tp_degree`` lays the heads out for that many ranks (:func:`head_layout`; the cache then holds
    the stored KV heads); shard the graph with ``neuroncore.parallel`` to run it on them.
    """
    _check_llama(hidden, heads, kv_heads)
    layout = head_layout(heads, kv_heads, tp_degree)
    b = GraphBuilder("llama_decode")
    hd = hidden // heads
    nh, nkv, group = layout.heads, layout.kv_heads, layout.group
    tokens = b.parameter("input_ids", (batch,), "int32", low=0, high=vocab)
    positions = b.parameter("position_ids", (batch,), "int32", low=context, high=context + 1)
    caches = [(b.parameter(f"past_key.{i}", (batch, nkv, context, hd), dtype),
               b.parameter(f"past_value.{i}", (batch, nkv, context, hd), dtype))
              for i in range(layers)]
    x = _embedding(b, tokens, vocab, hidden, dtype, tp_degree)
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
                wq, wk, wv, wo = _attention_weights(b, hidden, heads, kv_heads, hd, layout, dtype)
                with b.scope("q_proj"):
                    q = b.matmul(h, wq)
                with b.scope("k_proj"):
                    k = b.matmul(h, wk)
                with b.scope("v_proj"):
                    v = b.matmul(h, wv)
                q = _rotate(b, b.reshape(q, (batch, nh, hd)), cos, sin)
                k = _rotate(b, b.reshape(k, (batch, nkv, hd)), cos, sin)
                k_new = b.reshape(k, (batch, nkv, 1, hd))
                v_new = b.reshape(v, (batch, nkv, 1, hd))
                keys = b.concatenate([caches[i][0], k_new], 2)
                values = b.concatenate([caches[i][1], v_new], 2)
                qg = b.reshape(q, (batch, nkv, group, hd))
                scores = b.multiply(b.dot(qg, keys, rhs_contract=-1), 1.0 / math.sqrt(hd))
                probs = b.softmax(scores)
                attn = b.reshape(b.dot(probs, values), (batch, nh * hd))
                with b.scope("o_proj"):
                    x = b.add(x, b.matmul(attn, wo))
                new_kv += [k_new, v_new]
            with b.scope("post_attention_layernorm"):
                h = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
            x = b.add(x, _mlp(b, h, hidden, intermediate, dtype, tp_degree))
    with b.scope("norm"):
        x = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
    return b.build([_lm_head(b, x, hidden, vocab, dtype, tp_degree), *new_kv])


def llama_prefill(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                  vocab: int, batch: int, context: int, dtype: str = "bf16", tp_degree: int = 1) -> Graph:
    """Context encoding: a ``context``-token prompt per sequence, causal attention over it.

    Outputs: the last position's logits [batch, vocab], then each layer's K and V for the prompt
    [batch, kv_heads, context, head_dim] (the cache the decode steps read). Grouped queries are
    folded into rows ([batch, kv, group*seq, hd]) so KV heads are never repeated in memory.
    """
    _check_llama(hidden, heads, kv_heads)
    layout = head_layout(heads, kv_heads, tp_degree)
    b = GraphBuilder("llama_prefill", weights_of="llama_decode")
    hd = hidden // heads
    nh, nkv, group, s = layout.heads, layout.kv_heads, layout.group, context
    tokens = b.parameter("input_ids", (batch, s), "int32", low=0, high=vocab)
    x = _embedding(b, b.reshape(tokens, (batch * s,)), vocab, hidden, dtype, tp_degree)
    with b.scope("rotary_emb"):
        cos_table, sin_table = _rope_tables(s, hd)
        cos = b.weight("cos_cached", cos_table.shape, dtype, array=cos_table)
        sin = b.weight("sin_cached", sin_table.shape, dtype, array=sin_table)
    with b.scope("causal_mask"):
        rows, cols = b.iota((s, s), 0), b.iota((s, s), 1)
        mask = b.select(b.compare(cols, rows, "LE"), b.constant(0.0, dtype, (s, s)),
                        b.constant(-30000.0, dtype, (s, s)))
        mask = b.reshape(b.broadcast(mask, (batch, nkv, group, s, s), (3, 4)), (batch, nkv, group * s, s))
    new_kv: list[Op] = []

    def heads_of(y: Op, n: int) -> Op:  # [b*s, n*hd] -> [b, n, s, hd] with RoPE where asked
        return b.transpose(b.reshape(y, (batch, s, n, hd)), (0, 2, 1, 3))

    def rope(t: Op) -> Op:
        n = t.shape[1]
        flat = b.reshape(t, (batch * n, s, hd))
        return b.reshape(_rotate(b, flat, cos, sin, rows_dim=1), (batch, n, s, hd))

    for i in range(layers):
        with b.scope(f"layers.{i}"):
            with b.scope("input_layernorm"):
                h = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
            with b.scope("self_attn"):
                wq, wk, wv, wo = _attention_weights(b, hidden, heads, kv_heads, hd, layout, dtype)
                with b.scope("q_proj"):
                    q = rope(heads_of(b.matmul(h, wq), nh))
                with b.scope("k_proj"):
                    k = rope(heads_of(b.matmul(h, wk), nkv))
                with b.scope("v_proj"):
                    v = heads_of(b.matmul(h, wv), nkv)
                qg = b.reshape(q, (batch, nkv, group * s, hd))
                scores = b.multiply(b.dot(qg, k, rhs_contract=-1), 1.0 / math.sqrt(hd))
                probs = b.softmax(b.add(scores, mask))
                ctx = b.reshape(b.dot(probs, v), (batch, nh, s, hd))
                ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (batch * s, nh * hd))
                with b.scope("o_proj"):
                    x = b.add(x, b.matmul(ctx, wo))
                new_kv += [k, v]
            with b.scope("post_attention_layernorm"):
                h = b.rms_norm(x, b.weight("weight", (hidden,), dtype, init="ones"))
            x = b.add(x, _mlp(b, h, hidden, intermediate, dtype, tp_degree))
    last = b.reshape(b.slice(b.reshape(x, (batch, s, hidden)), (0, s - 1, 0), (batch, s, hidden)),
                     (batch, hidden))
    with b.scope("norm"):
        last = b.rms_norm(last, b.weight("weight", (hidden,), dtype, init="ones"))
    return b.build([_lm_head(b, last, hidden, vocab, dtype, tp_degree), *new_kv])
