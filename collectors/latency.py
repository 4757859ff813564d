"""Latency distributions that any reader can cut into its own windows: cumulative log histograms.

neuron-monitor reports latency percentiles "of the executions finished in this period", and every
reader (neuron-monitor at 5 s, neuron-top at 0.5 s, a bench at 0.1 s) has its own period. Keeping
raw samples would grow with the execution rate; a cumulative histogram with logarithmic buckets has
a fixed size, and the difference of two snapshots is exactly the histogram of the executions
between them. Buckets are 1 % wide, so a reported percentile is within 0.5 % of the true sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

BUCKETS_PER_E = 1.0 / math.log1p(0.01)  # bucket index = round(ln(ns) * this): 1 % wide buckets
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p0", 0.0), ("p1", 0.01), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p99", 0.99), ("p100", 1.0))


def bucket(latency_ns: float) -> int:
    """Histogram bucket of a latency; anything under 1 ns counts as 1 ns."""
    return round(math.log(max(latency_ns, 1.0)) * BUCKETS_PER_E)


def bucket_seconds(index: int) -> float:
    """The value a bucket stands for, in seconds (its centre on the log scale)."""
    return math.exp(index / BUCKETS_PER_E) / 1e9


def difference(newer: Mapping[int, int], older: Mapping[int, int] | None) -> dict[int, int]:
    """Counts added between two cumulative snapshots (a newer publisher restarts from empty)."""
    if not older:
        return {k: v for k, v in newer.items() if v > 0}
    out = {}
    for key, count in newer.items():
        added = count - older.get(key, 0)
        if added > 0:
            out[key] = added
    return out


def percentiles(counts: Mapping[int, int]) -> dict[str, float] | None:
    """neuron-monitor's ``p0``..``p100`` (seconds) of a histogram; None when it is empty.

    Nearest-rank percentiles: pNN is the smallest sample with at least NN % of samples at or below it
    (p0 is the minimum, p100 the maximum), read as its bucket's value.
    """
    total = sum(counts.values())
    if total <= 0:
        return None
    ordered = sorted(counts.items())
    out: dict[str, float] = {}
    for name, q in PERCENTILES:
        rank = max(1, math.ceil(q * total))
        seen = 0
        for index, count in ordered:
            seen += count
            if seen >= rank:
                out[name] = bucket_seconds(index)
                break
    return out


__all__ = ["PERCENTILES", "bucket", "bucket_seconds", "difference", "percentiles"]
