"""Parallel training steps composed from one rank's simulated programs (neuroncore.parallel.training):
the layer programs carry Megatron's collectives, pipeline bubbles follow 1F1B, gradient collectives
overlap the backward in buckets, ZeRO-1 shards the optimizer, and bad layouts are one line."""

from __future__ import annotations

import pytest

from formats.figures import training_step_figures
from neuroncore.compiler import compile as compile_graph
from neuroncore.parallel.training import (
    DDP_BUCKET_BYTES,
    ParallelPlan,
    PlanError,
    StepTiming,
    _grad_buckets,
    _sync_schedule,
    clear_program_cache,
    overlap_fraction,
    time_training_step,
)
from neuroncore.topology import instance_topology
from neuroncore.workloads.train_graphs import RankShapes, Transformer, layer_backward, layer_forward
from neuroncore.workloads.training import SMALL, TRAIN_WORKLOADS, get_train

LLAMA = SMALL["llama-train"]


def _collectives(graph) -> list[str]:
    return [op.opcode for op in graph.ops if op.opcode in ("all-reduce", "all-gather")]


def test_layer_programs_carry_megatrons_collectives_and_twice_the_matmul_work() -> None:
    """Megatron: forward all-reduces after o_proj and down_proj, backward after the gradients of the
    column-parallel inputs (q/k/v and gate/up); the backward's matmuls are 2x the forward's plus the
    recomputed attention scores."""
    r = RankShapes.of(LLAMA, 1, 128, 2)
    fwd, bwd = layer_forward(LLAMA, r, 2), layer_backward(LLAMA, r, 2)
    assert _collectives(fwd) == ["all-reduce", "all-reduce"]
    assert _collectives(bwd) == ["all-reduce", "all-reduce"]
    assert _collectives(layer_forward(LLAMA, RankShapes.of(LLAMA, 1, 128, 1), 1)) == []
    f = int(compile_graph(fwd, "trn1").raw_flops.sum())
    b = int(compile_graph(bwd, "trn1").raw_flops.sum())
    assert 2.0 <= b / f <= 3.0


def test_sequence_parallel_layers_gather_into_and_scatter_out_of_each_tp_block() -> None:
    """Megatron-LM sequence parallelism (NxD --sequence_parallel_enabled): a rank holds 1/tp of the
    tokens between the blocks; the forward all-gathers the normed input of attention and of the MLP
    and reduce-scatters o_proj's and down_proj's partial sums; the backward gathers the output
    gradients and the recomputed norms and reduce-scatters the gradients of the blocks' inputs. The
    residual stream's HBM traffic shrinks by tp while the matmuls stay the same."""
    tp = 2
    r = RankShapes.of(LLAMA, 1, 128, tp, sequence_parallel=True)
    assert r.sp_tokens == 64 and RankShapes.of(LLAMA, 1, 128, 1, sequence_parallel=True).sp_tokens == 128
    fwd, bwd = layer_forward(LLAMA, r, tp), layer_backward(LLAMA, r, tp)
    ops = lambda g: [op.opcode for op in g.ops if op.opcode in ("all-reduce", "all-gather", "reduce-scatter")]  # noqa: E731
    assert ops(fwd) == ["all-gather", "reduce-scatter", "all-gather", "reduce-scatter"]
    assert sorted(ops(bwd)) == ["all-gather"] * 4 + ["reduce-scatter"] * 2
    assert fwd.ops[0].shape == (64, LLAMA.hidden) and fwd.outputs[0].shape == (64, LLAMA.hidden)
    plain = RankShapes.of(LLAMA, 1, 128, tp)
    sp_prog, plain_prog = compile_graph(fwd, "trn1"), compile_graph(layer_forward(LLAMA, plain, tp), "trn1")
    assert int(sp_prog.raw_flops.sum()) == pytest.approx(int(plain_prog.raw_flops.sum()), rel=0.02)
    with pytest.raises(PlanError, match="sequence parallelism needs tp 3"):
        ParallelPlan(tp=3, dp=1, seq=100, sequence_parallel=True).check(
            Transformer("x", 2, 96, 3, 3, 192, 64), _FakeTopology(3))


def test_attention_and_loss_tiles_stay_small_enough_for_chip() -> None:
    """Flash attention in 128-row query tiles with a two-pass backward (dQ per query tile, dK/dV per
    key block) and the cross-entropy in vocabulary blocks: no score or logit tile of the layer and
    head programs is wider than a block on both sides, and the backward's attention matmuls are the
    seven of the causal triangle (QK^T and dO V^T in each pass, dQ, dK, dV)."""
    from neuroncore.workloads.train_graphs import ATTENTION_BLOCK, KEY_BLOCK, LOSS_BLOCK, head_graph

    model = Transformer("llama-tiles", 1, 256, 4, 4, 512, 10000)
    seq = 4 * ATTENTION_BLOCK
    r = RankShapes.of(model, 1, seq, 1)
    bwd = layer_backward(model, r, 1)
    grids = [op for op in bwd.ops if op.opcode == "exponential" and len(op.shape) == 4]
    assert grids and all(min(op.shape[2], op.shape[3]) <= max(ATTENTION_BLOCK, KEY_BLOCK) for op in grids)
    attn_dots = [op for op in bwd.ops if op.opcode == "dot" and len(op.shape) == 4]
    hd = model.head_dim
    flops = sum(2 * op.shape[0] * op.shape[1] * op.shape[2] * op.shape[3] *
                (hd if op.shape[3] != hd else op.operands[0].shape[2 if op.attrs["lhs_contract"] == 2 else 3])
                for op in attn_dots)
    blocks = seq // ATTENTION_BLOCK
    triangle = 2 * model.heads * hd * ATTENTION_BLOCK ** 2 * blocks * (blocks + 1) // 2  # one matmul
    assert flops == 7 * triangle
    head = head_graph(model, r, 1)
    wide = [op for op in head.ops if op.opcode == "exponential"]
    assert wide and all(op.shape[-1] <= LOSS_BLOCK for op in wide)
    assert not [op for op in head.ops if op.opcode == "parameter" and op.shape == (seq, model.vocab)]


class _FakeTopology:
    def __init__(self, cores: int) -> None:
        self.cores, self.name = cores, "fake"


@pytest.fixture(scope="module")
def steps() -> dict[str, StepTiming]:
    w = get_train("llama-train")
    clear_program_cache()  # whatever ran before in this process: these steps compile their own
    out = {}
    for name, opts in {
        "dp": dict(tp=2, pp=1, seq=128, micro_batch=1, global_batch=64),
        "zero1": dict(tp=2, pp=1, zero1=True, seq=128, micro_batch=1, global_batch=64),
        "pp": dict(tp=2, pp=2, seq=128, micro_batch=1, global_batch=32),
        "efa": dict(tp=2, pp=1, seq=128, micro_batch=1, global_batch=64, nodes=2),
        "efa_trn1n": dict(tp=2, pp=1, seq=128, micro_batch=1, global_batch=64, nodes=2,
                          instance="trn1n.32xlarge"),
    }.items():
        model, plan = w.configure(None, **opts)
        out[name] = time_training_step(model, plan)
    return out


def test_step_is_the_sum_of_its_levels(steps: dict[str, StepTiming]) -> None:
    for step in steps.values():
        assert step.step_ns == pytest.approx(sum(step.parts.values()))
        assert set(step.parts) == {"forward", "backward", "pipeline", "gradient_sync", "optimizer"}
        assert step.parts["forward"] > 0 and step.parts["backward"] > step.parts["forward"]
        fig = training_step_figures(step.step_ns, step.plan.global_batch, step.plan.seq,
                                    step.model_flops, step.plan.world, step.peak_flops_per_core)
        assert fig.mfu is not None and 0 < fig.mfu < 1


def test_data_parallel_sync_is_bucketed_and_overlaps_the_backward(steps: dict[str, StepTiming]) -> None:
    dp = steps["dp"]
    assert dp.plan.dp == 16 and dp.parts["pipeline"] == 0
    assert all(s.operation == "AllReduce" for s in dp.sync)
    starts = [s.start_ns for s in dp.sync]
    assert starts == sorted(starts)
    assert all(b.start_ns >= a.end_ns for a, b in zip(dp.sync, dp.sync[1:]))  # one CC stream
    # this small model's gradients fit one bucket, which holds the embedding's and head's: nothing
    # to overlap (test_buckets_start_after_the_head_and_their_layers has several buckets)
    # (the bucket's start and the backward's end are the same sum in another order: equal within
    # floating-point rounding)
    assert len(dp.sync) == 1 and overlap_fraction(dp.sync) == pytest.approx(0.0, abs=1e-9)
    # only what runs past the backward is exposed
    assert dp.parts["gradient_sync"] <= dp.sync_total_ns - dp.sync_overlapped_ns + 1e-6
    # the backward starts with the head and loss: a bucket is ready only after them and its layers,
    # so the last one (the last layers, embedding and head) starts when the whole backward is done
    backward_end = dp.parts["forward"] + dp.parts["backward"]
    assert dp.sync[-1].start_ns >= backward_end - 1e-6
    assert dp.sync[0].start_ns >= backward_end - dp.parts["backward"] / dp.plan.micro_batches \
        + dp.head.device_ns - 1e-6


def test_zero1_reduce_scatters_shards_the_optimizer_and_all_gathers(steps: dict[str, StepTiming]) -> None:
    dp, z = steps["dp"], steps["zero1"]
    ops = [s.operation for s in z.sync]
    assert ops[-1] == "AllGather" and set(ops[:-1]) == {"ReduceScatter"}
    assert z.optimizer.device_ns < dp.optimizer.device_ns / 4  # 1/16 of the parameters each
    # bf16 auto-cast: FP32 gradients are reduce-scattered, the updated bf16 parameters gathered
    gather, scatter = z.sync[-1], z.sync[0]
    assert z.plan.precision == "bf16-autocast"
    params = -(-z.model.params() // z.plan.tp)
    assert gather.bytes == pytest.approx(2 * params, rel=0.01)
    assert sum(s.bytes for s in z.sync[:-1]) == pytest.approx(4 * params, rel=0.01)
    assert scatter.bytes > 0


def test_pipeline_bubble_follows_1f1b(steps: dict[str, StepTiming]) -> None:
    pp = steps["pp"]
    m, p = pp.plan.micro_batches, pp.plan.pp
    slot = (pp.parts["forward"] + pp.parts["backward"]) / m
    assert pp.p2p_ns > 0
    assert pp.parts["pipeline"] == pytest.approx((p - 1) * (slot + 2 * pp.p2p_ns) + m * 2 * pp.p2p_ns)


def test_efa_bandwidth_sets_the_cost_of_gradient_sync_across_nodes(steps: dict[str, StepTiming]) -> None:
    one, two, fast = steps["dp"], steps["efa"], steps["efa_trn1n"]
    assert two.sync_total_ns > one.sync_total_ns  # 32 ranks over EFA vs 16 over NeuronLink
    assert fast.sync_total_ns < two.sync_total_ns  # trn1n: 1,600 Gbps


def test_programs_built_from_the_same_shapes_are_compiled_once(steps: dict[str, StepTiming]) -> None:
    """Two nodes instead of one change the DP group, not a rank's programs: the second step reuses
    all four (compiled by the first) and re-times only the collectives on its own topology."""
    one, two = steps["dp"], steps["efa"]
    assert one.programs_reused == 0 and two.programs_reused == 4
    assert all(p.compile_s == 0.0 for p in two.programs)
    assert two.forward_layer.device_ns == one.forward_layer.device_ns
    assert two.backward_layer.device_ns == one.backward_layer.device_ns
    assert steps["zero1"].programs_reused == 3  # its optimizer updates 1/dp of the parameters


@pytest.mark.parametrize("opts, message", [
    (dict(tp=2, dp=4), "= 8 ranks, but trn1.32xlarge has 32"),
    (dict(tp=3), "does not divide"),
    (dict(tp=2, global_batch=20), "not a multiple"),
    (dict(pp=4, tp=2), "pp 4 does not divide 2 layers"),
    (dict(precision="fp8"), "precision must be"),
])
def test_bad_layouts_are_one_line(opts: dict, message: str) -> None:
    model, plan = get_train("llama-train").configure(None, seq=128, **opts)
    with pytest.raises(PlanError, match=message):
        time_training_step(model, plan)


def test_options_are_checked() -> None:
    with pytest.raises(PlanError, match="no option"):
        get_train("llama-train").configure(None, tensor_parallel=2)
    with pytest.raises(PlanError, match="expects int"):
        get_train("llama-train").configure(None, tp="2")
    with pytest.raises(PlanError, match="no preset"):
        get_train("bert-pretrain").configure("bert-huge")
    with pytest.raises(PlanError, match="unknown training workload"):
        get_train("resnet-train")


def test_workloads_have_the_published_presets() -> None:
    assert set(TRAIN_WORKLOADS) == {"llama-train", "bert-pretrain", "gpt-train", "vit-finetune"}
    assert set(TRAIN_WORKLOADS["llama-train"].presets) == {
        "llama2-7b", "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b"}
    # parameter counts of the published models (Hugging Face configs)
    assert TRAIN_WORKLOADS["llama-train"].presets["llama2-7b"].params() == pytest.approx(6.74e9, rel=0.01)
    assert TRAIN_WORKLOADS["llama-train"].presets["llama3.1-70b"].params() == pytest.approx(70.6e9, rel=0.01)
    assert TRAIN_WORKLOADS["bert-pretrain"].presets["bert-large"].params() == pytest.approx(335e6, rel=0.03)
    assert TRAIN_WORKLOADS["gpt-train"].presets["gpt3-6.7b"].params() == pytest.approx(6.7e9, rel=0.03)


def test_buckets_start_after_the_head_and_their_layers() -> None:
    """The backward runs the head and loss first, then the layers last to first: a bucket is ready
    when its layers are done, the last (with the embedding and head) when the backward is done."""
    topo = instance_topology("trn1.32xlarge")
    buckets = _grad_buckets(DDP_BUCKET_BYTES, 4, 2**20)
    start, head, layer = 1e6, 5e6, 10e6
    end = start + head + 4 * layer
    sync = _sync_schedule(topo, [list(range(32))], "AllReduce", buckets, "fp32", 4, layer, end, start,
                          head)
    assert [s.start_ns for s in sync[:4]] == [start + head + k * layer for k in (1, 2, 3, 4)]
    assert sync[-1].start_ns >= end
    assert 0 < overlap_fraction(sync) < 1


def test_buckets_cover_every_gradient_once() -> None:
    buckets = _grad_buckets(10 * 2**20, 8, 3 * 2**20)
    assert sum(b for b, _ in buckets) == 83 * 2**20
    assert all(b == DDP_BUCKET_BYTES for b, _ in buckets[:-1])
    assert [d for _, d in buckets] == sorted(d for _, d in buckets) and buckets[-1][1] == 8


def test_training_figures_definition() -> None:
    fig = training_step_figures(2e9, 1024, 4096, 1e18, 512, 91.75e12)
    assert fig.step_s == 2.0 and fig.seq_per_s == 512.0 and fig.tokens_per_s == 512.0 * 4096
    assert fig.mfu == pytest.approx(1e18 / (2.0 * 512 * 91.75e12))
    assert training_step_figures(1e9, 8, 128, 1e12, 1, None).mfu is None


def test_plan_key_is_the_benchmark_key() -> None:
    assert ParallelPlan(tp=8, dp=64, nodes=16, seq=4096, global_batch=1024).key("llama2-7b") == \
        "llama2-7b/16xtrn1.32xlarge/tp8pp1dp64/seq4096/gbs1024"


@pytest.mark.parametrize("grad_dtype", ["fp32", "bf16"])
def test_gradient_accumulation_follows_each_gradient_and_equals_a_tail_sum(grad_dtype: str) -> None:
    """The layer backward accumulates each weight gradient where it is produced, before the next
    matmul (a scheduler places the add as soon as its operands exist), not as a tail after the
    whole backward; a cast only when the buffer's type differs from the gradient's; and the accumulated
    values equal the buffers plus the gradients the backward computes without accumulation."""
    import numpy as np

    from neuroncore.ir.builder import GraphBuilder
    from neuroncore.ir.reference import run_reference
    from neuroncore.workloads.train_graphs import Saved, backward_ops

    model = SMALL["bert-pretrain"]
    r = RankShapes.of(model, 1, 128, 1)
    bwd = layer_backward(model, r, 1, "bf16", grad_dtype)
    adds = [op for op in bwd.outputs[1:]]
    assert adds and all(op.opcode == "add" and op.layer.endswith("grad_accumulation") for op in adds)
    converts = [op for op in bwd.ops if op.opcode == "convert" and op.layer.endswith("grad_accumulation")]
    assert len(converts) == (len(adds) if grad_dtype == "fp32" else 0)
    for add in adds:
        acc, g = add.operands
        if g.opcode == "convert":
            g = g.operands[0]
        between = bwd.ops[g.index + 1:add.index]
        assert "dot" not in {op.opcode for op in between}, add.name  # before the next matmul

    # the same backward without accumulation: the raw gradients, in the same order
    b = GraphBuilder(f"{model.name}_layer_bwd", root_layer="layers.0")  # same weights
    inputs = {p.name: p for p in bwd.parameters}
    def param(name: str):
        return b.parameter(name, inputs[name].shape, "bf16")

    saved = Saved(*[param(name) for name in ("hidden_states", "q", "k", "v", "attn_out", "lse", "residual")],
                  (param("input_layernorm_out"), param("post_attention_layernorm_out")),
                  (param("fc1_out"), param("fc1_act")))
    dy = b.parameter("grad_output", inputs["grad_output"].shape, "bf16")
    dx, grads = backward_ops(b, model, r, 1, "bf16", saved, dy)
    raw = b.build([dx, *grads])
    rng = np.random.default_rng(0)
    values = {p.name: rng.standard_normal(p.shape).astype(np.float32) * 0.5 for p in bwd.parameters}
    values["lse"] = np.abs(values["lse"]) + 2.0
    got = run_reference(bwd, values)
    want = run_reference(raw, {p.name: values[p.name] for p in raw.parameters})
    assert len(got) == len(want)
    np.testing.assert_array_equal(got[0], want[0])
    for add, out, grad in zip(adds, got[1:], want[1:]):
        acc = values[add.operands[0].name]
        expected = run_reference(_sum_graph(acc.shape, grad_dtype), [acc, grad.astype(np.float32)])[0]
        np.testing.assert_array_equal(out, expected, err_msg=add.name)


def _sum_graph(shape: tuple[int, ...], dtype: str):
    """acc + g in the buffer's type (g rounded to bf16 first, as the backward produced it)."""
    from neuroncore.ir.builder import GraphBuilder

    b = GraphBuilder("sum")
    acc = b.parameter("acc", shape, dtype)
    g = b.parameter("g", shape, "bf16")
    return b.build([b.add(acc, g if dtype == "bf16" else b.convert(g, dtype))])


def test_layers_keep_what_autograd_keeps_without_checkpointing() -> None:
    """The forward keeps each linear's input (both norms' outputs; BERT's GELU output, which
    down_proj reads) and v and the attention context as the projections and the head merge produce
    them, token-major; the backward reads them instead of recomputing the norms and the GELU.
    SwiGLU's product is still recomputed (NxD's selective checkpointing)."""
    bert, llama = SMALL["bert-pretrain"], LLAMA
    for model in (bert, llama):
        r = RankShapes.of(model, 2, 128, 1)
        fwd, bwd = layer_forward(model, r, 1), layer_backward(model, r, 1)
        kept = {op.name: op for op in bwd.parameters}
        for norm in ("input_layernorm_out", "post_attention_layernorm_out"):
            assert kept[norm].shape == (256, model.hidden)
        assert kept["v"].shape == (256, model.kv_heads * model.head_dim)
        assert kept["attn_out"].shape == (256, model.hidden)
        buffers = sum(p.name.startswith("grad_acc") for p in bwd.parameters)
        assert len(fwd.outputs) == len(bwd.parameters) - 1 - buffers  # every kept value, plus the output
        opcodes = {op.opcode for op in bwd.ops}
        assert not opcodes & {"layer_norm", "rms_norm"}, model.name  # norms are not recomputed
    bert_ops = {op.opcode for op in layer_backward(bert, RankShapes.of(bert, 2, 128, 1), 1).ops}
    assert "gelu" not in bert_ops and "gelu_dx" in bert_ops
    llama_ops = {op.opcode for op in layer_backward(llama, RankShapes.of(llama, 2, 128, 1), 1).ops}
    assert "silu" in llama_ops  # the SwiGLU product recomputed
