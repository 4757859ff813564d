"""Arithmetic over optional figures: a column that was never filled stays `None`.

Profiles from the real tool leave some columns empty; a total over such rows must say "unknown",
not 0, and a known value must not be lost to an unknown one. The hierarchy, the Summary and the
viewer's trees all fold rows this way, so they share these three.
"""

from __future__ import annotations


def add_known(a: int | None, b: int | None) -> int | None:
    """`a + b`, treating `None` as absent; `None` only when both are."""
    return b if a is None else a if b is None else a + b


def min_known(a: int | None, b: int | None) -> int | None:
    """`min(a, b)`, treating `None` as absent."""
    return b if a is None else a if b is None else min(a, b)


def max_known(a: int | None, b: int | None) -> int | None:
    """`max(a, b)`, treating `None` as absent."""
    return b if a is None else a if b is None else max(a, b)
