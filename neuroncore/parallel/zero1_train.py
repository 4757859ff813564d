"""ZeRO-1 training with real numerics: a PyTorch training step on ``ranks`` cores, each on its shard
of the batch, gradients reduce-scattered, the optimizer run on each rank's 1/N of the parameters
with only that shard of the optimizer state on its core, the updated shards all-gathered.

    step = ZeroOneTrainStep(model, optimizer, (x_shard, y_shard), ranks=2, loss_fn=F.mse_loss)
    loss = step(x, y)        # x: ranks x the traced shard along dim 0; returns the mean loss

Why two programs per rank and not one: the traced step (:class:`neuroncore.training.TrainStep`)
fuses the optimizer into the step per parameter tensor, while ZeRO-1 shards the *flattened*
parameters of each param group. So each rank runs

1. the traced step's **gradient program** (forward + backward; the program gradient accumulation
   uses, whose outputs are the loss and one gradient per parameter), on its batch shard, then
2. per param group, a small **ZeRO-1 update program**: the group's gradients flattened (padded with
   zeros to a multiple of N), a ``reduce-scatter`` (group ``dp``: the rank gets the sum of its
   1/N slice), the 1/N scale DDP's averaging applies, the optimizer update with the same code the
   traced step uses (:func:`neuroncore.training.optimizers.emit_update`) on the rank's slice of the
   flattened parameters and its resident state shard, then an ``all-gather`` of the updated slices
   and the full parameters cut back into their tensors.

Precision (``precision=``): ``fp32``; ``bf16`` (auto-cast: bf16 parameters for the forward, FP32
master weights sharded with the optimizer state, each rank's updated master shard rounded to bf16
and the bf16 shards all-gathered); ``bf16-sr`` (bf16 parameters only, the updated shard rounded back
stochastically, as the single-core ``bf16-sr`` step does).

The ranks run in threads; a collective waits for every rank and sums in rank order in FP32 (the
rendezvous of :mod:`neuroncore.parallel.dp_train`). Each rank has its own resident state
(:class:`~neuroncore.runtime.device.DeviceState`): full parameters and buffers, and only its shard of
the optimizer state. The host copies (``model.parameters()``, ``optimizer.state``) are assembled after
every step, the state from every rank's shard.

Timing: after the numerics, every rank's executions are timed and recorded on its core (so a
``neuron-profile capture`` holds them): the gradient program, then each update program, which the
ranks enter together from the latest of their clocks; each reduce-scatter and all-gather lasts what
``neuroncore.collectives`` computes for its size over the ranks on the instance topology. The
gradient program is not overlapped with the collectives (DDP's bucketed overlap is the modelled
path, ``neuroncore.parallel.training``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuroncore.collectives.record import CollectiveRecord
from neuroncore.compiler import compile as compile_graph
from neuroncore.dtypes import DType
from neuroncore.frontends.torch_frontend import _from_numpy, _to_numpy
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Op
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.group import timed_collectives
from neuroncore.parallel.held_cores import cores_held, placed_at
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.training import PlanError
from neuroncore.runtime.device import DeviceState, ExecutionResult, LoadedModel, stochastic_rounding_wanted
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.optimizers import OptimizerKind, emit_update, host_scalars, split_scalars
from neuroncore.training.precision import Precision, parse_precision
from neuroncore.training.torch_step import (
    ProgramKind,
    StepInputs,
    TrainStep,
    _caller_frames,
    _Layout,
    mark_stepped,
)


class _Rendezvous:
    """Collectives between the rank threads: FP32 sums in rank order, gathers in rank order."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks)
        self.slots: list[np.ndarray | None] = [None] * ranks

    def for_rank(self, rank: int) -> Callable[[Op, np.ndarray], np.ndarray]:
        def exchange(op: Op, value: np.ndarray) -> np.ndarray:
            self.slots[rank] = np.asarray(value, np.float32)
            self.barrier.wait()
            parts = [p for p in self.slots if p is not None]
            if op.opcode == "reduce-scatter":
                total = np.zeros_like(parts[0])
                for part in parts:
                    total = total + part
                rows = total.shape[0] // self.ranks
                result = total[rank * rows:(rank + 1) * rows].copy()
            elif op.opcode == "all-gather":
                result = np.concatenate(parts, axis=int(op.attrs.get("dimension", 0)))
            else:
                raise PlanError(f"{op.opcode} is not a ZeRO-1 collective")
            self.barrier.wait()
            return result
        return exchange


@dataclass
class _Shard:
    """One param group's flat layout: its parameters' sizes and the per-rank slice length."""

    params: list[int]
    sizes: list[int]
    shard: int  # elements per rank (the flat group padded to ranks * shard)

    @property
    def total(self) -> int:
        return sum(self.sizes)


class ZeroOneTrainStep(TrainStep):
    """A training step on ``ranks`` cores with ZeRO-1: sharded optimizer state and update."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: StepInputs, *, ranks: int,
                 loss_fn: Callable[..., Any] | None = None, precision: str | Precision = "fp32",
                 instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise PlanError(f"ranks must be a positive integer, not {ranks!r}")
        self.ranks = ranks
        try:
            prec = parse_precision(precision)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        super().__init__(model, optimizer, example_inputs, loss_fn=loss_fn, precision=prec,
                         accumulation_steps=1, instance=instance, core=0, frames=_caller_frames())
        if ranks > len(self.instance.cores):
            raise PlanError(f"{ranks} ranks do not fit {self.instance.name}")
        graph, self.grad_layout = self._build(ProgramKind.ACCUMULATE)  # loss + gradients
        graph.name = f"{self.name}_gradients"  # what a profile calls it: no accumulation here
        grad_program = compile_graph(graph, self.core.spec)
        self.grad_programs: list[LoadedModel] = [self.instance.core(r).load(grad_program)
                                                 for r in range(ranks)]
        self.shards = [_Shard(g.params, [self.params[i].numel() for i in g.params],
                              -(-sum(self.params[i].numel() for i in g.params) // ranks))
                       for g in self.groups]
        self.update_programs: list[list[tuple[LoadedModel, _Layout]]] = []
        for r in range(ranks):
            per_group = []
            for g in range(len(self.groups)):
                ugraph, layout = self._build_update(g, r)
                update = self.instance.core(r).load(compile_graph(ugraph, self.core.spec))
                # bf16 parameters written back: rounded stochastically as a bf16-sr step does
                update.stochastic_rounding = stochastic_rounding_wanted(self.precision is Precision.BF16_SR)
                per_group.append((update, layout))
            self.update_programs.append(per_group)
        self.topology = instance_topology(self.instance.name, nodes=self.instance.nodes)
        self._timing = [self._costs(m) for m in
                        [*self.grad_programs, *(u for per in self.update_programs for u, _ in per)]]
        self.rank_results: list[list[ExecutionResult]] = [[] for _ in range(ranks)]
        full = self.state.tensors
        self.rank_states = [DeviceState(self.instance.core(r), self._rank_tensors(full, r))
                            for r in range(ranks)]

    # -- trace time ----------------------------------------------------------------------------
    def _costs(self, loaded: LoadedModel) -> tuple[np.ndarray, list[tuple[int, CollectiveRecord]]]:
        return timed_collectives(loaded.program, self.topology, self.ranks)

    def _params_in_bf16(self) -> bool:
        """bf16 and bf16-sr: every rank's forward reads bf16 parameters (all-gathered in bf16)."""
        return self.precision is not Precision.FP32

    @property
    def master(self) -> bool:
        """bf16 auto-cast: FP32 master weights, sharded like the optimizer state (NxD's ZeRO-1)."""
        return self.precision is Precision.BF16

    def _shard_names(self, g: int) -> list[str]:
        return [f"zero1/{g}/{s}" for s in self.groups[g].spec.state_names]

    def _master_name(self, g: int) -> str:
        return f"zero1/{g}/master"

    def _build_update(self, g: int, rank: int) -> tuple[Any, _Layout]:
        """Rank ``rank``'s ZeRO-1 update of param group ``g`` (see the module doc)."""
        group, shard = self.groups[g], self.shards[g]
        n = self.ranks
        b = GraphBuilder(f"{self.name}_zero1_update_{g}")
        pad = shard.shard * n - shard.total
        held = DType.BF16 if self._params_in_bf16() else DType.FP32

        def flat(ops: list[Op]) -> Op:
            parts = [b.reshape(op, (op.size,)) for op in ops]
            if pad:
                parts.append(b.constant(0.0, ops[0].dtype, (pad,)))
            return parts[0] if len(parts) == 1 else b.concatenate(parts, 0)

        with b.located("model/gradient_sync", self._frames):
            grads = [b.parameter(f"grad/{self.param_names[i]}", tuple(self.params[i].shape), DType.FP32)
                     for i in shard.params]
            summed = b.add_op("reduce-scatter", [flat(grads)], (shard.shard,), DType.FP32,
                              reduction="sum", dimension=0, group="dp", name=f"reduce-scatter.{b.n_ops}")
            grad = b.multiply(summed, 1.0 / n)
        with b.located("model/optimizer", self._frames):
            if self.master:  # the rank's FP32 master shard is what the optimizer updates
                mine = b.parameter(self._master_name(g), (shard.shard,), DType.FP32)
            else:
                params = [b.parameter(f"param/{self.param_names[i]}", tuple(self.params[i].shape), held)
                          for i in shard.params]
                start = rank * shard.shard
                mine = b.slice(flat(params), [start], [start + shard.shard], [1])
                if held is not DType.FP32:
                    mine = b.convert(mine, DType.FP32)
            state = [b.parameter(name, (shard.shard,), DType.FP32) for name in self._shard_names(g)]
            vector = b.parameter(f"scalars/{g}", (len(group.spec.scalar_names),), DType.FP32)
            new_master, new_state = emit_update(b, group.spec, mine, grad, state,
                                                split_scalars(b, group.spec, vector))
            # bf16: the updated shard rounded to the parameters' dtype (stochastically with bf16-sr)
            new_param = new_master if held is DType.FP32 else b.convert(new_master, held)
        with b.located("model/gradient_sync", self._frames):
            gathered = b.add_op("all-gather", [new_param], (shard.shard * n,), held,
                                dimension=0, group="dp", name=f"all-gather.{b.n_ops}")
            outputs, names, offset = [], [], 0
            for i, size in zip(shard.params, shard.sizes):
                piece = b.slice(gathered, [offset], [offset + size], [1])
                outputs.append(b.reshape(piece, tuple(self.params[i].shape)))
                names.append(f"param/{self.param_names[i]}")
                offset += size
        names += self._shard_names(g)
        outputs += new_state
        if self.master:
            outputs.append(new_master)
            names.append(self._master_name(g))
        graph = b.build(outputs).pruned()
        return graph, _Layout([p.name for p in graph.parameters], names)

    def _rank_tensors(self, full: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
        """Rank ``rank``'s resident tensors: parameters and buffers whole, the optimizer state as
        this rank's slice of each group's flattened state."""
        tensors = {k: v.copy() for k, v in full.items() if not k.startswith("state/")}
        for g, shard in enumerate(self.shards):
            for s, name in zip(self.groups[g].spec.state_names, self._shard_names(g)):
                pieces = [full[f"state/{self.param_names[i]}/{s}"].reshape(-1) for i in shard.params]
                whole = np.concatenate([*pieces, np.zeros(shard.shard * self.ranks - shard.total,
                                                          np.float32)])
                tensors[name] = whole[rank * shard.shard:(rank + 1) * shard.shard].astype(np.float32)
            if self.master:  # the FP32 initial parameters, before any bf16 rounding
                params = [full[f"param/{self.param_names[i]}"].reshape(-1) for i in shard.params]
                flat = np.concatenate([*params, np.zeros(shard.shard * self.ranks - shard.total, np.float32)])
                tensors[self._master_name(g)] = flat[rank * shard.shard:(rank + 1) * shard.shard].copy()
        return tensors

    # -- run time ------------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """One step: ``inputs`` hold ``ranks`` shards along dim 0; returns the mean loss."""
        inputs = self.positional(inputs, named)
        for x, s in zip(inputs, self.example_shapes):
            if tuple(x.shape) != (s[0] * self.ranks, *s[1:]):
                raise PlanError(f"{self.name} ZeRO-1 step: input of shape "
                                f"{[s[0] * self.ranks, *s[1:]]} expected, got {list(x.shape)}")
        shards = [[x[r * s[0]:(r + 1) * s[0]] for x, s in zip(inputs, self.example_shapes)]
                  for r in range(self.ranks)]
        self.steps += 1
        host_start = time.time_ns()
        rendezvous = _Rendezvous(self.ranks)
        losses: list[float] = [0.0] * self.ranks
        produced: list[list[list[np.ndarray]]] = [[] for _ in range(self.ranks)]

        def run(rank: int) -> None:
            state = self.rank_states[rank]
            host = {f"input/{j}": _to_numpy(x) for j, x in enumerate(shards[rank])}
            loaded = self.grad_programs[rank]
            layout = self.grad_layout
            host.update(self.rng_state(layout.inputs, rank))
            arrays = bind_inputs(loaded.program.graph, state.inputs(layout.inputs, host))
            outputs = loaded.compute(arrays)
            produced[rank].append(outputs)
            losses[rank] = float(np.asarray(outputs[0]).reshape(-1)[0])
            grads = dict(zip(layout.outputs[1:], outputs[1:]))
            state.update({k: v for k, v in grads.items() if k.startswith("buffer/")})
            for g, group in enumerate(self.groups):
                update, ulayout = self.update_programs[rank][g]
                extra = {k: np.asarray(v, np.float32) for k, v in grads.items() if k.startswith("grad/")}
                extra[f"scalars/{g}"] = host_scalars(group.spec, group.torch_group,
                                                     self.steps)
                arrays = bind_inputs(update.program.graph, state.inputs(ulayout.inputs, extra))
                new = update.compute(arrays, rendezvous.for_rank(rank))
                produced[rank].append(new)
                state.update(dict(zip(ulayout.outputs, new)))

        run_ranks(self.ranks, run, rendezvous.barrier, "zero1")
        self.advance_rng()
        self._record(produced, host_start)
        self._sync_host()
        return torch.tensor(sum(losses) / len(losses), dtype=torch.float32)

    def _record(self, produced: list[list[list[np.ndarray]]], host_start_ns: int) -> None:
        """Time and record the step's executions on every rank's core: the gradient program, then
        each update program; the ranks enter each update program together (its collectives
        synchronise them), from the latest of their clocks."""
        stages = [self.grad_programs] + [[self.update_programs[r][g][0] for r in range(self.ranks)]
                                         for g in range(len(self.groups))]
        self.rank_results = [[] for _ in range(self.ranks)]
        for k, stage in enumerate(stages):
            with cores_held([m.core for m in stage]) as t0:
                pass  # the ranks start together from the latest clock; each record takes its own core
            for rank, loaded in enumerate(stage):
                costs, templates = self._timing[self._timing_index(loaded)]
                timeline = schedule(loaded.program, float(t0), costs)
                placed = placed_at(timeline, templates)
                self.rank_results[rank].append(loaded.record(t0, timeline, produced[rank][k], False, placed,
                                                             host_start_ns=host_start_ns))
        self.last_results = self.rank_results[0]

    def _timing_index(self, loaded: LoadedModel) -> int:
        programs = [*self.grad_programs, *(u for per in self.update_programs for u, _ in per)]
        return next(i for i, m in enumerate(programs) if m is loaded)

    @property
    def step_time_ns(self) -> int:
        """Device time of the last step on rank 0: gradient program start to the last update's end."""
        results = self.rank_results[0]
        return results[-1].end_ns - results[0].start_ns if results else 0

    def optimizer_state_elements(self, rank: int) -> int:
        """Elements of optimizer state resident on ``rank``'s core (its shards only)."""
        return sum(v.size for k, v in self.rank_states[rank].tensors.items() if k.startswith("zero1/"))

    def _sync_host(self) -> None:
        """Parameters and buffers from rank 0 (every rank holds the same), the optimizer state
        assembled from every rank's shard."""
        if not hasattr(self, "rank_states"):
            return
        first = self.rank_states[0].tensors
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for name, value in first.items():
                if name.startswith("buffer/") and name[len("buffer/"):] in buffers:
                    target = buffers[name[len("buffer/"):]]
                    target.copy_(_from_numpy(value, target.dtype))
            for g, shard in enumerate(self.shards):
                spec = self.groups[g].spec
                whole = {s: np.concatenate([st.tensors[name] for st in self.rank_states])
                         for s, name in zip(spec.state_names, self._shard_names(g))}
                masters = (np.concatenate([st.tensors[self._master_name(g)] for st in self.rank_states])
                           if self.master else None)
                offset = 0
                for i, size in zip(shard.params, shard.sizes):
                    p = self.params[i]
                    value = (first[f"param/{self.param_names[i]}"] if masters is None else  # FP32 masters
                             masters[offset:offset + size].reshape(tuple(p.shape)))
                    p.copy_(_from_numpy(value, p.dtype))
                    p.grad = None
                    held = self.optimizer.state[p]
                    for s, flat in whole.items():
                        held[s] = _from_numpy(flat[offset:offset + size].reshape(tuple(p.shape)), p.dtype)
                    if spec.kind is not OptimizerKind.SGD:
                        held["step"] = torch.tensor(float(self.steps), dtype=torch.float32)
                    offset += size
        mark_stepped(self.optimizer)


__all__ = ["ZeroOneTrainStep"]
