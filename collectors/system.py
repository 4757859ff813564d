"""The system profile: host CPU and memory over time, and the runtime's API events, on the host clock.

    with collectors.system_profile("out/run/system", interval_s=0.05):
        model(x)

Written as the real tool's system-profile tables (profile-schema.md §1.5): ``CpuUsage`` (one row per
CPU per sample, psutil), ``HostMemUsage`` (used bytes and percent per sample) and
``SystemProfileEvents`` (``trace_event_source`` ``neuron_rt``): ``nrt_load`` per loaded model,
``nrt_execute`` per execution with its host span, ``nc_exec_running`` for the device span, and
``nrt_cc`` per collective.

**Clock alignment.** System-profile timestamps are Unix-epoch nanoseconds. Device profiles keep the
device clock (ns since the core's first execution, as the real trace's ticks). Each execution is
the sync point: the runtime reports the host time the execution was requested
(``host_start_ns``) next to its device start, so a device timestamp ``t`` of that execution is
placed at ``host_start_ns + (t - device_start)`` on the host clock. ``nc_exec_running`` and
``nrt_cc`` events are placed that way, and carry both clocks in ``extra_attributes_json``
(``device_start_ns``, ``device_end_ns``) so a reader can redo the mapping. Device time is simulated,
so an execution's device span and its host span need not have the same length.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from collectors.recording import recording
from formats.recorder import metadata_from_spec
from formats.writer import ProfileWriter, timestamp_text
from neuroncore.config import default_instance
from neuroncore.events import EventBatch
from neuroncore.hardware import INSTANCE_TYPES, core_spec
from neuroncore.record_kinds import (
    CcOpMeta,
    ExecutionEndMeta,
    ExecutionStartMeta,
    ProgramLoadedMeta,
    TrainStepMeta,
)

FIRST_FLUSH_S = 5.0
FLUSH_FRACTION = 0.1
EVENT_COLUMNS = ("id", "name", "start_ts", "end_ts", "duration_ns", "trace_event_source", "instance_id",
                 "process_id", "thread_id", "nc_idx", "worker_gid", "extra_attributes_json")


class RuntimeEventLog:
    """Runtime API events (``SystemProfileEvents`` rows) from the event sink of one process.

    A process under ``neuron-profile capture -- CMD`` writes its log as JSON lines at exit
    (``write_jsonl``); the wrapper reads it into the system profile (``read_jsonl``)."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.rows: dict[str, list[Any]] = {name: [] for name in EVENT_COLUMNS}
        self._starts: dict[int, ExecutionStartMeta] = {}  # execution id -> its start
        self._lock = threading.Lock()

    def __call__(self, batch: EventBatch) -> None:
        meta = batch.meta
        with self._lock:
            if isinstance(meta, ProgramLoadedMeta):
                now = time.time_ns()
                self._event("nrt_load", now, now, os.getpid(), threading.get_native_id(), meta.core,
                            {"model_id": meta.model_id, "model_name": meta.model_name,
                             "instructions": meta.n_instructions, "rank": meta.rank})
            elif isinstance(meta, ExecutionStartMeta):
                self._starts[meta.execution_id] = meta
            elif isinstance(meta, ExecutionEndMeta):
                self._execution(meta)
            elif isinstance(meta, CcOpMeta):
                self._collectives(batch.columns, meta)
            elif isinstance(meta, TrainStepMeta):
                self._train_step(meta)

    def write_jsonl(self, path: str | Path) -> None:
        with self._lock, open(path, "w", encoding="utf-8") as out:
            for i in range(len(self.rows["id"])):
                out.write(json.dumps({name: self.rows[name][i] for name in EVENT_COLUMNS}) + "\n")

    def read_jsonl(self, path: str | Path) -> int:
        """Append another log's rows (renumbering ids); returns how many. Only plain JSON is read."""
        added = 0
        with self._lock, open(path, encoding="utf-8") as source:
            for line in source:
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or not all(k in row for k in EVENT_COLUMNS):
                    raise ValueError(f"{path}: not a runtime event log line: {line[:80]!r}")
                row["id"] = len(self.rows["id"]) + 1
                for name in EVENT_COLUMNS:
                    self.rows[name].append(row[name])
                added += 1
        return added

    def _event(self, name: str, start: int, end: int, pid: int, tid: int, core: Any,
               extra: dict[str, Any]) -> None:
        events = self.rows
        events["id"].append(len(events["id"]) + 1)
        events["name"].append(name)
        events["start_ts"].append(int(start))
        events["end_ts"].append(int(end))
        events["duration_ns"].append(int(end) - int(start))
        events["trace_event_source"].append("neuron_rt")
        events["instance_id"].append(self.instance_id)
        events["process_id"].append(int(pid))
        events["thread_id"].append(int(tid))
        events["nc_idx"].append(None if core is None else int(core))
        events["worker_gid"].append(extra.get("rank"))
        events["extra_attributes_json"].append(json.dumps(extra, default=str))

    def _execution(self, meta: ExecutionEndMeta) -> None:
        start = self._starts.get(meta.execution_id)
        host_start, host_end = meta.host_start_ns, meta.host_end_ns
        pid, tid = meta.pid, meta.thread_id
        extra = {"execution_id": meta.execution_id, "model_id": meta.model_id,
                 "model_name": None if start is None else start.model_name,
                 "rank": None if start is None else start.rank,
                 "device_start_ns": meta.start_ns, "device_end_ns": meta.end_ns,
                 "timing_only": meta.timing_only}
        self._event("nrt_execute", host_start, host_end, pid, tid, meta.core, extra)
        device_ns = meta.device_time_ns
        self._event("nc_exec_running", host_start, host_start + device_ns, pid, tid, meta.core, extra)

    def _train_step(self, meta: TrainStepMeta) -> None:
        """A ``train_step`` mark over the step's execution on the host clock: where steps begin and
        end in the system profile, with the step's layout and batch."""
        start = self._starts.get(meta.execution_id)
        pid, tid = (start.pid, start.thread_id) if start else (os.getpid(), threading.get_native_id())
        begin = start.host_start_ns if start else meta.host_start_ns
        extra = {"execution_id": meta.execution_id, "step": meta.step, "layout": meta.layout,
                 "global_batch": meta.global_batch, "seq": meta.seq, "step_time_ns": meta.step_time_ns,
                 "rank": None if start is None else start.rank}
        self._event("train_step", begin, begin + meta.step_time_ns, pid, tid, meta.core, extra)

    def _collectives(self, columns: Mapping[str, Any], meta: CcOpMeta) -> None:
        start = self._starts.get(meta.execution_id)
        if start is None:
            return
        offset = start.host_start_ns - start.start_ns  # device -> host (see module doc)
        for i, operation in enumerate(columns["operation"]):
            extra = {"execution_id": meta.execution_id, "operation": operation,
                     "algorithm": columns["algorithm"][i], "replica_group": columns["replica_group"][i],
                     "bytes": int(columns["input_size"][i]), "rank": meta.rank,
                     "device_start_ns": int(columns["start_ts"][i]),
                     "device_end_ns": int(columns["end_ts"][i])}
            self._event("nrt_cc", int(columns["start_ts"][i]) + offset, int(columns["end_ts"][i]) + offset,
                        start.pid, start.thread_id, meta.core, extra)


class SystemProfileCollector:
    """Samples host CPU/memory in a thread and turns runtime events from the sink into rows."""

    def __init__(self, out_dir: str | Path, *, interval_s: float = 0.1,
                 instance_id: str | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"the sampling interval must be positive, not {interval_s!r}")
        self.out_dir = Path(out_dir)
        self.interval_s = float(interval_s)
        self.instance_id = instance_id or socket.gethostname()
        spec = core_spec(default_instance())
        instance = INSTANCE_TYPES[default_instance()]
        self.hbm_capacity_bytes = instance.chips * instance.chip.hbm_bytes
        self.writer = ProfileWriter(self.out_dir, {"is_simulation": True, "instance_type": default_instance(),
                                                   **metadata_from_spec(spec)})
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self.events = RuntimeEventLog(self.instance_id)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="neuronscope-system-sampler",
                                        daemon=True)
        self.samples = 0

    # -- host samples ------------------------------------------------------------------------
    def start(self) -> None:
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval to measure
        self._thread.start()

    def _sample_loop(self) -> None:
        started = time.monotonic()
        next_flush = FIRST_FLUSH_S
        while not self._stop.wait(self.interval_s):
            self.sample()
            elapsed = time.monotonic() - started
            if elapsed >= next_flush:
                self.flush()
                next_flush = elapsed + max(FIRST_FLUSH_S, elapsed * FLUSH_FRACTION)

    def flush(self) -> None:
        """Commit the samples taken so far as parts: a capture killed later keeps them. Flushes come
        every max(5 s, a tenth of the time so far), so a killed capture loses at most that tail and
        an hour's capture has a few dozen parts per table, not thousands."""
        with self._lock:
            if self.writer.is_open:
                self.writer.flush()

    def sample(self) -> None:
        """Take one CPU and memory sample now (the thread calls this every interval)."""
        now = time.time_ns()
        self._first_ns = self._first_ns or now
        self._last_ns = now
        per_cpu = psutil.cpu_percent(percpu=True)
        memory = psutil.virtual_memory()
        with self._lock:
            if not self.writer.is_open:
                return
            self.writer.write("CpuUsage", {
                "timestamp": [now] * len(per_cpu), "util_percent": [float(p) for p in per_cpu],
                "cpu_id": [str(i) for i in range(len(per_cpu))],
                "instance_id": [self.instance_id] * len(per_cpu)})
            self.writer.write("HostMemUsage", {
                "timestamp": [now], "used_bytes": [int(memory.total - memory.available)],
                "used_percent": [float(memory.percent)], "instance_id": [self.instance_id]})
            self.samples += 1

    # -- runtime events ----------------------------------------------------------------------
    def __call__(self, batch: EventBatch) -> None:
        meta = batch.meta
        if isinstance(meta, ProgramLoadedMeta):
            with self._lock:
                if self.writer.is_open and meta.instance_type:
                    self.writer.update_metadata(instance_type=meta.instance_type,
                                                **metadata_from_spec(meta.spec))
        self.events(batch)

    def add_events(self, path: str | Path) -> int:
        """Take in the runtime events another process logged (``RuntimeEventLog.write_jsonl``)."""
        return self.events.read_jsonl(path)

    # -- finishing ---------------------------------------------------------------------------
    def _stop_sampling(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _flush_events(self) -> None:
        events = self.events.rows
        if events["id"]:
            self.writer.write("SystemProfileEvents", events)
        times = [t for t in (self._first_ns, self._last_ns, *events["start_ts"], *events["end_ts"]) if t]
        first, last = (min(times), max(times)) if times else (time.time_ns(),) * 2
        self.writer.write("SystemProfileMetadata", {
            "first_ts": [timestamp_text(first)], "last_ts": [timestamp_text(last)],
            "first_ts_ns": [str(first)], "last_ts_ns": [str(last)], "ntff_version": [0],
            "hbm_capacity_bytes": [int(self.hbm_capacity_bytes)]})

    def close(self) -> Path:
        self._stop_sampling()
        self.sample()  # the last moment is always in the profile
        with self._lock:
            if not self.writer.is_open:  # aborted already
                return self.writer.close()
            self._flush_events()
            return self.writer.close()

    def abort(self, reason: str) -> Path | None:
        self._stop_sampling()
        with contextlib.suppress(Exception):
            self.sample()  # the moment it stopped
        with self._lock:
            if self.writer.is_open:
                with contextlib.suppress(Exception):
                    self._flush_events()
            return self.writer.abort(reason)


@contextlib.contextmanager
def system_profile(out_dir: str | Path, *, interval_s: float = 0.1, sink: Any = None,
                   instance_id: str | None = None) -> Iterator[SystemProfileCollector]:
    """Record a system profile of the block into ``out_dir`` (kept, flagged incomplete, on error)."""
    collector = SystemProfileCollector(out_dir, interval_s=interval_s, instance_id=instance_id)
    with recording(collector, sink, started=collector.start):
        yield collector


__all__ = ["RuntimeEventLog", "SystemProfileCollector", "system_profile"]
