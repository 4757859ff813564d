"""A running training job seen live: the live counters keep its steps, neuron-monitor reports its
throughput, training MFU and step-latency percentiles (execution_stats.training_stats), and
neuron-top's status line shows them."""

from __future__ import annotations

import time

import pytest

import neuroncore as nc
from collectors.livereader import parse_state
from collectors.livestate import LiveAccumulator
from collectors.livewindow import repeated, window
from collectors.monitor_report import execution_stats
from explorer.top import render
from explorer.top.report import parse_process
from explorer.top.snapshots import Hardware
from neuroncore.events import EventSink
from neuroncore.parallel.train_step import TrainingStepRun
from neuroncore.workloads.training import get_train


def _document(acc: LiveAccumulator, sequence: int, sampled_at: float) -> dict:
    return {"format": "neuronscope-live", "version": 1, "pid": 4242, "start_time": 1.0, "tag": "4242",
            "command": "train.py", "user": "me", "runtime_version": "x", "period_s": 0.5,
            "started_at": 10.0, "sequence": sequence, "sampled_at": sampled_at,
            "host": {"cpu_user_s": 0.0, "cpu_system_s": 0.0, "rss_bytes": 0}, **acc.snapshot()}


@pytest.fixture(scope="module")
def states() -> tuple:
    sink = EventSink()
    acc = LiveAccumulator()
    sink.subscribe(acc)
    model, plan = get_train("llama-train").configure(None, tp=2, dp=16, seq=128, global_batch=32)
    run = TrainingStepRun.load(model, plan, nc.Instance("trn1.32xlarge", sink=sink))
    run.execute()
    first = parse_state(_document(acc, 1, 11.0))
    for _ in range(3):
        run.execute()
    second = parse_state(_document(acc, 2, 12.0))
    return first, second, plan


def test_live_counters_keep_the_steps(states) -> None:
    first, second, plan = states
    assert first.training is not None and second.training is not None
    assert (first.training.steps, second.training.steps) == (1, 4)
    assert second.training.sequences == 4 * plan.global_batch
    assert sum(second.training.step_latency_hist.values()) == 4


def test_monitor_reports_training_stats_for_the_period(states) -> None:
    first, second, plan = states
    stats = execution_stats(window(first, second))["training_stats"]
    assert stats["steps"] == 3 and stats["layout"] == plan.key("llama-small")
    step_s = stats["step_latency"]["p50"]
    assert stats["throughput"]["sequences_per_s"] == pytest.approx(plan.global_batch / step_s, rel=0.1)
    assert 0 < stats["mfu"] < 1
    assert stats["step_latency"]["p0"] <= stats["step_latency"]["p50"] <= stats["step_latency"]["p100"]
    assert "training_stats" not in execution_stats(window(None, _plain()))
    # a period with no new step keeps the rates, counts nothing, has no percentiles
    again = execution_stats(repeated(window(first, second)))["training_stats"]
    assert again["steps"] == 0 and again["step_latency"] is None


def test_neuron_top_shows_the_training_job(states) -> None:
    first, second, _ = states
    entry = {"pid": 4242, "neuron_runtime_tag": "4242",
             "report": {"execution_stats": execution_stats(window(first, second))}}
    proc = parse_process(entry, Hardware("i-0", "trn1.32xlarge", "v2", 16, 2, 32 * 2**30))
    assert proc.training is not None and proc.training.steps == 3 and proc.training.step_p50_s
    frame = type("F", (), {"active": (proc,)})()
    note = render.training_note(frame)  # type: ignore[arg-type]
    assert note.startswith("training pid 4242 llama-small/1xtrn1.32xlarge/tp2pp1dp16/seq128/gbs32: 3 steps")
    assert "seq/s" in note and "MFU" in note and "step p50" in note


def _plain():
    acc = LiveAccumulator()
    return parse_state(_document(acc, 1, time.time()))
