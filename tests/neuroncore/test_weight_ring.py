"""The weight ring and the second trigger stream (issue 15 §4, docs/execution-core.md "What the
calibration against published numbers added"): with a ring (``context.WEIGHT_STREAM_FRACTION``,
off by default) weights loaded whole go round the top of SBUF in load order, so a load waits only
for matmuls a ring's length back; activation loads are triggered from GpSimd (always), so a weight
load waiting for its range never holds them up (or they it)."""

from __future__ import annotations

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler import context
from neuroncore.compiler.memory import RangeAllocator
from neuroncore.compiler.program import RES_DMA, RES_TENSOR_LS, RES_TENSOR_MM
from neuroncore.enums import Engine
from neuroncore.hardware import NC_V2, with_overrides

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
    assert spill_over >= alloc.stream_lo
    big = RangeAllocator(64 * KB, stream_fraction=0.5)
    at, _ = big.allocate(16 * KB)  # a large non-stream block stays below the ring too
    assert at + 16 * KB <= big.stream_lo


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
    plain = nc.compile(graph, SPEC)  # the default: no ring
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(context, "WEIGHT_STREAM_FRACTION", 0.5)
        ring = nc.compile(graph, SPEC)
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
    out_ring = nc.Instance("inf2.xlarge").core(0).load(ring).execute(inputs).outputs[0]
    out_plain = nc.Instance("inf2.xlarge").core(0).load(plain).execute(inputs).outputs[0]
    np.testing.assert_array_equal(out_ring, out_plain)  # only where weights sit changed
    assert_close(out_ring, nc.run_reference(graph, inputs)[0], "bf16")
    t_ring = nc.Instance("inf2.xlarge").core(0).load(ring).execute(timing_only=True).device_time_ns
    t_plain = nc.Instance("inf2.xlarge").core(0).load(plain).execute(timing_only=True).device_time_ns
    assert t_ring <= t_plain
