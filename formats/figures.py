"""Every figure a view shows, defined once, over a time window or the whole execution.

    from formats.figures import Window, figures, whole, engine_busy, track_busy, row_busy
    w = whole(profile)                                   # the whole execution: length = total_time
    w = Window.span(t0, t1)                              # a region [t0, t1), absolute ns
    f = figures(profile, w)                              # Figures: engines, tracks, DMA, HBM, FLOPs, CC
    f.engines["Tensor"].fraction, f.mfu, f.hbm.read, f.dma.throughput_bytes_per_s
    from_summary(summary_row)                            # the same Figures from a stored Summary row

Used by summary-text/json (``formats.view_output``), the terminal viewer, the GUI (rows, region
summary, compare), the Perfetto export and neuron-top. docs/figures.md states each definition with
its unit and columns; the formulas are repeated in each function's docstring. Op, layer and
source-line times are in :mod:`formats.attribution`; number formatting in :mod:`formats.units`.

The rules every figure follows:

* **The window.** ``[t0, t1)`` in absolute ns; its *length* is the denominator of every fraction
  and rate. For :func:`whole` the window is unbounded and its length is ``total_time`` (T, see
  :func:`device_time_ns`), so ``figures(p, whole(p))`` equals the profile's ``Summary`` row
  (``tests/formats/test_figures.py`` checks it) -- the Summary is the whole-execution window.
* **Time** (busy, active, collective time) comes from intervals *clipped* to the window and merged
  (union): overlapping instructions of one engine count once.
* **Amounts** (instruction counts, bytes, FLOPs, packets) count the events that *start* in the
  window, whole (an event is not split across windows, so adjacent windows add up).
* **Null, never a made-up 0**: a figure the tables cannot determine (no FLOP columns, no HBM byte
  columns, no Metadata peak) is ``None``.

Unions are computed as ``formats.summary`` computes them: the table is read in time slices (row
groups pruned by their ``start_ts`` statistics) and swept in NumPy (``formats.intervals``), so memory
is one slice whatever the profile's size and a 10M-instruction profile costs one scan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from formats import sqlsource
from formats.intervals import UnionAccumulator, key_order, start_order, time_slices, union_length
from formats.schema import ENGINE_NAMES
from formats.sqlsource import TableSource, literal
from formats.units import fmt_count

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = [
    "TENSOR_ROWS", "BucketBusy", "Busy", "Collectives", "DmaFigures", "Figures", "Flops", "Hardware",
    "HbmBytes", "RowSelect", "TrainingStepFigures", "Window", "busiest", "busiest_opcodes", "busy_buckets",
    "busy_per_bucket", "busy_rows", "collective_overlap", "collectives", "covered_per_bucket",
    "device_time_ns", "dma",
    "engine_busy", "figures", "flops", "from_summary", "hbm_bytes", "row_busy", "track_busy",
    "training_step_figures", "whole",
]

# The Tensor engine's two timeline rows: ``Tensor`` (LoadStationary: LDWEIGHTS/transposes) and
# ``TensorMatrix`` (MATMUL streaming), in our layout and the real tool's. "Tensor" busy means the
# union of both rows.
TENSOR_ROWS = ("Tensor", "TensorMatrix")
ROWS_PER_SLICE = 2_000_000


# -- hardware and time base ----------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """The Metadata constants the utilisation figures use.

    ``peak_flops_per_s`` = 2 x tensor_engine_num_rows x tensor_engine_num_cols x
    tensor_engine_clock_freq (GHz) x 1e9; ``hbm_bytes_per_s`` = hbm_ddr_bandwidth; ``clock_hz`` =
    neuroncore_clock_freq (GHz) x 1e9. None when Metadata lacks them."""

    peak_flops_per_s: float | None
    hbm_bytes_per_s: float | None
    clock_hz: float | None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Hardware:
        rows, cols, ghz = (meta.get(k) for k in ("tensor_engine_num_rows", "tensor_engine_num_cols",
                                                "tensor_engine_clock_freq"))
        peak = 2.0 * rows * cols * ghz * 1e9 if rows and cols and ghz else None
        hbm = meta.get("hbm_ddr_bandwidth") or None
        clock = meta.get("neuroncore_clock_freq")
        return cls(peak, float(hbm) if hbm else None, float(clock) * 1e9 if clock else None)


@dataclass(frozen=True)
class Window:
    """``[t0, t1)`` in absolute ns (None = unbounded) and the length every fraction divides by."""

    t0: int | None
    t1: int | None
    length_ns: float | None

    @classmethod
    def span(cls, t0: int, t1: int) -> Window:
        """A region: ``[t0, t1)``, length ``t1 - t0``."""
        return cls(int(t0), int(t1), float(max(0, int(t1) - int(t0))))

    @property
    def bounded(self) -> bool:
        return self.t0 is not None or self.t1 is not None

    def ratio(self, value: float | None) -> float | None:
        """``value / length`` (None when either is unknown or the length is 0)."""
        if value is None or not self.length_ns or self.length_ns <= 0:
            return None
        return float(value) / float(self.length_ns)


def device_time_ns(profile: Profile, con: duckdb.DuckDBPyConnection | None = None,
                   spans: Sequence[tuple[int | None, int | None]] = ()) -> tuple[float | None, str]:
    """T, the device time of a profile, and where it came from.

    T = Σ over ExecutionInfo rows of ``execution_end_ts - execution_start_ts`` (the runtime's start
    and stop of each run: idle gaps inside a run count, host gaps between runs do not); without
    ExecutionInfo ``Metadata.last_hw_timestamp - first_hw_timestamp``; failing that the span of
    ``spans`` (first start, last end of the event tables; computed here when not given)."""
    own = con is None
    con = con or sqlsource.connect(threads=2)
    try:
        info = TableSource(profile, "ExecutionInfo")
        if info.present and info.has("execution_start_ts") and info.has("execution_end_ts"):
            value = con.execute(f"""SELECT sum(execution_end_ts - execution_start_ts)::HUGEINT FROM
                                    {info.relation()} WHERE execution_end_ts IS NOT NULL
                                    AND execution_start_ts IS NOT NULL""").fetchall()[0][0]
            if value:
                return float(value), "ExecutionInfo"
        meta = profile.metadata
        first, last = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
        if first is not None and last is not None and last > first:
            return float(last - first), "Metadata first/last_hw_timestamp"
        if not spans:
            found = []
            for name in ("Instruction", "DmaPacket", "CcOp", "CcInstruction"):
                source = TableSource(profile, name)
                if source.present:
                    found.append(tuple(con.execute(
                        f"SELECT min(start_ts), max(end_ts) FROM {source.relation()}").fetchall()[0]))
            spans = found
        firsts = [a for a, _ in spans if a is not None]
        lasts = [b for _, b in spans if b is not None]
        if firsts and lasts:
            return float(max(lasts) - min(firsts)), "event span"
        return None, "none"
    finally:
        if own:
            con.close()


def whole(profile: Profile, con: duckdb.DuckDBPyConnection | None = None) -> Window:
    """The whole execution: unbounded, length T (:func:`device_time_ns`). The Summary's window."""
    return Window(None, None, device_time_ns(profile, con)[0])


# -- results ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Busy:
    """How busy one engine or timeline row was in a window.

    ``busy_ns`` = Σ over physical cores of |∪ of the row's instruction intervals clipped to the
    window|; ``fraction`` = busy_ns / window length; ``instructions`` = instructions that start in
    the window; ``instruction_ns`` = Σ of their durations (not clipped: time the engine spent on
    them, overlaps counted twice)."""

    name: str
    busy_ns: int
    length_ns: float | None
    instructions: int = 0
    instruction_ns: int = 0

    @property
    def fraction(self) -> float | None:
        if not self.length_ns or self.length_ns <= 0:
            return None
        return self.busy_ns / self.length_ns


@dataclass(frozen=True)
class HbmBytes:
    """Bytes read from and written to HBM by what starts in the window.

    ``source`` says which columns: ``DmaPacket`` (Σ ``hbm_read_bytes``/``hbm_write_bytes`` of the
    packets: HBM traffic is DMA traffic, our extension columns), else ``Instruction`` (Σ of the
    instruction columns, the real tool's layout), else None (unknown: read/write None)."""

    read: int | None
    write: int | None
    source: str | None

    @property
    def total(self) -> int | None:
        if self.read is None and self.write is None:
            return None
        return (self.read or 0) + (self.write or 0)


@dataclass(frozen=True)
class DmaFigures:
    """DMA in a window: ``packets`` and ``bytes`` (Σ ``transfer_bytes``) of the packets that start in
    it, ``active_ns`` = |∪ of packet intervals clipped to the window|, ``length_ns`` the window's.
    ``throughput_bytes_per_s`` = bytes / length (the average over the window; shown in GB/s)."""

    packets: int
    bytes: int
    active_ns: int
    length_ns: float | None
    transfers: int | None = None  # logical transfers (DmaPacketAggregated rows, else packet_aggregation_id)

    @property
    def active_fraction(self) -> float | None:
        return None if not self.length_ns else self.active_ns / self.length_ns

    @property
    def throughput_bytes_per_s(self) -> float | None:
        return None if not self.length_ns else self.bytes / (self.length_ns * 1e-9)

    @property
    def average_transfer_bytes(self) -> float | None:
        """bytes / transfers: Summary.dma_transfer_average_bytes (the real Summary Viewer's
        ``average_dma_size``)."""
        return None if not self.transfers else self.bytes / self.transfers

    @property
    def count_text(self) -> str:
        """"85 transfers (1,360 packets)": a transfer is one DMA request, split into packets by the
        queue (docs/figures.md). Every view names both, so one view's count never reads as
        contradicting another's."""
        packets = f"{fmt_count(self.packets)} packets"
        if self.transfers is None:
            return packets
        if not self.packets:  # a Summary without the per-kind packet counts
            return f"{fmt_count(self.transfers)} transfers"
        return f"{fmt_count(self.transfers)} transfers ({packets})"


@dataclass(frozen=True)
class Flops:
    """FLOPs of the Tensor (PE) instructions that start in the window.

    per instruction PE = greatest(raw_flops, flops_transpose) (the real tool's raw_flops may include a
    transpose's FLOPs, ours are 0 with the count in flops_transpose: either way once);
    transpose = coalesce(flops_transpose, raw_flops if tensor_instruction_type = 'TRANSPOSE');
    ``hardware`` = Σ PE, ``transpose`` = Σ transpose, ``model`` = Σ (PE - transpose) over
    instructions attributed to an HLO op (raw_hlo_id not null). None when no FLOP column is filled."""

    hardware: int | None
    transpose: int | None
    model: int | None

    @property
    def instruction(self) -> int | None:
        """hardware - transpose (the numerator of ``mfu_inst``)."""
        return None if self.hardware is None else self.hardware - (self.transpose or 0)


@dataclass(frozen=True)
class Collectives:
    """Collective operations (``CcOp``) in a window: ``count`` that start in it, ``time_ns`` = Σ of
    their durations clipped to the window, ``active_ns`` = |∪ clipped|; fraction = active / length."""

    count: int
    time_ns: int
    active_ns: int
    length_ns: float | None

    @property
    def active_fraction(self) -> float | None:
        return None if not self.length_ns else self.active_ns / self.length_ns


@dataclass(frozen=True)
class Figures:
    """Every figure of one window (see each class for its definition)."""

    window: Window
    engines: Mapping[str, Busy]  # canonical engine -> Busy (Tensor = both of its rows)
    tracks: Mapping[str, Busy]  # timeline row (Tensor, TensorMatrix, Vector, ...) -> Busy
    dma: DmaFigures
    hbm: HbmBytes
    flops: Flops
    collectives: Collectives
    active_ns: int | None  # |∪ of every instruction, DMA packet, CcOp and CcInstruction interval|
    hardware: Hardware
    notes: tuple[str, ...] = field(default=())

    @property
    def length_ns(self) -> float | None:
        return self.window.length_ns

    def _capacity(self, rate: float | None) -> float | None:
        if not rate or not self.length_ns:
            return None
        return rate * self.length_ns * 1e-9

    @property
    def mfu(self) -> float | None:
        """model FLOPs / (PEAK x length): Summary.mfu_estimated_percent."""
        return _ratio(self.flops.model, self._capacity(self.hardware.peak_flops_per_s))

    @property
    def mfu_inst(self) -> float | None:
        """(hardware - transpose) FLOPs / (PEAK x length): Summary.mfu_inst_estimated_percent."""
        return _ratio(self.flops.instruction, self._capacity(self.hardware.peak_flops_per_s))

    @property
    def hfu(self) -> float | None:
        """hardware FLOPs / (PEAK x length): Summary.hfu_estimated_percent."""
        return _ratio(self.flops.hardware, self._capacity(self.hardware.peak_flops_per_s))

    @property
    def mbu(self) -> float | None:
        """(HBM read + write bytes) / (HBM_BW x length): Summary.mbu_estimated_percent."""
        return _ratio(self.hbm.total, self._capacity(self.hardware.hbm_bytes_per_s))

    @property
    def active_fraction(self) -> float | None:
        """|∪ of everything| / length: Summary.total_active_time_percent."""
        return self.window.ratio(self.active_ns)

    @property
    def busiest(self) -> Busy | None:
        return busiest(self.engines)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or (isinstance(num, float) and math.isnan(num)):
        return None
    return float(num) / float(den)


def busiest(busy: Mapping[str, Busy]) -> Busy | None:
    """The engine with the largest busy fraction (ties: the first in ``ENGINE_NAMES`` order)."""
    known = [b for b in busy.values() if b.fraction is not None]
    return max(known, key=lambda b: b.fraction or 0.0, default=None)


# -- scanning --------------------------------------------------------------------------------------


_LONGEST: dict[tuple[Any, ...], int] = {}


def _longest(profile: Profile, source: TableSource, con: duckdb.DuckDBPyConnection) -> int:
    """The longest event of a table (bounds the lookback before t0, so row groups far before the
    window are skipped). Cached per table files (path, size, mtime): a profile captured again at the
    same path is measured again."""
    stamps = []
    for f in source.files:
        try:
            st = f.stat()
            stamps.append((str(f), st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append((str(f), -1, -1))
    key = (source.name, *stamps)
    if key not in _LONGEST:
        found = con.execute(f"SELECT max(end_ts - start_ts) FROM {source.relation()}").fetchall()[0][0]
        _LONGEST[key] = int(found or 0)
    return _LONGEST[key]


def _window_filter(profile: Profile, source: TableSource, window: Window, con: duckdb.DuckDBPyConnection,
                   ) -> tuple[str, list[int]]:
    """Rows overlapping the window (or starting in it: zero-length events at t0 count)."""
    conditions: list[str] = []
    params: list[int] = []
    if window.t1 is not None:
        conditions.append("start_ts < ?")
        params.append(window.t1)
    if window.t0 is not None:
        conditions.append("(end_ts > ? OR start_ts >= ?)")
        params += [window.t0, window.t0]
        conditions.append("start_ts >= ?")
        params.append(window.t0 - _longest(profile, source, con))
    return " AND ".join(conditions) or "true", params


def _slices(source: TableSource, window: Window) -> list[tuple[int | None, int | None]]:
    """Time slices of the table (by start_ts) cut to the window's lookback."""
    return time_slices(source.files, "start_ts", ROWS_PER_SLICE)


def _clip(s: np.ndarray, e: np.ndarray, window: Window) -> tuple[np.ndarray, np.ndarray]:
    if window.t0 is not None:
        s = np.maximum(s, window.t0)
    if window.t1 is not None:
        e = np.minimum(e, window.t1)
    return s, np.maximum(e, s)


def _starts_in(s: np.ndarray, window: Window) -> np.ndarray:
    keep = np.ones(s.size, bool)
    if window.t0 is not None:
        keep &= s >= window.t0
    if window.t1 is not None:
        keep &= s < window.t1
    return keep


def _ints(values: Any) -> np.ndarray:
    array = np.ma.filled(values, 0) if np.ma.isMaskedArray(values) else np.asarray(values)
    return array.astype(np.int64, copy=False)


def _sweep(profile: Profile, source: TableSource, window: Window, con: duckdb.DuckDBPyConnection,
           key_sql: str, extra: str = "", second: Callable[[np.ndarray], np.ndarray] | None = None,
           ) -> tuple[UnionAccumulator, dict[int, int], dict[int, int], UnionAccumulator, UnionAccumulator]:
    """Per key: union of clipped intervals; count and Σ duration of the rows starting in the window;
    the union of everything (segments kept, for the profile-wide "active" union); and, when
    ``second`` maps keys to coarser keys, the unions per coarser key (an engine across its rows)."""
    acc, total, coarse = UnionAccumulator(), UnionAccumulator(keep_segments=True), UnionAccumulator()
    counts: dict[int, int] = {}
    durations: dict[int, int] = {}
    where, params = _window_filter(profile, source, window, con)
    if extra:
        where = f"({where}) AND ({extra})"
    for low, high in _slices(source, window):
        cond, args = where, list(params)
        if low is not None:
            cond, args = f"{cond} AND start_ts >= ?", [*args, low]
        if high is not None:
            cond, args = f"{cond} AND start_ts < ?", [*args, high]
        cols = con.execute(f"SELECT {key_sql} AS k, start_ts AS s, end_ts AS e FROM {source.relation()} "
                           f"WHERE {cond}", args).fetchnumpy()
        if not len(cols["s"]):
            continue
        key, s0, e0 = _ints(cols["k"]), _ints(cols["s"]), _ints(cols["e"])
        inside = _starts_in(s0, window)
        if inside.any():
            n = np.bincount(key[inside])
            d = np.bincount(key[inside], weights=(e0 - s0)[inside])
            for k in np.flatnonzero(n).tolist():
                counts[k] = counts.get(k, 0) + int(n[k])
                durations[k] = durations.get(k, 0) + round(float(d[k]))
        s, e = _clip(s0, e0, window)
        by_start = start_order(s)
        acc.add(key, s, e, key_order(key, by_start))
        total.add(0, s, e, by_start)
        if second is not None:
            other = second(key)
            coarse.add(other, s, e, key_order(other, by_start))
    return acc, counts, durations, total, coarse


# -- engines and rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RowKeys:
    """Instruction rows as small integers: engine code, timeline row code, physical core."""

    tracks: tuple[str, ...]
    engines: tuple[str, ...]  # canonical engines present (ENGINE_NAMES order)
    track_engine: Mapping[str, str]  # timeline row -> its engine

    def key_sql(self, source: TableSource) -> str:
        engines = "[" + ", ".join(literal(e) for e in ENGINE_NAMES) + "]"
        tracks = "[" + ", ".join(literal(t) for t in self.tracks) + "]"
        track = f"coalesce({source.col('timeline_track')}, {source.col('engine')})"
        pcore = f"coalesce({source.col('pcore_idx')}, 0)"
        # key = engine (0 = unknown, 1.. ENGINE_NAMES) + 8 x (track + len(tracks)+1 x pcore)
        return (f"coalesce(list_position({engines}, {source.col('engine')}), 0)::BIGINT + 8 * ("
                f"coalesce(list_position({tracks}, {track}), 0)::BIGINT + {len(self.tracks) + 1} * {pcore})")

    def decode(self, key: int) -> tuple[str | None, str | None, int]:
        engine_code, rest = key % 8, key // 8
        track_code, pcore = rest % (len(self.tracks) + 1), rest // (len(self.tracks) + 1)
        engine = ENGINE_NAMES[engine_code - 1] if engine_code else None
        track = self.tracks[track_code - 1] if track_code else None
        return engine, track, pcore


def _row_keys(source: TableSource, con: duckdb.DuckDBPyConnection) -> _RowKeys:
    """The profile's timeline rows and engines (every one is reported, 0 when idle in a window)."""
    track = f"coalesce({source.col('timeline_track')}, {source.col('engine')})"
    rows = con.execute(f"SELECT DISTINCT {track}, {source.col('engine')} FROM {source.relation()}").fetchall()
    names = sorted({str(r[0]) for r in rows if r[0] is not None},
                   key=lambda t: (TRACK_ORDER.index(t) if t in TRACK_ORDER else len(TRACK_ORDER), t))
    engines = tuple(e for e in ENGINE_NAMES if any(r[1] == e for r in rows))
    owner = {str(r[0]): str(r[1]) for r in rows if r[0] is not None and r[1] is not None}
    return _RowKeys(tuple(names), engines, owner)


TRACK_ORDER = ("Tensor", "TensorMatrix", "Vector", "Scalar", "GpSimd", "Sync")


@dataclass
class _Instructions:
    engines: dict[str, Busy]
    tracks: dict[str, Busy]
    segments: tuple[np.ndarray, np.ndarray]


def _instructions(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection,
                  extra: str = "") -> _Instructions:
    source = TableSource(profile, "Instruction")
    if not source.present:
        return _Instructions({}, {}, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    keys = _row_keys(source, con)
    span = len(keys.tracks) + 1
    acc, counts, durations, total, coarse = _sweep(
        profile, source, window, con, keys.key_sql(source), extra,
        second=lambda k: k % 8 + 8 * ((k // 8) // span))  # (engine, pcore): the engine across its rows
    # engine busy = Σ over pcores of the union over the engine's rows: sweep per (engine, pcore)
    lengths = acc.lengths()
    per_engine: dict[str, list[int]] = {}
    per_track: dict[str, list[int]] = {}
    for key in set(lengths) | set(counts):
        engine, track, _ = keys.decode(key)
        for target, name in ((per_engine, engine), (per_track, track)):
            if name is None:
                continue
            slot = target.setdefault(name, [0, 0, 0])
            slot[1] += counts.get(key, 0)
            slot[2] += durations.get(key, 0)
    # track lengths: rows of one track never overlap another track's key except across pcores (summed)
    for key, length in lengths.items():
        engine, track, _ = keys.decode(key)
        if track is not None:
            per_track[track][0] += length
    for key, length in coarse.lengths().items():
        engine = ENGINE_NAMES[key % 8 - 1] if key % 8 else None
        if engine is not None:
            per_engine.setdefault(engine, [0, 0, 0])[0] += length
    def busy(name: str, sums: Mapping[str, list[int]]) -> Busy:
        busy_ns, count, duration = sums.get(name, [0, 0, 0])
        return Busy(name, busy_ns, window.length_ns, count, duration)

    engines = {name: busy(name, per_engine) for name in keys.engines}
    tracks = {name: busy(name, per_track) for name in keys.tracks}
    _, ts, te = total.segments()
    return _Instructions(engines, tracks, (ts, te))


def engine_busy(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection | None = None
                ) -> dict[str, Busy]:
    """Per canonical engine (``Tensor``, ``Vector``, ``Scalar``, ``GpSimd``, ``Sync``): busy_ns =
    Σ over physical cores of |∪ of the engine's instruction intervals clipped to the window| (the
    Tensor engine: the union across both of its rows, ``Tensor`` and ``TensorMatrix``); fraction =
    busy_ns / window length. Whole window: ``Summary.<e>_engine_active_time[_percent]``."""
    with _connection(con) as c:
        return _instructions(profile, window, c).engines


def track_busy(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection | None = None
               ) -> dict[str, Busy]:
    """Per timeline row (``coalesce(timeline_track, engine)``: ``Tensor``, ``TensorMatrix``,
    ``Vector`` ...): busy_ns = Σ over physical cores of |∪ of the row's instruction intervals clipped
    to the window|; fraction = busy_ns / window length. What a GUI/viewer row shows."""
    with _connection(con) as c:
        return _instructions(profile, window, c).tracks


def row_busy(profile: Profile, window: Window, *, engines: Sequence[str] = (), tracks: Sequence[str] = (),
             pcore: int | None = None, label: str | None = None,
             con: duckdb.DuckDBPyConnection | None = None) -> Busy:
    """Busy figure of one selection of instructions: those of ``engines`` (canonical names) or of
    ``tracks`` (timeline rows), optionally one physical core. busy_ns = Σ over physical cores of |∪
    of their intervals clipped to the window| (one union per core over the whole selection:
    ``engines=["Tensor"]`` is the engine's union across its two rows); fraction = busy_ns / window
    length -- as :func:`engine_busy` and :func:`track_busy`, which are this over each engine/row."""
    with _connection(con) as c:
        source = TableSource(profile, "Instruction")
        name = label or "+".join([*engines, *tracks]) or "instructions"
        if not source.present:
            return Busy(name, 0, window.length_ns)
        extra = _selection_sql(source, engines, tracks, pcore)
        acc, counts, durations, _, _ = _sweep(profile, source, window, c,
                                              f"coalesce({source.col('pcore_idx')}, 0)", extra)
        return Busy(name, sum(acc.lengths().values()), window.length_ns, sum(counts.values()),
                    sum(durations.values()))


def _selection_sql(source: TableSource, engines: Sequence[str], tracks: Sequence[str],
                   pcore: int | None) -> str:
    parts = []
    if engines:
        parts.append(f"{source.col('engine')} IN ({', '.join(literal(e) for e in engines)})")
    if tracks:
        track = f"coalesce({source.col('timeline_track')}, {source.col('engine')})"
        parts.append(f"{track} IN ({', '.join(literal(t) for t in tracks)})")
    extra = "(" + " OR ".join(parts) + ")" if parts else ""
    if pcore is not None:
        extra = f"{extra + ' AND ' if extra else ''}coalesce({source.col('pcore_idx')}, 0) = {int(pcore)}"
    return extra


def busy_per_bucket(start: np.ndarray, width: float, covered: np.ndarray, reach: np.ndarray, t0: int,
                    t1: int, buckets: int) -> np.ndarray:
    """Per bucket of [t0, t1), the fraction of it a row is busy (0..1), from per-bucket aggregates at
    a stated resolution ``width`` -- the busy figure of docs/figures.md (|∪ of the row's intervals ∩
    bucket| / its width) when a caller has aggregates, not segments (the GUI's windows: a DuckDB
    ``sum`` per pixel in the window's own query, or a level of detail's buckets). The exact
    evaluation from a union's segments is :func:`covered_per_bucket` (``busy_rows``).

    Input per *source bucket* of width ``width`` (at most an output bucket): source bucket k covers
    [start[k], start[k] + width); ``covered[k]`` is the time the row's pieces starting in it cover
    inside it, ``reach[k]`` the latest end of those pieces. A source bucket's covered time is shared
    between the (at most two) output buckets it touches in proportion to its overlap with each; a
    piece that runs on past its source bucket covers ``[bucket end, reach)`` (bucket by bucket,
    through the running maximum of the reaches). So it equals the exact figure when the source
    buckets are the output buckets and the pieces do not overlap (an instruction row's events:
    ``tests/formats/test_tracks.py`` checks it against ``busy_rows``); from a level of detail it is
    within one source bucket per output bucket; pieces that overlap (DMA packets in flight
    together) count once per piece, capped at the bucket."""
    buckets = max(1, int(buckets))
    pixel = (t1 - t0) / buckets
    out = np.zeros(buckets)
    if start.size == 0:
        return out
    start = start.astype(np.float64)
    end = start + width
    covered = covered.astype(np.float64)
    reach = reach.astype(np.float64)
    first = np.maximum(start, t0)
    p0 = np.clip(np.floor((first - t0) / pixel), 0, buckets - 1).astype(np.int64)
    p0_end = t0 + (p0 + 1) * pixel
    here = np.clip(np.minimum(end, p0_end) - first, 0, None) / width
    after = np.clip(np.minimum(end, t1) - np.maximum(p0_end, first), 0, None) / width
    np.add.at(out, p0, covered * here)
    nxt = p0 + 1 < buckets
    np.add.at(out, p0[nxt] + 1, covered[nxt] * after[nxt])
    inside = end < t1  # the run-on after each source bucket: first in the pixel holding its end ...
    pe = np.clip(np.floor((np.maximum(end, t0) - t0) / pixel), 0, buckets - 1).astype(np.int64)[inside]
    pe_end = t0 + (pe + 1) * pixel
    np.add.at(out, pe, np.clip(np.minimum(reach[inside], pe_end) - np.maximum(end[inside], t0), 0, None))
    latest = np.full(buckets, -np.inf)  # ... then in every later pixel it reaches
    np.maximum.at(latest, pe, reach[inside])
    earlier = np.r_[-np.inf, np.maximum.accumulate(latest)[:-1]]
    starts = t0 + np.arange(buckets) * pixel
    out += np.clip(np.minimum(earlier, starts + pixel) - starts, 0.0, pixel)
    fraction: np.ndarray = np.clip(out / pixel, 0.0, 1.0)
    return fraction


def covered_per_bucket(start: np.ndarray, end: np.ndarray, t0: int, t1: int, buckets: int) -> np.ndarray:
    """ns covered in each of ``buckets`` equal buckets of [t0, t1) by *disjoint* sorted intervals (a
    union's segments) -- the definition itself, exactly: C(x) = covered length before x, and bucket
    i gets C(edge i+1) - C(edge i) (a bucket no segment touches gets exactly 0)."""
    buckets = max(1, int(buckets))
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
    ns: np.ndarray = np.diff(covered)
    return ns


@dataclass(frozen=True)
class BucketBusy:
    """Busy time of one selection in equal buckets of ``[t0, t1)`` (a zoomed-out row's pixels, a
    terminal strip's cells): ``busy_ns[i]`` = |∪ of the selection's intervals ∩ bucket i|, so Σ
    busy_ns = ``row_busy`` over the same window and a 30 %-busy engine never looks solid.
    ``source``: "Instruction" (intervals merged here) or "ActiveTime" (the engine's stored merged
    stretches, the same union, used for whole-engine selections on profiles that have them)."""

    edges: np.ndarray  # buckets + 1 edges, absolute ns (float: buckets may be fractional ns)
    busy_ns: np.ndarray  # per bucket, float64
    source: str

    @property
    def fraction(self) -> np.ndarray:
        """busy_ns / bucket width, each in [0, 1] per physical core (Σ over cores: up to their count)."""
        width = np.diff(self.edges)
        fraction: np.ndarray = np.divide(self.busy_ns, width, out=np.zeros_like(self.busy_ns),
                                         where=width > 0)
        return fraction


@dataclass(frozen=True)
class RowSelect:
    """One row of a timeline: the instructions of ``engines`` (canonical names; ``Tensor`` = the union
    of the engine's two timeline rows) or of ``tracks`` (``coalesce(timeline_track, engine)``),
    optionally of one physical core."""

    label: str
    engines: tuple[str, ...] = ()
    tracks: tuple[str, ...] = ()
    pcore: int | None = None


def busy_buckets(profile: Profile, t0: int, t1: int, buckets: int, *, engines: Sequence[str] = (),
                 tracks: Sequence[str] = (), pcore: int | None = None, use_active_time: bool = True,
                 con: duckdb.DuckDBPyConnection | None = None) -> BucketBusy:
    """Per-bucket busy time of a selection (as :func:`row_busy`: ``engines`` by canonical name --
    ``["Tensor"]`` is the union of both Tensor rows -- or ``tracks`` by timeline row, optionally one
    physical core; Σ over cores) over ``buckets`` equal buckets of ``[t0, t1)``: :func:`busy_rows`
    of one row."""
    t0, t1, n = int(t0), int(t1), max(1, int(buckets))
    if t1 <= t0:
        return BucketBusy(t0 + (t1 - t0) * np.arange(n + 1, dtype=np.float64) / n, np.zeros(n), "Instruction")
    select = RowSelect("row", tuple(engines), tuple(tracks), pcore)
    return busy_rows(profile, t0, t1, n, [select], use_active_time=use_active_time, con=con)["row"]


def busy_rows(profile: Profile, t0: int, t1: int, buckets: int, rows: Sequence[RowSelect], *,
              use_active_time: bool = True, con: duckdb.DuckDBPyConnection | None = None
              ) -> dict[str, BucketBusy]:
    """Per row label, the busy time of each of ``buckets`` equal buckets of [t0, t1): the union of
    the row's instruction intervals inside the bucket, Σ over physical cores (docs/figures.md), so
    ``mean(fraction) == engine_busy/track_busy(...)[row].fraction`` over the same window and the
    buckets of adjacent windows add up. Whole-engine rows read the engine's stored merged stretches
    (``ActiveTime``, the same union) when the profile has them and ``use_active_time``; every other
    row comes from one sweep of the instructions overlapping the window, in time slices (row groups
    pruned by their ``start_ts`` statistics, swept in NumPy by ``formats.intervals``), so memory is
    one slice and a 10M-instruction profile costs one scan."""
    t0, t1, n = int(t0), int(t1), max(1, int(buckets))
    if t1 <= t0:
        raise ValueError(f"empty window: t1 ({t1}) must be after t0 ({t0})")
    edges = t0 + (t1 - t0) * np.arange(n + 1, dtype=np.float64) / n
    out: dict[str, BucketBusy] = {}
    with _connection(con) as c:
        active = TableSource(profile, "ActiveTime")
        swept = []
        for row in rows:
            if use_active_time and row.engines and not row.tracks and active.present:
                out[row.label] = BucketBusy(edges, _active_time_busy(active, row, t0, t1, n, c), "ActiveTime")
            else:
                swept.append(row)
        busy = _instruction_busy(profile, t0, t1, n, swept, c)
        for row in swept:
            out[row.label] = BucketBusy(edges, busy[row.label], "Instruction")
    return {row.label: out[row.label] for row in rows}


def _active_time_busy(active: TableSource, row: RowSelect, t0: int, t1: int, n: int,
                      con: duckdb.DuckDBPyConnection) -> np.ndarray:
    """ns busy per bucket of a whole-engine row from ``ActiveTime`` (Σ over physical cores)."""
    busy = np.zeros(n)
    stems = ", ".join(literal(e.lower()) for e in row.engines)
    core_sql = f"coalesce({active.col('pcore_idx')}, 0)"
    cond = f"lower({active.col('engine', engines=False)}) IN ({stems}) AND start_ts < ? AND end_ts > ?"
    if row.pcore is not None:
        cond += f" AND {core_sql} = {int(row.pcore)}"
    cols = con.execute(f"SELECT start_ts AS s, end_ts AS e, {core_sql} AS p "
                       f"FROM {active.relation()} WHERE {cond}", [t1, t0]).fetchnumpy()
    s, e, core = _ints(cols["s"]), _ints(cols["e"]), _ints(cols["p"])
    for k in np.unique(core).tolist():  # Σ over physical cores
        mine = core == k
        acc = UnionAccumulator(keep_segments=True)  # several engines of one core may overlap
        acc.add(0, s[mine], e[mine])
        _, ms, me = acc.segments()
        busy += covered_per_bucket(ms, me, t0, t1, n)
    return busy


def _pick_sql(source: TableSource, rows: Sequence[RowSelect]) -> list[str]:
    """One boolean SQL column per row selection (``r0``, ``r1`` ...)."""
    picks = []
    for i, row in enumerate(rows):
        condition = _selection_sql(source, row.engines, row.tracks, row.pcore) or "false"
        picks.append(f"coalesce({condition}, false) AS r{i}")
    return picks


def _instruction_busy(profile: Profile, t0: int, t1: int, buckets: int, rows: Sequence[RowSelect],
                      con: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    """ns busy per bucket of each row from one sweep of the instructions (Σ over physical cores)."""
    out = {row.label: np.zeros(buckets) for row in rows}
    source = TableSource(profile, "Instruction")
    if not source.present or not rows:
        return out
    pcore = f"coalesce({source.col('pcore_idx')}, 0)"
    picks = _pick_sql(source, rows)  # an instruction may belong to several rows (Tensor ∪ its tracks)
    where, params = _window_filter(profile, source, Window.span(t0, t1), con)
    acc = UnionAccumulator(keep_segments=True)
    for low, high in time_slices(source.files, "start_ts", ROWS_PER_SLICE):
        cond, args = where, list(params)
        if low is not None:
            cond, args = f"{cond} AND start_ts >= ?", [*args, low]
        if high is not None:
            cond, args = f"{cond} AND start_ts < ?", [*args, high]
        cols = con.execute(f"SELECT start_ts AS s, end_ts AS e, {pcore} AS p, {', '.join(picks)} "
                           f"FROM {source.relation()} WHERE {cond}", args).fetchnumpy()
        if not len(cols["s"]):
            continue
        s, e = _clip(_ints(cols["s"]), _ints(cols["e"]), Window.span(t0, t1))
        core = _ints(cols["p"])
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
    for k in np.unique(key).tolist():  # one (row, physical core) at a time: fractions add up
        mine = key == k
        order = np.argsort(start[mine], kind="stable")
        covered = covered_per_bucket(start[mine][order], end[mine][order], t0, t1, buckets)
        out[rows[k % len(rows)].label] += covered / width
    return {label: fraction * width for label, fraction in out.items()}


def busiest_opcodes(profile: Profile, t0: int, t1: int, rows: Sequence[RowSelect],
                    con: duckdb.DuckDBPyConnection | None = None) -> dict[str, str]:
    """Per row label: the opcode with the most instruction time inside [t0, t1) (Σ of the
    instructions' durations clipped to the window; "" when idle) -- one grouped scan of the rows
    overlapping the window."""
    source = TableSource(profile, "Instruction")
    if not source.present or not rows or t1 <= t0:
        return {row.label: "" for row in rows}
    with _connection(con) as c:
        where, params = _window_filter(profile, source, Window.span(t0, t1), c)
        sums = ", ".join(f"sum(CASE WHEN r{i} THEN d END) AS t{i}" for i in range(len(rows)))
        picks = ", ".join(_pick_sql(source, rows))
        found = c.execute(f"""
            SELECT op, {sums} FROM (
                SELECT {source.col('opcode', engines=False)} AS op,
                       least(end_ts, {int(t1)}) - greatest(start_ts, {int(t0)}) AS d, {picks}
                FROM {source.relation()} WHERE {where})
            GROUP BY op""", params).fetchall()
    out = {}
    for i, row in enumerate(rows):
        best = max(((r[1 + i] or 0, str(r[0])) for r in found if r[0] is not None), default=(0, ""))
        out[row.label] = best[1] if best[0] > 0 else ""
    return out


# -- DMA, HBM, FLOPs, collectives ----------------------------------------------------------------


def _starts_filter(window: Window) -> tuple[str, list[int]]:
    conditions, params = [], []
    if window.t0 is not None:
        conditions.append("start_ts >= ?")
        params.append(window.t0)
    if window.t1 is not None:
        conditions.append("start_ts < ?")
        params.append(window.t1)
    return " AND ".join(conditions) or "true", params


def _dma(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection
         ) -> tuple[DmaFigures, tuple[np.ndarray, np.ndarray]]:
    source = TableSource(profile, "DmaPacket")
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not source.present:
        return DmaFigures(0, 0, 0, window.length_ns), empty
    where, params = _starts_filter(window)
    n, nbytes, transfers = con.execute(
        f"SELECT count(*), sum(transfer_bytes)::HUGEINT, count(DISTINCT packet_aggregation_id) "
        f"FROM {source.relation()} WHERE {where}", params).fetchall()[0]
    aggregated = TableSource(profile, "DmaPacketAggregated")
    if aggregated.present:
        transfers = con.execute(f"SELECT count(*) FROM {aggregated.relation()} WHERE {where}",
                                params).fetchall()[0][0]
    acc, _, _, total, _ = _sweep(profile, source, window, con, "0")
    _, s, e = total.segments()
    return DmaFigures(int(n), int(nbytes or 0), acc.lengths().get(0, 0), window.length_ns,
                      int(transfers or 0)), (s, e)


def dma(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection | None = None) -> DmaFigures:
    """DMA packets starting in the window: count, Σ ``transfer_bytes``; active = |∪ of packet
    intervals clipped to the window|; throughput = bytes / window length (B/s, shown in GB/s).
    Whole window: ``Summary.dma_active_time[_percent]``, ``dma_transfer_total_bytes`` (Σ packets'
    bytes when the profile has no DmaPacketAggregated)."""
    with _connection(con) as c:
        return _dma(profile, window, c)[0]


def hbm_bytes(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection | None = None) -> HbmBytes:
    """HBM bytes read/written by what starts in the window: Σ ``DmaPacket.hbm_read_bytes`` /
    ``hbm_write_bytes`` when the packets carry them (HBM traffic is DMA traffic; a packet's missing
    side counts 0), else Σ of the ``Instruction`` columns, else unknown (None). Whole window:
    ``Summary.hbm_read_bytes`` / ``hbm_write_bytes``. (Summing the Instruction columns of our
    profiles gives 0: our instructions touch only SBUF/PSUM -- the GUI's old "hbm read bytes 0 B".)"""
    with _connection(con) as c:
        where, params = _starts_filter(window)
        packets = TableSource(profile, "DmaPacket")
        if packets.present and (packets.has("hbm_read_bytes") or packets.has("hbm_write_bytes")):
            read, write = c.execute(
                f"SELECT sum({packets.col('hbm_read_bytes')})::HUGEINT, "
                f"sum({packets.col('hbm_write_bytes')})::HUGEINT, "
                f"count({packets.col('hbm_read_bytes')}) + count({packets.col('hbm_write_bytes')}) "
                f"FROM {packets.relation()} WHERE {where}", params).fetchall()[0][:2]
            known = c.execute(
                f"SELECT count({packets.col('hbm_read_bytes')}) + count({packets.col('hbm_write_bytes')}) "
                f"FROM {packets.relation()}").fetchall()[0][0]
            if known:
                return HbmBytes(int(read or 0), int(write or 0), "DmaPacket")
        instr = TableSource(profile, "Instruction")
        if instr.present and (instr.has("hbm_read_bytes") or instr.has("hbm_write_bytes")):
            read, write = c.execute(
                f"SELECT sum({instr.col('hbm_read_bytes')})::HUGEINT, "
                f"sum({instr.col('hbm_write_bytes')})::HUGEINT "
                f"FROM {instr.relation()} WHERE {where}", params).fetchall()[0]
            if read is not None or write is not None:
                return HbmBytes(None if read is None else int(read), None if write is None else int(write),
                                "Instruction")
        return HbmBytes(None, None, None)


def flops(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection | None = None) -> Flops:
    """FLOPs of the Tensor instructions starting in the window (see :class:`Flops` for the
    formulas). Whole window: ``Summary.hardware_flops``, ``transpose_flops``, ``model_flops``."""
    with _connection(con) as c:
        source = TableSource(profile, "Instruction")
        if not source.present:
            return Flops(None, None, None)
        col = source.col
        raw, ft = col("raw_flops"), col("flops_transpose")
        transpose = (f"coalesce({ft}, CASE WHEN {col('tensor_instruction_type')} = 'TRANSPOSE' "
                     f"THEN {raw} END)")
        where, params = _starts_filter(window)
        hardware, transposed, model, known = c.execute(f"""
            SELECT sum(greatest({raw}, {ft}))::HUGEINT, sum({transpose})::HUGEINT,
                   sum(greatest({raw}, {ft}) - coalesce({transpose}, 0))
                       FILTER (WHERE {col('raw_hlo_id')} IS NOT NULL)::HUGEINT,
                   count({raw}) + count({ft})
            FROM {source.relation()} WHERE {col('engine')} = 'Tensor' AND {where}""", params).fetchall()[0]
        if not known:
            whole_known = c.execute(f"SELECT count({raw}) + count({ft}) FROM {source.relation()} "
                                    f"WHERE {col('engine')} = 'Tensor'").fetchall()[0][0]
            if not whole_known:
                return Flops(None, None, None)
        hw = int(hardware or 0)
        return Flops(hw, int(transposed or 0), int(model or 0) if source.has("raw_hlo_id") else None)


def _collectives(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection
                 ) -> tuple[Collectives, tuple[np.ndarray, np.ndarray]]:
    source = TableSource(profile, "CcOp")
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not source.present:
        return Collectives(0, 0, 0, window.length_ns), empty
    acc, _, _, total, _ = _sweep(profile, source, window, con, "0")
    where, params = _starts_filter(window)
    count = con.execute(f"SELECT count(*) FROM {source.relation()} WHERE {where}", params).fetchall()[0][0]
    clipped = _clip_sum(profile, source, window, con)
    _, s, e = total.segments()
    return Collectives(int(count), clipped, acc.lengths().get(0, 0), window.length_ns), (s, e)


def _clip_sum(profile: Profile, source: TableSource, window: Window, con: duckdb.DuckDBPyConnection) -> int:
    where, params = _window_filter(profile, source, window, con)
    lo = "start_ts" if window.t0 is None else f"greatest(start_ts, {int(window.t0)})"
    hi = "end_ts" if window.t1 is None else f"least(end_ts, {int(window.t1)})"
    found = con.execute(f"SELECT sum(greatest(0, {hi} - {lo}))::HUGEINT FROM {source.relation()} "
                        f"WHERE {where}", params).fetchall()[0][0]
    return int(found or 0)


def collectives(profile: Profile, window: Window,
                con: duckdb.DuckDBPyConnection | None = None) -> Collectives:
    """Collective time in the window: CcOps starting in it (count), Σ of their durations clipped to
    the window, |∪ clipped| (active). Whole window: ``Summary.cc_op_count``, ``cc_op_time``,
    ``cc_op_active_time[_percent]``."""
    with _connection(con) as c:
        return _collectives(profile, window, c)[0]


# -- everything at once ------------------------------------------------------------------------------


class _connection:
    """The caller's connection, or a private one closed on exit."""

    def __init__(self, con: duckdb.DuckDBPyConnection | None) -> None:
        self.own = con is None
        self.con = con or sqlsource.connect(memory_limit="1GB")

    def __enter__(self) -> duckdb.DuckDBPyConnection:
        return self.con

    def __exit__(self, *exc: object) -> None:
        if self.own:
            self.con.close()


def figures(profile: Profile, window: Window | None = None,
            con: duckdb.DuckDBPyConnection | None = None) -> Figures:
    """Every figure of ``window`` (default: the whole execution, :func:`whole`)."""
    with _connection(con) as c:
        window = window if window is not None else whole(profile, c)
        instr = _instructions(profile, window, c)
        dma_fig, dma_segments = _dma(profile, window, c)
        cc, cc_segments = _collectives(profile, window, c)
        pieces = [instr.segments, dma_segments, cc_segments]
        cc_instr = TableSource(profile, "CcInstruction")
        if cc_instr.present:
            _, _, _, total, _ = _sweep(profile, cc_instr, window, c, "0")
            pieces.append(total.segments()[1:])
        starts = np.concatenate([p[0] for p in pieces])
        ends = np.concatenate([p[1] for p in pieces])
        active = union_length(starts, ends) if starts.size else 0
        any_events = any(TableSource(profile, t).present for t in ("Instruction", "DmaPacket", "CcOp"))
        return Figures(window, instr.engines, instr.tracks, dma_fig, hbm_bytes(profile, window, c),
                       flops(profile, window, c), cc, active if any_events else None,
                       Hardware.from_metadata(profile.metadata))


def _get(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _ns(row: Mapping[str, Any], key: str) -> int:
    seconds = _get(row, key)
    return 0 if seconds is None else round(seconds * 1e9)


def _int(row: Mapping[str, Any], key: str) -> int | None:
    value = _get(row, key)
    return None if value is None else int(value)


def from_summary(row: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> Figures:
    """The whole-execution :class:`Figures` as a stored ``Summary`` row holds them (what a view shows
    for a profile without scanning it; equal to ``figures(p, whole(p))`` for a profile whose Summary
    was computed by ``formats.summary``). Per-row (track) figures are not in the Summary: empty."""
    seconds = _get(row, "total_time")
    length = None if seconds is None else float(round(seconds * 1e9))
    window = Window(None, None, length)
    engines = {}
    for name in ENGINE_NAMES:
        stem = name.lower()
        if not _get(row, f"{stem}_engine_instruction_count"):
            continue  # the scan reports the engines that ran instructions
        engines[name] = Busy(name, _ns(row, f"{stem}_engine_active_time"), length,
                             _int(row, f"{stem}_engine_instruction_count") or 0,
                             _ns(row, f"{stem}_engine_instruction_time"))
    packets = sum(_int(row, f"{c}_dma_packet_count") or 0 for c in ("static", "software_dynamic",
                                                                     "hardware_dynamic"))
    dma_fig = DmaFigures(packets, _int(row, "dma_transfer_total_bytes") or 0, _ns(row, "dma_active_time"),
                         length, _int(row, "dma_transfer_count"))
    read, write = _int(row, "hbm_read_bytes"), _int(row, "hbm_write_bytes")
    hbm = HbmBytes(read, write, None if read is None and write is None else "Summary")
    flop = Flops(_int(row, "hardware_flops"), _int(row, "transpose_flops"), _int(row, "model_flops"))
    cc = Collectives(_int(row, "cc_op_count") or 0, _ns(row, "cc_op_time"), _ns(row, "cc_op_active_time"),
                     length)
    active = None if row.get("total_active_time") is None else _ns(row, "total_active_time")
    hardware = Hardware.from_metadata(metadata) if metadata else _hardware_from_row(row, length)
    return Figures(window, engines, {}, dma_fig, hbm, flop, cc, active, hardware)


def _hardware_from_row(row: Mapping[str, Any], length: float | None) -> Hardware:
    """Peak FLOP/s and HBM bandwidth implied by the row's own utilisation figures (a Summary row does
    not carry Metadata): PEAK = hardware_flops / (hfu x T), HBM_BW = HBM bytes / (mbu x T)."""
    peak = hbm = None
    hfu, hw_flops = _get(row, "hfu_estimated_percent"), _get(row, "hardware_flops")
    if hfu and hw_flops and length:
        peak = hw_flops / (hfu * length * 1e-9)
    mbu = _get(row, "mbu_estimated_percent")
    total = (_get(row, "hbm_read_bytes") or 0) + (_get(row, "hbm_write_bytes") or 0)
    if mbu and total and length:
        hbm = total / (mbu * length * 1e-9)
    return Hardware(peak, hbm, None)


# -- training steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingStepFigures:
    """The headline figures of a training step (docs/figures.md, "Training step").

    * ``step_s`` = step time S (seconds, the step's wall time on its slowest rank);
    * ``seq_per_s`` = global batch B / S; ``tokens_per_s`` = B x sequence length / S;
    * ``mfu`` = model FLOPs of the step / (S x ranks x peak FLOP/s per rank), where model FLOPs are
      6 N + 12 L h s per token (PaLM, appendix B: weights forward + backward, and attention),
      counted once whatever is recomputed or padded -- so MFU is comparable across layouts.
    """

    step_s: float
    seq_per_s: float
    tokens_per_s: float
    mfu: float | None


def training_step_figures(step_ns: float, global_batch: int, seq: int, model_flops: float,
                          ranks: int, peak_flops_per_rank: float | None) -> TrainingStepFigures:
    """:class:`TrainingStepFigures` from a step's time, batch and model FLOPs (one definition for the
    bench, the Summary and neuron-top)."""
    step_s = step_ns / 1e9
    seq_per_s = global_batch / step_s if step_s > 0 else 0.0
    capacity = step_s * ranks * (peak_flops_per_rank or 0.0)
    mfu = model_flops / capacity if capacity > 0 else None
    return TrainingStepFigures(step_s, seq_per_s, seq_per_s * seq, mfu)


def collective_overlap(durations_ns: Sequence[float], overlaps_ns: Sequence[float]) -> float | None:
    """Communication/computation overlap of a set of collectives: Σ time each ran while a compute
    engine was busy / Σ their durations (None for no collective time). docs/figures.md, "Training
    step"."""
    total = float(sum(durations_ns))
    return float(sum(overlaps_ns)) / total if total > 0 else None
