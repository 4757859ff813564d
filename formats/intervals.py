"""Interval unions ("active time", profile-schema §4: ∪ of busy intervals) in bounded memory.

A union needs the intervals in start order. Sorting a whole 10M-row table in SQL costs seconds (a
DuckDB window over 10M rows: ~3 s here), so the summary reads a table in *time slices* -- rows whose
``start_ts`` falls in [a, b), found cheaply through the Parquet row-group statistics -- and sweeps each
slice in NumPy. Slices arrive in time order, so the sweep carries each key's open segment from one
slice to the next and the result is exact whatever the slice boundaries; memory is bounded by one
slice, not by the table.

``UnionAccumulator`` keeps, per integer key (an engine, an (engine, opcode) pair, a DMA class, ...),
the total union length and optionally the merged segments themselves (the ``ActiveTime`` rows).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import duckdb
import numpy as np

from formats.sqlsource import literal


def start_order(start: np.ndarray) -> np.ndarray:
    """Indices sorting ``start``; stable, and cheap on the nearly sorted columns profiles hold
    (timsort merges the sorted runs that row groups and encoder lanes leave)."""
    if start.size < 2 or bool(np.all(start[1:] >= start[:-1])):
        return np.arange(start.size)
    return np.argsort(start, kind="stable")


def key_order(key: np.ndarray, by_start: np.ndarray) -> np.ndarray:
    """Indices sorting rows by (key, start), given an order by start: one stable pass over small
    integer keys (radix sort for 8/16-bit keys)."""
    if key.size == 0:
        return by_start
    keyed = key[by_start]
    if keyed[0] == keyed[-1] and bool(np.all(keyed == keyed[0])):
        return by_start
    if keyed.dtype.itemsize > 2 and int(keyed.max(initial=0)) < 65_536 and int(keyed.min(initial=0)) >= 0:
        keyed = keyed.astype(np.uint16)
    return by_start[np.argsort(keyed, kind="stable")]


class UnionAccumulator:
    """Union length (and merged segments, if kept) per key, over slices fed in start order.

    Feed each slice with ``add(key, start, end)``; every start in a slice must be >= every start of
    the slices before (slices partition time by start). Intervals are half-open [start, end); touching
    intervals merge, as the hierarchy rollups merge them.
    """

    def __init__(self, keep_segments: bool = False) -> None:
        self.keep_segments = keep_segments
        self.open: dict[int, tuple[int, int]] = {}  # key -> (segment start, reach) not yet closed
        self.closed_length: dict[int, int] = {}
        self.overlapped: set[int] = set()  # keys whose intervals overlapped (strictly) in the last add()
        self._segments: list[tuple[int, np.ndarray, np.ndarray]] = []

    def add(self, key: np.ndarray | int, start: np.ndarray, end: np.ndarray,
            order: np.ndarray | None = None) -> None:
        """Fold one slice in. ``key`` is one key for all rows or one per row; ``order`` (optional)
        sorts the rows by (key, start) if the caller already has it."""
        n = start.size
        self.overlapped = set()
        if n == 0:
            return
        if np.isscalar(key) or np.ndim(key) == 0:  # one key: no key column to sort or split by
            if order is None:
                order = start_order(start)
            s, e = start[order].astype(np.int64, copy=False), end[order].astype(np.int64, copy=False)
            self._fold(int(key), s, e)
            return
        else:
            keys = np.asarray(key)
            if order is None:
                order = key_order(keys, start_order(start))
        k = keys[order]
        s, e = start[order].astype(np.int64, copy=False), end[order].astype(np.int64, copy=False)
        if k[0] == k[-1] and (k.size < 3 or bool(np.all(k == k[0]))):
            self._fold(int(k[0]), s, e)
            return
        change = np.flatnonzero(k[1:] != k[:-1]) + 1
        bounds = [0, *change.tolist(), n]
        for a, b in itertools.pairwise(bounds):
            self._fold(int(k[a]), s[a:b], e[a:b])

    def _fold(self, key: int, s: np.ndarray, e: np.ndarray) -> None:
        carried = self.open.get(key)
        if carried is not None and s[0] < carried[0]:  # fed out of order (two adds for one key in a slice)
            s = np.concatenate([np.array([carried[0]], np.int64), s])
            e = np.concatenate([np.array([carried[1]], np.int64), e])
            order = np.argsort(s, kind="stable")
            s, e, carried = s[order], e[order], None
            self.overlapped.add(key)
        reach = np.maximum.accumulate(e)
        new = np.empty(s.size, dtype=bool)
        if carried is not None:  # the open segment from earlier slices comes first
            np.maximum(reach, carried[1], out=reach)
            new[0] = s[0] > carried[1]
        else:
            new[0] = True
        np.greater(s[1:], reach[:-1], out=new[1:])
        if (carried is not None and s[0] < carried[1]) or bool(np.any(s[1:] < reach[:-1])):
            self.overlapped.add(key)
        first = np.flatnonzero(new)
        last = np.empty(first.size, np.int64)
        last[:-1] = first[1:] - 1
        last[-1:] = s.size - 1
        if first.size and first[0] == 0:
            seg_s, seg_e = s[first], reach[last]
        else:  # the first rows extend the carried segment (new[0] is False only when one is carried)
            assert carried is not None
            seg_s = np.concatenate([np.array([carried[0]], np.int64), s[first]])
            seg_e = np.concatenate([reach[[first[0] - 1 if first.size else s.size - 1]], reach[last]])
        if carried is not None and first.size and first[0] == 0:  # carried segment closed before s[0]
            seg_s = np.concatenate([np.array([carried[0]], np.int64), seg_s])
            seg_e = np.concatenate([np.array([carried[1]], np.int64), seg_e])
        self.open[key] = (int(seg_s[-1]), int(seg_e[-1]))
        if seg_s.size > 1:
            closed_s, closed_e = seg_s[:-1], seg_e[:-1]
            self.closed_length[key] = self.closed_length.get(key, 0) + int((closed_e - closed_s).sum())
            if self.keep_segments:
                self._segments.append((key, closed_s, closed_e))

    def add_disjoint(self, key: int, length: int) -> None:
        """Add the union length of intervals known to overlap nothing else of ``key`` (a serial
        engine's instructions of one opcode: their union is their sum, no sweep needed)."""
        self.closed_length[key] = self.closed_length.get(key, 0) + int(length)

    def lengths(self) -> dict[int, int]:
        """Union length per key, open segments included (call after the last slice)."""
        out = dict(self.closed_length)
        for key, (s, e) in self.open.items():
            out[key] = out.get(key, 0) + (e - s)
        return out

    def drain(self, *, include_open: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hand over the closed segments kept so far (and forget them): a caller that writes them as
        it goes keeps memory at one slice's segments. ``include_open`` closes the books (last call):
        the open segments are handed over too."""
        parts = self._segments
        self._segments = []
        if include_open:
            parts = parts + [(k, np.array([v[0]], np.int64), np.array([v[1]], np.int64))
                             for k, v in sorted(self.open.items())]
            for key, (s, e) in self.open.items():
                self.closed_length[key] = self.closed_length.get(key, 0) + (e - s)
            self.open = {}
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        sizes = np.array([p[1].size for p in parts])
        keys = np.repeat(np.array([p[0] for p in parts], np.int64), sizes)
        return keys, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, start, end) of every merged segment (call after the last slice). Ordered by slice,
        then key, then start: time-clustered, which is what row-group pruning wants; sort if needed."""
        parts = list(self._segments)
        parts += [(k, np.array([v[0]], np.int64), np.array([v[1]], np.int64))
                  for k, v in sorted(self.open.items())]
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        sizes = np.array([p[1].size for p in parts])
        keys = np.repeat(np.array([p[0] for p in parts], np.int64), sizes)
        return keys, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


def union_length(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of [start, end) intervals (in memory; for small inputs and tests)."""
    acc = UnionAccumulator()
    acc.add(0, np.asarray(start, np.int64), np.asarray(end, np.int64))
    return acc.lengths().get(0, 0)


def time_slices(files: Sequence[Path], column: str = "start_ts", rows_per_slice: int = 2_000_000
                ) -> list[tuple[int | None, int | None]]:
    """Boundaries [a, b) that split a table into slices of about ``rows_per_slice`` rows by ``column``,
    from the row groups' min statistics (footers only). ``None`` = unbounded. One unbounded slice if
    any row group lacks statistics or a footer cannot be read (then a slice is the whole table:
    correct, just not bounded; the scan that follows reports a damaged file).

    The footers are read by DuckDB's ``parquet_metadata``, not pyarrow's ``Statistics``: building
    those from a damaged footer (a flipped bit in a level histogram or a physical type) throws a C++
    exception pyarrow cannot turn into a Python one, and the process aborts; DuckDB raises an error."""
    if not files:
        return [(None, None)]
    listed = "[" + ", ".join(literal(str(f)) for f in files) + "]"
    try:
        with duckdb.connect() as con:
            found = con.execute(
                f"SELECT file_name, row_group_id, any_value(row_group_num_rows), "
                f"bool_or(path_in_schema = ?), any_value(stats_min) FILTER (WHERE path_in_schema = ?) "
                f"FROM parquet_metadata({listed}) GROUP BY ALL", [column, column]).fetchall()
    except duckdb.Error:
        return [(None, None)]
    groups: list[tuple[int, int]] = []  # (min, rows)
    for _file, _group, rows, has_column, low in found:
        if not has_column:
            return [(None, None)]
        if not rows:
            continue
        try:
            groups.append((int(low), int(rows)))
        except (TypeError, ValueError):  # no statistics, or not an integer column
            return [(None, None)]
    groups.sort()
    cuts: list[int] = []
    rows = 0
    for low, count in groups:
        if rows >= rows_per_slice and (not cuts or low > cuts[-1]):
            cuts.append(low)
            rows = 0
        rows += count
    edges: list[int | None] = [None, *cuts, None]
    return list(itertools.pairwise(edges))


def merge_slices(*slices: list[tuple[int | None, int | None]]) -> list[tuple[int | None, int | None]]:
    """Common boundaries for several tables read together (each table's cuts, all of them)."""
    cuts = sorted({b for table in slices for _, b in table if b is not None})
    edges: list[int | None] = [None, *cuts, None]
    return list(itertools.pairwise(edges))
