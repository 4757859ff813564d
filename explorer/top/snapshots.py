"""neuron-top's typed data API: immutable snapshots, separate from the widgets that draw them.

As nvitop separates ``Device``/``Process`` snapshots from its TUI, every source (our live state, a
neuron-monitor stream from any host) produces one ``Frame`` per update and never touches the screen;
the TUI, ``--once`` and the tests read frames and nothing else. Frames are frozen, so the collection
thread can hand one to the UI thread without copying or locking, and a widget can tell "nothing
changed" by equality alone.

Absent is not zero (sys-tools.md §1.5): a core no process lists is absent from every mapping, a group
a report does not carry is ``None``, a value a source cannot know (a remote process's command) is
``None``; renderers show each as "no data", never as ``0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# engines shown per core (Sync is internal sequencing, not a compute engine a user tunes for)
ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "DMA")
# per-core device memory categories, in the real tool's summary order (sys-tools.md §3.2 row 5)
DEVICE_MEMORY_KEYS = ("tensors", "constants", "model_code", "runtime_memory", "model_shared_scratchpad")
DEVICE_MEMORY_LABELS = {"tensors": "Tensors", "constants": "Constants", "model_code": "Model Code",
                        "runtime_memory": "Runtime Memory", "model_shared_scratchpad": "Model Scratchpad"}
HOST_MEMORY_KEYS = ("tensors", "constants", "dma_buffers", "application_memory")
HOST_MEMORY_LABELS = {"tensors": "Tensors", "constants": "Constants", "dma_buffers": "DMA Buffers",
                      "application_memory": "App. Memory"}
LINK_KINDS = ("neuronlink", "efa")

# process states shown in the process table's flag column; STOPPED: SIGSTOP / Ctrl-Z (psutil status)
RUNNING, STALE, EXITED, ERROR, STOPPED = "running", "stale", "exited", "error", "stopped"


@dataclass(frozen=True)
class Hardware:
    """The instance being watched (from ``neuron_hardware_info`` + ``instance_info``)."""

    instance_id: str
    instance_type: str
    core_version: str  # v1, v2, v3, v3d
    device_count: int
    cores_per_device: int  # logical
    device_memory_bytes: int
    simulated: bool = False
    error: str = ""

    @property
    def cores(self) -> int:
        return self.device_count * self.cores_per_device

    def device_of(self, core: int) -> int:
        return core // max(self.cores_per_device, 1)

    def local_of(self, core: int) -> int:
        return core % max(self.cores_per_device, 1)


@dataclass(frozen=True)
class CoreUse:
    """One global logical core as one process used it over the last period."""

    core: int
    utilization: float  # percent 0..100
    flops: float  # FLOP/s
    engine_busy: Mapping[str, float] | None = None  # fraction 0..1 by engine; None: source lacks it
    hbm_bytes_per_s: float | None = None


@dataclass(frozen=True)
class LoadedModel:
    """One model (one subgraph of it) on one core, with its memory by category."""

    pid: int
    name: str
    model_id: int
    uuid: str
    is_running: bool
    core: int  # global logical core
    device_memory: Mapping[str, int]
    host_bytes: int

    @property
    def device_bytes(self) -> int:
        return sum(self.device_memory.values())


@dataclass(frozen=True)
class TrainingUse:
    """A training job's last period: steps, throughput, training MFU, step-latency percentiles."""

    layout: str
    steps: int
    seq_per_s: float
    mfu: float | None
    step_p50_s: float | None
    step_p99_s: float | None


@dataclass(frozen=True)
class ProcessSnapshot:
    """One Neuron application, as its report (and, for live state, its own file) describes it."""

    pid: int
    tag: str
    error: str = ""
    cores: Mapping[int, CoreUse] | None = None  # None: neuroncore_counters not reported
    host_memory: Mapping[str, int] | None = None  # None: memory_used not reported
    core_memory: Mapping[int, Mapping[str, int]] | None = None
    models: tuple[LoadedModel, ...] = ()
    vcpu_user: float | None = None
    vcpu_system: float | None = None
    executions: int | None = None  # completed in the last period
    latency_p50_s: float | None = None
    training: TrainingUse | None = None  # a process running training steps (execution_stats.training_stats)
    group_errors: Mapping[str, str] = field(default_factory=dict)
    command: str | None = None
    user: str | None = None
    started_at: float | None = None  # Unix seconds; for a stream, when it was first seen
    started_exact: bool = True  # False: ``started_at`` is only "first seen"
    rss_bytes: int | None = None
    link_bytes_per_s: Mapping[str, float] | None = None
    state: str = RUNNING
    gone_at: float | None = None  # when an exited process was last seen

    @property
    def device_memory_bytes(self) -> int | None:
        if self.core_memory is None:
            return None
        return sum(sum(v.values()) for v in self.core_memory.values())

    @property
    def held_cores(self) -> tuple[int, ...]:
        """Cores this process lists or holds memory on."""
        held = set(self.cores or ()) | set(self.core_memory or ())
        return tuple(sorted(held))

    @property
    def host_bytes(self) -> int | None:
        if self.rss_bytes is not None:
            return self.rss_bytes
        return None if self.host_memory is None else sum(self.host_memory.values())


@dataclass(frozen=True)
class SystemSnapshot:
    """Host-wide figures (``system_data``): None where the group was not collected."""

    vcpu_user: float | None = None  # user + nice, percent of the machine
    vcpu_system: float | None = None  # system + io_wait + irq + soft_irq
    vcpu_count: int | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    swap_total: int | None = None
    swap_used: int | None = None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceStatus:
    """Where frames come from and what went wrong on the way (shown, never raised)."""

    kind: str  # "live" or "monitor"
    description: str  # live directory or stream name
    message: str = ""  # one line: why there is nothing, or that the stream ended
    errors: tuple[str, ...] = ()  # recent problems, newest last (malformed lines, group errors)
    ended: bool = False
    reports: int = 0
    malformed: int = 0


@dataclass(frozen=True)
class HistoryView:
    """Recent samples, oldest first, per tab (``None`` = the "all" tab, else a pid)."""

    cores: Mapping[int | None, Mapping[int, tuple[float, ...]]] = field(default_factory=dict)
    hbm: Mapping[int | None, tuple[float, ...]] = field(default_factory=dict)  # bytes/s
    links: Mapping[int | None, tuple[float, ...]] = field(default_factory=dict)  # NeuronLink bytes/s
    has_hbm: bool = False  # the source reports HBM / link traffic at all


@dataclass(frozen=True)
class Frame:
    """Everything neuron-top shows at one moment."""

    sequence: int
    taken_at: float  # Unix seconds
    hardware: Hardware
    system: SystemSnapshot
    processes: tuple[ProcessSnapshot, ...]  # by pid; exited ones last seen recently included
    status: SourceStatus
    host_name: str = ""
    history: HistoryView = field(default_factory=HistoryView)

    @property
    def active(self) -> tuple[ProcessSnapshot, ...]:
        """Processes whose data counts (not exited, no entry error): the tabs after "all"."""
        return tuple(p for p in self.processes if p.state not in (EXITED, ERROR))

    def process(self, pid: int) -> ProcessSnapshot | None:
        return next((p for p in self.processes if p.pid == pid), None)


__all__ = ["DEVICE_MEMORY_KEYS", "DEVICE_MEMORY_LABELS", "ENGINES", "ERROR", "EXITED", "HOST_MEMORY_KEYS",
           "HOST_MEMORY_LABELS", "LINK_KINDS", "RUNNING", "STALE", "STOPPED", "CoreUse", "Frame", "Hardware",
           "HistoryView", "LoadedModel", "ProcessSnapshot", "SourceStatus", "SystemSnapshot"]
