"""Tensor-parallel training with real numerics: a traced PyTorch training step split Megatron-style
over ``tp`` cores, each holding its block of the weights, their gradients and optimizer state.

    step = TensorParallelTrainStep(model, optimizer, (x, y), tp=2, loss_fn=F.mse_loss)
    loss = step(x, y)        # every rank sees the whole batch; returns the loss

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
from typing import Any

import numpy as np
import torch

from neuroncore import collectives as cc
from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.options import CompilerOptions
from neuroncore.compiler.program import Program
from neuroncore.frontends.torch_frontend import _from_numpy, _to_numpy
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.group import CC_OPERATIONS, _Rendezvous
from neuroncore.parallel.held_cores import cores_held, placed_at
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.sharding import ShardedGraph, ShardingError, Split, block_of, join_blocks, shard
from neuroncore.parallel.training import PlanError
from neuroncore.runtime import records
from neuroncore.runtime.device import DeviceState, ExecutionResult, LoadedModel
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.optimizers import OptimizerKind, host_scalars
from neuroncore.training.precision import Precision, parse_precision
from neuroncore.training.step_records import emit_step
from neuroncore.training.torch_step import ProgramKind, StepInputs, TrainStep, _caller_frames


class TensorParallelTrainStep(TrainStep):
    """A training step split over ``tp`` cores with Megatron tensor parallelism (see module doc)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: StepInputs, *, tp: int,
                 loss_fn: Callable[..., Any] | None = None, precision: str | Precision = "fp32",
                 sequence_parallel: bool = False, instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise PlanError(f"tp must be a positive integer, not {tp!r}")
        self.tp = tp
        self.sequence_parallel = bool(sequence_parallel)
        try:
            prec = parse_precision(precision)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        super().__init__(model, optimizer, example_inputs, loss_fn=loss_fn, precision=prec,
                         accumulation_steps=1, instance=instance, core=0, frames=_caller_frames())

    def _memory_shards(self) -> int:
        return self.tp  # each rank holds 1/tp of the weights, gradients and optimizer state

    def _place(self, options: CompilerOptions | None) -> None:
        """Shard the step program and put each rank's program and blocks on its core (the whole
        program is never compiled nor its state placed: a rank holds only its blocks)."""
        tp = self.tp
        if tp > len(self.instance.cores):
            raise PlanError(f"tp={tp} does not fit {self.instance.name} "
                            f"({len(self.instance.cores)} cores)")
        full, self.layout = self.graphs[ProgramKind.UPDATE]
        trained = frozenset(f"param/{n}" for n in self.param_names)
        try:
            self.sharded: ShardedGraph = shard(full, tp, trained=trained,
                                               sequence_parallel=self.sequence_parallel)
        except ShardingError as exc:
            raise PlanError(f"{self.name}: {exc}") from None
        self.rank_program = compile_graph(self.sharded.local, self.core.spec, options)
        self.rank_models: list[LoadedModel] = [self.instance.core(r).load(self.rank_program, rank=r)
                                               for r in range(tp)]
        for loaded in self.rank_models:  # bf16-sr: every rank's bf16 writes round stochastically,
            loaded.stochastic_rounding = self.stochastic_rounding
            # from the same seed, so a replicated weight (a norm's) stays identical on every rank
        self.input_split = dict(zip(self.layout.inputs, self.sharded.input_splits))
        self.output_split = dict(zip(self.layout.outputs, self.sharded.output_splits))
        topology = instance_topology(self.instance.name, nodes=self.instance.nodes)
        self._templates: list[tuple[int, CollectiveRecord]] = []
        self._costs = self.rank_program.cost_ns.copy()
        for node in self.rank_program.collective_nodes:
            op = self.rank_program.graph.ops[int(self.rank_program.op_index[node])]
            record = cc.collective(CC_OPERATIONS[op.opcode], topology, [list(range(tp))],
                                   op.operands[0].size, op.dtype.value)
            self._costs[node] = record.duration_ns
            self._templates.append((int(node), record))
        whole = self._initial_state()
        self.rank_states = [DeviceState(self.instance.core(r),
                                        {k: self._block(k, v, r) for k, v in whole.items()})
                            for r in range(tp)]

    @property
    def program(self) -> Program:
        """The ranks' program (every rank runs it on its blocks)."""
        return self.rank_program

    def _block(self, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """Rank ``rank``'s block of the resident tensor ``name`` (the whole of a replicated one)."""
        return np.ascontiguousarray(block_of(value, self.input_split.get(name), self.tp, rank))

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
        """One step on the whole batch ``inputs`` (every rank sees all of it); returns the loss."""
        inputs = self.positional(inputs, named)
        batch = self._micro_batches(inputs)[0]
        host_start = time.time_ns()
        self.steps += 1
        host: dict[str, np.ndarray] = {f"input/{j}": _to_numpy(x) for j, x in enumerate(batch)}
        for g, group in enumerate(self.groups):
            host[f"scalars/{g}"] = host_scalars(group.spec, float(group.torch_group["lr"]), self.steps)
        host.update(self.rng_state(self.layout.inputs))  # one state for every rank: rank 0's seed,
        self.advance_rng()                                # so each rank's numbers are one core's
        rendezvous = _Rendezvous(self.tp)
        produced: list[list[np.ndarray]] = [[] for _ in range(self.tp)]
        local_graph = self.rank_program.graph

        def run(rank: int) -> None:
            state = self.rank_states[rank]
            mine = {k: self._block(k, v, rank) for k, v in host.items()}
            arrays = state.inputs(self.layout.inputs, mine)
            arrays += [make(rank) for make in self.sharded.rank_inputs]
            model = self.rank_models[rank]
            outputs = model.compute(bind_inputs(local_graph, arrays), rendezvous.for_rank(rank))
            produced[rank] = outputs
            state.update({name: self._stored(name, value, rank)
                          for name, value in zip(self.layout.outputs[1:], outputs[1:])})

        run_ranks(self.tp, run, rendezvous.barrier, "tp-train")
        self.last_results = self._record(produced, host_start)
        first = inputs[0]
        seq = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else 0
        emit_step(self.rank_models[0], self.last_results[:1], step=self.steps,
                  global_batch=int(first.shape[0]) if first.dim() else 1, seq=seq, name=self.name,
                  bf16=self.precision is not Precision.FP32, host_start_ns=host_start, tp=self.tp,
                  whole=self.graphs[ProgramKind.UPDATE][0])
        self._sync_host()
        return torch.tensor(float(np.asarray(produced[0][0]).reshape(-1)[0]), dtype=torch.float32)

    def _stored(self, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """What rank ``rank`` keeps of an output aliasing resident tensor ``name``: its block, as the
        input reads it (an output computed whole on every rank is cut to the block, locally)."""
        want, got = self.input_split.get(name), self.output_split.get(name)
        if want == got:
            return value
        if got is None:
            return self._block(name, value, rank)
        raise PlanError(f"{self.name}: {name} is read split as {want} but written split as {got}")

    def _record(self, produced: list[list[np.ndarray]], host_start_ns: int) -> list[ExecutionResult]:
        """Time the step once (every rank runs the same program) and record it on every rank's core."""
        with cores_held([m.core for m in self.rank_models]) as t0:
            timeline = schedule(self.rank_program, float(t0), self._costs)
            placed = placed_at(timeline, self._templates)
            results = [m.record(t0, timeline, produced[r], False, placed, host_start_ns=host_start_ns)
                       for r, m in enumerate(self.rank_models)]
        sink = self.rank_models[0].sink
        if sink.active and placed:
            records.emit_link_usage(sink, [t for _, t in placed], float(t0), float(results[0].end_ns),
                                    execution_ids=[r.execution_id for r in results])
        return results

    def gathered(self, name: str) -> np.ndarray:
        """The whole value of resident tensor ``name`` from every rank's block."""
        split = self.input_split.get(name)
        parts = [st.tensors[name] for st in self.rank_states]
        return parts[0] if split is None else join_blocks(parts, split)

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


__all__ = ["TensorParallelTrainStep"]
