"""The scans behind ``formats.summary``: grouped DuckDB aggregates and the sliced interval sweeps.

``formats.summary`` turns what this module measures into the Summary's columns; this module only
reads: one grouped scan of ``Instruction`` by (engine spelling, opcode), one of ``DmaPacket`` by queue
type, transfer and collective totals, and the time-sliced sweep (``formats.intervals``) that yields
every union ("active time") and the DmaUsage samples. Why slices: see ``formats.intervals``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import duckdb
import numpy as np
import pyarrow as pa

from formats.figures import Hardware, device_time_ns
from formats.intervals import UnionAccumulator, key_order, merge_slices, start_order, time_slices
from formats.schema import ENGINE_NAMES, canonical_engine
from formats.sqlsource import TableSource, ident, literal
from neuroncore.enums import Engine

if TYPE_CHECKING:
    from formats.lod import LodBuilder
    from formats.reader import Profile

T = TypeVar("T")
_Columns = dict[str, dict[str, np.ndarray]]  # one time slice: query name -> column -> values

ENGINE_STEMS: dict[str, str] = {e.label: e.stem for e in Engine}  # "GpSimd" -> "gpsimd"
OTHER_ENGINE = len(ENGINE_NAMES)  # code of an engine name we do not know (kept in totals)

# Opcodes that do not count towards total_exec_time (§4.1: setup/teardown).
SETUP_OPCODES = ("NOP", "SET_ORDERING_MODE", "EVENT_SEMAPHORE", "EVENT_SEMAPHORE_RANGE_CLEAR", "NOTIFY",
                 "COMPARE_BRANCH", "DRAIN", "WRITE", "TENSOR_LOAD", "MODIFY_POOL_CONFIG")
ACTIVATE_OPCODES = ("ACTIVATE", "ACTIVATE_QUANTIZE")

# DMA classes by queue_type (§4.4): static = compiler-generated queues.
STATIC, SOFTWARE_DYNAMIC, HARDWARE_DYNAMIC, UNKNOWN_DMA = 0, 1, 2, 3
DMA_CLASS = {"instruction": STATIC, "input": STATIC, "output": STATIC, "data": STATIC,
             "software_dynamic": SOFTWARE_DYNAMIC, "hardware_dynamic": HARDWARE_DYNAMIC}

ROWS_PER_SLICE = 2_000_000
DMA_USAGE_MAX_SAMPLES = 20_000
DMA_USAGE_MIN_PERIOD_NS = 1_000

# Keys of the accumulators (small integers so NumPy sorts them by radix): DMA classes are class + 1.
_TOTAL = 0
_DYNAMIC = 10



@dataclass(frozen=True)
class ProgramFacts:
    """What the compiled program (the NEFF) says and the event tables cannot: sizes and queue count.
    The recorder passes them at close; profiles summarised later without them leave these null."""

    weight_size_bytes: int | None = None
    input_size_bytes: int | None = None
    output_size_bytes: int | None = None
    dma_queue_count: int | None = None


# -- the computation --------------------------------------------------------------------------------


class _Computation:
    """One profile's summary: the aggregate queries, the sliced sweeps, then the formulas."""

    def __init__(self, profile: Profile, facts: ProgramFacts | None, con: duckdb.DuckDBPyConnection,
                 rows_per_slice: int, extra_rows: int, prefetch: bool = True) -> None:
        self.profile = profile
        self.facts = facts or ProgramFacts()
        self.con = con
        self.rows_per_slice = rows_per_slice
        self.prefetch = prefetch
        self.extra_rows = extra_rows
        self.hw = Hardware.from_metadata(profile.metadata)
        self.instr = TableSource(profile, "Instruction")
        self.packets = TableSource(profile, "DmaPacket")
        self.transfers = TableSource(profile, "DmaPacketAggregated")
        self.cc_ops = TableSource(profile, "CcOp")
        self.cc_instr = TableSource(profile, "CcInstruction")
        self.notes: list[str] = []

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, list(params)).fetchall()

    # -- aggregates ------------------------------------------------------------------------------
    def instruction_keys(self) -> tuple[list[str], list[str], bool, int | None, int | None]:
        """(engine spellings, opcodes, several pcores?, first start, last end): what the sweep needs
        before the big aggregate is done, from one cheap scan of three small columns."""
        if not self.instr.present:
            return [], [], False, None, None
        pcore = f"coalesce({self.instr.col('pcore_idx')}, 0)" if self.instr.has("pcore_idx") else "0"
        rows = self.con.cursor().execute(
            f"SELECT engine, opcode, max({pcore}), min(start_ts), max(end_ts) FROM {self.instr.relation()} "
            f"GROUP BY ALL").fetchall()
        return (sorted({str(r[0]) for r in rows}), sorted({str(r[1]) for r in rows}), any(r[2] for r in rows),
                min(r[3] for r in rows), max(r[4] for r in rows))

    def instruction_groups(self) -> list[dict[str, Any]]:
        """One row per (engine spelling, opcode, pcore, tensor_instruction_type, attributed to an HLO
        op or not) with every sum the Summary needs. Per-row work is plain sums: what depends on the
        instruction type or the HLO attribution (transpose and model FLOPs) is grouped on -- a few
        groups -- and resolved per group in Python, which costs a third less than CASE per row."""
        if not self.instr.present:
            return []
        c = self.instr.col
        raw, flops_t, adjusted, adj_t = (c("raw_flops"), c("flops_transpose"), c("adjusted_flops"),
                                         c("adjusted_flops_transpose"))
        byte_columns = ("hbm_read_bytes", "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes",
                        "psum_read_bytes", "psum_write_bytes", "spill_save_bytes", "spill_reload_bytes",
                        "psum_read_sbuf_write_bytes", "input_queue_bytes", "output_queue_bytes",
                        "weight_queue_bytes")
        sums = ", ".join(f"sum({c(b)}) AS {b}" if self.instr.has(b) else f"NULL AS {b}" for b in byte_columns)
        psum_sbuf = c("psum_read_sbuf_write_bytes")
        pcore = f"coalesce({c('pcore_idx')}, 0)" if self.instr.has("pcore_idx") else "0"
        kind = c("tensor_instruction_type") if self.instr.has("tensor_instruction_type") else "NULL::VARCHAR"
        hlo = f"{c('raw_hlo_id')} IS NOT NULL" if self.instr.has("raw_hlo_id") else "false"
        sql = f"""
            SELECT {ident('engine')} AS raw_engine, opcode, {pcore} AS pcore, {kind} AS kind, {hlo} AS hlo,
                   count(*) AS n, sum(duration_ns) AS instruction_ns,
                   sum(greatest({raw}, {flops_t})) AS pe_flops, sum({flops_t}) AS ft,
                   sum({raw}) FILTER (WHERE {flops_t} IS NULL) AS raw_bare,
                   sum(greatest({adjusted}, {adj_t})) AS adj_pe_flops, sum({adj_t}) AS adj_t,
                   sum({adjusted}) FILTER (WHERE {adj_t} IS NULL AND {flops_t} IS NULL) AS adj_bare,
                   {sums},
                   count(*) FILTER (WHERE {psum_sbuf} > 0) AS psum_sbuf_n,
                   count({psum_sbuf}) AS psum_sbuf_known,
                   min(start_ts) AS first, max(end_ts) AS last
            FROM {self.instr.relation()} GROUP BY ALL"""
        cursor = self.con.cursor().execute(sql)  # a cursor of its own: it may run beside the sweep
        names = [d[0] for d in cursor.description]
        return [_resolve_group(dict(zip(names, values))) for values in cursor.fetchall()]

    def packet_groups(self) -> list[dict[str, Any]]:
        """One row per raw queue_type with packet counts, bytes, time and HBM bytes."""
        if not self.packets.present:
            return []
        c = self.packets.col
        sql = f"""
            SELECT queue_type AS raw_type, count(*) AS n, sum(transfer_bytes)::HUGEINT AS nbytes,
                   sum(duration_ns)::HUGEINT AS packet_ns,
                   sum({c('hbm_read_bytes')})::HUGEINT AS hbm_read,
                   sum({c('hbm_write_bytes')})::HUGEINT AS hbm_write,
                   min(start_ts) AS first, max(end_ts) AS last
            FROM {self.packets.relation()} GROUP BY ALL"""
        cursor = self.con.execute(sql)
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, values)) for values in cursor.fetchall()]
        for row in rows:
            kind = (row["raw_type"] or "unknown").lower()
            row["kind"], row["dma_class"] = kind, DMA_CLASS.get(kind, UNKNOWN_DMA)
        return rows

    def transfer_totals(self) -> dict[str, Any]:
        """Transfers (compiler blocks): the aggregated table if present, else packets by aggregation id."""
        if self.transfers.present:
            sql = f"""SELECT count(*), sum(duration_ns)::HUGEINT, sum(transfer_bytes)::HUGEINT,
                             sum(transfer_bytes) FILTER (WHERE lower(queue_type) = 'input')::HUGEINT,
                             sum(transfer_bytes) FILTER (WHERE lower(queue_type) = 'output')::HUGEINT,
                             sum(transfer_bytes) FILTER (WHERE lower(queue_type) = 'data')::HUGEINT
                      FROM {self.transfers.relation()}"""
        elif self.packets.present:
            sql = f"""SELECT count(*), sum(last - first)::HUGEINT, sum(nbytes)::HUGEINT,
                             sum(nbytes) FILTER (WHERE kind = 'input')::HUGEINT,
                             sum(nbytes) FILTER (WHERE kind = 'output')::HUGEINT,
                             sum(nbytes) FILTER (WHERE kind = 'data')::HUGEINT
                      FROM (SELECT packet_aggregation_id, min(start_ts) AS first, max(end_ts) AS last,
                                   sum(transfer_bytes) AS nbytes, lower(any_value(queue_type)) AS kind
                            FROM {self.packets.relation()} GROUP BY packet_aggregation_id)"""
        else:
            return {"count": 0, "time_ns": 0, "bytes": 0, "input": 0, "output": 0, "data": 0}
        count, time_ns, nbytes, inp, out, data = self.query(sql)[0]
        return {"count": int(count or 0), "time_ns": int(time_ns or 0), "bytes": int(nbytes or 0),
                "input": int(inp or 0), "output": int(out or 0), "data": int(data or 0)}

    def cc_totals(self, source: TableSource) -> dict[str, Any]:
        if not source.present:
            return {"count": 0, "time_ns": 0, "first": None, "last": None}
        count, time_ns, first, last = self.query(
            f"SELECT count(*), sum(duration_ns)::HUGEINT, min(start_ts), max(end_ts) "
            f"FROM {source.relation()}")[0]
        return {"count": int(count), "time_ns": int(time_ns or 0), "first": first, "last": last}

    # -- time bases ------------------------------------------------------------------------------
    def total_time_ns(self, spans: Sequence[tuple[Any, Any]]) -> tuple[float | None, str]:
        """T: ``formats.figures.device_time_ns`` (one definition for the Summary and every window)."""
        return device_time_ns(self.profile, self.con, spans)

    # -- sweeps ----------------------------------------------------------------------------------
    def sweep(self, engines: list[str], opcodes: list[str], pcores: bool, dma_kinds: list[str],
              usage: _DmaUsage | None, segments: bool,
              segment_sink: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
              lod: LodBuilder | None = None) -> dict[str, UnionAccumulator]:
        """Every union the Summary needs, in time slices over Instruction, DmaPacket and the CC tables.
        The next slice is fetched on a second cursor while this one is swept (DuckDB and NumPy both
        release the GIL), so scanning and sweeping overlap."""
        acc = {"engine": UnionAccumulator(keep_segments=segments), "opcode": UnionAccumulator(),
               "dma": UnionAccumulator(), "cc_op": UnionAccumulator(), "cc_instr": UnionAccumulator(),
               "total": UnionAccumulator()}
        tables = [t for t in (self.instr, self.packets, self.cc_ops, self.cc_instr) if t.present]
        if not tables:
            return acc
        slices = merge_slices(*(time_slices(t.files, "start_ts", self.rows_per_slice) for t in tables))
        queries = self._slice_queries(engines, opcodes, pcores, dma_kinds, ids=lod is not None)
        engine_codes = np.array([OTHER_ENGINE] + [_engine_code(e) for e in engines], np.int64)
        kind_class = np.array([UNKNOWN_DMA, *(DMA_CLASS.get(k.lower(), UNKNOWN_DMA) for k in dma_kinds)],
                              np.int64)
        n_ops = len(opcodes) + 1
        cursor = self.con.cursor()

        def fetch(bounds: tuple[int | None, int | None]) -> _Columns:
            where, params = _slice_filter(*bounds)
            return {name: cursor.execute(sql.format(where=where), params).fetchnumpy()
                    for name, sql in queries.items()}

        # prefetch: read the next slice while this one is swept; without it (a capture's close, maybe at
        # interpreter exit where no thread can start) one slice is in memory at a time
        pool = ThreadPoolExecutor(1, thread_name_prefix="summary-scan") if self.prefetch else None
        with pool if pool is not None else contextlib.nullcontext():
            pending: Future[_Columns] | _Ready[_Columns] = (
                pool.submit(fetch, slices[0]) if pool else _Ready(functools.partial(fetch, slices[0])))
            for index in range(len(slices)):
                data = pending.result()
                if index + 1 < len(slices):
                    bounds = slices[index + 1]
                    pending = pool.submit(fetch, bounds) if pool else _Ready(functools.partial(fetch, bounds))
                sorted_s: list[np.ndarray] = []
                sorted_e: list[np.ndarray] = []
                cols = data.get("instr")
                if cols is not None and len(cols["s"]):
                    s, e = _ints(cols["s"]), _ints(cols["e"])
                    code = engine_codes[cols["g"]]
                    by_start = start_order(s)
                    key = code + 8 * cols["p"].astype(np.int64) if pcores else code
                    by_engine = key_order(key, by_start)
                    acc["engine"].add(key, s, e, by_engine)
                    if lod is not None:  # the LOD's level 0 from the same rows, already in engine order
                        lod.add(code[by_engine], cols["o"][by_engine], _ints(cols["i"])[by_engine],
                                s[by_engine], e[by_engine])
                    opkey = code * n_ops + cols["o"].astype(np.int64)
                    _opcode_unions(acc["opcode"], acc["engine"].overlapped, key, opkey, s, e, by_start,
                                   shortcut=not pcores)
                    sorted_s.append(s[by_start])
                    sorted_e.append(e[by_start])
                cols = data.get("dma")
                if cols is not None and len(cols["s"]):
                    s, e = _ints(cols["s"]), _ints(cols["e"])
                    klass = kind_class[cols["k"]]
                    by_start = start_order(s)
                    acc["dma"].add(klass + 1, s, e, key_order(klass + 1, by_start))
                    acc["dma"].add(_TOTAL, s, e, by_start)
                    dynamic = (klass == SOFTWARE_DYNAMIC) | (klass == HARDWARE_DYNAMIC)
                    if dynamic.any():
                        acc["dma"].add(_DYNAMIC, s[dynamic], e[dynamic])
                    if usage is not None:
                        usage.add(s, e, _ints(cols["b"]))
                    sorted_s.append(s[by_start])
                    sorted_e.append(e[by_start])
                for name in ("cc_op", "cc_instr"):
                    cols = data.get(name)
                    if cols is not None and len(cols["s"]):
                        s, e = _ints(cols["s"]), _ints(cols["e"])
                        by_start = start_order(s)
                        acc[name].add(_TOTAL, s, e, by_start)
                        sorted_s.append(s[by_start])
                        sorted_e.append(e[by_start])
                if sorted_s:  # sorted runs: the merge below is cheap
                    acc["total"].add(_TOTAL, np.concatenate(sorted_s), np.concatenate(sorted_e))
                if segment_sink is not None:  # ActiveTime rows leave as they close: memory stays one slice's
                    segment_sink(*acc["engine"].drain(include_open=index == len(slices) - 1))
        return acc

    def _slice_queries(self, engines: list[str], opcodes: list[str], pcores: bool,
                       dma_kinds: list[str], ids: bool = False) -> dict[str, str]:
        """One query per table for a slice (``{where}`` filled per slice). Engines, opcodes and queue
        types come back as small codes (positions in the lists the aggregates found)."""
        def listed(values: Sequence[str]) -> str:
            return "[" + ", ".join(literal(v) for v in values) + "]"

        queries: dict[str, str] = {}
        if self.instr.present:
            pcore = f", coalesce({self.instr.col('pcore_idx')}, 0)::UTINYINT AS p" if pcores else ""
            pcore += ", id AS i" if ids else ""
            queries["instr"] = f"""
                SELECT coalesce(list_position({listed(engines)}, engine), 0)::UTINYINT AS g,
                       coalesce(list_position({listed(opcodes)}, opcode), 0)::USMALLINT AS o,
                       start_ts AS s, end_ts AS e{pcore}
                FROM {self.instr.relation()} {{where}}"""
        if self.packets.present:
            kind = f"coalesce(list_position({listed(dma_kinds)}, queue_type), 0)" if dma_kinds else "0"
            queries["dma"] = f"""SELECT ({kind})::UTINYINT AS k, start_ts AS s, end_ts AS e,
                                        transfer_bytes AS b
                                 FROM {self.packets.relation()} {{where}}"""
        for name, source in (("cc_op", self.cc_ops), ("cc_instr", self.cc_instr)):
            if source.present:
                queries[name] = f"SELECT start_ts AS s, end_ts AS e FROM {source.relation()} {{where}}"
        return queries


def _opcode_unions(acc: UnionAccumulator, overlapped: set[int], key: np.ndarray, opkey: np.ndarray,
                   s: np.ndarray, e: np.ndarray, by_start: np.ndarray, shortcut: bool) -> None:
    """Per (engine, opcode) unions of one slice. An engine whose instructions overlapped nothing in
    this slice (nor the segment carried into it) runs serially, so each opcode's union is its plain
    sum: no sort, no sweep. Only engines that did overlap (Tensor's two timeline rows) are swept."""
    if not shortcut:
        acc.add(opkey, s, e, key_order(opkey, by_start))
        return
    if overlapped:
        lookup = np.zeros(max(max(overlapped), int(key.max())) + 1, bool)
        lookup[list(overlapped)] = True
        swept = lookup[key]
    else:
        swept = np.zeros(key.size, bool)
    if swept.any():
        order = by_start[swept[by_start]]
        acc.add(opkey, s, e, key_order(opkey, order))
    serial = ~swept
    if serial.any():
        sums = np.bincount(opkey[serial], weights=(e - s)[serial])
        for k in np.flatnonzero(sums).tolist():
            acc.add_disjoint(k, round(sums[k]))


def _resolve_group(row: dict[str, Any]) -> dict[str, Any]:
    """Per-group FLOP figures from the plain sums (per row: transpose = ``coalesce(flops_transpose,
    raw_flops if TRANSPOSE-typed)``, model = PE FLOPs minus transpose when attributed to an HLO op)."""
    row["engine"] = canonical_engine(row["raw_engine"])
    typed = row["kind"] == "TRANSPOSE"
    parts = [row["ft"], row["raw_bare"] if typed else None]
    transpose = None if all(p is None for p in parts) else sum(int(p) for p in parts if p is not None)
    adj_parts = [row["adj_t"], row["adj_bare"] if typed else None]
    row["transpose_flops"] = transpose
    row["adj_transpose_flops"] = None if all(p is None for p in adj_parts) else \
        sum(int(p) for p in adj_parts if p is not None)
    pe = row["pe_flops"]
    row["model_flops"] = None if not row["hlo"] or pe is None else int(pe) - (transpose or 0)
    if row["engine"] != "Tensor":  # PE FLOPs are the Tensor engine's (§4.2)
        row.update(dict.fromkeys(("pe_flops", "adj_pe_flops", "transpose_flops", "adj_transpose_flops",
                                  "model_flops")))
    setup = row["opcode"] in SETUP_OPCODES
    row["exec_first"], row["exec_last"] = (None, None) if setup else (row["first"], row["last"])
    return row


class _Ready(Generic[T]):
    """A deferred call with a Future's ``result()``: the synchronous stand-in for a prefetch."""

    def __init__(self, call: Callable[[], T]) -> None:
        self.call = call

    def result(self) -> T:
        return self.call()


def _ints(values: Any) -> np.ndarray:
    array = np.asarray(values)
    if np.ma.isMaskedArray(values):
        array = np.ma.filled(values, 0)
    return array.astype(np.int64, copy=False)


def _engine_code(raw: str | None) -> int:
    name = canonical_engine(raw)
    return ENGINE_NAMES.index(name) if name in ENGINE_NAMES else OTHER_ENGINE


def _slice_filter(low: int | None, high: int | None) -> tuple[str, list[int]]:
    conditions, params = [], []
    if low is not None:
        conditions.append("start_ts >= ?")
        params.append(low)
    if high is not None:
        conditions.append("start_ts < ?")
        params.append(high)
    return ("WHERE " + " AND ".join(conditions)) if conditions else "", params


class _DmaUsage:
    """DmaUsage samples: DMA bytes per fixed period, each packet's bytes spread evenly over its
    duration (exact integrals via prefix sums of ramps: O(packets + samples), no per-sample loop)."""

    def __init__(self, first: int, last: int, period_ns: int) -> None:
        self.first = first
        self.period = max(1, int(period_ns))
        self.n = max(1, math.ceil((last - first) / self.period) + 1)
        self.rate = np.zeros(self.n + 1)
        self.rate_at = np.zeros(self.n + 1)
        self.rate_end = np.zeros(self.n + 1)
        self.rate_end_at = np.zeros(self.n + 1)

    def add(self, start: np.ndarray, end: np.ndarray, nbytes: np.ndarray) -> None:
        s = (start - self.first).astype(np.float64)
        e = (end - self.first).astype(np.float64)
        duration = np.maximum(e - s, 1.0)
        rate = nbytes / duration
        e = np.maximum(e, s + 1.0)
        # bytes moved before edge x = Σ rate·(max(0, x - s) - max(0, x - e)); edges at k·period
        for position, sums, weighted in ((s, self.rate, self.rate_at), (e, self.rate_end, self.rate_end_at)):
            bucket = np.clip(np.floor(position / self.period).astype(np.int64) + 1, 0, self.n)
            sums += np.bincount(bucket, weights=rate, minlength=self.n + 1)
            weighted += np.bincount(bucket, weights=rate * position, minlength=self.n + 1)

    def table(self) -> pa.Table:
        edges = np.arange(self.n + 1, dtype=np.float64) * self.period
        before = (edges * np.cumsum(self.rate) - np.cumsum(self.rate_at)) - \
                 (edges * np.cumsum(self.rate_end) - np.cumsum(self.rate_end_at))
        moved = np.maximum(np.diff(before), 0.0)
        cumulative = np.rint(np.cumsum(moved)).astype(np.int64)
        return pa.table({
            "timestamp": pa.array(self.first + np.arange(self.n, dtype=np.int64) * self.period),
            "current_throughput": pa.array((moved / (self.period * 1e-9)).astype(np.float32)),
            "total_transfer_bytes": pa.array(cumulative),
            "pcore_idx": pa.array(np.zeros(self.n, np.int64)),
        })


def _usage_period(profile: Profile, con: duckdb.DuckDBPyConnection, first: int, last: int) -> tuple[int, int]:
    """(origin, period) of the DmaUsage samples: HbmUsage's grid when the profile has one (so the two
    counters line up sample for sample), else the first packet and span / DMA_USAGE_MAX_SAMPLES, at
    least 1 us."""
    hbm = TableSource(profile, "HbmUsage")
    span = max(1, last - first)
    floor = max(DMA_USAGE_MIN_PERIOD_NS, math.ceil(span / DMA_USAGE_MAX_SAMPLES))
    if hbm.present and hbm.num_rows > 1:
        rows = con.execute(f"SELECT timestamp FROM {hbm.relation()} ORDER BY timestamp LIMIT 64").fetchall()
        diffs = sorted(b[0] - a[0] for a, b in itertools.pairwise(rows) if b[0] > a[0])
        if diffs:
            period = max(floor, int(diffs[len(diffs) // 2]))
            origin = int(rows[0][0])
            return (origin if origin <= first else first), period
    return first, floor


