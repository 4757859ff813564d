"""``neuron-profile view --output-format perfetto``: a Perfetto trace (``.pftrace``, TrackEvent protobuf).

The format is the ``perfetto`` package's TrackEvent protos (``perfetto.protos...perfetto_trace_pb2``),
so ui.perfetto.dev and ``trace_processor`` open it natively (interned names, 64-bit ns timestamps).
One process per profile -- a folder of per-rank or per-execution profiles opens as one trace -- and
under it, top to bottom:

* ``Layers``: one slice per framework layer (module path) and execution, from its first op's start to
  its last op's end, nested by path (``model`` > ``model/layers.0`` > ``model/layers.0/mlp``);
* ``HLO ops``: one slice per HLO op and execution (``HloInstruction``), args layer, instruction count,
  busy time, HBM bytes;
* one track per engine timeline row (``Tensor``, ``TensorMatrix``, ``Vector``, ``Scalar``, ``GpSimd``,
  ``Sync``): a slice per instruction, named by opcode, args ``id``, ``hlo``, ``layer``, ``source``
  (file:line), ``operands``, ``semaphore_wait_ns`` and the byte columns;
* one track per DMA queue (``qSyncIO0`` ...), one slice per transfer (its packets' first start to last
  end), args bytes and packet count, as the real UI aggregates;
* one track per collective stream (``CcOp.stream_id``), slices named by operation;
* counter tracks for HBM and DMA throughput (``HbmUsage``, ``DmaUsage``; computed if absent), bytes/s;
* flow arrows for ``Flow`` dependencies. By default only the ones that explain waiting: per target
  (an instruction that waited on a semaphore, or a DMA transfer) the single incoming edge whose source
  ended last -- the wait it actually sat in. ``all_flows=True`` writes every edge.

**Slices must nest on a track.** Where slices overlap (DMA transfers of one queue run on 16 engines;
HLO ops interleave) the track gets lanes (``qSyncIO0 #2`` ...), each slice on the first lane where it
fits. On one track, events at the same timestamp are written ends first (the latest-begun end first),
then zero-length slices (as instant events), then begins -- so a zero-duration instruction never
closes before it opens, and every later slice keeps its depth.

**Streamed, bounded memory.** Tables are read in time slices (rows whose ``start_ts`` falls in
[a, b), found from Parquet row-group statistics, as the summary reads them); each slice's begins and
the ends that fall inside it are sorted and written, later ends carried to the next slice. DMA
transfers, the chosen flows and the hierarchy are built once as DuckDB temporary tables (spilled to a
temporary directory past a memory limit) and read back slice by slice. Packets are encoded with NumPy
(a protobuf message per row as a byte matrix), not one Python object per event, and interned strings
are reset (``SEQ_INCREMENTAL_STATE_CLEARED``) when their table grows past a bound. Memory is one
time slice, whatever the profile's size.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from formats import sqlsource, summary
from formats.intervals import merge_slices, time_slices
from formats.reader import Profile
from formats.sqlsource import TableSource, arrow_table
from neuroncore.enums import Resource

SEQUENCE_ID = 0x4E53  # "NS": our one packet sequence
TRACK_ORDER = tuple(r.track_label for r in (Resource.TENSOR_LS, Resource.TENSOR_MM, Resource.VECTOR,
                                              Resource.SCALAR, Resource.GPSIMD, Resource.SYNC))
"""Engine rows top to bottom: the Tensor engine's two streams together, then the other engines."""
WINDOW_ROWS = 150_000  # rows per time slice of a table
CHUNK_EVENTS = 16_384  # events encoded at once
INTERN_LIMIT = 400_000  # interned strings kept before the sequence's interning is cleared
DUCKDB_MEMORY = "160MB"
INTERNED_PER_PACKET = 2_000

# track groups, top to bottom (TrackDescriptor.sibling_order_rank = group * 10_000 + position)
LAYERS, OPS, ENGINES, QUEUES, STREAMS, COUNTERS = range(6)

# event kinds in the sort key: at one timestamp, ends, then instants, then begins
END, INSTANT, BEGIN = 0, 1, 2
_TYPE = np.array([pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_INSTANT, pb.TrackEvent.TYPE_SLICE_BEGIN],
                 np.int64)
_FLOW_KINDS = {"instruction": 0, "dma_block": 1}


@dataclass(frozen=True)
class TraceOptions:
    """What to write. ``all_flows``: every ``Flow`` edge, not only the waits; ``hierarchy``: the
    Layers and HLO ops tracks."""

    all_flows: bool = False
    hierarchy: bool = True


@dataclass
class TraceStats:
    """What was written, for the CLI's closing line and for tests."""

    tracks: int = 0
    slices: int = 0
    counters: int = 0
    flows: int = 0
    bytes: int = 0


# -- protobuf wire encoding, one message per row -------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)


def _varint_matrix(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's base-128 varint as a row of a uint8 matrix (left-aligned) and its length."""
    v = np.asarray(values).astype(np.int64).view(np.uint64)  # negatives: 10-byte two's complement
    lengths = np.searchsorted(_VARINT_LIMITS, v, side="right").astype(np.int64) + 1
    width = int(lengths.max(initial=1))
    matrix = np.empty((v.size, width), np.uint8)
    rest = v.copy()
    for k in range(width):
        more = np.where(k < lengths - 1, 0x80, 0).astype(np.uint8)
        matrix[:, k] = (rest & np.uint64(0x7F)).astype(np.uint8) | more
        rest >>= np.uint64(7)
    return matrix, lengths


class _Messages:
    """``n`` protobuf messages built field by field as columns: each field is a (rows x width) byte
    matrix with a per-row length (its first ``length`` bytes are the row's); a row's message is its
    fields' bytes in order. A nested message is its tag, its length and its own fields, spliced in, so
    nothing is compacted until the outermost ``flat()``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []

    def raw(self, matrix: np.ndarray, lengths: np.ndarray) -> None:
        self.parts.append((matrix, lengths))

    def const(self, data: bytes, present: np.ndarray | None = None) -> None:
        matrix = np.broadcast_to(np.frombuffer(data, np.uint8), (self.n, len(data)))
        lengths = np.full(self.n, len(data), np.int64)
        self.raw(matrix, lengths if present is None else np.where(present, lengths, 0))

    def varint(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        self.const(tag, present)
        matrix, lengths = _varint_matrix(values)
        self.raw(matrix, lengths if present is None else np.where(present, lengths, 0))

    def fixed64(self, tag: bytes, values: np.ndarray, counts: np.ndarray) -> None:
        """A repeated fixed64 field (unpacked, as declared): ``counts[i]`` values for row i, the
        values of all rows concatenated in row order."""
        if not int(counts.max(initial=0)):
            return
        record = np.empty((values.size, len(tag) + 8), np.uint8)
        record[:, :len(tag)] = np.frombuffer(tag, np.uint8)
        record[:, len(tag):] = np.ascontiguousarray(values, dtype="<u8").view(np.uint8).reshape(-1, 8)
        width = record.shape[1]
        if int(counts.max()) == 1:  # the common case: one value or none per row
            matrix = np.zeros((self.n, width), np.uint8)
            matrix[counts == 1] = record
        else:
            matrix = np.zeros((self.n, int(counts.max()) * width), np.uint8)
            rows = np.repeat(np.arange(self.n), counts)
            slot = np.arange(values.size) - np.repeat(np.cumsum(counts) - counts, counts)
            for b in range(width):
                matrix[rows, slot * width + b] = record[:, b]
        self.raw(matrix, counts.astype(np.int64) * width)

    def message(self, tag: bytes, inner: _Messages, present: np.ndarray | None = None) -> None:
        lengths = inner.lengths()
        if present is not None:
            lengths = np.where(present, lengths, 0)
        self.const(tag, present)
        size, size_lengths = _varint_matrix(lengths)
        self.raw(size, size_lengths if present is None else np.where(present, size_lengths, 0))
        for matrix, part in inner.parts:
            self.raw(matrix, part if present is None else np.where(present, part, 0))

    def lengths(self) -> np.ndarray:
        total = np.zeros(self.n, np.int64)
        for _, lengths in self.parts:
            total += lengths
        return total

    def flat(self) -> bytes:
        """Every row's bytes, concatenated in row order."""
        width = sum(m.shape[1] for m, _ in self.parts)
        matrix = np.empty((self.n, width), np.uint8)
        mask = np.empty((self.n, width), bool)
        at = 0
        for m, lengths in self.parts:
            w = m.shape[1]
            matrix[:, at:at + w] = m
            np.less(np.arange(w), lengths[:, None], out=mask[:, at:at + w])
            at += w
        return matrix[mask].tobytes()


# -- the packet stream -----------------------------------------------------------------------------


class _Writer:
    """Packets to a stream (``Trace.packet`` records, field 1, length-delimited), nothing held."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.stats = TraceStats()
        self.next_uuid = 1
        self._first = True
        self.event_names: dict[str, int] = {}
        self.arg_names: dict[str, int] = {}
        self.strings: dict[str, int] = {}
        self._pending: dict[str, list[tuple[int, str]]] = {"event_names": [], "debug_annotation_names": [],
                                                            "debug_annotation_string_values": []}

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.stats.bytes += len(data)

    def packet(self, packet: pb.TracePacket) -> None:
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if self._first:
            packet.first_packet_on_sequence = True
            packet.sequence_flags |= pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        data = packet.SerializeToString()
        self.write(b"\x0a" + _varint(len(data)) + data)

    def uuid(self) -> int:
        self.next_uuid += 1
        return self.next_uuid

    def track(self, name: str, parent: int | None = None, *, process: tuple[int, str] | None = None,
              counter: bool = False, rank: int | None = None) -> int:
        uuid = self.uuid()
        packet = pb.TracePacket()
        desc = packet.track_descriptor
        desc.uuid = uuid
        if parent is not None:
            desc.parent_uuid = parent
        if process is not None:
            desc.process.pid, desc.process.process_name = process
            desc.child_ordering = pb.TrackDescriptor.EXPLICIT
        else:
            desc.name = name
        if rank is not None:
            desc.sibling_order_rank = rank
        if counter:
            desc.counter.unit = pb.CounterDescriptor.UNIT_UNSPECIFIED
        self.packet(packet)
        self.stats.tracks += 1
        return uuid

    # interning: iids for names and string values, sent before the events that use them

    def _intern(self, table: dict[str, int], kind: str, values: list[Any]) -> np.ndarray:
        """iids of ``values`` (0 for None), new ones queued for the next interned-data packet."""
        out = np.zeros(len(values), np.int64)
        for i, value in enumerate(values):
            if value is None:
                continue
            text = str(value)
            iid = table.get(text)
            if iid is None:
                iid = table[text] = len(table) + 1
                self._pending[kind].append((iid, text))
            out[i] = iid
        return out

    def event_name_iids(self, values: list[Any]) -> np.ndarray:
        return self._intern(self.event_names, "event_names", values)

    def string_iids(self, values: list[Any]) -> np.ndarray:
        return self._intern(self.strings, "debug_annotation_string_values", values)

    def arg_name_iid(self, name: str) -> int:
        return int(self._intern(self.arg_names, "debug_annotation_names", [name])[0])

    def reset_interning_if_large(self) -> None:
        """Start the sequence's interned state afresh when it has grown past ``INTERN_LIMIT``."""
        if len(self.strings) + len(self.event_names) <= INTERN_LIMIT:
            return
        self.event_names.clear()
        self.arg_names.clear()
        self.strings.clear()
        for queued in self._pending.values():
            queued.clear()
        packet = pb.TracePacket()
        packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        self.packet(packet)

    def flush_interned(self) -> None:
        while any(self._pending.values()):
            packet = pb.TracePacket()
            packet.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            room = INTERNED_PER_PACKET
            for kind, queued in self._pending.items():
                take, self._pending[kind] = queued[:room], queued[room:]
                room -= len(take)
                for iid, text in take:
                    if kind == "debug_annotation_string_values":
                        entry = packet.interned_data.debug_annotation_string_values.add()
                        entry.iid, entry.str = iid, text.encode("utf-8", "replace")
                    else:
                        entry = getattr(packet.interned_data, kind).add()
                        entry.iid, entry.name = iid, text
            self.packet(packet)


# -- slices read from the tables, one time slice at a time ----------------------------------------


@dataclass
class _Block:
    """Slices of one source in one time slice, as columns."""

    group: int  # track group (ENGINES, QUEUES, ...)
    track: pa.Array  # logical track per row
    start: np.ndarray
    end: np.ndarray
    name: pa.Array  # slice names
    flow_kind: int  # -1: no flows; else _FLOW_KINDS value of ``key``
    key: np.ndarray  # id Flow uses (instruction id, transfer id)
    args: dict[str, pa.Array] = field(default_factory=dict)


@dataclass
class _Source:
    group: int
    sql: str  # with {where}: one time slice
    flow_kind: int = -1
    nested: bool = False  # slices nest (layers) rather than sit side by side


def _codes(array: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """(code per row, -1 for null; the distinct values) of a string-like column."""
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    encoded = pc.dictionary_encode(array.cast(pa.string()))
    codes = np.asarray(pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False), np.int64)
    return codes, encoded.dictionary.to_pylist()


def _iids(array: pa.Array, intern: Any) -> np.ndarray:
    """Interned ids of a string column's values (0 for null), interning each distinct value once."""
    codes, values = _codes(array)
    lut = np.append(intern(values), 0) if values else np.zeros(1, np.int64)
    return lut[codes]  # code -1 (null) picks the trailing 0


def _ints(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(column, 0).to_numpy(zero_copy_only=False), np.int64)


def _slice_filter(low: int | None, high: int | None, column: str = "start_ts") -> tuple[str, list[int]]:
    conditions, params = [], []
    if low is not None:
        conditions.append(f"{column} >= ?")
        params.append(low)
    if high is not None:
        conditions.append(f"{column} < ?")
        params.append(high)
    return ("WHERE " + " AND ".join(conditions)) if conditions else "", params


def _literal_filter(low: int | None, high: int | None, column: str) -> str:
    """The time-slice condition with the bounds as integer literals (for ``con.sql``)."""
    conditions = [f"{column} >= {int(low)}"] if low is not None else []
    conditions += [f"{column} < {int(high)}"] if high is not None else []
    return ("WHERE " + " AND ".join(conditions)) if conditions else ""


def _fetch(con: duckdb.DuckDBPyConnection, source: _Source, bounds: tuple[int | None, int | None]
           ) -> _Block | None:
    where = _literal_filter(*bounds, column="s")
    table = arrow_table(con, f"SELECT * FROM ({source.sql}) {where}")
    if table.num_rows == 0:
        return None
    columns = {name: table.column(name).combine_chunks() for name in table.column_names}
    args = {name: col for name, col in columns.items() if name not in ("t", "s", "e", "n", "k")}
    return _Block(source.group, columns["t"], _ints(columns["s"]), _ints(columns["e"]), columns["n"],
                  source.flow_kind,
                  _ints(columns["k"]) if "k" in columns else np.full(table.num_rows, -1, np.int64), args)


# -- per-profile state: tracks and lanes -----------------------------------------------------------


class _Tracks:
    """Lane tracks per logical track, created on first use; lane state carried across time slices."""

    def __init__(self, writer: _Writer, process: int) -> None:
        self.writer = writer
        self.process = process
        self.uuids: dict[str, list[int]] = {}
        self.free_at: dict[str, list[int]] = {}  # side-by-side lanes: when each lane is free
        self.stacks: dict[str, list[list[int]]] = {}  # nested lanes: open slices' ends per lane
        self.position: dict[int, int] = {}

    def lane_uuid(self, group: int, name: str, lane: int) -> int:
        lanes = self.uuids.setdefault(name, [])
        while len(lanes) <= lane:
            k = len(lanes)
            base = TRACK_ORDER.index(name) if group == ENGINES and name in TRACK_ORDER else None
            if base is None:
                base = len(TRACK_ORDER) + self.position.get(group, 0)
                self.position[group] = self.position.get(group, 0) + 1
            lanes.append(self.writer.track(name if k == 0 else f"{name} #{k + 1}", self.process,
                                           rank=group * 10_000 + base * 100 + min(k, 99)))
        return lanes[lane]

    def assign(self, group: int, name: str, start: np.ndarray, end: np.ndarray, nested: bool) -> np.ndarray:
        """Lane per slice (slices in start order) and the tracks for them: uuids per slice."""
        lanes = self._nested(name, start, end) if nested else self._side_by_side(name, start, end)
        uuids = np.array([self.lane_uuid(group, name, lane) for lane in range(int(lanes.max(initial=0)) + 1)],
                         np.int64)
        return uuids[lanes]

    def _side_by_side(self, name: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        free = self.free_at.setdefault(name, [])
        if len(free) <= 1 and (not free or free[0] <= start[0]) and (
                start.size < 2 or bool(np.all(start[1:] >= np.maximum.accumulate(end)[:-1]))):
            free[:] = [max(int(end.max()), free[0] if free else int(end.max()))]
            return np.zeros(start.size, np.int64)
        lanes = np.zeros(start.size, np.int64)
        for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
            for lane, at in enumerate(free):
                if at <= s:
                    free[lane] = max(e, s)
                    lanes[i] = lane
                    break
            else:
                lanes[i] = len(free)
                free.append(e)
        return lanes

    def _nested(self, name: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        stacks = self.stacks.setdefault(name, [])
        lanes = np.zeros(start.size, np.int64)
        for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
            for lane, stack in enumerate(stacks):
                while stack and stack[-1] <= s:
                    stack.pop()
                if not stack or stack[-1] >= e:
                    lanes[i] = lane
                    if e > s:
                        stack.append(e)
                    break
            else:
                lanes[i] = len(stacks)
                stacks.append([e] if e > s else [])
        return lanes


# -- flows -----------------------------------------------------------------------------------------


class _Flows:
    """The chosen Flow edges (a DuckDB temp table with a trace-wide flow id), looked up per slice."""

    def __init__(self, con: duckdb.DuckDBPyConnection, count: int) -> None:
        self.con = con
        self.count = count

    def per_row(self, bounds: tuple[int | None, int | None], side: str, kinds: np.ndarray, keys: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """(flow ids in row order, count per row) for the rows whose ``side`` (src or dst) starts in
        ``bounds``; rows are identified by (flow kind, key)."""
        n = keys.size
        if not self.count or n == 0:
            return np.zeros(0, np.uint64), np.zeros(n, np.int64)
        where, params = _slice_filter(*bounds, column="s")
        cols = self.con.execute(f"SELECT kind, id, fid FROM trace_flows_{side} {where}",
                                params).fetchnumpy()
        if not len(cols["fid"]):
            return np.zeros(0, np.uint64), np.zeros(n, np.int64)
        row_key = (kinds.astype(np.int64) << 56) | keys
        edge_key = (np.asarray(cols["kind"], np.int64) << 56) | np.asarray(cols["id"], np.int64)
        order = np.argsort(row_key, kind="stable")
        pos = np.searchsorted(row_key[order], edge_key)
        pos = np.minimum(pos, n - 1)
        found = (row_key[order][pos] == edge_key) & (kinds[order][pos] >= 0)
        rows = order[pos[found]]
        fids = np.asarray(cols["fid"], np.int64)[found]
        by_row = np.argsort(rows, kind="stable")
        return fids[by_row].astype(np.uint64), np.bincount(rows, minlength=n).astype(np.int64)


def _build_flows(con: duckdb.DuckDBPyConnection, profile: Profile, instr: TableSource, has_transfers: bool,
                 options: TraceOptions, first: int) -> _Flows:
    flow = TableSource(profile, "Flow")
    for table in ("trace_flows", "trace_flows_src", "trace_flows_dst"):
        con.execute(f"DROP TABLE IF EXISTS {table}")
    if not flow.present or not (instr.present or has_transfers):
        return _Flows(con, 0)
    nodes = []
    if instr.present:
        wait = instr.col("evt_wait_time_ns")
        nodes.append(f"SELECT 0 AS kind, id, start_ts AS s, end_ts AS e, {wait} AS w FROM {instr.relation()}")
    if has_transfers:
        nodes.append("SELECT 1 AS kind, k AS id, s, e, NULL::BIGINT AS w FROM trace_transfers")
    kind = ("CASE lower({t}) WHEN 'instruction' THEN 0 WHEN 'dma_block' THEN 1 END")
    choose = "" if options.all_flows else """
        WHERE dst.kind = 1 OR coalesce(dst.w, 1) > 0
        QUALIFY row_number() OVER (PARTITION BY dst.kind, dst.id ORDER BY src.e DESC, src.id DESC) = 1"""
    con.execute(f"""
        CREATE TEMP TABLE trace_flows AS
        WITH nodes AS ({' UNION ALL '.join(nodes)}),
             edges AS (SELECT {kind.format(t='in_table')} AS a, in_id,
                              {kind.format(t='out_table')} AS b, out_id
                       FROM {flow.relation()}),
             chosen AS (SELECT src.kind AS src_kind, src.id AS src_id, src.s AS src_s,
                               dst.kind AS dst_kind, dst.id AS dst_id, dst.s AS dst_s
                        FROM edges JOIN nodes src ON src.kind = edges.a AND src.id = edges.in_id
                                   JOIN nodes dst ON dst.kind = edges.b AND dst.id = edges.out_id
                        {choose})
        SELECT *, {first} + row_number() OVER () - 1 AS fid FROM chosen""")
    count = int(con.execute("SELECT count(*) FROM trace_flows").fetchall()[0][0])
    for side in ("src", "dst"):  # one copy per end, in its start order: a time slice reads few row groups
        _sorted_table(con, f"trace_flows_{side}", f"SELECT {side}_kind AS kind, {side}_id AS id, fid, "
                                                  f"{side}_s AS s FROM trace_flows")
    con.execute("DROP TABLE trace_flows")
    return _Flows(con, count)


def _sorted_table(con: duckdb.DuckDBPyConnection, name: str, sql: str) -> None:
    """``CREATE TEMP TABLE name`` of ``sql`` ordered by its ``s`` column, so the row groups' min/max
    statistics let a time slice's ``WHERE s >= a AND s < b`` skip all but a few of them."""
    con.execute(f"DROP TABLE IF EXISTS {name}")
    con.execute("SET preserve_insertion_order = true")
    try:
        con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM ({sql}) ORDER BY s")
    finally:
        con.execute("SET preserve_insertion_order = false")


# -- the sources of one profile ----------------------------------------------------------------------


def _instruction_source(instr: TableSource) -> _Source:
    track = f"coalesce({instr.col('timeline_track')}, {instr.col('engine')}, 'instructions')"
    args = {"id": "id", "hlo": "hlo_name", "layer": "layer", "source": "bir_debug_info_source_location",
            "operands": "operands", "semaphore_wait_ns": "evt_wait_time_ns",
            "hbm_read_bytes": "hbm_read_bytes", "hbm_write_bytes": "hbm_write_bytes",
            "sbuf_read_bytes": "sbuf_read_bytes", "sbuf_write_bytes": "sbuf_write_bytes"}
    cols = ", ".join(f"{instr.col(c)} AS {name}" for name, c in args.items() if instr.has(c))
    return _Source(ENGINES, f"""SELECT {track} AS t, start_ts AS s, end_ts AS e,
                                       coalesce({instr.col('opcode')}, 'instruction') AS n, id AS k, {cols}
                                FROM {instr.relation()}""", flow_kind=_FLOW_KINDS["instruction"])


def _build_transfers(con: duckdb.DuckDBPyConnection, packets: TableSource) -> bool:
    con.execute("DROP TABLE IF EXISTS trace_transfers")
    if not packets.present:
        return False
    queue = (f"coalesce({packets.col('queue_name')}, "
             f"'queue ' || coalesce({packets.col('queue_idx')}::VARCHAR, '?'))")
    _sorted_table(con, "trace_transfers", f"""
        SELECT {queue} AS t, min(start_ts) AS s, max(end_ts) AS e, 'DMA transfer' AS n,
               packet_aggregation_id AS k, packet_aggregation_id AS id,
               sum(transfer_bytes) AS bytes, count(*) AS packets,
               sum({packets.col('hbm_read_bytes')}) AS hbm_read_bytes,
               sum({packets.col('hbm_write_bytes')}) AS hbm_write_bytes
        FROM {packets.relation()} GROUP BY ALL""")
    return True


def _cc_source(cc: TableSource) -> _Source:
    extra = ", ".join(f"{cc.col(c)} AS {c}" for c in ("op_id", "algorithm", "dtype", "num_elements",
                                                      "input_size", "output_size") if cc.has(c))
    return _Source(STREAMS, f"""SELECT 'CC stream ' || stream_id AS t, start_ts AS s, end_ts AS e,
                                       operation AS n{', ' + extra if extra else ''}
                                FROM {cc.relation()}""")


def _build_hierarchy(con: duckdb.DuckDBPyConnection, profile: Profile, instr: TableSource) -> list[_Source]:
    """Layers and HLO ops as temp tables from ``HloInstruction`` (one row per op and execution) and the
    instructions' layer per op; none when the profile has no HloInstruction."""
    for table in ("trace_ops", "trace_layers"):
        con.execute(f"DROP TABLE IF EXISTS {table}")
    hlo = TableSource(profile, "HloInstruction")
    if not hlo.present:
        return []
    names = (f"(SELECT raw_hlo_id, any_value({instr.col('layer')}) AS layer, "
             f"any_value({instr.col('hlo_name')}) AS hlo FROM {instr.relation()} "
             f"WHERE raw_hlo_id IS NOT NULL GROUP BY ALL)"
             if instr.present and instr.has("raw_hlo_id") else
             "(SELECT NULL::BIGINT AS raw_hlo_id, NULL::VARCHAR AS layer, NULL::VARCHAR AS hlo WHERE false)")
    extra = ", ".join(f"h.{c} AS {c}" for c in ("instruction_count", "active_time_ns", "hbm_read_bytes",
                                                 "hbm_write_bytes") if hlo.has(c))
    con.execute(f"""CREATE TEMP TABLE trace_ops AS
                    SELECT 'HLO ops' AS t, h.start_ts AS s, h.end_ts AS e,
                           coalesce(h.{'hlo_name' if hlo.has('hlo_name') else 'raw_hlo_id'}::VARCHAR, n.hlo,
                                    'op ' || h.raw_hlo_id) AS n,
                           n.layer AS layer, coalesce(h.{'modular_flow_invocation_idx'
                           if hlo.has('modular_flow_invocation_idx') else 'raw_hlo_id * 0'}, 0) AS execution
                           {', ' + extra if extra else ''}
                    FROM {hlo.relation()} h LEFT JOIN {names} n USING (raw_hlo_id)""")
    con.execute("""CREATE TEMP TABLE trace_layers AS
                   SELECT 'Layers' AS t, min(s) AS s, max(e) AS e, parts[depth] AS n,
                          array_to_string(parts[1:depth], '/') AS layer, execution, count(*) AS ops
                   FROM (SELECT s, e, execution, parts, unnest(range(1, len(parts) + 1)) AS depth
                         FROM (SELECT s, e, execution, str_split(layer, '/') AS parts FROM trace_ops
                               WHERE layer IS NOT NULL AND layer <> ''))
                   GROUP BY parts[1:depth], parts[depth], depth, execution""")
    return [_Source(LAYERS, "SELECT * FROM trace_layers", nested=True),
            _Source(OPS, "SELECT * FROM trace_ops")]


# -- writing -----------------------------------------------------------------------------------------


def write_trace(programs: Iterable[tuple[str, Profile]], out: IO[bytes],
                options: TraceOptions | None = None) -> TraceStats:
    """Write one Perfetto trace of every profile in ``programs`` (name, profile) to ``out``."""
    options = options or TraceOptions()
    writer = _Writer(out)
    with tempfile.TemporaryDirectory(prefix="neuronscope-trace-") as spill:
        con = sqlsource.connect(memory_limit=DUCKDB_MEMORY, threads=2)
        try:
            con.execute(f"SET temp_directory = {sqlsource.literal(spill)}")
            for pid, (name, profile) in enumerate(programs, start=1):
                _write_profile(writer, con, pid, name, profile, options)
        finally:
            con.close()
    return writer.stats


class _Pending:
    """Ends not yet written (they fall in a later time slice): ts, tie-break, track."""

    def __init__(self) -> None:
        self.ts = np.zeros(0, np.int64)
        self.tie = np.zeros(0, np.int64)
        self.uuid = np.zeros(0, np.int64)

    def add(self, ts: np.ndarray, tie: np.ndarray, uuid: np.ndarray) -> None:
        self.ts = np.concatenate([self.ts, ts])
        self.tie = np.concatenate([self.tie, tie])
        self.uuid = np.concatenate([self.uuid, uuid])

    def take(self, high: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        due = np.ones(self.ts.size, bool) if high is None else self.ts < high
        out = self.ts[due], self.tie[due], self.uuid[due]
        self.ts, self.tie, self.uuid = self.ts[~due], self.tie[~due], self.uuid[~due]
        return out


def _write_profile(writer: _Writer, con: duckdb.DuckDBPyConnection, pid: int, name: str, profile: Profile,
                   options: TraceOptions) -> None:
    process = writer.track(name, process=(pid, name))
    tracks = _Tracks(writer, process)
    instr, packets, cc = (TableSource(profile, t) for t in ("Instruction", "DmaPacket", "CcOp"))
    sources: list[_Source] = _build_hierarchy(con, profile, instr) if options.hierarchy else []
    if instr.present:
        sources.append(_instruction_source(instr))
    if _build_transfers(con, packets):
        sources.append(_Source(QUEUES, "SELECT * FROM trace_transfers", flow_kind=_FLOW_KINDS["dma_block"]))
    if cc.present:
        sources.append(_cc_source(cc))
    flows = _build_flows(con, profile, instr, packets.present, options, first=writer.stats.flows + 1)
    writer.stats.flows += flows.count
    windows = merge_slices(*(time_slices(t.files, "start_ts", WINDOW_ROWS) for t in (instr, packets, cc)
                             if t.present)) if sources else []
    pending = _Pending()
    row_base = 0
    for bounds in windows:
        blocks = [b for b in (_fetch(con, s, bounds) for s in sources) if b is not None]
        nested = {s.group for s in sources if s.nested}
        if blocks:
            row_base = _write_window(writer, tracks, flows, blocks, nested, bounds, pending, row_base)
        else:  # nothing starts here: only ends carried from before
            ts, tie, uuid = pending.take(bounds[1])
            if ts.size:
                _write_events(writer, _ends_only(ts, tie, uuid))
        del blocks
        pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed slices otherwise
    for counter_name, ts_values, values in _counters(profile, con):
        track = writer.track(counter_name, process, counter=True, rank=COUNTERS * 10_000 + len(counter_name))
        _write_counter(writer, track, ts_values, values)
    for table in ("trace_flows_src", "trace_flows_dst", "trace_transfers", "trace_ops", "trace_layers"):
        con.execute(f"DROP TABLE IF EXISTS {table}")


@dataclass
class _Rows:
    """The slices of one time slice, every source together, in start order."""

    start: np.ndarray
    end: np.ndarray
    uuid: np.ndarray
    name_iid: np.ndarray
    tie: np.ndarray  # global row number: begin order
    out_flows: tuple[np.ndarray, np.ndarray]
    in_flows: tuple[np.ndarray, np.ndarray]
    args: list[tuple[int, str, np.ndarray, np.ndarray]]  # (name iid, kind, values, present)


def _write_window(writer: _Writer, tracks: _Tracks, flows: _Flows, blocks: list[_Block], nested: set[int],
                  bounds: tuple[int | None, int | None], pending: _Pending, row_base: int) -> int:
    writer.reset_interning_if_large()
    start = np.concatenate([b.start for b in blocks])
    end = np.maximum(np.concatenate([b.end for b in blocks]), start)
    group = np.concatenate([np.full(b.start.size, b.group, np.int64) for b in blocks])
    key = np.concatenate([b.key for b in blocks])
    kinds = np.concatenate([np.full(b.start.size, b.flow_kind, np.int64) for b in blocks])
    name_iid = np.concatenate([_iids(b.name, writer.event_name_iids) for b in blocks])
    labels: dict[str, int] = {}
    track_parts = []
    for b in blocks:
        codes, values = _codes(b.track)
        lut = np.array([labels.setdefault(str(v), len(labels)) for v in values]
                       + [labels.setdefault("(no track)", len(labels))], np.int64)  # the last: null
        track_parts.append(lut[codes])
    track = np.concatenate(track_parts)
    args = _arg_columns(writer, blocks)
    writer.flush_interned()
    # at one start: zero-length first (it ends where the next begins), except on nested tracks, where
    # a parent (the longer) opens before its children
    length = end - start
    length = np.where(np.isin(group, list(nested)), -length, length)
    order = np.lexsort((key, length, group, start))
    start, end, group, key, kinds, name_iid = (a[order] for a in (start, end, group, key, kinds, name_iid))
    args = [(iid, kind, values[order], present[order]) for iid, kind, values, present in args]
    track = track[order]
    uuid = np.zeros(start.size, np.int64)
    for label, t in labels.items():
        sel = np.flatnonzero(track == t)
        if not sel.size:
            continue
        g = int(group[sel[0]])
        uuid[sel] = tracks.assign(g, label, start[sel], end[sel], nested=g in nested)
    tie = row_base + np.arange(start.size, dtype=np.int64)
    rows = _Rows(start, end, uuid, name_iid, tie, flows.per_row(bounds, "src", kinds, key),
                 flows.per_row(bounds, "dst", kinds, key), args)
    writer.stats.slices += start.size
    lasting = end > start
    pending.add(end[lasting], tie[lasting], uuid[lasting])
    ends = pending.take(bounds[1])
    _write_events(writer, _events(rows, ends))
    return row_base + start.size


def _arg_columns(writer: _Writer, blocks: list[_Block]) -> list[tuple[int, str, np.ndarray, np.ndarray]]:
    """Every arg any block has, as one column over all rows: (name iid, 'int'|'str'|'double', values,
    present). Strings become interned iids."""
    names: list[str] = []
    for b in blocks:
        names += [n for n in b.args if n not in names]
    out = []
    for name in names:
        kind = None
        values, present = [], []
        for b in blocks:
            n = b.start.size
            col = b.args.get(name)
            if col is None or pa.types.is_null(col.type):
                values.append(np.zeros(n, np.int64))
                present.append(np.zeros(n, bool))
                continue
            valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
            kind_of = col.type
            if pa.types.is_integer(kind_of) or pa.types.is_decimal(kind_of) or pa.types.is_boolean(kind_of):
                this, v = "int", _ints(col.cast(pa.int64()))
            elif pa.types.is_floating(col.type):
                this = "double"
                v = np.asarray(pc.fill_null(col.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False),
                               np.float64).view(np.int64)
            else:
                this = "str"
                v = _iids(col, writer.string_iids)
            if kind is not None and this != kind:  # one arg, two types across sources: keep the first
                values.append(np.zeros(n, np.int64))
                present.append(np.zeros(n, bool))
                continue
            kind = this
            values.append(v)
            present.append(valid)
        if kind is not None:
            out.append((writer.arg_name_iid(name), kind, np.concatenate(values), np.concatenate(present)))
    return out


@dataclass
class _Events:
    """Events in write order: ts, type, track, and the row they come from (-1 for an end)."""

    ts: np.ndarray
    kind: np.ndarray
    uuid: np.ndarray
    row: np.ndarray
    rows: _Rows | None


def _events(rows: _Rows, ends: tuple[np.ndarray, np.ndarray, np.ndarray]) -> _Events:
    end_ts, end_tie, end_uuid = ends
    n = rows.start.size
    kind = np.where(rows.end > rows.start, BEGIN, INSTANT)
    ts = np.concatenate([rows.start, end_ts])
    kinds = np.concatenate([kind, np.full(end_ts.size, END)])
    tie = np.concatenate([rows.tie, -end_tie])  # ends: the latest-begun first (LIFO)
    order = np.lexsort((tie, kinds, ts))
    row = np.concatenate([np.arange(n), np.full(end_ts.size, -1)])[order]
    uuid = np.concatenate([rows.uuid, end_uuid])[order]
    return _Events(ts[order], kinds[order], uuid, row, rows)


def _ends_only(ts: np.ndarray, tie: np.ndarray, uuid: np.ndarray) -> _Events:
    order = np.lexsort((-tie, ts))
    return _Events(ts[order], np.full(ts.size, END), uuid[order], np.full(ts.size, -1), None)


def _gather_csr(values: np.ndarray, counts: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR slices (values grouped by row, ``counts`` per row) of ``rows`` (-1: none), concatenated."""
    ptr = np.concatenate([[0], np.cumsum(counts)])
    if not counts.size:
        return values[:0], np.zeros(rows.size, np.int64)
    take = np.where(rows >= 0, counts[np.maximum(rows, 0)], 0)
    first = ptr[np.maximum(rows, 0)]
    idx = np.repeat(first, take) + (np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take))
    return values[idx], take


def _write_events(writer: _Writer, events: _Events) -> None:
    for low in range(0, events.ts.size, CHUNK_EVENTS):
        high = min(low + CHUNK_EVENTS, events.ts.size)
        writer.write(_encode(events, low, high))


def _encode(events: _Events, low: int, high: int) -> bytes:
    n = high - low
    ts, kind, uuid, row = (a[low:high] for a in (events.ts, events.kind, events.uuid, events.row))
    opened = row >= 0
    at = np.maximum(row, 0)
    event = _Messages(n)
    event.varint(b"\x48", _TYPE[kind])  # type = 9
    event.varint(b"\x58", uuid)  # track_uuid = 11
    rows = events.rows
    if rows is not None:
        event.varint(b"\x50", rows.name_iid[at], opened)  # name_iid = 10
        for name_iid, arg_kind, values, present in rows.args:
            here = opened & present[at]
            if not here.any():
                continue
            annotation = _Messages(n)
            annotation.const(b"\x08" + _varint(name_iid))  # name_iid = 1
            if arg_kind == "double":
                annotation.fixed64(b"\x29", values[at][here], here.astype(np.int64))  # double_value = 5
            else:
                tag = b"\x20" if arg_kind == "int" else b"\x88\x01"  # int_value = 4, string_value_iid = 17
                annotation.varint(tag, values[at])
            event.message(b"\x22", annotation, here)  # debug_annotations = 4
        for tag, (values, counts) in ((b"\xf9\x02", rows.out_flows), (b"\x81\x03", rows.in_flows)):
            if values.size:  # flow_ids = 47, terminating_flow_ids = 48
                gathered, take = _gather_csr(values, counts, np.where(kind == END, -1, row))
                event.fixed64(tag, gathered, take)
    packet = _Messages(n)
    packet.varint(b"\x40", ts)  # timestamp = 8
    packet.message(b"\x5a", event)  # track_event = 11
    flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    packet.const(b"\x50" + _varint(SEQUENCE_ID) + b"\x68" + _varint(flags))  # sequence id 10, flags 13
    trace = _Messages(n)
    trace.message(b"\x0a", packet)  # Trace.packet = 1
    return trace.flat()


# -- counters ------------------------------------------------------------------------------------


def _counters(profile: Profile, con: duckdb.DuckDBPyConnection) -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = []
    hbm = TableSource(profile, "HbmUsage")
    if hbm.present:
        cols = con.execute(f"SELECT timestamp, current_throughput FROM {hbm.relation()} ORDER BY timestamp"
                           ).fetchnumpy()
        out.append(("HBM throughput (bytes/s)", np.asarray(cols["timestamp"]),
                    np.asarray(cols["current_throughput"], np.float64)))
    dma = TableSource(profile, "DmaUsage")
    if dma.present:
        cols = con.execute(f"SELECT timestamp, current_throughput FROM {dma.relation()} ORDER BY timestamp"
                           ).fetchnumpy()
        ts, values = np.asarray(cols["timestamp"]), np.asarray(cols["current_throughput"], np.float64)
    elif TableSource(profile, "DmaPacket").present:
        usage = summary.compute(profile, active_time_sink=lambda table: None).dma_usage  # samples only
        ts, values = usage.column("timestamp").to_numpy(), usage.column("current_throughput").to_numpy()
    else:
        return out
    out.append(("DMA throughput (bytes/s)", ts, values.astype(np.float64)))
    return out


def _write_counter(writer: _Writer, track: int, ts: np.ndarray, values: np.ndarray) -> None:
    for low in range(0, ts.size, CHUNK_EVENTS):
        t = np.asarray(ts[low:low + CHUNK_EVENTS], np.int64)
        v = np.nan_to_num(np.asarray(values[low:low + CHUNK_EVENTS], np.float64))
        n = t.size
        event = _Messages(n)
        event.varint(b"\x48", np.full(n, pb.TrackEvent.TYPE_COUNTER))
        event.varint(b"\x58", np.full(n, track))
        event.fixed64(b"\xe1\x02", v.view(np.uint64), np.ones(n, np.int64))  # double_counter_value = 44
        packet = _Messages(n)
        packet.varint(b"\x40", t)
        packet.message(b"\x5a", event)
        packet.const(b"\x50" + _varint(SEQUENCE_ID))
        trace = _Messages(n)
        trace.message(b"\x0a", packet)
        writer.write(trace.flat())
        writer.stats.counters += n


def default_path(name: str) -> str:
    """``device_profile_<name>.pftrace`` (the real tool writes device_profile_model_<id>.pftrace)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("_") or "profile"
    return os.path.join(os.getcwd(), f"device_profile_{safe}.pftrace")
