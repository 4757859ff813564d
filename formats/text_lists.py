"""The schema's list-valued text columns, read and written in one place.

Many list-like columns are text, not Parquet lists (profile-schema §2.4): ``FrameworkNode.children_ids``
and ``Instruction.stack_frame_ids`` (``[101, 102, 103]``), ``time_intervals`` (``[[1, 10], [20, 50]]``),
the other ``FrameworkNode`` lists (``[1024, 2048, 512]``). A profile from another tool, or a damaged
one, can hold anything there, so the readers never raise on a bad element: they skip it and *count*
it, and the views say "N malformed ids skipped" instead of dying or hiding the loss.

Readers accept the text form and, leniently, a real list (a writer that used a Parquet list column).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_INTEGER = re.compile(r"-?[0-9]+")
Intervals = npt.NDArray[np.int64]  # shape (n, 2): start, end


@dataclass(frozen=True)
class IdList:
    """The integers of one id list and how many of its elements were not integers (skipped)."""

    ids: tuple[int, ...] = ()
    malformed: int = 0


@dataclass(frozen=True)
class IntervalList:
    """The ``[start, end]`` pairs of one ``time_intervals`` value; ``malformed`` is 1 when the value
    could not be read at all (then ``spans`` is empty) -- the value is one unit, not per element."""

    spans: Intervals
    malformed: int = 0

    @property
    def union_ns(self) -> int:
        """Total length of the union of the spans (overlaps count once)."""
        return union_length(self.spans)


def _as_int(value: object) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value)
    return None


def parse_ids(value: object) -> IdList:
    """An id list (``"[1, 2, 3]"``, or a list) as integers; elements that are not integers (``x``,
    ``1.5``, ``null``, an empty slot in ``[1,,2]``) are skipped and counted. ``None``, ``""`` and
    ``"[]"`` are the empty list. A value that is neither text nor a list counts as one malformed."""
    if value is None:
        return IdList()
    if isinstance(value, str):
        body = value.strip()
        if body.startswith("["):
            body = body[1:]
        if body.endswith("]"):
            body = body[:-1]
        if not body.strip():
            return IdList()
        parts: Sequence[object] = body.split(",")
    elif isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        parts = list(value)
    else:
        return IdList((), 1)
    ids: list[int] = []
    bad = 0
    for part in parts:
        number = _as_int(part)
        if number is None:
            bad += 1
        else:
            ids.append(number)
    return IdList(tuple(ids), bad)


def parse_intervals(value: object) -> IntervalList:
    """``time_intervals`` (``"[[1, 10], [20, 50]]"``, or a list of pairs) as an (n, 2) int64 array.
    Anything else -- bad JSON, a pair that is not two integers -- is one malformed value, no spans."""
    empty = np.zeros((0, 2), np.int64)
    if value is None or (isinstance(value, str) and not value.strip()):
        return IntervalList(empty)
    try:
        loaded = json.loads(value) if isinstance(value, str) else value
        if not isinstance(loaded, (list, tuple, np.ndarray)):
            raise ValueError("not a list")
        pairs: list[tuple[int, int]] = []
        for pair in loaded:
            if len(pair) != 2:
                raise ValueError("not a pair")
            start, end = (_as_int(v) for v in pair)
            if start is None or end is None:
                raise ValueError("not integers")
            pairs.append((start, end))
    except (ValueError, TypeError):
        return IntervalList(empty, 1)
    return IntervalList(np.asarray(pairs, np.int64).reshape(-1, 2))


def union_length(spans: Intervals) -> int:
    """Total length of the union of (n, 2) spans: touching or overlapping spans count once."""
    total, reach = 0, None
    for a, b in sorted((int(s), int(e)) for s, e in spans):
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def format_list(values: Sequence[object]) -> str:
    """The writer's text list: ``[1024, 2048]`` / ``[a, b]``; ``None`` is written ``null``."""
    return "[" + ", ".join("null" if v is None else str(v) for v in values) + "]"


def format_intervals(starts: Sequence[int], ends: Sequence[int]) -> str:
    """The writer's ``time_intervals`` text: ``[[s, e], [s, e]]``."""
    return "[" + ", ".join(f"[{s}, {e}]" for s, e in zip(starts, ends)) + "]"
