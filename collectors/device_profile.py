"""Device profiles of whatever runs compiled models: one profile per execution (or the nth only).

    import collectors
    with collectors.profile("out/run", nth_exec=2):      # around any code that runs models
        model(x); model(x)
    # out/run/model=llama_decode/core=0/execution=2/Instruction.parquet, ...

A device profile describes one execution of one program on one NeuronCore, as the real tool's does.
The collector listens to the execution core's event sink and routes each execution's batches to a
profile of its own, laid out as hive-style partitions (``model=<name>/core=<n>/execution=<k>``), so
the whole folder reads as one dataset in the query layer, DuckDB, Spark or pandas. Several models,
several cores and the ranks of a tensor-parallel group each get their own profiles.

An execution's profile stays open until the next execution on the same core starts (or the
collection ends): what a group reports after its ranks finish (NeuronLink usage) still reaches it.
If the code inside raises, or the collection is interrupted, the profile of an execution still
running is kept, marked incomplete (``<dir>.incomplete``), profiles of finished executions are
closed complete, and the exception goes on.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.recording import recording
from formats.recorder import ProfileRecorder
from formats.writer import ProfileWriter
from neuroncore.events import EventBatch
from neuroncore.record_kinds import (
    ExecutionEndMeta,
    ExecutionMeta,
    ExecutionStartMeta,
    NeuronLinkUsageMeta,
    ProgramLoadedMeta,
    meta_of,
)


def _safe(text: str) -> str:
    """A partition value usable as a path component (and read back unchanged by hive parsing)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text) or "model"


def _program_identity(program: EventBatch | None, model_id: int) -> Any:
    """What identifies a compiled program across its loads: one ``Program`` object per compiled
    model, whose per-node operand list every ``program_loaded`` batch of it carries (tensor-parallel
    ranks and reloads share it). The batch is kept, so the identity is never reused."""
    if program is None:
        return ("model", model_id)
    return id(meta_of(program, ProgramLoadedMeta).operands)


@dataclass
class _Open:
    recorder: ProfileRecorder
    path: Path
    model: str
    core: int
    execution: int
    key: tuple[Any, int]  # (program, core): what executions are counted by
    warm_up: bool  # recorded before the nth execution, kept only if the nth never comes
    execution_ids: set[int] = field(default_factory=set)
    ended: bool = False  # its execution_end arrived: the execution's records are all there


@dataclass(frozen=True)
class CapturedProfile:
    """One device profile written by the collector."""

    path: Path
    model: str
    core: int
    execution: int  # 1-based count of this model's executions on this core
    complete: bool
    warm_up: bool = False  # the model ran fewer times than nth_exec: this is the last execution before


class DeviceProfileCollector:
    """Event-sink listener that writes one device profile per selected execution.

    With ``nth_exec=N`` only each model's Nth execution per core is kept. Until it comes, the latest
    earlier execution is recorded too, and dropped when a later one starts; if the program stops
    before the Nth, that warm-up execution is kept instead, marked in Metadata
    (``warm_up_execution``, ``requested_execution``) so every view can say so.

    Recording errors never reach the code that runs the model (the execution core calls this
    listener from ``execute()``): the profile concerned is kept, marked incomplete, with the cause
    in its Warning rows; ``errors`` lists them and ``close()`` raises the first afterwards.
    """

    def __init__(self, out_dir: str | Path, *, nth_exec: int | None = None,
                 metadata: Mapping[str, Any] | None = None, **writer_options: Any) -> None:
        if nth_exec is not None and (not isinstance(nth_exec, int) or nth_exec < 0):
            raise ValueError(f"nth_exec must be a positive execution number (or 0 for none), "
                             f"not {nth_exec!r}")
        self.out_dir = Path(out_dir)
        self.nth_exec = nth_exec
        self.metadata = dict(metadata or {})
        self.writer_options = writer_options
        self.profiles: list[CapturedProfile] = []
        self.errors: list[str] = []  # one line per recording failure
        self._programs: dict[tuple[int, int], EventBatch] = {}  # (model_id, core) -> program_loaded batch
        self._counts: dict[tuple[Any, int], int] = {}
        self._open: dict[int, _Open] = {}  # core -> its latest execution's profile
        self._by_execution: dict[int, _Open] = {}
        self._warm_kept: dict[tuple[int, int], CapturedProfile] = {}  # closed warm-up fallbacks
        self._names: dict[Any, str] = {}  # loaded program -> its model= folder name
        self._lock = threading.Lock()

    # -- listener ----------------------------------------------------------------------------
    def __call__(self, batch: EventBatch) -> None:
        with self._lock:
            try:
                self._route(batch)
            except Exception as exc:  # never into the program's execute()
                meta = batch.meta
                self._failed(f"recording a {batch.kind} batch failed: {type(exc).__name__}: {exc}",
                             meta.execution_id if isinstance(meta, ExecutionMeta) else None)

    def _route(self, batch: EventBatch) -> None:
        meta = batch.meta
        if isinstance(meta, ProgramLoadedMeta):
            self._programs[(meta.model_id, meta.core)] = batch
            return
        if isinstance(meta, ExecutionStartMeta):
            self._start(batch, meta)
            return
        if isinstance(meta, NeuronLinkUsageMeta):
            for sharing in {id(o): o for e in meta.execution_ids
                            if (o := self._by_execution.get(e))}.values():
                sharing.recorder(batch)
            return
        target = self._by_execution.get(meta.execution_id)
        if target is not None:
            target.recorder(batch)
            if isinstance(meta, ExecutionEndMeta):
                target.ended = True

    def _failed(self, message: str, execution_id: Any) -> None:
        self.errors.append(message)
        entry = self._by_execution.get(execution_id) if execution_id is not None else None
        if entry is not None:
            self._open.pop(entry.core, None)
            with contextlib.suppress(Exception):
                self._finish(entry, complete=False, reason=message)

    def _start(self, batch: EventBatch, meta: ExecutionStartMeta) -> None:
        core, model_id = meta.core, meta.model_id
        program = self._programs.get((model_id, core))
        # executions are counted per program and core: a program loaded again continues its count
        key = (_program_identity(program, model_id), core)
        self._counts[key] = count = self._counts.get(key, 0) + 1
        nth = self.nth_exec
        wanted = nth is None or (nth > 0 and count <= nth)
        previous = self._open.pop(core, None)
        if previous is not None:
            if wanted and previous.warm_up and previous.key == key:
                self._drop(previous)  # superseded by a later execution of the same model
            else:
                self._finish(previous, complete=previous.ended, reason="its execution did not finish")
        if not wanted:
            return
        superseded = self._warm_kept.pop(key, None)
        if superseded is not None:  # an earlier warm-up of this model, closed when another model ran
            with contextlib.suppress(ValueError):
                self.profiles.remove(superseded)
            shutil.rmtree(superseded.path, ignore_errors=True)
        warm_up = nth is not None and count < nth
        loaded = None if program is None else meta_of(program, ProgramLoadedMeta)
        name = self._name(key[0], meta.model_name or (loaded.model_name if loaded else "model"))
        path = self.out_dir / f"model={name}" / f"core={core}" / f"execution={count}"
        info = dict(self.metadata)
        if loaded is not None:
            if loaded.instance_type is not None:
                info.setdefault("instance_type", loaded.instance_type)
            info.setdefault("neuron_device_idx", loaded.device)
        info.setdefault("neuroncore_idx", core)
        info.setdefault("profile_name", f"{name} core {core} execution {count}")
        info.setdefault("capture_working_dir", _working_dir())  # where source files may be read
        if nth is not None:
            info.update(requested_execution=nth, warm_up_execution=warm_up)
        writer = ProfileWriter(path, {"is_simulation": True, **info}, **self.writer_options)
        recorder = ProfileRecorder(writer, core=core)
        entry = _Open(recorder, path, name, core, count, key, warm_up, {meta.execution_id})
        self._open[core] = entry
        self._by_execution[meta.execution_id] = entry
        if program is not None:
            recorder(program)
        recorder(batch)

    def _name(self, family: Any, model_name: str) -> str:
        """The ``model=`` folder name of a loaded program: its name, made unique among programs (two
        traced modules of one class, in fp32 and bf16, are two programs: ``MLP`` and ``MLP_2``). The
        ranks of a tensor-parallel model load one program, so they share one name."""
        if family not in self._names:
            base, n = _safe(model_name), 1
            taken = set(self._names.values())
            name = base
            while name in taken:
                n += 1
                name = f"{base}_{n}"
            self._names[family] = name
        return self._names[family]

    def _drop(self, entry: _Open) -> None:
        for execution_id in entry.execution_ids:
            self._by_execution.pop(execution_id, None)
        entry.recorder.writer.discard()

    def _finish(self, entry: _Open, *, complete: bool, reason: str = "") -> None:
        for execution_id in entry.execution_ids:
            self._by_execution.pop(execution_id, None)
        if complete:
            try:
                path = entry.recorder.close()
            except Exception as exc:  # kept, marked, at <dir>.incomplete; the cause is remembered
                self.errors.append(f"{entry.path}: {type(exc).__name__}: {exc}")
                path, complete = entry.recorder.writer.path or entry.path, False
        else:
            path = entry.recorder.abort(reason or "capture interrupted") or entry.path
        if entry.recorder.error is not None and not any(str(entry.path) in e for e in self.errors):
            self.errors.append(f"{entry.path}: {type(entry.recorder.error).__name__}: {entry.recorder.error}")
        captured = CapturedProfile(Path(path), entry.model, entry.core, entry.execution, complete,
                                   entry.warm_up)
        self.profiles.append(captured)
        if entry.warm_up:
            self._warm_kept[entry.key] = captured

    # -- finishing ---------------------------------------------------------------------------
    def close(self) -> list[CapturedProfile]:
        """Finish every open profile (complete if its execution finished, else kept marked
        incomplete); returns all profiles written. Raises ``RecordingError`` (one line) afterwards
        if any recording failed."""
        with self._lock:
            for core in sorted(self._open):
                with contextlib.suppress(Exception):  # _finish records its own failures
                    entry = self._open[core]
                    self._finish(entry, complete=entry.ended, reason="its execution did not finish")
            self._open.clear()
            if self.errors:
                more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
                raise RecordingError(f"device profile failed: {self.errors[0]}{more}")
            return list(self.profiles)

    def abort(self, reason: str) -> list[CapturedProfile]:
        """Keep every open profile: complete if its execution had finished (a Ctrl-C or an exception
        after the profiled step does not take away what it recorded), else flagged incomplete with
        ``reason``."""
        with self._lock:
            for core in sorted(self._open):
                with contextlib.suppress(Exception):
                    entry = self._open[core]
                    self._finish(entry, complete=entry.ended, reason=reason)
            self._open.clear()
            return list(self.profiles)


class RecordingError(RuntimeError):
    """A device profile could not be recorded whole (one line; what was recorded is kept, marked)."""


@contextlib.contextmanager
def profile(out_dir: str | Path, *, nth_exec: int | None = None, sink: Any = None,
            metadata: Mapping[str, Any] | None = None,
            **writer_options: Any) -> Iterator[DeviceProfileCollector]:
    """Record device profiles of every execution inside the block (or only each core's ``nth_exec``-th
    execution of each model; 0 records nothing) into ``out_dir``."""
    collector = DeviceProfileCollector(out_dir, nth_exec=nth_exec, metadata=metadata, **writer_options)
    with recording(collector, sink):
        yield collector


__all__ = ["CapturedProfile", "DeviceProfileCollector", "RecordingError", "profile"]


def _working_dir() -> str | None:
    """The directory the program runs in (``formats.source_access`` reads source files under it)."""
    try:
        return os.getcwd()
    except OSError:  # the directory was removed under the program
        return None
