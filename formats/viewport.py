"""What a timeline draws: one engine's instructions in [t0, t1], at most one per pixel bucket.

    window = engine_window(profile, "Tensor", t0, t1, buckets=2000)
    window.start_ts, window.end_ts, window.id, window.opcode    # the longest event of each bucket

A timeline never draws 20M rectangles; per pixel it draws the longest event there (Perfetto's rule
for zoomed-out tracks). Two paths answer that, and the caller cannot tell them apart:

* **Zoomed in** (a pixel narrower than ``InstructionLod``'s finest bucket): DuckDB reads only the row
  groups whose ``start_ts``/``end_ts`` statistics overlap the window -- our writer keeps row groups
  time-clustered and writes those statistics -- and keeps the longest event per pixel bucket.
* **Zoomed out**: the precomputed level of detail. ``InstructionLod`` (our extension table, written
  when a capture closes, like the real tool's pre-bucketed ``DmaUsageSummary``) holds per engine and
  per level the longest instruction starting in each bucket; widths grow 4x per level from span / 2^17.
  The coarsest level whose bucket still fits in a pixel is read (held in memory: a few MB) and
  reduced to pixel buckets. A profile without the table (the real tool's, or an interrupted capture)
  gets it built on first use, once per ``Viewport``.

An event belongs to the bucket its start falls in (events that began before ``t0`` go to bucket 0),
so the two paths agree except at pixel edges where an LOD bucket straddles two pixels.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from formats import sqlsource
from formats.lod import LOD_TABLE, build_lod, lod_geometry
from formats.schema import ENGINE_NAMES, canonical_engine
from formats.sqlsource import TableSource, literal

__all__ = ["LOD_TABLE", "Viewport", "Window", "build_lod", "engine_window", "lod_geometry", "viewport"]

if TYPE_CHECKING:
    from formats.reader import Profile

TRACK_ONLY = ("tensormatrix",)  # timeline rows that are part of an engine, not an engine (§2.5)


@dataclass(frozen=True)
class Window:
    """The events to draw: one (the longest) per non-empty pixel bucket, in bucket order."""

    bucket: np.ndarray  # int64 pixel bucket index in [0, buckets)
    start_ts: np.ndarray
    end_ts: np.ndarray
    duration_ns: np.ndarray
    id: np.ndarray
    opcode: list[str]
    count: np.ndarray  # instructions starting in the bucket (raw path: overlapping it)
    source: str  # "instructions" or "lod level N"

    def __len__(self) -> int:
        return int(self.bucket.size)


class _Lod:
    """An InstructionLod table held as NumPy arrays per (engine, level), sorted by bucket start."""

    def __init__(self, table: pa.Table) -> None:
        self.levels: dict[str, list[tuple[int, dict[str, np.ndarray]]]] = {}
        self.max_duration: dict[str, int] = {}
        if table.num_rows == 0:
            return
        engine_codes, engine_names = _codes(table.column("engine"))
        opcode_codes, self.opcode_names = _codes(table.column("opcode"))
        level = table.column("level").to_numpy()
        cols = {n: table.column(n).to_numpy() for n in ("bucket_ts", "bucket_width_ns", "start_ts", "end_ts",
                                                         "duration_ns", "id", "count")}
        cols["opcode"] = opcode_codes
        by_name: dict[str, list[int]] = {}
        for code, raw in enumerate(engine_names):
            by_name.setdefault(canonical_engine(raw) or "", []).append(code)
        for name, codes in sorted(by_name.items()):
            mine = np.isin(engine_codes, codes)
            entries = []
            for lv in sorted(set(level[mine].tolist())):
                sel = mine & (level == lv)
                order = np.argsort(cols["bucket_ts"][sel], kind="stable")
                part = {k: v[sel][order] for k, v in cols.items()}
                entries.append((int(part["bucket_width_ns"][0]), part))
            self.levels[name] = entries
            durations = [int(p["duration_ns"].max()) for _, p in entries if p["duration_ns"].size]
            self.max_duration[name] = max(durations, default=0)

    def finest_width(self, engine: str) -> int | None:
        entries = self.levels.get(engine)
        return entries[0][0] if entries else None

    def window(self, engine: str, t0: int, t1: int, buckets: int) -> Window | None:
        entries = self.levels.get(engine)
        if not entries:
            return None
        pixel = (t1 - t0) / buckets
        usable = [(w, p) for w, p in entries if w <= pixel]
        if not usable:
            return None
        width, part = usable[-1]
        level = entries.index((width, part))
        lo = np.searchsorted(part["bucket_ts"], t0 - self.max_duration.get(engine, 0) - width, "left")
        hi = np.searchsorted(part["bucket_ts"], t1, "left")
        sel = slice(lo, hi)
        keep = part["end_ts"][sel] > t0
        s = part["start_ts"][sel][keep]
        cols = {k: v[sel][keep] for k, v in part.items()}
        bucket = np.clip((s - t0) * buckets // (t1 - t0), 0, buckets - 1).astype(np.int64)
        cols["opcode"] = self.opcode_names[cols["opcode"]]
        return _longest_per_bucket(bucket, cols, f"lod level {level}")


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(per-row code, distinct values) of a string column, without a Python string per row."""
    encoded = column.combine_chunks()
    if not pa.types.is_dictionary(encoded.type):
        encoded = encoded.dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, np.asarray(encoded.dictionary.to_pylist(), dtype=object)


def _longest_per_bucket(bucket: np.ndarray, cols: dict[str, np.ndarray], source: str) -> Window:
    order = np.lexsort((-cols["duration_ns"], bucket))
    b = bucket[order]
    head = np.r_[True, b[1:] != b[:-1]] if b.size else np.zeros(0, bool)
    idx = order[head]
    counts = np.add.reduceat(cols["count"][order], np.flatnonzero(head)) if b.size else np.zeros(0, np.int64)
    return Window(bucket[idx], cols["start_ts"][idx], cols["end_ts"][idx], cols["duration_ns"][idx],
                  cols["id"][idx], [str(x) for x in cols["opcode"][idx]], counts.astype(np.int64), source)


class Viewport:
    """Window queries over one profile's Instruction table, with a DuckDB connection and the LOD
    kept between calls (a TUI or GUI holds one per open profile)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.source = TableSource(profile, "Instruction")
        self.con = sqlsource.connect(memory_limit="512MB")
        self._lod: _Lod | None = None
        self._spellings: dict[str, list[str]] | None = None
        self._lock = threading.Lock()
        self._max_duration: int | None = None

    def close(self) -> None:
        self.con.close()

    # -- the LOD ----------------------------------------------------------------------------------
    def lod(self) -> _Lod:
        if self._lod is None:
            if self.profile.num_rows(LOD_TABLE):
                table = self.profile.table(LOD_TABLE)
            else:
                table = build_lod(self.profile, self.con)
            self._lod = _Lod(table)
        return self._lod

    def _engine_spellings(self, engine: str) -> list[str]:
        """Every spelling of ``engine`` the Instruction table uses (real profiles differ, §2.5)."""
        if self._spellings is None:
            rows = self.con.execute(f"SELECT DISTINCT engine FROM {self.source.relation()}").fetchall()
            spellings: dict[str, list[str]] = {}
            for (raw,) in rows:
                spellings.setdefault(canonical_engine(raw) or "", []).append(raw)
            self._spellings = spellings
        return self._spellings.get(engine, [])

    def _longest(self) -> int:
        if self._max_duration is None:
            if self.profile.num_rows(LOD_TABLE):
                self._max_duration = max(self.lod().max_duration.values(), default=0)
            else:
                row = self.con.execute(f"SELECT max(duration_ns) FROM {self.source.relation()}").fetchall()[0]
                self._max_duration = int(row[0] or 0) if row else 0
        return self._max_duration

    # -- queries ----------------------------------------------------------------------------------
    def engine_window(self, engine: str, t0: int, t1: int, buckets: int = 2000) -> Window:
        """Instructions of ``engine`` (an engine in any spelling, or a timeline track such as
        ``TensorMatrix``) overlapping [t0, t1), reduced to the longest one per pixel bucket."""
        t0, t1, buckets = int(t0), int(t1), max(1, int(buckets))
        if t1 <= t0:
            raise ValueError(f"empty window: t1 ({t1}) must be after t0 ({t0})")
        with self._lock:
            name = canonical_engine(engine) or engine
            if name in ENGINE_NAMES and engine.lower() not in TRACK_ONLY:
                wanted = self._lod is not None or self._lod_worth_it(name, t0, t1, buckets)
                lod = self.lod() if wanted else None
                if lod is not None:
                    window = lod.window(name, t0, t1, buckets)
                    if window is not None:
                        return window
                condition = self._engine_condition(name)
            else:
                condition = f"{sqlsource.ident('timeline_track')} = {literal(engine)}"
            return self._raw(condition, t0, t1, buckets)

    def _lod_worth_it(self, engine: str, t0: int, t1: int, buckets: int) -> bool:
        """Build (or load) the LOD only when a pixel is wider than its finest bucket."""
        if self.profile.num_rows(LOD_TABLE):
            return True
        meta = self.profile.metadata
        first, last = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
        if first is None or last is None or last <= first:
            return True
        _, widths = lod_geometry(first, last)
        return (t1 - t0) / buckets >= widths[0]

    def _engine_condition(self, engine: str) -> str:
        spellings = self._engine_spellings(engine) or [engine]
        return f"engine IN ({', '.join(literal(s) for s in spellings)})"

    def _raw(self, condition: str, t0: int, t1: int, buckets: int) -> Window:
        if not self.source.present:
            empty = np.zeros(0, np.int64)
            return Window(empty, empty, empty, empty, empty, [], empty, "instructions")
        lookback = t0 - self._longest()
        opcode = self.source.col("opcode", engines=False)
        cols = self.con.execute(f"""
            SELECT b, arg_max(start_ts, duration_ns) AS start_ts, arg_max(end_ts, duration_ns) AS end_ts,
                   max(duration_ns) AS duration_ns, arg_max(id, duration_ns) AS id,
                   arg_max(op, duration_ns) AS opcode, count(*) AS count
            FROM (SELECT start_ts, end_ts, duration_ns, id, {opcode} AS op,
                         least({buckets - 1}, greatest(0, (start_ts - {t0}) * {buckets} // {t1 - t0})) AS b
                  FROM {self.source.relation()}
                  WHERE {condition} AND start_ts < {t1} AND end_ts > {t0} AND start_ts >= {lookback})
            GROUP BY b ORDER BY b""").fetchnumpy()
        return Window(np.asarray(cols["b"], np.int64), np.asarray(cols["start_ts"], np.int64),
                      np.asarray(cols["end_ts"], np.int64), np.asarray(cols["duration_ns"], np.int64),
                      np.asarray(cols["id"], np.int64), [str(x) for x in cols["opcode"]],
                      np.asarray(cols["count"], np.int64), "instructions")


_VIEWPORTS: weakref.WeakKeyDictionary[Profile, Viewport] = weakref.WeakKeyDictionary()


def viewport(profile: Profile) -> Viewport:
    """The cached ``Viewport`` of ``profile`` (one per Profile object, dropped with it)."""
    found = _VIEWPORTS.get(profile)
    if found is None:
        found = _VIEWPORTS[profile] = Viewport(profile)
    return found


def engine_window(profile: Profile, engine: str, t0: int, t1: int, buckets: int = 2000) -> Window:
    """Instructions of one engine overlapping [t0, t1], reduced to at most ``buckets`` pixel buckets
    with the longest event per bucket. Reuses a per-profile ``Viewport`` (connection, LOD)."""
    return viewport(profile).engine_window(engine, t0, t1, buckets)
