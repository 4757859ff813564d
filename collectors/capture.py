"""``neuron-profile capture``: run a built-in workload, or wrap any program, and record its profiles.

    neuron-profile capture --workload bert-layer -o out/bert
    neuron-profile capture --workload llama-decode --preset llama2-7b --instance inf2.48xlarge --tp 24 \\
        --timing-only -o out/llama
    neuron-profile capture --workload llama-train --tp 2 --set seq=256 --set global_batch=64 -o out/train
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
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from collectors import autoprofile
from collectors.device_profile import CapturedProfile, RecordingError, profile
from collectors.system import SystemProfileCollector, system_profile
from formats import units
from formats.dataset import capture_state, find_profiles
from formats.reader import ProfileError
from neuroncore.cli_options import (
    add_power_throttling_option,
    add_precision_options,
    disable_power_throttling,
    precision_options,
)
from neuronscope import settings
from neuronscope.cli_kit import CliError

EXIT_OK, EXIT_BAD_INPUT = 0, 2
EXIT_RECORDING_FAILED = 3  # the program succeeded but a device profile could not be recorded whole


class CaptureError(CliError, ValueError):
    """Bad capture arguments or a capture that cannot run (one line for the user, exit 2)."""


@dataclass
class CaptureResult:
    """What a capture produced, for the closing summary."""

    out_dir: Path
    device_profiles: list[Path]
    system_profile: Path | None
    lines: list[str]
    exit_code: int = 0
    failure: str | None = None  # why a device profile is missing or incomplete (one line)
    stopped_by: int | None = None  # the signal that stopped the capture


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


RERUN_FILE = "rerun.json"
RERUN_FORMAT = "neuronscope-rerun/1"
# hardware facts a capture may scale (--scale-hardware FIELD=FACTOR): what-if studies of bandwidth,
# latency and clocks (neuroncore.hardware.CoreSpec field names)
SCALABLE_HARDWARE = ("hbm_bytes_per_s", "dma_engine_bytes_per_s", "dma_fixed_latency_ns", "pe_clock_hz",
                     "vector_clock_hz", "scalar_clock_hz", "gpsimd_clock_hz")


def parse_scaling(items: list[str] | None) -> dict[str, float]:
    """``["hbm_bytes_per_s=2"]`` -> ``{"hbm_bytes_per_s": 2.0}``; one-line CaptureError otherwise."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, factor = str(item).partition("=")
        try:
            value = float(factor)
        except ValueError:
            value = float("nan")
        if not sep or name not in SCALABLE_HARDWARE or not value > 0 or value == float("inf"):
            raise CaptureError(f"--scale-hardware takes FIELD=FACTOR with FIELD one of "
                               f"{', '.join(SCALABLE_HARDWARE)} and FACTOR > 0, not {item!r}")
        out[name] = value
    return out


def scale_hardware(instance: Any, factors: dict[str, float]) -> None:
    """Scale facts of every core of ``instance`` (and the spec programs are compiled for) in place."""
    if not factors:
        return
    from dataclasses import replace

    core = instance.spec.chip.core
    scaled = replace(core, **{name: getattr(core, name) * f for name, f in factors.items()})
    instance.spec = replace(instance.spec, chip=replace(instance.spec.chip, core=scaled))
    for c in instance.cores:
        c.spec = scaled


def compiler_options(args: argparse.Namespace) -> Any:
    """The ``CompilerOptions`` of a workload capture's flags (one-line CaptureError when refused)."""
    from neuroncore.compiler.options import OptionsError

    try:
        return precision_options(args)
    except OptionsError as exc:
        raise CaptureError(str(exc)) from None


def write_rerun(out: Path, args: argparse.Namespace, instance_name: str) -> Path:
    """``rerun.json`` beside the profiles: what re-running this capture needs (workload and options,
    never code or pickles), read by ``neuron-profile analyze --what-if`` (collectors/whatif.py)."""
    facts = {
        "format": RERUN_FORMAT, "workload": args.workload, "preset": args.preset, "set": list(args.set),
        "dtype": args.dtype, "instance": instance_name, "tp": args.tp, "core": args.core,
        "timing_only": bool(args.timing_only), "seed": args.seed, "num_exec": args.num_exec,
        "profile_nth_exec": args.profile_nth_exec, "rank_slowdown": list(args.rank_slowdown or []),
        "scale_hardware": list(getattr(args, "scale_hardware", None) or []),
        "power_throttling": not getattr(args, "no_power_throttling", False),
        "compiler_options": {"auto_cast": getattr(args, "auto_cast", None),
                             "auto_cast_type": getattr(args, "auto_cast_type", None),
                             "quantize": getattr(args, "quantize", None),
                             "prefetch_weights": bool(getattr(args, "prefetch_weights", False)),
                             "fp8_matmuls": bool(getattr(args, "fp8_matmuls", False))},
    }
    path = out / RERUN_FILE
    path.write_text(json.dumps(facts, indent=1) + "\n")
    return path

def capture_training(args: argparse.Namespace, console: Console) -> CaptureResult:
    """A training workload: rank 0's step program run ``num_exec`` times (steps) under the
    collectors; the profile has the step's levels, its collectives and its TrainingStep row."""
    from formats.figures import collective_overlap, training_step_figures
    from neuroncore.parallel.train_step import TrainingStepRun
    from neuroncore.parallel.training import PlanError
    from neuroncore.runtime import Instance
    from neuroncore.workloads.training import get_train

    overrides = _overrides(args.set)
    if args.tp > 1:
        overrides["tp"] = args.tp
    if args.instance:
        overrides["instance"] = args.instance
    if args.dtype:
        raise CaptureError("--dtype does not apply to training workloads; use --set precision=...")
    if (getattr(args, "rank_slowdown", None) or getattr(args, "scale_hardware", None)
            or getattr(args, "no_power_throttling", False) or not compiler_options(args).is_default):
        raise CaptureError("--rank-slowdown, --scale-hardware, --no-power-throttling, --auto-cast(-type), "
                           "--quantize, --prefetch-weights and --fp8-matmuls do not apply to training "
                           "workloads")
    try:
        model, plan = get_train(args.workload).configure(args.preset, **overrides)
    except PlanError as exc:
        raise CaptureError(str(exc)) from None
    out = Path(args.output)
    _prepare_output(out, args.force)
    profiles: list[CapturedProfile] = []
    steps: list[Any] = []
    with contextlib.ExitStack() as stack:
        if not args.system_only:
            device = stack.enter_context(profile(out / "device", nth_exec=args.profile_nth_exec))
        if not args.device_only:
            stack.enter_context(system_profile(out / "system", interval_s=args.system_interval))
        with _progress(console) as progress:
            task = progress.add_task(f"compiling {args.workload} step", total=args.num_exec)
            try:
                run = TrainingStepRun.load(model, plan, Instance(plan.instance, nodes=plan.nodes))
            except PlanError as exc:
                raise CaptureError(str(exc)) from None
            progress.update(task, description=f"training {model.name}")
            for _ in range(args.num_exec):
                steps.append((*run.execute(), run.step_time_ns))
                progress.advance(task)
    if not args.system_only:
        profiles = device.profiles
    _, rows, _, step_ns = steps[min(len(steps), max(args.profile_nth_exec, 1)) - 1]
    fig = training_step_figures(step_ns, plan.global_batch, plan.seq, run.step_flops,
                                plan.world, run.peak_flops_per_rank)
    dp_rows = [r for r in rows if r.group == "dp"]
    dp_ns = sum(r.end_ns - r.start_ns for r in dp_rows)
    overlap = collective_overlap([r.end_ns - r.start_ns for r in dp_rows], [r.overlap_ns for r in dp_rows])
    whose = "rank 0's program" if plan.pp == 1 else f"the programs of rank 0 of each of {plan.pp} stages"
    instructions = sum(st.program.n_instructions for st in run.stages)
    lines = [
        f"captured {args.workload} ({model.name}) {plan.key(model.name)}: {len(steps)} steps of {whose}, "
        f"profiled step {args.profile_nth_exec or 'none'}",
        f"step {units.fmt_ns(step_ns)}; {fig.seq_per_s:,.1f} seq/s; MFU {units.fmt_pct(fig.mfu)}; "
        f"{instructions:,} instructions",
        f"collectives: {len(rows)} ({len(dp_rows)} gradient synchronisation, "
        f"{units.fmt_ns(dp_ns)}, {units.fmt_pct(overlap)} overlapped with compute)",
        *([] if plan.pp == 1 else [
            f"pipeline: {plan.pp} stages, 1F1B over {plan.micro_batches} micro-batches, "
            f"{sum(r.group == 'pp' for r in rows)} sends/receives on stage 0, one profile per stage"]),
        f"{len(profiles)} device profile(s) in {out / 'device'}" + ("" if args.device_only else
                                                                   f"; system profile in {out / 'system'}"),
    ]
    return CaptureResult(out, [p.path for p in profiles], None if args.device_only else out / "system",
                         lines)


def capture_workload(args: argparse.Namespace, console: Console) -> CaptureResult:
    """Compile a built-in workload, run it ``num_exec`` times under the collectors."""
    from neuroncore.workloads.training import TRAIN_WORKLOADS

    if args.workload in TRAIN_WORKLOADS:
        return capture_training(args, console)
    from neuroncore.compiler import compile as compile_graph
    from neuroncore.parallel import TensorParallelModel
    from neuroncore.parallel.group import parse_slowdown
    from neuroncore.runtime import Instance
    from neuroncore.runtime.timing_summary import summarize
    from neuroncore.workloads import get, random_inputs

    workload = get(args.workload)
    overrides = _overrides(args.set)
    if args.dtype:
        overrides["dtype"] = args.dtype
    if args.rank_slowdown and args.tp < 2:
        raise ValueError("--rank-slowdown needs a tensor-parallel group (--tp 2 or more)")
    if args.tp > 1 and "tp_degree" in workload.defaults:
        overrides["tp_degree"] = args.tp
    options = workload.options(args.preset, **overrides)
    graph = workload.build(**options)
    compile_options = compiler_options(args)
    instance = Instance(args.instance)
    scale_hardware(instance, parse_scaling(getattr(args, "scale_hardware", None)))
    if getattr(args, "no_power_throttling", False):
        disable_power_throttling(instance)
    out = Path(args.output)
    _prepare_output(out, args.force)
    write_rerun(out, args, instance.name)
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
                runner: Any = TensorParallelModel.load(
                    graph, instance, tp_degree=args.tp, first_rank=args.core,
                    rank_slowdown=parse_slowdown(args.rank_slowdown or []), options=compile_options)
            else:
                runner = instance.core(args.core).load(
                    compile_graph(graph, instance.spec.chip.core, compile_options))
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
        f"device time {units.fmt_ns(summary.device_time_ns)}; {rank0.program.n_instructions:,} instructions, "
        f"{summary.dma_transfers:,} DMA transfers, {units.fmt_bytes(summary.hbm_bytes)} HBM traffic",
        f"busiest engine {busiest.name} {units.fmt_pct(busiest.active_ns / total)} active; "
        f"DMA {units.fmt_pct(summary.dma_active_ns / total)} active; MFU {units.fmt_pct(summary.mfu)}",
        (f"collectives: {summary.collectives} on the CC-core, {units.fmt_ns(summary.collective_ns)} "
         f"({units.fmt_pct(summary.collective_ns / total)} of the step)") if summary.collectives else
        f"spill/reload {units.fmt_bytes(summary.spill_bytes)}; no collectives",
        f"{len(profiles)} device profile(s) in {out / 'device'}" + ("" if args.device_only else
                                                                   f"; system profile in {out / 'system'}"),
    ]
    return CaptureResult(out, [p.path for p in profiles], None if args.device_only else out / "system",
                         lines)


# A terminal's Ctrl-C reaches the whole process group, the program included: the wrapper gives the
# program this long to stop on its own before forwarding the signal (a second SIGINT would interrupt
# the program's exit-time close); then, if it still runs after KILL_AFTER_S, it is killed.
FORWARD_AFTER_S = 1.0
KILL_AFTER_S = 60.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


def _run_child(command: list[str], env: dict[str, str], watch_fd: int) -> tuple[int, int | None]:
    """Run the program to its end: (its exit code as a shell reports it, the signal that asked the
    capture to stop or None). SIGINT, SIGTERM and SIGHUP sent to the wrapper are forwarded."""
    stop: list[int] = []
    previous: dict[signal.Signals, Any] = {}  # signal -> the handler it had
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, lambda s, _f: stop.append(s))
    try:
        child = subprocess.Popen(command, env=env, pass_fds=(watch_fd,))
        asked_at: float | None = None
        forwarded_at: float | None = None
        while True:
            try:
                code = child.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if stop and asked_at is None:
                asked_at = now
            if asked_at is not None and forwarded_at is None and now - asked_at >= FORWARD_AFTER_S:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(stop[0])
                forwarded_at = now
            elif forwarded_at is not None and now - forwarded_at >= KILL_AFTER_S:
                child.kill()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return (128 - code if code < 0 else code), (stop[0] if stop else None)


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
    status_file = (out / f".capture-status-{os.getpid()}.json").resolve()
    env[settings.CAPTURE_STATUS.name] = str(status_file)
    if not args.system_only:
        env[settings.PROFILE_DIR.name] = str((out / "device").resolve())
        env[settings.PROFILE_NTH_EXEC.name] = str(args.profile_nth_exec)
    system = None if args.device_only else SystemProfileCollector(out / "system",
                                                                  interval_s=args.system_interval)
    # the program's runtime events are written inside the system profile being recorded, so that
    # whatever happens to the wrapper they belong to it (folded in and removed when it finishes)
    events_file = None if system is None else system.writer.staging / autoprofile.EVENTS_NAME
    if events_file is not None:
        env[settings.EVENTS_FILE.name] = str(events_file.resolve())
    watch_read, watch_write = os.pipe()  # the program notices the wrapper's death by this pipe's EOF
    env[settings.WRAPPER_FD.name] = str(watch_read)
    started = time.monotonic()
    stopped_by: int | None = None
    try:
        if system is not None:
            system.start()
        with _progress(console) as progress:
            progress.add_task(f"running {' '.join(command)[:60]}", total=None)
            code, stopped_by = _run_child(command, env, watch_read)
    finally:
        os.close(watch_read)
        os.close(watch_write)
        if system is not None:
            with contextlib.suppress(Exception):
                if events_file is not None and events_file.exists() and events_file.stat().st_size:
                    system.add_events(events_file)
            if events_file is not None:
                events_file.unlink(missing_ok=True)
            if stopped_by is not None:
                system.abort(f"capture stopped by {_signal_name(stopped_by)}")
            elif sys.exc_info()[0] is not None:
                system.abort(f"capture failed: {sys.exc_info()[1]}")
            else:
                system.close()
    errors = _read_status(status_file)
    device = out / "device"
    entries = find_profiles(device, include_incomplete=True)[0] if device.exists() and any(
        device.iterdir()) and _has_profiles(device) else []
    states = [(entry.path, capture_state(entry.path)) for entry in entries]
    complete = [p for p, st in states if not st.incomplete]
    incomplete = [(p, st) for p, st in states if st.incomplete]
    warm = [(p, st) for p, st in states if st.warm_up]
    lines = [
        f"ran {' '.join(command)[:80]} in {time.monotonic() - started:.1f} s: exit code {code}"
        + (f" (capture stopped by {_signal_name(stopped_by)})" if stopped_by else ""),
        f"{len(complete) + len(incomplete)} device profile(s) in {device}"
        + (f" ({len(incomplete)} incomplete, kept as <dir>.incomplete)" if incomplete else ""),
        f"profiled each model's execution {args.profile_nth_exec} per core" if not args.system_only
        else "device profiling off (--system-only)",
        ("system profile in " + str(system.writer.path or out / "system")) if system is not None
        else "system profiling off (--device-only)",
    ]
    for path, state in warm:
        why = (f"the program ran this model only {state.execution} time(s), fewer than --profile-nth-exec "
               f"{args.profile_nth_exec}" if code == 0 and stopped_by is None else
               f"the program stopped (exit code {code}) after {state.execution} execution(s) of this model")
        lines.append(f"{path.relative_to(device)}: {why}: kept its last execution, marked as a warm-up "
                     f"execution in Metadata")
    if not states and not args.system_only:
        lines.append("no device profile: the program ran no compiled model" if code == 0 and not errors
                     else f"no device profile: the program stopped (exit code {code}) before a model ran")
    elif states:
        lines.append(f"open with: neuron-profile view {device}"
                     + (" --include-incomplete" if incomplete and not complete else ""))
    failure = None
    if errors:
        failure = errors[0]
    elif incomplete and stopped_by is None and code == 0:
        failure = f"device profile incomplete: {incomplete[0][1].reason or incomplete[0][0]}"
    exit_code = 128 + stopped_by if stopped_by is not None else code
    if failure is not None and exit_code == 0:
        exit_code = EXIT_RECORDING_FAILED
    result = CaptureResult(out, [p for p, _ in states], None if system is None else system.writer.path,
                           lines, exit_code)
    result.failure = failure
    result.stopped_by = stopped_by
    return result


def _has_profiles(root: Path) -> bool:
    try:
        find_profiles(root, include_incomplete=True)
        return True
    except ProfileError:
        return False


def _read_status(path: Path) -> list[str]:
    """The recording errors the program reported at exit (plain JSON, a list of lines); removed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    finally:
        path.unlink(missing_ok=True)
    errors = data.get("errors") if isinstance(data, dict) else None
    return [str(e) for e in errors if isinstance(e, str)] if isinstance(errors, list) else []


class CaptureStopped(BaseException):
    """SIGTERM/SIGHUP during a workload capture: unwinds like Ctrl-C, so the profiles are kept marked."""

    def __init__(self, signum: int) -> None:
        super().__init__(_signal_name(signum))
        self.signum = signum


@contextlib.contextmanager
def _stop_on(*signums: int) -> Any:
    """Turn ``signums`` into ``CaptureStopped`` for the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise CaptureStopped(signum)

    previous = {s: signal.signal(s, stop) for s in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class CaptureCommand:
    """``neuron-profile capture``."""

    name = "capture"
    help = "run a built-in workload or any program and record device and system profiles"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from neuroncore.hardware import INSTANCE_TYPES
        from neuroncore.workloads import WORKLOADS
        from neuroncore.workloads.training import TRAIN_WORKLOADS

        parser.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
        parser.add_argument("--workload", "-w", choices=sorted([*WORKLOADS, *TRAIN_WORKLOADS]),
                            help="built-in workload to run (a training workload: one step per execution)")
        parser.add_argument("--preset", help="workload preset, e.g. llama2-7b")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="workload option (repeatable)")
        parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"])
        parser.add_argument("--instance", choices=sorted(INSTANCE_TYPES),
                            help="instance type (default: NEURONSCOPE_INSTANCE or config)")
        parser.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree")
        parser.add_argument("--rank-slowdown", action="append", metavar="RANK=FACTOR",
                            help="make rank RANK of the tensor-parallel group FACTOR x slower (its engine "
                                 "instructions; repeatable, e.g. 1=2.0)")
        parser.add_argument("--core", type=int, default=0, help="first core")
        parser.add_argument("--scale-hardware", action="append", metavar="FIELD=FACTOR",
                            help="scale a hardware fact of the simulated cores (repeatable; what-if "
                                 "studies): " + ", ".join(SCALABLE_HARDWARE))
        add_precision_options(parser)
        add_power_throttling_option(parser)
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
            try:
                with _stop_on(signal.SIGTERM, signal.SIGHUP):
                    result = capture_workload(args, console)
            except CaptureStopped as stop:  # profiles were kept, marked incomplete, on the way out
                print(f"neuron-profile: interrupted ({_signal_name(stop.signum)}); what was recorded is "
                      f"kept (marked incomplete)", file=sys.stderr)
                return 128 + stop.signum
            except RecordingError as exc:  # kept, marked; the cause in one line
                print(f"neuron-profile: error: {exc}", file=sys.stderr)
                return EXIT_RECORDING_FAILED
        else:
            result = capture_command(args, console)
        out = Console()
        for line in result.lines:
            out.print(line, highlight=False, soft_wrap=True)
        print(result.out_dir, flush=True)
        if result.stopped_by is not None:
            print(f"neuron-profile: interrupted ({_signal_name(result.stopped_by)}); what was recorded is "
                  f"kept (marked incomplete)", file=sys.stderr)
        elif result.failure is not None:
            print(f"neuron-profile: error: {result.failure}", file=sys.stderr)
        return result.exit_code


__all__ = ["CaptureCommand", "CaptureError", "CaptureResult", "capture_command", "capture_workload"]

