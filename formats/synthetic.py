"""Synthetic profiles of any size, written through the real writer.

``write_synthetic(path, instructions, shape)`` writes an ``instructions``-long profile through
``ProfileWriter`` (memory: one chunk), with the derived tables a capture writes at close (Summary,
OpcodeSummary, ActiveTime, DmaUsage, InstructionLod: ``formats.derive``). Three shapes, one per
benchmark that needs millions of rows:

* ``Shape.ENGINE_CLOCKS`` (``bench/profile_format.py``: Summary, viewport and Perfetto export
  figures): every timeline row runs its own clock (busy 30-600 ns, idle 0-300 ns), random HLO ops, one
  DMA packet per 8 instructions; ``flows=True`` adds a capture's SEMAPHORE and DMA_TRIGGER edges.
* ``Shape.SIDE_BY_SIDE`` (``bench/gui.py``): the six rows (TensorMatrix too) advance together over one
  stretch of time as in a real trace, HLO ops and layers contiguous in time, six DMA queues, a
  collective stream and an HBM counter every 10 us.
* ``Shape.HIERARCHY`` (``bench/tui_view.py``): 32 layers x (attention, mlp) x 4 ops in execution
  order, repeated over executions, with HloInstruction, FrameworkNode and the StackFrame tables.

It lives in the package, not in ``bench/`` or ``tests/``, because both use it: bench scripts import
only installed packages, and ``tests/formats/test_synthetic.py`` checks that every shape stays a valid
profile that opens, so a benchmark never measures a profile our readers would refuse. The same seed
gives the same profile.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa

from formats.derive import write_derived
from formats.recorder import metadata_from_spec
from formats.writer import ProfileWriter
from neuroncore.hardware import NC_V2


class Shape(Enum):
    """Which synthetic profile ``write_synthetic`` writes (see the module docstring)."""

    ENGINE_CLOCKS = "engine-clocks"
    SIDE_BY_SIDE = "side-by-side"
    HIERARCHY = "hierarchy"


ENGINES = ["Tensor", "Vector", "Scalar", "GpSimd", "Sync"]
TRACKS = [*ENGINES, "TensorMatrix"]
TRACK_SHARE = np.array([0.15, 0.25, 0.15, 0.05, 0.10, 0.30])
OPCODES = ["MATMUL", "LDWEIGHTS", "TENSOR_TENSOR", "TENSOR_SCALAR", "TENSOR_COPY", "ACTIVATE", "IOTA",
           "WRITE", "EVENT_SEMAPHORE", "TENSOR_REDUCE", "NOP"]
TRACK_OPCODES = {0: [1], 1: [2, 3, 4, 9], 2: [5, 7], 3: [6, 8], 4: [7, 8, 10], 5: [0]}
ENGINE_OF = [0, 1, 2, 3, 4, 0]  # timeline row -> engine (TensorMatrix is the Tensor engine)
QUEUES = [f"qSyncIO{i}" for i in range(3)] + [f"qSyncWeight{i}" for i in range(3)]
HLO_SPAN_NS = 20_000  # one HLO op every 20 us, 512 distinct ops; a layer every 1 ms, 32 layers
LAYER_SPAN_NS = 1_000_000


HIERARCHY_LAYERS = 32
HIERARCHY_BLOCKS = (
    ("self_attn", ("dot.q", "dot.qk", "softmax", "dot.pv")),
    ("mlp", ("dot.gate", "dot.up", "silu", "dot.down")),
)
HIERARCHY_OPCODES = ["MATMUL", "LDWEIGHTS", "TENSOR_TENSOR", "ACTIVATE", "IOTA", "WRITE"]
PER_OP = 400  # instructions of one op in one execution


def write_synthetic(
    path: str,
    instructions: int,
    shape: Shape,
    *,
    seed: int = 0,
    chunk: int = 1_000_000,
    flows: bool = False,
) -> None:
    """Write the ``shape`` profile of ``instructions`` instructions into the new directory ``path``.
    ``chunk``: instructions held in memory at once (not for ``Shape.HIERARCHY``, which writes one
    execution at a time); ``flows``: dependency edges (``Shape.ENGINE_CLOCKS`` only)."""
    if flows and shape is not Shape.ENGINE_CLOCKS:
        raise ValueError(f"flows are written for {Shape.ENGINE_CLOCKS.value} profiles, not {shape.value}")
    if shape is Shape.ENGINE_CLOCKS:
        _write_engine_clocks(path, instructions, seed, chunk, flows)
    elif shape is Shape.SIDE_BY_SIDE:
        _write_side_by_side(path, instructions, seed, chunk)
    else:
        _write_hierarchy(path, instructions, seed)


def _hardware(profile_name: str, **extra: Any) -> dict[str, Any]:
    """The core's NC-v2 constants, as a capture on trn1 writes them."""
    return {**metadata_from_spec(NC_V2), "is_simulation": True, "profile_name": profile_name, **extra}


def _operand_dictionaries() -> tuple[pa.Array, pa.Array, pa.Array]:
    """Operand texts and BIR ids (4096 each) and HLO names (512), shared by the flat shapes."""
    operands = pa.array(
        [
            f"S[{i % 32}] (Tensor)++@complete src=fp16@0x{i:04x}[1,0,0][3,1,1] dst=0x{2 * i:06x}"
            for i in range(4096)
        ]
    )
    birs = pa.array([f"sg0000:{i}" for i in range(4096)])
    return operands, birs, pa.array([f"dot.{i}" for i in range(512)])


# -- Shape.ENGINE_CLOCKS ---------------------------------------------------------------------------


def _clocked_chunk(rng: np.random.Generator, clock: np.ndarray, m: int) -> dict[str, np.ndarray]:
    """``m`` instructions continuing each timeline row's clock: busy 30-600 ns, idle 0-300 ns between."""
    track = rng.choice(len(TRACKS), m, p=TRACK_SHARE).astype(np.int8)
    duration = rng.integers(30, 600, m).astype(np.int64)
    gap = rng.integers(0, 300, m).astype(np.int64)
    start = np.empty(m, np.int64)
    for t in range(len(TRACKS)):
        sel = track == t
        if sel.any():
            ends = clock[t] + np.cumsum(duration[sel] + gap[sel])
            start[sel] = ends - duration[sel]
            clock[t] = ends[-1]
    order = np.argsort(start, kind="stable")
    track, duration, gap, start = track[order], duration[order], gap[order], start[order]
    opcode = np.empty(m, np.int8)
    for t, choices in TRACK_OPCODES.items():
        sel = track == t
        opcode[sel] = rng.choice(choices, int(sel.sum()))
    return {"track": track, "engine": np.where(track == 5, 0, track).astype(np.int8), "duration": duration,
            "gap": gap, "start": start, "opcode": opcode}


def _causal_sources(ids: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each instruction (rows in start order), a semaphore source as a capture's would be: the
    instruction of the chunk that ended last at or before its start (itself for the first ones,
    an edge the analyses drop), so the dependency graph is consistent with the timing."""
    order = np.argsort(end, kind="stable")
    pos = np.searchsorted(end[order], start, side="right") - 1
    return np.where(pos >= 0, ids[order[np.maximum(pos, 0)]], ids)


def _write_engine_clocks(path: str, n: int, seed: int, chunk: int, flows: bool) -> None:
    """An ``n``-instruction profile written through ProfileWriter (memory: one chunk), with the tables a
    capture derives at close (Summary, OpcodeSummary, ActiveTime, DmaUsage, InstructionLod).
    ``flows``: a ``Flow`` edge into every instruction (from the instruction that ended last before it
    started: consistent with the timing, as a capture's) and one instruction -> transfer edge per DMA
    transfer, as a capture's SEMAPHORE and DMA_TRIGGER edges."""
    rng = np.random.default_rng(seed)
    clock = np.zeros(len(TRACKS), np.int64)
    operands, birs, hlos = _operand_dictionaries()
    next_id = packet_id = 0
    with ProfileWriter(path, _hardware("synthetic")) as writer:
        while next_id < n:
            m = min(chunk, n - next_id)
            c = _clocked_chunk(rng, clock, m)
            ids = np.arange(next_id, next_id + m, dtype=np.int64)
            op = rng.integers(0, 512, m)
            flops = np.where(c["opcode"] == 0, 2 * 128 * 128 * 512, 0).astype(np.int64)
            writer.write("Instruction", {
                "start_ts": c["start"], "end_ts": c["start"] + c["duration"], "duration_ns": c["duration"],
                "engine": pa.DictionaryArray.from_arrays(pa.array(c["engine"]), pa.array(ENGINES)),
                "timeline_track": pa.DictionaryArray.from_arrays(pa.array(c["track"]), pa.array(TRACKS)),
                "opcode": pa.DictionaryArray.from_arrays(pa.array(c["opcode"]), pa.array(OPCODES)),
                "operands": pa.DictionaryArray.from_arrays(pa.array((ids % 4096).astype(np.int16)), operands),
                "bir_id": pa.DictionaryArray.from_arrays(pa.array((ids % 4096).astype(np.int16)), birs),
                "hlo_name": pa.DictionaryArray.from_arrays(pa.array(op.astype(np.int16)), hlos),
                "id": ids, "pc": ids % 50_000, "raw_hlo_id": op, "evt_wait_time_ns": c["gap"],
                "raw_flops": flops, "adjusted_flops": flops, "pcore_idx": np.zeros(m, np.int64),
                "sbuf_read_bytes": np.where(c["opcode"] < 6, 65536, 0),
                "sbuf_write_bytes": np.where(c["opcode"] < 6, 32768, 0),
            })
            k = m // 8  # DMA packets: 4 per transfer, 16 engines, six queues
            start = np.sort(rng.integers(int(c["start"][0]), int(c["start"][-1]) + 1, k))
            duration = rng.integers(200, 2000, k)
            nbytes = rng.integers(512, 65536, k)
            queue = rng.integers(0, 6, k)
            writer.write("DmaPacket", {
                "start_ts": start, "end_ts": start + duration, "duration_ns": duration,
                "pcore_idx": np.zeros(k, np.int64), "id": np.arange(packet_id, packet_id + k),
                "packet_idx": (np.arange(k) % 4).astype(np.int32),
                "packet_aggregation_id": np.arange(packet_id, packet_id + k) // 4,
                "engine_idx": np.arange(k) % 16,
                "read_bytes": nbytes, "write_bytes": nbytes, "transfer_bytes": nbytes,
                "throughput": (nbytes / duration * 1e9).astype(np.float32),
                "queue_type": pa.DictionaryArray.from_arrays(pa.array((queue % 3).astype(np.int8)),
                                                             pa.array(["data", "input", "output"])),
                "queue_name": pa.DictionaryArray.from_arrays(pa.array(queue.astype(np.int8)),
                                                             pa.array([f"qSyncIO{i}" for i in range(6)])),
                "queue_idx": queue, "crc": np.zeros(k, np.int64),
                "hbm_read_bytes": np.where(queue % 2 == 0, nbytes, 0),
                "hbm_write_bytes": np.where(queue % 2 == 1, nbytes, 0),
            })
            if flows:
                transfers = np.unique(np.arange(packet_id, packet_id + k) // 4)
                edges = m + transfers.size
                writer.write("Flow", {
                    "in_id": np.concatenate([_causal_sources(ids, c["start"], c["start"] + c["duration"]),
                                             rng.choice(ids, transfers.size)]),
                    "out_id": np.concatenate([ids, transfers]),
                    "in_table": pa.DictionaryArray.from_arrays(pa.array(np.zeros(edges, np.int8)),
                                                               pa.array(["instruction"])),
                    "out_table": pa.DictionaryArray.from_arrays(
                        pa.array(np.repeat(np.array([0, 1], np.int8), [m, transfers.size])),
                        pa.array(["instruction", "dma_block"])),
                    "dependency_type": pa.DictionaryArray.from_arrays(
                        pa.array(np.repeat(np.array([0, 1], np.int8), [m, transfers.size])),
                        pa.array(["SEMAPHORE", "DMA_TRIGGER"])),
                })
            next_id += m
            packet_id += k
        write_derived(writer)



# -- Shape.SIDE_BY_SIDE ----------------------------------------------------------------------------


def _side_by_side_chunk(rng: np.random.Generator, start: int, m: int) -> dict[str, Any]:
    """``m`` instructions over one stretch of time that every track shares (as in a real trace: the
    engines run side by side), each track busy 30-600 ns per instruction with random idle gaps."""
    per_track = np.floor(TRACK_SHARE * m).astype(np.int64)
    per_track[-1] += m - per_track.sum()
    width = int(per_track.max() * 470)
    parts = []
    for t, n in enumerate(per_track.tolist()):
        duration = rng.integers(30, 600, n).astype(np.int64)
        idle = max(0, width - int(duration.sum()))
        weights = rng.random(n)
        gap = np.floor(weights / weights.sum() * idle).astype(np.int64)
        begin = start + np.cumsum(gap + duration) - duration
        parts.append((np.full(n, t, np.int8), begin, duration, gap))
    track = np.concatenate([p[0] for p in parts])
    begin = np.concatenate([p[1] for p in parts])
    order = np.argsort(begin, kind="stable")
    out = {
        "track": track[order],
        "start": begin[order],
        "duration": np.concatenate([p[2] for p in parts])[order],
        "gap": np.concatenate([p[3] for p in parts])[order],
        "end_of_chunk": np.int64(start + width),
    }
    opcode = np.empty(m, np.int8)
    for t, choices in TRACK_OPCODES.items():
        sel = out["track"] == t
        opcode[sel] = rng.choice(choices, int(sel.sum()))
    out["opcode"] = opcode
    return out


def _write_side_by_side(path: str, n: int, seed: int, chunk: int) -> None:
    """An ``n``-instruction profile written through ProfileWriter (memory: one chunk): six timeline
    rows advancing together, HLO ops and layers contiguous in time, six DMA queues (one packet per 8
    instructions), one collective stream and an HBM counter every 10 us, plus the derived tables a
    capture writes at close (Summary, OpcodeSummary, ActiveTime, DmaUsage, InstructionLod)."""
    rng = np.random.default_rng(seed)
    operands = pa.array(
        [
            f"S[{i % 32}] (Tensor)++@complete src=fp16@0x{i:04x}[1,0,0][3,1,1] dst=0x{2 * i:06x}"
            for i in range(4096)
        ]
    )
    birs = pa.array([f"sg0000:{i}" for i in range(4096)])
    hlos = pa.array([f"dot.{i}" for i in range(512)])
    layers = pa.array([f"model/layers.{i}/mlp" for i in range(32)])
    clock = next_id = packet_id = cc_id = hbm_total = 0
    with ProfileWriter(path, _hardware("synthetic", instance_type="trn1.2xlarge")) as writer:
        while next_id < n:
            m = min(chunk, n - next_id)
            c = _side_by_side_chunk(rng, clock, m)
            ids = np.arange(next_id, next_id + m, dtype=np.int64)
            op = (c["start"] // HLO_SPAN_NS) % 512
            layer = (c["start"] // LAYER_SPAN_NS) % 32
            flops = np.where(c["opcode"] == 0, 2 * 128 * 128 * 512, 0).astype(np.int64)
            engine = np.array(ENGINE_OF, np.int8)[c["track"]]
            writer.write(
                "Instruction",
                {
                    "start_ts": c["start"],
                    "end_ts": c["start"] + c["duration"],
                    "duration_ns": c["duration"],
                    "engine": pa.DictionaryArray.from_arrays(pa.array(engine), pa.array(ENGINES)),
                    "timeline_track": pa.DictionaryArray.from_arrays(pa.array(c["track"]), pa.array(TRACKS)),
                    "opcode": pa.DictionaryArray.from_arrays(pa.array(c["opcode"]), pa.array(OPCODES)),
                    "operands": pa.DictionaryArray.from_arrays(
                        pa.array((ids % 4096).astype(np.int16)), operands
                    ),
                    "bir_id": pa.DictionaryArray.from_arrays(pa.array((ids % 4096).astype(np.int16)), birs),
                    "hlo_name": pa.DictionaryArray.from_arrays(pa.array(op.astype(np.int16)), hlos),
                    "layer": pa.DictionaryArray.from_arrays(pa.array(layer.astype(np.int8)), layers),
                    "id": ids,
                    "pc": ids % 50_000,
                    "raw_hlo_id": op,
                    "evt_wait_time_ns": c["gap"],
                    "raw_flops": flops,
                    "adjusted_flops": flops,
                    "pcore_idx": np.zeros(m, np.int64),
                    "sbuf_read_bytes": np.where(c["opcode"] < 6, 65536, 0),
                    "sbuf_write_bytes": np.where(c["opcode"] < 6, 32768, 0),
                },
            )
            end = int(c["end_of_chunk"])
            k = m // 8
            start = np.sort(rng.integers(clock, end, k))
            duration = rng.integers(200, 2000, k)
            nbytes = rng.integers(512, 65536, k)
            queue = rng.integers(0, len(QUEUES), k)
            writer.write(
                "DmaPacket",
                {
                    "start_ts": start,
                    "end_ts": start + duration,
                    "duration_ns": duration,
                    "pcore_idx": np.zeros(k, np.int64),
                    "id": np.arange(packet_id, packet_id + k),
                    "packet_idx": (np.arange(k) % 4).astype(np.int32),
                    "packet_aggregation_id": np.arange(packet_id, packet_id + k) // 4,
                    "engine_idx": np.arange(k) % 16,
                    "read_bytes": nbytes,
                    "write_bytes": nbytes,
                    "transfer_bytes": nbytes,
                    "throughput": (nbytes / duration * 1e9).astype(np.float32),
                    "queue_type": pa.DictionaryArray.from_arrays(
                        pa.array((queue // 3).astype(np.int8)), pa.array(["input", "data"])
                    ),
                    "queue_name": pa.DictionaryArray.from_arrays(
                        pa.array(queue.astype(np.int8)), pa.array(QUEUES)
                    ),
                    "queue_idx": queue,
                    "crc": np.zeros(k, np.int64),
                    "hbm_read_bytes": nbytes,
                    "hbm_write_bytes": np.zeros(k, np.int64),
                },
            )
            cc_start = np.arange(clock, end, 50_000, dtype=np.int64)
            cc_duration = rng.integers(3_000, 12_000, cc_start.size)
            nc = cc_start.size
            writer.write(
                "CcOp",
                {
                    "start_ts": cc_start,
                    "end_ts": cc_start + cc_duration,
                    "duration_ns": cc_duration,
                    "operation": pa.array(["AllReduce"] * nc),
                    "algorithm": pa.array(["Ring"] * nc),
                    "num_elements": np.full(nc, 1 << 20),
                    "dtype": pa.array(["bf16"] * nc),
                    "op_id": np.arange(cc_id, cc_id + nc),
                    "stream_id": np.zeros(nc, np.int64),
                    "stream_index": np.arange(cc_id, cc_id + nc),
                    "trigger_engine": pa.array(["GpSimd"] * nc),
                },
            )
            ts = np.arange(clock, end, 10_000, dtype=np.int64)
            moved = rng.integers(0, 4_000_000, ts.size)
            writer.write(
                "HbmUsage",
                {
                    "timestamp": ts,
                    "current_throughput": (moved * 1e5).astype(np.float32),
                    "total_transfer_bytes": hbm_total + np.cumsum(moved),
                    "pcore_idx": np.zeros(ts.size, np.int64),
                },
            )
            hbm_total += int(moved.sum())
            next_id += m
            packet_id += k
            cc_id += nc
            clock = end
        write_derived(writer)



# -- Shape.HIERARCHY -------------------------------------------------------------------------------


def _ops() -> list[tuple[str, str, int]]:
    """(layer path, hlo name, op id) of one execution, in execution order."""
    out: list[tuple[str, str, int]] = []
    for layer in range(HIERARCHY_LAYERS):
        for block, names in HIERARCHY_BLOCKS:
            for name in names:
                out.append((f"model/layers.{layer}/{block}", f"{name}.{layer}", len(out) + 1))
    return out


def _write_hierarchy(path: str, n: int, seed: int) -> None:
    """An ``n``-instruction profile with a full hierarchy (see ``Shape.HIERARCHY``)."""
    rng = np.random.default_rng(seed)
    ops = _ops()
    executions = max(1, -(-n // (len(ops) * PER_OP)))  # at least n instructions
    layers = sorted({layer for layer, _, _ in ops})
    layer_index = {layer: i for i, layer in enumerate(layers)}
    hlo_names = pa.array([name for _, name, _ in ops])
    layer_names = pa.array(layers)
    stacks = pa.array([f"[1, 2, {3 + i % 8}]" for i in range(len(ops))])
    engine_names, opcode_names = pa.array(ENGINES), pa.array(HIERARCHY_OPCODES)
    tracks = pa.array(TRACKS)
    hlo_rows: dict[str, list[Any]] = {}
    node_spans: dict[str, list[tuple[int, int]]] = {}
    node_sums: dict[str, np.ndarray] = {}  # per layer: instructions per engine (5), hbm bytes
    t = 0
    next_id = 0
    with ProfileWriter(path, _hardware("synthetic 10M")) as writer:
        for execution in range(executions):
            columns: dict[str, list[np.ndarray]] = {}
            for op_index, (layer, _name, op_id) in enumerate(ops):
                engine = rng.choice(5, PER_OP, p=[0.4, 0.3, 0.15, 0.05, 0.1]).astype(np.int8)
                duration = rng.integers(40, 400, PER_OP)
                gap = rng.integers(0, 60, PER_OP)
                start = t + np.cumsum(duration // 3 + gap) - duration // 3
                end = start + duration
                # Tensor alternates LDWEIGHTS/MATMUL; the others run one opcode each
                opcode = np.where(
                    (engine == 0) & (np.arange(PER_OP) % 2 == 1),
                    1,
                    np.array([0, 2, 3, 4, 5], np.int8)[engine],
                ).astype(np.int8)
                flops = np.where(opcode == 0, 2 * 128 * 128 * 128, 0).astype(np.int64)
                hbm = np.where(opcode == 1, 32768, 0).astype(np.int64)
                part = {
                    "start": start,
                    "end": end,
                    "dur": duration,
                    "engine": engine,
                    "opcode": opcode,
                    "op": np.full(PER_OP, op_index, np.int16),
                    "flops": flops,
                    "hbm": hbm,
                    "wait": np.where(engine == 0, gap, 0),
                }
                for key, array in part.items():
                    columns.setdefault(key, []).append(array)
                s, e = int(start.min()), int(end.max())
                for key, value in (
                    ("id", next_id),
                    ("raw_bir_id", next_id),
                    ("raw_penguin_id", op_id),
                    ("raw_hlo_id", op_id),
                    ("raw_framework_id", op_id),
                    ("hlo_name", ops[op_index][1]),
                    ("modular_flow_invocation_idx", execution),
                    ("start_ts", s),
                    ("end_ts", e),
                    ("time_intervals", f"[[{s}, {e}]]"),
                    ("element_count_per_interval", [None]),
                    ("transpose_element_count_per_interval", [None]),
                    ("hbm_transfer_size_per_interval", [int(hbm.sum())]),
                    ("hbm_read_bytes", int(hbm.sum())),
                    ("hbm_write_bytes", 0),
                    ("instruction_count", PER_OP),
                    ("active_time_ns", e - s),
                    ("raw_flops", int(flops.sum())),
                ):
                    hlo_rows.setdefault(key, []).append(value)
                path_parts = layer.split("/")
                for depth in range(1, len(path_parts) + 1):
                    node = "/".join(path_parts[:depth])
                    node_spans.setdefault(node, []).append((s, e))
                    sums = node_sums.setdefault(node, np.zeros(7, np.int64))
                    sums[:5] += np.bincount(engine, minlength=5)
                    sums[5] += int(hbm.sum())
                    sums[6] += int(flops.sum())
                next_id += PER_OP
                t = e + 20
            cat = {k: np.concatenate(v) for k, v in columns.items()}
            m = cat["start"].size
            ids = np.arange(next_id - m, next_id, dtype=np.int64)
            op = cat["op"]
            writer.write(
                "Instruction",
                {
                    "start_ts": cat["start"],
                    "end_ts": cat["end"],
                    "duration_ns": cat["dur"],
                    "engine": pa.DictionaryArray.from_arrays(pa.array(cat["engine"]), engine_names),
                    "timeline_track": pa.DictionaryArray.from_arrays(
                        pa.array(np.where(cat["opcode"] == 0, 5, cat["engine"]).astype(np.int8)), tracks
                    ),
                    "opcode": pa.DictionaryArray.from_arrays(pa.array(cat["opcode"]), opcode_names),
                    "operands": pa.DictionaryArray.from_arrays(
                        pa.array(np.zeros(m, np.int8)), pa.array(["S[5] (Tensor)++@complete"])
                    ),
                    "id": ids,
                    "pc": ids % 50_000,
                    "bir_id": pa.DictionaryArray.from_arrays(
                        pa.array((ids % 1024).astype(np.int16)),
                        pa.array([f"sg0000:{i}" for i in range(1024)]),
                    ),
                    "hlo_name": pa.DictionaryArray.from_arrays(pa.array(op), hlo_names),
                    "raw_hlo_id": op.astype(np.int64) + 1,
                    "raw_framework_id": op.astype(np.int64) + 1,
                    "layer": pa.DictionaryArray.from_arrays(
                        pa.array(np.array([layer_index[ops[i][0]] for i in range(len(ops))], np.int16)[op]),
                        layer_names,
                    ),
                    "stack_frame_ids": pa.DictionaryArray.from_arrays(pa.array(op), stacks),
                    "raw_flops": cat["flops"],
                    "adjusted_flops": cat["flops"],
                    "hbm_read_bytes": cat["hbm"],
                    "hbm_write_bytes": np.zeros(m, np.int64),
                    "evt_wait_time_ns": cat["wait"],
                    "pcore_idx": np.zeros(m, np.int64),
                },
            )
        writer.write("HloInstruction", hlo_rows)
        writer.write("FrameworkNode", _framework_rows(node_spans, node_sums, ops))
        _stack_frames(writer)
        writer.update_metadata(first_hw_timestamp=0, last_hw_timestamp=t)
        write_derived(writer)


def _framework_rows(
    spans: dict[str, list[tuple[int, int]]], sums: dict[str, np.ndarray], ops: list[tuple[str, str, int]]
) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {}
    peak = 2 * 128 * 128 * 2.8e9
    for node, node_spans in spans.items():
        parent = node.rpartition("/")[0]
        children = sorted(n for n in spans if n.rpartition("/")[0] == node)
        merged: list[list[int]] = []
        for s, e in sorted(node_spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        busy = sum(e - s for s, e in merged)
        total = sums[node]
        values = {
            "node_name": node,
            "children_names": "[" + ", ".join(children) + "]",
            "parent_name": parent,
            "children_ids": "[" + ", ".join(str(i) for layer, _, i in ops if layer == node) + "]",
            "start_ts": merged[0][0],
            "end_ts": merged[-1][1],
            "time_intervals": json.dumps(merged),
            "hbm_read_bytes": int(total[5]),
            "hbm_write_bytes": 0,
            "tensor_engine_instruction_count": int(total[0]),
            "vector_engine_instruction_count": int(total[1]),
            "scalar_engine_instruction_count": int(total[2]),
            "gpsimd_engine_instruction_count": int(total[3]),
            "sync_engine_instruction_count": int(total[4]),
            "instruction_count": int(total[:5].sum()),
            "active_time_ns": busy,
            "mfu": round(100 * total[6] / (peak * busy * 1e-9), 3) if busy else None,
        }
        for key, value in values.items():
            rows.setdefault(key, []).append(value)
    return rows


def _stack_frames(writer: Any) -> None:
    """Frames: run.py:10 -> model.py:20 -> model.py:30..37 (one line per op kind)."""
    files = {"id": ["1", "2"], "name": ["run.py", "model.py"]}
    functions = {"id": ["1", "2"], "name": ["main", "forward"]}
    lines = [(1, 1, 10), (2, 2, 20)] + [(2, 2, 30 + i) for i in range(8)]
    writer.write("StackFrameFileName", files)
    writer.write("StackFrameFunctionName", functions)
    writer.write(
        "StackFrameFileLocation",
        {
            "id": [str(i + 1) for i in range(len(lines))],
            "file_name_id": pa.array([f for f, _, _ in lines], pa.int32()),
            "function_name_id": pa.array([g for _, g, _ in lines], pa.int32()),
            "line_number": pa.array([n for _, _, n in lines], pa.int32()),
        },
    )
    writer.write(
        "StackFrame",
        {
            "id": [str(i + 1) for i in range(len(lines))],
            "file_location_id": pa.array(list(range(1, len(lines) + 1)), pa.int32()),
            "parent_frame_id": ["0", "1"] + ["2"] * 8,
        },
    )
