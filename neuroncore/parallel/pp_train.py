"""Pipeline-parallel training with real numerics: a model cut into ``pp`` stages by its layers
(a ``torch.nn.Sequential``'s modules, a transformers decoder's layers), one per core, micro-batches
run in the 1F1B schedule, activations and their gradients sent between the stages' cores.

    step = PipelineParallelTrainStep(model, optimizer, (ids, mask, labels), pp=2, micro_batches=4)
    loss = step(ids, mask, labels)   # micro_batches x the traced micro-batch along dim 0; the mean loss

The loss is exported once and its graph cut by layer names, as NxD's pipeline does
(:mod:`neuroncore.parallel.pp_partition`: the embedding on the first stage, the final norm, LM head
and loss on the last, the attention mask and position embeddings passed along with the hidden
states). Each stage's programs come from torch's autograd like a single-core step
(:func:`neuroncore.training.torch_joint.stage_joint_graph`), its part of the graph replayed with the
gradients of what it receives as extra outputs:

* stage ``s < pp-1``: a **forward** program (what it receives -> what it sends to stage s+1) and
  a **backward** program (the same inputs and the gradients received from stage s+1 -> the
  parameters' gradients, added to resident gradient buffers, and the gradients of what it
  received, sent to stage s-1). The backward recomputes the stage's forward from its inputs: the
  stage keeps only its micro-batches' inputs between the passes (full activation checkpointing per
  stage);
* the last stage: one **forward + loss + backward** program per micro-batch (1F1B runs them back to
  back there), its loss scaled by 1/micro_batches as ``(loss / M).backward()`` does;
* every stage: an **optimizer** program over its parameters and resident state (the traced step's own
  update code, :func:`neuroncore.training.optimizers.emit_update`), after its last backward.

The order is 1F1B (Narayanan et al. 2021; Megatron-LM, NxD): stage s runs ``pp - s - 1`` warm-up
forwards, then alternates one forward and one backward, then drains the backwards. Each stage's
gradients accumulate over the micro-batches in micro-batch order, as single-core gradient
accumulation does, so the step equals one core trained on the same micro-batches.

Sends: a stage's forward program ends with one ``collective-permute`` per value it sends to the
next stage, its backward program with one per gradient it sends to the previous stage (group ``pp``,
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
from neuroncore.frontends.torch_random import RNG_STATE_INPUT
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Graph, Op
from neuroncore.ir.philox import STATE_LIMIT
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.pipeline import Pass, one_f_one_b
from neuroncore.parallel.pp_partition import Stage, layer_list, partition
from neuroncore.parallel.training import PlanError
from neuroncore.runtime.device import DeviceState, ExecutionResult, LoadedModel, stochastic_rounding_wanted
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.optimizers import emit_update, host_scalars, split_scalars
from neuroncore.training.precision import Precision, parse_precision
from neuroncore.training.torch_joint import JointGraph, export_loss, stage_joint_graph
from neuroncore.training.torch_step import (
    StepInputs,
    TrainStep,
    _caller_frames,
    _StepConverter,
    _strip,
    keyword_inputs,
)


@dataclass
class _Program:
    loaded: LoadedModel
    inputs: list[str]  # program parameter names
    outputs: list[str]  # what each output is: "send/<i>", "dx/<i>", "loss" or a resident tensor's name
    costs: np.ndarray  # node costs, the sends' from neuroncore.collectives
    sends: list[tuple[int, CollectiveRecord, str]]  # each send node, its timed template, its output


@dataclass(frozen=True)
class Transfer:
    """One send between stages: an activation (or a mask, position embeddings ... a later stage
    reads) forward, or its gradient back, timed on the topology."""

    micro_batch: int
    source: int  # stage
    target: int
    kind: Pass  # FORWARD: an activation; BACKWARD: its gradient
    size_bytes: int
    start_ns: float
    end_ns: float
    value: str = ""  # the name of the value in the exported loss graph


@dataclass
class _Arrival:
    """Values one stage's execution receives, and when the last of them has arrived."""

    values: list[np.ndarray]
    ready_ns: float


class PipelineParallelTrainStep(TrainStep):
    """A model trained in ``pp`` pipeline stages with the 1F1B schedule (see module doc)."""

    compiles_step_program = False  # the stages' programs are the step

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: StepInputs, *, pp: int, micro_batches: int,
                 loss_fn: Callable[..., Any] | None = None, boundaries: Sequence[int] | None = None,
                 layers: str | None = None, precision: str | Precision = "fp32",
                 instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(pp, int) or isinstance(pp, bool) or pp < 2:
            raise PlanError(f"pp must be an integer of at least 2, not {pp!r}")
        if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
            raise PlanError(f"micro_batches must be a positive integer, not {micro_batches!r}")
        try:
            prec = parse_precision(precision)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        layer_name, count = layer_list(model, layers)
        modules = isinstance(model, torch.nn.Sequential) and layers is None
        what = f"{count} {'modules' if modules else 'layers'}"
        cuts = list(boundaries) if boundaries is not None else [count * s // pp for s in range(1, pp)]
        edges = [0, *cuts, count]
        if len(cuts) != pp - 1 or any(a >= b for a, b in itertools.pairwise(edges)):
            raise PlanError(f"{pp} stages of {what} need {pp - 1} increasing cut points inside "
                            f"(0, {count}); got {cuts}")
        self.pp, self.micro_batches, self.edges, self.layers = pp, micro_batches, edges, layer_name
        super().__init__(model, optimizer, example_inputs, loss_fn=loss_fn, precision=prec,
                         accumulation_steps=1, instance=instance, core=0, frames=_caller_frames())
        if pp > len(self.instance.cores):
            raise PlanError(f"pp={pp} does not fit {self.instance.name} ({len(self.instance.cores)} cores)")
        self.topology = instance_topology(self.instance.name, nodes=self.instance.nodes)
        examples = list(keyword_inputs(example_inputs)[1])
        wrapper, ep, alias = export_loss(model, examples, loss_fn=loss_fn, loss_scale=1.0 / micro_batches,
                                         input_keys=self.input_keys)
        self.stages = partition(ep, alias, layers=layer_name, edges=edges)
        named = dict(wrapper.named_parameters())
        tables = {**ep.state_dict, **ep.constants}
        values: dict[str, torch.Tensor] = {}  # each sent value's example, to trace the next stage
        self.forward_programs: list[_Program | None] = []
        self.backward_programs: list[_Program] = []
        self.optimizer_programs: list[_Program] = []
        self.stage_params: list[list[int]] = []
        whole = self.state.tensors
        states = []
        for stage in self.stages:
            s, last = stage.index, stage.index == pp - 1
            params = [(n, named[n]) for n in stage.params]
            buffers = [(n, tables[n]) for n in stage.buffers]
            inputs = [examples[j] if kind == "input" else values[j] for kind, j in stage.inputs]
            if not last:
                with torch.no_grad():
                    outs = torch.fx.Interpreter(stage.module).run(
                        *[p for _, p in params], *[b for _, b in buffers], *inputs)
                values.update(zip(stage.sends, outs))
            input_grads = [i for i, (kind, j) in enumerate(stage.inputs)
                           if kind == "recv" and j in stage.needs_grad]
            output_grads = None if last else [i for i, n in enumerate(stage.sends) if n in stage.needs_grad]
            joint = stage_joint_graph(f"{self.name} stage {s}", stage.module, params, buffers, inputs,
                                      input_grads=input_grads, output_grads=output_grads)
            names = [_strip(n) for n in stage.params]
            self.stage_params.append([self.param_names.index(n) for n in names])
            received = {j: i for i, j in enumerate(stage.received)}
            feeds = [f"input/{j}" if kind == "input" else f"recv/{received[j]}" for kind, j in stage.inputs]
            feeds += [f"grad_out/{i}" for i in range(len(output_grads or ()))]
            program_inputs = ([f"param/{n}" for n in names] + [f"buffer/{_strip(n)}" for n in stage.buffers]
                              + feeds)
            core = self.instance.core(s)
            fwd, bwd = self._stage_graphs(joint, stage, program_inputs, names, len(input_grads))
            self.forward_programs.append(None if fwd is None else self._load(fwd, core, s))
            self.backward_programs.append(self._load(bwd, core, s))
            self.optimizer_programs.append(self._load(self._optimizer_graph(s), core, s))
            mine = {f"param/{n}" for n in names} | {f"buffer/{_strip(n)}" for n in stage.buffers}
            mine |= {name for i in self.stage_params[s] for name in self._state_names(i)}
            tensors = {k: v for k, v in whole.items() if k in mine}
            for name in stage.buffers:
                tensors.setdefault(f"buffer/{_strip(name)}", _to_numpy(tables[name]))
            tensors.update({f"grad/{n}": np.zeros(whole[f"param/{n}"].shape, np.float32) for n in names})
            states.append(DeviceState(core, tensors))
        self.stage_states = states
        self.transfers: list[Transfer] = []
        self.received: dict[tuple[Pass, int, int], list[np.ndarray]] = {}
        self._last_sends: dict[str, CollectiveRecord] = {}
        self.stage_results: list[list[ExecutionResult]] = [[] for _ in range(pp)]

    # -- trace time ----------------------------------------------------------------------------
    def _load(self, built: tuple[Graph, list[str]], core: Any, stage: int) -> _Program:
        graph, labels = built
        program = compile_graph(graph, self.core.spec)
        loaded = core.load(program)
        loaded.stochastic_rounding = stochastic_rounding_wanted(self.precision is Precision.BF16_SR)
        costs = program.cost_ns.copy()
        sends = []
        output_label = {out.name: label for out, label in zip(program.graph.outputs, labels)}
        for node in program.collective_nodes:  # the stage's sends: permutes to its peer's core
            op = program.graph.ops[int(program.op_index[node])]
            pair = [stage, int(op.attrs["pp_peer"])]
            record = cc.permute(self.topology, [pair], op.operands[0].size, op.dtype.value)
            costs[node] = record.duration_ns
            sends.append((int(node), record, output_label[op.name]))
        return _Program(loaded, [p.name for p in graph.parameters], labels, costs, sends)

    def _lowered(self, joint: JointGraph, s: int, inputs: list[str]) -> tuple[_StepConverter, list[Op]]:
        load_handlers()
        autocast = "bf16" if self.precision is not Precision.FP32 else None
        conv = _StepConverter(joint, f"{self.name}_stage{s}", autocast, inputs)
        conv.bf16_params = self._params_in_bf16()
        return conv, conv.lower()

    def _stage_graphs(self, joint: JointGraph, stage: Stage, inputs: list[str], names: list[str],
                      n_dx: int) -> tuple[tuple[Graph, list[str]] | None, tuple[Graph, list[str]]]:
        """The stage's forward graph (None for the last stage) and its backward (or forward + loss +
        backward) graph, each with what its outputs are; each its own lowering of the joint graph."""
        s, last = stage.index, stage.index == self.pp - 1
        forward = None
        if not last:  # the forward's outputs, the joint graph's last ones
            conv, outs = self._lowered(joint, s, inputs)
            sent = outs[len(outs) - len(stage.sends):]
            ys = [_send(conv.b, y, "activation", s + 1) for y in sent]
            forward = (_live_graph(f"{self.name}_stage{s}_forward", conv.b, ys),
                       [f"send/{i}" for i in range(len(ys))])
        conv, outs = self._lowered(joint, s, inputs)
        b = conv.b
        loss, grads = outs[0], outs[1:1 + len(names)]
        dxs = outs[1 + len(names):1 + len(names) + n_dx]
        results, labels = ([loss], ["loss"]) if last else ([], [])
        for n, grad in zip(names, grads):
            with b.located(f"model/backward/accumulate/{self._module_of(self.param_names.index(n))}",
                           self._frames):
                acc = b.parameter(f"grad/{n}", grad.shape, DType.FP32)
                results.append(b.add(acc, grad if grad.dtype is DType.FP32 else b.convert(grad, DType.FP32)))
            labels.append(f"grad/{n}")
        for i, dx in enumerate(dxs):
            results.append(_send(b, dx, "gradient", s - 1))
            labels.append(f"dx/{i}")
        name = f"{self.name}_stage{s}_{'forward_backward' if last else 'backward'}"
        return forward, (_live_graph(name, b, results), labels)

    def _optimizer_graph(self, s: int) -> tuple[Graph, list[str]]:
        b = GraphBuilder(f"{self.name}_stage{s}_optimizer")
        outputs: list[Op] = []
        labels: list[str] = []
        held = self._params_in_bf16()
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
                    param = b.parameter(f"param/{name}", shape, DType.BF16 if held else DType.FP32)
                    if held:
                        param = b.convert(param, DType.FP32)
                    grad = b.parameter(f"grad/{name}", shape, DType.FP32)
                    state = [b.parameter(n, shape, DType.FP32) for n in self._state_names(i)]
                    new_param, new_state = emit_update(b, group.spec, param, grad, state, scalars)
                    if held:  # stored back in bf16: rounded stochastically
                        new_param = b.convert(new_param, DType.BF16)
                outputs += [new_param, *new_state]
                labels += [f"param/{name}", *self._state_names(i)]
        return _live_graph(b.name, b, outputs), labels

    # -- run time ------------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """One step over ``micro_batches`` micro-batches stacked along dim 0; returns the mean loss."""
        inputs = self.positional(inputs, named)
        m = self.micro_batches
        if len(inputs) != len(self.example_shapes) or any(
                tuple(given.shape) != (shape[0] * m, *shape[1:])
                for given, shape in zip(inputs, self.example_shapes)):
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
        acts: dict[tuple[int, int], _Arrival] = {(0, k): _Arrival([], 0.0) for k in range(m)}
        grads: dict[tuple[int, int], _Arrival] = {}  # (stage, k) -> its outputs' gradients
        self.transfers = []
        self.received = {}
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
                arrived = acts[(s, k)]
                host = self._feeds(s, k, micro[k], arrived.values)
                if kind is Pass.FORWARD and last:  # forward + loss + backward, at once
                    out, end = self._run(s, self.backward_programs[s], host, arrived.ready_ns, host_start)
                    losses[k] = float(np.asarray(out["loss"]).reshape(-1)[0])
                    self._send(s, s - 1, k, Pass.BACKWARD, _labelled(out, "dx"), end, grads)
                elif kind is Pass.FORWARD:
                    program = self.forward_programs[s]
                    assert program is not None
                    out, end = self._run(s, program, host, arrived.ready_ns, host_start)
                    self._send(s, s + 1, k, Pass.FORWARD, _labelled(out, "send"), end, acts)
                elif not last:
                    back = grads[(s, k)]
                    host.update({f"grad_out/{i}": v for i, v in enumerate(back.values)})
                    out, end = self._run(s, self.backward_programs[s], host,
                                         max(arrived.ready_ns, back.ready_ns), host_start)
                    if s:
                        self._send(s, s - 1, k, Pass.BACKWARD, _labelled(out, "dx"), end, grads)
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

    def _feeds(self, s: int, k: int, batch: list[np.ndarray],
               received: list[np.ndarray]) -> dict[str, np.ndarray]:
        """What the host hands stage ``s``'s programs for micro-batch ``k``: the step inputs the stage
        reads, what it received, and its random state (one stream per stage and micro-batch, the
        same for the forward and the backward that recomputes it, so both draw the same masks)."""
        host = {f"input/{j}": batch[j] for j in self.stages[s].user_inputs}
        host.update({f"recv/{i}": v for i, v in enumerate(received)})
        seed = (self.rng_seed + s) % STATE_LIMIT
        offset = ((self.steps - 1) * self.micro_batches + k) % STATE_LIMIT
        host[RNG_STATE_INPUT] = np.array([seed, offset], np.float32)
        return host

    def _run(self, s: int, program: _Program, host: dict[str, np.ndarray], ready_ns: float,
             host_start_ns: int) -> tuple[dict[str, np.ndarray], float]:
        """Execute ``program`` on stage ``s``'s core from when its input is there; its outputs by
        label (resident ones stored) and its end time."""
        state = self.stage_states[s]
        loaded = program.loaded
        feeds = {k: v for k, v in host.items() if k in program.inputs}
        arrays = bind_inputs(loaded.program.graph, state.inputs(program.inputs, feeds))
        outputs = loaded.compute(arrays, _sent)
        by_label = dict(zip(program.outputs, outputs))
        state.update({k: v for k, v in by_label.items() if k in state.tensors})
        core = loaded.core
        with core.lock:
            t0 = max(core.clock_ns, int(np.ceil(ready_ns)))
            timeline = schedule(loaded.program, float(t0), program.costs)
            placed = [(node, tpl.shifted(float(timeline.start_ns[node]) - tpl.start_ns))
                      for node, tpl, _ in program.sends]
            result = loaded.record(t0, timeline, outputs, False, placed, host_start_ns=host_start_ns)
        self.stage_results[s].append(result)
        self._last_sends = {label: record for (_, _, label), (_, record) in zip(program.sends, placed)}
        return by_label, float(result.end_ns)

    def _send(self, source: int, target: int, k: int, kind: Pass, values: list[tuple[str, np.ndarray]],
              sent_ns: float, into: dict[tuple[int, int], _Arrival]) -> None:
        """Hand ``values`` to stage ``target``: they arrive when the sending program's
        collective-permutes (timed on the topology) have ended."""
        ready = sent_ns
        names = self.stages[source].sends if kind is Pass.FORWARD else \
            [n for n in self.stages[source].received if n in self.stages[source].needs_grad]
        for (label, _), name in zip(values, names):
            record = self._last_sends[label]
            self.transfers.append(Transfer(k, source, target, kind, int(record.input_bytes),
                                           float(record.start_ns), float(record.end_ns), name))
            ready = max(ready, float(record.end_ns))
        arrays = [v for _, v in values]
        self.received[(kind, target, k)] = arrays
        into[(target, k)] = _Arrival(arrays, ready)

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


def _labelled(out: dict[str, np.ndarray], kind: str) -> list[tuple[str, np.ndarray]]:
    """The outputs labelled ``<kind>/<i>``, in order."""
    picked = [(label, v) for label, v in out.items() if label.startswith(kind + "/")]
    return sorted(picked, key=lambda item: int(item[0].rpartition("/")[2]))


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


__all__ = ["Pass", "PipelineParallelTrainStep", "Transfer", "one_f_one_b"]
