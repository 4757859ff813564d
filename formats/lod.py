"""``InstructionLod``: the level of detail behind zoomed-out timelines (``formats.viewport``).

Per engine and level, the longest instruction starting in each time bucket; level 0 buckets are
span / 2^17 wide (at least 1 ns), each level 4x wider, up to ~256 buckets over the span. The table's
size is bounded by the bucket count, not by the profile: a few hundred thousand rows for 20M or 2G
instructions alike.

Level 0 is reduced slice by slice from rows sorted by (engine, start) -- the order the summary's sweep
already has -- with O(n) NumPy passes (``np.maximum.reduceat``), so a capture's close builds it from
the slices it reads anyway, with no extra scan and no SQL hash table (a DuckDB ``GROUP BY engine,
bucket`` with ``arg_max`` states held ~300 MB on 5M rows). Buckets cut by a slice boundary are merged
at the end; the coarser levels come from level 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa

from formats import sqlsource
from formats.intervals import key_order, start_order, time_slices
from formats.schema import ENGINE_NAMES, SCHEMA, canonical_engine
from formats.sqlsource import TableSource, literal

if TYPE_CHECKING:
    from formats.reader import Profile

LOD_TABLE = "InstructionLod"
LOD_FINEST_BUCKETS = 2**17
LOD_FACTOR = 4
LOD_COARSEST_BUCKETS = 256
ENGINE_LABELS = [*ENGINE_NAMES, "Other"]  # codes 0..4 canonical engines, 5 anything else


def lod_geometry(first: int, last: int) -> tuple[int, list[int]]:
    """(origin, bucket width per level) for a time range."""
    span = max(1, int(last) - int(first))
    width = max(1, math.ceil(span / LOD_FINEST_BUCKETS))
    widths = [width]
    while span / widths[-1] > LOD_COARSEST_BUCKETS:
        widths.append(widths[-1] * LOD_FACTOR)
    return int(first), widths


class LodBuilder:
    """Level-0 buckets fed slice by slice; ``table()`` merges them and adds the coarser levels.

    ``opcodes``: names of the opcode codes passed to ``add`` (code i -> ``opcodes[i]``).
    """

    def __init__(self, first: int, last: int, opcodes: list[str]) -> None:
        self.origin, self.widths = lod_geometry(first, last)
        self.opcodes = list(opcodes)
        self._parts: list[dict[str, np.ndarray]] = []

    def add(self, engine: np.ndarray, opcode: np.ndarray, ids: np.ndarray, start: np.ndarray,
            end: np.ndarray) -> None:
        """One slice, rows grouped by engine code and sorted by start within each group. Kept per
        bucket in compact types (~35 bytes; the end is start + duration)."""
        n = start.size
        if n == 0:
            return
        bucket = (start - self.origin) // self.widths[0]
        duration = end - start
        change = np.empty(n, dtype=bool)
        change[0] = True
        np.not_equal(engine[1:], engine[:-1], out=change[1:])
        change[1:] |= bucket[1:] != bucket[:-1]
        bounds = np.flatnonzero(change)
        longest = np.maximum.reduceat(duration, bounds)
        sizes = np.diff(np.append(bounds, n))
        hits = np.flatnonzero(duration == np.repeat(longest, sizes))
        group = np.searchsorted(bounds, hits, side="right") - 1
        first_hit = hits[np.flatnonzero(np.r_[True, group[1:] != group[:-1]])]
        self._parts.append({"g": engine[bounds].astype(np.int8), "b": bucket[bounds].astype(np.int32),
                            "s": start[first_hit], "d": longest.astype(np.int64), "i": ids[first_hit],
                            "o": opcode[first_hit].astype(np.int32), "n": sizes.astype(np.int32)})

    def table(self) -> pa.Table:
        """Level 0 merged across slice boundaries, then each coarser level from the one below (4x
        fewer rows each time, so the whole costs about twice level 0); one table, a chunk per level."""
        schema = SCHEMA.arrow_schema(LOD_TABLE)
        if not self._parts:
            return schema.empty_table()
        current = {k: np.concatenate([p[k] for p in self._parts]) for k in self._parts[0]}
        self._parts = []
        chunk_schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())
                                           if f.name in ("engine", "opcode") else f.type) for f in schema])
        tables = []
        for level, width in enumerate(self.widths):
            if level:
                current["b"] = current["b"] // LOD_FACTOR
            current = _longest_per_key(current)
            tables.append(self._level_table(current, level, width).cast(chunk_schema))
        return pa.concat_tables(tables).select(schema.names)

    def _level_table(self, rows: dict[str, np.ndarray], level: int, width: int) -> pa.Table:
        start, duration = rows["s"], rows["d"]
        engine = pa.DictionaryArray.from_arrays(pa.array(rows["g"].astype(np.int32)), pa.array(ENGINE_LABELS))
        return pa.table({
            "engine": engine, "level": pa.array(np.full(start.size, level, np.int32)),
            "bucket_ts": pa.array(self.origin + rows["b"].astype(np.int64) * width),
            "bucket_width_ns": pa.array(np.full(start.size, width, np.int64)),
            "start_ts": pa.array(start), "end_ts": pa.array(start + duration),
            "duration_ns": pa.array(duration), "id": pa.array(rows["i"]),
            "opcode": pa.DictionaryArray.from_arrays(pa.array(rows["o"]), pa.array(self.opcodes)),
            "count": pa.array(rows["n"].astype(np.int64)),
        })


def _longest_per_key(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per (engine, bucket): the longest, with the counts added."""
    order = np.lexsort((-rows["d"], rows["b"], rows["g"]))
    g, b = rows["g"][order], rows["b"][order]
    head = np.empty(order.size, dtype=bool)
    head[:1] = True
    head[1:] = (g[1:] != g[:-1]) | (b[1:] != b[:-1])
    pick = order[head]
    out = {k: v[pick] for k, v in rows.items() if k != "n"}
    out["n"] = np.add.reduceat(rows["n"][order].astype(np.int64), np.flatnonzero(head))
    return out


def build_lod(profile: Profile, con: duckdb.DuckDBPyConnection | None = None,
              rows_per_slice: int = 2_000_000) -> pa.Table:
    """``InstructionLod`` rows for a profile that has none (the real tool's): its own sliced scan."""
    source = TableSource(profile, "Instruction")
    if not source.present:
        return SCHEMA.arrow_schema(LOD_TABLE).empty_table()
    own = con is None
    con = con or sqlsource.connect(memory_limit="512MB")
    try:
        rows = con.execute(f"SELECT engine, opcode, min(start_ts), max(end_ts) FROM {source.relation()} "
                           f"GROUP BY ALL").fetchall()
        engines = sorted({str(r[0]) for r in rows})
        opcodes = ["?", *sorted({str(r[1]) for r in rows})]
        builder = LodBuilder(min(r[2] for r in rows), max(r[3] for r in rows), opcodes)
        codes = np.array([len(ENGINE_NAMES)] + [ENGINE_NAMES.index(canonical_engine(e))  # type: ignore[arg-type]
                                                if canonical_engine(e) in ENGINE_NAMES else len(ENGINE_NAMES)
                                                for e in engines], np.int64)
        listed = ", ".join(literal(e) for e in engines)
        ops = ", ".join(literal(o) for o in opcodes[1:])
        for low, high in time_slices(source.files, "start_ts", rows_per_slice):
            conditions = [c for c in (None if low is None else f"start_ts >= {int(low)}",
                                      None if high is None else f"start_ts < {int(high)}") if c]
            where = "WHERE " + " AND ".join(conditions) if conditions else ""
            cols = con.execute(f"""
                SELECT coalesce(list_position([{listed}], engine), 0)::UTINYINT AS g,
                       coalesce(list_position([{ops}], opcode), 0)::USMALLINT AS o, id, start_ts, end_ts
                FROM {source.relation()} {where}""").fetchnumpy()
            start = np.asarray(cols["start_ts"], np.int64)
            engine = codes[np.asarray(cols["g"])]
            order = key_order(engine, start_order(start))
            builder.add(engine[order], np.asarray(cols["o"])[order], np.asarray(cols["id"], np.int64)[order],
                        start[order], np.asarray(cols["end_ts"], np.int64)[order])
        return builder.table()
    finally:
        if own:
            con.close()
