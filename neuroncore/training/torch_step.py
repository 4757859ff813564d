"""A PyTorch training step compiled for one NeuronCore: forward, backward and optimizer update.

    step = neuroncore.trace_train_step(model, optimizer, (x, y), loss_fn=F.cross_entropy)
    for x, y in batches:
        loss = step(x, y)          # one execution on the core; the loss comes back to the host

What happens at trace time: :func:`neuroncore.training.torch_joint.joint_graph` captures the loss
and its gradients through torch's autograd; the PyTorch frontend lowers that FX graph to IR; the
optimizer's update (:mod:`neuroncore.training.optimizers`) is appended as IR ops; the whole is
compiled to ONE program per step. The parameters, the optimizer state (and, with gradient
accumulation, the gradient buffers) are program inputs whose updated values are outputs: they stay
on the core between steps (:class:`neuroncore.runtime.device.DeviceState`, as XLA aliases a
program's inputs to its outputs). Only the user inputs and a few host scalars per step go in, and
only the loss comes out to the host.

After every call the host copies are brought up to date (eagerly, after each step):
``model.parameters()`` hold the new values and ``optimizer.state_dict()`` the new state (``step``,
``exp_avg``, ``exp_avg_sq`` for Adam/AdamW; ``momentum_buffer`` for SGD), as if the user's own
``loss.backward(); optimizer.step(); optimizer.zero_grad()`` had run.

Gradient accumulation (``accumulation_steps=K``): a call takes K micro-batches stacked along dim 0
(each input K times the traced batch). The first K-1 run an *accumulate* program (forward +
backward, gradients added to resident buffers) and the last the *update* program (forward +
backward + the summed gradients + the optimizer), each loss scaled by 1/K as ``(loss / K).backward()``
does; the call returns the mean loss. Both programs are compiled once.
"""

from __future__ import annotations

import enum
import inspect
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.options import CompilerOptions
from neuroncore.compiler.program import Program
from neuroncore.dtypes import DType
from neuroncore.frontends.torch_frontend import (
    _TORCH_DIR,
    KNOWN_MAX_ELEMENTS,
    _Converter,
    _from_numpy,
    _function_frame,
    _to_numpy,
    ir_dtype,
    layer_path,
    stack_frames,
)
from neuroncore.frontends.torch_ops import load_handlers
from neuroncore.frontends.torch_random import RNG_STATE_INPUT, uses_rng
from neuroncore.frontends.tracing import TraceError
from neuroncore.ir.graph import Graph, Op, SourceFrame
from neuroncore.ir.philox import STATE_LIMIT
from neuroncore.runtime import Instance
from neuroncore.runtime.device import (
    DeviceState,
    ExecutionResult,
    LoadedModel,
    stochastic_rounding_wanted,
)
from neuroncore.training.memory import MemoryBreakdown, MemoryCheckError, check_fits, training_memory
from neuroncore.training.optimizers import (
    OptimizerError,
    OptimizerKind,
    OptimizerSpec,
    emit_update,
    host_scalars,
    optimizer_spec,
    split_scalars,
)
from neuroncore.training.precision import Precision, check_options, parse_precision
from neuroncore.training.step_records import PHASES, emit_step
from neuroncore.training.torch_joint import (
    FORWARD,
    LOSS_FN_CALL,
    RECOMPUTE_OF,
    CheckpointingIgnored,
    JointGraph,
    joint_graph,
    saved_activations,
)


class ProgramKind(enum.Enum):
    """The two programs of a step: ``update`` always, ``accumulate`` with gradient accumulation."""

    UPDATE = "update"
    ACCUMULATE = "accumulate"




@dataclass
class _Group:
    spec: OptimizerSpec
    params: list[int]  # indices into the step's parameter list
    torch_group: dict[str, Any]


@dataclass
class _Layout:
    """Where each input and output of a compiled step program lives."""

    inputs: list[str]  # program parameter names, in order
    outputs: list[str]  # resident-state name (or "loss") per program output


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _strip(name: str) -> str:
    """A qualified name inside the user's model (the step wraps it as ``model``)."""
    if name == "model":
        return ""
    return name[len("model."):] if name.startswith("model.") else name


class _JointExport:
    """What ``_Converter`` reads of an ``ExportedProgram``, for a joint FX graph whose
    placeholders are all runtime inputs (parameters and state are resident, not constants)."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        self.graph_module = module
        self.graph = module.graph
        self.graph_signature = SimpleNamespace(input_specs=[], output_specs=[])
        self.state_dict: dict[str, torch.Tensor] = {}
        self.constants: dict[str, torch.Tensor] = {}


class _StepConverter(_Converter):
    """Lowers a joint graph: placeholders get the step's input names; every op's layer path is
    ``model/<phase>/<module path>`` so the hierarchy is phase -> layer -> HLO op."""

    def __init__(self, joint: JointGraph, name: str, autocast: str | None,
                 input_names: list[str], loss_frames: tuple[SourceFrame, ...] = ()) -> None:
        super().__init__(_JointExport(joint.module), name, autocast)  # type: ignore[arg-type]
        self.loss_frames = loss_frames  # where ``loss_fn`` is defined: its ops' line (lower)
        self.joint = joint
        self.input_names = input_names
        self.placeholders: list[Op] = []
        self.values: list[Op] = []  # what the graph reads of each placeholder
        self.bf16_params = False  # bf16-sr: parameters held in bf16, read as FP32
        self.buffer_updates: dict[str, Op] = {}  # resident buffer -> its new value (BatchNorm stats)


    def _placeholder(self, node: torch.fx.Node) -> None:
        meta = node.meta.get("val")
        if not isinstance(meta, torch.Tensor):
            raise TraceError(f"{self.b.name}: a non-tensor input ({node.name}) in a training step")
        name = self.input_names[len(self.placeholders)]
        dtype = ir_dtype(meta.dtype, f" (input {name!r})")
        held = self.bf16_params and name.startswith("param/") and dtype is DType.FP32
        if meta.numel() == 0 and name.startswith("buffer/"):  # an empty KV cache (use_cache=True
            with self.b.located("model", ()):                 # in a forward): nothing to hold
                value = self.b.constant(0.0, dtype, shape=tuple(meta.shape))
            self.placeholders.append(value)
            self.values.append(value)
            self.env[node] = value
            return
        buffer = len(self.placeholders) - len(self.joint.param_names)
        if 0 <= buffer < len(self.joint.buffers) \
                and self.joint.buffer_names[buffer] in self.joint.constants \
                and meta.numel() <= KNOWN_MAX_ELEMENTS:  # a literal (Falcon's ``qkv[..., [-2], :]``):
            self.known[node] = self.joint.buffers[buffer]  # constant indices become slices
        with self.b.located("model", ()):
            op = self.b.parameter(name, tuple(meta.shape), DType.BF16 if held else dtype)
            value = self.b.convert(op, DType.FP32) if held else op
        self.placeholders.append(op)
        self.values.append(value)
        self.env[node] = value

    def lower(self) -> list[Op]:
        """IR ops for the joint graph's outputs (loss, then one gradient per parameter)."""
        outputs: list[Op] = []
        for node in self.ep.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "call_function":
                stack = node.meta.get("nn_module_stack")
                path = _strip(list(stack.values())[-1][0]) if stack else ""
                module = layer_path({"": (path, None)} if path else None)
                phase = node.meta.get("train_phase", FORWARD)
                if RECOMPUTE_OF in node.meta:  # a checkpointed value recomputed in the backward
                    phase += "/recompute"
                layer = "model/" + phase + module[len("model"):]
                trace = node.meta.get("stack_trace")
                frames = tuple(f for f in stack_frames(trace, stack)
                               if not f.file.startswith(_PACKAGE_DIR))  # the step's own wrapper
                if not frames and trace and LOSS_FN_CALL in trace:
                    # an op of the user's ``loss_fn`` (or its backward): torch records only the
                    # step wrapper's frame, so its best line is where ``loss_fn`` is defined, as a
                    # plain traced function gets its ``def`` line (before: ``<unknown>``)
                    frames = self.loss_frames
                self.frames = frames
                with self.b.located(layer, frames):
                    self._evaluate_known(node)
                    self.env[node] = self._call(node)
            elif node.op == "output":
                for arg in node.args[0]:
                    meta = arg.meta["val"]
                    with self.b.located("model/backward", ()):
                        outputs.append(self._as_op(self.env.get(arg), tuple(meta.shape),
                                                   ir_dtype(meta.dtype)))
            elif node.op == "get_attr":
                raise TraceError(f"{self.b.name}: graph attribute {node.target!r} is not supported "
                                 f"in a training step")
        return outputs


StepInputs = Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
"""A step's example inputs: positional tensors, or keyword tensors (``{"input_ids": ..., "labels": ...}``)."""


def keyword_inputs(example_inputs: StepInputs) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    """(the keywords, in order, or ``()`` for positional inputs; the tensors in that order)."""
    if isinstance(example_inputs, Mapping):
        keys = tuple(example_inputs)
        bad = [k for k in keys if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise TraceError(f"keyword inputs must be named by identifiers, not {bad[0]!r}")
        return keys, tuple(example_inputs[k] for k in keys)
    return (), tuple(example_inputs)


class TrainStep:
    """A compiled training step: call it with a batch; it returns the loss as a 0-d tensor.

    Traced with keyword inputs (a dict), it is called with the same keywords:
    ``step(input_ids=..., labels=...)``; traced with positional inputs, positionally."""

    compiles_step_program = True
    """Whether the step's own programs are compiled (a pipeline-parallel step compiles its stages'
    programs instead: the whole step on one core is not one of them)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: StepInputs, *, loss_fn: Callable[..., Any] | None,
                 precision: Precision, accumulation_steps: int, instance: str | None,
                 core: int, frames: tuple[SourceFrame, ...],
                 options: CompilerOptions | None = None, max_grad_norm: float | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.precision = precision
        self.accumulation_steps = accumulation_steps
        self.max_grad_norm = max_grad_norm
        self.input_keys, examples = keyword_inputs(example_inputs)
        self.example_shapes = [tuple(x.shape) for x in examples]
        self.example_dtypes = [x.dtype for x in examples]
        self.name = type(model).__name__
        self.steps = 0
        self.last_results: list[ExecutionResult] = []
        self.instance = Instance(instance)
        self.core = self.instance.core(core)
        self._check_memory(activations=0)  # parameters alone: before anything is traced
        scale = 1.0 / accumulation_steps
        self.joint = joint_graph(model, examples, loss_fn=loss_fn, loss_scale=scale,
                                 input_keys=self.input_keys)
        named = {f"model.{k}": p for k, p in model.named_parameters()}
        self.params = [named[n] for n in self.joint.param_names]
        self.param_names = [_strip(n) for n in self.joint.param_names]
        self.groups = self._groups(optimizer)
        self._frames = frames
        self._loss_frames = _function_frame(loss_fn) if loss_fn is not None else ()
        self.memory = self._check_memory(activations=self._traced_activations())  # before compiling
        self.programs: dict[ProgramKind, tuple[Program, LoadedModel, _Layout]] = {}
        kinds = [ProgramKind.UPDATE] + ([ProgramKind.ACCUMULATE] if accumulation_steps > 1 else [])
        if not self.compiles_step_program:
            kinds = []
        self.graphs: dict[ProgramKind, tuple[Graph, _Layout]] = {kind: self._build(kind) for kind in kinds}
        self._place(options)
        # dropout and other random ops: one seed drawn from torch's generator (so
        # torch.manual_seed makes a run repeat), a new offset for every execution (rng_state)
        self.rng_seed = int(torch.randint(0, STATE_LIMIT, (1,)).item())
        self.rng_executions = 0

    # -- trace time ----------------------------------------------------------------------------
    def _place(self, options: CompilerOptions | None) -> None:
        """Compile the step's programs for its core, load them and put the resident state there.
        (A tensor-parallel step places its ranks' programs and blocks instead, never the whole.)"""
        for kind, (graph, layout) in self.graphs.items():
            program = compile_graph(graph, self.core.spec, options)
            loaded = self.core.load(program)
            loaded.stochastic_rounding = self.stochastic_rounding
            self.programs[kind] = (program, loaded, layout)
        self.state = DeviceState(self.core, self._initial_state())

    @property
    def stochastic_rounding(self) -> bool:
        """Whether the step's programs round bf16 writes stochastically (bf16-sr, unless
        ``NEURON_RT_STOCHASTIC_ROUNDING_EN`` says otherwise)."""
        return stochastic_rounding_wanted(self.precision is Precision.BF16_SR)

    def _memory_shards(self) -> int:
        """How many ways a rank's weights, gradients and optimizer state are split (tp)."""
        return 1

    def _traced_activations(self) -> int:
        """Saved activation bytes to check before building the programs: the joint graph's (a
        tensor-parallel step counts each rank's from its sharded program instead, before compiling)."""
        return saved_activations(self.joint)

    def _check_memory(self, activations: int) -> MemoryBreakdown:
        """Refuse (one line with the breakdown) a step whose weights, gradients, optimizer state and
        saved activations do not fit in the core's free HBM."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        kinds = {optimizer_spec(self.optimizer, g).kind for g in self.optimizer.param_groups
                 if _supported(self.optimizer, g)}
        kind = OptimizerKind.ADAMW if kinds - {OptimizerKind.SGD} else OptimizerKind.SGD
        momentum = any(float(g.get("momentum", 0.0) or 0.0) for g in self.optimizer.param_groups)
        need = training_memory(sum(p.numel() for p in trainable), self.precision, kind,
                               activations=activations, momentum=momentum, master_copy=False,
                               tp=self._memory_shards())
        if self.precision is Precision.FP32 and trainable and \
                all(p.dtype in (torch.bfloat16, torch.float16) for p in trainable):
            # a model in bf16/fp16: its weights, gradients and optimizer state are all 2-byte
            # tensors (emit_update's ``rounding``), half of the FP32 arithmetic's bytes
            need = replace(need, weights=need.weights // 2, gradients=need.gradients // 2,
                           optimizer_state=need.optimizer_state // 2)
        free = self.core.spec.hbm_bytes - self.core.hbm_used_bytes
        try:
            check_fits(need, hbm_bytes=free, what=f"{self.name} training step",
                       where=f"core {self.core.index} of {self.instance.name}")
        except MemoryCheckError as exc:
            raise TraceError(str(exc)) from None
        return need

    def _groups(self, optimizer: torch.optim.Optimizer) -> list[_Group]:
        index = {id(p): i for i, p in enumerate(self.params)}
        groups: list[_Group] = []
        seen: set[int] = set()
        for group in optimizer.param_groups:
            try:
                spec = optimizer_spec(optimizer, group)
            except OptimizerError as exc:
                raise TraceError(str(exc)) from None
            members = [index[id(p)] for p in group["params"] if id(p) in index]
            seen.update(members)
            groups.append(_Group(spec, members, group))
        missing = [self.param_names[i] for i in range(len(self.params)) if i not in seen]
        if missing:
            raise TraceError(f"parameters {', '.join(missing[:3])} require grad but are in no "
                             f"param group of the optimizer")
        return groups

    def _state_names(self, i: int) -> list[str]:
        spec = next(g.spec for g in self.groups if i in g.params)
        return [f"state/{self.param_names[i]}/{s}" for s in spec.state_names]

    def _input_names(self) -> list[str]:
        names = [f"param/{n}" for n in self.param_names]
        names += [f"buffer/{n}" for n in (_strip(b) for b in self.joint.buffer_names)]
        names += [f"input/{i}" for i in range(self.joint.n_inputs)]
        return names

    def _build(self, kind: ProgramKind) -> tuple[Graph, _Layout]:
        load_handlers()
        autocast = "bf16" if self.precision is not Precision.FP32 else None
        name = self.name + ("_train_step" if kind is ProgramKind.UPDATE else "_accumulate")
        conv = _StepConverter(self.joint, name, autocast, self._input_names(), self._loss_frames)
        conv.bf16_params = self._params_in_bf16()
        b = conv.b
        loss, *grads = conv.lower()
        grads = self._reduce_gradients(b, grads)
        params = conv.values[: len(self.params)]
        outputs: list[Op] = [loss]
        names = ["loss"]
        accumulate = self.accumulation_steps > 1
        if accumulate:
            for i, grad in enumerate(grads):
                with b.located(f"model/backward/accumulate/{self._module_of(i)}", self._frames):
                    # ``.grad`` of a bf16/fp16 parameter is of its type: each add rounds to it
                    acc = b.parameter(f"grad/{self.param_names[i]}", grad.shape,
                                      grad.dtype if grad.dtype in (DType.BF16, DType.FP16) else DType.FP32)
                    grads[i] = b.add(acc, grad if grad.dtype is acc.dtype else b.convert(grad, acc.dtype))
        if kind is ProgramKind.ACCUMULATE:
            outputs += grads
            names += [f"grad/{n}" for n in self.param_names]
        else:
            if self.max_grad_norm is not None:
                with b.located("model/optimizer/clip_grad_norm", self._frames):
                    grads = clip_grad_norm(b, grads, self.max_grad_norm)
            for g, group in enumerate(self.groups):
                with b.located("model/optimizer", self._frames):
                    vector = b.parameter(f"scalars/{g}", (len(group.spec.scalar_names),), DType.FP32)
                    scalars = split_scalars(b, group.spec, vector)
                for i in group.params:
                    with b.located(f"model/optimizer/{self._module_of(i)}", self._frames):
                        # a model in bf16/fp16 (no FP32 master weights): its state is of its type
                        # too, every step of the update rounded to it, as torch's (emit_update)
                        narrow = params[i].dtype if params[i].dtype is not DType.FP32 else None
                        state = [b.parameter(n, params[i].shape, narrow or DType.FP32)
                                 for n in self._state_names(i)]
                        if narrow is not None:
                            state = [b.convert(x, DType.FP32) for x in state]
                        param = params[i] if narrow is None else b.convert(params[i], DType.FP32)
                        grad = grads[i] if grads[i].dtype is DType.FP32 else b.convert(grads[i], DType.FP32)
                        new_param, new_state = emit_update(b, group.spec, param, grad, state, scalars,
                                                           rounding=narrow)
                        if conv.bf16_params:  # stored back in bf16: rounded stochastically
                            new_param = b.convert(new_param, DType.BF16)
                        if narrow is not None:
                            new_param = b.convert(new_param, narrow)
                            new_state = [b.convert(x, narrow) for x in new_state]
                    outputs += [new_param, *new_state]
                    names += [f"param/{self.param_names[i]}", *self._state_names(i)]
        for buffer, value in conv.buffer_updates.items():  # running statistics, every forward
            outputs.append(value)
            names.append(buffer)
        graph = b.build(outputs).pruned()
        inputs = [p.name for p in graph.parameters]
        return graph, _Layout(inputs, names)

    def _params_in_bf16(self) -> bool:
        """Whether the device holds the parameters the forward reads in bf16 (bf16-sr: they are
        the only copy; ZeRO-1 in bf16 keeps FP32 master shards besides)."""
        return self.precision is Precision.BF16_SR

    def _reduce_gradients(self, b: Any, grads: list[Op]) -> list[Op]:
        """The gradients the optimizer (or the accumulation) uses: this rank's own on one core;
        a data-parallel step (``neuroncore.parallel.dp_train``) averages them over its replicas."""
        return grads

    def _module_of(self, i: int) -> str:
        module = self.param_names[i].rpartition(".")[0]
        return layer_path({"": (module, None)} if module else None)[len("model/"):] or "model"

    def _initial_state(self) -> dict[str, np.ndarray]:
        """Parameters, optimizer state (resumed from ``optimizer.state`` when it has some),
        gradient buffers and buffers, as they are put on the core before the first step."""
        tensors: dict[str, np.ndarray] = {}
        for i, p in enumerate(self.params):
            tensors[f"param/{self.param_names[i]}"] = _to_numpy(p.detach()).astype(np.float32)
            held = self.optimizer.state.get(p, {})
            for full in self._state_names(i):
                value = held.get(full.rpartition("/")[2])
                tensors[full] = (_to_numpy(value).astype(np.float32) if isinstance(value, torch.Tensor)
                                 else np.zeros(tuple(p.shape), np.float32))
            if self.accumulation_steps > 1:
                tensors[f"grad/{self.param_names[i]}"] = np.zeros(tuple(p.shape), np.float32)
            step = held.get("step")
            if step is not None and i == 0:
                self.steps = int(float(step))
        for name, value in zip(self.joint.buffer_names, self.joint.buffers):
            tensors[f"buffer/{_strip(name)}"] = _to_numpy(value)
        return tensors

    # -- run time ------------------------------------------------------------------------------
    def rng_state(self, inputs: Sequence[str], rank: int = 0) -> dict[str, np.ndarray]:
        """The ``rng/state`` input of one execution of a program that draws random numbers
        (``{}`` for one that does not): the step's seed (one per rank) and a fresh offset. Callers
        count an execution with :meth:`advance_rng` once every rank has its state."""
        if not uses_rng(list(inputs)):
            return {}
        seed = (self.rng_seed + rank + self.rng_executions // STATE_LIMIT) % STATE_LIMIT
        return {RNG_STATE_INPUT: np.array([seed, self.rng_executions % STATE_LIMIT], np.float32)}

    def advance_rng(self) -> None:
        self.rng_executions += 1

    def positional(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> tuple[Any, ...]:
        """A call's inputs in the traced order: the positional ones of a step traced positionally,
        the keyword ones (any order) of a step traced with keywords; a mix is refused."""
        for group in self.groups:  # a hyper-parameter the programs hold fixed changed: refused
            try:                   # before anything runs
                host_scalars(group.spec, group.torch_group, self.steps + 1)
            except OptimizerError as exc:
                raise TraceError(str(exc)) from None
        if not self.input_keys:
            if named:
                raise TraceError(f"{self.name} step was traced with positional inputs; got keyword "
                                 f"inputs {', '.join(sorted(named))}")
            return tuple(inputs)
        if inputs:
            raise TraceError(f"{self.name} step was traced with keyword inputs "
                             f"({', '.join(self.input_keys)}); call it with the same keywords")
        missing = [k for k in self.input_keys if k not in named]
        extra = sorted(set(named) - set(self.input_keys))
        if missing or extra:
            what = (f"missing {', '.join(missing)}" if missing else "") + \
                ("; " if missing and extra else "") + (f"unexpected {', '.join(extra)}" if extra else "")
            raise TraceError(f"{self.name} step was traced with keyword inputs "
                             f"({', '.join(self.input_keys)}): {what}")
        return tuple(named[k] for k in self.input_keys)

    def __call__(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """One optimizer step on ``inputs`` (``accumulation_steps`` micro-batches along dim 0)."""
        inputs = self.positional(inputs, named)
        micro = self._micro_batches(inputs)
        host_start = time.time_ns()
        self.steps += 1
        self.last_results = []
        total = 0.0
        for k, batch in enumerate(micro):
            last = k == len(micro) - 1
            kind = ProgramKind.UPDATE if last else ProgramKind.ACCUMULATE
            _program, loaded, layout = self.programs[kind]
            host = {f"input/{j}": _to_numpy(x) for j, x in enumerate(batch)}
            host.update(self.rng_state(layout.inputs))
            self.advance_rng()
            if last:
                for g, group in enumerate(self.groups):
                    host[f"scalars/{g}"] = host_scalars(group.spec, group.torch_group,
                                                        self.steps)
            result = loaded.execute(self.state.inputs(layout.inputs, host))
            outputs = result.outputs or []
            self.state.update(dict(zip(layout.outputs[1:], outputs[1:])))
            total += float(np.asarray(outputs[0]).reshape(-1)[0])
            self.last_results.append(result)
        if self.accumulation_steps > 1:
            self.state.zero([f"grad/{n}" for n in self.param_names])
        first = inputs[0]
        seq = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else 0
        emit_step(self.programs[ProgramKind.UPDATE][1], self.last_results, step=self.steps,
                  global_batch=int(first.shape[0]) if first.dim() else 1, seq=seq, name=self.name,
                  bf16=self.precision is not Precision.FP32, host_start_ns=host_start)
        self._sync_host()
        return torch.tensor(total, dtype=torch.float32)

    def _micro_batches(self, inputs: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
        k = self.accumulation_steps
        if len(inputs) != len(self.example_shapes):
            raise TraceError(f"{self.name} step was traced with {len(self.example_shapes)} inputs; "
                             f"{len(inputs)} given")
        for i, (x, shape, dtype) in enumerate(zip(inputs, self.example_shapes, self.example_dtypes)):
            want = (shape[0] * k, *shape[1:]) if shape else shape
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != want or x.dtype != dtype:
                # the shape and the dtype both: a float target where int64 class ids were traced
                # must not read as "[8] expected, got (8,)"
                got = f"{list(x.shape)} ({x.dtype})" if isinstance(x, torch.Tensor) else type(x).__name__
                which = repr(self.input_keys[i]) if self.input_keys else str(i)
                raise TraceError(f"{self.name} step: input {which} of shape {list(want)} ({dtype}) expected"
                                 f"{f' ({k} micro-batches of {shape[0]})' if k > 1 else ''}, got {got}")
        if k == 1:
            return [list(inputs)]
        return [[x[j * s[0]:(j + 1) * s[0]] for x, s in zip(inputs, self.example_shapes)] for j in range(k)]

    def _sync_host(self) -> None:
        """Copy the resident parameters, optimizer state and updated buffers (BatchNorm running
        statistics) into the model and optimizer."""
        updated = {n for _, _, layout in self.programs.values() for n in layout.outputs
                   if n.startswith("buffer/")}
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for name in updated:
                target = buffers.get(name[len("buffer/"):])
                if target is not None:
                    target.copy_(_from_numpy(self.state.tensors[name], target.dtype))
                    tracked = buffers.get(name[len("buffer/"):].rpartition(".")[0] + ".num_batches_tracked")
                    if tracked is not None and name.endswith("running_mean"):
                        tracked += self.accumulation_steps
            for i, p in enumerate(self.params):
                name = self.param_names[i]
                p.copy_(_from_numpy(self.state.tensors[f"param/{name}"], p.dtype))
                p.grad = None
                held = self.optimizer.state[p]
                spec = next(g.spec for g in self.groups if i in g.params)
                for full in self._state_names(i):
                    held[full.rpartition("/")[2]] = _from_numpy(self.state.tensors[full], p.dtype)
                if spec.kind is not OptimizerKind.SGD:
                    held["step"] = torch.tensor(float(self.steps), dtype=torch.float32)
        mark_stepped(self.optimizer)

    # -- what a caller may inspect -------------------------------------------------------------
    @property
    def program(self) -> Program:
        """The update program (forward + backward + optimizer)."""
        return self.programs[ProgramKind.UPDATE][0]

    @property
    def graph(self) -> Graph:
        return self.program.graph


def clip_grad_norm(b: Any, grads: Sequence[Op], max_norm: float) -> list[Op]:
    """The gradients scaled as ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` scales them,
    on the device before the optimizer: ``g * min(1, max_norm / (||g||_2 + 1e-6))``, the norm over
    all gradients together. A loop cannot call ``clip_grad_norm_`` itself: the gradients never
    reach the host (``p.grad`` is None after a step).

    Computed in torch's steps and types: one norm per gradient (``_foreach_norm``, of the
    gradient's type), the norm of those norms (of their common type: a 16-bit one when every
    gradient has it, else FP32), ``+ 1e-6``, then ``max_norm / total`` as torch evaluates a number
    over a tensor (``total.reciprocal() * max_norm``), clamped to 1, and each gradient multiplied by
    it in place (``_foreach_mul_``: the product of the gradient's type). Each step is computed in
    FP32 and rounded to its type, as torch's CPU kernels do; with FP32 gradients nothing is
    rounded. Before, a bf16 model's norm, coefficient and scaled gradients stayed FP32 (36 of 740
    parameters one bf16 step off PyTorch's after 3 clipped SGD steps)."""
    kinds = {g.dtype for g in grads}
    common = kinds.pop() if len(kinds) == 1 else DType.FP32

    def rounded(x: Op, dtype: DType) -> Op:  # an FP32 value as torch stores it in ``dtype``
        return x if dtype is DType.FP32 else b.convert(b.convert(x, dtype), DType.FP32)

    fp32 = [g if g.dtype is DType.FP32 else b.convert(g, DType.FP32) for g in grads]
    total: Op | None = None
    for g, original in zip(fp32, grads):
        square = b.multiply(g, g)
        part = b.reduce(square, list(range(len(g.shape))), "sum") if g.shape else square
        norm = rounded(b.sqrt(part), original.dtype)
        norm = rounded(norm, common) if original.dtype is not common else norm
        squared = b.multiply(norm, norm)
        total = squared if total is None else b.add(total, squared)
    assert total is not None
    denominator = rounded(b.add(rounded(b.sqrt(total), common), 1e-6), common)
    coef = rounded(b.multiply(rounded(b.divide(1.0, denominator), common), float(max_norm)), common)
    coef = b.minimum(coef, 1.0)
    scaled = [b.multiply(g, b.broadcast(coef, g.shape, ()) if g.shape else coef) for g in fp32]
    return [x if g.dtype is DType.FP32 else b.convert(x, g.dtype) for x, g in zip(scaled, grads)]


def mark_stepped(optimizer: torch.optim.Optimizer) -> None:
    """Tell torch's LR schedulers that ``optimizer.step()`` ran (the flag their ``step()`` reads):
    the update ran on the device, so without it a correct loop warns "Detected call of
    `lr_scheduler.step()` before `optimizer.step()`"."""
    optimizer._opt_called = True  # type: ignore[attr-defined]


def _supported(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    try:
        optimizer_spec(optimizer, group)
    except OptimizerError:
        return False
    return True


def _caller_frames() -> tuple[SourceFrame, ...]:
    """The user's line that traced the step (the optimizer ops' source)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for info in inspect.stack()[1:]:
        path = os.path.abspath(info.filename)
        if not path.startswith(here + os.sep) and not path.startswith(_TORCH_DIR + os.sep):
            return (SourceFrame(path, info.lineno, info.function),)
    return ()


def trace_train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     example_inputs: StepInputs, *,
                     loss_fn: Callable[..., Any] | None = None, precision: str | Precision = "fp32",
                     accumulation_steps: int = 1, instance: str | None = None,
                     core: int = 0, options: CompilerOptions | None = None,
                     max_grad_norm: float | None = None) -> TrainStep:
    """Compile ``model``'s training step with ``optimizer`` for one core (see the module doc).

    ``example_inputs``: one micro-batch, positionally; with ``loss_fn`` the last one is the target
    (``loss_fn(model(*inputs[:-1]), inputs[-1])``), else the model's forward returns the loss. Or a
    dict of keyword inputs, as transformers models are called (``{"input_ids": ids, "labels": ids}``:
    ``model(**inputs)``, the last entry the target with ``loss_fn``); the step is then called with
    the same keywords, ``step(input_ids=..., labels=...)``.
    ``precision``: ``"fp32"``, ``"bf16"`` (auto-cast: bf16 matmuls, FP32 master weights and
    optimizer state) or ``"bf16-sr"`` (bf16 weights updated with stochastic rounding).
    ``options``: the compiler's precision options (``CompilerOptions``: auto-cast mode and type, e.g.
    matmuls in fp16 or fp8), applied to the whole step program; weight quantisation is refused (a
    step's weights are what it trains).
    ``max_grad_norm``: clip the gradients' global L2 norm before the update, as
    ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)`` between ``backward()``
    and ``optimizer.step()`` does (after accumulating all micro-batches).
    """
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TraceError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
    if not isinstance(accumulation_steps, int) or isinstance(accumulation_steps, bool) \
            or accumulation_steps < 1:
        raise TraceError(f"accumulation_steps must be a positive integer, not {accumulation_steps!r}")
    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (Sequence, Mapping)):
        raise TraceError("example_inputs must be a non-empty sequence of torch tensors or a dict of "
                         "keyword inputs")
    keys, examples = keyword_inputs(example_inputs)
    if not examples or not all(isinstance(x, torch.Tensor) for x in examples):
        raise TraceError("example_inputs must be a non-empty sequence of torch tensors or a dict of "
                         "keyword tensors")
    if max_grad_norm is not None and (
            isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
            or not math.isfinite(max_grad_norm) or max_grad_norm <= 0):
        raise TraceError(f"max_grad_norm must be a positive number, not {max_grad_norm!r}")
    if accumulation_steps > 1 and any(x.dim() == 0 for x in examples):
        raise TraceError("gradient accumulation splits inputs along dim 0; a 0-d input has none")
    try:
        prec = parse_precision(precision)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    check_options(options)
    return TrainStep(model, optimizer, dict(zip(keys, examples)) if keys else examples,
                     loss_fn=loss_fn, precision=prec, accumulation_steps=accumulation_steps,
                     instance=instance, core=core, frames=_caller_frames(), options=options,
                     max_grad_norm=None if max_grad_norm is None else float(max_grad_norm))


__all__ = ["PHASES", "CheckpointingIgnored", "ProgramKind", "StepInputs", "TrainStep", "clip_grad_norm",
           "keyword_inputs", "mark_stepped", "trace_train_step"]
