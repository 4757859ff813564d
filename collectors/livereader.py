"""Reading live state: one typed, immutable snapshot per publishing process.

Readers never lock and never wait: they list the live directory and parse each file, which a
publisher only ever replaces whole. While reading they clean up after publishers that could not:

* a file whose process is gone (or whose pid now belongs to another process, told apart by start
  time) is deleted, as are temporary files such a process left half-written;
* a file of a live process that has not been rewritten for ``STALE_PERIODS`` of its own periods (at
  least ``STALE_MIN_S``) is kept and marked ``stale``: the process holds its cores but its publisher
  is stuck (for example a long call that holds the GIL), which a viewer should show, not hide.

A directory that is not the user's own and private is not read at all (``livepaths.check_live_dir``;
said once on the log, and by neuron-monitor as its one-line error); in a good one, files are opened
through the directory's descriptor without following links and without blocking, and only regular
files of the user up to ``MAX_STATE_BYTES`` are parsed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors import livepaths

STALE_PERIODS = 6
STALE_MIN_S = 5.0
TMP_MAX_AGE_S = 60.0  # a temporary file older than this has lost its writer
MAX_STATE_BYTES = 16 << 20  # a process with thousands of models writes well under 1 MiB

_log = logging.getLogger(__name__)
_warned: set[str] = set()


@dataclass(frozen=True)
class CoreSample:
    """Cumulative counters of one physical core of one process (``collectors.livestate``)."""

    index: int
    device: int
    generation: int
    busy_ns: int
    flops: int
    executions: int
    hbm_bytes: int
    engine_busy_ns: Mapping[str, float]
    last_execution_at: float


@dataclass(frozen=True)
class ModelSample:
    """A model loaded by a process, with its device memory by neuron-monitor category."""

    model_id: int
    name: str
    uuid: str
    core: int
    device: int
    rank: int
    loaded_at: float
    memory: Mapping[str, int]
    executions: int
    last_execution_at: float

    @property
    def memory_bytes(self) -> int:
        return sum(self.memory.values())


@dataclass(frozen=True)
class TrainingSample:
    """Cumulative training-step counters of a process that trains (``collectors.livestate``)."""

    layout: str
    steps: int
    sequences: int
    tokens: int
    step_ns: int  # device time of the steps
    model_flops: float
    ranks: int
    peak_flops_per_rank: float
    seq: int
    step_latency_hist: Mapping[int, int]


@dataclass(frozen=True)
class ProcessState:
    """One publisher's file as read at one moment."""

    pid: int
    start_time: float
    tag: str
    command: str
    user: str
    runtime_version: str
    period_s: float
    started_at: float
    sampled_at: float
    sequence: int
    instance_type: str | None
    cpu_user_s: float
    cpu_system_s: float
    rss_bytes: int
    cores: Mapping[int, CoreSample]
    models: tuple[ModelSample, ...]
    execution_status: Mapping[str, int]
    errors: Mapping[str, int]
    total_latency_hist: Mapping[int, int]
    device_latency_hist: Mapping[int, int]
    link_bytes: Mapping[str, int]
    training: TrainingSample | None = None
    stale: bool = False
    path: Path | None = field(default=None, compare=False)

    @property
    def device_memory_bytes(self) -> int:
        return sum(m.memory_bytes for m in self.models)

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices whose cores this process has used, in order."""
        return tuple(sorted({c.device for c in self.cores.values()}))


def parse_state(data: Mapping[str, Any], path: Path | None = None, *, stale: bool = False) -> ProcessState:
    """A ``ProcessState`` from a state file's JSON; KeyError/TypeError/ValueError if malformed."""
    if data.get("format") != "neuronscope-live":
        raise ValueError("not a neuronscope live-state file")
    host = data.get("host", {})
    cores = {}
    for key, c in data.get("cores", {}).items():
        cores[int(key)] = CoreSample(
            index=int(key), device=int(c["device"]), generation=int(c.get("generation", 0)),
            busy_ns=int(c["busy_ns"]), flops=int(c["flops"]), executions=int(c["executions"]),
            hbm_bytes=int(c.get("hbm_bytes", 0)),
            engine_busy_ns={k: float(v) for k, v in c.get("engine_busy_ns", {}).items()},
            last_execution_at=float(c.get("last_execution_at", 0.0)))
    models = tuple(ModelSample(
        model_id=int(m["model_id"]), name=str(m["name"]), uuid=str(m["uuid"]), core=int(m["core"]),
        device=int(m["device"]), rank=int(m.get("rank", 0)), loaded_at=float(m["loaded_at"]),
        memory={k: int(v) for k, v in m["memory"].items()}, executions=int(m["executions"]),
        last_execution_at=float(m.get("last_execution_at", 0.0))) for m in data.get("models", []))
    return ProcessState(
        pid=int(data["pid"]), start_time=float(data["start_time"]), tag=str(data["tag"]),
        command=str(data.get("command", "")), user=str(data.get("user", "")),
        runtime_version=str(data.get("runtime_version", "")), period_s=float(data["period_s"]),
        started_at=float(data["started_at"]), sampled_at=float(data["sampled_at"]),
        sequence=int(data["sequence"]), instance_type=data.get("instance_type"),
        cpu_user_s=float(host.get("cpu_user_s", 0.0)), cpu_system_s=float(host.get("cpu_system_s", 0.0)),
        rss_bytes=int(host.get("rss_bytes", 0)), cores=cores, models=models,
        execution_status={k: int(v) for k, v in data.get("execution_status", {}).items()},
        errors={k: int(v) for k, v in data.get("errors", {}).items()},
        total_latency_hist={int(k): int(v) for k, v in data.get("total_latency_hist", {}).items()},
        device_latency_hist={int(k): int(v) for k, v in data.get("device_latency_hist", {}).items()},
        link_bytes={k: int(v) for k, v in data.get("link_bytes", {}).items()},
        training=_training(data.get("training")), stale=stale, path=path)


def _training(raw: Any) -> TrainingSample | None:
    if not isinstance(raw, Mapping):
        return None
    return TrainingSample(
        layout=str(raw["layout"]), steps=int(raw["steps"]), sequences=int(raw["sequences"]),
        tokens=int(raw["tokens"]), step_ns=int(raw["step_ns"]), model_flops=float(raw["model_flops"]),
        ranks=int(raw["ranks"]), peak_flops_per_rank=float(raw["peak_flops_per_rank"]), seq=int(raw["seq"]),
        step_latency_hist={int(k): int(v) for k, v in raw.get("step_latency_hist", {}).items()})


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):  # another reader got there first, or not ours to delete
        path.unlink()


def _tmp_owner(name: str) -> int | None:
    parts = name.split(".")  # .<pid>.<random>.tmp
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() and parts[3] == "tmp" else None


def read_live_state(directory: Path | None = None, *, cleanup: bool = True,
                    now: float | None = None) -> list[ProcessState]:
    """Every live publisher's state, by pid; removes the files of dead publishers if ``cleanup``."""
    directory = directory or livepaths.live_dir()
    now = time.time() if now is None else now
    try:
        if not livepaths.check_live_dir(directory):
            return []
        dir_fd = livepaths.open_live_dir(directory)
    except livepaths.LiveDirError as exc:
        if str(exc) not in _warned:  # once per problem: readers poll every second
            _warned.add(str(exc))
            _log.warning("%s", exc)
        return []
    try:
        return _read_states(directory, dir_fd, cleanup, now)
    finally:
        os.close(dir_fd)


def _read_states(directory: Path, dir_fd: int, cleanup: bool, now: float) -> list[ProcessState]:
    try:
        entries = list(os.scandir(dir_fd))
    except OSError:
        return []
    states: list[ProcessState] = []
    for entry in entries:
        path = directory / entry.name
        pid = livepaths.pid_of(path)
        if pid is None:
            owner = _tmp_owner(entry.name)
            if cleanup and owner is not None and (livepaths.process_start_time(owner) is None
                                                  or now - _mtime(entry) > TMP_MAX_AGE_S):
                _remove(path)
            continue
        try:
            raw = livepaths.read_private(dir_fd, entry.name, MAX_STATE_BYTES)
            data = None if raw is None or len(raw) > MAX_STATE_BYTES else json.loads(raw)
        except FileNotFoundError:
            continue  # its publisher exited between the listing and the read
        except (OSError, ValueError, RecursionError):
            data = None
        start_time = _float(data.get("start_time")) if isinstance(data, dict) else None
        alive = (livepaths.same_process_alive(pid, start_time) if start_time is not None
                 else livepaths.process_start_time(pid) is not None)
        if not alive:
            if cleanup:
                _remove(path)
            continue
        if data is None:
            continue  # a live process wrote something we cannot read (other version): skip it
        try:
            period = float(data.get("period_s", 1.0))
            stale = now - float(data.get("sampled_at", 0.0)) > max(STALE_PERIODS * period, STALE_MIN_S)
            states.append(parse_state(data, path, stale=stale))
        except (KeyError, TypeError, ValueError):
            continue
    states.sort(key=lambda s: s.pid)
    return states


def _mtime(entry: os.DirEntry) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


__all__ = ["CoreSample", "ModelSample", "ProcessState", "TrainingSample", "parse_state", "read_live_state"]
