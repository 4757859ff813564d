"""Rates and per-period deltas from two live-state samples of the same process.

The core's device time is simulated, so utilisation needs a rule that ties it to the wall clock:

    window W  = wall time between the two samples (publisher clock, ``sampled_at``)
    busy B    = device time of the executions that ended in the window (on one core)
    neuroncore_utilization = 100 * min(B, W) / W
    flops                  = FLOPs of those executions / max(W, B)       (per second)
    engine busy fraction   = engine busy time / max(W, B)                 (0..1)

When the simulated device time exceeds the wall time (the simulation ran faster than the device
would), the core counts as fully busy and rates are taken over the device time, so no figure ever
exceeds what the hardware could do. Executions are attributed to the window in which they ended.

The first window of a process that appears after the reader started counts from the publisher's
start (its counters start at zero there). A sample identical to the previous one (the publisher has
not written since) repeats the previous rates with zero deltas instead of reporting an idle core.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from collectors import latency
from collectors.livereader import ProcessState, TrainingSample
from collectors.livestate import ENGINES


@dataclass(frozen=True)
class CoreWindow:
    """One physical core over one window."""

    index: int
    device: int
    utilization: float  # percent, 0..100
    flops: float  # FLOP/s
    engine_busy: Mapping[str, float]  # fraction 0..1 per engine (Tensor, Vector, Scalar, GpSimd, Sync, DMA)
    executions: int
    hbm_bytes_per_s: float


@dataclass(frozen=True)
class ProcessWindow:
    """One process over one window: rates, deltas and the latency distribution of its executions."""

    pid: int
    period_s: float
    cores: Mapping[int, CoreWindow]
    execution_status: Mapping[str, int]
    errors: Mapping[str, int]
    total_latency: Mapping[str, float] | None  # seconds, p0..p100; None: nothing finished
    device_latency: Mapping[str, float] | None
    vcpu_user: float  # percent of the whole machine
    vcpu_system: float
    link_bytes_per_s: Mapping[str, float]
    training: TrainingWindow | None = None


@dataclass(frozen=True)
class TrainingWindow:
    """The training steps that ended in a window: throughput, MFU and step-latency percentiles
    (``formats.figures.training_step_figures`` over the window's steps: their sequences over their
    device time)."""

    layout: str
    steps: int
    seq_per_s: float
    tokens_per_s: float
    mfu: float | None
    step_latency: Mapping[str, float] | None  # seconds, p0..p100


def training_window(previous: TrainingSample | None, current: TrainingSample | None) -> TrainingWindow | None:
    """Steps between two samples (all of them when the layout changed or there was no sample)."""
    from formats.figures import training_step_figures

    if current is None:
        return None
    if previous is not None and previous.layout != current.layout:
        previous = None
    steps = current.steps - (previous.steps if previous else 0)
    step_ns = current.step_ns - (previous.step_ns if previous else 0)
    if steps <= 0 or step_ns <= 0:
        return TrainingWindow(current.layout, 0, 0.0, 0.0, None, None)
    sequences = current.sequences - (previous.sequences if previous else 0)
    flops = current.model_flops - (previous.model_flops if previous else 0.0)
    fig = training_step_figures(step_ns, sequences, current.seq, flops, current.ranks,
                                current.peak_flops_per_rank)
    hist = latency.difference(current.step_latency_hist, previous.step_latency_hist if previous else None)
    return TrainingWindow(current.layout, steps, fig.seq_per_s, fig.tokens_per_s, fig.mfu,
                          latency.percentiles(hist))


def _zero_core_counts() -> dict[str, float]:
    counts: dict[str, float] = {"busy_ns": 0, "flops": 0, "executions": 0, "hbm_bytes": 0}
    counts.update({f"e:{e}": 0.0 for e in ENGINES})
    return counts


def _counts(state: ProcessState | None, core: int) -> dict[str, float]:
    if state is None or core not in state.cores:
        return _zero_core_counts()
    c = state.cores[core]
    out: dict[str, float] = {"busy_ns": c.busy_ns, "flops": c.flops, "executions": c.executions,
                             "hbm_bytes": c.hbm_bytes}
    out.update({f"e:{e}": c.engine_busy_ns.get(e, 0.0) for e in ENGINES})
    return out


def window(previous: ProcessState | None, current: ProcessState, cpus: int | None = None) -> ProcessWindow:
    """The window between two samples of one process (``previous`` None: since it started)."""
    cpus = cpus or os.cpu_count() or 1
    if previous is not None and (previous.pid != current.pid or previous.start_time != current.start_time
                                 or previous.sequence > current.sequence):
        previous = None  # another process (pid reuse) or a restarted publisher
    since = previous.sampled_at if previous is not None else current.started_at
    wall_s = max(current.sampled_at - since, 1e-9)
    wall_ns = wall_s * 1e9
    cores = {}
    for index, sample in current.cores.items():
        now, before = _counts(current, index), _counts(previous, index)
        delta = {k: now[k] - before[k] for k in now}
        busy = max(delta["busy_ns"], 0)
        span_ns = max(wall_ns, busy)
        cores[index] = CoreWindow(
            index=index, device=sample.device,
            utilization=100.0 * min(busy, wall_ns) / wall_ns,
            flops=max(delta["flops"], 0) * 1e9 / span_ns,
            engine_busy={e: min(max(delta[f"e:{e}"], 0.0) / span_ns, 1.0) for e in ENGINES},
            executions=int(max(delta["executions"], 0)),
            hbm_bytes_per_s=max(delta["hbm_bytes"], 0) * 1e9 / span_ns)
    status = _delta(current.execution_status, previous.execution_status if previous else None)
    errors = _delta(current.errors, previous.errors if previous else None)
    total = latency.difference(current.total_latency_hist, previous.total_latency_hist if previous else None)
    device = latency.difference(current.device_latency_hist,
                                previous.device_latency_hist if previous else None)
    cpu_user = current.cpu_user_s - (previous.cpu_user_s if previous else 0.0)
    cpu_system = current.cpu_system_s - (previous.cpu_system_s if previous else 0.0)
    links = _delta(current.link_bytes, previous.link_bytes if previous else None)
    return ProcessWindow(
        pid=current.pid, period_s=wall_s, cores=cores, execution_status=status, errors=errors,
        total_latency=latency.percentiles(total), device_latency=latency.percentiles(device),
        vcpu_user=max(cpu_user, 0.0) / wall_s / cpus * 100.0,
        vcpu_system=max(cpu_system, 0.0) / wall_s / cpus * 100.0,
        link_bytes_per_s={k: v / wall_s for k, v in links.items()},
        training=training_window(previous.training if previous else None, current.training))


def _delta(now: Mapping[str, int], before: Mapping[str, int] | None) -> dict[str, int]:
    before = before or {}
    return {k: max(v - before.get(k, 0), 0) for k, v in now.items()}


def repeated(last: ProcessWindow) -> ProcessWindow:
    """The previous window's rates with nothing new: counts zero, no latencies."""
    cores = {i: CoreWindow(c.index, c.device, c.utilization, c.flops, c.engine_busy, 0, c.hbm_bytes_per_s)
             for i, c in last.cores.items()}
    return ProcessWindow(
        pid=last.pid, period_s=last.period_s, cores=cores,
        execution_status=dict.fromkeys(last.execution_status, 0), errors=dict.fromkeys(last.errors, 0),
        total_latency=None, device_latency=None, vcpu_user=last.vcpu_user, vcpu_system=last.vcpu_system,
        link_bytes_per_s=last.link_bytes_per_s,
        training=None if last.training is None else TrainingWindow(
            last.training.layout, 0, last.training.seq_per_s, last.training.tokens_per_s, last.training.mfu,
            None))


class LiveTracker:
    """Successive windows for a reader with its own period: remembers each process's last sample."""

    def __init__(self, cpus: int | None = None) -> None:
        self.cpus = cpus
        self._samples: dict[int, ProcessState] = {}
        self._windows: dict[int, ProcessWindow] = {}

    def prime(self, states: Iterable[ProcessState]) -> None:
        """Take baseline samples without producing windows (a reader's start)."""
        self._samples = {s.pid: s for s in states}

    def advance(self, states: Iterable[ProcessState]) -> dict[int, ProcessWindow]:
        """The window of every process since the previous call; forgets processes that are gone."""
        out: dict[int, ProcessWindow] = {}
        samples: dict[int, ProcessState] = {}
        for state in states:
            before = self._samples.get(state.pid)
            last = self._windows.get(state.pid)
            if (before is not None and last is not None and before.sequence == state.sequence
                    and before.start_time == state.start_time):
                out[state.pid] = repeated(last)
                samples[state.pid] = before
                continue
            out[state.pid] = window(before, state, self.cpus)
            samples[state.pid] = state
        self._samples = samples
        self._windows = {pid: w for pid, w in out.items()}
        return out


__all__ = ["CoreWindow", "LiveTracker", "ProcessWindow", "TrainingWindow", "repeated", "training_window",
           "window"]
