"""Timing a program that several cores run together: the cores held, the collectives placed.

Every multi-core step (tensor-parallel inference, the TP, PP, ZeRO-1 and timing-only training
steps) does the same two things around its schedule: it holds every participating core's lock so
no other execution moves a clock in between, and starts from the latest of their clocks, since
ranks that meet in collectives cannot begin before the slowest is free; then it moves each
collective's template to where the schedule put its node. One place for both keeps the rule the
same for every parallel mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from neuroncore.collectives.record import CollectiveRecord
from neuroncore.runtime.device import NeuronCore
from neuroncore.runtime.scheduler import Timeline


@contextmanager
def cores_held(cores: Sequence[NeuronCore]) -> Iterator[int]:
    """Hold every core's lock (in the order given) and yield the latest of their clocks."""
    for core in cores:
        core.lock.acquire()
    try:
        yield max(core.clock_ns for core in cores)
    finally:
        for core in cores:
            core.lock.release()


def placed_at(timeline: Timeline, templates: Iterable[tuple[Any, CollectiveRecord]]
              ) -> list[tuple[int, CollectiveRecord]]:
    """Each collective template ``(node, record)`` shifted to where ``timeline`` started its node."""
    return [(int(node), template.shifted(float(timeline.start_ns[node]) - template.start_ns))
            for node, template in templates]


__all__ = ["cores_held", "placed_at"]
