"""Pipeline-parallel training with real numerics: a ``torch.nn.Sequential`` cut into ``pp`` stages on
``pp`` cores, micro-batches run in the 1F1B schedule, activations and their gradients sent between the
stages' cores.

    step = PipelineParallelTrainStep(model, optimizer, (x_mb, y_mb), pp=2, micro_batches=4,
                                     loss_fn=F.mse_loss)
    loss = step(x, y)        # x: micro_batches x the traced micro-batch along dim 0; the mean loss

Each stage's programs come from torch's autograd like a single-core step
(:func:`neuroncore.training.torch_joint.joint_graph`), traced for the stage's modules alone with the
gradient of the stage's input as an extra output:

* stage ``s < pp-1``: a **forward** program (the stage's input -> its output, sent to stage s+1) and
  a **backward** program (the input and the output's gradient received from stage s+1 -> the
  parameters' gradients, added to resident gradient buffers, and the input's gradient, sent to
  stage s-1). The backward recomputes the stage's forward from its input: the stage keeps only its
  micro-batches' inputs between the passes (full activation checkpointing per stage);
* the last stage: one **forward + loss + backward** program per micro-batch (1F1B runs them back to
  back there), its loss scaled by 1/micro_batches as ``(loss / M).backward()`` does;
* every stage: an **optimizer** program over its parameters and resident state (the traced step's own
  update code, :func:`neuroncore.training.optimizers.emit_update`), after its last backward.

The order is 1F1B (Narayanan et al. 2021; Megatron-LM, NxD): stage s runs ``pp - s - 1`` warm-up
forwards, then alternates one forward and one backward, then drains the backwards. Each stage's
gradients accumulate over the micro-batches in micro-batch order, as single-core gradient
accumulation does, so the step equals one core trained on the same micro-batches.

Sends: a stage's forward program ends with a ``collective-permute`` of its output to the next
stage, its backward program with one of its input's gradient to the previous stage (group ``pp``,
under ``model/pipeline/send_<activation|gradient>``): a CC-core node timed by
``neuroncore.collectives`` on the instance topology and recorded as a CcOp row on the sender's core
(``self.transfers`` lists each with its timing). Timing: each execution starts when its core is
free and its input has arrived (the sending program's permute has ended). Every execution is
recorded on its stage's core, so a capture shows the pipeline: stage s's core idles until its first
activation arrives, and the drain at the end is the bubble.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuroncore import collectives as cc
from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.dtypes import DType
from neuroncore.frontends.torch_frontend import _to_numpy
from neuroncore.frontends.torch_ops import load_handlers
from neuroncore.frontends.tracing import TraceError
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Graph, Op
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.pipeline import Pass, one_f_one_b
from neuroncore.parallel.training import PlanError
from neuroncore.runtime.device import DeviceState, ExecutionResult, LoadedModel
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.optimizers import emit_update, host_scalars, split_scalars
from neuroncore.training.precision import Precision
from neuroncore.training.torch_joint import JointGraph, joint_graph
from neuroncore.training.torch_step import TrainStep, _caller_frames, _StepConverter


class _Stage(torch.nn.Module):
    """Modules ``first..last-1`` of a Sequential, named by their index in it (``layers.<i>``)."""

    def __init__(self, model: torch.nn.Sequential, first: int, last: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleDict({str(i): model[i] for i in range(first, last)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


def _vjp_loss(out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``sum(out * grad)``: its gradients are the vector-Jacobian products the stage sends back."""
    return (out * grad).sum()


@dataclass
class _Program:
    loaded: LoadedModel
    inputs: list[str]  # program parameter names
    outputs: list[str]  # what each output is: "y", "dx", "loss" or a resident tensor's name
    costs: np.ndarray  # node costs, the send's from neuroncore.collectives
    sends: list[tuple[int, CollectiveRecord]]  # the send node and its timed template


@dataclass(frozen=True)
class Transfer:
    """One send between stages: an activation forward or its gradient back, timed on the topology."""

    micro_batch: int
    source: int  # stage
    target: int
    kind: Pass  # FORWARD: an activation; BACKWARD: its gradient
    size_bytes: int
    start_ns: float
    end_ns: float


class PipelineParallelTrainStep(TrainStep):
    """A ``Sequential`` trained in ``pp`` pipeline stages with the 1F1B schedule (see module doc)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: Sequence[torch.Tensor], *, pp: int, micro_batches: int,
                 loss_fn: Callable[..., Any], boundaries: Sequence[int] | None = None,
                 instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(model, torch.nn.Sequential):
            raise PlanError("pipeline parallelism cuts a torch.nn.Sequential into stages; "
                            f"got {type(model).__name__}")
        if not isinstance(pp, int) or isinstance(pp, bool) or pp < 2:
            raise PlanError(f"pp must be an integer of at least 2, not {pp!r}")
        if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
            raise PlanError(f"micro_batches must be a positive integer, not {micro_batches!r}")
        if loss_fn is None:
            raise PlanError("a pipeline step needs loss_fn (the last stage computes the loss)")
        if len(example_inputs) != 2:
            raise PlanError("a pipeline step takes (inputs, target): the first stage reads the "
                            "inputs, the last the target")
        cuts = list(boundaries) if boundaries is not None else [len(model) * s // pp for s in range(1, pp)]
        edges = [0, *cuts, len(model)]
        if len(cuts) != pp - 1 or any(a >= b for a, b in itertools.pairwise(edges)):
            raise PlanError(f"{pp} stages of {len(model)} modules need {pp - 1} increasing cut "
                            f"points inside (0, {len(model)}); got {cuts}")
        self.pp, self.micro_batches, self.edges = pp, micro_batches, edges
        super().__init__(model, optimizer, example_inputs, loss_fn=loss_fn, precision=Precision.FP32,
                         accumulation_steps=1, instance=instance, core=0, frames=_caller_frames())
        if pp > len(self.instance.cores):
            raise PlanError(f"pp={pp} does not fit {self.instance.name} ({len(self.instance.cores)} cores)")
        self.topology = instance_topology(self.instance.name, nodes=self.instance.nodes)
        x, target = example_inputs
        self.stage_modules = [_Stage(model, a, b) for a, b in itertools.pairwise(edges)]
        with torch.no_grad():  # each stage's example input: the previous stages' output
            acts = [x]
            for stage in self.stage_modules[:-1]:
                acts.append(stage(acts[-1]))
        self.stage_inputs = acts
        self.forward_programs: list[_Program | None] = []
        self.backward_programs: list[_Program] = []
        self.optimizer_programs: list[_Program] = []
        self.stage_params: list[list[int]] = []
        whole = self.state.tensors
        states = []
        for s, stage in enumerate(self.stage_modules):
            last = s == pp - 1
            scale = 1.0 / micro_batches
            if last:
                joint = joint_graph(stage, (acts[s], target), loss_fn=loss_fn, loss_scale=scale,
                                    input_grads=(0,))
            else:
                joint = joint_graph(stage, (acts[s], acts[s + 1]), loss_fn=_vjp_loss,
                                    input_grads=(0,) if s else ())
            names = [self._global(n) for n in joint.param_names]
            self.stage_params.append([self.param_names.index(n) for n in names])
            core = self.instance.core(s)
            fwd, bwd = self._stage_graphs(joint, s, names, last)
            self.forward_programs.append(None if fwd is None else self._load(fwd, core, s))
            self.backward_programs.append(self._load(bwd, core, s))
            self.optimizer_programs.append(self._load(self._optimizer_graph(s), core, s))
            mine = {f"param/{n}" for n in names} | {f"grad/{n}" for n in names}
            mine |= {name for i in self.stage_params[s] for name in self._state_names(i)}
            tensors = {k: v for k, v in whole.items() if k in mine}
            tensors.update({f"grad/{n}": np.zeros_like(whole[f"param/{n}"]) for n in names})
            states.append(DeviceState(core, tensors))
        self.stage_states = states
        self.transfers: list[Transfer] = []
        self._last_sends: list[CollectiveRecord] = []
        self.stage_results: list[list[ExecutionResult]] = [[] for _ in range(pp)]

    # -- trace time ----------------------------------------------------------------------------
    def _global(self, name: str) -> str:
        """A stage's parameter name (``model.layers.<i>.<rest>``) as the whole model names it."""
        inner = name[len("model."):] if name.startswith("model.") else name
        return inner[len("layers."):] if inner.startswith("layers.") else inner

    def _load(self, built: tuple[Graph, list[str]], core: Any, stage: int) -> _Program:
        graph, labels = built
        program = compile_graph(graph, self.core.spec)
        loaded = core.load(program)
        costs = program.cost_ns.copy()
        sends = []
        for node in program.collective_nodes:  # the stage's send: a permute to its peer's core
            op = program.graph.ops[int(program.op_index[node])]
            pair = [stage, int(op.attrs["pp_peer"])]
            record = cc.permute(self.topology, [pair], op.operands[0].size, op.dtype.value)
            costs[node] = record.duration_ns
            sends.append((int(node), record))
        return _Program(loaded, [p.name for p in graph.parameters], labels, costs, sends)

    def _lowered(self, joint: JointGraph, s: int, names: list[str]) -> tuple[_StepConverter, list[Op]]:
        load_handlers()
        inputs = [f"param/{n}" for n in names] + [f"input/{i}" for i in range(joint.n_inputs)]
        conv = _StepConverter(joint, f"{self.name}_stage{s}", None, inputs)
        return conv, conv.lower()

    def _stage_graphs(self, joint: JointGraph, s: int, names: list[str],
                      last: bool) -> tuple[tuple[Graph, list[str]] | None, tuple[Graph, list[str]]]:
        """The stage's forward graph (None for the last stage) and its backward (or forward + loss +
        backward) graph, each with what its outputs are; each its own lowering of the joint graph."""
        if joint.buffer_names:
            raise PlanError(f"stage {s} has buffers ({joint.buffer_names[0]}): pipeline stages "
                            f"carry parameters only")
        forward = None
        if not last:  # the stage's output: what _vjp_loss multiplied with the incoming gradient
            conv, _ = self._lowered(joint, s, names)
            y = _send(conv.b, conv.env[_vjp_output(joint)], "activation", s + 1)
            forward = (_live_graph(f"{self.name}_stage{s}_forward", conv.b, [y]), ["y"])
        conv, outs = self._lowered(joint, s, names)
        b = conv.b
        loss, grads = outs[0], outs[1:1 + len(names)]
        dx = outs[1 + len(names)] if len(outs) > 1 + len(names) else None
        results, labels = ([loss], ["loss"]) if last else ([], [])
        for n, grad in zip(names, grads):
            with b.located("model/backward/accumulate", ()):
                acc = b.parameter(f"grad/{n}", grad.shape, DType.FP32)
                results.append(b.add(acc, grad))
            labels.append(f"grad/{n}")
        if dx is not None and s:
            results.append(_send(b, dx, "gradient", s - 1))
            labels.append("dx")
        name = f"{self.name}_stage{s}_{'forward_backward' if last else 'backward'}"
        return forward, (_live_graph(name, b, results), labels)

    def _optimizer_graph(self, s: int) -> tuple[Graph, list[str]]:
        b = GraphBuilder(f"{self.name}_stage{s}_optimizer")
        outputs: list[Op] = []
        labels: list[str] = []
        for g, group in enumerate(self.groups):
            members = [i for i in group.params if i in self.stage_params[s]]
            if not members:
                continue
            with b.located("model/optimizer", self._frames):
                vector = b.parameter(f"scalars/{g}", (len(group.spec.scalar_names),), DType.FP32)
                scalars = split_scalars(b, group.spec, vector)
            for i in members:
                name = self.param_names[i]
                shape = tuple(self.params[i].shape)
                with b.located(f"model/optimizer/{self._module_of(i)}", self._frames):
                    param = b.parameter(f"param/{name}", shape, DType.FP32)
                    grad = b.parameter(f"grad/{name}", shape, DType.FP32)
                    state = [b.parameter(n, shape, DType.FP32) for n in self._state_names(i)]
                    new_param, new_state = emit_update(b, group.spec, param, grad, state, scalars)
                outputs += [new_param, *new_state]
                labels += [f"param/{name}", *self._state_names(i)]
        return _live_graph(b.name, b, outputs), labels

    # -- run time ------------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """One step over ``micro_batches`` micro-batches stacked along dim 0; returns the mean loss."""
        inputs = self.positional(inputs, named)
        m = self.micro_batches
        for given, shape in zip(inputs, self.example_shapes):
            if len(inputs) != 2 or tuple(given.shape) != (shape[0] * m, *shape[1:]):
                raise PlanError(f"{self.name} pipeline step: inputs of shapes "
                                f"{[[s[0] * m, *s[1:]] for s in self.example_shapes]} expected "
                                f"({m} micro-batches), got {[list(t.shape) for t in inputs]}")
        host_start = time.time_ns()
        self.steps += 1
        micro = [[_to_numpy(t[k * s[0]:(k + 1) * s[0]]) for t, s in zip(inputs, self.example_shapes)]
                 for k in range(m)]
        pp = self.pp
        orders = [one_f_one_b(s, pp, m) for s in range(pp)]
        cursor = [0] * pp
        # values and their arrival times on the receiving stage's core
        acts: dict[tuple[int, int], tuple[np.ndarray, float]] = {}  # (stage, k) -> its input
        grads: dict[tuple[int, int], tuple[np.ndarray, float]] = {}  # (stage, k) -> its output's grad
        for k in range(m):
            acts[(0, k)] = (micro[k][0], 0.0)
        self.transfers = []
        self.stage_results = [[] for _ in range(pp)]
        losses = [0.0] * m
        while any(cursor[s] < len(orders[s]) for s in range(pp)):
            progressed = False
            for s in range(pp):
                if cursor[s] >= len(orders[s]):
                    continue
                kind, k = orders[s][cursor[s]]
                last = s == pp - 1
                if (s, k) not in acts or (kind is Pass.BACKWARD and not last and (s, k) not in grads):
                    continue
                if kind is Pass.FORWARD and last:  # forward + loss + backward, at once
                    x, ready = acts[(s, k)]
                    out, end = self._run(s, self.backward_programs[s], {"input/0": x, "input/1": micro[k][1]},
                                         ready, host_start)
                    losses[k] = float(np.asarray(out["loss"]).reshape(-1)[0])
                    self._send(s, s - 1, k, Pass.BACKWARD, out["dx"], end, grads)
                elif kind is Pass.FORWARD:
                    x, ready = acts[(s, k)]
                    program = self.forward_programs[s]
                    assert program is not None
                    out, end = self._run(s, program, {"input/0": x}, ready, host_start)
                    self._send(s, s + 1, k, Pass.FORWARD, out["y"], end, acts)
                elif not last:
                    x, _ = acts[(s, k)]
                    dy, ready = grads[(s, k)]
                    out, end = self._run(s, self.backward_programs[s], {"input/0": x, "input/1": dy},
                                         ready, host_start)
                    if s:
                        self._send(s, s - 1, k, Pass.BACKWARD, out["dx"], end, grads)
                cursor[s] += 1
                progressed = True
            if not progressed:
                raise PlanError(f"{self.name}: the 1F1B schedule stalled (a stage waits for a "
                                f"micro-batch no stage produces)")
        for s in range(pp):
            scalars = {f"scalars/{g}": host_scalars(group.spec, float(group.torch_group["lr"]), self.steps)
                       for g, group in enumerate(self.groups)}
            self._run(s, self.optimizer_programs[s], scalars, 0.0, host_start)
            self.stage_states[s].zero([n for n in self.stage_states[s].tensors if n.startswith("grad/")])
        self.last_results = [r for results in self.stage_results for r in results]
        self._sync_host()
        return torch.tensor(sum(losses), dtype=torch.float32)

    def _run(self, s: int, program: _Program, host: dict[str, np.ndarray], ready_ns: float,
             host_start_ns: int) -> tuple[dict[str, np.ndarray], float]:
        """Execute ``program`` on stage ``s``'s core from when its input is there; its outputs by
        label (resident ones stored) and its end time."""
        state = self.stage_states[s]
        loaded = program.loaded
        arrays = bind_inputs(loaded.program.graph, state.inputs(program.inputs, host))
        outputs = loaded.compute(arrays, _sent)
        by_label = dict(zip(program.outputs, outputs))
        state.update({k: v for k, v in by_label.items() if k in state.tensors})
        core = loaded.core
        with core.lock:
            t0 = max(core.clock_ns, int(np.ceil(ready_ns)))
            timeline = schedule(loaded.program, float(t0), program.costs)
            placed = [(node, tpl.shifted(float(timeline.start_ns[node]) - tpl.start_ns))
                      for node, tpl in program.sends]
            result = loaded.record(t0, timeline, outputs, False, placed, host_start_ns=host_start_ns)
        self.stage_results[s].append(result)
        self._last_sends = [record for _, record in placed]
        return by_label, float(result.end_ns)

    def _send(self, source: int, target: int, k: int, kind: Pass, value: np.ndarray, sent_ns: float,
              into: dict[tuple[int, int], tuple[np.ndarray, float]]) -> None:
        """Hand ``value`` to stage ``target``: it arrives when the sending program's collective-permute
        (its last node, timed on the topology) has ended."""
        (record,) = self._last_sends
        self.transfers.append(Transfer(k, source, target, kind, int(value.size) * 4,
                                       float(record.start_ns), float(record.end_ns)))
        into[(target, k)] = (value, max(sent_ns, float(record.end_ns)))

    def _sync_host(self) -> None:
        if not hasattr(self, "stage_states"):
            return
        for state in self.stage_states:
            self.state.update({k: v for k, v in state.tensors.items() if k in self.state.tensors})
        super()._sync_host()

    @property
    def bubble_fraction(self) -> float:
        """The 1F1B bubble of the schedule, ``(pp - 1) / (micro_batches + pp - 1)`` of the step."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)


def _send(b: GraphBuilder, value: Op, kind: str, peer: int) -> Op:
    """A stage's send to stage ``peer``: a collective-permute (group ``pp``) whose result is what the
    peer receives, under ``model/pipeline/send_<kind>``."""
    with b.located(f"model/pipeline/send_{kind}", ()):
        return b.add_op("collective-permute", [value], value.shape, value.dtype, group="pp",
                        pp_kind=kind, pp_role="send", pp_peer=peer, name=f"collective-permute.{b.n_ops}")


def _live_graph(name: str, b: GraphBuilder, outputs: list[Op]) -> Graph:
    """The graph of what ``outputs`` need, with only the inputs they read (a builder's ops are
    copied by reference, so the two graphs of one stage come from two lowerings)."""
    live: set[int] = set()
    stack = list(outputs)
    while stack:
        op = stack.pop()
        if id(op) not in live:
            live.add(id(op))
            stack.extend(op.operands)
    graph = b.build(outputs)
    ops = [op for op in graph.ops if id(op) in live]
    for index, op in enumerate(ops):
        op.index = index
    return Graph(name, ops, [p for p in graph.parameters if id(p) in live], list(outputs))


def _sent(op: Op, value: np.ndarray) -> np.ndarray:
    """A send's numerics on the sending core: the value leaves as it is (the receiving stage's
    program reads it as its input)."""
    return value


def _vjp_output(joint: JointGraph) -> Any:
    """The FX node of the stage's output in a joint graph traced with :func:`_vjp_loss`: the operand
    of the forward multiply that reads the incoming-gradient placeholder."""
    placeholders = [n for n in joint.module.graph.nodes if n.op == "placeholder"]
    grad_in = placeholders[-1]
    for node in grad_in.users:
        if node.op == "call_function" and node.meta.get("train_phase") == "forward":
            others = [a for a in node.args if isinstance(a, torch.fx.Node) and a is not grad_in]
            if others:
                return others[0]
    raise TraceError("could not find the stage's output in its joint graph")


__all__ = ["Pass", "PipelineParallelTrainStep", "Transfer", "one_f_one_b"]
