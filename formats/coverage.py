"""How busy a timeline row is in each pixel bucket: exact, not a level-of-detail lower bound.

    rows = [RowSelect("Tensor", engines=("Tensor",)), RowSelect("MATMUL", tracks=("TensorMatrix",))]
    cov = busy_buckets(profile, t0, t1, buckets=120, rows=rows)
    cov["Tensor"][i]      # busy fraction of bucket i: |∪ of the row's intervals ∩ bucket| / bucket width

The figure is ``formats.figures``' busy time (docs/figures.md: the union of a row's instruction
intervals clipped to the window, summed over physical cores) cut into equal buckets of [t0, t1), so
``mean(cov[row]) == figures.engine_busy/track_busy(...)[row].fraction`` for the same window and the
buckets of two adjacent windows add up. A zoomed-out view from ``InstructionLod`` (the longest
instruction per bucket) can only say "at least this busy"; this reads every instruction overlapping
the window instead -- in time slices (row groups pruned by their ``start_ts`` statistics, swept in
NumPy by ``formats.intervals``), so memory is one slice, and a 10M-instruction profile costs one scan.

A row is a selection of instructions: canonical ``engines`` (``Tensor`` = the union of the engine's
two timeline rows, LoadStationary ``Tensor`` and MATMUL ``TensorMatrix``) and/or timeline ``tracks``
(``coalesce(timeline_track, engine)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from formats import sqlsource
from formats.intervals import UnionAccumulator, key_order, start_order, time_slices
from formats.sqlsource import TableSource, literal

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = ["RowSelect", "busiest_opcodes", "busy_buckets", "covered_per_bucket"]

ROWS_PER_SLICE = 2_000_000


@dataclass(frozen=True)
class RowSelect:
    """One row of a timeline: the instructions of ``engines`` (canonical names) or of ``tracks``."""

    label: str
    engines: tuple[str, ...] = ()
    tracks: tuple[str, ...] = ()


def covered_per_bucket(start: np.ndarray, end: np.ndarray, t0: int, t1: int, buckets: int) -> np.ndarray:
    """ns covered in each of ``buckets`` equal buckets of [t0, t1) by *disjoint* sorted intervals
    (merged segments): C(x) = covered length before x, and bucket i gets C(edge i+1) - C(edge i)."""
    edges = t0 + (t1 - t0) * np.arange(buckets + 1, dtype=np.float64) / buckets
    if start.size == 0:
        return np.zeros(buckets)
    s = np.clip(start.astype(np.float64), t0, t1)
    e = np.clip(end.astype(np.float64), t0, t1)
    before = np.concatenate([[0.0], np.cumsum(e - s)])  # covered length up to segment i's start
    i = np.searchsorted(s, edges, side="right")  # segments starting at or before each edge
    last = np.maximum(i - 1, 0)
    inside = np.where(i > 0, np.minimum(edges, e[last]) - s[last], 0.0)
    covered = before[last] * (i > 0) + np.maximum(inside, 0.0)
    return np.diff(covered)


def busy_buckets(profile: Profile, t0: int, t1: int, buckets: int, rows: Sequence[RowSelect],
                 con: duckdb.DuckDBPyConnection | None = None) -> dict[str, np.ndarray]:
    """Per row label: the busy fraction of each of ``buckets`` equal buckets of [t0, t1) (Σ over
    physical cores, so a row of two cores can reach 2). Rows with no instructions are all zeros."""
    t0, t1, buckets = int(t0), int(t1), max(1, int(buckets))
    if t1 <= t0:
        raise ValueError(f"empty window: t1 ({t1}) must be after t0 ({t0})")
    out = {row.label: np.zeros(buckets) for row in rows}
    source = TableSource(profile, "Instruction")
    if not source.present or not rows:
        return out
    own = con is None
    con = con or sqlsource.connect(memory_limit="1GB")
    try:
        return _sweep(source, t0, t1, buckets, rows, con, out)
    finally:
        if own:
            con.close()


def _pick_sql(source: TableSource, rows: Sequence[RowSelect]) -> list[str]:
    """One boolean SQL column per row selection (``r0``, ``r1`` ...)."""
    track = f"coalesce({source.col('timeline_track')}, {source.col('engine')})"
    picks = []
    for i, row in enumerate(rows):
        parts = []
        if row.engines:
            parts.append(f"{source.col('engine')} IN ({', '.join(literal(e) for e in row.engines)})")
        if row.tracks:
            parts.append(f"{track} IN ({', '.join(literal(t) for t in row.tracks)})")
        picks.append(f"coalesce({' OR '.join(parts) or 'false'}, false) AS r{i}")
    return picks


def busiest_opcodes(profile: Profile, t0: int, t1: int, rows: Sequence[RowSelect],
                    con: duckdb.DuckDBPyConnection | None = None) -> dict[str, str]:
    """Per row label: the opcode with the most instruction time inside [t0, t1) ("" when idle);
    one grouped scan of the rows overlapping the window."""
    source = TableSource(profile, "Instruction")
    if not source.present or not rows or t1 <= t0:
        return {row.label: "" for row in rows}
    own = con is None
    con = con or sqlsource.connect(memory_limit="1GB")
    try:
        longest = con.execute(f"SELECT max(end_ts - start_ts) FROM {source.relation()}").fetchall()[0][0] or 0
        sums = ", ".join(f"sum(CASE WHEN r{i} THEN d END) AS t{i}" for i in range(len(rows)))
        picks = ", ".join(_pick_sql(source, rows))
        found = con.execute(f"""
            SELECT op, {sums} FROM (
                SELECT {source.col('opcode', engines=False)} AS op,
                       least(end_ts, {int(t1)}) - greatest(start_ts, {int(t0)}) AS d, {picks}
                FROM {source.relation()}
                WHERE start_ts < {int(t1)} AND end_ts > {int(t0)} AND start_ts >= {int(t0) - int(longest)})
            GROUP BY op""").fetchall()
    finally:
        if own:
            con.close()
    out = {}
    for i, row in enumerate(rows):
        best = max(((r[1 + i] or 0, str(r[0])) for r in found if r[0] is not None), default=(0, ""))
        out[row.label] = best[1] if best[0] > 0 else ""
    return out


def _sweep(source: TableSource, t0: int, t1: int, buckets: int, rows: Sequence[RowSelect],
           con: duckdb.DuckDBPyConnection, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pcore = f"coalesce({source.col('pcore_idx')}, 0)"
    picks = _pick_sql(source, rows)  # an instruction may belong to several rows (Tensor ∪ its tracks)
    longest = con.execute(f"SELECT max(end_ts - start_ts) FROM {source.relation()}").fetchall()[0][0] or 0
    where = f"start_ts < {t1} AND end_ts > {t0} AND start_ts >= {t0 - int(longest)}"
    acc = UnionAccumulator(keep_segments=True)
    cores = 1
    for low, high in time_slices(source.files, "start_ts", ROWS_PER_SLICE):
        cond = where
        if low is not None:
            cond += f" AND start_ts >= {int(low)}"
        if high is not None:
            cond += f" AND start_ts < {int(high)}"
        cols = con.execute(f"SELECT start_ts AS s, end_ts AS e, {pcore} AS p, {', '.join(picks)} "
                           f"FROM {source.relation()} WHERE {cond}").fetchnumpy()
        if not len(cols["s"]):
            continue
        s = np.maximum(np.asarray(cols["s"], np.int64), t0)
        e = np.minimum(np.asarray(cols["e"], np.int64), t1)
        core = np.asarray(cols["p"], np.int64)
        cores = max(cores, int(core.max(initial=0)) + 1)
        keys, starts, ends = [], [], []
        for i in range(len(rows)):
            mine = np.asarray(cols[f"r{i}"], bool)
            if mine.any():
                keys.append(i + len(rows) * core[mine])
                starts.append(s[mine])
                ends.append(e[mine])
        if not keys:
            continue
        key, start, end = np.concatenate(keys), np.concatenate(starts), np.concatenate(ends)
        acc.add(key, start, end, key_order(key, start_order(start)))
    key, start, end = acc.segments()
    width = (t1 - t0) / buckets
    for k in np.unique(key).tolist():
        mine = key == k
        order = np.argsort(start[mine], kind="stable")
        covered = covered_per_bucket(start[mine][order], end[mine][order], t0, t1, buckets)
        out[rows[k % len(rows)].label] += covered / width
    return out
