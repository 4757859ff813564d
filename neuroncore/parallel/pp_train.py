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

With ``tp > 1`` every stage is split over its own ``tp`` cores by the tensor-parallel sharding pass
(:mod:`neuroncore.parallel.sharding`, as :class:`~neuroncore.parallel.tp_train.TensorParallelTrainStep`
splits a whole step): the stage's ranks run in threads and meet in its all-reduces; each rank sends to
the same rank of the neighbouring stage: the whole value, or its block of a value the stage leaves
split (GPT-2's hidden-split residual; the sequence-split hidden states with ``sequence_parallel``),
which the next stage reads split from the start and whose gradient it sends back split alike
(``sent_splits``); the optimizer program runs on each rank's blocks.

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
from dataclasses import dataclass, field
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
from neuroncore.parallel.group import CC_OPERATIONS, _Rendezvous
from neuroncore.parallel.held_cores import cores_held, placed_at
from neuroncore.parallel.pipeline import Pass, one_f_one_b
from neuroncore.parallel.pp_partition import Stage, layer_list, partition
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.sharding import ShardingError, Split, join_blocks, rank_block, shard
from neuroncore.parallel.training import PlanError
from neuroncore.runtime.device import DeviceState, ExecutionResult, LoadedModel, stochastic_rounding_wanted
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.optimizers import emit_update, host_scalars, split_scalars
from neuroncore.training.precision import Precision, parse_precision
from neuroncore.training.step_records import emit_step, forward_matmul_flops
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
    loaded: LoadedModel  # tensor-parallel rank 0's copy
    inputs: list[str]  # program parameter names
    outputs: list[str]  # what each output is: "send/<i>", "dx/<i>", "loss" or a resident tensor's name
    costs: np.ndarray  # node costs, the collectives' from neuroncore.collectives
    sends: list[tuple[int, CollectiveRecord, str]]  # each send node, its timed template, its output
    ranks: list[LoadedModel] = field(default_factory=list)  # every tensor-parallel rank's copy
    collectives: list[tuple[int, CollectiveRecord]] = field(default_factory=list)  # tp all-reduces ...
    input_splits: dict[str, Split | None] = field(default_factory=dict)  # how each input is split
    output_splits: dict[str, Split | None] = field(default_factory=dict)
    rank_inputs: list[Callable[[int], np.ndarray]] = field(default_factory=list)


@dataclass
class _Sharded:
    """A stage program as one rank runs it (split over the stage's cores at ``tp > 1``)."""

    graph: Graph  # the rank's graph (the whole one at tp 1)
    labels: list[str]  # what each output is
    input_splits: dict[str, Split | None]  # by the whole graph's parameter names
    output_splits: dict[str, Split | None]  # by label
    rank_inputs: list[Callable[[int], np.ndarray]]
    names: list[str]  # the inputs the host and the state feed, in order (rank inputs follow them)


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
                 layers: str | None = None, precision: str | Precision = "fp32", tp: int = 1,
                 sequence_parallel: bool = False, instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(pp, int) or isinstance(pp, bool) or pp < 2:
            raise PlanError(f"pp must be an integer of at least 2, not {pp!r}")
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise PlanError(f"tp must be a positive integer, not {tp!r}")
        self.tp = tp
        self.sequence_parallel = bool(sequence_parallel) and tp > 1
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
        if pp * tp > len(self.instance.cores):
            raise PlanError(f"pp={pp} x tp={tp} does not fit {self.instance.name} "
                            f"({len(self.instance.cores)} cores)")
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
        self.stage_splits: list[dict[str, Split | None]] = []  # each resident tensor's split
        # how each value crossing into stage t travels, by (t, its name): as the sender's program
        # makes it (its rank's block when split); the receiver reads it, and sends its gradient back,
        # split alike
        self.sent_splits: dict[tuple[int, str], Split | None] = {}
        whole = self.state.tensors
        self.forward_flops = 0.0
        states: list[list[DeviceState]] = []  # per stage, per tensor-parallel rank
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
            fwd, bwd = self._stage_graphs(joint, stage, program_inputs, names, len(input_grads))
            # a micro-batch's forward matmuls: every stage's backward program recomputes its forward
            self.forward_flops += forward_matmul_flops(bwd[0])
            arriving = {f"recv/{i}": self.sent_splits.get((s, n)) for i, n in enumerate(stage.received)}
            # a weight an earlier stage holds too (tied: GPT-2's LM head is its token embedding) is
            # split as that stage splits it, so that every holder's block is the same rows
            arriving.update({f"param/{n}": self.backward_programs[t].input_splits.get(f"param/{n}")
                             for n in names for t in range(s) if n in self._stage_names(t)})
            fsplit = None if fwd is None else self._split(fwd, s, arriving=arriving)
            sent = {} if fsplit is None else {n: fsplit.output_splits.get(f"send/{i}")
                                              for i, n in enumerate(stage.sends)}
            # the gradients of what it sent arrive split like those values; the gradients of what it
            # received leave split as the previous stage sent them
            back_arriving = {**arriving, **{f"grad_out/{i}": sent[stage.sends[o]]
                                            for i, o in enumerate(output_grads or ())}}
            leaving = {f"dx/{k}": self.sent_splits.get((s, stage.inputs[i][1]))
                       for k, i in enumerate(input_grads)}
            read = {} if fsplit is None else {k: v for k, v in fsplit.input_splits.items()
                                              if k.startswith("param/")}
            bsplit = self._split(bwd, s, arriving=back_arriving, leaving=leaving, weights=read)
            if fwd is not None and fsplit is not None and _weights_differ(fsplit, bsplit):
                # the forward reads the resident weights as the backward keeps them (its sends
                # leaving as before, so the backward's gradients still match them)
                kept = {k: v for k, v in bsplit.input_splits.items()
                        if k.startswith("param/") and v is not None}
                fsplit = self._split(fwd, s, arriving={**arriving, **kept},
                                     leaving={f"send/{i}": sent[n] for i, n in enumerate(stage.sends)})
            self.sent_splits.update({(s + 1, n): split for n, split in sent.items()})
            self.forward_programs.append(None if fsplit is None else self._load(fsplit, s))
            backward = self._load(bsplit, s)
            self.backward_programs.append(backward)
            # a weight's optimizer state and update are split as the backward splits it (as the
            # forward does, for a weight only the forward reads: a bias)
            splits = {f"param/{n}": backward.input_splits.get(f"param/{n}", read.get(f"param/{n}"))
                      for n in names}
            built, blocks = self._optimizer_graph(s, splits)
            self.optimizer_programs.append(self._load(built, s, blocks=blocks))
            mine = {f"param/{n}" for n in names} | {f"buffer/{_strip(n)}" for n in stage.buffers}
            mine |= {name for i in self.stage_params[s] for name in self._state_names(i)}
            tensors = {k: v for k, v in whole.items() if k in mine}
            for name in stage.buffers:
                tensors.setdefault(f"buffer/{_strip(name)}", _to_numpy(tables[name]))
            tensors.update({f"grad/{n}": np.zeros(whole[f"param/{n}"].shape, np.float32) for n in names})
            # kept as the backward reads them; the optimizer cuts a gradient the backward sums whole
            layout = {**self.optimizer_programs[-1].input_splits, **backward.input_splits}
            self.stage_splits.append({k: layout.get(k) for k in tensors})
            states.append([DeviceState(self.instance.core(s * tp + r),
                                       {k: rank_block(v, self.stage_splits[s][k], tp, r)
                                        for k, v in tensors.items()}) for r in range(tp)])
        self.stage_states = states
        self._tie_weights()
        self.transfers: list[Transfer] = []
        self.received: dict[tuple[Pass, int, int], list[np.ndarray]] = {}
        self._last_sends: dict[str, CollectiveRecord] = {}
        self.stage_results: list[list[ExecutionResult]] = [[] for _ in range(pp)]  # tp rank 0's
        self.rank_results: list[ExecutionResult] = []  # the other tensor-parallel ranks'

    # -- trace time ----------------------------------------------------------------------------
    def _stage_names(self, s: int) -> list[str]:
        """The parameters stage ``s`` holds, by their names."""
        return [self.param_names[i] for i in self.stage_params[s]]

    def _tie_weights(self) -> None:
        """A weight several stages read (GPT-2's LM head is its token embedding) is held by each of
        them, as Megatron's first and last stages both hold the word embeddings: after the last
        backward, the holders all-reduce its gradient (Megatron's embedding group) and each runs the
        same update on the summed gradient, so the copies stay equal."""
        holders: dict[int, list[int]] = {}
        for s, params in enumerate(self.stage_params):
            for i in params:
                holders.setdefault(i, []).append(s)
        tied = {i: h for i, h in holders.items() if len(h) > 1}
        self.tied_stages: list[int] = []
        self.tied_programs: dict[int, _Program] = {}
        if not tied:
            return
        groups = {tuple(h) for h in tied.values()}
        if len(groups) > 1:
            name = self.param_names[next(iter(tied))]
            raise PlanError(f"{self.name}: parameter {name} is used by stages {tied[next(iter(tied))]} "
                            f"(tied weights); tied weights are shared between pipeline stages only "
                            f"by one group of stages: untie them (tie_word_embeddings=False)")
        (group,) = groups
        self.tied_stages = list(group)
        self.tied_blocks: dict[str, Split | None] = {}
        tp = self.tp
        blocks: dict[int, Split | None] = {}  # the block of the tied gradient every rank all-reduces
        for i in tied:
            # a holder may keep the gradient whole (the vocabulary-split table's, summed whole by
            # its backward): its rank r all-reduces block r of it, as the optimizer reads it
            kept = {self.stage_splits[s].get(f"grad/{self.param_names[i]}") for s in group} - {None}
            if len(kept) > 1:
                raise PlanError(f"{self.name}: tied weight {self.param_names[i]}'s gradient is kept split "
                                f"as {' and '.join(sorted(map(str, kept)))} by stages {list(group)} at "
                                f"tp={tp}; tied weights are shared only where every holder splits them "
                                f"alike: untie them (tie_word_embeddings=False)")
            blocks[i] = kept.pop() if kept else None
        # rank r of each holder all-reduces its block with rank r of the others (its block is theirs)
        peers = [[t * tp + r for t in group] for r in range(tp)]
        for s in group:
            b = GraphBuilder(f"{self.name}_stage{s}_tied_gradients")
            outputs: list[Op] = []
            labels: list[str] = []
            for k, i in enumerate(sorted(tied)):
                name = self.param_names[i]
                with b.located(f"model/gradient_sync/tied/{self._module_of(i)}", self._frames):
                    shape = _block_shape(tuple(self.params[i].shape), blocks[i], tp)
                    grad = b.parameter(f"grad/{name}", shape, DType.FP32)
                    outputs.append(b.add_op("all-reduce", [grad], grad.shape, DType.FP32, reduction="sum",
                                            name=f"all-reduce.tied.{k}"))
                labels.append(f"grad/{name}")
                self.tied_blocks[f"grad/{name}"] = blocks[i]
            self.tied_programs[s] = self._load((_live_graph(b.name, b, outputs), labels), s, blocks={},
                                               groups=peers)

    def _split(self, built: tuple[Graph, list[str]], stage: int, *,
               arriving: dict[str, Split | None] | None = None,
               leaving: dict[str, Split | None] | None = None,
               weights: dict[str, Split | None] | None = None) -> _Sharded:
        """A stage's program split over the stage's ``tp`` cores by the tensor-parallel sharding pass
        (trained weights told apart), as :class:`~neuroncore.parallel.tp_train.TensorParallelTrainStep`
        splits a whole step. ``arriving``: how inputs come in split (received values and gradients,
        each rank holding its block; weights split as another program of the stage reads them);
        ``leaving``: how the gradients it sends back must leave (as the previous stage sent their
        values: converted before the send where the program makes them otherwise); ``weights``:
        how the stage keeps the weights this program does not read (its forward's split)."""
        graph, labels = built
        names = [p.name for p in graph.parameters]
        if self.tp == 1:
            return _Sharded(graph, labels, {}, {}, [], names)
        trained = frozenset(n for n in names if n.startswith("param/"))
        presplit: dict[str, Split | None] = {k: v for k, v in (arriving or {}).items()
                                             if v is not None and k in names}
        wanted = {labels.index(k): v for k, v in (leaving or {}).items() if k in labels}
        try:
            while True:
                sharded = shard(graph, self.tp, trained=trained, sequence_parallel=self.sequence_parallel,
                                input_splits=presplit, output_splits=wanted)
                # a gradient buffer is kept split like its weight (the optimizer reads both alike):
                # one that came out split otherwise (an embedding's gradient made from a hidden-split
                # gradient) is split (or kept whole) like the weight from the start, and converted
                # where it is added
                clash = _gradient_clashes({**(weights or {}), **dict(zip(names, sharded.input_splits))},
                                          names)
                if not clash or any(k in presplit for k in clash):
                    break
                presplit.update(clash)
        except ShardingError as exc:
            raise PlanError(f"{self.name} stage {stage}: {exc}") from None
        return _Sharded(sharded.local, labels, dict(zip(names, sharded.input_splits)),
                        dict(zip(labels, sharded.output_splits)), list(sharded.rank_inputs), names)

    def _load(self, built: tuple[Graph, list[str]] | _Sharded, stage: int, *,
              blocks: dict[str, Split | None] | None = None,
              groups: list[list[int]] | None = None) -> _Program:
        """Compile a stage's program and load it on the stage's cores (``built`` split by
        :meth:`_split` at ``tp > 1``). An optimizer program is built on the blocks already:
        ``blocks`` says how its inputs are split."""
        if isinstance(built, _Sharded):
            split = built
        elif blocks is not None or self.tp == 1:
            split = _Sharded(built[0], built[1], dict(blocks or {}), {}, [],
                             [p.name for p in built[0].parameters])
        else:
            split = self._split(built, stage)
        tp = self.tp
        graph, labels = split.graph, split.labels
        names = split.names
        input_splits, output_splits, rank_inputs = split.input_splits, split.output_splits, split.rank_inputs
        program = compile_graph(graph, self.core.spec)
        ranks = [self.instance.core(stage * tp + r).load(program, rank=r) for r in range(tp)]
        for loaded in ranks:
            loaded.stochastic_rounding = stochastic_rounding_wanted(self.precision is Precision.BF16_SR)
        costs = program.cost_ns.copy()
        sends = []
        collectives: list[tuple[int, CollectiveRecord]] = []
        output_label = {out.name: label for out, label in zip(program.graph.outputs, labels)}
        groups = groups or [list(range(stage * tp, (stage + 1) * tp))]  # the collectives' ranks (cores)
        for node in program.collective_nodes:
            op = program.graph.ops[int(program.op_index[node])]
            if op.opcode == "collective-permute":  # a send: each rank to its peer stage's same rank
                peer = int(op.attrs["pp_peer"])
                pairs = [[stage * tp + r, peer * tp + r] for r in range(tp)]
                record = cc.permute(self.topology, pairs, op.operands[0].size, op.dtype.value)
                sends.append((int(node), record, output_label[op.name]))
            else:  # the stage's tensor-parallel all-reduce (or all-gather ...) over its ranks
                record = cc.collective(CC_OPERATIONS[op.opcode], self.topology, groups,
                                       op.operands[0].size, op.dtype.value)
                collectives.append((int(node), record))
            costs[node] = record.duration_ns
        return _Program(ranks[0], names, labels, costs, sends, ranks,
                        collectives, input_splits, output_splits, rank_inputs)

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

    def _optimizer_graph(self, s: int, splits: dict[str, Split | None]
                         ) -> tuple[tuple[Graph, list[str]], dict[str, Split | None]]:
        """The stage's optimizer program on each rank's blocks (elementwise: a block's update is the
        whole update's block), and how its inputs are split."""
        b = GraphBuilder(f"{self.name}_stage{s}_optimizer")
        outputs: list[Op] = []
        labels: list[str] = []
        blocks: dict[str, Split | None] = {}
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
                split = splits.get(f"param/{name}")
                shape = _block_shape(tuple(self.params[i].shape), split, self.tp)
                for key in (f"param/{name}", f"grad/{name}", *self._state_names(i)):
                    blocks[key] = split
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
        return (_live_graph(b.name, b, outputs), labels), blocks

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
        self.rank_results = []
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
        self._sum_tied_gradients(host_start)
        for s in range(pp):
            scalars = {f"scalars/{g}": host_scalars(group.spec, group.torch_group, self.steps)
                       for g, group in enumerate(self.groups)}
            self._run(s, self.optimizer_programs[s], scalars, 0.0, host_start)
            for state in self.stage_states[s]:
                state.zero([n for n in state.tensors if n.startswith("grad/")])
        rank0 = [r for results in self.stage_results for r in results]  # the last stage's update last
        self.last_results = rank0 + self.rank_results
        first = inputs[0]
        seq = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else 0
        emit_step(self.optimizer_programs[-1].loaded, rank0, step=self.steps,
                  global_batch=int(first.shape[0]) if first.dim() else 1, seq=seq, name=self.name,
                  bf16=self.precision is not Precision.FP32, host_start_ns=host_start, tp=self.tp,
                  pp=pp, model_flops=3.0 * self.forward_flops * m)
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
        """Execute ``program`` on stage ``s``'s cores (each tensor-parallel rank on its blocks, the
        ranks meeting in every collective) from when its input is there; its outputs by label
        (resident ones stored; rank 0's) and its end time."""
        tp = self.tp
        graph = program.loaded.program.graph
        feeds = {k: v for k, v in host.items() if k in program.inputs}
        produced: list[list[np.ndarray]] = [[] for _ in range(tp)]
        rendezvous = _Rendezvous(tp)

        def run(r: int) -> None:
            state = self.stage_states[s][r]
            mine = {k: rank_block(v, program.input_splits.get(k), tp, r)
                    for k, v in feeds.items()}
            arrays = [self._read(s, program, name, value, r)
                      for name, value in zip(program.inputs, state.inputs(program.inputs, mine))]
            arrays += [make(r) for make in program.rank_inputs]
            exchange = rendezvous.for_rank(r)

            def collective(op: Op, value: np.ndarray) -> np.ndarray:
                return value if op.opcode == "collective-permute" else exchange(op, value)

            outputs = program.ranks[r].compute(bind_inputs(graph, arrays), collective)
            produced[r] = outputs
            state.update({k: self._stored(s, program, k, v, r) for k, v in zip(program.outputs, outputs)
                          if k in state.tensors})

        if tp == 1:
            run(0)
        else:
            run_ranks(tp, run, rendezvous.barrier, f"pp-stage{s}")
        by_label = dict(zip(program.outputs, produced[0]))
        for i, label in enumerate(program.outputs):  # a value sent split: the ranks' blocks, whole
            split = program.output_splits.get(label)
            if split is not None and label.startswith(("send/", "dx/")):
                by_label[label] = join_blocks([outs[i] for outs in produced], split)
        with cores_held([m.core for m in program.ranks]) as free_ns:
            t0 = max(free_ns, int(np.ceil(ready_ns)))
            timeline = schedule(program.loaded.program, float(t0), program.costs)
            placed_sends = placed_at(timeline, ((node, tpl) for node, tpl, _ in program.sends))
            placed = placed_sends + placed_at(timeline, program.collectives)
            results = [m.record(t0, timeline, produced[r], False, placed, host_start_ns=host_start_ns)
                       for r, m in enumerate(program.ranks)]
        self.stage_results[s].append(results[0])
        self.rank_results.extend(results[1:])
        self._last_sends = {label: record for (_, _, label), (_, record) in zip(program.sends, placed_sends)}
        return by_label, float(results[0].end_ns)

    def _sum_tied_gradients(self, host_start_ns: int) -> None:
        """The tied weights' gradient all-reduce over the stages holding them (threads meeting in
        the collective, FP32 sums in stage order; with ``tp > 1`` rank r of every holder with rank
        r of the others, each over its block), timed from when the last holder is free."""
        stages = self.tied_stages
        if not stages:
            return
        produced: dict[tuple[int, int], list[np.ndarray]] = {}
        for r in range(self.tp):
            rendezvous = _Rendezvous(len(stages))

            def run(k: int, r: int = r, rendezvous: _Rendezvous = rendezvous) -> None:
                s = stages[k]
                program, state = self.tied_programs[s], self.stage_states[s][r]
                whole = {n: self.stage_splits[s].get(n) is None and self.tied_blocks[n] is not None
                         for n in program.inputs}  # kept whole, all-reduced by blocks
                arrays = [rank_block(state.tensors[n], self.tied_blocks[n], self.tp, r)
                          if whole[n] else state.tensors[n] for n in program.inputs]
                outputs = program.ranks[r].compute(bind_inputs(program.loaded.program.graph, arrays),
                                                   rendezvous.for_rank(k))
                produced[(s, r)] = outputs
                state.update({n: _with_block(state.tensors[n], v, self.tied_blocks[n], self.tp, r)
                              if whole[n] else v for n, v in zip(program.outputs, outputs)})

            run_ranks(len(stages), run, rendezvous.barrier, f"pp-tied-rank{r}")
        with cores_held([m.core for s in stages for m in self.tied_programs[s].ranks]) as t0:
            for s in stages:
                program = self.tied_programs[s]
                timeline = schedule(program.loaded.program, float(t0), program.costs)
                placed = placed_at(timeline, program.collectives)
                results = [m.record(t0, timeline, produced[(s, r)], False, placed,
                                    host_start_ns=host_start_ns) for r, m in enumerate(program.ranks)]
                self.stage_results[s].append(results[0])
                self.rank_results.extend(results[1:])

    def _read(self, s: int, program: _Program, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """A resident tensor as ``program`` reads it: a gradient kept whole (the backward computes
        the gradient of a vocabulary-split table whole) is cut to the rank's block for the optimizer,
        locally."""
        kept = self.stage_splits[s].get(name)
        wanted = program.input_splits.get(name, kept)
        if kept is None and wanted is not None and name in self.stage_states[s][rank].tensors:
            return rank_block(value, wanted, self.tp, rank)
        return value

    def _stored(self, s: int, program: _Program, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """What rank ``rank`` keeps of an output aliasing resident tensor ``name``: its block, as the
        inputs read it (an output computed whole on every rank is cut to the block, locally)."""
        want, got = self.stage_splits[s].get(name), program.output_splits.get(name)
        if got is not None and got != want:
            raise PlanError(f"{self.name}: {name} is kept split as {want} but written split as {got}")
        if value.shape == self.stage_states[s][rank].tensors[name].shape:
            return value
        return rank_block(value, want, self.tp, rank)

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
        for s, ranks in enumerate(self.stage_states):
            for name in ranks[0].tensors:
                if name in self.state.tensors:
                    split = self.stage_splits[s].get(name)
                    parts = [state.tensors[name] for state in ranks]
                    self.state.update({name: parts[0] if split is None else  # a padded vocabulary cut
                                       join_blocks(parts, split, self.state.tensors[name].shape[split.dim])})
        super()._sync_host()

    @property
    def bubble_fraction(self) -> float:
        """The 1F1B bubble of the schedule, ``(pp - 1) / (micro_batches + pp - 1)`` of the step."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)


def _weights_differ(forward: _Sharded, backward: _Sharded) -> bool:
    """Whether the forward program splits a weight the backward keeps split otherwise (a weight the
    backward keeps whole, the forward cuts from it locally)."""
    return any(k.startswith("param/") and v is not None and forward.input_splits.get(k) != v
               for k, v in backward.input_splits.items())


def _gradient_clashes(splits: dict[str, Split | None], names: list[str]) -> dict[str, Split | None]:
    """Gradient buffers (``grad/<name>``, inputs of the program: ``names``) split otherwise than their
    weight (``param/<name>``, whole when nothing splits it), each with its weight's split (None:
    kept whole like a whole weight)."""
    clashes: dict[str, Split | None] = {}
    for name in names:
        split = splits.get(name)
        weight = splits.get("param/" + name[len("grad/"):])
        if name.startswith("grad/") and split is not None and split != weight:
            clashes[name] = weight
    return clashes


def _block_shape(shape: tuple[int, ...], split: Split | None, tp: int) -> tuple[int, ...]:
    """A rank's block of a value of ``shape`` split as ``split``."""
    if split is None:
        return shape
    return tuple(-(-d // tp) if i == split.dim else d for i, d in enumerate(shape))  # padded: rounded up


def _with_block(whole: np.ndarray, block: np.ndarray, split: Split | None, tp: int, rank: int) -> np.ndarray:
    """``whole`` with rank ``rank``'s block (split as ``split``, outer 1; a padded block cut at the
    end of the dim) replaced by ``block``."""
    assert split is not None and split.outer == 1
    rows = block.shape[split.dim]
    start = min(rank * rows, whole.shape[split.dim])
    stop = min(start + rows, whole.shape[split.dim])
    out = whole.copy()
    index = (slice(None),) * split.dim + (slice(start, stop),)
    out[index] = block[(slice(None),) * split.dim + (slice(0, stop - start),)]
    return out


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


__all__ = ["Pass", "PipelineParallelTrainStep", "Transfer", "one_f_one_b"]
