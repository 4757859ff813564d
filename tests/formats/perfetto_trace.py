"""Read a ``.pftrace`` back the way trace_processor does: per track, BEGIN/END events in file order must
nest (an END closes the slice opened last on that track, never before it opened), interned names and
debug-annotation values resolved, flows matched by id."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


@dataclass
class Slice:
    track: str
    ts: int
    dur: int
    name: str
    depth: int
    args: dict[str, Any]
    flows_out: list[int]
    flows_in: list[int]


@dataclass
class Trace:
    names: dict[int, str] = field(default_factory=dict)
    parents: dict[int, int] = field(default_factory=dict)
    ranks: dict[int, int] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    counters: collections.Counter[str] = field(default_factory=collections.Counter)

    def count(self) -> collections.Counter[str]:
        return collections.Counter(s.track for s in self.slices)

    def on(self, track: str) -> list[Slice]:
        return [s for s in self.slices if s.track == track]

    @property
    def flows(self) -> tuple[int, int]:
        return (sum(len(s.flows_out) for s in self.slices), sum(len(s.flows_in) for s in self.slices))


def read_trace(path: Path) -> Trace:
    trace = Trace()
    raw = pb.Trace.FromString(path.read_bytes())
    event_names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    strings: dict[int, str] = {}
    open_slices: dict[int, list[Slice]] = collections.defaultdict(list)
    last_ts: dict[int, int] = {}
    for packet in raw.packet:
        if packet.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            event_names.clear()
            arg_names.clear()
            strings.clear()
        if packet.HasField("interned_data"):
            data = packet.interned_data
            event_names.update({e.iid: e.name for e in data.event_names})
            arg_names.update({e.iid: e.name for e in data.debug_annotation_names})
            strings.update({e.iid: e.str.decode() for e in data.debug_annotation_string_values})
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            trace.names[d.uuid] = d.name or d.process.process_name
            trace.parents[d.uuid] = d.parent_uuid
            trace.ranks[d.uuid] = d.sibling_order_rank
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        uuid = event.track_uuid
        track = trace.names[uuid]  # a track is described before its first event
        if event.type == pb.TrackEvent.TYPE_COUNTER:
            trace.counters[track] += 1
            continue
        assert packet.timestamp >= last_ts.get(uuid, 0), f"{track}: events out of time order"
        last_ts[uuid] = packet.timestamp
        stack = open_slices[uuid]
        if event.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stack, f"{track}: END at {packet.timestamp} with no open slice"
            done = stack.pop()
            done.dur = packet.timestamp - done.ts
            assert done.dur >= 0
            continue
        assert event.type in (pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_INSTANT)
        args: dict[str, Any] = {}
        for a in event.debug_annotations:
            name = arg_names[a.name_iid] if a.name_iid else a.name
            if a.HasField("string_value_iid"):
                args[name] = strings[a.string_value_iid]
            elif a.HasField("int_value"):
                args[name] = a.int_value
            elif a.HasField("double_value"):
                args[name] = a.double_value
            else:
                args[name] = a.string_value
        name = event_names[event.name_iid] if event.name_iid else event.name
        item = Slice(track, packet.timestamp, 0, name, len(stack), args, list(event.flow_ids),
                     list(event.terminating_flow_ids))
        trace.slices.append(item)
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stack.append(item)
    for uuid, stack in open_slices.items():
        assert not stack, f"{trace.names[uuid]}: {len(stack)} slices never closed"
    return trace
