"""Running counts per stream over a program's nodes, in node order: each node's position in its
stream (``Program.pc``) and each producer's semaphore value (``Program.sem_value``).

Both are a counter per key advanced node by node. NumPy makes them with a stable sort of the
keys, a cumulative sum and scatters over every node (``*_sorted``, the plain definition); a big
prefill assembles tens of millions of nodes (Llama-3-70B trn1 tp32 b4 2,048 tokens: 11.4 M), where
those passes cost ~0.3 CPU s each. A program of ``LOOP_MIN_NODES`` or more nodes takes one
compiled loop instead (``*_loop``, numba, imported only then: a small compile never loads it),
the same arrays (docs/execution-core.md "Compile speed"; ``tests/neuroncore/test_compile_speed.py``
compares both).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

LOOP_MIN_NODES = 1 << 20  # a program this large counts in one compiled loop

_loops: dict[str, Any] = {}


def _positions(keys: np.ndarray, lo: int, n_keys: int) -> np.ndarray:  # pragma: no cover (numba)
    counts = np.zeros(n_keys, np.int64)
    out = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        k = keys[i] - lo
        out[i] = counts[k]
        counts[k] += 1
    return out


def _values(sem: np.ndarray, dma: np.ndarray, dma_step: int, lo: int,
            n_keys: int) -> np.ndarray:  # pragma: no cover (numba)
    running = np.zeros(n_keys, np.int64)
    out = np.zeros(len(sem), np.int32)
    for i in range(len(sem)):
        s = sem[i]
        if s >= 0:
            k = s - lo
            running[k] += dma_step if dma[i] else 1
            out[i] = running[k]
    return out


def _compiled(name: str) -> Any:
    """The loop ``name`` compiled by numba (or loaded from its cache) on first use."""
    loop = _loops.get(name)
    if loop is None:
        from numba import njit  # only big programs pay for the import

        loop = _loops[name] = njit(cache=True, nogil=True)({"positions": _positions, "values": _values}[name])
    return loop


def stream_positions(keys: np.ndarray) -> np.ndarray:
    """Each node's position among the earlier nodes with its key (int64)."""
    if len(keys) < LOOP_MIN_NODES:
        return stream_positions_sorted(keys)
    return stream_positions_loop(keys)


def stream_positions_sorted(keys: np.ndarray) -> np.ndarray:
    """``stream_positions`` by a stable sort of the keys (16-bit keys: a radix sort)."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    bounds = [0, *(np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1).tolist(), len(keys)]
    del sorted_keys
    positions = np.empty(len(order), np.int64)
    for a, b in pairwise(bounds):  # each stream's nodes, in program order
        positions[order[a:b]] = np.arange(b - a)
    return positions


def stream_positions_loop(keys: np.ndarray) -> np.ndarray:
    """``stream_positions`` in one compiled loop."""
    if not len(keys):
        return np.zeros(0, np.int64)
    lo, hi = int(keys.min()), int(keys.max())
    return _compiled("positions")(keys, lo, hi - lo + 1)


def semaphore_values(sem_increment: np.ndarray, dma: np.ndarray, dma_step: int) -> np.ndarray:
    """Each producer's (``sem_increment >= 0``) running count on its semaphore in node order, a
    DMA transfer (``dma``) counting ``dma_step``, any other node 1; 0 for the other nodes (int32)."""
    if len(sem_increment) < LOOP_MIN_NODES:
        return semaphore_values_sorted(sem_increment, dma, dma_step)
    return semaphore_values_loop(sem_increment, dma, dma_step)


def semaphore_values_sorted(sem_increment: np.ndarray, dma: np.ndarray, dma_step: int) -> np.ndarray:
    """``semaphore_values`` by a stable sort of the producers by semaphore (16-bit keys: a radix
    sort) and a cumulative sum per semaphore."""
    producers = np.flatnonzero(sem_increment >= 0)
    sems = sem_increment[producers]
    steps = np.where(dma[producers], dma_step, 1).astype(np.int64)
    order = np.argsort(sems, kind="stable")
    running = np.cumsum(steps[order])
    grouped = sems[order]
    group_start = np.empty(len(order), bool)
    group_start[:1] = True
    np.not_equal(grouped[1:], grouped[:-1], out=group_start[1:])
    base = np.maximum.accumulate(np.where(group_start, running - steps[order], 0))
    sem_value = np.zeros(len(sem_increment), np.int32)
    sem_value[producers[order]] = (running - base).astype(np.int32)
    return sem_value


def semaphore_values_loop(sem_increment: np.ndarray, dma: np.ndarray, dma_step: int) -> np.ndarray:
    """``semaphore_values`` in one compiled loop."""
    producing = sem_increment[sem_increment >= 0]
    if not len(producing):
        return np.zeros(len(sem_increment), np.int32)
    lo, hi = int(producing.min()), int(producing.max())
    return _compiled("values")(sem_increment, dma, dma_step, lo, hi - lo + 1)
