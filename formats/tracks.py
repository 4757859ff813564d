"""What a timeline draws for any row -- instruction tracks, DMA queues, collective streams -- and for
counter tracks, reduced to pixel buckets in DuckDB, never by loading the events.

    tracks = TrackViewport(profile)                   # one per open profile; see its thread rules
    tracks.span_keys(INSTRUCTION_TRACKS)              # [SpanKey(key=(0, 'TensorMatrix'), rows=..), ...]
    windows = tracks.span_windows(DMA_QUEUES, t0, t1, buckets=2000)
    windows[(0, "qSyncIO0")].start_ts                 # the transfer packet drawn in each bucket
    tracks.engine_window("Tensor", t0, t1, 2000)      # one canonical engine, any spelling, both rows
    tracks.counter_windows(HBM_THROUGHPUT, t0, t1, 2000)[()].high   # max per bucket

A timeline needs rows that are engines and rows that are not (the Tensor engine's ``TensorMatrix``
stream, DMA queues, CC streams), per physical core, with the attributes it colours by (HLO op,
layer), and counters. This module answers them all with Perfetto's rules for zoomed-out tracks:

* **Span rows**: per pixel bucket the event of largest rank (``formats.lod``: the longest, ties to
  the larger id) whose start falls in it (events that began before ``t0`` go to bucket 0), with the
  number of events there and the fraction of the bucket the row is busy. Zoomed in, one DuckDB query
  per table groups the visible rows of every key at once (row groups pruned by their time
  statistics). Zoomed out, a level of detail (``formats.lod.SpanLod``) built once per table by one
  DuckDB aggregate (``build_span_lod``), held in memory -- its size is bounded by the bucket count,
  not by the profile. Until it is built, ``install_quick_lod`` stands one in from the profile's
  stored ``InstructionLod`` (no scan for engines drawn as one row); ``engine_window`` answers a whole
  engine from that stored table.
* **Counter rows**: per pixel bucket the minimum, maximum and last sample, plus the value in force
  at ``t0``, so a sparse counter draws as steps and a dense one as a min/max band.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from formats import sqlsource
from formats.figures import busy_per_bucket
from formats.intervals import time_slices
from formats.lod import (
    LOD_COARSEST,
    LOD_FACTOR,
    LOD_PER_PIXEL,
    LOD_SLICE_ROWS,
    LOD_TABLE,
    SpanLod,
    SpanWindow,
    bucket_sql,
    build_lod,
    codes_of,
    empty_window,
    lod_buckets,
    lod_from_table,
    lod_geometry,
    lod_widths,
    longest_per_bucket,
    longest_sorted,
    rank_sql,
    recode,
)
from formats.schema import ENGINE_NAMES, canonical_engine
from formats.sqlsource import TableSource, arrow_table

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = [
    "CC_STREAMS", "COUNTERS", "DMA_QUEUES", "DMA_THROUGHPUT", "ENGINE_ACTIVE", "HBM_THROUGHPUT",
    "INSTRUCTION_ENGINES", "INSTRUCTION_TRACKS", "NEURONLINK_THROUGHPUT", "PENDING_DMA", "PSUM_USAGE",
    "SBUF_USAGE", "CounterSpec", "CounterWindow", "SpanKey", "SpanLod", "SpanSpec", "SpanWindow",
    "TrackViewport", "build_span_lod", "key_condition", "merge_windows", "quick_instruction_lod",
]

TRACK_ONLY = ("tensormatrix",)  # timeline rows that are part of an engine, not an engine (§2.5)


@dataclass(frozen=True)
class SpanSpec:
    """A table of intervals drawn as rows: one row per distinct ``keys`` value.

    ``keys`` are column names whose raw values (as stored: engine spellings are not normalised, a
    missing column is null) tell rows apart; a caller that shows several raw keys as one row (a
    real profile's ``tensor`` and ``Tensor``) merges their windows with ``merge_windows``.
    ``attrs`` are columns returned for each drawn event (what a timeline colours or labels by)."""

    table: str
    keys: tuple[str, ...]
    id: str
    attrs: tuple[str, ...] = ()
    start: str = "start_ts"
    end: str = "end_ts"


@dataclass(frozen=True)
class CounterSpec:
    """A sampled value drawn as a counter row (one row per distinct ``keys`` value)."""

    table: str
    value: str
    keys: tuple[str, ...] = ()
    timestamp: str = "timestamp"
    unit: str = ""
    hold: str | None = None  # a column saying how long each sample holds (its window); None: until the next


INSTRUCTION_TRACKS = SpanSpec("Instruction", ("pcore_idx", "timeline_track", "engine"), "id",
                              ("opcode", "hlo_name", "layer"))
# one row per engine spelling, all cores and timeline rows together (``engine_window``)
INSTRUCTION_ENGINES = SpanSpec("Instruction", ("engine",), "id", ("opcode",))
DMA_QUEUES = SpanSpec("DmaPacket", ("pcore_idx", "queue_name", "queue_idx"), "packet_aggregation_id",
                      ("queue_type",))
CC_STREAMS = SpanSpec("CcOp", ("stream_id",), "op_id", ("operation", "algorithm"))
# each engine's busy stretches (the union of its instructions, across the Tensor engine's two rows)
ENGINE_ACTIVE = SpanSpec("ActiveTime", ("pcore_idx", "engine"), "start_ts")

HBM_THROUGHPUT = CounterSpec("HbmUsage", "current_throughput", ("pcore_idx",), unit="B/s")
DMA_THROUGHPUT = CounterSpec("DmaUsage", "current_throughput", ("pcore_idx",), unit="B/s")
NEURONLINK_THROUGHPUT = CounterSpec("NeuronLinkUsage", "current_throughput", ("channel_id",), unit="B/s",
                                    hold="duration_ns")
PSUM_USAGE = CounterSpec("PsumUsage", "avg_util_percent", ("pcore_idx",), unit="%")
SBUF_USAGE = CounterSpec("SbufUsage", "avg_util_percent", ("pcore_idx",), unit="%")
PENDING_DMA = CounterSpec("PendingDma", "value", ("pcore_idx",), unit="")
COUNTERS = (HBM_THROUGHPUT, DMA_THROUGHPUT, NEURONLINK_THROUGHPUT, PSUM_USAGE, SBUF_USAGE, PENDING_DMA)


@dataclass(frozen=True)
class SpanKey:
    """One row of a span table: its key and how many events it has, from when to when."""

    key: tuple[Any, ...]
    rows: int
    first: int
    last: int


@dataclass(frozen=True)
class CounterWindow:
    """One counter row reduced to pixel buckets: min, max and last sample of each non-empty bucket,
    and the value in force when the window starts (the last sample before it, if any is near)."""

    bucket: np.ndarray
    low: np.ndarray
    high: np.ndarray
    last: np.ndarray
    before: float | None
    samples: int  # samples inside the window
    until: np.ndarray | None = None  # per bucket, when its last sample stops holding (spec.hold); else None
    before_until: int | None = None  # the same for ``before``

    def __len__(self) -> int:
        return int(self.bucket.size)


# -- SQL pieces ----------------------------------------------------------------------------------


def _key_exprs(source: TableSource, keys: Sequence[str]) -> list[str]:
    """Key columns as they are stored (no per-row expressions: grouping by plain dictionary-encoded
    columns is what keeps a 100M-row scan fast; callers name rows from the raw values)."""
    return [f"{source.col(k, engines=False)} AS k{i}" for i, k in enumerate(keys)]


def _key_filter(source: TableSource, keys: Sequence[str], wanted: Iterable[tuple[Any, ...]] | None) -> str:
    """``AND (k0, k1) IN (...)``-style condition for the wanted keys (empty when all are wanted)."""
    if wanted is None:
        return ""
    wanted = list(wanted)
    if not keys:
        return ""
    if not wanted:
        return " AND false"
    terms = []
    for value in wanted:
        parts = []
        for k, v in zip(keys, value):
            expr = source.col(k, engines=False)
            parts.append(f"{expr} IS NULL" if v is None else f"{expr} = {_sql_value(v)}")
        terms.append("(" + " AND ".join(parts) + ")")
    return " AND (" + " OR ".join(terms) + ")"


def key_condition(source: TableSource, keys: Sequence[str], wanted: Iterable[tuple[Any, ...]] | None) -> str:
    """A SQL condition selecting the rows whose ``keys`` columns equal one of ``wanted`` (raw values,
    as ``span_keys`` returns them); ``true`` when ``wanted`` is None. For callers that summarise
    what a row shows with their own queries."""
    condition = _key_filter(source, keys, wanted)
    return condition[len(" AND "):] if condition else "true"


def _sql_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return repr(float(value))
    return sqlsource.literal(str(value))


def _plain(values: Any) -> np.ndarray:
    """A fetched column as a plain NumPy array; a column with nulls becomes objects with None (a
    null key must stay null: ``pcore_idx IS NULL`` is another row than ``pcore_idx = 0``)."""
    if isinstance(values, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(values)
        if not mask.any():
            return np.asarray(values.data)
        out = np.asarray(values.data, dtype=object)
        out[mask] = None
        return out
    return np.asarray(values)


def _int64(values: Any, fill: int = 0) -> np.ndarray:
    """A fetched integer column with nulls replaced by ``fill``."""
    if isinstance(values, np.ma.MaskedArray):
        return np.asarray(values.filled(fill), dtype=np.int64)
    return np.asarray(values, dtype=np.int64)


def _python(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _key_tuples(cols: dict[str, Any], n_keys: int, rows: int) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """(distinct keys, inverse index per row) of the ``k0..kN`` columns of a fetched result."""
    if n_keys == 0:
        return [()], np.zeros(rows, np.int64)
    columns = [_plain(cols[f"k{i}"]).tolist() for i in range(n_keys)]
    index: dict[tuple[Any, ...], int] = {}
    inverse = np.empty(rows, np.int64)
    for r, key in enumerate(zip(*columns)):
        found = index.get(key)
        if found is None:
            found = index[key] = len(index)
        inverse[r] = found
    return list(index), inverse


# -- levels of detail from the events ----------------------------------------------------------


def build_span_lod(profile: Profile, spec: SpanSpec, *, memory_limit: str = "512MB",
                   threads: int | None = None, rows_per_slice: int = LOD_SLICE_ROWS) -> SpanLod | None:
    """The level of detail of one span table (None if the table is absent or empty): DuckDB
    aggregates per (key, level-0 bucket) over time slices of the table (each slice's row groups
    found by their statistics, so the hash table holds one slice's buckets), fetched as Arrow with
    keys and attributes turned into integer codes, buckets cut by a slice edge merged, then each
    coarser level from the one below. Uses its own connection, so it can run on a background thread
    while windows are answered from another."""
    source = TableSource(profile, spec.table)
    if not source.present:
        return None
    con = sqlsource.connect(memory_limit=memory_limit, threads=threads)
    try:
        start, end = source.col(spec.start), source.col(spec.end)
        found = con.execute(f"SELECT min({start}), max({end}) FROM {source.relation()}").fetchall()
        span = found[0] if found else None  # fetchall: a DuckDB 2 connection refuses new work while a
        # result is unfinished (fetchone leaves it open)
        if span is None or span[0] is None:
            return None
        first, last = int(span[0]), int(span[1])
        lod = SpanLod(first, lod_widths(first, last, lod_buckets(source.num_rows), LOD_COARSEST))
        table = _aggregate(con, source, spec, lod, None, rows_per_slice)
    finally:
        con.close()
    _add_levels(lod, spec, table)
    return lod


def _aggregate(con: Any, source: TableSource, spec: SpanSpec, lod: SpanLod, condition: str | None,
               rows_per_slice: int) -> pa.Table:
    """Per (key, level-0 bucket of ``lod``) the longest event, slice by slice, as one Arrow table."""
    start, end = source.col(spec.start), source.col(spec.end)
    rank = rank_sql(f"({end}) - ({start})", source.col(spec.id))
    attrs = ", ".join(f"arg_max(a{i}, r) AS a{i}" for i in range(len(spec.attrs)))
    keys = _key_exprs(source, spec.keys)
    key_names = ", ".join(f"k{i}" for i in range(len(spec.keys)))
    parts = []
    for low, high in time_slices(source.files, spec.start, rows_per_slice):
        bounds = [c for c in (None if low is None else f"{start} >= {int(low)}",
                              None if high is None else f"{start} < {int(high)}", condition) if c]
        where = "WHERE " + " AND ".join(bounds) if bounds else ""
        parts.append(arrow_table(con, f"""
            SELECT {key_names + ',' if key_names else ''} b, max(d) AS d, arg_max(i, r) AS i,
                   arg_max(s, r) AS s, count(*) AS n {', ' + attrs if attrs else ''},
                   CAST(sum(least(x, {lod.origin} + (b + 1) * {lod.widths[0]}) - s) AS BIGINT) AS c,
                   max(x) AS x
            FROM (SELECT {', '.join(keys) + ',' if keys else ''}
                         ({start} - {lod.origin}) // {lod.widths[0]} AS b,
                         ({end}) - ({start}) AS d, {source.col(spec.id)} AS i, {start} AS s, {rank} AS r,
                         {end} AS x
                         {''.join(f', {source.col(a)} AS a{i}' for i, a in enumerate(spec.attrs))}
                  FROM {source.relation()} {where})
            GROUP BY ALL"""))
    return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]


def _add_levels(lod: SpanLod, spec: SpanSpec, table: pa.Table) -> None:
    """Split an aggregate by key, merge buckets two slices share, and build the coarser levels."""
    base = {"b": _numbers(table.column("b")), "start_ts": _numbers(table.column("s")),
            "id": _numbers(table.column("i")), "count": _numbers(table.column("n"))}
    base["end_ts"] = base["start_ts"] + _numbers(table.column("d"))
    if "c" in table.column_names:
        base["covered"] = _numbers(table.column("c"))
        base["reach"] = _numbers(table.column("x"))
    for i, a in enumerate(spec.attrs):
        codes, values = codes_of(table.column(f"a{i}"))
        base[f"a:{a}"] = recode(lod, a, codes, values)
    key_codes = [codes_of(table.column(f"k{i}")) for i in range(len(spec.keys))]
    if key_codes:
        combined = np.zeros(base["b"].size, np.int64)  # one integer per key tuple (mixed radix)
        for codes, values in key_codes:
            combined = combined * (len(values) + 1) + (codes.astype(np.int64) + 1)
        _, first_row, inverse = np.unique(combined, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        keys_found = [tuple(None if codes[r] < 0 else _python(values[codes[r]])
                            for codes, values in key_codes) for r in first_row.tolist()]
    else:
        keys_found, inverse = [()], np.zeros(base["b"].size, np.int64)
    order = np.argsort(inverse.astype(np.int64) << 32 | base["b"], kind="stable")  # by key, then bucket
    bounds = np.searchsorted(inverse[order], np.arange(len(keys_found) + 1))
    for k, key in enumerate(keys_found):
        pick = order[bounds[k]:bounds[k + 1]]
        mine = {name: v[pick] for name, v in base.items()}
        mine = longest_sorted(mine, mine["b"])  # buckets that two slices share
        levels = []
        for level, width in enumerate(lod.widths):
            if level:
                if "covered" in mine:  # a parent also holds what its children's events run on into it
                    child_end = lod.origin + (mine["b"] + 1) * lod.widths[level - 1]
                    parent_end = lod.origin + (mine["b"] // LOD_FACTOR + 1) * width
                    spill = np.clip(np.minimum(mine["reach"], parent_end) - child_end, 0, None)
                    mine = {**mine, "covered": mine["covered"] + spill}
                mine = longest_sorted(mine, mine["b"] // LOD_FACTOR)
            part = {name: v for name, v in mine.items() if name != "b"}
            part["bucket_ts"] = lod.origin + mine["b"] * width
            levels.append(part)
        lod.levels[key] = levels
        lod.max_duration[key] = int((mine["end_ts"] - mine["start_ts"]).max()) if mine["b"].size else 0


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(), dtype=np.int64)


def merge_windows(windows: Sequence[SpanWindow]) -> SpanWindow:
    """Several windows of the same pixel grid drawn as one row: the longest per bucket again."""
    windows = [w for w in windows if w is not None]
    if len(windows) == 1:
        return windows[0]
    if not windows:
        return empty_window("events")
    names = sorted(set().union(*(w.attrs for w in windows)))
    cols: dict[str, np.ndarray] = {
        "start_ts": np.concatenate([w.start_ts for w in windows]),
        "end_ts": np.concatenate([w.end_ts for w in windows]),
        "id": np.concatenate([w.id for w in windows]),
        "count": np.concatenate([w.count for w in windows]),
    }
    for a in names:
        cols[f"a:{a}"] = np.concatenate([w.attrs.get(a, np.full(len(w), None, object)) for w in windows])
    merged = longest_per_bucket(np.concatenate([w.bucket for w in windows]), cols, windows[0].source)
    busy = [w.busy for w in windows if w.busy is not None]
    if len(busy) == len(windows) and len({b.size for b in busy}) == 1:
        # raw keys of one row (two spellings of an engine) never run at once: their busy time adds up
        merged = replace(merged, busy=np.minimum(1.0, np.sum(busy, axis=0)))
    return merged


def quick_instruction_lod(profile: Profile, keys: Sequence[SpanKey], spec: SpanSpec | None = None, *,
                          memory_limit: str = "512MB") -> SpanLod | None:
    """A first level of detail for ``Instruction`` rows, made in a fraction of the full build's time:
    an engine drawn as one row is taken from the profile's stored ``InstructionLod``
    (``formats.lod.lod_from_table``, no scan); the rows of engines split into several rows (the PE's
    ``Tensor``/``TensorMatrix``) are aggregated on the same bucket grid. Opcode is the only
    attribute. None when the profile has no ``InstructionLod`` or several physical cores
    (``InstructionLod`` is per engine, not per core). ``keys``: the table's rows (``span_keys``)."""
    spec = spec or INSTRUCTION_TRACKS
    if not profile.num_rows(LOD_TABLE) or spec.keys != INSTRUCTION_TRACKS.keys:
        return None
    if len({k.key[0] or 0 for k in keys}) > 1:
        return None
    stored = lod_from_table(profile.table(LOD_TABLE))
    if stored is None:
        return None
    lod = SpanLod(stored.origin, stored.widths, dictionaries=dict(stored.dictionaries))
    tracks_of: dict[str, set[str]] = {}
    for k in keys:
        engine = canonical_engine(k.key[2]) or str(k.key[2])
        tracks_of.setdefault(engine, set()).add(k.key[1] or engine)
    split = sorted(e for e, names in tracks_of.items() if len(names) > 1)
    for engine in tracks_of:
        if engine in split or (engine,) not in stored.levels:
            continue
        key = next(k.key for k in keys if (canonical_engine(k.key[2]) or str(k.key[2])) == engine)
        lod.levels[key] = stored.levels[(engine,)]
        lod.max_duration[key] = stored.max_duration[(engine,)]
    if split:
        source = TableSource(profile, spec.table)
        spellings = [k.key[2] for k in keys if (canonical_engine(k.key[2]) or str(k.key[2])) in split]
        listed = ", ".join(_sql_value(s) for s in spellings)
        condition = f"{source.col(spec.keys[2], engines=False)} IN ({listed})"
        quick = SpanSpec(spec.table, spec.keys, spec.id, ("opcode",), spec.start, spec.end)
        con = sqlsource.connect(memory_limit=memory_limit)
        try:
            table = _aggregate(con, source, quick, lod, condition, LOD_SLICE_ROWS)
        finally:
            con.close()
        _add_levels(lod, quick, table)
    return lod


# -- the viewport --------------------------------------------------------------------------------


class TrackViewport:
    """Window queries over one profile's span and counter tables, with one DuckDB connection and the
    levels of detail kept between calls. A viewer holds one per open profile and closes it.

    Thread rules (a GUI's UI thread, its fetch thread and its level-of-detail thread share one):

    * every public method may be called from any thread, concurrently;
    * the DuckDB connection runs one statement at a time (``_con_lock``, held for each query and its
      fetch); building a level of detail uses a connection of its own, outside every lock, so windows
      are answered meanwhile;
    * the remembered state -- levels of detail, row keys, longest events -- is read and replaced
      only under ``_state_lock``, which is never held while a query or a build runs; a ``SpanLod``
      is installed finished and never changed after, so a window computed from one needs no lock;
    * one build per table at a time (``_build_locks``): a second caller waits for the first's result;
      a full level of detail is never replaced by a quick one.
    """

    def __init__(self, profile: Profile, *, memory_limit: str = "512MB") -> None:
        self.profile = profile
        self.con = sqlsource.connect(memory_limit=memory_limit)
        self._con_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._build_locks: dict[SpanSpec, threading.Lock] = {}
        self._lods: dict[SpanSpec, SpanLod | None] = {}
        self._full: set[SpanSpec] = set()  # specs whose full level of detail is built
        self._longest: dict[SpanSpec, int] = {}
        self._keys: dict[SpanSpec, set[tuple[Any, ...]]] = {}
        self._key_list: dict[SpanSpec, list[SpanKey]] = {}
        self._engines: SpanLod | None = None  # the stored InstructionLod, keyed by canonical engine
        self._engines_loaded = False
        self._memory_limit = memory_limit

    def close(self) -> None:
        with self._con_lock:
            self.con.close()

    def _source(self, table: str) -> TableSource:
        return TableSource(self.profile, table)

    def _query(self, sql: str) -> dict[str, Any]:
        with self._con_lock:
            result: dict[str, Any] = self.con.execute(sql).fetchnumpy()
            return result

    def _build_lock(self, spec: SpanSpec) -> threading.Lock:
        with self._state_lock:
            return self._build_locks.setdefault(spec, threading.Lock())

    # -- levels of detail --------------------------------------------------------------------
    def has_lod(self, spec: SpanSpec) -> bool:
        with self._state_lock:
            return self._lods.get(spec) is not None or spec in self._full

    def lod(self, spec: SpanSpec) -> SpanLod | None:
        """The table's full level of detail, built on first use (``build_span_lod``; may take a while
        on a large table -- call it from a background thread first if the caller must stay
        responsive)."""
        with self._build_lock(spec):
            with self._state_lock:
                if spec in self._full:
                    return self._lods[spec]
            built = build_span_lod(self.profile, spec, memory_limit=self._memory_limit)
            with self._state_lock:
                self._lods[spec] = built
                self._full.add(spec)
                if built is not None:
                    self._longest[spec] = max(built.max_duration.values(), default=0)
            return built

    def install_lod(self, spec: SpanSpec, lod: SpanLod) -> None:
        """Use ``lod`` for ``spec`` until a full one is built (a full one is never replaced)."""
        with self._state_lock:
            if spec in self._full:
                return
            self._lods[spec] = lod
            self._longest.setdefault(spec, max(lod.max_duration.values(), default=0))

    def install_quick_lod(self, spec: SpanSpec) -> bool:
        """Install ``quick_instruction_lod`` for ``spec`` (an Instruction spec); False when the profile
        cannot give one (no stored ``InstructionLod``, several physical cores)."""
        quick = quick_instruction_lod(self.profile, self.span_keys(spec), spec,
                                      memory_limit=self._memory_limit)
        if quick is None:
            return False
        self.install_lod(spec, quick)
        return True

    def has_full_lod(self, spec: SpanSpec) -> bool:
        with self._state_lock:
            return spec in self._full

    def _current_lod(self, spec: SpanSpec) -> SpanLod | None:
        with self._state_lock:
            return self._lods.get(spec)

    def lod_serves(self, spec: SpanSpec, t0: int, t1: int, buckets: int) -> bool:
        """True if an installed level of detail answers this window (pixels at least ``LOD_PER_PIXEL``
        finest buckets wide)."""
        lod = self._current_lod(spec)
        return lod is not None and lod.serves(t0, t1, buckets)

    # -- span rows ---------------------------------------------------------------------------
    def span_keys(self, spec: SpanSpec) -> list[SpanKey]:
        """Every row of the table: key, event count, first start and last end (one grouped scan, then
        remembered)."""
        with self._state_lock:
            known = self._key_list.get(spec)
        if known is not None:
            return list(known)
        source = self._source(spec.table)
        if not source.present:
            return []
        keys = _key_exprs(source, spec.keys)
        names = ", ".join(f"k{i}" for i in range(len(spec.keys)))
        cols = self._query(f"""
            SELECT {names + ',' if names else ''} count(*) AS n, min(s) AS first, max(e) AS last
            FROM (SELECT {', '.join(keys) + ',' if keys else ''} {source.col(spec.start)} AS s,
                         {source.col(spec.end)} AS e FROM {source.relation()})
            {'GROUP BY ALL' if names else ''}""")
        rows = len(cols["n"])
        found, inverse = _key_tuples(cols, len(spec.keys), rows)
        out = []
        for k, key in enumerate(found):
            r = int(np.flatnonzero(inverse == k)[0])
            if int(cols["n"][r]) == 0:
                continue
            out.append(SpanKey(tuple(_python(v) for v in key), int(cols["n"][r]), int(cols["first"][r]),
                               int(cols["last"][r])))
        ordered = sorted(out, key=lambda s: tuple((v is None, str(v)) for v in s.key))
        with self._state_lock:
            self._keys[spec] = {k.key for k in out}
            self._key_list[spec] = ordered
        return list(ordered)

    def span_windows(self, spec: SpanSpec, t0: int, t1: int, buckets: int = 2000,
                     keys: Iterable[tuple[Any, ...]] | None = None, where: str | None = None,
                     ) -> dict[tuple[Any, ...], SpanWindow]:
        """Events of ``spec`` overlapping [t0, t1), per key (all keys, or those in ``keys``), reduced
        to the one of largest rank per pixel bucket. ``where`` (a SQL condition over the table's
        columns) keeps only matching events -- for highlights -- and always reads the events (no LOD)."""
        t0, t1, buckets = int(t0), int(t1), max(1, int(buckets))
        if t1 <= t0:
            raise ValueError(f"empty window: t1 ({t1}) must be after t0 ({t0})")
        wanted = None if keys is None else [tuple(k) for k in keys]
        with self._state_lock:
            known = self._keys.get(spec)
            lod = self._lods.get(spec)
        if wanted is not None and known is not None and known <= set(wanted):
            wanted = None  # every row is wanted: no per-row key test (an OR of key tuples costs 4x the scan)
        if where is None and lod is not None and lod.serves(t0, t1, buckets):
            out = {}
            for key in (wanted if wanted is not None else list(lod.levels)):
                window = lod.window(key, t0, t1, buckets)
                if window is not None:
                    out[key] = window
            return out
        return self._raw_spans(spec, t0, t1, buckets, wanted, where)

    def engine_window(self, engine: str, t0: int, t1: int, buckets: int = 2000) -> SpanWindow:
        """Instructions of ``engine`` (a canonical engine in any spelling: all its timeline rows and
        cores together; or a timeline row such as ``TensorMatrix``) overlapping [t0, t1), one per
        pixel bucket. Zoomed out, from the stored ``InstructionLod`` (built from the events, once,
        for a profile without one); zoomed in, from the events."""
        t0, t1, buckets = int(t0), int(t1), max(1, int(buckets))
        if t1 <= t0:
            raise ValueError(f"empty window: t1 ({t1}) must be after t0 ({t0})")
        name = canonical_engine(engine) or engine
        if name in ENGINE_NAMES and engine.lower() not in TRACK_ONLY:
            lod = self._engine_lod(t0, t1, buckets)
            if lod is not None:
                window = lod.window((name,), t0, t1, buckets)
                if window is not None:
                    return window
            spec = INSTRUCTION_ENGINES
            keys = [k.key for k in self.span_keys(spec) if (canonical_engine(k.key[0]) or "") == name]
        else:
            spec = INSTRUCTION_TRACKS
            keys = [k.key for k in self.span_keys(spec) if k.key[1] == engine]
        if not keys:
            return empty_window("events", spec.attrs)
        found = list(self._raw_spans(spec, t0, t1, buckets, keys, None).values())
        return merge_windows(found) if found else empty_window("events", spec.attrs)

    def _engine_lod(self, t0: int, t1: int, buckets: int) -> SpanLod | None:
        """The stored ``InstructionLod`` as a level of detail keyed by canonical engine: loaded on first
        use, or built from the events when the profile has none and this window is wide enough to
        want it (then kept: one build per viewport)."""
        with self._state_lock:
            if self._engines_loaded:
                return self._engines
        if not self.profile.num_rows(LOD_TABLE):
            meta = self.profile.metadata
            first, last = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
            if first is not None and last is not None and last > first:
                _, widths = lod_geometry(first, last)
                if (t1 - t0) / buckets < widths[0] * LOD_PER_PIXEL:
                    return None  # zoomed in: the events answer; no build yet
        with self._build_lock(INSTRUCTION_ENGINES):
            with self._state_lock:
                if self._engines_loaded:
                    return self._engines
            if self.profile.num_rows(LOD_TABLE):
                table = self.profile.table(LOD_TABLE)
            else:
                table = build_lod(self.profile, memory_limit=self._memory_limit)
            built = lod_from_table(table)
            with self._state_lock:
                self._engines, self._engines_loaded = built, True
            return built

    def _longest_event(self, spec: SpanSpec, source: TableSource) -> int:
        with self._state_lock:
            known = self._longest.get(spec)
        if known is not None:
            return known
        start, end = source.col(spec.start), source.col(spec.end)
        with self._con_lock:
            rows = self.con.execute(f"SELECT max(({end}) - ({start})) FROM {source.relation()}").fetchall()
        row = rows[0] if rows else None
        longest = int(row[0] or 0) if row else 0
        with self._state_lock:
            self._longest.setdefault(spec, longest)
            return self._longest[spec]

    def _raw_spans(self, spec: SpanSpec, t0: int, t1: int, buckets: int, wanted: list[tuple[Any, ...]] | None,
                   where: str | None) -> dict[tuple[Any, ...], SpanWindow]:
        source = self._source(spec.table)
        if not source.present:
            return {}
        start, end = source.col(spec.start), source.col(spec.end)
        keys = _key_exprs(source, spec.keys)
        names = ", ".join(f"k{i}" for i in range(len(spec.keys)))
        rank = rank_sql(f"({end}) - ({start})", source.col(spec.id))
        attrs = "".join(f", arg_max(a{i}, r) AS a{i}" for i in range(len(spec.attrs)))
        attr_cols = "".join(f", {source.col(a)} AS a{i}" for i, a in enumerate(spec.attrs))
        lookback = t0 - self._longest_event(spec, source)
        condition = (f"{start} < {t1} AND {end} > {t0} AND {start} >= {lookback}"
                     + _key_filter(source, spec.keys, wanted) + (f" AND ({where})" if where else ""))
        cols = self._query(f"""
            SELECT {names + ',' if names else ''} b, arg_max(s, r) AS s, arg_max(e, r) AS e,
                   arg_max(i, r) AS i, count(*) AS n {attrs},
                   sum(least(e, {t0} + (b + 1) * {(t1 - t0) / buckets!r}) - greatest(s, {t0})) AS c,
                   max(e) AS x
            FROM (SELECT {', '.join(keys) + ',' if keys else ''}
                         {bucket_sql(f"({start}) - {t0}", t1 - t0, buckets)} AS b,
                         {start} AS s, {end} AS e, {source.col(spec.id)} AS i, {rank} AS r {attr_cols}
                  FROM {source.relation()} WHERE {condition})
            GROUP BY ALL ORDER BY b""")
        rows = len(cols["b"])
        found, inverse = _key_tuples(cols, len(spec.keys), rows)
        out: dict[tuple[Any, ...], SpanWindow] = {}
        bucket = np.asarray(cols["b"], np.int64)
        for k, key in enumerate(found):
            sel = inverse == k
            attrs_out = {a: _plain(cols[f"a{i}"])[sel].astype(object) for i, a in enumerate(spec.attrs)}
            out[tuple(_python(v) for v in key)] = SpanWindow(
                bucket[sel], np.asarray(cols["s"], np.int64)[sel], np.asarray(cols["e"], np.int64)[sel],
                np.asarray(cols["i"], np.int64)[sel], np.asarray(cols["n"], np.int64)[sel], attrs_out,
                "events", busy_per_bucket(t0 + bucket[sel] * ((t1 - t0) / buckets), (t1 - t0) / buckets,
                                          np.asarray(cols["c"], np.float64)[sel],
                                          np.asarray(cols["x"], np.float64)[sel], t0, t1, buckets))
        return out

    # -- counter rows ------------------------------------------------------------------------
    def counter_keys(self, spec: CounterSpec) -> list[tuple[tuple[Any, ...], int]]:
        """(key, samples) of every row of a counter table."""
        source = self._source(spec.table)
        if not source.present or not source.has(spec.value):
            return []
        keys = _key_exprs(source, spec.keys)
        names = ", ".join(f"k{i}" for i in range(len(spec.keys)))
        with self._con_lock:
            cols = self.con.execute(f"""
                SELECT {names + ',' if names else ''} count(*) AS n
                FROM (SELECT {', '.join(keys) + ',' if keys else ''} 1 AS one FROM {source.relation()})
                {'GROUP BY ALL' if names else ''}""").fetchnumpy()
        found, inverse = _key_tuples(cols, len(spec.keys), len(cols["n"]))
        out = []
        for k, key in enumerate(found):
            n = int(np.asarray(cols["n"])[inverse == k].sum())
            if n:
                out.append((tuple(_python(v) for v in key), n))
        return sorted(out, key=lambda kv: tuple((v is None, str(v)) for v in kv[0]))

    def counter_windows(self, spec: CounterSpec, t0: int, t1: int, buckets: int = 2000,
                        keys: Iterable[tuple[Any, ...]] | None = None
                        ) -> dict[tuple[Any, ...], CounterWindow]:
        """Samples of ``spec`` in [t0, t1) per key, reduced to min/max/last per pixel bucket, plus the
        last sample within one window width before ``t0`` (the value in force at the left edge)."""
        t0, t1, buckets = int(t0), int(t1), max(1, int(buckets))
        if t1 <= t0:
            raise ValueError(f"empty window: t1 ({t1}) must be after t0 ({t0})")
        source = self._source(spec.table)
        if not source.present or not source.has(spec.value):
            return {}
        wanted = None if keys is None else [tuple(k) for k in keys]
        ts, value = source.col(spec.timestamp), f"CAST({source.col(spec.value)} AS DOUBLE)"
        hold = f"{ts} + {source.col(spec.hold)}" if spec.hold and source.has(spec.hold) else "NULL::BIGINT"
        keys_sql = _key_exprs(source, spec.keys)
        names = ", ".join(f"k{i}" for i in range(len(spec.keys)))
        lead = names + "," if names else ""
        key_cols = ", ".join(keys_sql) + "," if keys_sql else ""
        key_filter = _key_filter(source, spec.keys, wanted)
        with self._con_lock:
            cols = self.con.execute(f"""
                SELECT {lead} b, min(v) AS lo, max(v) AS hi, arg_max(v, t) AS last, count(*) AS n,
                       arg_max(u, t) AS u
                FROM (SELECT {key_cols} {bucket_sql(f"({ts}) - {t0}", t1 - t0, buckets)} AS b,
                             {value} AS v, {ts} AS t, {hold} AS u
                      FROM {source.relation()} WHERE {ts} >= {t0} AND {ts} < {t1} AND {value} IS NOT NULL
                      {key_filter})
                GROUP BY ALL ORDER BY b""").fetchnumpy()
            before = self.con.execute(f"""
                SELECT {lead} arg_max(v, t) AS v, arg_max(u, t) AS u
                FROM (SELECT {key_cols} {value} AS v, {ts} AS t, {hold} AS u FROM {source.relation()}
                      WHERE {ts} < {t0} AND {ts} >= {t0 - (t1 - t0)} AND {value} IS NOT NULL {key_filter})
                {'GROUP BY ALL' if names else ''}""").fetchnumpy()
        found, inverse = _key_tuples(cols, len(spec.keys), len(cols["b"]))
        prior_keys, prior_inverse = _key_tuples(before, len(spec.keys), len(before["v"]))
        prior: dict[tuple[Any, ...], tuple[float, int | None]] = {}
        holds = spec.hold is not None and source.has(spec.hold)
        for k, key in enumerate(prior_keys):
            values = _plain(before["v"])[prior_inverse == k]
            if values.size and values[0] is not None and not (isinstance(values[0], float) and
                                                                math.isnan(values[0])):
                until = _plain(before["u"])[prior_inverse == k][0] if holds else None
                held = None if until is None else int(until)
                prior[tuple(_python(v) for v in key)] = (float(values[0]), held)
        out: dict[tuple[Any, ...], CounterWindow] = {}
        for k, key in enumerate(found):
            sel = inverse == k
            name = tuple(_python(v) for v in key)
            value_before, until_before = prior.get(name, (None, None))
            out[name] = CounterWindow(np.asarray(cols["b"], np.int64)[sel],
                                      np.asarray(cols["lo"], np.float64)[sel],
                                      np.asarray(cols["hi"], np.float64)[sel],
                                      np.asarray(cols["last"], np.float64)[sel], value_before,
                                      int(np.asarray(cols["n"], np.int64)[sel].sum()),
                                      _int64(cols["u"])[sel] if holds else None,
                                      until_before)
        for name, (value_before, until_before) in prior.items():
            if name not in out and (wanted is None or name in wanted):
                none = np.zeros(0, np.float64)
                out[name] = CounterWindow(np.zeros(0, np.int64), none, none, none, value_before, 0,
                                          np.zeros(0, np.int64) if holds else None, until_before)
        return out

    def counter_range(self, spec: CounterSpec, keys: Iterable[tuple[Any, ...]] | None = None
                      ) -> tuple[float, float] | None:
        """(min, max) of the counter over the whole profile (its row's fixed scale)."""
        source = self._source(spec.table)
        if not source.present or not source.has(spec.value):
            return None
        wanted = None if keys is None else [tuple(k) for k in keys]
        value = f"CAST({source.col(spec.value)} AS DOUBLE)"
        with self._con_lock:
            row = self.con.execute(f"SELECT min({value}), max({value}) FROM {source.relation()} "
                                   f"WHERE true {_key_filter(source, spec.keys, wanted)}").fetchall()[0]
        if row is None or row[0] is None:
            return None
        return float(row[0]), float(row[1])

