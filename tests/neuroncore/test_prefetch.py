"""Weight prefetch one layer ahead (``CompilerOptions(prefetch_weights=True)``, compiler/prefetch.py):
a real scheduling change -- the weight loads' triggers move up the Sync stream into the layer before
-- that keeps every dependency, the numerics and the weight queue's order, and shortens a decode
step whose weight loads queued behind the previous layer's activation traffic."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.options import CompilerOptions, OptionsError
from neuroncore.compiler.prefetch import layer_block
from neuroncore.compiler.program import RES_DMA
from neuroncore.enums import Engine
from neuroncore.workloads import get, random_inputs

PREFETCH = CompilerOptions(prefetch_weights=True)
SMALL = dict(layers=2, hidden=256, heads=4, kv_heads=4, intermediate=512, vocab=512)


def test_layer_blocks() -> None:
    assert layer_block("model/layers.3/mlp/down_proj") == "model/layers.3"
    assert layer_block("encoder/layer.0/attention/self") == "encoder/layer.0"
    assert layer_block("transformer/h_2/attn") == "transformer/h_2"
    assert layer_block("model/fc1") == "model/fc1" and layer_block("model/norm/x") == "model/norm"
    assert layer_block("") == ""


def test_the_option_is_checked() -> None:
    with pytest.raises(OptionsError, match="prefetch_weights must be True or False"):
        CompilerOptions(prefetch_weights="yes")  # type: ignore[arg-type]
    assert not PREFETCH.is_default and PREFETCH.precision_is_default


@pytest.fixture(scope="module", params=["trn1", "trn2"])
def pair(request: pytest.FixtureRequest):
    graph = get("llama-decode").graph()
    return request.param, graph, nc.compile(graph, request.param), nc.compile(graph, request.param, PREFETCH)


def weight_transfers(program: nc.Program) -> np.ndarray:
    (queue,) = [q.index for q in program.queues if q.name == "qSyncWeight0"]
    return np.flatnonzero((program.resource == RES_DMA) & (program.queue == queue))


def test_only_weight_load_triggers_move_and_the_queue_keeps_its_order(pair) -> None:
    _, _, base, pre = pair
    assert pre.n_nodes == base.n_nodes
    assert sorted(base.opcodes[i] for i in base.opcode_id) == sorted(pre.opcodes[i] for i in pre.opcode_id)
    wb, wp = weight_transfers(base), weight_transfers(pre)
    # the weight queue's transfers in the same order, each with the same trigger text
    texts = [base.operands[i].split(" ", 1)[-1] for i in wb]
    assert [pre.operands[i].split(" ", 1)[-1] for i in wp] == texts
    # their triggers sit earlier in the Sync stream than they did, some of them
    sync_b = base.pc[base.trigger[wb]]
    sync_p = pre.pc[pre.trigger[wp]]
    assert (sync_p <= sync_b).all() and (sync_p < sync_b).sum() >= 4
    assert all(pre.engine[pre.trigger[wp]] == int(Engine.SYNC))
    # a trigger moves to the layer before its own at the earliest: the first layer's never move
    blocks = list(dict.fromkeys(layer_block(base.graph.ops[op].layer) for op in base.op_index if op >= 0))
    of = np.asarray([blocks.index(layer_block(base.graph.ops[base.op_index[t]].layer)) for t in wb])
    # the other nodes keep their order, so count them: a trigger has at least as many before it as
    # the first node of the layer before its own had in the program as emitted
    others = np.ones(base.n_nodes, bool)
    others[base.trigger[wb]] = False
    first_rank: dict[int, int] = {}
    for rank, i in enumerate(np.flatnonzero(others)):
        if base.op_index[i] >= 0:
            first_rank.setdefault(blocks.index(layer_block(base.graph.ops[base.op_index[i]].layer)), rank)
    moved_others = np.ones(pre.n_nodes, bool)
    moved_others[pre.trigger[wp]] = False
    before = np.cumsum(moved_others) - moved_others  # other nodes before each position
    for trigger, block in zip(pre.trigger[wp], of, strict=True):
        assert before[trigger] >= first_rank[max(block - 1, 0)]


def test_dependencies_are_kept_and_the_step_is_faster(pair) -> None:
    target, _, base, pre = pair
    instance = {"trn1": "trn1.2xlarge", "trn2": "trn2.48xlarge"}[target]
    tb = nc.Instance(instance).core(0).load(base).execute(timing_only=True)
    tp = nc.Instance(instance).core(0).load(pre).execute(timing_only=True)
    tl = tp.timeline
    for i in range(pre.n_nodes):  # every node starts after what it waits for, in its new order
        deps = pre.deps(i)
        assert (deps < i).all()
        if deps.size:
            assert tl.start_ns[i] >= tl.end_ns[deps].max() - 1e-6
    wb, wp = weight_transfers(base), weight_transfers(pre)
    assert tl.start_ns[wp].mean() - tl.begin_ns < tb.timeline.start_ns[wb].mean() - tb.timeline.begin_ns
    assert tp.device_time_ns <= tb.device_time_ns
    if target == "trn1":  # a measured difference, not a relabel
        assert tp.device_time_ns < 0.97 * tb.device_time_ns
    # (on trn2 the default program already gains it: activation loads are triggered from GpSimd,
    # so the weight triggers no longer queue behind them on Sync; docs/execution-core.md)


def test_numerics_are_unchanged() -> None:
    graph = get("llama-decode").graph(**SMALL)
    inputs = random_inputs(graph, seed=3)
    core = nc.Instance("trn1.2xlarge").core(0)
    outputs = [core.load(nc.compile(graph, "trn1", options)).execute(inputs).outputs
               for options in (None, PREFETCH)]
    assert all(np.array_equal(a, b) for a, b in zip(*outputs, strict=True))
