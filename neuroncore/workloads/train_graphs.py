"""One rank's training programs, built at full size with the builder API (no weight is allocated).

A training step of a transformer is, per rank, the same few programs run many times: the forward
and the backward of one layer (every layer of a model has the same shapes), the embedding and the
LM head with the loss, and the optimizer update over the rank's share of the parameters. This
module writes each of them as an HLO-level graph **at the rank's own shapes** under Megatron
tensor parallelism (``tp`` ranks: column-parallel q/k/v and gate/up, row-parallel o/down, each
row-parallel output all-reduced; in the backward the all-reduce moves to the gradient of the
column-parallel inputs, Megatron's "f" operator), so the compiler and the cost model time them
exactly as they time inference graphs.

Why built here and not traced: a joint forward/backward graph traced from PyTorch at 7B-70B sizes
would take minutes to trace and compile per configuration, and all its layers repeat; building one
layer's backward from the forward's shapes keeps each benchmark configuration under a minute. The
backward follows the textbook derivatives: for ``y = x W`` the gradients ``dx = dy W^T`` and
``dW = x^T dy`` (twice the forward's matmul FLOPs), plus the elementwise gradients of the norms,
activations and rotary embedding. Attention is a causal flash-attention (NKI kernel in NxD /
NeMo-Megatron on Neuron): queries in blocks, each block against the keys up to its end only (the
masked upper triangle is skipped), scores recomputed in the backward from the saved log-sum-exp
instead of storing probabilities.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Graph, Op, SourceFrame

ATTENTION_BLOCK = 128  # query rows per flash-attention block: the NKI kernel's q tile (B_P_SIZE = pmax)
KEY_BLOCK = 128  # keys per block of the backward's dK/dV pass [assumption: one PE tile]
OPTIMIZER_CHUNK = 1 << 24  # elements per simulated optimizer chunk (the update is a linear stream)


@dataclass(frozen=True)
class Transformer:
    """A transformer's dimensions and the layer variant its family uses."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    norm: str = "rms"  # "rms" (Llama) or "layer" (GPT, BERT, ViT)
    mlp: str = "swiglu"  # "swiglu" (Llama) or "gelu"
    bias: bool = False
    causal: bool = True
    rope: bool = True
    tied_head: bool = False  # the head's weight is the embedding table (counted once; BERT's MLM)
    classes: int = 0  # a classifier head instead of an LM head (ViT)
    # q, k and v as one column-parallel linear [hidden, (heads + 2 kv_heads) x head_dim] whose
    # output is split (NxD Training's Llama configs: fuse_qkv; Megatron's query_key_value)
    fused_qkv: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check(self, tp: int) -> None:
        """One line for a layout tensor parallelism cannot split."""
        if self.heads % tp or (self.kv_heads % tp and tp % self.kv_heads):
            raise ValueError(f"{self.name}: tp {tp} does not divide {self.heads} heads "
                             f"({self.kv_heads} KV heads)")
        if self.intermediate % tp:
            raise ValueError(f"{self.name}: tp {tp} does not divide the MLP size {self.intermediate}")

    def layer_params(self) -> int:
        """Trained parameters of one layer (whole model, not per rank)."""
        h, hd = self.hidden, self.head_dim
        attn = h * self.heads * hd * 2 + h * self.kv_heads * hd * 2
        mlp = h * self.intermediate * (3 if self.mlp == "swiglu" else 2)
        norms = h * (2 if self.norm == "rms" else 4)
        bias = (self.heads * hd + 2 * self.kv_heads * hd + h + self.intermediate + h) if self.bias else 0
        return attn + mlp + norms + bias

    def other_params(self) -> int:
        """Embedding, final norm and the head."""
        head = self.hidden * self.classes if self.classes else (
            0 if self.tied_head else self.hidden * self.vocab)
        return self.vocab * self.hidden + head + self.hidden * 2

    def params(self) -> int:
        return self.layers * self.layer_params() + self.other_params()


@dataclass(frozen=True)
class RankShapes:
    """What one rank holds of a layer under ``tp``-way Megatron sharding."""

    tokens: int  # micro-batch x sequence
    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    tp: int = 1
    sequence_parallel: bool = False  # Megatron-LM sequence parallelism (Korthikanti et al. 2022)

    @classmethod
    def of(cls, model: Transformer, micro_batch: int, seq: int, tp: int,
           sequence_parallel: bool = False) -> RankShapes:
        model.check(tp)
        if sequence_parallel and (micro_batch * seq) % tp:
            raise ValueError(f"{model.name}: sequence parallelism needs tp {tp} to divide the "
                             f"{micro_batch * seq} tokens of a micro-batch")
        kv = max(1, model.kv_heads // tp)  # fewer KV heads than ranks: each rank keeps a copy
        return cls(micro_batch * seq, micro_batch, seq, model.heads // tp, kv, model.head_dim,
                   model.hidden, model.intermediate // tp, tp, sequence_parallel and tp > 1)

    @property
    def sp_tokens(self) -> int:
        """Tokens a rank holds between the tensor-parallel blocks (the residual stream, the norms,
        the layer's input and output): all of them, or ``1 / tp`` with sequence parallelism."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens


def _all_reduce(b: GraphBuilder, x: Op, tp: int, group: str = "tp") -> Op:
    """Megatron's all-reduce over the tensor-parallel group (nothing with one rank). ``group`` tags
    the op with the rank group it runs over, for programs that hold collectives of several groups."""
    if tp == 1:
        return x
    return b.add_op("all-reduce", [x], x.shape, x.dtype, reduction="sum", name=f"all-reduce.{b.n_ops}",
                    group=group)


def _enter_tp(b: GraphBuilder, x: Op, r: RankShapes, group: str = "tp") -> Op:
    """Into a tensor-parallel block: with sequence parallelism the rank's token shard is
    all-gathered (Megatron's ``g`` in the sequence-parallel layout); otherwise it is whole already."""
    if not r.sequence_parallel:
        return x
    return b.add_op("all-gather", [x], (x.shape[0] * r.tp, *x.shape[1:]), x.dtype, dimension=0,
                    group=group, name=f"all-gather.{b.n_ops}")


def _leave_tp(b: GraphBuilder, x: Op, r: RankShapes, group: str = "tp") -> Op:
    """Out of a tensor-parallel block (partial sums on every rank): all-reduced, or with sequence
    parallelism reduce-scattered over the tokens (each rank keeps the sum of its token shard)."""
    if not r.sequence_parallel:
        return _all_reduce(b, x, r.tp, group)
    return b.add_op("reduce-scatter", [x], (x.shape[0] // r.tp, *x.shape[1:]), x.dtype, reduction="sum",
                    dimension=0, group=group, name=f"reduce-scatter.{b.n_ops}")


def _weight(b: GraphBuilder, name: str, shape: tuple[int, ...], dtype: str) -> Op:
    with b.scope(name):
        return b.weight("weight", shape, dtype)


def _column_sum(b: GraphBuilder, x: Op) -> Op:
    """Sum over the token rows of [tokens, n] -> [n], as a matmul with a ones vector: how compilers
    reduce over the partition dim (a bias or norm-weight gradient), on the Tensor engine."""
    t, n = x.shape
    ones = b.weight("ones", (t, 1), x.dtype, init="ones")
    return b.reshape(b.dot(x, ones, lhs_contract=-2), (n,))


LOSS_BLOCK = 4096  # vocabulary columns per block of the fused cross-entropy [assumption]


def _combine(b: GraphBuilder, parts: list[Op], kind: str) -> Op:
    """Max or sum of partial results, pairwise."""
    out = parts[0]
    for p in parts[1:]:
        out = b.maximum(out, p) if kind == "max" else b.add(out, p)
    return out


ROW_CHUNK = 8192  # a wide row (a vocabulary of logits) is reduced in chunks that fit a partition


def _row_reduce(b: GraphBuilder, x: Op, kind: str = "sum") -> Op:
    """Reduce [rows, n] over n in chunks of ROW_CHUNK columns, then combine the partial results:
    how a compiler reduces a row longer than an SBUF partition holds."""
    rows, n = x.shape
    if n <= ROW_CHUNK:
        return b.reduce(x, [1], kind=kind)
    parts = [b.reduce(b.slice(x, (0, c), (rows, min(n, c + ROW_CHUNK))), [1], kind=kind)
             for c in range(0, n, ROW_CHUNK)]
    out = parts[0]
    for p in parts[1:]:
        out = b.maximum(out, p) if kind == "max" else b.add(out, p)
    return out


def _row(b: GraphBuilder, v: Op, shape: tuple[int, ...], dims: tuple[int, ...]) -> Op:
    return b.broadcast(v, shape, dims)


def _norm(b: GraphBuilder, m: Transformer, x: Op, name: str, dtype: str) -> Op:
    with b.scope(name):
        gamma = b.weight("weight", (x.shape[-1],), dtype, init="ones")
        if m.norm == "rms":
            return b.rms_norm(x, gamma)
        return b.layer_norm(x, gamma, b.weight("bias", (x.shape[-1],), dtype, scale=0.02))


def _norm_backward(b: GraphBuilder, m: Transformer, x: Op, dy: Op, name: str, dtype: str) -> tuple[Op, Op]:
    """d(norm)/dx and the weight gradient, recomputing the statistics from the saved input."""
    t, h = x.shape
    with b.scope(name):
        gamma = b.weight("weight", (h,), dtype, init="ones")
        xc = x
        if m.norm == "layer":
            mean = b.multiply(b.reduce(x, [1]), 1.0 / h)
            xc = b.subtract(x, _row(b, mean, (t, h), (0,)))
        var = b.multiply(b.reduce(b.multiply(xc, xc), [1]), 1.0 / h)
        rstd = _row(b, b.rsqrt(b.add(var, 1e-6)), (t, h), (0,))
        xhat = b.multiply(xc, rstd)
        dgamma = _column_sum(b, b.multiply(dy, xhat))
        dxhat = b.multiply(dy, _row(b, gamma, (t, h), (1,)))
        proj = b.multiply(b.reduce(b.multiply(dxhat, xhat), [1]), 1.0 / h)
        inner = b.subtract(dxhat, b.multiply(xhat, _row(b, proj, (t, h), (0,))))
        if m.norm == "layer":
            mean_d = b.multiply(b.reduce(dxhat, [1]), 1.0 / h)
            inner = b.subtract(inner, _row(b, mean_d, (t, h), (0,)))
            dgamma = b.add(dgamma, _column_sum(b, dy))  # + dbeta, folded into one output
        return b.multiply(inner, rstd), dgamma


def _heads(b: GraphBuilder, y: Op, r: RankShapes, n: int) -> Op:
    """[tokens, n*hd] -> [batch, n, seq, hd]."""
    return b.transpose(b.reshape(y, (r.batch, r.seq, n, r.head_dim)), (0, 2, 1, 3))


def _tokens(b: GraphBuilder, y: Op, r: RankShapes) -> Op:
    """[batch, n, seq, hd] -> [tokens, n*hd]."""
    n = y.shape[1]
    return b.reshape(b.transpose(y, (0, 2, 1, 3)), (r.tokens, n * r.head_dim))


def _rope(b: GraphBuilder, x: Op, dtype: str, sign: float = 1.0) -> Op:
    """Rotate-half rotary embedding over [batch, n, seq, hd] (``sign=-1``: its transpose, the
    backward). The tables are trained-free constants [seq, hd/2]."""
    bt, n, s, hd = x.shape
    half = hd // 2
    with b.scope("rotary_emb"):
        cos = b.weight("cos_cached", (s, half), dtype)
        sin = b.weight("sin_cached", (s, half), dtype)
    x1 = b.slice(x, (0, 0, 0, 0), (bt, n, s, half))
    x2 = b.slice(x, (0, 0, 0, half), (bt, n, s, hd))
    shape = (bt, n, s, half)
    c, sn = b.broadcast(cos, shape, (2, 3)), b.broadcast(sin, shape, (2, 3))
    if sign < 0:
        sn = b.negate(sn)
    first = b.subtract(b.multiply(x1, c), b.multiply(x2, sn))
    second = b.add(b.multiply(x2, c), b.multiply(x1, sn))
    return b.concatenate([first, second], 3)


def _expand_kv(b: GraphBuilder, kv: Op, heads: int) -> Op:
    """Grouped-query K/V [b, kv, s, hd] read by ``heads`` query heads -> [b, heads, s, hd]."""
    bt, n, s, hd = kv.shape
    if n == heads:
        return kv
    g = heads // n
    return b.reshape(b.broadcast(kv, (bt, n, g, s, hd), (0, 1, 3, 4)), (bt, heads, s, hd))


def _blocks(m: Transformer, seq: int) -> list[tuple[int, int, int]]:
    """(query start, query end, keys visible) per flash-attention block."""
    if not m.causal or seq <= ATTENTION_BLOCK:
        return [(0, seq, seq)]
    starts = range(0, seq, ATTENTION_BLOCK)
    return [(s, min(seq, s + ATTENTION_BLOCK), min(seq, s + ATTENTION_BLOCK)) for s in starts]


def _scale_queries(b: GraphBuilder, q: Op) -> Op:
    """``q / sqrt(head_dim)``: the NKI flash-attention kernels multiply the query tile by
    ``softmax_scale`` once as they load it, so no ``[queries, keys]`` score tile is ever scaled
    (one pass over ``seq x head_dim`` instead of one over ``seq x keys`` per tile)."""
    return b.multiply(q, 1.0 / math.sqrt(q.shape[-1]))


def _attention_forward(b: GraphBuilder, m: Transformer, q: Op, k: Op, v: Op) -> tuple[Op, Op]:
    """Causal block attention over queries already scaled (:func:`_scale_queries`); returns the
    context [b, h, s, hd] and the log-sum-exp [b, h, s]."""
    bt, nh, s, hd = q.shape
    outs: list[Op] = []
    lses: list[Op] = []
    for q0, q1, keys in _blocks(m, s):
        qi = q if (q0, q1) == (0, s) else b.slice(q, (0, 0, q0, 0), (bt, nh, q1, hd))
        ki = k if keys == s else b.slice(k, (0, 0, 0, 0), (bt, nh, keys, hd))
        vi = v if keys == s else b.slice(v, (0, 0, 0, 0), (bt, nh, keys, hd))
        scores = b.dot(qi, ki, rhs_contract=-1)
        probs = b.softmax(scores)
        lses.append(b.reduce(scores, [3], kind="max"))  # the kernel keeps its row statistic
        outs.append(b.dot(probs, vi))
    if len(outs) == 1:
        return outs[0], lses[0]
    return b.concatenate(outs, 2), b.concatenate(lses, 2)


def _attention_backward(b: GraphBuilder, m: Transformer, q: Op, k: Op, v: Op, out: Op, lse: Op,
                        dout: Op) -> tuple[Op, Op, Op]:
    """Flash-attention backward: scores recomputed and exponentiated against the saved
    log-sum-exp; dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)), dQ = dS K / sqrt(hd),
    dK = dS^T Q / sqrt(hd). ``q`` is the scaled query the forward saved (:func:`_scale_queries`),
    so the scores need no scaling and ``dS^T q`` is dK; dQ's scale is applied to the keys once
    (``seq x head_dim``), as the NKI backward kernel does, never to a score tile.

    One block (bidirectional, or short): all at once. Causal and longer than a block: two passes
    whose score tiles stay on chip, as FlashAttention-2's backward tiles it. The dQ pass walks the
    query blocks (each against the keys up to its end) and the dK/dV pass walks blocks of
    ``KEY_BLOCK`` keys (each against the queries from its start); each recomputes P and dS for its
    own tiles, so no partial dQ, dK or dV is ever accumulated through HBM. [Assumption: the kernel
    recomputes rather than keeping a whole-sequence accumulator; it costs two extra matmuls of the
    causal triangle.]"""
    bt, nh, s, hd = q.shape
    delta = b.reduce(b.multiply(dout, out), [3])  # [b, h, s]

    def rows_of(x: Op, r0: int, r1: int) -> Op:
        """Rows [r0, r1) of the sequence dim (2) of a [b, h, s, ...] value."""
        if (r0, r1) == (0, x.shape[2]):
            return x
        return b.slice(x, (0, 0, r0, *(0,) * (len(x.shape) - 3)), (bt, nh, r1, *x.shape[3:]))

    def tiles(r0: int, r1: int, c0: int, c1: int) -> tuple[Op, Op]:
        """P and dS for query rows [r0, r1) against keys [c0, c1)."""
        grid = (bt, nh, r1 - r0, c1 - c0)
        qi, doi = rows_of(q, r0, r1), rows_of(dout, r0, r1)
        ki, vi = rows_of(k, c0, c1), rows_of(v, c0, c1)
        scores = b.dot(qi, ki, rhs_contract=-1)
        probs = b.exp(b.subtract(scores, b.broadcast(rows_of(lse, r0, r1), grid, (0, 1, 2))))
        dp = b.dot(doi, vi, rhs_contract=-1)
        ds = b.multiply(probs, b.subtract(dp, b.broadcast(rows_of(delta, r0, r1), grid, (0, 1, 2))))
        return probs, ds

    blocks = _blocks(m, s)
    if len(blocks) == 1:
        probs, ds = tiles(0, s, 0, s)
        return (b.multiply(b.dot(ds, k), 1.0 / math.sqrt(hd)), b.dot(ds, q, lhs_contract=-2),
                b.dot(probs, dout, lhs_contract=-2))
    k_scaled = _scale_queries(b, k)  # dQ = dS (K / sqrt(hd))
    dqs = []
    for q0, q1, keys in blocks:  # dQ: each query block against the keys it sees
        _, ds = tiles(q0, q1, 0, keys)
        dqs.append(b.dot(ds, rows_of(k_scaled, 0, keys)))
    dks: list[Op] = []
    dvs: list[Op] = []
    for k0 in range(0, s, KEY_BLOCK):  # dK, dV: each key block against the queries that see it
        k1 = min(s, k0 + KEY_BLOCK)
        r0 = k0 // ATTENTION_BLOCK * ATTENTION_BLOCK  # the first query block whose keys reach k0
        probs, ds = tiles(r0, s, k0, k1)
        dvs.append(b.dot(probs, rows_of(dout, r0, s), lhs_contract=-2))
        dks.append(b.dot(ds, rows_of(q, r0, s), lhs_contract=-2))
    return b.concatenate(dqs, 2), b.concatenate(dks, 2), b.concatenate(dvs, 2)


def _fold_kv(b: GraphBuilder, g: Op, kv_heads: int) -> Op:
    """Gradient of :func:`_expand_kv`: sum the query heads' shares back onto their KV head.

    Query head ``j * groups + i`` reads KV head ``j``, so member ``i`` of every group is the
    strided slice of heads ``i, groups + i, ...`` and the fold is ``groups - 1`` elementwise adds
    of ``[batch, kv, seq, hd]`` tiles (how a kernel sums them: the heads of a group side by side).
    A reduce over the middle ``groups`` dim instead lowers as a reduction along a free dim of
    ``groups`` elements, one ``[rows, 1]`` tile per (token, channel) pair: 8,192 tiny tiles and
    ~38k instructions for a 70B layer at seq 8192 with 2 query heads per KV head."""
    bt, nh, s, hd = g.shape
    if nh == kv_heads:
        return g
    groups = nh // kv_heads
    members = [b.slice(g, (0, i, 0, 0), (bt, nh, s, hd), (1, groups, 1, 1)) for i in range(groups)]
    return _combine(b, members, "sum")


def _halves(b: GraphBuilder, x: Op) -> tuple[Op, Op]:
    """The gate and up halves of a fused [tokens, 2 I] gate_up projection."""
    t, two = x.shape
    return b.slice(x, (0, 0), (t, two // 2)), b.slice(x, (0, two // 2), (t, two))


def _linear(b: GraphBuilder, x: Op, d_in: int, d_out: int, name: str, dtype: str, bias: bool) -> Op:
    with b.scope(name):
        y = b.matmul(x, b.weight("weight", (d_in, d_out), dtype))
        if bias:
            y = b.add(y, b.weight("bias", (d_out,), dtype, scale=0.02))
    return y


def _linear_backward(b: GraphBuilder, x: Op, dy: Op, d_in: int, d_out: int, name: str, dtype: str,
                     bias: bool, grads: list[Op], later: list[tuple[str, Op, Op, bool]] | None = None) -> Op:
    """dx = dy W^T; dW = x^T dy (and db = sum dy), appended to ``grads`` -- or, with ``later``,
    left for :func:`_weight_grads` to emit after the input gradient's collective has started."""
    with b.scope(name):
        w = b.weight("weight", (d_in, d_out), dtype)
        dx = b.dot(dy, w, rhs_contract=-1)
    if later is not None:
        later.append((name, x, dy, bias))
    else:
        _weight_grads(b, [(name, x, dy, bias)], grads)
    return dx


def _weight_grads(b: GraphBuilder, pending: list[tuple[str, Op, Op, bool]], grads: list[Op]) -> None:
    """The weight (and bias) gradients of linears whose input gradients were emitted first.

    Megatron-LM launches the input gradient's all-reduce / reduce-scatter asynchronously and
    computes the weight gradient under it (``LinearWithGradAccumulationAndAsyncCommunication``);
    the CC-core runs a collective while the engines go on with work that does not need its result
    (Neuron's compute-communication overlap). Emitting the weight gradients after the collective
    puts them there in program order."""
    for name, x, dy, bias in pending:
        with b.scope(name):
            grads.append(b.dot(x, dy, lhs_contract=-2))
            if bias:
                grads.append(_column_sum(b, dy))
    pending.clear()


@dataclass(frozen=True)
class Saved:
    """The activations a layer's forward keeps for its backward, as autograd keeps them without
    activation checkpointing: each linear's input (the norms' outputs, attention's context, the
    GELU MLP's activation), each nonlinearity's input; attention probabilities are not kept
    (flash attention keeps the row statistic ``lse`` and recomputes the scores), and SwiGLU's
    product is recomputed (NxD's selective checkpointing, :attr:`Transformer.recompute_mlp`)."""

    x: Op
    q: Op
    k: Op
    v: Op
    ctx: Op
    lse: Op
    x2: Op
    norms: tuple[Op, Op]  # the two norms' outputs (the rank's token shard under sequence parallelism)
    mlp: tuple[Op, ...]  # swiglu: (gate_up,) the fused projection's output; gelu: (fc1 output, GELU)

    def outputs(self) -> list[Op]:
        return [self.q, self.k, self.v, self.ctx, self.lse, self.x2, *self.norms, *self.mlp]


def forward_ops(b: GraphBuilder, m: Transformer, r: RankShapes, tp: int, dtype: str, x: Op,
                group: str = "tp") -> tuple[Op, Saved]:
    """One layer's forward ops added to ``b`` (inside the caller's scope): output and saved values."""
    h = r.hidden
    norm1 = _norm(b, m, x, "input_layernorm", dtype)
    n1 = _enter_tp(b, norm1, r, group)
    with b.scope("self_attn"):
        # a fused qkv_proj's forward is its weight's three column blocks, one matmul each: a
        # matmul's output columns are independent, and slicing the fused [tokens, q + 2 kv]
        # output would send it through HBM; its backward is where fusing changes the work
        names = (("qkv_proj.q", "qkv_proj.k", "qkv_proj.v") if m.fused_qkv
                 else ("q_proj", "k_proj", "v_proj"))
        qt = _linear(b, n1, h, r.heads * r.head_dim, names[0], dtype, m.bias)
        kt = _linear(b, n1, h, r.kv_heads * r.head_dim, names[1], dtype, m.bias)
        vt = _linear(b, n1, h, r.kv_heads * r.head_dim, names[2], dtype, m.bias)
        if m.rope:  # the rotation works per head: q and k are kept in head layout
            q, k = _rope(b, _heads(b, qt, r, r.heads), dtype), _rope(b, _heads(b, kt, r, r.kv_heads), dtype)
            q = _scale_queries(b, q)  # saved scaled: the backward's scores and dK read it so
            kept_q, kept_k = q, k
        else:  # kept as the projections produce them (token-major); the heads are views of them
            qt = kept_q = _scale_queries(b, qt)
            kept_k = kt
            q, k = _heads(b, qt, r, r.heads), _heads(b, kt, r, r.kv_heads)
        v = _heads(b, vt, r, r.kv_heads)
        ctx, lse = _attention_forward(b, m, q, _expand_kv(b, k, r.heads), _expand_kv(b, v, r.heads))
        ctx_t = _tokens(b, ctx, r)
        with b.scope("o_proj"):
            o = _leave_tp(b, b.matmul(ctx_t, b.weight("weight", (r.heads * r.head_dim, h), dtype)), r,
                          group)
            if m.bias:
                o = b.add(o, b.weight("bias", (h,), dtype, scale=0.02))
    x2 = b.add(x, o)
    norm2 = _norm(b, m, x2, "post_attention_layernorm", dtype)
    n2 = _enter_tp(b, norm2, r, group)
    with b.scope("mlp"):
        saved_mlp: tuple[Op, ...]
        if m.mlp == "swiglu":
            # NxD's LlamaMLP: one column-parallel gate_up_proj [h, 2 I] (stride 2), split after
            gate_up = _linear(b, n2, h, 2 * r.intermediate, "gate_up_proj", dtype, False)
            gate, up = _halves(b, gate_up)
            act = b.multiply(b.silu(gate), up)
            saved_mlp = (gate_up,)
        else:
            pre = _linear(b, n2, h, r.intermediate, "fc1", dtype, m.bias)
            act = b.gelu(pre, approximate="none")  # HF BERT / ViT "gelu": the exact (erf) GELU
            saved_mlp = (pre, act)  # GELU's input and down_proj's input, both kept by autograd
        with b.scope("down_proj"):
            down = _leave_tp(b, b.matmul(act, b.weight("weight", (r.intermediate, h), dtype)), r, group)
            if m.bias:
                down = b.add(down, b.weight("bias", (h,), dtype, scale=0.02))
    return b.add(x2, down), Saved(x, kept_q, kept_k, vt, ctx_t, lse, x2, (norm1, norm2), saved_mlp)


class Gradients(list[Op]):
    """The weight gradients of a layer's backward, in the order they are produced. With a
    ``finish`` hook (gradient accumulation) each gradient is passed through it the moment it is
    appended, so its accumulation is emitted right after the matmul that produced it."""

    def __init__(self, finish: Callable[[Op], Op] | None = None) -> None:
        super().__init__()
        self._finish = finish

    def append(self, g: Op) -> None:
        super().append(self._finish(g) if self._finish is not None else g)


def backward_ops(b: GraphBuilder, m: Transformer, r: RankShapes, tp: int, dtype: str, s: Saved,
                 dy: Op, group: str = "tp", finish: Callable[[Op], Op] | None = None) -> tuple[Op, list[Op]]:
    """One layer's backward ops added to ``b``: the input gradient and the weight gradients (each
    passed through ``finish`` as it is produced, when given: gradient accumulation)."""
    h, hd = r.hidden, r.head_dim
    grads = Gradients(finish)
    x, x2 = s.x, s.x2
    with b.scope("mlp"):
        if m.mlp == "swiglu":
            gate, up = _halves(b, s.mlp[0])
            silu = b.silu(gate)
            act = b.multiply(silu, up)
        else:
            pre, act = s.mlp  # kept: no activation checkpointing (HF BERT / ViT on torch-neuronx)
        if m.bias:
            grads.append(_column_sum(b, dy))  # down_proj bias: dy is replicated, any rank has it
        dy_tp = _enter_tp(b, dy, r, group)  # sequence parallel: the reduce-scatter's backward
        with b.scope("down_proj"):
            w = b.weight("weight", (r.intermediate, h), dtype)
            dact = b.dot(dy_tp, w, rhs_contract=-1)
            grads.append(b.dot(act, dy_tp, lhs_contract=-2))
        # the norm's output is kept; sequence parallel gathers it again, as Megatron does
        n2 = _enter_tp(b, s.norms[1], r, group)
        # with a collective after the input gradient, the weight gradients go under it
        later: list[tuple[str, Op, Op, bool]] | None = [] if r.tp > 1 else None
        if m.mlp == "swiglu":
            # the activations' derivatives are Scalar-engine functions (nki.language.silu_dx,
            # gelu_dx on Trn1): one pass each instead of the chain of elementwise ops autodiff writes
            dgate = b.multiply(b.multiply(dact, up), b.silu_dx(gate))
            dup = b.multiply(dact, silu)
            # the fused projection's backward: one matmul over K = 2 I for the input gradient (no
            # sum of two [tokens, hidden] partials) and one for the weight gradient
            dn2 = _linear_backward(b, n2, b.concatenate([dgate, dup], 1), h, 2 * r.intermediate,
                                   "gate_up_proj", dtype, False, grads, later)
        else:
            dpre = b.multiply(dact, b.gelu_dx(pre))
            dn2 = _linear_backward(b, n2, dpre, h, r.intermediate, "fc1", dtype, m.bias, grads, later)
        dn2 = _leave_tp(b, dn2, r, group)
        _weight_grads(b, later or [], grads)
    dx2_norm, dg2 = _norm_backward(b, m, x2, dn2, "post_attention_layernorm", dtype)
    grads.append(dg2)
    dx2 = b.add(dy, dx2_norm)
    with b.scope("self_attn"):
        if m.bias:
            grads.append(_column_sum(b, dx2))
        dx2_tp = _enter_tp(b, dx2, r, group)
        def heads(x: Op, n: int) -> Op:
            """A kept attention value in head layout (a token-major one viewed)."""
            return x if len(x.shape) == 4 else _heads(b, x, r, n)

        ctx_t = s.ctx if len(s.ctx.shape) == 2 else _tokens(b, s.ctx, r)
        dctx = _heads(b, _linear_backward(b, ctx_t, dx2_tp, r.heads * hd, h, "o_proj", dtype, False, grads),
                      r, r.heads)
        kx = _expand_kv(b, heads(s.k, r.kv_heads), r.heads)
        vx = _expand_kv(b, heads(s.v, r.kv_heads), r.heads)
        dq, dk, dv = _attention_backward(b, m, heads(s.q, r.heads), kx, vx, heads(s.ctx, r.heads), s.lse,
                                         dctx)
        dk, dv = _fold_kv(b, dk, r.kv_heads), _fold_kv(b, dv, r.kv_heads)
        if m.rope:
            dq, dk = _rope(b, dq, dtype, -1.0), _rope(b, dk, dtype, -1.0)
        n1 = _enter_tp(b, s.norms[0], r, group)
        if m.fused_qkv:  # one input-gradient matmul over K = q + 2 kv (no sum of three partials)
            dqkv = b.concatenate([_tokens(b, dq, r), _tokens(b, dk, r), _tokens(b, dv, r)], 1)
            dn1 = _linear_backward(b, n1, dqkv, h, (r.heads + 2 * r.kv_heads) * hd, "qkv_proj", dtype,
                                   m.bias, grads, later)
        else:
            dn1 = _linear_backward(b, n1, _tokens(b, dq, r), h, r.heads * hd, "q_proj", dtype, m.bias,
                                   grads, later)
            dn1 = b.add(dn1, _linear_backward(b, n1, _tokens(b, dk, r), h, r.kv_heads * hd, "k_proj",
                                              dtype, m.bias, grads, later))
            dn1 = b.add(dn1, _linear_backward(b, n1, _tokens(b, dv, r), h, r.kv_heads * hd, "v_proj",
                                              dtype, m.bias, grads, later))
        dn1 = _leave_tp(b, dn1, r, group)
        _weight_grads(b, later or [], grads)
    dx_norm, dg1 = _norm_backward(b, m, x, dn1, "input_layernorm", dtype)
    grads.append(dg1)
    return b.add(dx2, dx_norm), grads


def layer_forward(m: Transformer, r: RankShapes, tp: int, dtype: str = "bf16") -> Graph:
    """One layer's forward on one rank: input [tokens, hidden] -> output, plus the activations the
    backward reads (written to HBM, as a training step keeps them)."""
    b = GraphBuilder(f"{m.name}_layer_fwd", root_layer="layers.0")
    x = b.parameter("hidden_states", (r.sp_tokens, r.hidden), dtype)
    y, saved = forward_ops(b, m, r, tp, dtype, x)
    return b.build([y, *saved.outputs()])


def layer_backward(m: Transformer, r: RankShapes, tp: int, dtype: str = "bf16",
                   grad_dtype: str = "fp32") -> Graph:
    """One layer's backward on one rank: the output gradient and the saved activations in, the
    input gradient and the weight gradients (accumulated into ``grad_dtype`` buffers, as gradient
    accumulation over micro-batches does) out. Megatron's backward all-reduces the gradient of each
    column-parallel block's input (after q/k/v and after gate/up)."""
    b = GraphBuilder(f"{m.name}_layer_bwd", root_layer="layers.0")
    t, h, hd = r.tokens, r.hidden, r.head_dim
    bt, sq = r.batch, r.seq
    mlp = ((b.parameter("gate_up", (t, 2 * r.intermediate), dtype),)
           if m.mlp == "swiglu" else (b.parameter("fc1_out", (t, r.intermediate), dtype),
                                      b.parameter("fc1_act", (t, r.intermediate), dtype)))
    def kept(name: str, n: int, head_layout: bool) -> Op:
        """A kept attention value as :func:`forward_ops` keeps it."""
        return b.parameter(name, (bt, n, sq, hd) if head_layout else (t, n * hd), dtype)

    rope = m.rope
    saved = Saved(b.parameter("hidden_states", (r.sp_tokens, h), dtype),
                  kept("q", r.heads, rope), kept("k", r.kv_heads, rope), kept("v", r.kv_heads, False),
                  kept("attn_out", r.heads, False),
                  b.parameter("lse", (bt, r.heads, sq), dtype),
                  b.parameter("residual", (r.sp_tokens, h), dtype),
                  (b.parameter("input_layernorm_out", (r.sp_tokens, h), dtype),
                   b.parameter("post_attention_layernorm_out", (r.sp_tokens, h), dtype)), mlp)
    dy = b.parameter("grad_output", (r.sp_tokens, h), dtype)

    def accumulate(g: Op) -> Op:
        """``acc += g`` right where ``g`` is produced: a compiler's scheduler places the add as
        soon as its operands are ready (XLA's graph has no order between independent ops; the
        program order here is ours), so it runs beside the rest of the backward instead of as a
        tail with every other engine idle. A cast only when the buffer's type differs."""
        with b.scope("grad_accumulation"):
            acc = b.parameter(f"grad_acc.{next(number)}", g.shape, grad_dtype)
            return b.add(acc, g if g.dtype.value == grad_dtype else b.convert(g, grad_dtype))

    number = itertools.count()
    dx, accumulated = backward_ops(b, m, r, tp, dtype, saved, dy, finish=accumulate)
    return b.build([dx, *accumulated])


def embedding_ops(b: GraphBuilder, m: Transformer, r: RankShapes, tp: int, dtype: str,
                  group: str = "tp") -> Op:
    """The input embedding on one rank: vocab-parallel (each rank looks its ids up in its rows, the
    others' ids are masked to zero, all-reduce); ViT's patch embedding is a matmul."""
    t, h = r.tokens, r.hidden
    vocab = -(-m.vocab // tp)  # padded to a multiple of tp (Megatron)
    with b.scope("embed_tokens"):
        if m.classes:  # ViT: patches [tokens, 3*16*16] @ [768, hidden], the rank's token shard
            return b.matmul(b.parameter("patches", (r.sp_tokens, m.vocab), dtype),
                            b.weight("weight", (m.vocab, h), dtype))
        ids = b.parameter("input_ids", (t,), "int32", low=0, high=vocab)
        keep = b.parameter("in_shard", (t,), dtype)
        x = b.multiply(b.gather(b.weight("weight", (vocab, h), dtype, scale=0.02), ids),
                       b.broadcast(keep, (t, h), (0,)))
        return _leave_tp(b, x, r, group)


def head_ops(b: GraphBuilder, m: Transformer, r: RankShapes, tp: int, dtype: str, last: Op,
             group: str = "tp") -> tuple[Op, Op, list[Op]]:
    """Final norm, the head and the loss, forward and backward: (loss, gradient of ``last``, the
    head's weight gradients). The LM head is column-parallel over the (padded) vocabulary and the
    cross-entropy's max and sum are all-reduced, as Megatron's vocab-parallel cross-entropy does;
    a classifier (ViT) reads the first token of each sequence."""
    t, h = r.tokens, r.hidden
    vocab = -(-m.vocab // tp)
    n = _enter_tp(b, _norm(b, m, last, "norm", dtype), r, group)
    width = m.classes if m.classes else vocab
    rows = r.batch if m.classes else t
    feats = b.slice(n, (0, 0), (rows, h)) if rows != t else n
    head = "classifier" if m.classes else "lm_head"
    with b.scope(head):
        w = b.weight("weight", (h, width), dtype)
        logits = b.matmul(feats, w)
    # Cross-entropy as a fused log-softmax kernel streams it: FP32 inside (autocast upcasts it),
    # over blocks of LOSS_BLOCK vocabulary columns so that a block's row tiles stay on chip. Pass 1
    # takes the row max, pass 2 the sum of exponentials, pass 3 recomputes the exponentials and
    # writes the gradient softmax - one_hot(target), the one-hot built on chip from a column index
    # row compared with the targets. The target's logit is gathered (one element per row): no dense
    # [rows, vocab] target is read from HBM.
    blocks = [(c, min(width, c + LOSS_BLOCK)) for c in range(0, width, LOSS_BLOCK)]
    with b.scope("loss"):
        target = b.parameter("target", (rows,), "fp32", low=0, high=width)  # the rank's column of it

        def block32(c0: int, c1: int) -> Op:
            return b.convert(b.slice(logits, (0, c0), (rows, c1)), "fp32")

        peak = _combine(b, [b.reduce(block32(c0, c1), [1], kind="max") for c0, c1 in blocks], "max")
        peak = peak if m.classes else _all_reduce(b, peak, tp, group)  # (a max: same bytes as a sum)

        def exp_block(c0: int, c1: int) -> Op:
            return b.exp(b.subtract(block32(c0, c1), b.broadcast(peak, (rows, c1 - c0), (0,))))

        total = _combine(b, [b.reduce(exp_block(c0, c1), [1]) for c0, c1 in blocks], "sum")
        total = total if m.classes else _all_reduce(b, total, tp, group)
        dlogits: list[Op] = []
        # a block's column indices made once, and each block's targets shifted to its columns, all
        # before the blocks' loop: inside it each one-hot is broadcasts only (streaming.joins)
        span = blocks[0][1] - blocks[0][0]
        columns = b.convert(b.iota((span,), 0), "fp32")
        shifted = [target if c0 == 0 else b.subtract(target, float(c0)) for c0, _ in blocks]
        for (c0, c1), local in zip(blocks, shifted):
            shape = (rows, c1 - c0)
            probs = b.divide(exp_block(c0, c1), b.broadcast(total, shape, (0,)))
            cols = columns if c1 - c0 == span else b.slice(columns, (0,), (c1 - c0,))
            one_hot = b.compare(b.broadcast(cols, shape, (1,)), b.broadcast(local, shape, (0,)), "EQ")
            dlogits.append(b.convert(b.subtract(probs, b.convert(one_hot, "fp32")), dtype))
        flat = b.parameter("target_flat_index", (rows,), "int32", low=0, high=rows * width)
        picked = b.convert(b.reshape(b.gather(b.reshape(logits, (rows * width, 1)), flat), (rows,)), "fp32")
        picked = picked if m.classes else _all_reduce(b, picked, tp, group)  # Megatron: masked, summed
        loss = b.reduce(b.subtract(b.add(b.log(total), peak), picked), [0])
    with b.scope(head):
        grad = dlogits[0] if len(dlogits) == 1 else b.concatenate(dlogits, 1)
        dn = b.dot(grad, w, rhs_contract=-1)
        dw = b.dot(feats, grad, lhs_contract=-2)
    if rows != t:
        dn = b.concatenate([dn, b.constant(0.0, dtype, (t - rows, h))], 0)
    if not m.classes:
        dn = _leave_tp(b, dn, r, group)
    elif r.sequence_parallel:  # a classifier's head is whole: each rank keeps its token shard
        dn = b.slice(dn, (0, 0), (r.sp_tokens, h))
    dlast, dgamma = _norm_backward(b, m, last, dn, "norm", dtype)
    return loss, dlast, [dw, dgamma]


def head_graph(m: Transformer, r: RankShapes, tp: int, dtype: str = "bf16") -> Graph:
    """The parts of a step outside the repeated layers on one rank: the embedding, and the final
    norm, head and loss forward and backward."""
    b = GraphBuilder(f"{m.name}_head", root_layer="model")
    x = embedding_ops(b, m, r, tp, dtype)
    last = b.parameter("last_hidden", (r.sp_tokens, r.hidden), dtype)
    loss, dlast, grads = head_ops(b, m, r, tp, dtype, last)
    return b.build([x, loss, dlast, *grads])


def optimizer_frames(name: str = "AdamW") -> tuple[SourceFrame, ...]:
    """The source location of a built-in step's optimizer ops: no user line runs the update (the
    step is built, not traced from ``optimizer.step()``), so a synthetic ``<optimizer AdamW>``
    says what they are instead of naming whichever caller built the program."""
    return (SourceFrame(f"<optimizer {name}>", 0, f"{name}.step"),)


def optimizer_graph(elements: int, param_dtype: str = "fp32", grad_dtype: str = "fp32",
                    model_dtype: str = "bf16", weight_decay: float = 0.01) -> Graph:
    """AdamW over ``elements`` parameters held as one flat fp32 stream (master weights, both moments
    and the gradient in, the updated master, moments and the model-dtype copy out), as
    ``torch.optim.AdamW`` computes it: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr wd p."""
    cols = 2048
    rows = max(1, -(-elements // cols))
    b = GraphBuilder("adamw", root_layer="optimizer")
    with b.source(optimizer_frames()):
        return _adamw_flat(b, (rows, cols), param_dtype, grad_dtype, model_dtype, weight_decay)


def _adamw_flat(b: GraphBuilder, shape: tuple[int, int], param_dtype: str, grad_dtype: str,
                model_dtype: str, weight_decay: float) -> Graph:
    """The body of :func:`optimizer_graph`."""
    p = b.parameter("param", shape, param_dtype)
    g = b.convert(b.parameter("grad", shape, grad_dtype), param_dtype)
    m1 = b.parameter("exp_avg", shape, param_dtype)
    m2 = b.parameter("exp_avg_sq", shape, param_dtype)
    lr, b1, b2, eps = 1e-4, 0.9, 0.999, 1e-8
    m1n = b.add(b.multiply(m1, b1), b.multiply(g, 1 - b1))
    m2n = b.add(b.multiply(m2, b2), b.multiply(b.multiply(g, g), 1 - b2))
    denom = b.add(b.sqrt(b.multiply(m2n, 1 / (1 - b2))), eps)
    step = b.divide(b.multiply(m1n, lr / (1 - b1)), denom)
    pn = b.subtract(b.multiply(p, 1 - lr * weight_decay), step)
    outs = [pn, m1n, m2n]
    if model_dtype != param_dtype:
        outs.append(b.convert(pn, model_dtype))
    return b.build(outs)


__all__ = ["ATTENTION_BLOCK", "KEY_BLOCK", "LOSS_BLOCK", "OPTIMIZER_CHUNK", "RankShapes", "Saved",
           "Transformer", "backward_ops", "embedding_ops", "forward_ops", "head_graph", "head_ops",
           "layer_backward", "layer_forward", "optimizer_frames", "optimizer_graph"]
