"""Trainium2 power throttling in the timing model (``runtime/scheduler.py``, docs/execution-core.md):
after the Tensor engine's utilisation stayed under 50 % for 3 us, the next burst of matmuls runs at
half rate until the ramp ends; NC-v2 never throttles; a dense program is never throttled; the option
that turns it off; the ``throttle`` records."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.program import RES_TENSOR_MM
from neuroncore.events import EventSink
from neuroncore.hardware import NC_V2, NC_V3
from neuroncore.record_kinds import RecordKind, ThrottleMeta
from neuroncore.runtime.scheduler import schedule

INSTANCES = {"trn1": "trn1.2xlarge", "trn2": "trn2.48xlarge"}


def bursty_graph(gap_ops: int) -> nc.Graph:
    """Two bursts of 4 MATMULs (w [128, 128] stationary, 2048 moving columns each), with ``gap_ops``
    ACTIVATE Exp passes over the first burst's [128, 2048] result between them (~1.7 us each)."""
    b = nc.GraphBuilder("bursty")
    x = b.parameter("x", (128, 2048), "bf16")
    w1 = b.parameter("w1", (128, 128), "bf16")
    w2 = b.parameter("w2", (128, 128), "bf16")
    h = b.dot(w1, x, lhs_contract=-2)
    for _ in range(gap_ops):
        h = b.exp(h)
    y = b.dot(w2, b.convert(h, "bf16"), lhs_contract=-2)
    return b.build([y])


def dense_graph() -> nc.Graph:
    """One matmul that keeps the PE array ~97 % busy for ~28 us on NC-v3."""
    b = nc.GraphBuilder("dense")
    w = b.parameter("w", (256, 2048), "bf16")
    x = b.parameter("x", (256, 2048), "bf16")
    return b.build([b.dot(w, x, lhs_contract=-2)])


def run(graph: nc.Graph, target: str, sink: EventSink | None = None, **spec_changes: object):
    spec = replace(NC_V3 if target == "trn2" else NC_V2, **spec_changes)
    program = nc.compile(graph, spec)
    result = nc.Instance(INSTANCES[target], sink=sink).core(0).load(program).execute(timing_only=True)
    return program, result.timeline


def matmuls(program: nc.Program) -> np.ndarray:
    return np.flatnonzero(program.resource == RES_TENSOR_MM)


@pytest.fixture(scope="module")
def bursty() -> tuple[nc.Program, object]:
    return run(bursty_graph(2), "trn2")


def test_the_burst_after_a_quiet_window_runs_at_half_rate(bursty) -> None:
    program, tl = bursty
    mm = matmuls(program)
    assert mm.size == 8
    took = tl.end_ns[mm] - tl.start_ns[mm]
    first, second = slice(0, 4), slice(4, 8)
    gap = tl.start_ns[mm[4]] - tl.end_ns[mm[3]]
    assert gap > NC_V3.throttle_window_ns  # the Tensor engine sat idle for more than the window
    np.testing.assert_allclose(took[first], program.cost_ns[mm[first]])  # the first burst: full speed
    # the second burst (1.7 us at half rate) lies inside the 3 us ramp: every MATMUL takes twice as long
    np.testing.assert_allclose(took[second], 2 * program.cost_ns[mm[second]])
    assert tl.throttle_start_ns.tolist() == [round(tl.start_ns[mm[4]])]
    ramp_end = tl.start_ns[mm[4]] + NC_V3.throttle_ramp_ns
    assert tl.throttle_end_ns.tolist() == [round(min(ramp_end, tl.finish_ns))]
    assert tl.throttle_extra_ns == pytest.approx(float((took - program.cost_ns[mm]).sum()))


def test_a_matmul_straddling_the_ramp_end_finishes_at_full_speed() -> None:
    # a 1 us ramp ends inside the second burst: MATMULs before it take 2x, the one across it
    # (ramp_end - s) + (cost - (ramp_end - s) / 2), the rest 1x
    program, tl = run(bursty_graph(2), "trn2", throttle_ramp_ns=1000.0)
    mm = matmuls(program)
    s, took, cost = tl.start_ns[mm[4:]], (tl.end_ns - tl.start_ns)[mm[4:]], program.cost_ns[mm[4:]]
    ramp_end = s[0] + 1000.0
    expected = np.where(s + 2 * cost <= ramp_end, 2 * cost,
                        np.where(s >= ramp_end, cost, (ramp_end - s) + (cost - (ramp_end - s) / 2)))
    np.testing.assert_allclose(took, expected)
    full, half = np.isclose(took, cost), np.isclose(took, 2 * cost)
    assert full.any() and half.any() and (~full & ~half).any()  # all three cases happen


def test_a_short_gap_does_not_throttle() -> None:
    program, tl = run(bursty_graph(0), "trn2")  # the bursts ~1.3 us apart: the window is half busy
    mm = matmuls(program)
    np.testing.assert_allclose(tl.end_ns[mm] - tl.start_ns[mm], program.cost_ns[mm])
    assert tl.throttle_start_ns.size == 0 and tl.throttle_extra_ns == 0


def test_a_dense_program_is_never_throttled() -> None:
    program, tl = run(dense_graph(), "trn2")
    mm = matmuls(program)
    busy = float((tl.end_ns[mm] - tl.start_ns[mm]).sum())
    assert busy / (tl.end_ns[mm].max() - tl.start_ns[mm].min()) > 0.9
    assert busy > 5 * NC_V3.throttle_window_ns  # long enough for a window to be judged many times
    assert tl.throttle_start_ns.size == 0
    np.testing.assert_allclose(tl.end_ns[mm] - tl.start_ns[mm], program.cost_ns[mm])


def test_trn1_never_throttles() -> None:
    assert not NC_V2.power_throttling and NC_V3.power_throttling
    program, tl = run(bursty_graph(2), "trn1")
    mm = matmuls(program)
    np.testing.assert_allclose(tl.end_ns[mm] - tl.start_ns[mm], program.cost_ns[mm])
    assert tl.throttle_start_ns.size == 0


def test_the_option_turns_it_off(bursty) -> None:
    program, throttled = bursty
    off = schedule(program, throttled.begin_ns - 0.0, power_throttling=False)
    assert off.throttle_start_ns.size == 0
    # compiled for a spec without it: the same schedule as the runtime switch
    _, spec_off = run(bursty_graph(2), "trn2", power_throttling=False)
    assert spec_off.finish_ns - spec_off.begin_ns == pytest.approx(off.finish_ns - off.begin_ns)
    # throttling made the execution longer (by less than the matmuls' extra time: evacuations of
    # the earlier matmuls overlap the later, slower ones)
    assert off.finish_ns - off.begin_ns < throttled.finish_ns - throttled.begin_ns


def test_throttle_records_are_emitted_for_throttled_executions_only() -> None:
    sink = EventSink(check=True)
    batches = []
    sink.subscribe(batches.append)
    _, tl = run(bursty_graph(2), "trn2", sink=sink)
    run(bursty_graph(2), "trn1", sink=sink)
    run(dense_graph(), "trn2", sink=sink)
    (batch,) = [b for b in batches if b.kind == RecordKind.THROTTLE]
    assert batch.columns["timestamp"].tolist() == tl.throttle_start_ns.tolist()
    assert (batch.columns["duration_ns"] == tl.throttle_end_ns - tl.throttle_start_ns).all()
    assert batch.columns["k"].tolist() == [1] and batch.columns["n"].tolist() == [2]
    assert isinstance(batch.meta, ThrottleMeta) and batch.meta.extra_ns == round(tl.throttle_extra_ns)
