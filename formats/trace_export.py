"""``neuron-profile view --output-format perfetto``: a Perfetto trace (``.pftrace``, TrackEvent protobuf).

Written with the TrackEvent protos of the ``perfetto`` package (``perfetto.protos...perfetto_trace_pb2``),
so ui.perfetto.dev and ``trace_processor`` open it as a native trace (no JSON conversion, interned
names, 64-bit ns timestamps). One process per profile -- a folder of per-rank or per-execution
profiles opens as one trace, which the real tool cannot do -- and under it:

* one track per engine timeline row (``Tensor``, ``TensorMatrix``, ``Vector``, ``Scalar``, ``GpSimd``,
  ``Sync``), slices named by opcode (debug args: id, HLO op, operands);
* one track per DMA queue (``qSyncIO0`` ...), one slice per transfer (a ``DmaPacket`` aggregation:
  first packet start to last packet end, bytes and packet count as args), as the real UI aggregates;
* one track per collective stream (``CcOp.stream_id``), slices named by operation;
* counter tracks for HBM throughput (``HbmUsage``) and DMA throughput (``DmaUsage``, computed if the
  profile has none), in bytes/s;
* flow arrows for the ``Flow`` table's dependencies (instruction -> the DMA transfer it triggered, and
  any instruction -> instruction edges a writer recorded).

Slices of one track must nest; where slices overlap (DMA transfers of one queue run on 16 engines at
once) the track gets lanes: ``qSyncIO0``, ``qSyncIO0 #2`` ..., each slice on the first free lane.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from formats import sqlsource, summary
from formats.reader import Profile
from formats.sqlsource import TableSource

SEQUENCE_ID = 0x4E53  # "NS": our one packet sequence
TRACK_ORDER = ("Tensor", "TensorMatrix", "Vector", "Scalar", "GpSimd", "Sync")


@dataclass
class _Slices:
    """Slices of one logical track, as columns."""

    name: str
    start: np.ndarray
    end: np.ndarray
    label: list[str]  # slice names
    key: np.ndarray  # id used by Flow (instruction id / transfer id); -1 none
    args: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class TraceStats:
    """What was written, for the CLI's closing line and for tests."""

    tracks: int = 0
    slices: int = 0
    counters: int = 0
    flows: int = 0
    bytes: int = 0


def _lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Lane per slice (slices sorted by start): 0 when nothing overlaps, else first-free-lane greedy."""
    if start.size < 2 or bool(np.all(start[1:] >= np.maximum.accumulate(end)[:-1])):
        return np.zeros(start.size, np.int64)
    lanes = np.zeros(start.size, np.int64)
    free_at: list[int] = []
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        for lane, free in enumerate(free_at):
            if free <= s:
                free_at[lane] = e
                lanes[i] = lane
                break
        else:
            lanes[i] = len(free_at)
            free_at.append(e)
    return lanes


class _Writer:
    """Packets to a stream: field 1 of ``Trace`` (length-delimited) per packet, so nothing is held."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.names: dict[str, int] = {}
        self.next_uuid = 1
        self.stats = TraceStats()
        self._first = True

    def packet(self, packet: pb.TracePacket) -> None:
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if self._first:
            packet.first_packet_on_sequence = True
            packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        data = packet.SerializeToString()
        self.out.write(b"\x0a" + _varint(len(data)) + data)
        self.stats.bytes += len(data) + 1 + len(_varint(len(data)))

    def uuid(self) -> int:
        self.next_uuid += 1
        return self.next_uuid

    def track(self, name: str, parent: int | None = None, *, process: tuple[int, str] | None = None,
              counter_unit: int | None = None) -> int:
        uuid = self.uuid()
        packet = pb.TracePacket()
        desc = packet.track_descriptor
        desc.uuid = uuid
        if parent is not None:
            desc.parent_uuid = parent
        if process is not None:
            desc.process.pid, desc.process.process_name = process
        else:
            desc.name = name
        if counter_unit is not None:
            desc.counter.unit = counter_unit
        self.packet(packet)
        self.stats.tracks += 1
        return uuid

    def name_iid(self, name: str, packet: pb.TracePacket) -> int:
        iid = self.names.get(name)
        if iid is None:
            iid = self.names[name] = len(self.names) + 1
            entry = packet.interned_data.event_names.add()
            entry.iid, entry.name = iid, name
            packet.sequence_flags |= pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        return iid


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# -- reading the tables --------------------------------------------------------------------------


def _instruction_slices(profile: Profile, con: Any) -> list[_Slices]:
    source = TableSource(profile, "Instruction")
    if not source.present:
        return []
    track = f"coalesce({source.col('timeline_track')}, {source.col('engine')})"
    cols = con.execute(f"""SELECT {track} AS t, start_ts, end_ts, opcode, id, {source.col('hlo_name')} AS h
                           FROM {source.relation()} ORDER BY start_ts, id""").fetchnumpy()
    tracks = np.asarray(cols["t"], dtype=object)
    out = []
    names = sorted({str(t) for t in tracks},
                   key=lambda t: (TRACK_ORDER.index(t) if t in TRACK_ORDER else len(TRACK_ORDER), t))
    hlo = np.asarray(cols["h"], dtype=object)
    for name in names:
        sel = tracks == name
        out.append(_Slices(name, np.asarray(cols["start_ts"])[sel], np.asarray(cols["end_ts"])[sel],
                           [str(x) for x in np.asarray(cols["opcode"], dtype=object)[sel]],
                           np.asarray(cols["id"])[sel],
                           {"hlo": [None if x is None else str(x) for x in hlo[sel]]}))
    return out


def _dma_slices(profile: Profile, con: Any) -> list[_Slices]:
    source = TableSource(profile, "DmaPacket")
    if not source.present:
        return []
    queue = (f"coalesce({source.col('queue_name')}, "
             f"'queue ' || coalesce({source.col('queue_idx')}::VARCHAR, '?'))")
    cols = con.execute(f"""SELECT {queue} AS q, packet_aggregation_id AS tid, min(start_ts) AS s,
                                  max(end_ts) AS e, sum(transfer_bytes) AS b, count(*) AS n
                           FROM {source.relation()} GROUP BY ALL ORDER BY s, tid""").fetchnumpy()
    queues = np.asarray(cols["q"], dtype=object)
    out = []
    for name in sorted({str(q) for q in queues}):
        sel = queues == name
        nbytes = np.asarray(cols["b"])[sel]
        out.append(_Slices(name, np.asarray(cols["s"])[sel], np.asarray(cols["e"])[sel],
                           ["DMA transfer"] * int(sel.sum()), np.asarray(cols["tid"])[sel],
                           {"bytes": [int(b) for b in nbytes],
                            "packets": [int(n) for n in np.asarray(cols["n"])[sel]]}))
    return out


def _cc_slices(profile: Profile, con: Any) -> list[_Slices]:
    source = TableSource(profile, "CcOp")
    if not source.present:
        return []
    cols = con.execute(f"""SELECT stream_id, start_ts, end_ts, operation
                           FROM {source.relation()} ORDER BY start_ts""").fetchnumpy()
    streams = np.asarray(cols["stream_id"])
    out = []
    for stream in sorted(set(streams.tolist())):
        sel = streams == stream
        out.append(_Slices(f"CC stream {stream}", np.asarray(cols["start_ts"])[sel],
                           np.asarray(cols["end_ts"])[sel],
                           [str(x) for x in np.asarray(cols["operation"], dtype=object)[sel]],
                           np.full(int(sel.sum()), -1, np.int64)))
    return out


def _counters(profile: Profile, con: Any) -> list[tuple[str, np.ndarray, np.ndarray]]:
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


def _flows(profile: Profile, con: Any) -> list[tuple[str, int, str, int]]:
    source = TableSource(profile, "Flow")
    if not source.present:
        return []
    return [(str(a), int(b), str(c), int(d)) for a, b, c, d in con.execute(
        f"SELECT in_table, in_id, out_table, out_id FROM {source.relation()}").fetchall()]


# -- writing ---------------------------------------------------------------------------------------


def _events(slices: list[tuple[_Slices, int, int]]) -> Iterator[tuple[int, int, int, int, int]]:
    """(ts, order, group, row, lane track) in time order; ends sort before begins at the same ts."""
    parts = []
    for group, (sl, _, _) in enumerate(slices):
        n = sl.start.size
        rows = np.arange(n)
        parts.append(np.stack([sl.end, np.zeros(n, np.int64), np.full(n, group), rows]))
        parts.append(np.stack([sl.start, np.ones(n, np.int64), np.full(n, group), rows]))
    if not parts:
        return
    events = np.concatenate(parts, axis=1)
    order = np.lexsort((events[1], events[0]))
    for ts, kind, group, row in events[:, order].T.tolist():
        yield ts, kind, group, row, 0


def write_trace(programs: Iterable[tuple[str, Profile]], out: IO[bytes]) -> TraceStats:
    """Write one Perfetto trace of every profile in ``programs`` (name, profile) to ``out``."""
    writer = _Writer(out)
    con = sqlsource.connect(memory_limit="1GB")
    try:
        for pid, (name, profile) in enumerate(programs, start=1):
            _write_profile(writer, con, pid, name, profile)
    finally:
        con.close()
    return writer.stats


def _write_profile(writer: _Writer, con: Any, pid: int, name: str, profile: Profile) -> None:
    process = writer.track(name, process=(pid, name))
    groups: list[tuple[_Slices, int, int]] = []  # (slices, kind, parent track)
    for kind, found in enumerate((_instruction_slices(profile, con), _dma_slices(profile, con),
                                  _cc_slices(profile, con))):
        for sl in found:
            groups.append((sl, kind, process))
    lane_tracks: list[list[int]] = []
    lanes_of: list[np.ndarray] = []
    for sl, _, parent in groups:
        lanes = _lanes(sl.start, sl.end)
        lanes_of.append(lanes)
        tracks = [writer.track(sl.name if lane == 0 else f"{sl.name} #{lane + 1}", parent)
                  for lane in range(int(lanes.max(initial=0)) + 1)]
        lane_tracks.append(tracks)
    flow_out, flow_in = _flow_maps(groups, _flows(profile, con), first=writer.stats.flows + 1)
    writer.stats.flows += sum(len(ids) for ids in flow_out.values())
    for ts, kind, group, row, _ in _events(groups):
        sl = groups[group][0]
        track = lane_tracks[group][int(lanes_of[group][row])]
        packet = pb.TracePacket()
        packet.timestamp = int(ts)
        event = packet.track_event
        event.track_uuid = track
        if kind == 0:
            event.type = pb.TrackEvent.TYPE_SLICE_END
        else:
            event.type = pb.TrackEvent.TYPE_SLICE_BEGIN
            event.name_iid = writer.name_iid(sl.label[row], packet)
            key = (group, row)
            for flow in flow_out.get(key, ()):
                event.flow_ids.append(flow)
            for flow in flow_in.get(key, ()):
                event.terminating_flow_ids.append(flow)
            if sl.key[row] >= 0:
                _arg(event, "id", int(sl.key[row]))
            for arg, values in sl.args.items():
                if values[row] is not None:
                    _arg(event, arg, values[row])
            writer.stats.slices += 1
        writer.packet(packet)
    for counter_name, ts_values, values in _counters(profile, con):
        track = writer.track(counter_name, process, counter_unit=pb.CounterDescriptor.UNIT_UNSPECIFIED)
        for ts, value in zip(ts_values.tolist(), values.tolist()):
            packet = pb.TracePacket()
            packet.timestamp = int(ts)
            packet.track_event.type = pb.TrackEvent.TYPE_COUNTER
            packet.track_event.track_uuid = track
            packet.track_event.double_counter_value = float(value)
            writer.packet(packet)
            writer.stats.counters += 1


def _arg(event: pb.TrackEvent, name: str, value: Any) -> None:
    annotation = event.debug_annotations.add()
    annotation.name = name
    if isinstance(value, int):
        annotation.int_value = value
    else:
        annotation.string_value = str(value)


def _flow_maps(groups: list[tuple[_Slices, int, int]], edges: list[tuple[str, int, str, int]], first: int
               ) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[int]]]:
    """Flow id lists per (group, row) for the edges whose both ends are slices in this trace; ids
    count up from ``first`` (unique in the trace across profiles)."""
    index: dict[tuple[str, int], tuple[int, int]] = {}
    for group, (sl, kind, _) in enumerate(groups):
        table = "instruction" if kind == 0 else "dma_block" if kind == 1 else None
        if table is None:
            continue
        for row, key in enumerate(sl.key.tolist()):
            index[(table, key)] = (group, row)
    flow_out: dict[tuple[int, int], list[int]] = {}
    flow_in: dict[tuple[int, int], list[int]] = {}
    flow = first - 1
    for in_table, in_id, out_table, out_id in edges:
        source = index.get((in_table.lower(), in_id))
        target = index.get((out_table.lower(), out_id))
        if source is None or target is None:
            continue
        flow += 1
        flow_out.setdefault(source, []).append(flow)
        flow_in.setdefault(target, []).append(flow)
    return flow_out, flow_in


def default_path(name: str) -> str:
    """``device_profile_<name>.pftrace`` (the real tool writes device_profile_model_<id>.pftrace)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("_") or "profile"
    return os.path.join(os.getcwd(), f"device_profile_{safe}.pftrace")
