"""Runtime API: instances of cores, loading compiled programs onto a core, executing them.

    inst = Instance("trn1.2xlarge")
    model = inst.core(0).load(program)
    result = model.execute([x])              # numerics + timing
    result = model.execute(timing_only=True) # shapes only: no weights are ever allocated

Each execution gets an id and a measured device time from the timing model; the core's clock moves
forward so successive executions sit one after another on the device timeline.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from neuroncore import plugins
from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler.program import Program
from neuroncore.config import default_instance
from neuroncore.dtypes import DType, to_storage
from neuroncore.events import EventSink
from neuroncore.events import sink as default_sink
from neuroncore.hardware import INSTANCE_TYPES, CoreSpec, InstanceSpec
from neuroncore.ir.reference import bind_inputs
from neuroncore.record_kinds import ExecutionEndMeta, ExecutionStartMeta, RecordKind
from neuroncore.runtime import records
from neuroncore.runtime.host_io import EXECUTION_OVERHEAD_NS
from neuroncore.runtime.ids import PROCESS_IDS
from neuroncore.runtime.interpreter import Exchange, Machine, materialize_weights, prepare_hbm
from neuroncore.runtime.scheduler import Timeline, schedule
from neuroncore.runtime.state import ResidentState, ResidentTensor, StateBinding, host_bytes, without_holes
from neuronscope import settings

# device idle time between back-to-back executions: the runtime's per-execution overhead (~10-13 us
# between executions in Neuron runtime traces, aws-neuron-sdk#1370; see runtime/host_io.py)
LAUNCH_GAP_NS = int(EXECUTION_OVERHEAD_NS)


@dataclass
class ExecutionResult:
    """One execution: its id, device time window and (unless timing-only) its outputs."""

    execution_id: int
    model_id: int
    core: int
    start_ns: int
    end_ns: int
    outputs: list[np.ndarray] | None
    timeline: Timeline
    program: Program
    # bytes the host sent for this execution's inputs and got back as outputs; tensors bound to
    # resident state (neuroncore.runtime.state) stay on the device and are not counted
    host_to_device_bytes: int = 0
    device_to_host_bytes: int = 0

    @property
    def device_time_ns(self) -> int:
        return self.end_ns - self.start_ns


class LoadedModel:
    """A program resident on one core. Weights are materialised on the first numerics run only.

    ``rank`` is the model's place in a tensor-parallel group: it picks the rank's shard of sharded
    weights (0 for a model that is not sharded)."""

    def __init__(self, program: Program, core: NeuronCore, sink: EventSink, rank: int = 0) -> None:
        self.program = program
        self.core = core
        self.sink = sink
        self.rank = rank
        self.model_id = PROCESS_IDS.next_model_id()
        self.executions = 0
        self._weights: dict[str, np.ndarray] | None = None
        # NEURON_RT_STOCHASTIC_ROUNDING_EN: bf16 writes round stochastically (a bf16-sr training
        # step turns it on for its programs unless the variable says 0); one seeded stream per model
        self.stochastic_rounding = bool(settings.STOCHASTIC_ROUNDING.get())
        self._rounding_rng = np.random.default_rng(settings.STOCHASTIC_ROUNDING_SEED.get() or 0)
        self._announced = -1  # sink generation the program was last reported to
        self.announce()

    def announce(self) -> None:
        """Report the program to the sink's listeners, unless they have all heard of it: a recorder
        subscribed after the model was loaded still learns its ops and instructions."""
        sink, core = self.sink, self.core
        if sink.active and self._announced != sink.generation:
            records.emit_program(sink, self.program, self.model_id, core.index, device=core.device,
                                 instance_type=core.instance_type, rank=self.rank)
            self._announced = sink.generation

    def execute(self, inputs: Sequence[np.ndarray | None] | Mapping[str, np.ndarray] | None = None, *,
                timing_only: bool = False, state: StateBinding | None = None) -> ExecutionResult:
        """Run the program once. With ``state``, the bound parameters read the core's resident
        tensors (their ``inputs`` are None) and the bound outputs are written back to them in place
        instead of being returned (``outputs`` then holds only the others, in order)."""
        program = self.program
        host_start_ns = time.time_ns()
        outputs: list[np.ndarray] | None = None
        if state is not None:
            if isinstance(inputs, Mapping):
                raise ValueError("inputs bound to resident state are passed as a sequence")
            params = [p.shape for p in program.graph.parameters]
            if not timing_only:
                if inputs is None:
                    raise ValueError("inputs are required unless timing_only=True")
                with self.core.lock:
                    resident = self.core.resident
                    arrays = resident.bind_inputs(params, list(inputs), state)
                    outputs = resident.store_outputs(self.compute(bind_inputs(program.graph, arrays)), state)
        elif not timing_only:
            if inputs is None:
                raise ValueError("inputs are required unless timing_only=True")
            outputs = self.compute(bind_inputs(program.graph, without_holes(inputs)))
        elif inputs is not None:
            bind_inputs(program.graph, without_holes(inputs))  # still reject wrong shapes
        with self.core.lock:
            t0 = self.core.clock_ns
            timeline = schedule(program, float(t0))
            result = self.record(t0, timeline, outputs, timing_only, host_start_ns=host_start_ns)
        result.host_to_device_bytes, result.device_to_host_bytes = self.host_transfer_bytes(state)
        return result

    def host_transfer_bytes(self, state: StateBinding | None) -> tuple[int, int]:
        """Bytes of one execution's inputs the host sends and outputs it reads back (resident-bound
        tensors excluded)."""
        graph, binding = self.program.graph, state or StateBinding()
        sent = host_bytes([p.shape for p in graph.parameters], [p.dtype for p in graph.parameters],
                          binding.reads)
        received = host_bytes([o.shape for o in graph.outputs], [o.dtype for o in graph.outputs],
                              binding.writes)
        return sent, received

    def compute(self, inputs: list[np.ndarray], exchange: Exchange | None = None) -> list[np.ndarray]:
        """Numerics only: the outputs for bound ``inputs``; ``exchange`` serves collectives."""
        program = self.program
        if self._weights is None:
            self._weights = materialize_weights(program, self.rank)
        hbm = prepare_hbm(program, inputs, self._weights)
        rounding = self._rounding_rng if self.stochastic_rounding else None
        Machine(program, hbm, exchange, rounding).run()
        return [to_storage(hbm[name].reshape(op.shape), op.dtype)
                for name, op in zip(program.output_tensors, program.graph.outputs)]

    def record(self, t0: int, timeline: Timeline, outputs: list[np.ndarray] | None, timing_only: bool,
               collectives: Sequence[tuple[int, CollectiveRecord]] = (), *,
               host_start_ns: int | None = None) -> ExecutionResult:
        """Put one execution that ``timeline`` timed from ``t0`` on this core's clock and report it.

        ``collectives`` pairs each collective node with its timed record (tensor-parallel runs).
        ``host_start_ns`` is when the caller asked for the execution (Unix ns): with the report's own
        end it lets a system profile place the execution on the host clock."""
        program = self.program
        end = int(np.ceil(timeline.finish_ns)) if program.n_nodes else t0
        with self.core.lock:
            execution_id = PROCESS_IDS.next_execution_id()
            self.core.clock_ns = max(self.core.clock_ns, end + LAUNCH_GAP_NS)
        self.executions += 1
        sink, core = self.sink, self.core.index
        sink.poll()  # on-demand listeners (live state while watched) attach here, before the report
        if sink.active:
            self.announce()
            host_ns, pid, tid = host_start_ns or time.time_ns(), os.getpid(), threading.get_native_id()
            sink.emit(RecordKind.EXECUTION_START, {},
                      ExecutionStartMeta(execution_id=execution_id, model_id=self.model_id, core=core,
                                         start_ns=t0, model_name=program.graph.name, rank=self.rank,
                                         host_start_ns=host_ns, pid=pid, thread_id=tid))
            records.emit_execution(sink, program, timeline, execution_id=execution_id,
                                   model_id=self.model_id, core=core)
            if collectives:
                records.emit_collectives(sink, program, collectives, rank=self.rank,
                                         execution_id=execution_id, model_id=self.model_id, core=core)
            sink.emit(RecordKind.EXECUTION_END, {},
                      ExecutionEndMeta(execution_id=execution_id, model_id=self.model_id, core=core,
                                       start_ns=t0, end_ns=end, device_time_ns=end - t0,
                                       timing_only=timing_only, host_end_ns=time.time_ns(),
                                       host_start_ns=host_ns, pid=pid, thread_id=tid))
        return ExecutionResult(execution_id, self.model_id, core, t0, end, outputs, timeline, program)


def stochastic_rounding_wanted(requested: bool) -> bool:
    """Whether a model should round bf16 writes stochastically: what ``NEURON_RT_STOCHASTIC_ROUNDING_EN``
    says when it is set, else ``requested`` (a bf16-sr training step requests it)."""
    value = settings.STOCHASTIC_ROUNDING.get()
    return requested if value is None else bool(value)


class DeviceState:
    """Tensors that stay in one core's HBM from one execution to the next: a training step's
    parameters, optimizer state and gradient buffers. A program reads them as inputs and writes
    their new values as outputs, as XLA aliases a program's inputs to its outputs; the host sends
    only what is not resident (the batch, a few scalars) and reads back only what it asks for.

    The tensors are held in the core's one store of resident tensors (``NeuronCore.resident``, where
    a decoder keeps its KV caches), each under this state's own prefix (two steps, or a whole state
    and a rank's blocks, may use the same names on one core), so they count in the core's HBM use
    and must fit next to the loaded programs (``NeuronCore.allocate_state``: one-line error
    otherwise). They are released when the state is garbage-collected. ``tensors`` reads them by
    name; ``update`` replaces their values (a program's outputs become the resident values)."""

    _serial = itertools.count()

    def __init__(self, core: NeuronCore, tensors: Mapping[str, np.ndarray]) -> None:
        self.core = core
        prefix = f"device-state.{next(DeviceState._serial)}/"
        self._held: dict[str, ResidentTensor] = {}
        finalize = weakref.finalize(self, _free_states, core, [prefix + k for k in tensors])
        try:
            for name, value in tensors.items():
                array = np.asarray(value)
                held = core.allocate_state(prefix + name, tuple(array.shape), DType.FP32)
                held.values = array
                self._held[name] = held
        except ValueError:
            finalize()
            raise
        self.tensors: Mapping[str, np.ndarray] = _ResidentValues(self._held)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._held.values())

    def inputs(self, names: Sequence[str], host: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """A program's inputs in order: resident tensors by name, the rest from ``host``."""
        values = []
        for name in names:
            if name in self._held:
                values.append(self.tensors[name])
            elif name in host:
                values.append(host[name])
            else:
                raise ValueError(f"input {name!r} is neither resident on core {self.core.index} "
                                 f"nor given by the host")
        return values

    def update(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Make a program's outputs the resident values of the tensors they alias."""
        for name, value in outputs.items():
            held = self._held.get(name)
            if held is None:
                raise ValueError(f"output {name!r} aliases no resident tensor")
            held.values = np.asarray(value, np.float32).reshape(held.shape)

    def zero(self, names: Sequence[str]) -> None:
        """Reset resident tensors (gradient buffers after an optimizer step) to zeros."""
        for name in names:
            held = self._held[name]
            held.values = np.zeros(held.shape, np.float32)


class _ResidentValues(Mapping[str, np.ndarray]):
    """A device state's tensors by their own names: the values of the core's resident tensors."""

    def __init__(self, held: dict[str, ResidentTensor]) -> None:
        self._held = held

    def __getitem__(self, name: str) -> np.ndarray:
        values = self._held[name].values
        assert values is not None  # set when the state is made, replaced, never cleared
        return values

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


def _free_states(core: NeuronCore, names: list[str]) -> None:
    for name in names:
        core.free_state(name)


class NeuronCore:
    """One core of an instance, with its own device clock."""

    def __init__(self, index: int, spec: CoreSpec, device: int, sink: EventSink) -> None:
        self.index = index
        self.spec = spec
        self.device = device
        self.sink = sink
        self.clock_ns = 0
        self.instance_type: str | None = None  # set by the Instance that owns the core
        self.lock = threading.RLock()
        self.models: list[LoadedModel] = []
        self.resident = ResidentState()  # tensors kept in HBM across executions (KV caches)

    @property
    def hbm_used_bytes(self) -> int:
        """Device memory held by the models loaded on this core and its resident tensors."""
        return sum(sum(m.program.hbm_bytes_by_kind().values()) for m in self.models) + self.resident.nbytes

    def allocate_state(self, name: str, shape: tuple[int, ...], dtype: DType) -> ResidentTensor:
        """Reserve a resident tensor (zeros) in this core's HBM; it must fit next to what is loaded.
        Allocating a name again with the same shape and dtype returns the tensor, zeroed."""
        existing = self.resident.tensors.get(name)
        if existing is not None:
            if existing.shape != shape or existing.dtype != dtype:
                raise ValueError(f"resident tensor {name} exists on core {self.index} as "
                                 f"{list(existing.shape)} {existing.dtype}")
            existing.values = None
            return existing
        tensor = ResidentTensor(name, shape, dtype)
        self.require_hbm({"state": tensor.nbytes}, name)
        self.resident.tensors[name] = tensor
        return tensor

    def free_state(self, name: str) -> None:
        """Release a resident tensor (nothing happens for a name that is not held)."""
        self.resident.tensors.pop(name, None)

    def load(self, program: Program, *, rank: int = 0) -> LoadedModel:
        """Place ``program`` on this core; it must fit in the core's HBM with what is loaded already.
        ``rank``: the tensor-parallel rank whose weight shards this copy holds."""
        if program.spec.generation != self.spec.generation:
            raise ValueError(
                f"program compiled for {program.spec.name} cannot load on {self.spec.name} "
                f"(core {self.index})")
        self.require_hbm(program.hbm_bytes_by_kind(), program.graph.name)
        model = LoadedModel(program, self, self.sink, rank)
        self.models.append(model)
        return model

    def unload(self, model: LoadedModel) -> None:
        """Take ``model`` off this core (the runtime's ``nrt_unload``): its device memory is free
        again. A core and its models refer to each other, so a loaded model nobody holds is freed
        only by the cycle collector, which walks every record of its program (a long prefill's
        million: ~0.7 CPU s); unloaded, it is freed as soon as its last holder lets go."""
        if model not in self.models:
            raise ValueError(f"{model.program.graph.name} is not loaded on core {self.index}")
        self.models.remove(model)


    def require_hbm(self, usage: Mapping[str, int], name: str) -> None:
        """Refuse (one line: needs vs has, by kind) a model whose ``usage`` does not fit next to
        what this core holds already."""
        need, used, have = sum(usage.values()), self.hbm_used_bytes, self.spec.hbm_bytes
        if need + used > have:
            parts = ", ".join(f"{kind} {_gib(n)}" for kind, n in usage.items() if n)
            loaded = f" ({_gib(used)} held by {len(self.models)} loaded models)" if self.models else ""
            raise ValueError(
                f"{name} does not fit in device memory: it needs {_gib(need)} of HBM "
                f"({parts}) on core {self.index} (device {self.device}), which has {_gib(have)}"
                f"{loaded}")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


class Instance:
    """An instance type's cores; the default type comes from ``neuroncore.config``.

    ``nodes`` > 1 models several instances of the type joined by EFA (timing studies of multi-node
    tensor parallelism): their cores are numbered on from the first node's, as global ranks are."""

    def __init__(self, instance_type: str | None = None, *, sink: EventSink | None = None,
                 nodes: int = 1) -> None:
        name = instance_type or default_instance()
        if name not in INSTANCE_TYPES:
            known = ", ".join(sorted(INSTANCE_TYPES))
            raise ValueError(f"unknown instance type {name!r}; known: {known}")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ValueError(f"nodes must be a positive integer, not {nodes!r}")
        self.spec: InstanceSpec = INSTANCE_TYPES[name]
        self.nodes = nodes
        self.sink = sink or default_sink
        per_chip = self.spec.chip.cores_per_chip
        self.cores = [NeuronCore(i, self.spec.chip.core, i // per_chip, self.sink)
                      for i in range(self.spec.cores * nodes)]
        for core in self.cores:
            core.instance_type = name
        plugins.activate(self.sink)

    @property
    def name(self) -> str:
        return self.spec.name

    def core(self, index: int = 0) -> NeuronCore:
        if not 0 <= index < len(self.cores):
            raise ValueError(f"{self.name} has cores 0..{len(self.cores) - 1}, not {index}")
        return self.cores[index]
