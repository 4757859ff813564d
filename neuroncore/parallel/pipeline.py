"""The 1F1B pipeline schedule, shared by the pipeline-parallel step that runs real numerics
(:mod:`neuroncore.parallel.pp_train`) and the profiled step programs of the training workloads
(:mod:`neuroncore.parallel.train_step`): which forward or backward each stage runs in which order.

1F1B (Narayanan et al. 2021, Megatron-LM and NxD's default): stage s of P runs ``P - s - 1`` warm-up
forwards, then alternates one forward and one backward, then drains its remaining backwards, so a
stage holds at most ``P - s`` micro-batches' activations and the bubble is ``(P - 1) / (M + P - 1)``
of the step for M micro-batches.
"""

from __future__ import annotations

import enum


class Pass(enum.Enum):
    """What one slot of a stage's 1F1B schedule runs."""

    FORWARD = "F"
    BACKWARD = "B"


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[Pass, int]]:
    """Stage ``stage``'s 1F1B order: warm-up forwards, one forward / one backward, the drain."""
    warm = min(stages - stage - 1, micro_batches)
    order = [(Pass.FORWARD, k) for k in range(warm)]
    for k in range(micro_batches - warm):
        order += [(Pass.FORWARD, warm + k), (Pass.BACKWARD, k)]
    order += [(Pass.BACKWARD, k) for k in range(micro_batches - warm, micro_batches)]
    return order


def execution_order(stages: int, micro_batches: int) -> list[tuple[int, Pass, int]]:
    """Every stage's slots ``(stage, pass, micro-batch)`` in an order that respects the pipeline's
    dependencies (a forward after the previous stage's forward of its micro-batch, a backward
    after the next stage's backward of it): the order their sends happen in."""
    orders = [one_f_one_b(s, stages, micro_batches) for s in range(stages)]
    cursor = [0] * stages
    done: set[tuple[int, Pass, int]] = set()
    out: list[tuple[int, Pass, int]] = []
    while len(out) < sum(map(len, orders)):
        progressed = False
        for s in range(stages):
            if cursor[s] == len(orders[s]):
                continue
            kind, k = orders[s][cursor[s]]
            if kind is Pass.FORWARD:
                ready = s == 0 or (s - 1, Pass.FORWARD, k) in done
            else:
                ready = (s, Pass.FORWARD, k) in done and (
                    s == stages - 1 or (s + 1, Pass.BACKWARD, k) in done)
            if ready:
                done.add((s, kind, k))
                out.append((s, kind, k))
                cursor[s] += 1
                progressed = True
        if not progressed:  # cannot happen for 1F1B; a guard against an infinite loop
            raise RuntimeError("the 1F1B schedule stalled")
    return out


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The layers stage ``stage`` holds: contiguous, the first ``layers % stages`` stages one more."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


__all__ = ["Pass", "execution_order", "one_f_one_b", "stage_layers"]
