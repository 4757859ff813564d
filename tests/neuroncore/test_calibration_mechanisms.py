"""The mechanisms the calibration against published numbers added to the cost model (issue 15 §4).

Each is what the real compiler or runtime does, from a public fact (docs/execution-core.md, cost
model): weights prefetched across layers, collective latency paid per hop, the runtime's
per-execution overhead and the host copies of a request.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import neuroncore as nc
from neuroncore import collectives as cc
from neuroncore.compiler.memory import RangeAllocator
from neuroncore.compiler.program import RES_DMA
from neuroncore.hardware import NC_V2
from neuroncore.runtime import device
from neuroncore.runtime.host_io import EXECUTION_OVERHEAD_NS, host_copy_ns, request_latency_ns
from neuroncore.topology import instance_topology

GIB = 2**30
L_NS = 1_500.0  # intra-node hop latency (neuroncore.md §6: 1-2 us)
INF2_LINK = 96 * GIB  # bytes/s per link direction (§1.4)


def test_large_block_reuses_the_range_freed_longest_ago():
    big = 1 << 17  # >= capacity / 16: a large block
    alloc = RangeAllocator(2 * big)  # room for exactly two
    top, _ = alloc.allocate(big)
    below, _ = alloc.allocate(big)
    assert top > below
    alloc.release(top, big, [9])  # the top range was last read by a recent node
    alloc.release(below, big, [5])  # this one by an older one
    at, hazards = alloc.allocate(big)
    assert (at, hazards) == (below, [5])


def _linear_chain(layers: int, width: int) -> nc.Graph:
    """A decode-shaped chain of bf16 linears (one token, weights of 2 MiB: large SBUF blocks)."""
    b = nc.GraphBuilder("chain")
    x = b.parameter("x", (1, width), "bf16")
    for i in range(layers):
        with b.scope(f"layers.{i}"):
            x = b.matmul(x, b.weight("weight", (width, width), "bf16"))
    return b.build([x])


def test_weight_loads_run_ahead_of_the_compute():
    program = nc.compile(_linear_chain(4, 1024), "trn1")
    timeline = nc.Instance("trn1.2xlarge").core(0).load(program).execute(timing_only=True).timeline
    weights = [i for i in np.flatnonzero(program.resource == RES_DMA)
               if program.dma_bytes[i] == 1024 * 1024 * 2]
    assert len(weights) == 4
    # each load starts when the one before it ends (the queue streams them back to back), not after
    # the matmul that reads the previous weight: the loads are prefetched
    for before, after in itertools.pairwise(weights):
        assert timeline.start_ns[after] <= timeline.end_ns[before] + 1.0
    # so the chain takes about its weight bytes at the DMA ceiling, not loads and matmuls in series
    total = timeline.finish_ns - timeline.begin_ns
    assert total < 1.3 * 4 * 1024 * 1024 * 2 / NC_V2.dma_bytes_per_s * 1e9


def test_mesh_flow_pays_one_hop_latency_per_link():
    inf2 = instance_topology("inf2.48xlarge")
    size = 64 * 1024
    one = cc.permute(inf2, [(0, 2)], size // 4, "fp32")  # device 0 -> 1: one link
    three = cc.permute(inf2, [(0, 6)], size // 4, "fp32")  # device 0 -> 3 round the ring: three
    assert one.duration_ns == pytest.approx(L_NS + size / INF2_LINK * 1e9)
    assert three.duration_ns == pytest.approx(3 * L_NS + size / INF2_LINK * 1e9)


def test_request_latency_adds_launch_and_host_copies():
    assert device.LAUNCH_GAP_NS == EXECUTION_OVERHEAD_NS
    assert host_copy_ns(NC_V2, 0) == 0.0
    copy = host_copy_ns(NC_V2, 17_000)
    assert copy == pytest.approx(NC_V2.dma_fixed_latency_ns + 1_000.0)  # 17 B/ns, one engine
    latency = request_latency_ns(NC_V2, 100_000.0, 17_000, 0)
    assert latency == pytest.approx(EXECUTION_OVERHEAD_NS + copy + 100_000.0)


def test_back_to_back_executions_leave_the_runtime_gap():
    program = nc.compile(_linear_chain(1, 256), "trn1")
    model = nc.Instance("trn1.2xlarge").core(0).load(program)
    first = model.execute(timing_only=True)
    second = model.execute(timing_only=True)
    assert second.start_ns - first.end_ns == device.LAUNCH_GAP_NS
