"""The event sink: nothing is built without a listener; with one, every record arrives exactly once."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.program import RES_DMA
from neuroncore.events import EventBatch, EventSink
from neuroncore.hardware import NC_V2, with_overrides
from neuroncore.record_kinds import HbmUsageMeta, RecordKind, check_batch
from neuroncore.runtime import records
from neuroncore.workloads import get, random_inputs


def small_model() -> nc.Graph:
    b = nc.GraphBuilder("small")
    x = b.parameter("x", (64, 96), "bf16")
    with b.scope("proj"):
        h = b.gelu(b.matmul(x, b.weight("weight", (96, 160), "bf16")))
    with b.scope("head"):
        y = b.add(b.matmul(h, b.weight("weight", (160, 48), "bf16")), 1.0)
    return b.build([y])


def collect(sink: EventSink) -> tuple[list[EventBatch], object]:
    batches: list[EventBatch] = []
    return batches, sink.subscribe(batches.append)


def of_kind(batches: list[EventBatch], kind: str) -> list[EventBatch]:
    return [b for b in batches if b.kind == kind]


def column(batches: list[EventBatch], kind: str, name: str) -> np.ndarray:
    parts = [np.asarray(b.columns[name]) for b in of_kind(batches, kind)]
    return np.concatenate(parts) if parts else np.array([])


def observed_run(program: nc.Program, instance: str, *, inputs=None, timing_only=True):
    sink = EventSink()
    batches, unsubscribe = collect(sink)
    result = nc.Instance(instance, sink=sink).core(0).load(program).execute(
        inputs, timing_only=timing_only)
    unsubscribe()
    return batches, result


# (workload, options, target): small defaults plus shapes that reuse buffers heavily
CASES = [
    ("bert-layer", {}, "trn1"),
    ("bert-layer", {}, "trn2"),
    ("llama-decode", {}, "trn1"),
    ("mlp", dict(batch=256, d_model=1024, d_ff=4096, dtype="fp32"), "trn2"),
    ("matmul", dict(m=300, k=200, n=700, dtype="bf16"), "trn1"),
]
INSTANCES = {"trn1": "trn1.2xlarge", "trn2": "trn2.48xlarge"}


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[2]}")
def observed(request):
    workload, options, target = request.param
    program = nc.compile(get(workload).graph(**options), target)
    batches, result = observed_run(program, INSTANCES[target])
    return program, batches, result


# -- no listener -------------------------------------------------------------------------------------


def test_nothing_is_built_without_a_listener(monkeypatch):
    assert not nc.sink.active  # nobody listens to the process-wide sink by default

    def forbidden(*args, **kwargs):
        raise AssertionError("records built with no listener")

    monkeypatch.setattr(records, "emit_execution", forbidden)
    monkeypatch.setattr(records, "emit_program", forbidden)
    graph = small_model()
    program = nc.compile(graph, "trn1")
    for sink in (None, EventSink()):  # the process-wide sink and a private one
        model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
        assert model.execute(timing_only=True).device_time_ns > 0
        assert model.execute(random_inputs(graph)).outputs is not None


def test_emit_without_listeners_is_a_no_op():
    sink = EventSink()
    assert not sink.active
    # nobody to hand it to: not even checked against its declaration
    meta = HbmUsageMeta(execution_id=1, model_id=1, core=0)
    sink.emit(RecordKind.HBM_USAGE, {"timestamp": np.arange(3)}, meta)


# -- one execution, observed -------------------------------------------------------------------------


def test_batches_are_columnar(observed):
    _, batches, _ = observed
    assert batches
    for batch in batches:
        check_batch(batch)
        lengths = {name: len(col) for name, col in batch.columns.items()}
        assert len(set(lengths.values())) <= 1, (batch.kind, lengths)
        assert len(batch) == (next(iter(lengths.values())) if lengths else 0)


def test_every_instruction_arrives_exactly_once(observed):
    program, batches, result = observed
    ids = column(batches, "instruction", "id").astype(np.int64)
    expected = np.flatnonzero(program.resource != RES_DMA)
    assert ids.size == expected.size
    assert np.array_equal(np.sort(ids), expected)
    start = column(batches, "instruction", "start_ts")
    end = column(batches, "instruction", "end_ts")
    tl = result.timeline
    np.testing.assert_allclose(start, tl.start_ns[ids], atol=0.5 + 1e-6)
    np.testing.assert_allclose(end, tl.end_ns[ids], atol=0.5 + 1e-6)
    assert np.array_equal(column(batches, "instruction", "duration_ns"), end - start)
    assert np.array_equal(column(batches, "instruction", "engine"), program.engine[ids])
    assert np.array_equal(column(batches, "instruction", "opcode"), program.opcode_id[ids])
    assert int(column(batches, "instruction", "raw_flops").sum()) == int(program.raw_flops.sum())
    for batch in of_kind(batches, "instruction"):
        assert batch.meta.opcodes == program.opcodes
        assert batch.meta.execution_id == result.execution_id


def test_instructions_are_split_into_batches(monkeypatch):
    monkeypatch.setattr(records, "BATCH_ROWS", 50)
    program = nc.compile(get("bert-layer").graph(seq=64, hidden=128, heads=2, intermediate=256), "trn1")
    batches, _ = observed_run(program, "trn1.2xlarge")
    instr = of_kind(batches, "instruction")
    assert len(instr) == -(-program.n_instructions // 50) > 1
    chunked = ("instruction", "dma_packet", "semaphore_update")
    assert all(len(b) <= 50 for b in batches if b.kind in chunked)
    ids = column(batches, "instruction", "id")
    assert np.array_equal(np.sort(ids), np.flatnonzero(program.resource != RES_DMA))
    assert len(of_kind(batches, "dma_packet")) > 1
    packets = column(batches, "dma_packet", "transfer_id")
    assert packets.size == int(program.dma_engines.astype(np.int64).sum())


def test_dma_packets_per_transfer(observed):
    program, batches, result = observed
    transfer = column(batches, "dma_packet", "transfer_id").astype(np.int64)
    dma = np.flatnonzero(program.resource == RES_DMA)
    counts = np.bincount(transfer, minlength=program.n_nodes)
    assert np.array_equal(counts[dma], program.dma_engines[dma].astype(np.int64))
    assert counts[program.resource != RES_DMA].sum() == 0
    engine = column(batches, "dma_packet", "engine_idx")
    assert engine.min() >= 0 and engine.max() < program.spec.dma_engines
    assert np.array_equal(column(batches, "dma_packet", "queue_idx"), program.queue[transfer])
    start = column(batches, "dma_packet", "start_ts")
    end = column(batches, "dma_packet", "end_ts")
    assert np.all(end >= start)
    tl = result.timeline
    assert np.all(start >= np.floor(tl.start_ns[transfer]))
    assert np.all(end <= np.ceil(tl.end_ns[transfer]))


def test_dma_packet_bytes_add_up_to_the_transfer(observed):
    program, batches, _ = observed
    transfer = column(batches, "dma_packet", "transfer_id").astype(np.int64)
    nbytes = column(batches, "dma_packet", "transfer_bytes").astype(np.int64)
    per_transfer = np.bincount(transfer, weights=nbytes, minlength=program.n_nodes)
    dma = program.resource == RES_DMA
    assert np.array_equal(per_transfer[dma].astype(np.int64), program.dma_bytes[dma])


def test_dma_packet_bytes_with_uneven_shares():
    # 100 rows of 10 bytes over 16 engines: 1000 B does not split evenly
    b = nc.GraphBuilder("uneven")
    x = b.parameter("x", (100, 5), "bf16")
    program = nc.compile(b.build([b.exp(x)]), "trn1")
    batches, _ = observed_run(program, "trn1.2xlarge")
    dma = np.flatnonzero(program.resource == RES_DMA)
    assert np.any(program.dma_bytes[dma] % program.dma_engines[dma] != 0)
    transfer = column(batches, "dma_packet", "transfer_id").astype(np.int64)
    nbytes = column(batches, "dma_packet", "transfer_bytes").astype(np.int64)
    per_transfer = np.bincount(transfer, weights=nbytes, minlength=program.n_nodes)
    assert np.array_equal(per_transfer[dma].astype(np.int64), program.dma_bytes[dma])
    total = column(batches, "hbm_usage", "total_transfer_bytes")
    assert abs(int(total[-1]) - 2 * 1000) <= 1


def test_semaphore_updates(observed):
    program, batches, result = observed
    node = column(batches, "semaphore_update", "node").astype(np.int64)
    sem = column(batches, "semaphore_update", "semaphore")
    value = column(batches, "semaphore_update", "value")
    ts = column(batches, "semaphore_update", "timestamp")
    # one update per producer, carrying the producer's semaphore and value
    assert np.array_equal(np.sort(node), np.flatnonzero(program.sem_increment >= 0))
    assert np.array_equal(sem, program.sem_increment[node])
    assert np.array_equal(value, program.sem_value[node])
    assert np.array_equal(column(batches, "semaphore_update", "is_dma"),
                          program.resource[node] == RES_DMA)
    # timestamps are the producers' end times (whole ns)
    np.testing.assert_allclose(ts, result.timeline.end_ns[node], atol=0.5 + 1e-6)
    # in time, each semaphore only goes up: no count can pass a value before its producer ended
    for s in np.unique(sem):
        mine = sem == s
        order = np.lexsort((value[mine], ts[mine]))
        v = value[mine][order]
        assert np.all(np.diff(v) > 0), f"semaphore {s} values are not increasing in time"
    names = of_kind(batches, "semaphore_update")[0].meta.semaphore_names
    assert all(int(s) in names for s in np.unique(sem))


def test_semaphore_updates_with_buffer_reuse():
    # a tiny SBUF forces reuse of stationary buffers (write-after-read on LoadStationary sources)
    spec = with_overrides(NC_V2, sbuf_bytes_per_partition=16 * 1024)
    program = nc.compile(get("mlp").graph(batch=256, d_model=512, d_ff=1024), spec)
    batches, _ = observed_run(program, "trn1.2xlarge")
    sem = column(batches, "semaphore_update", "semaphore")
    value = column(batches, "semaphore_update", "value")
    ts = column(batches, "semaphore_update", "timestamp")
    for s in np.unique(sem):
        mine = sem == s
        v = value[mine][np.lexsort((value[mine], ts[mine]))]
        assert np.all(np.diff(v) > 0), f"semaphore {s} values are not increasing in time"


def test_hbm_usage_totals_the_dma_traffic(observed):
    program, batches, result = observed
    (hbm,) = of_kind(batches, "hbm_usage")
    ts = np.asarray(hbm.columns["timestamp"])
    throughput = np.asarray(hbm.columns["current_throughput"], np.float64)
    total = np.asarray(hbm.columns["total_transfer_bytes"])
    dma = program.resource == RES_DMA
    moved = int(program.hbm_read_bytes[dma].sum() + program.hbm_write_bytes[dma].sum())
    assert moved > 0
    assert abs(int(total[-1]) - moved) <= max(1, 1e-9 * moved)
    assert np.all(np.diff(ts) > 0) and np.all(np.diff(total) >= 0)
    assert np.all(throughput >= 0)
    assert ts[0] >= result.start_ns - 1 and ts[-1] <= result.end_ns
    # throughput x sampling period integrates to the same bytes
    width = np.diff(ts).mean() if ts.size > 1 else 1.0
    assert float(np.sum(throughput) * width * 1e-9) == pytest.approx(moved, rel=1e-3)


def test_program_loaded_carries_the_ops():
    graph = small_model()
    program = nc.compile(graph, "trn1")
    sink = EventSink()
    batches, unsubscribe = collect(sink)
    model = nc.Instance("trn1.2xlarge", sink=sink).core(1).load(program)
    unsubscribe()
    (loaded,) = batches
    assert loaded.kind == "program_loaded"
    cols = loaded.columns
    assert list(cols["hlo_name"]) == [op.name for op in graph.ops]
    assert list(cols["layer"]) == [op.layer for op in graph.ops]
    assert list(cols["opcode"]) == [op.opcode for op in graph.ops]
    assert "model/proj" in cols["layer"] and "model/head" in cols["layer"]
    dot = next(i for i, op in enumerate(graph.ops) if op.opcode == "dot")
    frames = cols["frames"][dot]
    assert frames and any(f[0].endswith("test_events.py") for f in frames)
    assert all(len(f) == 3 for f in frames)  # (file, line, function)
    meta = loaded.meta
    assert meta.model_id == model.model_id and meta.core == 1
    assert meta.model_name == "small"
    assert meta.n_instructions == program.n_instructions
    assert meta.n_dma_transfers == program.n_dma_transfers
    assert meta.opcodes == program.opcodes
    assert len(meta.operands) == program.n_nodes


def test_execution_start_and_end_bracket_the_records():
    graph = small_model()
    program = nc.compile(graph, "trn1")
    sink = EventSink()
    batches, unsubscribe = collect(sink)
    model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
    first = model.execute(random_inputs(graph))
    second = model.execute(timing_only=True)
    unsubscribe()
    kinds = [b.kind for b in batches]
    assert kinds[0] == "program_loaded"
    by_execution = defaultdict(list)
    for position, batch in enumerate(batches[1:], start=1):
        by_execution[batch.meta.execution_id].append((position, batch))
    assert sorted(by_execution) == [first.execution_id, second.execution_id]
    for result, timing_only in ((first, False), (second, True)):
        entries = by_execution[result.execution_id]
        positions = [p for p, _ in entries]
        assert positions == list(range(positions[0], positions[0] + len(positions)))  # contiguous
        assert entries[0][1].kind == "execution_start" and entries[-1][1].kind == "execution_end"
        inner = {b.kind for _, b in entries[1:-1]}
        assert inner == {"instruction", "dma_packet", "semaphore_update", "hbm_usage"}
        start, end = entries[0][1].meta, entries[-1][1].meta
        assert start.start_ns == result.start_ns and start.model_id == model.model_id
        assert end.end_ns == result.end_ns and end.device_time_ns == result.device_time_ns
        assert end.timing_only is timing_only
        for _, batch in entries:
            assert batch.meta.core == 0 and batch.meta.model_id == model.model_id
    # numerics and timing-only runs report the same records apart from the clock
    a = next(b for _, b in by_execution[first.execution_id] if b.kind == "instruction")
    b = next(b for _, b in by_execution[second.execution_id] if b.kind == "instruction")
    assert np.array_equal(a.columns["id"], b.columns["id"])
    # whole-ns rounding of start and end may differ by 1 ns between clock offsets
    np.testing.assert_allclose(a.columns["duration_ns"], b.columns["duration_ns"], atol=1)


def test_unsubscribe_stops_delivery():
    program = nc.compile(small_model(), "trn1")
    sink = EventSink()
    first, unsubscribe_first = collect(sink)
    second, unsubscribe_second = collect(sink)
    assert sink.active
    model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
    model.execute(timing_only=True)
    assert len(first) == len(second) > 0
    assert [b.kind for b in first] == [b.kind for b in second]
    seen = len(first)
    unsubscribe_first()
    model.execute(timing_only=True)
    assert len(first) == seen
    assert len(second) > seen
    unsubscribe_second()
    assert not sink.active
    count = len(second)
    model.execute(timing_only=True)
    assert len(second) == count
    unsubscribe_second()  # a second call is harmless


def test_private_sink_is_isolated_from_the_process_wide_one():
    program = nc.compile(small_model(), "trn1")
    global_batches, unsubscribe_global = collect(nc.sink)
    try:
        private = EventSink()
        private_batches, unsubscribe_private = collect(private)
        nc.Instance("trn1.2xlarge", sink=private).core(0).load(program).execute(timing_only=True)
        unsubscribe_private()
        assert private_batches and not global_batches
        # the default instance reports to the process-wide sink
        nc.Instance("trn1.2xlarge").core(0).load(program).execute(timing_only=True)
        assert global_batches[0].kind == "program_loaded"
        assert "execution_end" in [b.kind for b in global_batches]
    finally:
        unsubscribe_global()
    assert not nc.sink.active
