"""A profile's events and dependency edges as flat NumPy arrays: the input of every causal analysis.

    graph = load_graph(profile)            # Instruction + DMA transfers + CcOp, Flow edges between them
    graph.start[i], graph.end[i], graph.kind[i]     # one index space over the three kinds of event

Why a graph of arrays: the critical path and idle attribution (``formats.critical_path``) walk
"what released what" over millions of instructions; that is a pointer chase, done in compiled loops
over integer arrays, never per-row Python objects. Loading is the only part that touches Parquet:
the few columns needed of ``Instruction``, ``DmaPacket`` and ``Flow`` are decoded part by part on a
thread pool (``formats.part_reader``; string columns kept as dictionaries, so ten million rows cost
their integer codes) straight into arrays allocated once for all events; DMA packets are grouped
into transfers on those arrays (DuckDB only for packets whose columns need its cast rules); CcOp
rows (few) are read with DuckDB; ``Flow`` edges are mapped from (table, id) to event indices in one
compiled pass per kind (an offset for contiguous ids, a lookup table or a binary search otherwise).

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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numba import njit

from formats import sqlsource
from formats.part_reader import (
    PartJob,
    PartStream,
    chunk_codes,
    dictionary_chunks,
    dictionary_codes,
    int_column,
)
from formats.reader import ProfileError
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
    # what the analyses derive from the arrays once per load (formats.event_order's orders)
    cache: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

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


def _part_jobs(profile: Profile, table: str, wanted: Sequence[str], dictionary: Sequence[str],
               required: Sequence[str] = ()) -> list[PartJob]:
    """One job per part of ``table`` holding ``required``: the ``wanted`` columns it has, and where its
    rows go (parts in order, each at the sum of the rows before it)."""
    found = profile.tables.get(table)
    if found is None:
        return []
    jobs = []
    offset = 0
    rows = found.file_rows or [pq.ParquetFile(path).metadata.num_rows for path in found.files]
    for path, schema, count in zip(found.files, found.file_schemas, rows):
        names = set(schema.names)
        if not set(required) <= names:
            continue
        cols = [c for c in wanted if c in names]
        jobs.append(PartJob(table, path, cols, [c for c in dictionary if c in cols], offset, count))
        offset += count
    return jobs


def _checked_rows(job: PartJob, table: pa.Table) -> slice:
    """Where a decoded part's rows go; a part that holds other than its footer's count changed since
    the profile was opened: one clear error, not a silent misplacement."""
    if table.num_rows != job.rows:
        raise ProfileError(f"{job.path}: changed while being read ({table.num_rows} rows, its footer said "
                           f"{job.rows}); open the profile again")
    return slice(job.offset, job.offset + job.rows)


INSTRUCTION_NUMBERS = ("id", "start_ts", "end_ts", "raw_flops", "flops_transpose")
INSTRUCTION_STRINGS = ("engine", "timeline_track", *TEXT_COLUMNS)


@dataclass
class _Events:
    """The event arrays, allocated once for every row a load may fill (instructions, then DMA
    transfers, then collectives), so no table is copied twice; per-instruction arrays besides."""

    start: np.ndarray
    end: np.ndarray
    ident: np.ndarray
    lane: np.ndarray
    engine: np.ndarray
    flops: np.ndarray
    text: list[np.ndarray]

    @classmethod
    def allocate(cls, capacity: int, instructions: int) -> _Events:
        start, end, ident = (np.empty(capacity, np.int64) for _ in range(3))
        return cls(start, end, ident, np.empty(capacity, np.int32), np.full(capacity, -1, np.int8),
                   np.empty(instructions, np.int64), [np.empty(instructions, np.int32) for _ in TEXT_COLUMNS])


Strings = dict[str, list[tuple[list[Any], np.ndarray]]]
"""A part's string columns as (dictionary values, per-row indices with nulls as len(values)) chunks."""


def _instruction_numbers(events: _Events, job: PartJob, table: pa.Table) -> Strings:
    """On a worker: a part's numbers copied into place; its string columns handed on as dictionary
    chunks (their codes depend on the values seen in earlier parts, so the reader maps them, in order)."""
    span = _checked_rows(job, table)
    events.ident[span] = int_column(table, "id")
    events.start[span] = int_column(table, "start_ts", 0)
    events.end[span] = int_column(table, "end_ts", 0)
    # PE FLOPs: greatest(raw_flops, flops_transpose), the hardware-FLOPs rule of docs/figures.md
    flops = events.flops[span]
    if "raw_flops" in job.columns:
        flops[:] = int_column(table, "raw_flops", 0)
    else:
        flops[:] = 0
    if "flops_transpose" in job.columns:
        np.maximum(flops, int_column(table, "flops_transpose", 0), out=flops)
    return {name: dictionary_chunks(table.column(name)) for name in job.dictionary}


def _read_instructions(parts: Iterator[tuple[PartJob, Strings]], events: _Events, total: int, lanes: _Lanes,
                       texts: dict[str, tuple[dict[str, int], list[str]]]) -> int:
    """Every instruction into ``events`` (``total`` rows, from the footers), sorted by id: the workers
    copied the numbers; here each part's strings become codes -- engine, lane (the timeline row, else
    the engine's canonical name), the TEXT_COLUMNS (values interned in ``texts``) -- in part order, so
    codes are numbered by first appearance. Returns the number of instructions."""
    engine_of: dict[str, int] = {}
    lane_map: dict[str, int] = {}

    def engine_code(value: str) -> int:
        name = canonical_engine(value)
        return ENGINE_NAMES.index(name) if name in ENGINE_NAMES else -1

    fallback: np.ndarray | None = None  # the lane of a row without a timeline row, by engine code + 1
    for job, strings in parts:
        if not job.rows:
            continue
        span = slice(job.offset, job.offset + job.rows)
        engine = chunk_codes(strings["engine"], engine_of, engine_code)
        events.engine[span] = engine
        if fallback is None:
            fallback = np.array([lanes.code(ENGINE_NAMES[e]) if e >= 0 else lanes.code("?")
                                 for e in range(-1, len(ENGINE_NAMES))], np.int32)
        lane = events.lane[span]
        if "timeline_track" in strings:
            lane[:] = chunk_codes(strings["timeline_track"], lane_map, lambda v: lanes.code(str(v)))
            unset = lane < 0
            if unset.any():
                lane[unset] = fallback[engine[unset] + 1]
        else:
            lane[:] = fallback[engine + 1]
        for column, out in zip(TEXT_COLUMNS, events.text):
            mapping, values = texts[column]

            def intern(v: str, values: list[str] = values) -> int:
                values.append(str(v))
                return len(values) - 1

            out[span] = chunk_codes(strings[column], mapping, intern) if column in strings else -1
    n = total
    if n > 1 and _first_drop(events.ident[:n], True) >= 0:
        order = np.argsort(events.ident[:n], kind="stable")
        for array in (events.ident, events.start, events.end, events.lane, events.engine, events.flops,
                      *events.text):
            array[:n] = array[:n][order]
    return n


@njit(cache=True, nogil=True)
def _first_drop(values: np.ndarray, strict: bool) -> int:
    """The first position where ``values`` stops increasing (``strict``) or decreases; -1 if none: one
    pass, no temporary arrays."""
    for k in range(1, values.size):
        if values[k] < values[k - 1] or (strict and values[k] == values[k - 1]):
            return k
    return -1


DMA_NUMBERS = ("packet_aggregation_id", "start_ts", "end_ts", "transfer_bytes")


def _dma_fast_path(profile: Profile) -> bool:
    """True when every DmaPacket part holds the transfer columns as plain integers (a capture's, the
    real tool's): grouped here from pyarrow arrays; anything else goes through DuckDB's cast rules."""
    found = profile.tables.get("DmaPacket")
    if found is None:
        return False
    for schema in found.file_schemas:
        for name in DMA_NUMBERS:
            if name not in schema.names or not pa.types.is_integer(schema.field(name).type):
                return False
        if "queue_idx" in schema.names and not pa.types.is_integer(schema.field("queue_idx").type):
            return False
        if "queue_name" in schema.names:
            kind = schema.field("queue_name").type
            if pa.types.is_dictionary(kind):
                kind = kind.value_type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                return False
    return True


Transfers = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]
"""DMA transfers: id, start, end, bytes, packets (int64 arrays) and queue name, ascending by id."""


def _read_transfers(parts: Iterator[tuple[PartJob, pa.Table]]) -> Transfers | None:
    """DMA transfers from packets: per ``packet_aggregation_id`` (ascending) the first start, last end,
    Σ transfer_bytes, packets and the smallest queue name (``coalesce(queue_name, 'queue ' ||
    queue_idx, 'DMA')``) -- the DuckDB query of ``_transfers_sql``, on arrays. None when a value is
    null (that query's null rules then decide)."""
    ids, starts, ends, nbytes, queue_rows = [], [], [], [], []
    names: dict[str, int] = {}
    clean = True
    for job, table in parts:
        if not table.num_rows:
            continue
        if any(table.column(c).null_count for c in DMA_NUMBERS):
            clean = False
            continue
        ids.append(int_column(table, "packet_aggregation_id"))
        starts.append(int_column(table, "start_ts"))
        ends.append(int_column(table, "end_ts"))
        nbytes.append(int_column(table, "transfer_bytes"))
        rows = table.num_rows
        codes = (dictionary_codes(table.column("queue_name"), names, lambda v: len(names))
                 if "queue_name" in job.columns else np.full(rows, -1, np.int32))
        if (codes < 0).any():  # no queue name: 'queue <queue_idx>', else 'DMA'
            missing = np.flatnonzero(codes < 0)
            if "queue_idx" in job.columns:
                index = table.column("queue_idx").take(pa.array(missing)).to_pylist()
            else:
                index = [None] * missing.size
            for row, value in zip(missing.tolist(), index):
                name = "DMA" if value is None else f"queue {value}"
                codes[row] = names.setdefault(name, len(names))
        queue_rows.append(codes)
    if not clean:
        return None
    empty = np.zeros(0, np.int64)
    if not ids:
        return empty, empty, empty, empty, empty, []
    pid = np.concatenate(ids)
    start, end, size, code = (np.concatenate(x) for x in (starts, ends, nbytes, queue_rows))
    if _first_drop(pid, False) >= 0:
        order = np.argsort(pid, kind="stable")
        pid, start, end, size, code = pid[order], start[order], end[order], size[order], code[order]
    heads = np.flatnonzero(np.concatenate([[True], pid[1:] != pid[:-1]]))
    # the smallest name per transfer: codes ranked by the names' order (DuckDB compares bytes; UTF-8
    # byte order is code point order, Python's)
    ordered = sorted(names, key=lambda name: name)
    rank = np.empty(len(names), np.int64)
    rank[[names[name] for name in ordered]] = np.arange(len(ordered))
    smallest = np.minimum.reduceat(rank[code], heads)
    counts = np.diff(np.append(heads, pid.size))
    return (pid[heads], np.minimum.reduceat(start, heads), np.maximum.reduceat(end, heads),
            np.add.reduceat(size, heads), counts.astype(np.int64), [ordered[r] for r in smallest.tolist()])


def _transfers_sql(profile: Profile, con: duckdb.DuckDBPyConnection) -> Transfers:
    """DMA transfers grouped by DuckDB (packets whose columns ``_read_transfers`` does not take)."""
    packets = TableSource(profile, "DmaPacket")
    col = packets.col
    queue = f"coalesce({col('queue_name')}, 'queue ' || {col('queue_idx')}::VARCHAR, 'DMA')"
    result = con.execute(f"""
        SELECT packet_aggregation_id AS id, min(start_ts) AS s, max(end_ts) AS e,
               min({queue}) AS q, sum(transfer_bytes)::BIGINT AS b, count(*)::BIGINT AS c
        FROM {packets.relation()} GROUP BY 1 ORDER BY 1""").fetchnumpy()
    return (np.asarray(result["id"], np.int64), np.asarray(result["s"], np.int64),
            np.asarray(result["e"], np.int64), np.asarray(result["b"], np.int64),
            np.asarray(result["c"], np.int64), [str(q) for q in result["q"]])


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


FLOW_COLUMNS = ("in_id", "out_id", "in_table", "out_table")


@dataclass
class _Flow:
    """Flow rows: in_id, out_id and the kind codes of in_table/out_table (-1: a table we do not
    model), allocated once for every row of the parts read."""

    src: np.ndarray
    dst: np.ndarray
    src_kind: np.ndarray
    dst_kind: np.ndarray


def _flow_rows(flow: _Flow, job: PartJob, table: pa.Table) -> None:
    """On a worker: one part's edges copied into place (the kind codes need no state: a fixed map)."""
    span = _checked_rows(job, table)
    flow.src[span] = int_column(table, "in_id")
    flow.dst[span] = int_column(table, "out_id")
    kind_code = {name: code for code, name in enumerate(KIND_NAMES)}
    for column, out in (("in_table", flow.src_kind), ("out_table", flow.dst_kind)):
        out[span] = chunk_codes(dictionary_chunks(table.column(column)), {},
                                lambda v: kind_code.get(str(v).lower(), -1))


class _IdIndex:
    """Where each id of one event kind sits among that kind's events: ids are unique and ascending;
    contiguous ids (our recorder's) are an offset, a dense range a lookup table, others a binary
    search. ``remap`` (optional) maps the position in sorted order to the event's position."""

    def __init__(self, sorted_ids: np.ndarray, remap: np.ndarray | None = None) -> None:
        self.ids = sorted_ids
        self.lo = int(sorted_ids[0]) if sorted_ids.size else 0
        hi = int(sorted_ids[-1]) if sorted_ids.size else -1
        dense = hi - self.lo < 4 * sorted_ids.size + 1024
        self.mode = 0 if hi - self.lo == sorted_ids.size - 1 else 1 if dense else 2
        self.lut = np.zeros(0, np.int64)
        if self.mode == 1 and sorted_ids.size:
            self.lut = np.full(hi - self.lo + 1, -1, np.int64)
            self.lut[sorted_ids - self.lo] = np.arange(sorted_ids.size)
        self.remap = remap if remap is not None else np.zeros(0, np.int64)


@njit(cache=True, nogil=True)
def _positions(wanted: np.ndarray, kinds: np.ndarray, code: int, ids: np.ndarray, lo: int, mode: int,
               lut: np.ndarray, remap: np.ndarray, offset: int, out: np.ndarray) -> None:
    """``out[e]`` = the event index of ``wanted[e]`` for every edge end whose kind is ``code`` (-1 where
    no event of that kind has the id); ``out`` may be ``wanted`` (each element is read, then written)."""
    n = ids.size
    hi = ids[n - 1] if n else lo - 1
    mapped = remap.size > 0
    for e in range(wanted.size):
        if kinds[e] != code:
            continue
        x = wanted[e]
        if n == 0 or x < lo or x > hi:
            out[e] = -1
            continue
        if mode == 0:
            pos = x - lo
        elif mode == 1:
            pos = lut[x - lo]
        else:
            pos = np.searchsorted(ids, x)
            if ids[pos] != x:
                pos = -1
        if pos >= 0 and mapped:
            pos = remap[pos]
        out[e] = pos + offset if pos >= 0 else -1


@njit(cache=True, nogil=True)
def _keep_edges(src: np.ndarray, dst: np.ndarray, src_kind: np.ndarray, dst_kind: np.ndarray) -> int:
    """Move the edges both of whose ends are events (and that are no self-loops) to the front, in
    order; returns how many. An end of a table we do not model (kind -1) is no event."""
    k = 0
    for e in range(src.size):
        a, b = src[e], dst[e]
        if src_kind[e] >= 0 and dst_kind[e] >= 0 and a >= 0 and b >= 0 and a != b:
            src[k] = a
            dst[k] = b
            k += 1
    return k


def _map_edges(src_id: np.ndarray, dst_id: np.ndarray, src_kind: np.ndarray, dst_kind: np.ndarray,
               indexes: Sequence[_IdIndex], offsets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(table, id) -> event index for both ends of every Flow edge; the edges both of whose ends are
    events here, in file order (the rest point at rows of tables we do not model or do not have)."""
    src, dst = src_id, dst_id  # mapped in place: the ids are not needed afterwards
    for code, index in enumerate(indexes):
        for ends, kinds in ((src, src_kind), (dst, dst_kind)):
            _positions(ends, kinds, code, index.ids, index.lo, index.mode, index.lut, index.remap,
                       int(offsets[code]), ends)
    k = _keep_edges(src, dst, src_kind, dst_kind)
    return src[:k], dst[:k]


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
    n_i = profile.num_rows("Instruction")
    events = _Events.allocate(n_i + profile.num_rows("DmaPacket") + profile.num_rows("CcOp"), n_i)
    flow = _Flow(*(np.empty(profile.num_rows("Flow"), t) for t in (np.int64, np.int64, np.int8, np.int8)))
    # every large part this load reads, decoded in one stream (both cores busy across tables), in
    # the order consumed: instructions, DMA packets, Flow
    instr_jobs = _part_jobs(profile, "Instruction", (*INSTRUCTION_NUMBERS, *INSTRUCTION_STRINGS),
                            INSTRUCTION_STRINGS)
    packets = TableSource(profile, "DmaPacket")
    with_packets = packets.present and packets.has("packet_aggregation_id")
    fast_dma = with_packets and _dma_fast_path(profile)
    dma_jobs = (_part_jobs(profile, "DmaPacket", (*DMA_NUMBERS, "queue_name", "queue_idx"), ("queue_name",))
                if fast_dma else [])
    flow_jobs = _part_jobs(profile, "Flow", FLOW_COLUMNS, ("in_table", "out_table"), required=FLOW_COLUMNS)
    n_flow = sum(job.rows for job in flow_jobs)
    stream = iter(PartStream([*instr_jobs, *dma_jobs, *flow_jobs], convert={
        "Instruction": lambda job, table: _instruction_numbers(events, job, table),
        "Flow": lambda job, table: _flow_rows(flow, job, table)}))
    n_i = _read_instructions(islice(stream, len(instr_jobs)), events, n_i, lanes, texts)
    if not n_i:
        gaps.append("no Instruction rows: there is nothing to analyse")
    n_d = n_c = 0
    d_bytes = d_count = np.zeros(0, np.int64)
    if with_packets:
        transfers = _read_transfers(islice(stream, len(dma_jobs))) if fast_dma else None
        d_id, d_start, d_end, d_bytes, d_count, names = transfers or _transfers_sql(profile, con)
        distinct = {q: lanes.code(q) for q in sorted(set(names))}
        n_d = d_id.size
        span = slice(n_i, n_i + n_d)
        events.ident[span], events.start[span], events.end[span] = d_id, d_start, d_end
        events.lane[span] = np.array([distinct[q] for q in names], np.int32)
    elif not packets.present:
        gaps.append("no DmaPacket rows: DMA transfers are not in the dependency graph")
    cc = TableSource(profile, "CcOp")
    c_id = np.zeros(0, np.int64)
    if cc.present:
        result = con.execute(f"""SELECT {cc.col('op_id')} AS id, start_ts AS s, end_ts AS e,
                                        coalesce({cc.col('operation')}, 'collective') AS op
                                 FROM {cc.relation()} ORDER BY 1, 2""").fetchnumpy()
        c_id = np.asarray(result["id"], np.int64)
        n_c = c_id.size
        span = slice(n_i + n_d, n_i + n_d + n_c)
        events.ident[span] = c_id
        events.start[span] = np.asarray(result["s"], np.int64)
        events.end[span] = np.asarray(result["e"], np.int64)
        events.lane[span] = np.array([lanes.code(str(o)) for o in result["op"]], np.int32)
    n = n_i + n_d + n_c
    start, end, ident, lane, engine = (a[:n] for a in (events.start, events.end, events.ident, events.lane,
                                                       events.engine))
    kind = np.empty(n, np.int8)
    kind[:n_i], kind[n_i:n_i + n_d], kind[n_i + n_d:] = INSTRUCTION, DMA, CC
    # Flow edges: (table, id) -> event index, in compiled passes over the rows the workers copied
    for _ in stream:  # the Flow parts (copied into ``flow`` on the workers)
        pass
    if not n_flow:
        gaps.append("no Flow table: dependencies are inferred from timing alone (an event's predecessor "
                    "is what ended last before it started)")
    by_kind = (_IdIndex(ident[:n_i]), _IdIndex(ident[n_i:n_i + n_d]),
               _IdIndex(np.sort(c_id), np.argsort(c_id, kind="stable")))
    src, dst = _map_edges(flow.src[:n_flow], flow.dst[:n_flow], flow.src_kind[:n_flow],
                          flow.dst_kind[:n_flow], by_kind, [0, n_i, n_i + n_d])
    first = int(start.min()) if start.size else None
    last = int(end.max()) if end.size else None
    windows, window_source = _windows(profile, con, first, last)
    if windows.shape[0] > 1:
        # events that begin before the first window (clock skew) belong to it
        execution = np.maximum(np.searchsorted(windows[:, 0], start, side="right") - 1, 0).astype(np.int32)
    else:  # one window (or none): every event is in it
        execution = np.zeros(start.size, np.int32)
    if windows.size and start.size:
        # an execution's window reaches at least its last event and starts no later than its first
        lo, hi = _window_spans(execution, start, end, windows.shape[0])
        windows[:, 0] = np.minimum(windows[:, 0], lo)
        seen = hi > np.iinfo(np.int64).min
        windows[:, 1] = np.maximum(windows[:, 1], np.where(seen, hi, windows[:, 1]))
    return DepGraph(start=start, end=end, kind=kind, ident=ident, lane=lane, engine=engine,
                    lanes=lanes.names, n_instr=n_i, n_dma=n_d, n_cc=n_c,
                    edge_src=src, edge_dst=dst, windows=windows, window_source=window_source,
                    execution=execution, flow_edges=n_flow, gaps=gaps, dma_bytes=d_bytes, dma_packets=d_count,
                    text_codes={c: t[:n_i] for c, t in zip(TEXT_COLUMNS, events.text)},
                    flops=events.flops[:n_i],
                    text_values={c: values for c, (_, values) in texts.items()})


@njit(cache=True, nogil=True)
def _window_spans(execution: np.ndarray, start: np.ndarray, end: np.ndarray,
                  n_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the first start and last end of its events (int64 max / min where it has none)."""
    lo = np.full(n_windows, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n_windows, np.iinfo(np.int64).min, np.int64)
    for i in range(start.size):
        w = execution[i]
        if start[i] < lo[w]:
            lo[w] = start[i]
        if end[i] > hi[w]:
            hi[w] = end[i]
    return lo, hi
