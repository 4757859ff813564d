"""How the timing model serves DMA queues (neuroncore.md §5.1: FIFO within one queue on one engine,
round-robin across queues). A queue is fed by one triggering engine, whose instruction stream runs in
order, so a queue's transfers arrive in program order and FIFO in program order is what the hardware
does; across queues nothing is served in program order: a transfer that is ready early runs before one
the compiler emitted earlier but that is ready later."""

from __future__ import annotations

import numpy as np

import neuroncore as nc
from neuroncore import workloads
from neuroncore.compiler.program import RES_DMA
from neuroncore.runtime.scheduler import schedule


def _dma_nodes(program: nc.Program) -> np.ndarray:
    return np.flatnonzero(program.resource == RES_DMA)


def test_each_queue_is_fed_by_one_engine_in_program_order():
    graph = workloads.get("bert-layer").graph(None)
    program = nc.compile(graph, "trn1")
    dma = _dma_nodes(program)
    for q in np.unique(program.queue[dma]):
        on_q = dma[program.queue[dma] == q]
        triggers = program.trigger[on_q]
        engines = set(program.engine[triggers].tolist())
        assert engines == {int(program.queues[q].trigger_engine)}, program.queues[q].name
        # triggers run in their engine's order, so transfers enter the queue in program order
        assert np.all(np.diff(triggers) > 0)


def test_a_ready_transfer_is_not_held_behind_an_earlier_one_of_another_queue():
    g = nc.GraphBuilder()
    x = g.parameter("x", (128, 2048), "fp32")
    y = g.parameter("y", (128, 2048), "fp32")
    a = x
    for _ in range(6):  # a's output store is ready only after this chain
        a = g.exp(g.multiply(a, 0.5))
    program = nc.compile(g.build([a, g.multiply(y, 2.0)]), "trn1")
    dma = _dma_nodes(program)
    names = [program.operands[i] for i in dma]
    store_a = dma[next(k for k, t in enumerate(names) if "-> hbm:output0." in t)]
    load_y = dma[next(k for k, t in enumerate(names) if "hbm:input1.y" in t)]
    assert store_a < load_y  # emitted first
    assert program.queue[store_a] != program.queue[load_y]
    timeline = schedule(program)
    # y's load is ready long before the chain ends: it runs first, on engines a's store has not taken
    assert timeline.end_ns[load_y] < timeline.start_ns[store_a]
