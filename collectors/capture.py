"""``neuron-profile capture``: run a built-in workload, or wrap any program, and record its profiles.

    neuron-profile capture --workload bert-layer -o out/bert
    neuron-profile capture --workload llama-decode --preset llama2-7b --instance inf2.48xlarge --tp 24 \\
        --timing-only -o out/llama
    neuron-profile capture -o out/mine -- python my_script.py --steps 3

Output: ``DIR/device/model=<m>/core=<c>/execution=<k>/`` (one device profile per profiled execution,
per core; a dataset the query layer reads whole) and ``DIR/system/`` (the system profile). Only each
model's ``--profile-nth-exec``-th execution per core is profiled (default 2: the first run pays
warm-up costs, as the real tool's guide says), so workloads run ``--num-exec`` times (default 2).

A wrapped program records through the env-var handshake of ``collectors.autoprofile``: nothing in
it changes. The wrapper samples the host while the program runs and folds the program's runtime
events into the system profile. Ctrl-C stops the program; what was recorded is kept, flagged
incomplete.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from collectors import autoprofile
from collectors.device_profile import CapturedProfile, profile
from collectors.system import system_profile

EXIT_OK, EXIT_BAD_INPUT = 0, 2


class CaptureError(ValueError):
    """Bad capture arguments or a capture that cannot run (one line for the user)."""


@dataclass
class CaptureResult:
    """What a capture produced, for the closing summary."""

    out_dir: Path
    device_profiles: list[Path]
    system_profile: Path | None
    lines: list[str]
    exit_code: int = 0


def _overrides(pairs: list[str]) -> dict[str, object]:
    from neuroncore.workloads import parse_overrides

    try:
        return parse_overrides(pairs)
    except ValueError as exc:
        raise CaptureError(str(exc)) from None


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn(
        "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console, transient=True)


def _prepare_output(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            raise CaptureError(f"{out} exists and is not empty; choose another -o or pass --force")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def capture_workload(args: argparse.Namespace, console: Console) -> CaptureResult:
    """Compile a built-in workload, run it ``num_exec`` times under the collectors."""
    from neuroncore.compiler import compile as compile_graph
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.runtime import Instance
    from neuroncore.runtime.summary import summarize
    from neuroncore.workloads import get, random_inputs

    workload = get(args.workload)
    overrides = _overrides(args.set)
    if args.dtype:
        overrides["dtype"] = args.dtype
    if args.tp > 1 and "tp_degree" in workload.defaults:
        overrides["tp_degree"] = args.tp
    options = workload.options(args.preset, **overrides)
    graph = workload.build(**options)
    instance = Instance(args.instance)
    out = Path(args.output)
    _prepare_output(out, args.force)
    results: list[Any] = []
    profiles: list[CapturedProfile] = []
    with contextlib.ExitStack() as stack:
        if not args.system_only:
            device = stack.enter_context(profile(out / "device", nth_exec=args.profile_nth_exec))
        if not args.device_only:
            stack.enter_context(system_profile(out / "system", interval_s=args.system_interval))
        with _progress(console) as progress:
            task = progress.add_task(f"compiling {workload.name}", total=args.num_exec)
            if args.tp > 1:
                runner: Any = TensorParallelModel.load(graph, instance, tp_degree=args.tp,
                                                       first_rank=args.core)
            else:
                runner = instance.core(args.core).load(compile_graph(graph, instance.spec.chip.core))
            inputs = None if args.timing_only else random_inputs(graph, seed=args.seed)
            progress.update(task, description=f"executing {workload.name}")
            for _ in range(args.num_exec):
                results.append(runner.execute(inputs, timing_only=args.timing_only))
                progress.advance(task)
    if not args.system_only:
        profiles = device.profiles
    chosen = results[min(len(results), max(args.profile_nth_exec, 1)) - 1]
    rank0 = chosen.ranks[0] if hasattr(chosen, "ranks") else chosen
    summary = summarize(rank0)
    busiest = max(summary.engines, key=lambda e: e.active_ns)
    total = summary.device_time_ns or 1
    where = (f"cores {args.core}..{args.core + args.tp - 1} (tp {args.tp})" if args.tp > 1
             else f"core {args.core}")
    lines = [
        f"captured {workload.name}{f' ({args.preset})' if args.preset else ''} on {instance.name} {where}: "
        f"{len(results)} executions, profiled execution {args.profile_nth_exec or 'none'}",
        f"device time {summary.device_time_ns / 1e3:,.1f} us; {rank0.program.n_instructions:,} instructions, "
        f"{summary.dma_transfers:,} DMA transfers, {summary.hbm_bytes / 1e6:,.1f} MB HBM traffic",
        f"busiest engine {busiest.name} {100 * busiest.active_ns / total:.1f}% active; "
        f"DMA {100 * summary.dma_active_ns / total:.1f}% active; MFU {100 * summary.mfu:.1f}%",
        (f"collectives: {summary.collectives} on the CC-core, {summary.collective_ns / 1e3:,.1f} us "
         f"({100 * summary.collective_ns / total:.1f}% of the step)") if summary.collectives else
        f"spill/reload {summary.spill_bytes / 1e6:,.1f} MB; no collectives",
        f"{len(profiles)} device profile(s) in {out / 'device'}" + ("" if args.device_only else
                                                                   f"; system profile in {out / 'system'}"),
    ]
    return CaptureResult(out, [p.path for p in profiles], None if args.device_only else out / "system",
                         lines)


def capture_command(args: argparse.Namespace, console: Console) -> CaptureResult:
    """Run ``args.command`` with the handshake variables set; sample the host meanwhile."""
    command = [c for c in args.command if c != "--"] if args.command else []
    if not command:
        raise CaptureError("nothing to run: give --workload NAME or a command after --")
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        raise CaptureError(f"command not found: {command[0]}")
    out = Path(args.output)
    _prepare_output(out, args.force)
    env = dict(os.environ)
    events_file = Path(tempfile.mkstemp(prefix=".events-", suffix=".jsonl", dir=out)[1])
    if not args.system_only:
        env[autoprofile.PROFILE_DIR] = str((out / "device").resolve())
        env[autoprofile.NTH_EXEC] = str(args.profile_nth_exec)
    if not args.device_only:
        env[autoprofile.EVENTS_FILE] = str(events_file.resolve())
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        system = None if args.device_only else stack.enter_context(
            system_profile(out / "system", interval_s=args.system_interval))
        with _progress(console) as progress:
            progress.add_task(f"running {' '.join(command)[:60]}", total=None)
            child = subprocess.Popen(command, env=env)
            try:
                code = child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=10)
                if child.poll() is None:
                    child.kill()
                raise
        if system is not None and events_file.exists() and events_file.stat().st_size:
            system.add_events(events_file)
    events_file.unlink(missing_ok=True)
    device_dirs = sorted(p.parent for p in (out / "device").rglob("Metadata.parquet")) \
        if (out / "device").exists() else []
    incomplete = sorted((out / "device").rglob("*.incomplete")) if (out / "device").exists() else []
    lines = [
        f"ran {' '.join(command)[:80]} in {time.monotonic() - started:.1f} s: exit code {code}",
        f"{len(device_dirs)} device profile(s) in {out / 'device'}"
        + (f" ({len(incomplete)} incomplete)" if incomplete else ""),
        f"profiled each model's execution {args.profile_nth_exec} per core" if not args.system_only
        else "device profiling off (--system-only)",
        "system profile in " + str(out / "system") if not args.device_only else "system profiling off "
        "(--device-only)",
        "no device profile: did the program run fewer executions than --profile-nth-exec?"
        if not device_dirs and not args.system_only else f"open with: neuron-profile view {out / 'device'}",
    ]
    return CaptureResult(out, device_dirs, None if args.device_only else out / "system", lines, code)


class CaptureCommand:
    """``neuron-profile capture``."""

    name = "capture"
    help = "run a built-in workload or any program and record device and system profiles"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from neuroncore.hardware import INSTANCE_TYPES
        from neuroncore.workloads import WORKLOADS

        parser.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
        parser.add_argument("--workload", "-w", choices=sorted(WORKLOADS), help="built-in workload to run")
        parser.add_argument("--preset", help="workload preset, e.g. llama2-7b")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="workload option (repeatable)")
        parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"])
        parser.add_argument("--instance", choices=sorted(INSTANCE_TYPES),
                            help="instance type (default: NEURONSCOPE_INSTANCE or config)")
        parser.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree")
        parser.add_argument("--core", type=int, default=0, help="first core")
        parser.add_argument("--timing-only", action="store_true", help="no numerics, no weights")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--num-exec", type=int, default=2, help="executions of a workload (default 2)")
        parser.add_argument("--profile-nth-exec", type=int, default=2, metavar="N",
                            help="profile only each model's Nth execution per core (default 2: skip "
                                 "warm-up; 0: none)")
        only = parser.add_mutually_exclusive_group()
        only.add_argument("--system-only", action="store_true", help="record only the system profile")
        only.add_argument("--device-only", action="store_true", help="record only device profiles")
        parser.add_argument("--system-interval", type=float, default=0.1, metavar="S",
                            help="host sampling period in seconds (default 0.1)")
        parser.add_argument("--force", action="store_true", help="replace a non-empty output directory")
        parser.add_argument("command", nargs=argparse.REMAINDER,
                            help="-- PROGRAM ARGS...: wrap any program instead of a workload")

    def run(self, args: argparse.Namespace) -> int:
        console = Console(stderr=True)
        for name in ("num_exec", "tp"):
            if getattr(args, name) < 1:
                raise CaptureError(f"--{name.replace('_', '-')} must be at least 1")
        if args.profile_nth_exec < 0:
            raise CaptureError("--profile-nth-exec must be 0 (none) or a positive execution number")
        if not args.system_interval > 0:
            raise CaptureError("--system-interval must be positive")
        command = [c for c in args.command if c != "--"]
        if args.workload and command:
            raise CaptureError("give either --workload or a command after --, not both")
        if args.workload:
            if args.profile_nth_exec > args.num_exec:
                raise CaptureError(f"--profile-nth-exec {args.profile_nth_exec} is beyond --num-exec "
                                   f"{args.num_exec}: nothing would be profiled")
            result = capture_workload(args, console)
        else:
            result = capture_command(args, console)
        out = Console()
        for line in result.lines:
            out.print(line, highlight=False, soft_wrap=True)
        print(result.out_dir)
        return result.exit_code


__all__ = ["CaptureCommand", "CaptureError", "CaptureResult", "capture_command", "capture_workload"]

