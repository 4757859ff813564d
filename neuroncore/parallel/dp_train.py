"""Data-parallel training with real numerics: a PyTorch training step on ``replicas`` cores, each on
its shard of the batch, gradients averaged by an all-reduce between backward and optimizer.

    step = DataParallelTrainStep(model, optimizer, (x_shard, y_shard), replicas=4, loss_fn=F.mse_loss)
    loss = step(x, y)        # x: replicas x the traced shard along dim 0; returns the mean loss

Each rank's program is the traced step (``neuroncore.training.TrainStep``) with one all-reduce per
gradient (group ``dp``) and a 1/replicas scale before the update, as DDP averages gradients. The
ranks run in their own threads; each all-reduce waits for every rank's gradient and sums them in
rank order in FP32 (the same rendezvous as tensor-parallel inference). The parameters stay identical
on every rank, so one resident state serves them all. With a mean loss and equal shards the result
equals a single core's step on the whole batch -- the check ``tests/training`` makes.

Each step is then timed and recorded on every rank's core, as ZeRO-1's are: the ranks start
together, each gradient all-reduce takes its duration from ``neuroncore.collectives`` over the
replicas on the instance topology, so ``neuron-profile capture`` holds one profile per rank and
``last_results`` the device times (before, the step computed numerics only: a capture of a
data-parallel script said the program ran no compiled model).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from neuroncore.collectives.record import CollectiveRecord
from neuroncore.frontends.torch_frontend import _to_numpy
from neuroncore.ir.graph import Op
from neuroncore.ir.reference import bind_inputs
from neuroncore.parallel.group import timed_collectives
from neuroncore.parallel.held_cores import cores_held, placed_at
from neuroncore.parallel.rank_threads import run_ranks
from neuroncore.parallel.training import PlanError
from neuroncore.runtime.device import ExecutionResult, LoadedModel
from neuroncore.runtime.scheduler import schedule
from neuroncore.topology import instance_topology
from neuroncore.training.optimizers import host_scalars
from neuroncore.training.precision import Precision, parse_precision
from neuroncore.training.step_records import emit_step
from neuroncore.training.torch_step import ProgramKind, StepInputs, TrainStep, _caller_frames


class _Rendezvous:
    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks)
        self.slots: list[np.ndarray | None] = [None] * ranks

    def for_rank(self, rank: int) -> Callable[[Op, np.ndarray], np.ndarray]:
        def exchange(op: Op, value: np.ndarray) -> np.ndarray:
            if op.opcode != "all-reduce":
                raise PlanError(f"{op.opcode} is not a data-parallel gradient collective")
            self.slots[rank] = np.asarray(value, np.float32)
            self.barrier.wait()
            total = np.zeros_like(self.slots[0])
            for part in self.slots:
                total = total + part
            self.barrier.wait()
            return total
        return exchange


class DataParallelTrainStep(TrainStep):
    """A training step replicated on ``replicas`` cores with gradient all-reduce (DDP)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: StepInputs, *, replicas: int,
                 loss_fn: Callable[..., Any] | None = None, precision: str = "fp32",
                 instance: str | None = "trn1.32xlarge") -> None:
        if not isinstance(replicas, int) or replicas < 1:
            raise PlanError(f"replicas must be a positive integer, not {replicas!r}")
        self.replicas = replicas
        super().__init__(model, optimizer, example_inputs, loss_fn=loss_fn,
                         precision=parse_precision(precision), accumulation_steps=1, instance=instance,
                         core=0, frames=_caller_frames())
        if replicas > len(self.instance.cores):
            raise PlanError(f"{replicas} replicas do not fit {self.instance.name}")
        program, _, _ = self.programs[ProgramKind.UPDATE]
        self.rank_models = [self.programs[ProgramKind.UPDATE][1]] + [
            self.instance.core(r).load(program) for r in range(1, replicas)]
        self.topology = instance_topology(self.instance.name, nodes=self.instance.nodes)
        self._timing = self._costs(self.rank_models[0])  # every rank runs the same program
        self.rank_results: list[list[ExecutionResult]] = [[] for _ in range(replicas)]

    def _costs(self, loaded: LoadedModel) -> tuple[np.ndarray, list[tuple[int, CollectiveRecord]]]:
        return timed_collectives(loaded.program, self.topology, self.replicas)

    def _reduce_gradients(self, b: Any, grads: list[Op]) -> list[Op]:
        out = []
        for i, grad in enumerate(grads):
            with b.located(f"model/gradient_sync/{self._module_of(i)}", self._frames):
                summed = b.add_op("all-reduce", [grad], grad.shape, grad.dtype, reduction="sum",
                                  group="dp", name=f"all-reduce.{b.n_ops}")
                out.append(b.multiply(summed, 1.0 / self.replicas))
        return out

    def __call__(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """One step: ``inputs`` hold ``replicas`` shards along dim 0; returns the mean loss."""
        inputs = self.positional(inputs, named)
        shards = [[x[r * s[0]:(r + 1) * s[0]] for x, s in zip(inputs, self.example_shapes)]
                  for r in range(self.replicas)]
        for x, s in zip(inputs, self.example_shapes):
            if tuple(x.shape) != (s[0] * self.replicas, *s[1:]):
                raise PlanError(f"{self.name} data-parallel step: input of shape "
                                f"{[s[0] * self.replicas, *s[1:]]} expected, got {list(x.shape)}")
        self.steps += 1
        host_start = time.time_ns()
        program, _, layout = self.programs[ProgramKind.UPDATE]
        rendezvous = _Rendezvous(self.replicas)
        outputs: list[list[np.ndarray] | None] = [None] * self.replicas

        def run(rank: int) -> None:
            host = {f"input/{j}": _to_numpy(x) for j, x in enumerate(shards[rank])}
            for g, group in enumerate(self.groups):
                host[f"scalars/{g}"] = host_scalars(group.spec, group.torch_group, self.steps)
            host.update(self.rng_state(layout.inputs, rank))
            arrays = bind_inputs(program.graph, self.state.inputs(layout.inputs, host))
            outputs[rank] = self.rank_models[rank].compute(arrays, rendezvous.for_rank(rank))

        run_ranks(self.replicas, run, rendezvous.barrier, "dp")
        self.advance_rng()
        done = [o for o in outputs if o is not None]
        self.rank_outputs = done
        self._record(done, host_start)
        first = inputs[0]
        seq = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else 0
        emit_step(self.rank_models[0], self.last_results, step=self.steps,
                  global_batch=int(first.shape[0]) if first.dim() else self.replicas, seq=seq,
                  name=self.name, bf16=self.precision is not Precision.FP32, host_start_ns=host_start,
                  dp=self.replicas)
        self.state.update(dict(zip(layout.outputs[1:], done[0][1:])))
        self._sync_host()
        losses = [float(np.asarray(o[0]).reshape(-1)[0]) for o in done]
        return torch.tensor(sum(losses) / len(losses), dtype=torch.float32)


    def _record(self, outputs: list[list[np.ndarray]], host_start_ns: int) -> None:
        """Time and record the step's execution on every replica's core (they start together,
        from the latest of their clocks)."""
        with cores_held([m.core for m in self.rank_models]) as t0:
            pass  # each record takes its own core
        costs, templates = self._timing
        self.rank_results = []
        for rank, loaded in enumerate(self.rank_models):
            timeline = schedule(loaded.program, float(t0), costs)
            placed = placed_at(timeline, templates)
            self.rank_results.append([loaded.record(t0, timeline, outputs[rank], False, placed,
                                                    host_start_ns=host_start_ns)])
        self.last_results = self.rank_results[0]


__all__ = ["DataParallelTrainStep"]
