"""What the compiler keeps on chip instead of going through HBM (docs/execution-core.md, "Fusion").

Attention's head split and merge are read in place or assembled by engine copies (on-chip views);
numerics must not change, and no scratch tensor may appear in HBM for them.
"""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.lowering_state import HbmTensorKind

S, H, D = 128, 4, 32
E = H * D


def _attention(dtype: str = "fp32", keep_merged: bool = False) -> tuple[nc.Graph, list[np.ndarray]]:
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E), dtype)
    heads = []
    for name in ("q", "k", "v"):
        w = g.weight(f"w{name}", (E, E), dtype)
        y = g.dot(x, w)
        y = g.reshape(y, (1, S, H, D))
        heads.append(g.transpose(y, (0, 2, 1, 3)))  # [1, H, S, D]
    q, k, v = (g.reshape(h, (H, S, D)) for h in heads)
    scores = g.dot(q, k, rhs_contract=-1)  # [H, S, S]
    probs = g.softmax(g.multiply(scores, 1.0 / np.sqrt(D)))
    out = g.dot(probs, v)  # [H, S, D]
    merged = g.reshape(g.transpose(g.reshape(out, (1, H, S, D)), (0, 2, 1, 3)), (S, E))
    wo = g.weight("wo", (E, E), dtype)
    # keep_merged: the merged context is also an output (a training step keeps it for the backward)
    graph = g.build([g.dot(merged, wo), *([merged] if keep_merged else [])])
    rng = np.random.default_rng(0)
    return graph, [rng.standard_normal((S, E)).astype(np.float32)]


@pytest.fixture(scope="module")
def attention_run(run):
    graph, inputs = _attention()
    return run(graph, inputs)


def test_head_split_and_merge_stay_on_chip(attention_run, assert_close):
    program = attention_run.program
    scratch = [t.name for t in program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert scratch == [], f"head split/merge went through HBM: {scratch}"
    assert program.hbm_views == {}
    assert program.stats["on_chip_views"] >= 3  # q, k and v heads read in place
    assert program.stats["on_chip_view_copies"] >= 1  # the merge: one copy per head
    assert_close(attention_run.out, attention_run.ref)


def test_a_kept_head_merge_is_stored_from_its_own_tiles(run, assert_close):
    """The merged attention context assembled on chip and kept as an output is stored from the
    merged tiles; storing its source (the transpose, a view) sent the heads through HBM first:
    stored, read back through a strided view, stored again."""
    graph, inputs = _attention(keep_merged=True)
    result = run(graph, inputs)
    program = result.program
    scratch = [t.name for t in program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert scratch == [] and program.hbm_views == {}, (scratch, list(program.hbm_views))
    assert_close(result.out, result.ref)
    assert_close(result.outputs[1], result.reference[1])


def test_a_view_of_a_value_in_hbm_still_reads_through_a_dma_view(run, assert_close):
    """Rows that move across partitions cannot be engine copies: the HBM view stays."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (8, 16, 64))
    y = g.exp(x)
    t = g.transpose(y, (1, 0, 2))  # rows of one tile spread over 16 tiles
    graph = g.build([g.add(t, 1.0)])
    inputs = [np.random.default_rng(1).standard_normal((8, 16, 64)).astype(np.float32)]
    result = run(graph, inputs)
    assert result.program.hbm_views, "expected the transpose to be read through an HBM view"
    assert_close(result.out, result.ref)


def _mlp(dtype: str, expose_dot: bool) -> nc.Graph:
    g = nc.GraphBuilder()
    x = g.parameter("x", (S, E), dtype)
    dot = g.dot(x, g.weight("w", (E, 2 * E), dtype))
    y = g.gelu(g.add(dot, g.weight("b", (2 * E,), dtype, scale=0.5)))
    out = g.dot(y, g.weight("w2", (2 * E, E), dtype))
    return g.build([out, dot] if expose_dot else [out])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bias_and_activation_are_fused_into_the_psum_evacuation(run, assert_close, dtype):
    """dot -> + bias row -> gelu: the evacuation adds the bias row (loaded once, replicated on
    the partitions) and applies the activation in place; no separate pass, same numerics."""
    graph = _mlp(dtype, expose_dot=False)
    inputs = [np.random.default_rng(2).standard_normal((S, E)).astype(np.float32)]
    result = run(graph, inputs)
    add, gelu = (op for op in graph.ops if op.opcode in ("add", "gelu"))
    program = result.program
    assert not (program.op_index == add.index).any() and not (program.op_index == gelu.index).any()
    dot_ops = {op.index for op in graph.ops if op.opcode == "dot"}
    acts = [i for i in range(program.n_nodes) if int(program.op_index[i]) in dot_ops
            and program.activation_fn[i] == "Gelu_apprx_tanh"]
    assert acts, "the activation runs in the dot's evacuation"
    assert_close(result.out, result.ref, dtype)
    # the same roundings as the unfused ops (the dot is a graph output there, so nothing fuses)
    unfused = run(_mlp(dtype, expose_dot=True), inputs)
    assert any(int(unfused.program.op_index[i]) == add.index for i in range(unfused.program.n_nodes))
    np.testing.assert_array_equal(result.out, unfused.outputs[0])


def test_a_batched_chain_is_lowered_batch_by_batch_on_chip(run, assert_close):
    """scores -> scale -> softmax -> @V over many heads: larger than a quarter of SBUF in total,
    so unfused every intermediate went to HBM; as a fusion group one head at a time stays on chip."""
    heads, seq, d = 24, 128, 64
    g = nc.GraphBuilder()
    q = g.parameter("q", (heads, seq, d), "bf16")
    k = g.parameter("k", (heads, seq, d), "bf16")
    v = g.parameter("v", (heads, seq, d), "bf16")
    scores = g.multiply(g.dot(q, k, rhs_contract=-1), 0.125)
    probs = g.softmax(g.exp(g.negate(g.exp(scores))))  # a longer chain: bigger than a quarter of SBUF
    graph = g.build([g.dot(probs, v)])
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((heads, seq, d)).astype(np.float32) for _ in range(3)]
    result = run(graph, inputs)
    program = result.program
    assert program.stats["fusion_groups"] >= 1 and program.stats["fused_ops"] >= 5
    scratch = [t.name for t in program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert scratch == [], f"intermediates of the group went through HBM: {scratch}"
    np.testing.assert_array_equal(result.out, result.ref)


def _masked_scores(b: int, heads: int, seq: int, d: int) -> tuple:
    """BERT's SDPA scores as torch computes them: ``q k^T`` as ``[b*heads, seq, seq]``, reshaped
    to ``[b, heads, seq, seq]`` for the mask add (the builder, ``v``, the scores, the sum)."""
    g = nc.GraphBuilder()
    q = g.parameter("q", (b * heads, seq, d), "fp32")
    k = g.parameter("k", (b * heads, seq, d), "fp32")
    v = g.parameter("v", (b * heads, seq, d), "fp32")
    mask = g.parameter("mask", (b, heads, seq, seq), "fp32")
    scores = g.dot(q, k, rhs_contract=-1)
    return g, v, scores, g.add(g.reshape(scores, (b, heads, seq, seq)), mask)


def test_a_view_of_the_scores_between_the_dot_and_the_mask_stays_in_the_group(run, assert_close):
    """torch's SDPA path (BERT) computes the scores as ``[B*H, S, S]`` and reshapes them to
    ``[B, H, S, S]`` before the mask add: a view reading a member closed the group, so the scores
    (here 96 KiB per partition in FP32, over a quarter of SBUF) were stored to HBM and read back
    by the add. The reshape keeps each batch's rows and columns: it aliases the dot's tiles one
    for one and steps with the group."""
    b, heads, seq, d = 4, 48, 128, 64  # 192 score tiles of 128 x 128 FP32: 96 KiB per partition
    g, v, scores, masked = _masked_scores(b, heads, seq, d)
    probs = g.reshape(g.softmax(masked), (b * heads, seq, seq))
    graph = g.build([g.dot(probs, v)])
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((b * heads, seq, d)).astype(np.float32) for _ in range(3)]
    inputs.append(np.where(rng.random((b, heads, seq, seq)) < 0.1, -1e4, 0.0).astype(np.float32))
    result = run(graph, inputs)
    scratch = [t.name for t in result.program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert scores.name not in scratch, f"the scores went through HBM: {scratch}"
    assert_close(result.out, result.ref)


def test_the_safe_softmax_select_steps_with_the_attention_group(run, assert_close):
    """torch's ``_safe_softmax`` (BERT's default SDPA path) checks each row of the masked scores for
    all ``-inf`` (a compare, a last-dim reduce, a compare of the ``[B, H, S]`` row statistic, a
    reshape to ``[B, H, S, 1]``, a compare) and selects zeros for such rows over the softmax. The
    row statistic is a reduce's column tiles, which did not step, so the group closed there and
    the softmax and the select (here 96 KiB per partition each in FP32, over a quarter of SBUF)
    went through HBM. Column tiles step one per row tile, a per-row broadcast of a member is read
    as its column, and the select steps with the group. Only where values live changes (outputs
    bit-identical to the HBM placement's, checked when this was built; the FP32 dot's own
    summation order is what differs from numpy)."""
    b, heads, seq, d = 4, 48, 128, 64  # 192 score tiles of 128 x 128 FP32: 96 KiB per partition
    g, v, _, masked = _masked_scores(b, heads, seq, d)
    probs = g.softmax(masked)
    is_masked = g.compare(masked, float("-inf"), "EQ")
    kept = g.convert(g.compare(is_masked, g.constant(1.0, "pred"), "NE"), "fp32")
    any_kept = g.compare(g.reduce(kept, [3]), 0.0, "NE")  # [b, heads, seq]: the column statistic
    all_masked = g.compare(g.reshape(any_kept, (b, heads, seq, 1)), g.constant(1.0, "pred"), "NE")
    safe = g.select(all_masked, 0.0, probs)
    graph = g.build([g.dot(g.reshape(safe, (b * heads, seq, seq)), v)])
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((b * heads, seq, d)).astype(np.float32) for _ in range(3)]
    masks = np.where(rng.random((b, heads, seq, seq)) < 0.1, -np.inf, 0.0).astype(np.float32)
    masks[:, :, ::17] = -np.inf  # whole rows masked: the select writes their zeros
    inputs.append(masks)
    result = run(graph, inputs)
    scratch = [t.name for t in result.program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert probs.name not in scratch and safe.name not in scratch, f"went through HBM: {scratch}"
    assert not np.isnan(result.out).any()
    assert_close(result.out, result.ref)


def test_an_op_reading_a_column_statistic_of_the_open_group_does_not_step_in_rows(run, assert_close):
    """A select of a row statistic still in the open group (a last-dim reduce's column tiles,
    compared) with a full-size row-tile operand takes the statistic's column layout, so it must not
    join a group that steps in row tiles: it stopped the compiler with "tile 1 of select is
    nowhere" (its reader's relayout wanted every tile stored while one step had made one). Found
    by ``torch.median``'s rank select (session 13); the graph is that one: a rank per element from
    a [3, 6, 6] comparison summed over its last axis, the element of rank 2 picked per row."""
    from neuroncore.frontends.rank_sort import stable_ranks

    g = nc.GraphBuilder("rank_select")
    x = g.parameter("x", (3, 6), "fp32")
    hit = g.compare(stable_ranks(g, x, 1, j_first=False), 2.0, "EQ")
    graph = g.build([g.reduce(g.select(hit, x, 0.0), [1], "sum")])
    inputs = [np.random.default_rng(3).standard_normal((3, 6)).astype(np.float32)]
    result = run(graph, inputs)
    assert_close(result.out, np.sort(inputs[0], axis=1)[:, 2])


def test_rotary_concatenation_is_assembled_on_chip(run, assert_close):
    """Rotate-half rotary embedding: ``cat(x1 cos - x2 sin, x2 cos + x1 sin)`` along the head dim
    of [heads, seq, head_dim] values that live in SBUF is built by engine copies into the output's
    column blocks (rows stay on their partitions); it used to store both halves to HBM and read
    them back through a view. Numerics are the same values copied."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (H, S, D))
    cos = g.parameter("cos", (S, D // 2))
    sin = g.parameter("sin", (S, D // 2))
    x1 = g.slice(x, (0, 0, 0), (H, S, D // 2))
    x2 = g.slice(x, (0, 0, D // 2), (H, S, D))
    c = g.broadcast(cos, (H, S, D // 2), (1, 2))
    s = g.broadcast(sin, (H, S, D // 2), (1, 2))
    first = g.subtract(g.multiply(x1, c), g.multiply(x2, s))
    second = g.add(g.multiply(x2, c), g.multiply(x1, s))
    rotated = g.concatenate([first, second], 2)
    graph = g.build([g.exp(rotated)])
    rng = np.random.default_rng(1)
    shapes = ((H, S, D), (S, D // 2), (S, D // 2))
    inputs = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    result = run(graph, inputs)
    program = result.program
    assert program.stats.get("on_chip_concatenations") == 1
    assert not any("concatenate" in name for name in program.hbm_views)
    assert_close(result.out, result.ref)


def _cast_mlp(tokens: int, width: int, expose_gelu: bool) -> nc.Graph:
    """An FP32 model's MLP under BF16 matmul auto-cast, as torch exports BERT's: dot -> + bias ->
    reshape [1, T, F] -> gelu -> reshape [T, F] -> cast to BF16 -> the next dot."""
    g = nc.GraphBuilder()
    x = g.parameter("x", (tokens, E), "fp32")
    dot = g.dot(x, g.weight("w", (E, width), "fp32"))
    y = g.add(dot, g.broadcast(g.weight("b", (width,), "fp32", scale=0.5), (tokens, width), (1,)))
    act = g.gelu(g.reshape(y, (1, tokens, width)))
    cast = g.convert(g.reshape(act, (tokens, width)), "bf16")
    out = g.dot(cast, g.weight("w2", (width, E), "bf16"))
    return g.build([out, act] if expose_gelu else [out])


@pytest.mark.parametrize("tokens", [64, 128], ids=["token-major", "feature-major"])
def test_the_cast_after_an_activation_is_the_evacuations_own_write(run, assert_close, tokens):
    """Engines convert on write (neuroncore.md §2.6): the BF16 cast of an FP32 dot's
    ``gelu(x @ w + b)`` is written by the evacuation itself, through the reshapes between the ops;
    no separate add, gelu or cast pass, and bit-identical to the unfused ops (every step FP32, one
    rounding on the last write). 64 tokens stay token-major, 128 are feature-major (orientation)."""
    graph = _cast_mlp(tokens, 2 * E, expose_gelu=False)
    inputs = [np.random.default_rng(4).standard_normal((tokens, E)).astype(np.float32)]
    result = run(graph, inputs)
    program = result.program
    fused = {op.index for op in graph.ops if op.opcode in ("add", "gelu", "convert")
             and op.operands[0].opcode != "constant"}
    assert len(fused) == 3
    assert not np.isin(program.op_index, list(fused)).any(), "a fused op has instructions of its own"
    first_dot = min(op.index for op in graph.ops if op.opcode == "dot")
    acts = [i for i in range(program.n_nodes) if int(program.op_index[i]) == first_dot
            and program.activation_fn[i] == "Gelu_apprx_tanh"]
    assert acts, "the activation runs in the dot's evacuation"
    assert (program.stats.get("oriented_dots", 0) > 0) == (tokens >= 128)
    # the gelu as a graph output keeps its own FP32 value, so the cast is a pass of its own there
    unfused = run(_cast_mlp(tokens, 2 * E, expose_gelu=True), inputs)
    cast = next(op for op in graph.ops if op.opcode == "convert" and op.operands[0].opcode == "reshape")
    assert (unfused.program.op_index == cast.index).any()
    np.testing.assert_array_equal(result.out, unfused.outputs[0])
    assert_close(result.out, result.ref, "bf16")


def test_a_cast_product_small_enough_stays_in_sbuf():
    """BERT-base's MLP at batch 8 (1,024 tokens x 3,072): the FP32 GELU output is 96 KB per
    partition, over the quarter of SBUF a value may hold, so it went through HBM and the cast read
    it back; the BF16 product the evacuation writes now is 48 KB, and stays on chip, feature-major."""
    graph = _cast_mlp(1024, 3072, expose_gelu=False)
    program = nc.compile(graph, "inf2")
    scratch = [t.name for t in program.hbm_tensors.values() if t.kind is HbmTensorKind.SCRATCH]
    assert scratch == [], f"the MLP intermediate went through HBM: {scratch}"
    assert program.stats.get("oriented_dots", 0) == 1
