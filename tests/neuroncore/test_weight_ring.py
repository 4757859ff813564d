"""The weight ring and the second trigger stream (issue 15 §4, docs/execution-core.md "What the
calibration against published numbers added"): with a ring (``context.WEIGHT_STREAM_FRACTION``,
half of SBUF to start with, less once activations need the room) weights loaded whole go round the
top of SBUF in load order, so a load waits only for matmuls a ring's length back; activation loads
are triggered from GpSimd (always), so a weight load waiting for its range never holds them up (or
they it)."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler import context
from neuroncore.compiler.memory import RangeAllocator
from neuroncore.compiler.program import RES_DMA, RES_TENSOR_LS, RES_TENSOR_MM
from neuroncore.enums import Engine
from neuroncore.hardware import NC_V2, with_overrides
from tests.fixtures.placement import run_placements

WIDTH = 1024  # each weight 16 KiB per partition: a quarter of the small core's SBUF
SPEC = with_overrides(NC_V2, sbuf_bytes_per_partition=64 * 1024)

KB = 1024


def test_stream_blocks_go_round_the_ring_in_load_order():
    alloc = RangeAllocator(64 * KB, stream_fraction=0.5)
    assert alloc.stream_lo == 32 * KB
    a, _ = alloc.allocate(8 * KB, stream=True)
    b, _ = alloc.allocate(8 * KB, stream=True)
    assert (a, b) == (32 * KB, 40 * KB)
    alloc.release(a, 8 * KB, [7])  # freed a moment ago: the ring does not hand it out next
    c, hazards = alloc.allocate(8 * KB, stream=True)
    assert (c, hazards) == (48 * KB, [])
    d, _ = alloc.allocate(8 * KB, stream=True)
    assert d == 56 * KB
    e, hazards = alloc.allocate(8 * KB, stream=True)  # wraps to the oldest block's place
    assert (e, hazards) == (a, [7])


def test_other_buffers_use_the_ring_only_when_the_rest_is_full():
    alloc = RangeAllocator(64 * KB, stream_fraction=0.5)
    small = [alloc.allocate(2 * KB)[0] for _ in range(16)]
    assert all(at < alloc.stream_lo for at in small)
    spill_over, _ = alloc.allocate(2 * KB)  # the rest is full: nothing loses capacity
    assert spill_over >= 32 * KB
    big = RangeAllocator(64 * KB, stream_fraction=0.5)
    at, _ = big.allocate(16 * KB)  # a large non-stream block stays below the ring too
    assert at + 16 * KB <= big.stream_lo


def test_the_ring_ends_when_the_activations_need_its_room():
    """The ring is what the activations leave: the first buffer with no room below the ring ends
    it, and from then on weights and activations are placed as with no ring at all."""
    alloc = RangeAllocator(64 * KB, stream_fraction=0.5)
    fill = [alloc.allocate(4 * KB)[0] for _ in range(8)]  # the bottom half
    w1, _ = alloc.allocate(4 * KB, stream=True)
    assert w1 == 32 * KB and alloc.stream_lo == 32 * KB
    over, _ = alloc.allocate(8 * KB)  # no room below: the ring is given up
    assert over >= 32 * KB and alloc.stream_lo == alloc.capacity
    ringless = RangeAllocator(64 * KB)
    for at in [*fill, w1, over]:
        size = 8 * KB if at == over else 4 * KB
        carved = ringless._carve(at, size)[0]
        assert carved == at
    ringless.cursor = alloc.cursor
    for i in range(4):  # same state, same placement from now on, weight or not
        size = (3 + i) * KB
        assert alloc.allocate(size, stream=i % 2 == 0)[0] == ringless.allocate(size)[0]


def test_without_a_ring_placement_is_unchanged():
    sizes = [3 * KB, 20 * KB, 1 * KB, 5 * KB, 20 * KB]
    plain, ringless = RangeAllocator(96 * KB), RangeAllocator(96 * KB, stream_fraction=0.0)
    for i, size in enumerate(sizes):
        assert plain.allocate(size)[0] == ringless.allocate(size, stream=i % 2 == 0)[0]


def _layers(n: int, width: int = WIDTH, tokens: int = 128) -> nc.Graph:
    """Encoder-shaped layers: a biased linear, GELU, a residual add and a norm (activations churn
    through SBUF between the weight loads), fp32 activations with bf16 weights."""
    b = nc.GraphBuilder("stack")
    x = b.parameter("x", (tokens, width), "bf16")
    for i in range(n):
        with b.scope(f"layers.{i}"):
            h = b.matmul(x, b.weight("w1", (width, width), "bf16"))
            h = b.gelu(b.add(h, b.broadcast_to(b.weight("b1", (width,), "bf16"), (tokens, width))))
            h = b.matmul(h, b.weight("w2", (width, width), "bf16"))
            x = b.layer_norm(b.add(h, x), b.weight("g", (width,), "bf16"), b.weight("beta", (width,), "bf16"))
    return b.build([x])


@pytest.fixture(scope="module")
def compiled() -> tuple[nc.Graph, nc.Program, nc.Program]:
    graph = _layers(3)
    ring = nc.compile(graph, SPEC)  # the default: a ring of half of SBUF to start with
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(context, "WEIGHT_STREAM_FRACTION", 0.0)
        plain = nc.compile(graph, SPEC)
    return graph, ring, plain


def _whole_weight_triggers(program: nc.Program) -> list[int]:
    (queue,) = [q.index for q in program.queues if q.name == "qSyncWeight0"]
    return [int(program.trigger[i]) for i in np.flatnonzero((program.resource == RES_DMA)
                                                              & (program.queue == queue))
            if program.dma_bytes[i] == WIDTH * WIDTH * 2]


def _waits_on_activations(program: nc.Program, trigger: int) -> bool:
    deps = program.dep_idx[program.dep_ptr[trigger]:program.dep_ptr[trigger + 1]]
    return any(program.resource[d] not in (RES_TENSOR_LS, RES_TENSOR_MM, RES_DMA) for d in deps)


def test_activation_loads_are_triggered_from_gpsimd_and_weights_from_sync(compiled):
    _, _, default = compiled
    kinds = {q.name: Engine(q.trigger_engine) for q in default.queues}
    used = {default.queues[q].name for q in default.queue[default.resource == RES_DMA]}
    assert kinds["qSyncWeight0"] is Engine.SYNC
    assert kinds["qGpSimdSpillReload0"] is kinds["qGpSimdData0"] is Engine.GPSIMD
    assert "qSyncSpillReload0" not in used and "qSyncData0" not in used  # no load goes there


def test_whole_weights_wait_only_for_matmuls_in_the_ring(compiled):
    _, ring, plain = compiled
    triggers = _whole_weight_triggers(ring)
    assert len(triggers) == 6
    # the ring: a whole weight's load waits at most for the matmuls of the weight before it there
    assert not any(_waits_on_activations(ring, t) for t in triggers)
    # without it the loads land where activations just were, and wait for them
    assert any(_waits_on_activations(plain, t) for t in _whole_weight_triggers(plain))


def test_same_numerics_and_no_slower(compiled, assert_close):
    graph, ring, plain = compiled
    inputs = [np.random.default_rng(0).standard_normal((128, WIDTH)).astype(np.float32)]
    ringed = run_placements(ring, plain, inputs)  # the same values: only where weights sit changed
    assert_close(ringed.out, nc.run_reference(graph, inputs)[0], "bf16")
    assert ringed.time_a_ns <= ringed.time_b_ns


def test_activation_peak_counts_live_values_once_and_skips_weights_views_and_hbm_values():
    from neuroncore.compiler.weight_ring import activation_peak_bytes

    b = nc.GraphBuilder("peak")
    x = b.parameter("x", (256, 64), "fp32")  # 2 row tiles x 64 x 4 B = 512 B per partition
    w = b.weight("w", (64, 64), "fp32")  # a weight: never an activation
    h = b.matmul(x, w)  # 512 B, live with x until the add
    y = b.add(h, x)  # x and h die here; y lives to the end
    big = b.parameter("big", (128, 4096), "fp32")  # 16 KiB: over the budget below, lives in HBM
    z = b.add(b.reshape(y, (256, 64)), b.reshape(y, (256, 64)))  # views count nothing
    graph = b.build([z, big])
    assert activation_peak_bytes(graph, hbm_home_bytes=8 * KB) == 3 * 512  # x, h and y at the add
    # y lives through its views to their reader z: y, big and z at once
    assert activation_peak_bytes(graph, hbm_home_bytes=16 * KB) == 2 * 512 + 16 * KB


def test_activation_peak_skips_weight_casts_hoisted_to_the_top():
    """The auto-cast path casts a weight to BF16 with a ``convert`` of the constant, and a traced
    CNN puts every such cast at the top of the graph (ResNet-50's 53 casts live from there to their
    convolutions: 475 KB per partition counted as activations, the program's whole "peak"). The
    cast is folded at compile time and streamed like the weight: it counts nothing."""
    from neuroncore.compiler.weight_ring import activation_peak_bytes

    b = nc.GraphBuilder("casts")
    x = b.parameter("x", (128, 64), "fp32")  # 256 B per partition
    casts = [b.convert(b.weight(f"w{i}", (64, 512), "fp32"), "bf16") for i in range(16)]  # 1 KB each
    h = x
    for cast in casts:  # each matmul's product is 2 KB per partition, sliced back to 64 columns
        h = b.slice(b.matmul(b.convert(h, "bf16"), cast), (0, 0), (128, 64))
    graph = b.build([h])
    assert [op.opcode for op in graph.ops[:3]] == ["parameter", "constant", "convert"]
    assert activation_peak_bytes(graph, hbm_home_bytes=64 * KB) < 4 * KB  # before: over 16 KB


def test_a_program_whose_activations_need_the_ring_has_none(compiled):
    """Decided from the graph before lowering: activations over half of SBUF at once (here six
    8 KiB branches of a 512-token input live together on the small core) compile exactly as with
    no ring at all."""
    b = nc.GraphBuilder("wide")
    x = b.parameter("x", (512, WIDTH), "bf16")
    branches = [b.matmul(x, b.weight(f"w{i}", (WIDTH, WIDTH), "bf16")) for i in range(6)]
    total = branches[0]
    for branch in branches[1:]:
        total = b.add(total, branch)
    graph = b.build([total])
    default = nc.compile(graph, SPEC)
    assert default.stats["activation_peak_bytes"] > SPEC.sbuf_bytes_per_partition // 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(context, "WEIGHT_STREAM_FRACTION", 0.0)
        ringless = nc.compile(graph, SPEC)
    assert np.array_equal(default.dep_idx, ringless.dep_idx)
    assert [b.address for b in default.buffers.values()] == [b.address for b in ringless.buffers.values()]
    _, ring, _ = compiled
    assert ring.stats["activation_peak_bytes"] <= SPEC.sbuf_bytes_per_partition // 2
