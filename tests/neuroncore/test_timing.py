"""The timing model: per-instruction cost formulas (neuroncore.md §3.3, §4, §5) and scheduler semantics.

Costs are checked twice: by calling ``neuroncore.compiler.costs`` directly and on the node a tiny
compiled graph produces. The scheduler is checked against the rules a real NeuronCore obeys: every
semaphore wait is honoured (and the semaphore values the compiler emits agree with the schedule),
engines run their streams in order without overlap, the Tensor engine's LoadStationary runs in the
background of the previous MultiplyMoving, and DMA transfers start a fixed latency after their
trigger.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neuroncore as nc
from neuroncore.compiler import costs
from neuroncore.compiler.emitter import DMA_COMPLETION_INCREMENT
from neuroncore.compiler.program import RES_DMA, RES_TENSOR_LS, RES_TENSOR_MM
from neuroncore.dtypes import DType
from neuroncore.hardware import NC_V2, NC_V3, Engine, core_spec, with_overrides
from neuroncore.workloads import get, random_inputs

INSTANCES = {"trn1": "trn1.2xlarge", "trn2": "trn2.48xlarge"}
EPS = 1e-6  # ns; timelines are float64


# -- helpers -----------------------------------------------------------------------------------------


def nodes_with(program: nc.Program, opcode: str) -> list[int]:
    return [i for i in range(program.n_nodes) if program.opcodes[program.opcode_id[i]] == opcode]


def only_node(program: nc.Program, opcode: str) -> int:
    found = nodes_with(program, opcode)
    assert len(found) == 1, (opcode, found, [program.opcodes[program.opcode_id[i]]
                                             for i in range(program.n_nodes)])
    return found[0]


def timeline_of(program: nc.Program, target: str = "trn1"):
    return nc.Instance(INSTANCES[target]).core(0).load(program).execute(timing_only=True).timeline


def unary_graph(shape, dtype, fn):
    b = nc.GraphBuilder("unary")
    x = b.parameter("x", shape, dtype)
    return b.build([fn(b, x)])


def binary_graph(shape, dtype, fn):
    b = nc.GraphBuilder("binary")
    x = b.parameter("x", shape, dtype)
    y = b.parameter("y", shape, dtype)
    return b.build([fn(b, x, y)])


def matmul_graph(k: int, m: int, n: int, dtype: str):
    """stationary lhsT [K, M] x moving [K, N]: one LDWEIGHTS + one MATMUL when the shapes fit the PE."""
    b = nc.GraphBuilder("mm")
    lhs_t = b.parameter("lhsT", (k, m), dtype)
    rhs = b.parameter("rhs", (k, n), dtype)
    return b.build([b.dot(lhs_t, rhs, lhs_contract=-2)])


_WAIT = re.compile(r"\$S\[(\d+)\]>=(\d+)")


def check_schedule(program: nc.Program, tl) -> None:
    """Every rule the timing model promises, on one executed timeline."""
    start, end = tl.start_ns, tl.end_ns
    n = program.n_nodes
    assert start.shape == end.shape == (n,)
    assert np.all(np.isfinite(start)) and np.all(end >= start - EPS)
    res = program.resource

    # (1) semaphore order: a node starts only after everything it waits for has ended
    for i in range(n):
        deps = program.deps(i)
        if deps.size:
            assert start[i] >= end[deps].max() - EPS, (i, program.operands[i])
        if res[i] == RES_DMA:
            # the transfer waits for nothing itself; its trigger did, and the fixed latency follows
            trig = int(program.trigger[i])
            assert 0 <= trig < i and res[trig] != RES_DMA
            assert start[i] >= end[trig] + program.spec.dma_fixed_latency_ns - EPS, i

    # (2) in-order, non-overlapping streams: the five engines, the Tensor engine's second track
    for r in (RES_TENSOR_LS, int(Engine.VECTOR), int(Engine.SCALAR), int(Engine.GPSIMD),
              int(Engine.SYNC), RES_TENSOR_MM):
        idx = np.flatnonzero(res == r)
        if idx.size > 1:
            assert np.all(start[idx[1:]] >= end[idx[:-1]] - EPS), f"overlap on resource {r}"
            assert np.all(start[idx[1:]] >= start[idx[:-1]] - EPS), f"out of order on resource {r}"
    tensor = np.flatnonzero((res == RES_TENSOR_LS) | (res == RES_TENSOR_MM))
    assert np.all(program.engine[tensor] == int(Engine.TENSOR))
    assert {program.opcodes[program.opcode_id[i]] for i in np.flatnonzero(res == RES_TENSOR_LS)} <= {
        "LDWEIGHTS"}
    assert {program.opcodes[program.opcode_id[i]] for i in np.flatnonzero(res == RES_TENSOR_MM)} <= {
        "MATMUL"}

    # (3) background LoadStationary: LS never before the previous MM started; MM after its LS ended
    last_ls = last_mm = -1
    for i in tensor:
        if res[i] == RES_TENSOR_LS:
            if last_mm >= 0:
                assert start[i] >= start[last_mm] - EPS, (i, last_mm)
            last_ls = i
        else:
            if last_ls >= 0:
                assert start[i] >= end[last_ls] - EPS, (i, last_ls)
            last_mm = i

    # (4) DMA transfers of one queue complete in order (the queue semaphore counts completions)
    dma = np.flatnonzero(res == RES_DMA)
    for q in np.unique(program.queue[dma]):
        on_q = dma[program.queue[dma] == q]
        assert np.all(np.diff(end[on_q]) >= -EPS), f"queue {q} completes out of order"

    # (5) packets: one per engine share, inside the transfer's window (packet times may be whole
    # nanoseconds)
    counts = np.bincount(tl.packet_node, minlength=n)
    assert np.array_equal(counts[dma], program.dma_engines[dma].astype(np.int64))
    assert np.all(tl.packet_start_ns >= start[tl.packet_node] - 0.5 - EPS)
    assert np.all(tl.packet_end_ns <= end[tl.packet_node] + 0.5 + EPS)
    assert np.all(tl.packet_end_ns >= tl.packet_start_ns)
    # a DMA engine serves each queue in order (FIFO); a packet lasts at least its engine time
    packet_queue = program.queue[tl.packet_node]
    for e in np.unique(tl.packet_engine):
        on_engine = tl.packet_engine == e
        for q in np.unique(packet_queue[on_engine]):
            sel = np.flatnonzero(on_engine & (packet_queue == q))
            assert np.all(tl.packet_start_ns[sel][1:] >= tl.packet_end_ns[sel][:-1] - EPS), (e, q)
    duration = tl.packet_end_ns - tl.packet_start_ns
    assert np.all(duration >= program.cost_ns[tl.packet_node] - 1.0 - EPS)

    check_semaphores(program, tl)


def check_semaphores(program: nc.Program, tl) -> None:
    """The semaphore program the compiler emits must agree with the schedule.

    A semaphore counts increments (1 per instruction, 16 per DMA transfer); a wait ``$S[s]>=v`` is
    released when the count reaches ``v``. So (a) a count must never reach a producer's value before
    that producer has ended (or a consumer could be released early), and (b) every wait in an
    operand string must already be satisfied when the waiting node starts.
    """
    end, start = tl.end_ns, tl.start_ns
    reach: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for s in np.unique(program.sem_increment[program.sem_increment >= 0]):
        producers = np.flatnonzero(program.sem_increment == s)
        steps = np.where(program.resource[producers] == RES_DMA, DMA_COMPLETION_INCREMENT, 1)
        # values are running counts in program order
        assert np.array_equal(program.sem_value[producers], np.cumsum(steps)), s
        order = np.argsort(end[producers], kind="stable")
        t_sorted = end[producers][order]
        count = np.cumsum(steps[order])
        reach[int(s)] = (t_sorted, count)
        for d in producers:
            earlier = steps[end[producers] < end[d] - EPS].sum()
            assert earlier < program.sem_value[d], (
                f"semaphore {s} reaches {program.sem_value[d]} before its producer {d} "
                f"({program.opcodes[program.opcode_id[d]]}) ends")
    for i in range(program.n_nodes):
        for s_text, v_text in _WAIT.findall(program.operands[i]):
            s, v = int(s_text), int(v_text)
            t_sorted, count = reach[s]
            k = int(np.searchsorted(count, v))
            assert k < count.size, (i, s, v)
            assert start[i] >= t_sorted[k] - EPS, (i, s, v)


# -- Tensor engine costs (§3.3) ----------------------------------------------------------------------


def test_matmul_cycle_formula():
    assert costs.matmul_cycles(NC_V2, 512, DType.BF16) == 512
    assert costs.matmul_cycles(NC_V2, 32, DType.BF16) == 64  # MM_INIT_LATENCY floor
    assert costs.matmul_cycles(NC_V2, 1, DType.FP16) == 64
    assert costs.matmul_cycles(NC_V2, 512, DType.FP32) == 4 * 512
    assert costs.matmul_cycles(NC_V3, 512, DType.BF16) == 512
    assert costs.cycles_to_ns(NC_V2, Engine.TENSOR, 512) == pytest.approx(182.857, abs=1e-3)
    assert costs.cycles_to_ns(NC_V3, Engine.TENSOR, 512) == pytest.approx(213.333, abs=1e-3)


def test_ldweights_is_fast_load_stationary():
    # LS II ~ stationary free elements / 4 (§3.3): 32 cycles for a 128-wide stationary
    assert costs.ldweights_cycles(NC_V2, 128, DType.BF16) == 32
    assert costs.ldweights_cycles(NC_V2, 128, DType.BF16) < costs.matmul_cycles(NC_V2, 128, DType.BF16)


def test_pe_transpose_formula():
    assert costs.pe_transpose_cycles(NC_V2, 128, 128) == 128
    assert costs.pe_transpose_cycles(NC_V2, 32, 128) == 64
    assert costs.pe_transpose_cycles(NC_V2, 16, 16) == 16


@pytest.mark.parametrize(("target", "ns"), [("trn1", 182.857), ("trn2", 213.333)])
def test_compiled_bf16_matmul_128x128x512(target, ns):
    program = nc.compile(matmul_graph(128, 128, 512, "bf16"), target)
    mm = only_node(program, "MATMUL")
    assert program.cost_ns[mm] == pytest.approx(ns, abs=0.01)
    assert program.resource[mm] == RES_TENSOR_MM
    assert program.raw_flops[mm] == 2 * 128 * 128 * 512
    ls = only_node(program, "LDWEIGHTS")
    assert ls < mm and program.resource[ls] == RES_TENSOR_LS
    assert program.cost_ns[ls] == pytest.approx(
        costs.cycles_to_ns(program.spec, Engine.TENSOR, 32), abs=1e-9)


def test_short_moving_is_floored_at_64_cycles():
    program = nc.compile(matmul_graph(128, 128, 32, "bf16"), "trn1")
    mm = only_node(program, "MATMUL")
    assert program.cost_ns[mm] == pytest.approx(64 / 2.8, abs=1e-3)  # 22.86 ns, not 32 cycles


def test_fp32_matmul_costs_four_times_in_two_passes():
    bf16 = nc.compile(matmul_graph(128, 128, 512, "bf16"), "trn1")
    fp32 = nc.compile(matmul_graph(128, 128, 512, "fp32"), "trn1")
    passes = nodes_with(fp32, "MATMUL")
    assert len(passes) == 2  # FP32_LO_HI: two instructions
    total = fp32.cost_ns[passes].sum()
    assert total == pytest.approx(4 * bf16.cost_ns[only_node(bf16, "MATMUL")], rel=1e-9)
    assert total == pytest.approx(4 * 182.857, abs=0.01)
    # each pass records half the FLOPs; adjusted (BF16-equivalent) FLOPs are x4 (§3.6)
    flops = 2 * 128 * 128 * 512
    assert [int(fp32.raw_flops[i]) for i in passes] == [flops // 2, flops // 2]
    assert int(fp32.adjusted_flops[passes].sum()) == 4 * flops
    assert int(bf16.adjusted_flops.sum()) == flops


# -- Vector / Scalar costs (§4.2, §4.3) --------------------------------------------------------------


def test_vector_and_scalar_formulas():
    assert costs.activation_cycles(NC_V2, 512) == 512
    assert costs.activation_cycles(NC_V2, 512, accumulate=True) == 512 + 64
    assert costs.activation_cycles(NC_V2, 10) == 64
    # tensor_tensor: 2N when both inputs are in SBUF (not the BF16 fast path), N with one in PSUM
    assert costs.vector_cycles(NC_V2, "tensor_tensor", 512) == 1024
    assert costs.vector_cycles(NC_V2, "tensor_tensor", 512, inputs_in_psum=1) == 512
    assert costs.vector_cycles(NC_V2, "tensor_tensor", 512, all_bf16=True) == 512
    assert costs.vector_cycles(NC_V2, "tensor_tensor", 20) == 64
    assert costs.vector_cycles(NC_V2, "tensor_scalar", 512) == 512
    assert costs.vector_cycles(NC_V2, "tensor_copy", 3) == 64
    assert costs.vector_cycles(NC_V2, "tensor_reduce", 512) == 512
    assert costs.vector_cycles(NC_V2, "tensor_reduce", 512, all_bf16=True) == 256
    assert costs.vector_cycles(NC_V2, "reciprocal", 512) == 8 * 512
    assert costs.gpsimd_cycles(NC_V2, 512) == 150 + 512
    with pytest.raises(ValueError, match="no Vector cost formula"):
        costs.vector_cycles(NC_V2, "bn_aggr", 512)
    # §4.3 conversions
    assert costs.cycles_to_ns(NC_V2, Engine.SCALAR, 512) == pytest.approx(365.714, abs=1e-3)
    assert costs.cycles_to_ns(NC_V2, Engine.VECTOR, 1024) == pytest.approx(914.286, abs=1e-3)
    assert costs.cycles_to_ns(NC_V3, Engine.SCALAR, 512) == pytest.approx(426.667, abs=1e-3)
    assert costs.cycles_to_ns(NC_V3, Engine.VECTOR, 1024) == pytest.approx(1066.667, abs=1e-3)


@pytest.mark.parametrize(("target", "ns"), [("trn1", 365.714), ("trn2", 426.667)])
def test_compiled_activate_n512(target, ns):
    program = nc.compile(unary_graph((128, 512), "fp32", lambda b, x: b.exp(x)), target)
    act = only_node(program, "ACTIVATE")
    assert program.engine[act] == int(Engine.SCALAR)
    assert program.activation_fn[act] == "Exp"
    assert program.cost_ns[act] == pytest.approx(ns, abs=0.01)


@pytest.mark.parametrize(("target", "ns"), [("trn1", 914.286), ("trn2", 1066.667)])
def test_compiled_tensor_tensor_fp32_sbuf_sbuf_n512(target, ns):
    program = nc.compile(binary_graph((128, 512), "fp32", lambda b, x, y: b.maximum(x, y)), target)
    tt = only_node(program, "TENSOR_TENSOR")
    assert program.engine[tt] == int(Engine.VECTOR)
    assert program.cost_ns[tt] == pytest.approx(ns, abs=0.01)  # 1024 DVE cycles
    assert program.performance_mode[tt] is None


@pytest.mark.parametrize(("target", "dve_ns", "act_ns"), [("trn1", 57.143, 45.714),
                                                          ("trn2", 66.667, 53.333)])
def test_min_ii_floors(target, dve_ns, act_ns):
    scaled = nc.compile(unary_graph((128, 16), "fp32", lambda b, x: b.multiply(x, 2.0)), target)
    ts = only_node(scaled, "TENSOR_SCALAR")
    assert scaled.cost_ns[ts] == pytest.approx(dve_ns, abs=0.01)  # 64 DVE cycles, not 16
    exp = nc.compile(unary_graph((128, 16), "fp32", lambda b, x: b.exp(x)), target)
    assert exp.cost_ns[only_node(exp, "ACTIVATE")] == pytest.approx(act_ns, abs=0.01)  # 64 ACT cycles


def test_tiny_tensor_tensor_is_floored():
    program = nc.compile(binary_graph((4, 8), "fp32", lambda b, x, y: b.subtract(x, y)), "trn1")
    assert program.cost_ns[only_node(program, "TENSOR_TENSOR")] == pytest.approx(64 / 1.12, abs=0.01)


# -- NC-v3 DVE performance modes (§2.6) --------------------------------------------------------------


def test_perf_mode_rules():
    assert costs.vector_perf_mode(NC_V2, "tensor_copy", True, True) is None  # NC-v2 has none
    assert costs.vector_perf_mode(NC_V3, "tensor_copy", True, True) == "4x"
    assert costs.vector_perf_mode(NC_V3, "tensor_scalar", True, True) == "4x"
    assert costs.vector_perf_mode(NC_V3, "tensor_copy", True, False) == "2x"  # one side in PSUM
    assert costs.vector_perf_mode(NC_V3, "tensor_tensor", True, True) == "2x"
    assert costs.vector_perf_mode(NC_V3, "tensor_tensor", True, False) is None
    assert costs.vector_perf_mode(NC_V3, "tensor_copy", False, True) is None  # FP32: 1x
    assert [costs.perf_mode_divisor(m) for m in (None, "2x", "4x")] == [1, 2, 4]


@pytest.mark.parametrize(("target", "mode", "ns"), [("trn1", None, 457.143), ("trn2", "4x", 133.333)])
def test_compiled_16bit_copy_perf_mode(target, mode, ns):
    program = nc.compile(unary_graph((128, 512), "bf16", lambda b, x: b.convert(x, "fp16")), target)
    copy = only_node(program, "TENSOR_COPY")
    assert program.performance_mode[copy] == mode
    assert program.cost_ns[copy] == pytest.approx(ns, abs=0.01)


@pytest.mark.parametrize(("dtype", "mode", "ns"), [("bf16", "2x", 533.333), ("fp32", None, 1066.667)])
def test_compiled_nc_v3_tensor_tensor_perf_mode(dtype, mode, ns):
    program = nc.compile(binary_graph((128, 512), dtype, lambda b, x, y: b.maximum(x, y)), "trn2")
    tt = only_node(program, "TENSOR_TENSOR")
    assert program.performance_mode[tt] == mode
    assert program.cost_ns[tt] == pytest.approx(ns, abs=0.01)


# -- DMA (§5) ----------------------------------------------------------------------------------------


def test_dma_engine_formula():
    # 128 rows of 2 KiB over 16 engines: 8 rows each at 17 B/ns plus the per-row overhead
    assert costs.dma_engines_used(NC_V2, 128) == 16
    assert costs.dma_engines_used(NC_V2, 4) == 4  # a few rows use a few engines (§5.2)
    assert costs.dma_engines_used(NC_V2, 0) == 1
    per_row = 2048 / 17 + NC_V2.dma_descriptor_overhead_ns
    assert costs.dma_engine_ns(NC_V2, 128, 2048) == pytest.approx(8 * per_row)
    # NC-v3: 23 B/ns per engine, but the core's HBM share (362 GB/s) is the lower ceiling
    per_engine = min(23.0, NC_V3.hbm_bytes_per_s / 1e9 / 16)
    assert costs.dma_engine_ns(NC_V3, 128, 2048) == pytest.approx(
        8 * (2048 / per_engine + NC_V3.dma_descriptor_overhead_ns))


@pytest.mark.parametrize("spec", [NC_V2, NC_V3], ids=["NC-v2", "NC-v3"])
def test_large_rows_settle_at_the_dma_ceiling(spec):
    rows, row_bytes = 128, 64 * 1024
    ns = costs.dma_engine_ns(spec, rows, row_bytes)  # all 16 engines run in parallel
    rate = rows * row_bytes / ns * 1e9
    assert rate <= spec.dma_bytes_per_s * (1 + 1e-9)
    assert rate >= 0.95 * spec.dma_bytes_per_s
    small = costs.dma_engine_ns(spec, rows, 256)
    assert rows * 256 / small * 1e9 < 0.5 * spec.dma_bytes_per_s  # < 256 B rows: overhead-bound


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_dma_fixed_latency_after_trigger(target):
    program = nc.compile(unary_graph((128, 512), "fp32", lambda b, x: b.exp(x)), target)
    tl = timeline_of(program, target)
    transfers = nodes_with(program, "DMA_DIRECT2D")
    assert len(transfers) == 2  # load x, store the result
    for i in transfers:
        trig = int(program.trigger[i])
        assert program.opcodes[program.opcode_id[trig]] == "WRITE"
        assert tl.start_ns[i] >= tl.end_ns[trig] + 1300.0 - EPS
    # nothing else is in flight: the load starts exactly 1300 ns after its trigger ends
    first = transfers[0]
    assert tl.start_ns[first] == pytest.approx(tl.end_ns[program.trigger[first]] + 1300.0, abs=EPS)
    assert tl.end_ns[first] == pytest.approx(tl.start_ns[first] + program.cost_ns[first], abs=EPS)
    # and the whole single-instruction program is: trigger, latency, load, ACT, trigger, latency, store
    act = only_node(program, "ACTIVATE")
    assert tl.start_ns[act] == pytest.approx(tl.end_ns[first], abs=EPS)


# -- scheduler semantics -----------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("workload", ["bert-layer", "llama-decode", "mlp", "matmul"])
def test_schedule_rules_on_workloads(workload, target):
    program = nc.compile(get(workload).graph(), target)
    check_schedule(program, timeline_of(program, target))


@pytest.mark.parametrize(
    ("workload", "options"),
    [
        ("mlp", dict(batch=256, d_model=1024, d_ff=4096, dtype="fp32")),
        ("matmul", dict(m=256, k=4096, n=256, dtype="fp32")),
        ("bert-layer", dict(seq=64, hidden=256, heads=4, intermediate=512, dtype="fp32")),
    ],
)
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_schedule_rules_on_larger_shapes(workload, options, target):
    program = nc.compile(get(workload).graph(**options), target)
    check_schedule(program, timeline_of(program, target))


def test_schedule_rules_when_sbuf_is_tiny():
    # a shrunken SBUF forces buffer reuse (and spills): more write-after-read hazards
    spec = with_overrides(NC_V2, sbuf_bytes_per_partition=16 * 1024)
    program = nc.compile(get("mlp").graph(batch=256, d_model=512, d_ff=1024), spec)
    check_schedule(program, nc.Instance("trn1.2xlarge").core(0).load(program)
                   .execute(timing_only=True).timeline)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["mlp", "matmul"]),
    a=st.integers(1, 300),
    b=st.integers(1, 600),
    c=st.integers(1, 600),
    dtype=st.sampled_from(["fp32", "bf16"]),
    target=st.sampled_from(["trn1", "trn2"]),
    sbuf_kib=st.sampled_from([None, 24, 48]),  # small SBUFs force buffer reuse and spills
)
def test_schedule_rules_property(kind, a, b, c, dtype, target, sbuf_kib):
    if kind == "mlp":
        graph = get("mlp").graph(batch=a, d_model=b, d_ff=c, dtype=dtype)
    else:
        graph = get("matmul").graph(m=a, k=b, n=c, dtype=dtype)
    spec = core_spec(target)
    if sbuf_kib is not None:
        spec = with_overrides(spec, sbuf_bytes_per_partition=sbuf_kib * 1024)
    try:
        program = nc.compile(graph, spec)
    except nc.CompileError:
        assume(False)  # does not fit at all in the shrunken SBUF
    check_schedule(program, timeline_of(program, target))


def test_timing_only_and_numerics_give_the_same_timeline():
    graph = get("mlp").graph(batch=64, d_model=128, d_ff=256, dtype="bf16")
    program = nc.compile(graph, "trn1")
    inputs = random_inputs(graph, seed=3)
    # two fresh instances: both executions start at t=0, so the timelines must be identical
    numerics = nc.Instance("trn1.2xlarge").core(0).load(program).execute(inputs)
    timing = nc.Instance("trn1.2xlarge").core(0).load(program).execute(timing_only=True)
    assert numerics.outputs is not None and timing.outputs is None
    for name in ("start_ns", "end_ns", "wait_ns", "packet_node", "packet_start_ns", "packet_end_ns",
                 "packet_engine"):
        assert np.array_equal(getattr(numerics.timeline, name), getattr(timing.timeline, name)), name
    assert numerics.device_time_ns == timing.device_time_ns > 0
    # on one core the second execution starts later; relative to its own start it is the same
    model = nc.Instance("trn1.2xlarge").core(1).load(program)
    first = model.execute(inputs)
    second = model.execute(timing_only=True)
    assert second.start_ns > first.start_ns
    np.testing.assert_allclose(first.timeline.start_ns - first.start_ns,
                               second.timeline.start_ns - second.start_ns, atol=1e-6)
    np.testing.assert_allclose(first.timeline.end_ns - first.start_ns,
                               second.timeline.end_ns - second.start_ns, atol=1e-6)
    assert abs(first.device_time_ns - second.device_time_ns) <= 1  # integer ns, ceil'd
    assert first.device_time_ns == numerics.device_time_ns


@pytest.mark.parametrize(("target", "instance"), [("trn1", "trn1.2xlarge"), ("trn2", "trn2.48xlarge")])
def test_big_matmul_is_near_pe_bound(target, instance):
    graph = get("matmul").graph(m=1024, k=1024, n=1024, dtype="bf16")
    program = nc.compile(graph, target)
    result = nc.Instance(instance).core(0).load(program).execute(timing_only=True)
    flops = 2 * 1024**3
    assert int(program.raw_flops.sum()) == flops
    bound_ns = flops / program.spec.pe_peak_bf16_flops_per_s * 1e9
    assert bound_ns == pytest.approx(23405.7 if target == "trn1" else 27306.7, rel=1e-4)
    assert result.device_time_ns >= bound_ns
    assert result.device_time_ns <= 2 * bound_ns
    # the PE's MultiplyMoving time alone is exactly the bound (512-wide moving tiles)
    mm = program.resource == RES_TENSOR_MM
    assert program.cost_ns[mm].sum() == pytest.approx(bound_ns, rel=1e-9)


def test_fp32_matmul_is_bounded_by_the_fp32_peak():
    program = nc.compile(get("matmul").graph(m=512, k=512, n=512, dtype="fp32"), "trn1")
    result = nc.Instance("trn1.2xlarge").core(0).load(program).execute(timing_only=True)
    bound_ns = 2 * 512**3 / NC_V2.pe_peak_fp32_flops_per_s * 1e9
    assert program.cost_ns[program.resource == RES_TENSOR_MM].sum() == pytest.approx(bound_ns, rel=1e-9)
    assert bound_ns <= result.device_time_ns <= 3 * bound_ns


def test_executions_on_one_core_are_sequential():
    program = nc.compile(get("mlp").graph(batch=32, d_model=64, d_ff=128), "trn1")
    inst = nc.Instance("trn1.2xlarge")
    model = inst.core(0).load(program)
    results = [model.execute(timing_only=True) for _ in range(3)]
    other = inst.core(1).load(program).execute(timing_only=True)
    for prev, nxt in itertools.pairwise(results):
        assert nxt.execution_id > prev.execution_id
        assert nxt.start_ns >= prev.end_ns
        assert nxt.timeline.begin_ns >= prev.timeline.finish_ns
        assert nxt.device_time_ns == prev.device_time_ns
    for r in results:
        assert r.end_ns == r.start_ns + r.device_time_ns
        assert r.timeline.begin_ns >= r.start_ns and r.timeline.finish_ns <= r.end_ns
        assert r.core == 0 and r.model_id == model.model_id
    assert model.executions == 3
    # another core has its own clock
    assert other.core == 1 and other.start_ns == 0
    assert other.execution_id > results[-1].execution_id
    assert inst.core(0).clock_ns >= results[-1].end_ns


def test_wait_is_time_blocked_on_semaphores():
    program = nc.compile(unary_graph((128, 512), "fp32", lambda b, x: b.exp(x)), "trn1")
    tl = timeline_of(program)
    act = only_node(program, "ACTIVATE")
    # the Scalar engine was free from t=0; it waited for the load to land
    load = int(program.deps(act)[0])
    assert program.resource[load] == RES_DMA
    assert tl.wait_ns[act] == pytest.approx(tl.end_ns[load] - tl.begin_ns, abs=EPS)
    assert np.all(tl.wait_ns >= 0)


# -- dependent-instruction penalties (neuroncore.md §4.1) --------------------------------------


def _costs_of(program, opcode):
    return [float(program.cost_ns[i]) for i in range(program.n_nodes)
            if program.opcodes[program.opcode_id[i]] == opcode]


def test_dependent_scalar_chain_issues_every_264_cycles():
    import neuroncore as nc
    from neuroncore.hardware import NC_V2

    b = nc.GraphBuilder("chain")
    x = b.parameter("x", (128, 1), "fp32")
    g = b.build([b.exp(b.tanh(x))])
    costs = _costs_of(nc.compile(g, "trn1"), "ACTIVATE")
    min_ii = 64 * 1e9 / NC_V2.scalar_clock_hz
    assert costs[0] == pytest.approx(min_ii)  # reads a DMA'd tile: no ACT predecessor
    assert costs[1] == pytest.approx(264 * 1e9 / NC_V2.scalar_clock_hz)  # 188.6 ns


def test_dependent_vector_instruction_pays_100_cycles():
    import neuroncore as nc
    from neuroncore.hardware import NC_V2

    b = nc.GraphBuilder("chain")
    x = b.parameter("x", (128, 256), "fp32")
    y = b.parameter("y", (128, 256), "fp32")
    g = b.build([b.add(b.add(x, y), y)])
    costs = _costs_of(nc.compile(g, "trn1"), "TENSOR_TENSOR")
    base = 2 * 256 * 1e9 / NC_V2.vector_clock_hz
    assert costs[0] == pytest.approx(base)
    assert costs[1] == pytest.approx(base + 100 * 1e9 / NC_V2.vector_clock_hz)


# -- NC-v2 port sharing (neuroncore.md §2.5) ---------------------------------------------------


def _psum_intervals(program, result, engine):
    tl = result.timeline
    return [(tl.start_ns[i], tl.end_ns[i]) for i in range(program.n_nodes)
            if program.resource[i] == engine and program.ports[i] & 2]


@pytest.mark.parametrize("target, exclusive", [("trn1", True), ("trn2", False)])
def test_vector_and_scalar_never_share_psum_on_v2(target, exclusive):
    import neuroncore as nc

    b = nc.GraphBuilder("evac")
    x = b.parameter("x", (512, 128), "bf16")
    g = b.build([b.matmul(x, b.weight("w", (128, 4096), "bf16"))])
    program = nc.compile(g, target)
    instance = "trn1.2xlarge" if target == "trn1" else "trn2.48xlarge"
    result = nc.Instance(instance, sink=nc.EventSink()).core(0).load(program).execute(
        timing_only=True)
    vector = _psum_intervals(program, result, 1)
    scalar = _psum_intervals(program, result, 2)
    assert vector and scalar  # evacuations alternate between the two engines
    overlaps = sum(1 for vs, ve in vector for ss, se in scalar if vs < se - 1e-6 and ss < ve - 1e-6)
    if exclusive:
        assert overlaps == 0
    else:
        assert overlaps > 0  # NC-v3 lifts the restriction (different banks)
