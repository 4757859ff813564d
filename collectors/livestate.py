"""What one process's cores have done so far: an event-sink listener keeping cumulative counters.

Everything kept here is cumulative since the listener started (busy device time, FLOPs, per-engine
busy time, executions, latency histograms, bytes moved) or current (loaded models and their device
memory). Rates and per-period deltas are a reader's business: it subtracts two snapshots taken at
times of its choosing, so any number of readers with different periods share one publisher.

Per-engine busy time is the union of an engine's instruction spans: each instruction track runs one
instruction at a time, so a track's busy time is the sum of its durations; the Tensor engine's two
tracks (LoadStationary and MultiplyMoving, on one PE array) overlap, so their spans are merged; DMA
is busy while at least one packet of the core is in flight.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from collectors import latency
from neuroncore.enums import ENGINE_NAMES, N_TRACKS, Engine, Resource
from neuroncore.events import EventBatch
from neuroncore.record_kinds import (
    ExecutionEndMeta,
    ModelMeta,
    ProgramLoadedMeta,
    RecordKind,
    TrainStepMeta,
    meta_of,
)

ENGINES = (*ENGINE_NAMES, "DMA")
_TRACK_ENGINE = {int(r): Engine(r).label for r in (Resource.VECTOR, Resource.SCALAR, Resource.GPSIMD,
                                                    Resource.SYNC)}  # single-stream tracks
_TENSOR_TRACKS = (int(Resource.TENSOR_LS), int(Resource.TENSOR_MM))
INSTRUCTION_BYTES = 64  # one encoded engine instruction in the program image [assumption]
DESCRIPTOR_BYTES = 32  # one DMA descriptor [assumption]
EXECUTION_STATUSES = ("completed", "completed_with_err", "completed_with_num_err", "timed_out",
                      "incorrect_input", "failed_to_queue")
ERROR_KINDS = ("generic", "numerical", "transient", "model", "runtime", "hardware")


def union_ns(starts: np.ndarray, ends: np.ndarray, carry_end: float) -> tuple[float, float]:
    """Length of the union of spans, not counting time before ``carry_end`` (already counted by an
    earlier batch of the same execution); returns it and the new carry."""
    if starts.size == 0:
        return 0.0, carry_end
    order = np.argsort(starts, kind="stable")
    s = np.maximum(starts[order].astype(np.float64), carry_end)
    e = ends[order].astype(np.float64)
    reach = np.maximum.accumulate(np.maximum(e, s))
    previous = np.concatenate(([carry_end], reach[:-1]))
    covered = np.maximum(reach - np.maximum(s, previous), 0.0)
    return float(covered.sum()), max(carry_end, float(reach[-1]))


@dataclass
class CoreCounters:
    """Cumulative activity of one physical core."""

    generation: int = 0
    device: int = 0
    busy_ns: int = 0  # device time of executions that ended
    flops: int = 0  # MAC x 2 of the Tensor engine, like the driver's flop_count
    executions: int = 0
    hbm_bytes: int = 0
    engine_busy_ns: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    last_execution_at: float = 0.0  # Unix seconds

    def as_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "device": self.device, "busy_ns": self.busy_ns,
                "flops": self.flops, "executions": self.executions, "hbm_bytes": self.hbm_bytes,
                "engine_busy_ns": {k: round(v) for k, v in self.engine_busy_ns.items()},
                "last_execution_at": self.last_execution_at}


@dataclass
class ModelRecord:
    """A loaded program and the device memory it holds, in neuron-monitor's per-core categories."""

    model_id: int
    name: str
    uuid: str
    core: int
    device: int
    rank: int
    loaded_at: float
    memory: dict[str, int]
    executions: int = 0
    last_execution_at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "name": self.name, "uuid": self.uuid, "core": self.core,
                "device": self.device, "rank": self.rank, "loaded_at": self.loaded_at,
                "memory": dict(self.memory), "executions": self.executions,
                "last_execution_at": self.last_execution_at}


def model_memory(meta: ProgramLoadedMeta) -> dict[str, int]:
    """A program's device memory by neuron-monitor category (sys-tools.md §1.6 ``memory_used``).

    constants = weights; tensors = inputs + outputs; model_shared_scratchpad = compiler scratch
    (spills, relayouts); model_code = instructions + DMA descriptors at the assumed encoded sizes;
    runtime_memory = 0 (the execution core has no runtime of its own in device memory)."""
    kinds = meta.hbm_bytes_by_kind
    return {
        "constants": int(kinds.get("weight", 0)),
        "model_code": meta.n_instructions * INSTRUCTION_BYTES + meta.n_dma_transfers * DESCRIPTOR_BYTES,
        "model_shared_scratchpad": int(kinds.get("scratch", 0)),
        "runtime_memory": 0,
        "tensors": int(kinds.get("input", 0)) + int(kinds.get("output", 0)),
    }


def program_uuid(meta: ProgramLoadedMeta, hlo_names: list[str]) -> str:
    """32 hex digits naming the program, equal for the same program loaded on several cores (as the
    real runtime's uuid is equal for one NEFF loaded several times)."""
    digest = hashlib.md5(usedforsecurity=False)
    digest.update(repr((meta.model_name, meta.n_instructions, meta.n_dma_transfers, meta.spec.name)).encode())
    for name in hlo_names:
        digest.update(name.encode())
    return digest.hexdigest()


class LiveAccumulator:
    """Event-sink listener: turns batches into cumulative per-core and per-process counters.

    Thread-safe (tensor-parallel runs report from several threads); work per batch is a few NumPy
    reductions, never a loop over records."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cores: dict[int, CoreCounters] = {}
        self.models: dict[int, ModelRecord] = {}
        self.instance_type: str | None = None
        self.status = dict.fromkeys(EXECUTION_STATUSES, 0)
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.total_latency: dict[int, int] = {}
        self.device_latency: dict[int, int] = {}
        self.link_bytes: dict[str, int] = {}
        self._carry: dict[tuple[int, str], float] = {}  # (core, engine) -> covered-until, per execution
        self.training: dict[str, Any] | None = None  # cumulative training-step counters, once a step ran

    # -- listener ------------------------------------------------------------------------------

    def __call__(self, batch: EventBatch) -> None:
        handler = self._handlers.get(batch.kind)
        if handler is None:  # execution-level detail the live counters do not use
            return
        with self._lock:
            handler(self, batch)

    def _core(self, index: int) -> CoreCounters:
        core = self.cores.get(index)
        if core is None:
            core = self.cores[index] = CoreCounters()
        return core

    def _on_program_loaded(self, batch: EventBatch) -> None:
        meta = meta_of(batch, ProgramLoadedMeta)
        index = meta.core
        core = self._core(index)
        core.generation = meta.spec.generation
        core.device = meta.device
        if meta.instance_type:
            self.instance_type = meta.instance_type
        model_id = meta.model_id
        if model_id in self.models:  # re-announced to a new listener: already counted
            return
        uuid = program_uuid(meta, list(batch.columns["hlo_name"]))
        self.models[model_id] = ModelRecord(
            model_id=model_id, name=meta.model_name, uuid=uuid, core=index,
            device=core.device, rank=meta.rank, loaded_at=time.time(),
            memory=model_memory(meta))
        self._evict(index, meta.spec.hbm_bytes)

    def _evict(self, core: int, capacity: int) -> None:
        """Forget the oldest models of a core once they could no longer all fit in its memory.

        There is no unload event: a model leaves when its Instance is dropped. A core cannot hold
        more than its HBM, so when the models recorded for it exceed that, the oldest belong to
        Instances that are gone."""
        if capacity <= 0:
            return
        mine = sorted((m for m in self.models.values() if m.core == core), key=lambda m: m.model_id)
        total = sum(sum(m.memory.values()) for m in mine)
        for model in mine[:-1]:
            if total <= capacity:
                break
            total -= sum(model.memory.values())
            del self.models[model.model_id]

    @staticmethod
    def _core_index(batch: EventBatch) -> int:
        return meta_of(batch, ModelMeta).core

    def _on_execution_start(self, batch: EventBatch) -> None:
        core = self._core_index(batch)
        for engine in ENGINES:
            self._carry[(core, engine)] = float("-inf")

    def _on_instruction(self, batch: EventBatch) -> None:
        cols = batch.columns
        index = self._core_index(batch)
        core = self._core(index)
        track = np.asarray(cols["track"])
        duration = np.asarray(cols["duration_ns"], dtype=np.float64)
        per_track = np.bincount(track, weights=duration, minlength=N_TRACKS)
        for t, engine in _TRACK_ENGINE.items():
            core.engine_busy_ns[engine] += float(per_track[t])
        tensor = (track == _TENSOR_TRACKS[0]) | (track == _TENSOR_TRACKS[1])
        if tensor.any():
            key = (index, Engine.TENSOR.label)
            busy, self._carry[key] = union_ns(np.asarray(cols["start_ts"])[tensor],
                                              np.asarray(cols["end_ts"])[tensor],
                                              self._carry.get(key, float("-inf")))
            core.engine_busy_ns[Engine.TENSOR.label] += busy
        core.flops += int(np.asarray(cols["raw_flops"], dtype=np.int64).sum())

    def _on_dma_packet(self, batch: EventBatch) -> None:
        cols = batch.columns
        index = self._core_index(batch)
        key = (index, "DMA")
        busy, self._carry[key] = union_ns(np.asarray(cols["start_ts"]), np.asarray(cols["end_ts"]),
                                          self._carry.get(key, float("-inf")))
        self._core(index).engine_busy_ns["DMA"] += busy

    def _on_hbm_usage(self, batch: EventBatch) -> None:
        total = np.asarray(batch.columns["total_transfer_bytes"])
        if total.size:
            self._core(self._core_index(batch)).hbm_bytes += int(total[-1])

    def _on_neuronlink_usage(self, batch: EventBatch) -> None:
        """Bytes moved over chip-to-chip links by kind (``neuronlink``, ``efa``, ``on_chip``)."""
        cols = batch.columns
        kinds = list(cols["channel_kind"])
        moved = np.asarray(cols["transfer_bytes"], dtype=np.int64)
        for kind in set(kinds):
            mask = np.fromiter((k == kind for k in kinds), bool, len(kinds))
            name = str(kind).lower().replace("-", "_")
            self.link_bytes[name] = self.link_bytes.get(name, 0) + int(moved[mask].sum())

    def _on_execution_end(self, batch: EventBatch) -> None:
        meta = meta_of(batch, ExecutionEndMeta)
        now = time.time()
        core = self._core(meta.core)
        device_ns = meta.device_time_ns
        core.busy_ns += device_ns
        core.executions += 1
        core.last_execution_at = now
        model = self.models.get(meta.model_id)
        if model is not None:
            model.executions += 1
            model.last_execution_at = now
        self.status["completed"] += 1
        host_ns = meta.host_end_ns - meta.host_start_ns
        _count(self.total_latency, latency.bucket(host_ns))
        _count(self.device_latency, latency.bucket(device_ns))

    def _on_train_step(self, batch: EventBatch) -> None:
        """A training step: cumulative steps, sequences, tokens, step device time, model FLOPs and a
        step-latency histogram (readers turn them into throughput, MFU and percentiles)."""
        m = meta_of(batch, TrainStepMeta)
        t = self.training
        if t is None or t["layout"] != m.layout:
            t = self.training = {"layout": m.layout, "steps": 0, "sequences": 0, "tokens": 0,
                                 "step_ns": 0, "model_flops": 0.0, "ranks": m.ranks,
                                 "peak_flops_per_rank": m.peak_flops_per_rank, "seq": m.seq,
                                 "step_latency_hist": {}}
        t["steps"] += 1
        t["sequences"] += m.global_batch
        t["tokens"] += m.global_batch * m.seq
        t["step_ns"] += m.step_time_ns
        t["model_flops"] += m.model_flops
        _count(t["step_latency_hist"], latency.bucket(m.step_time_ns))

    _handlers: ClassVar[dict[RecordKind, Callable[[LiveAccumulator, EventBatch], None]]] = {
        RecordKind.PROGRAM_LOADED: _on_program_loaded,
        RecordKind.EXECUTION_START: _on_execution_start,
        RecordKind.INSTRUCTION: _on_instruction,
        RecordKind.DMA_PACKET: _on_dma_packet,
        RecordKind.HBM_USAGE: _on_hbm_usage,
        RecordKind.NEURONLINK_USAGE: _on_neuronlink_usage,
        RecordKind.EXECUTION_END: _on_execution_end,
        RecordKind.TRAIN_STEP: _on_train_step,
    }
    """The record kinds the live counters read (semaphore updates and collectives they do not)."""

    # -- snapshot ------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything above as plain JSON-ready data (a copy, safe to serialise off the lock)."""
        with self._lock:
            return {
                "instance_type": self.instance_type,
                "cores": {str(i): c.as_dict() for i, c in sorted(self.cores.items())},
                "models": [m.as_dict() for _, m in sorted(self.models.items())],
                "execution_status": dict(self.status),
                "errors": dict(self.errors),
                "total_latency_hist": {str(k): v for k, v in self.total_latency.items()},
                "device_latency_hist": {str(k): v for k, v in self.device_latency.items()},
                "link_bytes": dict(self.link_bytes),
                **({} if self.training is None else {"training": {
                    **self.training,
                    "step_latency_hist": {str(k): v
                                          for k, v in self.training["step_latency_hist"].items()}}}),
            }


def _count(histogram: dict[int, int], key: int) -> None:
    histogram[key] = histogram.get(key, 0) + 1


__all__ = ["ENGINES", "ERROR_KINDS", "EXECUTION_STATUSES", "CoreCounters", "LiveAccumulator",
           "ModelRecord", "model_memory", "program_uuid", "union_ns"]
