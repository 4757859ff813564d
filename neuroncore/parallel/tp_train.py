"""Tensor-parallel training with real numerics: a traced PyTorch training step split Megatron-style
over ``tp`` cores, each holding its block of the weights, their gradients and optimizer state.

    step = TensorParallelTrainStep(model, optimizer, (x, y), tp=2, loss_fn=F.mse_loss)
    loss = step(x, y)        # every rank sees the whole batch; returns the loss

With ``accumulation_steps=K`` a call takes K micro-batches stacked along dim 0, as
:func:`neuroncore.training.trace_train_step` does: the first K-1 run the sharded *accumulate* program
(forward + backward, each rank adding its block of the gradients to resident buffers), the last the
sharded *update* program; both are split by the same pass, so a gradient buffer is split like its
weight in both.

How: the traced step's whole program (forward, backward through torch's autograd, optimizer update;
:class:`neuroncore.training.TrainStep`) goes through the same sharding pass as tensor-parallel
inference (:func:`neuroncore.parallel.sharding.shard`), told which inputs are trained weights. The pass
lays the forward out as Megatron does (a linear reading a replicated activation is column-parallel,
one reading a split activation row-parallel, with an all-reduce after it: Megatron's ``g``), and the
backward follows from the same rules without being told: the input gradient of a column-parallel
linear contracts the split output features, so it is a partial sum and gets an all-reduce (Megatron's
``f`` in backward); a row-parallel linear's input gradient comes out split and needs none; each
weight gradient comes out split like its weight. The optimizer's ops are elementwise, so each rank
updates only its block, with only its block of ``exp_avg``/``exp_avg_sq`` (or the momentum buffer)
resident. Anything that needs a whole split value (a softmax over vocabulary-split logits) gets an
all-gather: correct, and visible in the profile.

Each rank keeps its blocks as resident state on its own core (:class:`DeviceState`); only the batch
and the per-step scalars go in. The ranks run in threads and meet in every collective (FP32 sums in
rank order, the rendezvous of tensor-parallel inference). Then the step is timed as tensor-parallel
inference is: one schedule (the ranks run the same program), each collective lasting what
``neuroncore.collectives`` computes for its size over the ranks on the instance topology, recorded on
every rank's core; rank 0 reports the step's ``train_step`` record. After a call the host's
``model.parameters()`` and ``optimizer.state`` hold the gathered values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.options import CompilerOptions
from neuroncore.compiler.program import Program
from neuroncore.frontends.torch_frontend import _from_numpy, _to_numpy
from neuroncore.ir.graph import Graph
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.group import CC_OPERATIONS, _Rendezvous, timed_collectives
from neuroncore.parallel.held_cores import cores_held, placed_at
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.sharding import (
    ShardedGraph,
    ShardingError,
    Split,
    join_blocks,
    rank_block,
    shard,
)
from neuroncore.parallel.training import PlanError
from neuroncore.runtime import records
from neuroncore.runtime.device import DeviceState, ExecutionResult, LoadedModel
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.memory import program_saved_activations
from neuroncore.training.optimizers import OptimizerKind, host_scalars
from neuroncore.training.precision import Precision, parse_precision
from neuroncore.training.step_records import emit_step
from neuroncore.training.torch_step import (
    ProgramKind,
    StepInputs,
    TrainStep,
    _caller_frames,
    _Layout,
    mark_stepped,
)


@dataclass
class _RankProgram:
    """One sharded program of the step (update, or accumulate) as every rank runs it."""

    sharded: ShardedGraph
    program: Program
    models: list[LoadedModel]  # rank r's copy on core r
    layout: _Layout
    costs: np.ndarray  # node costs, the collectives' from neuroncore.collectives
    templates: list[tuple[int, CollectiveRecord]]  # each collective node, its timed template
    input_split: dict[str, Split | None]
    output_split: dict[str, Split | None]


class TensorParallelTrainStep(TrainStep):
    """A training step split over ``tp`` cores with Megatron tensor parallelism (see module doc)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: StepInputs, *, tp: int,
                 loss_fn: Callable[..., Any] | None = None, precision: str | Precision = "fp32",
                 sequence_parallel: bool = False, accumulation_steps: int = 1,
                 instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise PlanError(f"tp must be a positive integer, not {tp!r}")
        if not isinstance(accumulation_steps, int) or isinstance(accumulation_steps, bool) \
                or accumulation_steps < 1:
            raise PlanError(f"accumulation_steps must be a positive integer, not {accumulation_steps!r}")
        self.tp = tp
        self.sequence_parallel = bool(sequence_parallel)
        try:
            prec = parse_precision(precision)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        super().__init__(model, optimizer, example_inputs, loss_fn=loss_fn, precision=prec,
                         accumulation_steps=accumulation_steps, instance=instance, core=0,
                         frames=_caller_frames())

    def _memory_shards(self) -> int:
        return self.tp  # each rank holds 1/tp of the weights, gradients and optimizer state

    def _traced_activations(self) -> int:
        return 0  # each rank's own, from its sharded program (``_shard``), before compiling it

    def _place(self, options: CompilerOptions | None) -> None:
        """Shard the step's programs (update, and accumulate with gradient accumulation) and put
        each rank's programs and blocks on its core (the whole program is never compiled nor its
        state placed: a rank holds only its blocks)."""
        tp = self.tp
        if tp > len(self.instance.cores):
            raise PlanError(f"tp={tp} does not fit {self.instance.name} "
                            f"({len(self.instance.cores)} cores)")
        update = self._shard(*self.graphs[ProgramKind.UPDATE], options)
        # the accumulate program reads and writes the gradient buffers as the update reads them
        # (only those: its weights split themselves where the linears read them, as the update's do)
        fixed = {k: v for k, v in update.input_split.items() if v is not None and k.startswith("grad/")}
        self.rank_programs = {kind: update if kind is ProgramKind.UPDATE else
                              self._shard(graph, layout, options, fixed)
                              for kind, (graph, layout) in self.graphs.items()}
        self.sharded: ShardedGraph = update.sharded
        self.rank_program = update.program
        self.rank_models: list[LoadedModel] = update.models
        self.layout = update.layout
        self.input_split: dict[str, Split | None] = {}
        self.output_split = update.output_split
        for kind, ranked in self.rank_programs.items():  # a resident tensor is split one way
            for name, split in ranked.input_split.items():
                if name in self.input_split and self.input_split[name] != split:
                    raise PlanError(f"{self.name}: {name} is split as {self.input_split[name]} by the "
                                    f"update program but as {split} by the {kind.value} program")
                self.input_split[name] = split
        whole = self._initial_state()
        self.whole_shapes = {k: v.shape for k, v in whole.items()}
        self.rank_states = [DeviceState(self.instance.core(r),
                                        {k: self._block(k, v, r) for k, v in whole.items()})
                            for r in range(tp)]

    def _shard(self, full: Graph, layout: _Layout, options: CompilerOptions | None,
               fixed: dict[str, Split] | None = None) -> _RankProgram:
        """One step program split over the ranks, compiled once and loaded on every rank's core,
        its collectives timed over the ranks on the instance topology."""
        tp = self.tp
        trained = frozenset(f"param/{n}" for n in self.param_names)
        try:
            sharded = shard(full, tp, trained=trained, sequence_parallel=self.sequence_parallel,
                            input_splits=fixed)
        except ShardingError as exc:
            raise PlanError(f"{self.name}: {exc}") from None
        if fixed is None:  # the update program: a rank's saved activations, counted on its blocks
            self.memory = self._check_memory(activations=program_saved_activations(sharded.local))
        program = compile_graph(sharded.local, self.core.spec, options)
        models = [self.instance.core(r).load(program, rank=r) for r in range(tp)]
        for loaded in models:  # bf16-sr: every rank's bf16 writes round stochastically,
            loaded.stochastic_rounding = self.stochastic_rounding
            # from the same seed, so a replicated weight (a norm's) stays identical on every rank
        topology = instance_topology(self.instance.name, nodes=self.instance.nodes)
        costs, templates = timed_collectives(program, topology, tp)
        return _RankProgram(sharded, program, models, layout, costs, templates,
                            dict(zip(layout.inputs, sharded.input_splits)),
                            dict(zip(layout.outputs, sharded.output_splits)))

    @property
    def program(self) -> Program:
        """The ranks' program (every rank runs it on its blocks)."""
        return self.rank_program

    def _block(self, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """Rank ``rank``'s block of the resident tensor ``name`` (the whole of a replicated one)."""
        return rank_block(value, self.input_split.get(name), self.tp, rank)

    # -- what a caller may inspect -------------------------------------------------------------
    @property
    def collectives(self) -> list[tuple[str, str]]:
        """``(opcode, layer)`` of every collective of the rank program, in program order."""
        return [(op.opcode, op.layer) for op in self.sharded.local.ops
                if op.opcode in CC_OPERATIONS]

    def split_of(self, param: str) -> Split | None:
        """How parameter ``param`` (a ``named_parameters`` name) is split over the ranks."""
        return self.input_split.get(f"param/{param}")

    def resident_elements(self, rank: int, prefix: str = "state/") -> int:
        """Elements of resident tensors named ``prefix...`` on ``rank``'s core."""
        return sum(v.size for k, v in self.rank_states[rank].tensors.items() if k.startswith(prefix))

    # -- run time ------------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """One step on the whole batch ``inputs`` (every rank sees all of it; ``accumulation_steps``
        micro-batches along dim 0); returns the loss (the mean over the micro-batches)."""
        inputs = self.positional(inputs, named)
        micro = self._micro_batches(inputs)
        host_start = time.time_ns()
        self.steps += 1
        self.last_results = []
        total = 0.0
        for k, batch in enumerate(micro):
            last = k == len(micro) - 1
            ranked = self.rank_programs[ProgramKind.UPDATE if last else ProgramKind.ACCUMULATE]
            host: dict[str, np.ndarray] = {f"input/{j}": _to_numpy(x) for j, x in enumerate(batch)}
            if last:
                for g, group in enumerate(self.groups):
                    host[f"scalars/{g}"] = host_scalars(group.spec, group.torch_group,
                                                        self.steps)
            host.update(self.rng_state(ranked.layout.inputs))  # one state for every rank: rank 0's
            self.advance_rng()                                  # seed, so each rank's numbers are one core's
            produced = self._run_ranks(ranked, host)
            self.last_results += self._record(ranked, produced, host_start)
            total += float(np.asarray(produced[0][0]).reshape(-1)[0])
        if self.accumulation_steps > 1:
            for state in self.rank_states:
                state.zero([f"grad/{n}" for n in self.param_names])
        first = inputs[0]
        seq = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else 0
        rank0 = [r for r in self.last_results if r.core == self.rank_models[0].core.index]
        emit_step(self.rank_models[0], rank0, step=self.steps,
                  global_batch=int(first.shape[0]) if first.dim() else 1, seq=seq, name=self.name,
                  bf16=self.precision is not Precision.FP32, host_start_ns=host_start, tp=self.tp,
                  whole=self.graphs[ProgramKind.UPDATE][0])
        self._sync_host()
        return torch.tensor(total, dtype=torch.float32)

    def _run_ranks(self, ranked: _RankProgram, host: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
        """Every rank runs ``ranked`` on its blocks (threads meeting in each collective); each keeps
        its block of the outputs that alias resident tensors. The ranks' outputs."""
        rendezvous = _Rendezvous(self.tp)
        produced: list[list[np.ndarray]] = [[] for _ in range(self.tp)]
        layout, local_graph = ranked.layout, ranked.program.graph

        def run(rank: int) -> None:
            state = self.rank_states[rank]
            mine = {k: self._block(k, v, rank) for k, v in host.items()}
            arrays = state.inputs(layout.inputs, mine)
            arrays += [make(rank) for make in ranked.sharded.rank_inputs]
            outputs = ranked.models[rank].compute(bind_inputs(local_graph, arrays), rendezvous.for_rank(rank))
            produced[rank] = outputs
            state.update({name: self._stored(ranked, name, value, rank)
                          for name, value in zip(layout.outputs[1:], outputs[1:])})

        run_ranks(self.tp, run, rendezvous.barrier, "tp-train")
        return produced

    def _stored(self, ranked: _RankProgram, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """What rank ``rank`` keeps of an output aliasing resident tensor ``name``: its block, as the
        input reads it (an output computed whole on every rank is cut to the block, locally)."""
        want, got = self.input_split.get(name), ranked.output_split.get(name)
        if want == got:
            return value
        if got is None:
            return self._block(name, value, rank)
        raise PlanError(f"{self.name}: {name} is read split as {want} but written split as {got}")

    def _record(self, ranked: _RankProgram, produced: list[list[np.ndarray]],
                host_start_ns: int) -> list[ExecutionResult]:
        """Time one program once (every rank runs the same program) and record it on every rank's core."""
        with cores_held([m.core for m in ranked.models]) as t0:
            timeline = schedule(ranked.program, float(t0), ranked.costs)
            placed = placed_at(timeline, ranked.templates)
            results = [m.record(t0, timeline, produced[r], False, placed, host_start_ns=host_start_ns)
                       for r, m in enumerate(ranked.models)]
        sink = ranked.models[0].sink
        if sink.active and placed:
            records.emit_link_usage(sink, [t for _, t in placed], float(t0), float(results[0].end_ns),
                                    execution_ids=[r.execution_id for r in results])
        return results

    def gathered(self, name: str) -> np.ndarray:
        """The whole value of resident tensor ``name`` from every rank's block."""
        split = self.input_split.get(name)
        parts = [st.tensors[name] for st in self.rank_states]
        if split is None:
            return parts[0]
        return join_blocks(parts, split, self.whole_shapes[name][split.dim])  # a padded vocabulary cut

    def _sync_host(self) -> None:
        """Parameters and optimizer state gathered from the ranks' blocks into the model and the
        optimizer (as ``optimizer.step(); optimizer.zero_grad()`` leave them)."""
        if not hasattr(self, "rank_states"):
            return
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for name in self.layout.outputs:
                target = buffers.get(name[len("buffer/"):]) if name.startswith("buffer/") else None
                if target is not None:
                    target.copy_(_from_numpy(self.gathered(name), target.dtype))
            for i, p in enumerate(self.params):
                p.copy_(_from_numpy(self.gathered(f"param/{self.param_names[i]}"), p.dtype))
                p.grad = None
                held = self.optimizer.state[p]
                spec = next(g.spec for g in self.groups if i in g.params)
                for full in self._state_names(i):
                    held[full.rpartition("/")[2]] = _from_numpy(self.gathered(full), p.dtype)
                if spec.kind is not OptimizerKind.SGD:
                    held["step"] = torch.tensor(float(self.steps), dtype=torch.float32)
        mark_stepped(self.optimizer)


__all__ = ["TensorParallelTrainStep"]
