"""Levels of detail: what a zoomed-out timeline row draws, and the one rule that picks it.

A timeline never draws 20M rectangles; per pixel bucket it draws **the event with the largest rank
starting in the bucket** (events that began before the window go to its first bucket), with the
number of events there -- Perfetto's rule for zoomed-out tracks. The rank is, everywhere (DuckDB
queries, NumPy reductions, the stored table)::

    rank = duration_ns * 2**20 + (id mod 2**20)        # rank() / rank_sql()

the longest event; between equally long ones the larger id (compared modulo 2^20: the ids of one
bucket's events are that close). Packing both into one int64 keeps DuckDB's ``arg_max`` on a plain
integer (6x faster than a struct key) and makes the start, id and attributes of a bucket come from
the same event.

A level of detail (``SpanLod``) holds, per row key and level, the event of largest rank starting in
each bucket, with the count of events there and (when built from the events) the time they cover
and how far they reach, so busy time per pixel is known zoomed out too. Widths grow 4x per level.
Its size is bounded by the bucket count, not by the profile. Sources of one:

* ``formats.tracks.build_span_lod`` -- any span table, one DuckDB aggregate in time slices;
* the stored ``InstructionLod`` table (``lod_from_table``), per canonical engine: written when a
  capture closes (``LodBuilder``, fed by the summary's sweep) or built from the events for a profile
  without it (``build_lod``). A viewer reads it through ``formats.tracks.TrackViewport`` only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import sqlsource
from formats.figures import busy_per_bucket
from formats.intervals import key_order, start_order, time_slices
from formats.schema import ENGINE_NAMES, SCHEMA, canonical_engine
from formats.sqlsource import TableSource, literal

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = [
    "LOD_BUCKETS", "LOD_FACTOR", "LOD_MAX_BUCKETS", "LOD_PER_PIXEL", "LOD_TABLE", "TIE", "LodBuilder",
    "SpanLod", "SpanWindow", "bucket_of", "bucket_sql", "build_lod", "empty_window", "lod_buckets",
    "lod_from_table", "lod_geometry",
    "lod_widths", "longest_per_bucket", "longest_sorted", "rank", "rank_sql",
]

LOD_TABLE = "InstructionLod"
LOD_FACTOR = 4  # each level's buckets are this many times wider than the one below
LOD_PER_PIXEL = 2  # LOD buckets per pixel at least: a bucket straddling pixels leaves few holes
# the stored InstructionLod: level 0 is span / 2^17 wide, up to ~256 buckets over the span
LOD_FINEST_BUCKETS = 2**17
LOD_COARSEST_BUCKETS = 256
# an in-memory SpanLod of a table
LOD_BUCKETS = 2**15  # level-0 buckets over a table's span, at least ...
LOD_MAX_BUCKETS = 2**18  # ... and at most (memory: ~60 bytes per bucket and key, all levels)
LOD_EVENTS_PER_BUCKET = 32  # between the two, about this many events (of all keys) per level-0 bucket
LOD_COARSEST = 64
LOD_SLICE_ROWS = 8_000_000  # a table's build aggregates this many rows at a time (bounded hash table)
TIE = 1 << 20  # the rank's tie-break factor
ENGINE_LABELS = [*ENGINE_NAMES, "Other"]  # stored engine codes 0..4 canonical engines, 5 anything else


# -- the rule -----------------------------------------------------------------------------------


def rank(duration: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rank of each event (see the module docstring): the largest is drawn."""
    ids = np.mod(ids.astype(np.int64, copy=False), TIE)
    ranks: np.ndarray = duration.astype(np.int64, copy=False) * TIE + ids
    return ranks


def rank_sql(duration: str, ident: str) -> str:
    """``rank`` as a DuckDB expression over SQL expressions for the duration and the id."""
    return f"(({duration}) * {TIE} + (({ident}) % {TIE}))"


_INT64_LIMIT = 2**63


def bucket_of(offsets: np.ndarray, width: int, buckets: int) -> np.ndarray:
    """The pixel bucket of each time offset from a window's start: ``offset * buckets // width``
    clamped to [0, buckets) -- events before the window go to bucket 0. Exact integer arithmetic
    that never overflows int64: offsets are clamped to [-1, width] first, and a window so wide that
    ``width * buckets`` leaves int64 is divided with Python integers (one per drawn event)."""
    d = np.clip(np.asarray(offsets, np.int64), -1, width)
    if width * buckets < _INT64_LIMIT:
        scaled = d * buckets // width
    else:
        scaled = np.array([int(v) * buckets // width for v in d.tolist()], np.int64).reshape(d.shape)
    result: np.ndarray = np.clip(scaled, 0, buckets - 1).astype(np.int64, copy=False)
    return result


def bucket_sql(offset: str, width: int, buckets: int) -> str:
    """``bucket_of`` as a DuckDB expression over the SQL expression ``offset`` (a time minus the
    window's start): the same clamps, and 128-bit (HUGEINT) products when ``width * buckets`` leaves
    int64, so a wide window is never an ``Overflow in multiplication of INT64`` error."""
    clamped = f"least(greatest({offset}, -1), {width})"
    product = (f"{clamped} * {buckets}" if width * buckets < _INT64_LIMIT
               else f"CAST({clamped} AS HUGEINT) * {buckets}")
    return f"CAST(least({buckets - 1}, greatest(0, {product} // {width})) AS BIGINT)"


def longest_sorted(rows: dict[str, np.ndarray], bucket: np.ndarray) -> dict[str, np.ndarray]:
    """One row per value of ``bucket`` (non-decreasing): the one of largest rank, counts added (and
    covered time added, reaches maxed, when present) -- in O(n) passes (``reduceat``), no sort.
    ``rows`` holds ``start_ts``, ``end_ts``, ``id``, ``count`` and any per-row columns."""
    n = bucket.size
    if n == 0:
        return {**rows, "b": bucket}
    head = np.empty(n, bool)
    head[0] = True
    np.not_equal(bucket[1:], bucket[:-1], out=head[1:])
    starts = np.flatnonzero(head)
    ranks = rank(rows["end_ts"] - rows["start_ts"], rows["id"])
    best = np.maximum.reduceat(ranks, starts)
    group = np.cumsum(head) - 1
    hits = np.flatnonzero(ranks == best[group])
    first = hits[np.r_[True, group[hits][1:] != group[hits][:-1]]]
    out = {k: v[first] for k, v in rows.items()}
    out["b"] = bucket[first]
    out["count"] = np.add.reduceat(rows["count"], starts)
    if "covered" in rows:
        out["covered"] = np.add.reduceat(rows["covered"], starts)
        out["reach"] = np.maximum.reduceat(rows["reach"], starts)
    return out


# -- windows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanWindow:
    """The events to draw for one row: one (largest rank) per non-empty pixel bucket, in bucket order."""

    bucket: np.ndarray
    start_ts: np.ndarray
    end_ts: np.ndarray
    id: np.ndarray
    count: np.ndarray  # events starting in the bucket (raw path: overlapping the window, clamped)
    attrs: dict[str, np.ndarray]  # attribute -> object array of str (None where null)
    source: str  # "events" or "lod level N"
    # per pixel bucket of the window (every bucket, not only those with an event): the fraction of
    # it the row is busy, 0..1 (``formats.figures.busy_per_bucket``); None from a source that has no
    # busy time (the stored InstructionLod)
    busy: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.bucket.size)

    @property
    def duration_ns(self) -> np.ndarray:
        duration: np.ndarray = self.end_ts - self.start_ts
        return duration


def empty_window(source: str, attrs: Sequence[str] = ()) -> SpanWindow:
    empty = np.zeros(0, np.int64)
    return SpanWindow(empty, empty, empty, empty, empty, {a: np.zeros(0, object) for a in attrs}, source)


def longest_per_bucket(bucket: np.ndarray, cols: dict[str, np.ndarray], source: str) -> SpanWindow:
    """Per bucket (any order) the event of largest rank, counts added. ``cols``: ``start_ts``,
    ``end_ts``, ``id``, ``count`` and attributes as ``a:<name>``."""
    ranks = rank(cols["end_ts"] - cols["start_ts"], cols["id"])
    if bucket.size and bool(np.all(bucket[1:] >= bucket[:-1])):
        # already in bucket order (a level of detail's rows are): O(n) passes, no sort
        head = np.r_[True, bucket[1:] != bucket[:-1]]
        heads = np.flatnonzero(head)
        group = np.cumsum(head) - 1
        hits = np.flatnonzero(ranks == np.maximum.reduceat(ranks, heads)[group])
        pick = hits[np.r_[True, group[hits][1:] != group[hits][:-1]]]
        counts = np.add.reduceat(cols["count"], heads)
    else:
        order = np.lexsort((-ranks, bucket))
        b = bucket[order]
        head = np.r_[True, b[1:] != b[:-1]] if b.size else np.zeros(0, bool)
        pick = order[head]
        heads = np.flatnonzero(head)
        counts = np.add.reduceat(cols["count"][order], heads) if b.size else np.zeros(0, np.int64)
    attrs = {k[2:]: v[pick] for k, v in cols.items() if k.startswith("a:")}
    return SpanWindow(bucket[pick], cols["start_ts"][pick], cols["end_ts"][pick], cols["id"][pick],
                      counts.astype(np.int64), attrs, source)


# -- geometry -----------------------------------------------------------------------------------


def lod_widths(first: int, last: int, finest_buckets: int, coarsest_buckets: int) -> list[int]:
    """Bucket width per level over [first, last]: ``finest_buckets`` at level 0, 4x wider per level
    until at most ``coarsest_buckets`` cover the span."""
    span = max(1, int(last) - int(first))
    widths = [max(1, math.ceil(span / finest_buckets))]
    while span / widths[-1] > coarsest_buckets:
        widths.append(widths[-1] * LOD_FACTOR)
    return widths


def lod_geometry(first: int, last: int) -> tuple[int, list[int]]:
    """(origin, bucket width per level) of the stored ``InstructionLod`` for a time range."""
    return int(first), lod_widths(first, last, LOD_FINEST_BUCKETS, LOD_COARSEST_BUCKETS)


def lod_buckets(rows: int) -> int:
    """Level-0 buckets of a table's ``SpanLod`` for ``rows`` events: about ``LOD_EVENTS_PER_BUCKET``
    per bucket, so a window too narrow for the LOD holds few enough events to read them directly,
    whatever the table's size (within [LOD_BUCKETS, LOD_MAX_BUCKETS])."""
    wanted = 2 ** math.ceil(math.log2(max(1, rows / LOD_EVENTS_PER_BUCKET)))
    return int(min(LOD_MAX_BUCKETS, max(LOD_BUCKETS, wanted)))


# -- the level of detail ------------------------------------------------------------------------


@dataclass
class SpanLod:
    """Per key and level, the event of largest rank starting in each bucket (arrays sorted by bucket
    start). Built whole, then only read: a ``TrackViewport`` installs a finished one and never
    changes it, so readers on other threads need no lock."""

    origin: int
    widths: list[int]
    levels: dict[tuple[Any, ...], list[dict[str, np.ndarray]]] = field(default_factory=dict)
    max_duration: dict[tuple[Any, ...], int] = field(default_factory=dict)
    # attribute -> its distinct values; levels hold int32 codes into them (-1: null), so millions of
    # buckets cost 4 bytes per attribute, not a Python string each
    dictionaries: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def finest(self) -> int:
        return self.widths[0]

    def serves(self, t0: int, t1: int, buckets: int) -> bool:
        """True when a pixel of this window holds at least ``LOD_PER_PIXEL`` finest buckets."""
        return (t1 - t0) / max(1, buckets) >= self.finest * LOD_PER_PIXEL

    def window(self, key: tuple[Any, ...], t0: int, t1: int, buckets: int) -> SpanWindow | None:
        """None when a pixel is narrower than ``LOD_PER_PIXEL`` finest buckets (the caller reads the
        events); an empty window for a key without events."""
        entries = self.levels.get(key)
        pixel = (t1 - t0) / buckets
        usable = [i for i, w in enumerate(self.widths) if w * LOD_PER_PIXEL <= pixel]
        if not usable:
            return None
        if entries is None:
            return empty_window(f"lod level {usable[-1]}")
        level = usable[-1]
        part = entries[level]
        width = self.widths[level]
        lo = np.searchsorted(part["bucket_ts"], t0 - self.max_duration.get(key, 0) - width, "left")
        hi = np.searchsorted(part["bucket_ts"], t1, "left")
        keep = (part["reach"] if "reach" in part else part["end_ts"])[lo:hi] > t0
        cols = {k: v[lo:hi][keep] for k, v in part.items()}
        bucket = bucket_of(cols["start_ts"] - t0, t1 - t0, buckets)
        window = longest_per_bucket(bucket, cols, f"lod level {level}")
        if "covered" in cols:
            window = replace(window, busy=busy_per_bucket(cols["bucket_ts"], width, cols["covered"],
                                                          cols["reach"], t0, t1, buckets))
        for name, codes in window.attrs.items():
            values = self.dictionaries[name]  # one more entry at the end: None, for code -1
            window.attrs[name] = values[np.where(codes < 0, values.size - 1, codes)]
        return window


def codes_of(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """(int32 codes, distinct values) of a column; nulls get code -1."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    encoded = pc.dictionary_encode(array)
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, encoded.dictionary.to_pylist()


def recode(lod: SpanLod, attr: str, codes: np.ndarray, values: list[Any]) -> np.ndarray:
    """Codes into ``lod.dictionaries[attr]``, extending it with values it lacks (codes already in
    the levels stay valid: the dictionary only grows at its end, before the trailing None)."""
    known = lod.dictionaries.get(attr)
    table = [] if known is None else list(known[:-1])
    index = {v: i for i, v in enumerate(table)}
    mapping = np.empty(len(values), np.int32)
    for j, value in enumerate(values):
        if value not in index:
            index[value] = len(table)
            table.append(value)
        mapping[j] = index[value]
    lod.dictionaries[attr] = np.array([*table, None], dtype=object)
    return np.where(codes < 0, -1, mapping[np.maximum(codes, 0)] if mapping.size else -1).astype(np.int32)


def lod_from_table(table: pa.Table) -> SpanLod | None:
    """The stored ``InstructionLod`` as a ``SpanLod`` keyed by ``(canonical engine,)`` ("" for an
    engine of no canonical name), with ``opcode`` as its attribute; None when the table is empty or
    its levels are not 4x apart. The only reader of the stored table."""
    if table.num_rows == 0:
        return None
    level = table.column("level").to_numpy()
    widths_found = {int(lv): int(w) for lv, w in zip(level.tolist(),
                                                     table.column("bucket_width_ns").to_numpy().tolist())}
    widths = [widths_found[lv] for lv in sorted(widths_found)]
    if sorted(widths_found) != list(range(len(widths))) or any(
            b != a * LOD_FACTOR for a, b in itertools.pairwise(widths)):
        return None
    bucket_ts = table.column("bucket_ts").to_numpy().astype(np.int64)
    lod = SpanLod(int(bucket_ts[level == 0].min()), widths)
    engine_codes, engine_values = codes_of(table.column("engine"))
    canonical = np.asarray([canonical_engine(v) or "" if v is not None else "" for v in engine_values] + [""],
                           dtype=object)
    engines = canonical[np.where(engine_codes < 0, len(engine_values), engine_codes)]
    codes, values = codes_of(table.column("opcode"))
    opcode = recode(lod, "opcode", codes, values)
    columns = {name: table.column(name).to_numpy().astype(np.int64)
               for name in ("bucket_ts", "start_ts", "end_ts", "id", "count")}
    for engine in sorted(set(engines.tolist())):
        mine = engines == engine
        levels = []
        for lv in range(len(widths)):
            sel = np.flatnonzero(mine & (level == lv))
            sel = sel[np.argsort(bucket_ts[sel], kind="stable")]
            part = {name: values_[sel] for name, values_ in columns.items()}
            part["a:opcode"] = opcode[sel]
            levels.append(part)
        key = (engine,)
        lod.levels[key] = levels
        durations = levels[0]["end_ts"] - levels[0]["start_ts"]
        lod.max_duration[key] = int(durations.max()) if durations.size else 0
    return lod


# -- the stored table ---------------------------------------------------------------------------


class LodBuilder:
    """``InstructionLod``'s level 0 fed slice by slice; ``table()`` merges it and adds the coarser levels.

    Level 0 is reduced from rows sorted by (engine, start) -- the order the summary's sweep already
    has -- with O(n) NumPy passes (``np.maximum.reduceat`` over the rank), so a capture's close builds
    it from the slices it reads anyway, with no extra scan and no SQL hash table. Buckets cut by a
    slice boundary are merged at the end; the coarser levels come from level 0.

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
        ranks = rank(duration, ids)
        best = np.maximum.reduceat(ranks, bounds)
        sizes = np.diff(np.append(bounds, n))
        hits = np.flatnonzero(ranks == np.repeat(best, sizes))
        group = np.searchsorted(bounds, hits, side="right") - 1
        first_hit = hits[np.flatnonzero(np.r_[True, group[1:] != group[:-1]])]
        self._parts.append({"g": engine[bounds].astype(np.int8), "b": bucket[bounds].astype(np.int32),
                            "s": start[first_hit], "d": duration[first_hit].astype(np.int64),
                            "i": ids[first_hit], "o": opcode[first_hit].astype(np.int32),
                            "n": sizes.astype(np.int32)})

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
            current = _largest_per_key(current)
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


def _largest_per_key(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per (engine, bucket): the one of largest rank, with the counts added."""
    ranks = rank(rows["d"], rows["i"])
    order = np.lexsort((-ranks, rows["b"], rows["g"]))
    g, b = rows["g"][order], rows["b"][order]
    head = np.empty(order.size, dtype=bool)
    head[:1] = True
    head[1:] = (g[1:] != g[:-1]) | (b[1:] != b[:-1])
    pick = order[head]
    out = {k: v[pick] for k, v in rows.items() if k != "n"}
    out["n"] = np.add.reduceat(rows["n"][order].astype(np.int64), np.flatnonzero(head))
    return out


def build_lod(profile: Profile, con: duckdb.DuckDBPyConnection | None = None,
              rows_per_slice: int = 2_000_000, *, memory_limit: str = "512MB") -> pa.Table:
    """``InstructionLod`` rows for a profile that has none (the real tool's): its own sliced scan
    (on ``con``, or on a connection of its own)."""
    source = TableSource(profile, "Instruction")
    if not source.present:
        return SCHEMA.arrow_schema(LOD_TABLE).empty_table()
    own = con is None
    con = con or sqlsource.connect(memory_limit=memory_limit)
    try:
        rows = con.execute(f"SELECT engine, opcode, min(start_ts), max(end_ts) FROM {source.relation()} "
                           f"GROUP BY ALL").fetchall()
        if not rows:
            return SCHEMA.arrow_schema(LOD_TABLE).empty_table()
        engines = sorted({str(r[0]) for r in rows})
        opcodes = ["?", *sorted({str(r[1]) for r in rows})]
        builder = LodBuilder(min(r[2] for r in rows), max(r[3] for r in rows), opcodes)
        codes = np.array([len(ENGINE_NAMES)] + [_engine_code(e) for e in engines], np.int64)
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


def _engine_code(spelling: str) -> int:
    """The stored engine code of an engine spelling (``ENGINE_LABELS``: "Other" when not canonical)."""
    name = canonical_engine(spelling)
    return ENGINE_NAMES.index(name) if name is not None and name in ENGINE_NAMES else len(ENGINE_NAMES)
