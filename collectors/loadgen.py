"""``neuron-profile run``: keep simulated NeuronCores busy for a while (demos, neuron-top, monitor tests).

    neuron-profile run --workload bert-layer --duration 30
    neuron-profile run --workload llama-decode --preset llama2-7b --instance inf2.48xlarge --tp 8 \\
        --replicas 3 --utilisation 0.6 --duration 0      # until Ctrl-C

Each replica (a core, or a tensor-parallel group of ``--tp`` cores) executes the workload again and
again; the process publishes its live state like any process running models (``collectors.live``),
so ``neuron-top`` and ``neuron-monitor`` show it. Device time is simulated, so the loop paces itself:
after each round it sleeps until the wall clock has advanced by the round's device time divided by
``--utilisation`` (a round that took longer to simulate than that is not slowed further). Timing-only
by default: numerics would make rounds slow for no visible gain.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console

from collectors.capture import CaptureError, _overrides


def _load(args: argparse.Namespace) -> tuple[list[Any], str]:
    from neuroncore.compiler import compile as compile_graph
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.parallel.group import check_placement, check_slowdown, parse_slowdown
    from neuroncore.parallel.sharding import shard
    from neuroncore.runtime import Instance
    from neuroncore.topology import instance_topology
    from neuroncore.workloads import get

    workload = get(args.workload)
    overrides = _overrides(args.set)
    if args.rank_slowdown and args.tp < 2:
        raise ValueError("--rank-slowdown needs a tensor-parallel group (--tp 2 or more)")
    if args.tp > 1 and "tp_degree" in workload.defaults:
        overrides["tp_degree"] = args.tp
    graph = workload.graph(args.preset, **overrides)
    instance = Instance(args.instance)
    topology = instance_topology(instance.name)
    check_placement(topology, args.tp, args.core, args.replicas)
    if args.tp > 1:
        sharded = shard(graph, args.tp)
        program = compile_graph(sharded.local, instance.spec.chip.core)
        slowdown = check_slowdown(parse_slowdown(args.rank_slowdown or []), args.tp)
        replicas: list[Any] = [
            TensorParallelModel(sharded, program, instance, first_rank=args.core + k * args.tp,
                                topology=topology,
                                rank_slowdown=slowdown)
            for k in range(args.replicas)]
    else:
        program = compile_graph(graph, instance.spec.chip.core)
        replicas = [instance.core(topology.physical_cores_of(args.core + k)[0]).load(program)
                    for k in range(args.replicas)]
    return replicas, instance.name


def run_load(args: argparse.Namespace, console: Console) -> dict[str, float]:
    """Execute until ``args.duration`` seconds pass (0: until interrupted); returns the totals."""
    from neuroncore.workloads import random_inputs

    replicas, instance = _load(args)
    inputs = None
    if args.numerics:
        first = replicas[0]
        graph = first.sharded.full if hasattr(first, "sharded") else first.program.graph
        inputs = random_inputs(graph, seed=args.seed)
    started = time.monotonic()
    rounds = executions = 0
    device_ns = 0.0
    deadline = started + args.duration if args.duration > 0 else float("inf")
    with console.status(f"running {args.workload} on {instance}") as status:
        try:
            while time.monotonic() < deadline:
                round_start = time.monotonic()
                longest = 0
                for replica in replicas:
                    result = replica.execute(inputs, timing_only=not args.numerics)
                    longest = max(longest, result.device_time_ns)
                    executions += 1
                device_ns += longest
                rounds += 1
                pause = longest * 1e-9 / args.utilisation - (time.monotonic() - round_start)
                if pause > 0:
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                elapsed = time.monotonic() - started
                status.update(f"{args.workload} on {instance}: {executions:,} executions in {elapsed:,.1f} s "
                              f"(device busy {100 * min(1.0, device_ns * 1e-9 / elapsed):.0f}%)")
        except KeyboardInterrupt:
            pass
    elapsed = time.monotonic() - started
    return {"executions": executions, "rounds": rounds, "seconds": elapsed,
            "device_busy": min(1.0, device_ns * 1e-9 / elapsed) if elapsed else 0.0}


class RunCommand:
    """``neuron-profile run``: a load generator."""

    name = "run"
    help = "keep simulated NeuronCores busy with a built-in workload (for neuron-top / neuron-monitor)"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from neuroncore.hardware import INSTANCE_TYPES
        from neuroncore.workloads import WORKLOADS

        parser.add_argument("--workload", "-w", required=True, choices=sorted(WORKLOADS))
        parser.add_argument("--preset", help="workload preset, e.g. llama2-7b")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="workload option (repeatable)")
        parser.add_argument("--instance", choices=sorted(INSTANCE_TYPES))
        parser.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree")
        parser.add_argument("--rank-slowdown", action="append", metavar="RANK=FACTOR",
                            help="make rank RANK of each tensor-parallel group FACTOR x slower (repeatable)")
        parser.add_argument("--replicas", type=int, default=1, metavar="K",
                            help="copies on consecutive cores (data parallel)")
        parser.add_argument("--core", type=int, default=0, help="first core")
        parser.add_argument("--duration", type=float, default=10.0, metavar="S",
                            help="seconds to run (0: until Ctrl-C; default 10)")
        parser.add_argument("--utilisation", type=float, default=1.0, metavar="U",
                            help="target device busy fraction, in (0, 1] (default 1)")
        parser.add_argument("--numerics", action="store_true", help="compute outputs too (slower)")
        parser.add_argument("--seed", type=int, default=0)

    def run(self, args: argparse.Namespace) -> int:
        if not 0 < args.utilisation <= 1:
            raise CaptureError(f"--utilisation must be in (0, 1], not {args.utilisation}")
        if args.duration < 0:
            raise CaptureError(f"--duration must be 0 (until Ctrl-C) or positive, not {args.duration}")
        for name in ("tp", "replicas"):
            if getattr(args, name) < 1:
                raise CaptureError(f"--{name} must be at least 1")
        totals = run_load(args, Console(stderr=True))
        print(f"ran {args.workload}: {totals['executions']:,} executions in {totals['seconds']:.1f} s, "
              f"device busy {100 * totals['device_busy']:.0f}%")
        return 0


__all__ = ["RunCommand", "run_load"]
