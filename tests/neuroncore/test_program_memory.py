"""What a relocated layer costs in memory (docs/execution-core.md "Program memory").

A relocated layer is its template's nodes with ids shifted (compiler.layer_replay): its node
records and operand strings are made only when read, its waits are the program's own columns. What
is left per relocated node is the program's NumPy columns and its share of the relocated buffers.
The bounds below are measured, not derived (Python 3.11, session 12): a relocated node retained
~112 bytes and peaked at ~254 while the program was made, at assembly; a timing-only execution
holds ~49 bytes per node (start, end and wait times, DMA packets). Before session 12 ~181 / ~402
and ~90 (the twelve counters as 4-byte columns, the three instruction-kind texts as lists, int64
temporaries per node at assembly, the per-instruction record columns written by every execution);
~268 / ~370 before session 10 (each relocated layer's ``Buffer`` records made when relocating, not
when the table is read: ``program.RelocatedBuffers``), ~440 / ~490 before session 9 (per-dependency
copies of the waits, buffers with a ``__dict__``, lists of Python ints while building, int64
dependency and counter columns), and making every node record eagerly adds ~310 more."""

from __future__ import annotations

import gc
import tracemalloc

from neuroncore import workloads
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.program import Program
from neuroncore.runtime.scheduler import schedule

RETAINED_BYTES_PER_RELOCATED_NODE = 140
PEAK_BYTES_PER_RELOCATED_NODE = 300
EXECUTION_BYTES_PER_NODE = 70


def _traced(layers: int, *, read_records: bool = False) -> tuple[Program, int, int]:
    """A 128-token prefill of ``layers`` small layers, with the bytes its compile left allocated
    and the most it had allocated at once (tracemalloc); ``read_records``: every node record read
    (made) before measuring, as an eager build would have made them."""
    graph = workloads.get("llama-prefill").graph(None, layers=layers, context=128)
    gc.collect()
    tracemalloc.start()
    try:
        program = compile_graph(graph, "trn1")
        if read_records:
            list(program.semantics)
        gc.collect()
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return program, retained, peak


def test_a_relocated_node_costs_its_columns_not_copies_of_its_template() -> None:
    compile_graph(workloads.get("llama-prefill").graph(None, layers=8, context=128), "trn1")  # warm caches
    short, short_retained, short_peak = _traced(8)
    long, long_retained, long_peak = _traced(16)
    # the eight layers the longer prompt adds are all relocated
    assert long.stats["layers_relocated"] - short.stats["layers_relocated"] == 8
    added = long.n_nodes - short.n_nodes
    assert added > 5000
    retained = (long_retained - short_retained) / added
    peak = (long_peak - short_peak) / added
    assert retained < RETAINED_BYTES_PER_RELOCATED_NODE, f"{retained:.0f} bytes retained per relocated node"
    assert peak < PEAK_BYTES_PER_RELOCATED_NODE, f"{peak:.0f} bytes at peak per relocated node"
    # the measure catches per-node copies: relocated layers' records made eagerly exceed it
    eager = (_traced(16, read_records=True)[1] - _traced(8, read_records=True)[1]) / added
    assert eager > RETAINED_BYTES_PER_RELOCATED_NODE + 150, f"{eager:.0f}"


def test_a_timing_only_execution_holds_its_times_not_its_records() -> None:
    """A timing-only execution holds each node's start, end and wait and the DMA packets; the
    per-instruction and per-semaphore record columns are made only when a profile reads them."""
    program = _traced(16)[0]
    schedule(program)  # the timing loop compiled, the program's record layout made
    gc.collect()
    tracemalloc.start()
    try:
        timeline = schedule(program)
        held = tracemalloc.get_traced_memory()[0] / program.n_nodes
    finally:
        tracemalloc.stop()
    assert held < EXECUTION_BYTES_PER_NODE, f"{held:.0f} bytes per node"
    # read, the record columns are what the timing gives (ns rounded half up)
    instr = timeline.layout.instr_nodes
    assert timeline.i_start.tolist() == [int(t + 0.5) for t in timeline.start_ns[instr].tolist()]
    assert timeline.sem_ts.size == timeline.layout.producers.size
