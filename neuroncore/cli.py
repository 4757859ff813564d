"""``neuroncore``: compile and run a built-in workload on the execution core, print its timing.

    neuroncore run --workload bert-layer
    neuroncore run --workload llama-decode --preset llama2-7b --timing-only
    neuroncore run --workload llama-decode --preset llama2-70b --instance trn1.32xlarge --tp 32 --timing-only
    neuroncore run --workload matmul --set m=4096 --set k=8192 --set n=8192 --timing-only
    neuroncore run --workload llama-train --preset llama2-7b --nodes 16 --tp 8 --zero1 --set seq=4096 \
        --set global_batch=1024
    neuroncore run --workload matmul --dtype fp32 --auto-cast-type fp8_e4m3 --instance trn2.48xlarge
    neuroncore run --workload llama-decode --preset llama2-7b --quantize int8-weight-only --timing-only
    neuroncore workloads
    neuroncore check my_model.py:build    # unsupported ops of a PyTorch module / JAX function

Errors print one line and exit non-zero; tracebacks are for bugs, not for bad input.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from neuronscope.cli_kit import CliError, OneLineParser, add_instance_option, chosen_command, run_command

if TYPE_CHECKING:
    from neuroncore.compiler.options import CompilerOptions
    from neuroncore.ir.graph import Graph

# the compiler, runtime and workloads are imported by the subcommand that uses them (and its parser):
# ``neuroncore --help`` costs this module, rich and argparse only


def cmd_train(args: argparse.Namespace, console: Console) -> int:
    """A training workload: one rank's programs simulated, the step composed over the layout."""
    from neuroncore.parallel.training import overlap_fraction, time_training_step
    from neuroncore.workloads import parse_overrides
    from neuroncore.workloads.training import get_train

    overrides = parse_overrides(args.set)
    for name in ("tp", "pp", "dp", "nodes"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.zero1:
        overrides["zero1"] = True
    if args.instance:
        overrides["instance"] = args.instance
    model, plan = get_train(args.workload).configure(args.preset, **overrides)
    step = time_training_step(model, plan)
    console.print(f"[bold]{args.workload}[/] {model.name}: {model.params() / 1e9:.3f} B parameters on "
                  f"{plan.nodes}x {plan.instance} (tp {plan.tp}, pp {plan.pp}, dp {plan.dp}"
                  f"{', ZeRO-1' if plan.zero1 else ''}), seq {plan.seq}, micro-batch {plan.micro_batch}, "
                  f"global batch {plan.global_batch} ({plan.micro_batches} micro-batches per rank), "
                  f"{plan.precision}; timing only")
    table = Table(title=f"training step {step.step_ns / 1e6:,.1f} ms (simulated in {step.sim_wall_s:.1f} s)")
    for column in ("level", "ms", "share"):
        table.add_column(column, justify="left" if column == "level" else "right")
    for level, ns in step.parts.items():
        table.add_row(level, f"{ns / 1e6:,.2f}", f"{100 * ns / step.step_ns:.1f}%")
    console.print(table)
    per = ", ".join(f"{p.name} {p.device_ns / 1e6:,.2f} ms" for p in
                    (step.forward_layer, step.backward_layer, step.head, step.optimizer))
    tp_ms = (step.forward_layer.collective_ns + step.backward_layer.collective_ns) / 1e6
    console.print(f"one rank's programs: {per} (a layer's forward + backward include {tp_ms:,.2f} ms "
                  f"of tensor-parallel collectives)")
    if step.sync:
        console.print(f"gradient synchronisation: {len(step.sync)} collectives, "
                      f"{step.sync_total_ns / 1e6:,.2f} ms, {100 * overlap_fraction(step.sync):.0f}% "
                      f"overlapped with the backward")
    console.print(f"model FLOPs per step {step.model_flops:.3e} over {plan.world} ranks "
                  f"(throughput and MFU: neuron-profile capture, or bench/train.py)")
    return 0


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    from neuroncore.cli_options import disable_power_throttling, precision_options
    from neuroncore.compiler import compile  # noqa: A004
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.parallel.group import parse_slowdown
    from neuroncore.runtime import Instance
    from neuroncore.runtime.timing_summary import summarize
    from neuroncore.workloads import get, parse_overrides, random_inputs
    from neuroncore.workloads.training import TRAIN_WORKLOADS

    if args.workload in TRAIN_WORKLOADS:
        if args.rank_slowdown:
            raise ValueError("--rank-slowdown applies to tensor-parallel inference workloads")
        if (args.auto_cast or args.auto_cast_type or args.quantize or args.prefetch_weights
                or args.fp8_matmuls or args.no_power_throttling):
            raise ValueError("--auto-cast, --auto-cast-type, --quantize, --prefetch-weights, "
                             "--fp8-matmuls and --no-power-throttling apply to inference workloads; "
                             "training workloads set their precision with --set precision=...")
        return cmd_train(args, console)
    for name in ("pp", "dp", "nodes"):
        if getattr(args, name) is not None:
            raise ValueError(f"--{name} applies to training workloads ({', '.join(sorted(TRAIN_WORKLOADS))})")
    if args.zero1:
        raise ValueError("--zero1 applies to training workloads")
    if args.tp is None:
        args.tp = 1
    workload = get(args.workload)
    overrides = parse_overrides(args.set)
    if args.dtype:
        overrides["dtype"] = args.dtype
    if args.tp < 1:
        raise ValueError(f"--tp must be a positive number of cores, not {args.tp}")
    if args.rank_slowdown and args.tp < 2:
        raise ValueError("--rank-slowdown needs a tensor-parallel group (--tp 2 or more)")
    if args.tp > 1 and "tp_degree" in workload.defaults:
        overrides["tp_degree"] = args.tp  # lay heads out for the ranks (padding, KV replication)
    compiler_options = precision_options(args)
    options = workload.options(args.preset, **overrides)
    graph = workload.build(**options)
    instance = Instance(args.instance)
    if args.no_power_throttling:
        disable_power_throttling(instance)
    t = time.perf_counter()
    group = None
    if args.tp > 1:
        group = TensorParallelModel.load(graph, instance, tp_degree=args.tp, first_rank=args.core,
                                         rank_slowdown=parse_slowdown(args.rank_slowdown or []),
                                         options=compiler_options)
        program = group.program
    else:
        program = compile(graph, instance.spec.chip.core, compiler_options)
    compile_s = time.perf_counter() - t
    inputs = None if args.timing_only else random_inputs(graph, seed=args.seed)
    t = time.perf_counter()
    if group is not None:
        grouped = group.execute(inputs, timing_only=args.timing_only)
        result = grouped.ranks[0]
        result.outputs = grouped.outputs
    else:
        result = instance.core(args.core).load(program).execute(inputs, timing_only=args.timing_only)
    run_s = time.perf_counter() - t
    summary = summarize(result)
    total = summary.device_time_ns
    opts = ", ".join(f"{k}={v}" for k, v in options.items())
    if not compiler_options.precision_is_default:
        opts += (f"; auto-cast {compiler_options.auto_cast.value} to "
                 f"{compiler_options.auto_cast_type.value}, quantize {compiler_options.quantize.value}")
    if compiler_options.fp8_matmuls:
        opts += "; matmuls in fp8_e4m3"
    if compiler_options.prefetch_weights:
        opts += "; weights prefetched a layer ahead"
    where = (f"cores {args.core}..{args.core + args.tp - 1} (tp {args.tp}; rank 0 shown)" if group
             else f"core {args.core}")
    unchanged = _options_change_nothing(graph, compiler_options)
    console.print(f"[bold]{workload.name}[/] ({opts}) on {instance.name} {where} "
                  f"[{program.spec.name}], {'timing only' if args.timing_only else 'numerics + timing'}")
    if unchanged:
        console.print(f"note: {unchanged}")
    console.print(f"compiled {program.n_instructions:,} instructions + {program.n_dma_transfers:,} DMA "
                  f"transfers in {compile_s:.2f} s; executed in {run_s:.2f} s (execution "
                  f"{result.execution_id})")
    table = Table(title=f"device time {total / 1e3:,.1f} us")
    for column in ("engine", "instructions", "active us", "active %", "semaphore wait us"):
        table.add_column(column, justify="right" if column != "engine" else "left")
    for row in summary.engines:
        table.add_row(row.name, f"{row.instructions:,}", f"{row.active_ns / 1e3:,.1f}",
                      f"{100 * row.utilisation(total):.1f}", f"{row.semaphore_wait_ns / 1e3:,.1f}")
    table.add_row("DMA", f"{summary.dma_transfers:,}", f"{summary.dma_active_ns / 1e3:,.1f}",
                  f"{100 * summary.dma_active_ns / total if total else 0:.1f}", "-")
    console.print(table)
    console.print(f"FLOPs {summary.flops:,}  MFU {100 * summary.mfu:.1f}%  HBM bytes {summary.hbm_bytes:,}"
                  f"  DMA {summary.dma_throughput_bytes_per_s / 1e9:,.1f} GB/s"
                  f"  spill/reload bytes {summary.spill_bytes:,}")
    throttled = result.timeline.throttle_start_ns
    if throttled.size:
        spent = int((result.timeline.throttle_end_ns - throttled).sum())
        spec = program.spec
        periods = "period" if throttled.size == 1 else "periods"
        console.print(f"power throttling: {throttled.size} {periods}, {spent / 1e3:,.1f} us; the matmuls ran "
                      f"{result.timeline.throttle_extra_ns / 1e3:,.1f} us longer (Tensor utilisation under "
                      f"{spec.throttle_utilisation:.0%} for {spec.throttle_window_ns / 1e3:g} us, then the "
                      f"next burst at {spec.throttle_rate:.0%})")
    if group is not None:
        console.print(f"collectives: {summary.collectives} on the CC-core, busy "
                      f"{summary.collective_ns / 1e3:,.1f} us ({100 * summary.collective_ns / total:.1f}%)"
                      if total else "collectives: none")
    if result.outputs is not None:
        shapes = ", ".join(f"{list(o.shape)} {o.dtype}" for o in result.outputs[:3])
        more = f" (+{len(result.outputs) - 3} more)" if len(result.outputs) > 3 else ""
        console.print(f"outputs: {shapes}{more}")
    return 0


def _load_target(spec: str) -> tuple[object, tuple | dict]:
    """``path/to/script.py[:function]``: the function (default ``build``) returns
    ``(model_or_function, example_inputs)``. The script is the user's own code, run as is."""
    path, _, function = spec.partition(":")
    function = function or "build"
    if not os.path.isfile(path):
        raise ValueError(f"no such script: {path}")
    try:
        namespace = runpy.run_path(path, run_name="__neuroncore_check__")
    except Exception as exc:  # the user's script: report its failure in one line
        raise ValueError(f"{path} failed to run: {type(exc).__name__}: {exc}") from exc
    if function not in namespace or not callable(namespace[function]):
        raise ValueError(f"{path} defines no function {function!r} returning (model, example_inputs)")
    try:
        result = namespace[function]()
    except Exception as exc:
        raise ValueError(f"{path}:{function}() failed: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError(f"{path}:{function}() must return (model_or_function, example_inputs)")
    model, examples = result
    if isinstance(examples, dict):  # keyword inputs (PyTorch): model(**examples)
        return model, examples
    return model, tuple(examples) if isinstance(examples, (list, tuple)) else (examples,)


def _print_table(console: Console, title: str, header: tuple[str, ...],
                 rows: list[tuple[str, ...]]) -> None:
    """A table on a terminal (cells wrap, never cut); plain aligned columns, every cell whole,
    when the output is a pipe or a file, whatever COLUMNS says."""
    if not console.is_terminal:
        print(title)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return
    table = Table(title=title)
    for column in header:
        table.add_column(column, overflow="fold")  # a narrow terminal wraps a cell, never cuts it
    for row in rows:
        table.add_row(*row)
    console.print(table)


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    """Operator coverage: every op the core cannot run (one line each: op, HLO name, layer,
    file:line), then the model's coverage table (every opcode, its count, supported or not).
    Exit 1 if anything is unsupported."""
    from neuroncore.frontends.tracing import coverage

    model, examples = _load_target(args.target)
    result = coverage(model, examples)
    frontend = result.frontend
    missing = result.unsupported
    if not missing:
        console.print(f"[green]all ops supported[/] ({frontend}): {args.target} can run on the core")
    else:
        title = f"{len(missing)} unsupported op{'s' if len(missing) != 1 else ''} ({frontend})"
        _print_table(console, title, ("op", "HLO name", "layer", "source"),
                     [(op.opcode, op.name, op.layer or "-", op.source) for op in missing])
    n_codes = sum(1 for r in result.rows if not r.supported)
    title = (f"coverage ({frontend}): {result.total} ops of {len(result.rows)} kinds, "
             f"{result.unsupported_count} unsupported ({n_codes} kind{'s' if n_codes != 1 else ''})")
    _print_table(console, title, ("op", "count", "status"),
                 [(r.opcode, str(r.count), "supported" if r.supported else "UNSUPPORTED")
                  for r in result.rows])
    return 1 if missing else 0


def cmd_workloads(args: argparse.Namespace, console: Console) -> int:
    from neuroncore.workloads import WORKLOADS

    table = Table(title="built-in workloads")
    for column in ("name", "description", "options", "presets"):
        table.add_column(column)
    for w in WORKLOADS.values():
        table.add_row(w.name, w.description, ", ".join(f"{k}={v}" for k, v in w.defaults.items()),
                      ", ".join(w.presets) or "-")
    from neuroncore.workloads.training import PLAN_DEFAULTS, TRAIN_WORKLOADS

    for t in TRAIN_WORKLOADS.values():
        options = dict(PLAN_DEFAULTS, **t.defaults)
        table.add_row(t.name, t.description, ", ".join(f"{k}={v}" for k, v in options.items()),
                      ", ".join(t.presets))
    console.print(table)
    return 0


def _options_change_nothing(graph: Graph, options: CompilerOptions) -> str | None:
    """Why the precision options leave ``graph`` as it is, or None when they change it: auto-cast
    rewrites FP32 ops only and int8 quantises 2-D matmul weights only,
    so on a bf16 workload (the default of most) ``--auto-cast-type tf32`` alone would otherwise time
    the same program without a word."""
    from neuroncore.compiler.options import AutoCast, Quantization
    from neuroncore.compiler.precision import apply_options

    if options.precision_is_default:
        return None
    rewritten = apply_options(graph, options)
    if len(rewritten.ops) != len(graph.ops) or any(
            a.dtype is not b.dtype for a, b in zip(rewritten.ops, graph.ops)):
        return None
    parts = []
    if options.auto_cast is not AutoCast.NONE:
        parts.append("auto-cast casts FP32 ops only (as neuronx-cc) and this workload has none "
                     "(--dtype fp32; --fp8-matmuls casts bf16/fp16 matmuls)")
    if options.quantize is not Quantization.NONE:
        parts.append("int8 weight-only quantises a matmul's 2-D weight and this workload's matmuls "
                     "read none")
    return "the precision options change nothing: " + "; ".join(parts)


def _run_options(run: argparse.ArgumentParser) -> None:
    from neuroncore.cli_options import add_power_throttling_option, add_precision_options
    from neuroncore.hardware import INSTANCE_TYPES
    from neuroncore.workloads import WORKLOADS
    from neuroncore.workloads.training import TRAIN_WORKLOADS

    run.add_argument("--workload", "-w", required=True, choices=sorted([*WORKLOADS, *TRAIN_WORKLOADS]))
    run.add_argument("--preset", help="named configuration, e.g. llama2-7b")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="workload option, e.g. --set layers=4 (repeatable)")
    run.add_argument("--dtype", choices=["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"],
                     help="the workload's own element type")
    add_precision_options(run)
    add_power_throttling_option(run)
    add_instance_option(run, "instance type (default: NEURONSCOPE_INSTANCE or config, else trn1.2xlarge)",
                        choices=sorted(INSTANCE_TYPES))
    run.add_argument("--core", type=int, default=0, help="first core (rank 0 with --tp)")
    run.add_argument("--tp", type=int, default=None, metavar="N",
                     help="tensor-parallel degree: shard Megatron-style over N cores")
    run.add_argument("--pp", type=int, metavar="N", help="pipeline stages (training workloads)")
    run.add_argument("--dp", type=int, metavar="N",
                     help="data-parallel replicas (training workloads; default: the remaining cores)")
    run.add_argument("--zero1", action="store_true", help="ZeRO-1 optimizer sharding (training workloads)")
    run.add_argument("--nodes", type=int, metavar="N", help="instances joined by EFA (training workloads)")
    run.add_argument("--rank-slowdown", action="append", metavar="RANK=FACTOR",
                     help="make rank RANK of the tensor-parallel group FACTOR x slower (its engine "
                          "instructions; repeatable, e.g. 1=2.0)")
    run.add_argument("--timing-only", action="store_true",
                     help="simulate timing from shapes only; weights are never allocated")
    run.add_argument("--seed", type=int, default=0)


def _check_options(chk: argparse.ArgumentParser) -> None:
    chk.add_argument("target", help="script.py[:function]; the function (default build) returns "
                                    "(model_or_function, example_inputs)")


class _Subcommand:
    """One ``neuroncore`` subcommand (``cli_kit.Command``): its options are added only when it is
    the one chosen, so ``neuroncore --help`` never imports the compiler or the workloads."""

    def __init__(self, name: str, summary: str, body: Callable[[argparse.Namespace, Console], int],
                 options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
        self.name = name
        self.help = summary
        self.body = body
        self.options = options

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        if self.options is not None:
            self.options(parser)

    def run(self, args: argparse.Namespace) -> int:
        return int(self.body(args, Console()))


COMMANDS = [
    _Subcommand("run", "compile and execute a built-in workload, print its timing", cmd_run, _run_options),
    _Subcommand("workloads", "list the built-in workloads", cmd_workloads),
    _Subcommand("check", "list the ops of a PyTorch/JAX model the core cannot run", cmd_check,
                _check_options),
]


def build_parser(prepare: str | bool | None = True) -> argparse.ArgumentParser:
    """The ``neuroncore`` parser (``prepare``: as ``cli_kit.command_parser``; True builds every
    subcommand's options)."""
    from neuronscope.cli_kit import command_parser

    return command_parser("neuroncore", __doc__.split("\n\n")[0], COMMANDS, OneLineParser, prepare)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(chosen_command(argv, COMMANDS)).parse_args(argv)
    from neuroncore.compiler.errors import CompileError
    from neuroncore.ir.builder import GraphError
    from neuroncore.runtime.interpreter import ExecutionError

    def body() -> int:
        try:
            return int(args.handler.run(args))
        except MemoryError:
            raise CliError("out of host memory; try --timing-only") from None

    return run_command("neuroncore", body, bad_input=(CompileError, GraphError, ExecutionError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
