"""A profile's events and dependency edges as flat NumPy arrays: the input of every causal analysis.

    graph = load_graph(profile)            # Instruction + DMA transfers + CcOp, Flow edges between them
    graph.start[i], graph.end[i], graph.kind[i]     # one index space over the three kinds of event

Why a graph of arrays: the critical path and idle attribution (``formats.critical_path``) walk
"what released what" over millions of instructions; that is a pointer chase, done in compiled loops
over integer arrays, never per-row Python objects. Loading is the only part that touches Parquet:
``Instruction`` is read column by column with pyarrow (string columns kept as dictionaries, so ten
million rows cost their integer codes), DMA packets are grouped into transfers and CcOp rows read
with DuckDB, and ``Flow`` edges are mapped from (table, id) to event indices through sorted ids.

Events (one index space, instructions first, then transfers, then collectives):

* an **instruction**: an ``Instruction`` row; its lane is its timeline row
  (``coalesce(timeline_track, engine)``: the Tensor engine's weight-load and matmul streams are two
  in-order streams), its engine the canonical engine name;
* a **DMA transfer**: the packets of one ``DmaPacket.packet_aggregation_id`` (first start, last end;
  the ``dma_block`` id of ``Flow``), its lane its queue;
* a **collective**: a ``CcOp`` row (``cc_op`` id = ``op_id``), its lane its operation.

What is missing is said, never guessed: ``GraphGaps`` lists the tables a profile lacks (no ``Flow``:
dependencies are inferred from timing alone; no ``Instruction``: nothing to analyse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats import sqlsource
from formats.schema import ENGINE_NAMES, canonical_engine
from formats.sqlsource import TableSource

if TYPE_CHECKING:
    import duckdb

    from formats.reader import Profile

__all__ = ["CC", "DMA", "INSTRUCTION", "KIND_NAMES", "TEXT_COLUMNS", "DepGraph", "instruction_text",
           "load_graph"]

TEXT_COLUMNS = ("hlo_name", "layer")
"""Instruction text columns kept (as dictionary codes) for grouping: op and layer. Other columns of
the few events a report names (source lines) are looked up by id (``instruction_text``)."""

INSTRUCTION, DMA, CC = 0, 1, 2
KIND_NAMES = ("instruction", "dma_block", "cc_op")
"""Event kinds by code, spelled as ``Flow.in_table``/``out_table`` name them."""


@dataclass
class DepGraph:
    """Events and dependency edges of one profile (module docstring)."""

    start: np.ndarray  # int64 ns, per event
    end: np.ndarray  # int64 ns
    kind: np.ndarray  # int8: INSTRUCTION, DMA, CC
    ident: np.ndarray  # int64: Instruction.id, packet_aggregation_id, CcOp.op_id
    lane: np.ndarray  # int32: index into ``lanes`` (timeline row, queue or operation)
    engine: np.ndarray  # int8: index into ENGINE_NAMES for instructions, -1 otherwise
    lanes: list[str]
    n_instr: int
    n_dma: int
    n_cc: int
    edge_src: np.ndarray  # int64 event index, per Flow edge both of whose ends are events here
    edge_dst: np.ndarray
    windows: np.ndarray  # int64 (n_executions, 2): [start, end) of each execution, absolute ns
    window_source: str  # where the windows came from (ExecutionInfo, Metadata, event span)
    execution: np.ndarray  # int32 per event: its window (by start time)
    flow_edges: int  # Flow rows in the profile (including ones pointing at absent rows)
    gaps: list[str] = field(default_factory=list)  # what the profile lacks, one sentence each
    dma_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per transfer
    dma_packets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per instruction: codes into ``text_values[column]`` (-1 = null) of the text columns the
    # analyses group by (TEXT_COLUMNS)
    text_codes: dict[str, np.ndarray] = field(default_factory=dict)
    text_values: dict[str, list[str]] = field(default_factory=dict)
    flops: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per instruction: PE FLOPs

    def text(self, column: str, event: int) -> str | None:
        """An instruction's ``column`` value (None for nulls, other events, absent columns)."""
        codes = self.text_codes.get(column)
        if codes is None or event >= self.n_instr or codes[event] < 0:
            return None
        return self.text_values[column][int(codes[event])]

    @property
    def n(self) -> int:
        return int(self.start.size)

    def lane_name(self, event: int) -> str:
        return self.lanes[int(self.lane[event])]

    def engine_name(self, event: int) -> str | None:
        code = int(self.engine[event])
        return ENGINE_NAMES[code] if code >= 0 else None

    @property
    def device_time_ns(self) -> int:
        return int((self.windows[:, 1] - self.windows[:, 0]).sum()) if self.windows.size else 0


class _Lanes:
    """Names of timeline rows, queues and operations, interned to one list."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}

    def code(self, name: str) -> int:
        found = self.index.get(name)
        if found is None:
            found = self.index[name] = len(self.names)
            self.names.append(name)
        return found


def _dictionary_codes(column: pa.ChunkedArray, mapping: dict[str, int], intern: object) -> np.ndarray:
    """Per-row codes of a dictionary (or plain string) column, each distinct value mapped once."""
    out = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        for v in values:
            if v is not None and v not in mapping:
                mapping[v] = intern(v)  # type: ignore[operator]
        codes = np.array([mapping[v] if v is not None else -1 for v in values] + [-1], np.int32)
        idx = chunk.indices.fill_null(len(values)).to_numpy(zero_copy_only=False).astype(np.int64)
        out.append(codes[idx])
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def _int_column(table: pa.Table, name: str, fill: int = -1) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        column = column.fill_null(fill)
    return column.to_numpy().astype(np.int64, copy=False)


def _read_instructions(profile: Profile, lanes: _Lanes,
                       texts: dict[str, tuple[dict[str, int], list[str]]]) -> tuple[np.ndarray, ...]:
    """id, start, end, lane code, engine code, PE FLOPs of every instruction, sorted by id; the codes
    of the TEXT_COLUMNS go to ``texts`` (values interned there) and come back last, one array each."""
    files = profile.files("Instruction")
    ids, starts, ends, lane_codes, engine_codes, flops = [], [], [], [], [], []
    text_parts: dict[str, list[np.ndarray]] = {c: [] for c in TEXT_COLUMNS}
    engine_of: dict[str, int] = {}

    def engine_code(value: str) -> int:
        name = canonical_engine(value)
        return ENGINE_NAMES.index(name) if name in ENGINE_NAMES else -1

    lane_map: dict[str, int] = {}
    for path in files:
        names = pq.ParquetFile(path).schema_arrow.names
        numbers = ("id", "start_ts", "end_ts", "raw_flops", "flops_transpose")
        wanted = (*numbers, "engine", "timeline_track", *TEXT_COLUMNS)
        cols = [c for c in wanted if c in names]
        table = pq.read_table(path, columns=cols, read_dictionary=[c for c in cols if c not in numbers])
        if not table.num_rows:
            continue
        ids.append(_int_column(table, "id"))
        starts.append(_int_column(table, "start_ts", 0))
        ends.append(_int_column(table, "end_ts", 0))
        # PE FLOPs: greatest(raw_flops, flops_transpose), the hardware-FLOPs rule of docs/figures.md
        raw = (_int_column(table, "raw_flops", 0) if "raw_flops" in cols
               else np.zeros(table.num_rows, np.int64))
        if "flops_transpose" in cols:
            raw = np.maximum(raw, _int_column(table, "flops_transpose", 0))
        flops.append(raw)
        engine = _dictionary_codes(table.column("engine"), engine_of, engine_code)
        engine_codes.append(engine)
        # the lane: the timeline row, else the engine's canonical name
        track = (_dictionary_codes(table.column("timeline_track"), lane_map,
                                   lambda v: lanes.code(str(v)))
                 if "timeline_track" in cols else np.full(engine.size, -1, np.int32))
        fallback = np.array([lanes.code(ENGINE_NAMES[e]) if e >= 0 else lanes.code("?")
                             for e in range(-1, len(ENGINE_NAMES))], np.int32)
        track = np.where(track >= 0, track, fallback[engine + 1])
        lane_codes.append(track)
        for column in TEXT_COLUMNS:
            mapping, values = texts[column]

            def intern(v: str, values: list[str] = values) -> int:
                values.append(str(v))
                return len(values) - 1

            text_parts[column].append(_dictionary_codes(table.column(column), mapping, intern)
                                      if column in cols else np.full(engine.size, -1, np.int32))
    if not ids:
        empty = np.zeros(0, np.int64)
        return (empty, empty, empty, empty.astype(np.int32), empty.astype(np.int8), empty,
                *(empty.astype(np.int32) for _ in TEXT_COLUMNS))
    id_ = np.concatenate(ids)
    start = np.concatenate(starts)
    end = np.concatenate(ends)
    lane = np.concatenate(lane_codes).astype(np.int32)
    eng = np.concatenate(engine_codes).astype(np.int8)
    pe_flops = np.concatenate(flops)
    text_codes = [np.concatenate(text_parts[c]).astype(np.int32) for c in TEXT_COLUMNS]
    if id_.size > 1 and not (np.diff(id_) > 0).all():
        order = np.argsort(id_, kind="stable")
        id_, start, end, lane, eng = id_[order], start[order], end[order], lane[order], eng[order]
        pe_flops = pe_flops[order]
        text_codes = [t[order] for t in text_codes]
    return (id_, start, end, lane, eng, pe_flops, *text_codes)


def _windows(profile: Profile, con: duckdb.DuckDBPyConnection, first: int | None,
             last: int | None) -> tuple[np.ndarray, str]:
    """Each execution's [start, end) on the device clock: ExecutionInfo rows (relative to the
    profile's first timestamp), else Metadata's first/last hardware timestamps, else the events'
    span -- the same T as ``formats.figures.device_time_ns``."""
    info = TableSource(profile, "ExecutionInfo")
    origin = profile.metadata.get("first_hw_timestamp")
    if origin is None:
        origin = first
    timed = info.present and info.has("execution_start_ts") and info.has("execution_end_ts")
    if origin is not None and timed:
        rows = con.execute(f"""SELECT execution_start_ts, execution_end_ts FROM {info.relation()}
                               WHERE execution_start_ts IS NOT NULL AND execution_end_ts IS NOT NULL
                               ORDER BY 1""").fetchall()
        if rows:
            return np.array([[origin + a, origin + b] for a, b in rows], np.int64), "ExecutionInfo"
    meta = profile.metadata
    a, b = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
    if a is not None and b is not None and b > a:
        return np.array([[int(a), int(b)]], np.int64), "Metadata first/last_hw_timestamp"
    if first is not None and last is not None:
        return np.array([[first, last]], np.int64), "event span"
    return np.zeros((0, 2), np.int64), "none"


def _index_of(sorted_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position of each wanted id in ``sorted_ids`` (unique, ascending), -1 where absent. A lookup
    table when the ids are dense (our recorder's are), a binary search otherwise."""
    out = np.full(wanted.size, -1, np.int64)
    if not sorted_ids.size or not wanted.size:
        return out
    lo, hi = int(sorted_ids[0]), int(sorted_ids[-1])
    if hi - lo == sorted_ids.size - 1:  # contiguous ids: the position is the offset
        pos = wanted - lo
        return np.where((pos >= 0) & (pos < sorted_ids.size), pos, -1)
    inside = (wanted >= lo) & (wanted <= hi)
    if hi - lo < 4 * sorted_ids.size + 1024:
        lut = np.full(hi - lo + 1, -1, np.int64)
        lut[sorted_ids - lo] = np.arange(sorted_ids.size)
        out[inside] = lut[wanted[inside] - lo]
    else:
        pos = np.searchsorted(sorted_ids, wanted[inside])
        pos = np.minimum(pos, sorted_ids.size - 1)
        hit = sorted_ids[pos] == wanted[inside]
        sub = np.where(hit, pos, -1)
        out[inside] = sub
    return out


def _read_flow(profile: Profile) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """in_id, out_id and the kind codes of in_table/out_table (-1: a table we do not model)."""
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    skinds: list[np.ndarray] = []
    dkinds: list[np.ndarray] = []
    kind_code = {name: code for code, name in enumerate(KIND_NAMES)}
    total = 0
    for path in profile.files("Flow"):
        names = pq.ParquetFile(path).schema_arrow.names
        if not {"in_id", "out_id", "in_table", "out_table"} <= set(names):
            continue
        table = pq.read_table(path, columns=["in_id", "out_id", "in_table", "out_table"],
                              read_dictionary=["in_table", "out_table"])
        total += table.num_rows
        srcs.append(_int_column(table, "in_id"))
        dsts.append(_int_column(table, "out_id"))
        for column, out in (("in_table", skinds), ("out_table", dkinds)):
            mapping: dict[str, int] = {}
            out.append(_dictionary_codes(table.column(column), mapping,
                                         lambda v: kind_code.get(str(v).lower(), -1)))
    if not srcs:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty.astype(np.int32), empty.astype(np.int32), 0
    return (np.concatenate(srcs), np.concatenate(dsts), np.concatenate(skinds), np.concatenate(dkinds),
            total)


def instruction_text(profile: Profile, ids: list[int], column: str,
                     con: duckdb.DuckDBPyConnection | None = None) -> dict[int, str]:
    """``column`` of the instructions with these ``ids`` (a handful: the ones a report names). Read with
    pyarrow, part by part, skipping parts whose id range holds none of them (footer statistics):
    ten million instructions cost a few row groups, not a scan."""
    import pyarrow.compute as pc

    out: dict[int, str] = {}
    if not ids:
        return out
    wanted = pa.array(sorted({int(i) for i in ids}), pa.int64())
    lo, hi = wanted[0].as_py(), wanted[-1].as_py()
    for path in profile.files("Instruction"):
        part = pq.ParquetFile(path)
        if column not in part.schema_arrow.names or "id" not in part.schema_arrow.names:
            continue
        index = part.schema_arrow.names.index("id")
        for g in range(part.num_row_groups):
            stats = part.metadata.row_group(g).column(index).statistics
            if stats is not None and stats.has_min_max and (stats.max < lo or stats.min > hi):
                continue
            table = part.read_row_group(g, columns=["id", column])
            hit = table.filter(pc.is_in(table.column("id").cast(pa.int64()), value_set=wanted))
            for i, v in zip(hit.column("id").to_pylist(), hit.column(column).to_pylist()):
                if v is not None:
                    out[int(i)] = str(v)
    return out


def load_graph(profile: Profile, con: duckdb.DuckDBPyConnection | None = None) -> DepGraph:
    """The events and dependency edges of ``profile`` (module docstring)."""
    own = con is None
    con = con or sqlsource.connect(memory_limit="2GB")
    try:
        return _load(profile, con)
    finally:
        if own:
            con.close()


def _load(profile: Profile, con: duckdb.DuckDBPyConnection) -> DepGraph:
    lanes = _Lanes()
    gaps: list[str] = []
    texts: dict[str, tuple[dict[str, int], list[str]]] = {c: ({}, []) for c in TEXT_COLUMNS}
    i_id, i_start, i_end, i_lane, i_engine, i_flops, *i_text = _read_instructions(profile, lanes, texts)
    if not i_id.size:
        gaps.append("no Instruction rows: there is nothing to analyse")
    packets = TableSource(profile, "DmaPacket")
    d_id = d_start = d_end = d_bytes = d_count = np.zeros(0, np.int64)
    d_lane = np.zeros(0, np.int32)
    if packets.present and packets.has("packet_aggregation_id"):
        col = packets.col
        queue = f"coalesce({col('queue_name')}, 'queue ' || {col('queue_idx')}::VARCHAR, 'DMA')"
        result = con.execute(f"""
            SELECT packet_aggregation_id AS id, min(start_ts) AS s, max(end_ts) AS e,
                   min({queue}) AS q, sum(transfer_bytes)::BIGINT AS b, count(*)::BIGINT AS c
            FROM {packets.relation()} GROUP BY 1 ORDER BY 1""").fetchnumpy()
        d_id = np.asarray(result["id"], np.int64)
        d_start = np.asarray(result["s"], np.int64)
        d_end = np.asarray(result["e"], np.int64)
        d_bytes = np.asarray(result["b"], np.int64)
        d_count = np.asarray(result["c"], np.int64)
        names = [str(q) for q in result["q"]]
        distinct = {q: lanes.code(q) for q in sorted(set(names))}
        d_lane = np.array([distinct[q] for q in names], np.int32)
    elif not packets.present:
        gaps.append("no DmaPacket rows: DMA transfers are not in the dependency graph")
    cc = TableSource(profile, "CcOp")
    c_id = c_start = c_end = np.zeros(0, np.int64)
    c_lane = np.zeros(0, np.int32)
    if cc.present:
        result = con.execute(f"""SELECT {cc.col('op_id')} AS id, start_ts AS s, end_ts AS e,
                                        coalesce({cc.col('operation')}, 'collective') AS op
                                 FROM {cc.relation()} ORDER BY 1, 2""").fetchnumpy()
        c_id = np.asarray(result["id"], np.int64)
        c_start = np.asarray(result["s"], np.int64)
        c_end = np.asarray(result["e"], np.int64)
        ops = [str(o) for o in result["op"]]
        c_lane = np.array([lanes.code(o) for o in ops], np.int32)
    start = np.concatenate([i_start, d_start, c_start])
    end = np.concatenate([i_end, d_end, c_end])
    kind = np.concatenate([np.full(i_id.size, INSTRUCTION, np.int8), np.full(d_id.size, DMA, np.int8),
                           np.full(c_id.size, CC, np.int8)])
    ident = np.concatenate([i_id, d_id, c_id])
    lane = np.concatenate([i_lane, d_lane, c_lane]).astype(np.int32)
    engine = np.concatenate([i_engine, np.full(d_id.size + c_id.size, -1, np.int8)])
    # Flow edges: (table, id) -> event index
    src_id, dst_id, src_kind, dst_kind, n_flow = _read_flow(profile)
    if not n_flow:
        gaps.append("no Flow table: dependencies are inferred from timing alone (an event's predecessor "
                    "is what ended last before it started)")
    offsets = (0, i_id.size, i_id.size + d_id.size)
    sorted_ids = (i_id, d_id, np.sort(c_id))
    cc_order = np.argsort(c_id, kind="stable")
    src = np.full(src_id.size, -1, np.int64)
    dst = np.full(dst_id.size, -1, np.int64)
    for code in (INSTRUCTION, DMA, CC):
        for ids, kinds, out in ((src_id, src_kind, src), (dst_id, dst_kind, dst)):
            sel = np.flatnonzero(kinds == code)
            if not sel.size:
                continue
            pos = _index_of(sorted_ids[code], ids[sel])
            if code == CC:
                pos = np.where(pos >= 0, cc_order[np.maximum(pos, 0)], -1)
            out[sel] = np.where(pos >= 0, pos + offsets[code], -1)
    keep = (src >= 0) & (dst >= 0) & (src != dst)
    first = int(start.min()) if start.size else None
    last = int(end.max()) if end.size else None
    windows, window_source = _windows(profile, con, first, last)
    if windows.size:
        # events that begin before the first window (clock skew) belong to it
        execution = np.maximum(np.searchsorted(windows[:, 0], start, side="right") - 1, 0).astype(np.int32)
        # an execution's window reaches at least its last event and starts no later than its first
        if start.size:
            lo = np.full(windows.shape[0], np.iinfo(np.int64).max, np.int64)
            hi = np.full(windows.shape[0], np.iinfo(np.int64).min, np.int64)
            if windows.shape[0] == 1:
                lo[0], hi[0] = start.min(), end.max()
            else:
                np.minimum.at(lo, execution, start)
                np.maximum.at(hi, execution, end)
            windows[:, 0] = np.minimum(windows[:, 0], lo)
            seen = hi > np.iinfo(np.int64).min
            windows[:, 1] = np.maximum(windows[:, 1], np.where(seen, hi, windows[:, 1]))
    else:
        execution = np.zeros(start.size, np.int32)
    return DepGraph(start=start, end=end, kind=kind, ident=ident, lane=lane, engine=engine,
                    lanes=lanes.names, n_instr=int(i_id.size), n_dma=int(d_id.size), n_cc=int(c_id.size),
                    edge_src=src[keep], edge_dst=dst[keep], windows=windows, window_source=window_source,
                    execution=execution, flow_edges=n_flow, gaps=gaps, dma_bytes=d_bytes, dma_packets=d_count,
                    text_codes=dict(zip(TEXT_COLUMNS, i_text)), flops=i_flops,
                    text_values={c: values for c, (_, values) in texts.items()})
