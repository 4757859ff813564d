"""What-if by re-simulation: re-run a captured workload with one assumption changed, and compare.

    neuron-profile analyze out/bert/device --what-if dma-bandwidth=2 --what-if batch=2
    neuron-profile analyze out/bert/device --what-if auto     # the changes the findings point at

A capture of a built-in workload leaves ``rerun.json`` beside its profiles (``collectors.capture``:
workload name and options, instance, tp, hardware scaling -- JSON, never code or pickles). A what-if
is that capture again, with one change, through the same ``capture_workload`` (so its result *is* a
fresh ``neuron-profile capture`` with the changed option; the report prints that command), into a
temporary directory that is removed afterwards; both are analysed (``formats.analysis``) and
compared: device time before and after, the gain, and the critical path's shares after.

Changes (``--what-if NAME=VALUE``):

* ``dma-bandwidth=F``: each DMA engine's bandwidth x F (``--scale-hardware dma_engine_bytes_per_s=F``);
* ``hbm-bandwidth=F``: the core's HBM bandwidth x F (``--scale-hardware hbm_bytes_per_s=F``);
* ``dma-latency=F``: the per-transfer fixed DMA latency x F (``--scale-hardware dma_fixed_latency_ns=F``);
* ``tp=N``: tensor-parallel degree (``--tp N``); ``instance=NAME``: another instance type
  (``--instance NAME``); ``dtype=D``: the workload's dtype (``--dtype D``);
* ``power-throttling=off``: Trainium2 without its power throttling (``--no-power-throttling``);
* ``prefetch-weights=on``: compiled with each layer's weight loads issued during the layer before
  (``--prefetch-weights``, ``neuroncore.compiler.prefetch``);
* ``fp8-matmuls=on``: "bf16 -> fp8 matmuls", every matmul reading FP8 E4M3 operands (``--fp8-matmuls``);
  the report notes the FP8 rate of the instance's cores (the BF16 rate on NC-v2, double-row on NC-v3);
* ``auto-cast-type=T``, ``auto-cast=M``, ``quantize=Q``: compiler precision options as neuronx-cc has
  them (``--auto-cast-type`` ...; auto-cast rewrites FP32 operations only);
* ``KEY=VALUE``: any other workload option, e.g. ``batch=2`` (``--set KEY=VALUE``).

``auto`` runs ``dma-bandwidth=2``, ``hbm-bandwidth=2`` and ``dma-latency=0.5`` when a finding points
at a DMA queue, ``power-throttling=off`` when the profile recorded throttling and
``prefetch-weights=on`` when a finding is about the weight queue. Findings then carry
the gain measured for the change that addresses them (``Finding.gain_ns``): a DMA-queue finding the
largest gain among the DMA and HBM changes run, the power-throttling finding that of
``power-throttling=off``, weight-queue and Tensor-engine findings those of ``prefetch-weights=on`` and
``fp8-matmuls=on`` (``ADDRESSES``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from formats.analysis import THROTTLE_FINDING, Analysis, Finding
from formats.analyze_command import ANALYZE_FORMATS, AnalyzeCommand, analyze_dir, text_lines, to_json
from formats.units import fmt_ns, fmt_pct
from neuronscope.cli_kit import EXIT_OK, CliError

__all__ = ["WhatIf", "WhatIfAnalyzeCommand", "find_rerun", "run_what_if"]

HARDWARE_KNOBS = {"dma-bandwidth": "dma_engine_bytes_per_s", "hbm-bandwidth": "hbm_bytes_per_s",
                  "dma-latency": "dma_fixed_latency_ns"}
AUTO = ("dma-bandwidth=2", "hbm-bandwidth=2", "dma-latency=0.5")
THROTTLING = "power-throttling"  # power-throttling=off: Trainium2 without its power throttling
PREFETCH = "prefetch-weights"  # prefetch-weights=on: each layer's weights loaded during the one before
FP8_MATMULS = "fp8-matmuls"  # fp8-matmuls=on: every matmul reads FP8 E4M3 operands
AUTO_CAST = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
QUANTIZE = ("none", "int8-weight-only")


@dataclass(frozen=True)
class WhatIf:
    """One re-simulation and its comparison with the captured run."""

    change: str
    capture: str  # the equivalent neuron-profile capture command
    before_ns: int
    after_ns: int
    share_after: dict[str, dict[str, float]]
    note: str | None = None  # what the change means on this hardware (fp8 on NC-v2, ...)

    @property
    def gain_ns(self) -> int:
        return self.before_ns - self.after_ns

    def as_dict(self) -> dict[str, Any]:
        return {"change": self.change, "capture": self.capture,
                "device_time_ns": {"before": self.before_ns, "after": self.after_ns},
                "gain_ns": self.gain_ns, "gain": self.gain_ns / self.before_ns if self.before_ns else None,
                "critical_path_share_after": self.share_after, "note": self.note}


def find_rerun(root: str | Path) -> Path | None:
    """The ``rerun.json`` of the capture a profile or folder belongs to (it or up to 4 levels up)."""
    from collectors.capture import RERUN_FILE

    here = Path(root).resolve()
    for folder in [here, *list(here.parents)[:4]]:
        candidate = folder / RERUN_FILE
        if candidate.is_file():
            return candidate
    return None


def _load_rerun(path: Path) -> dict[str, Any]:
    from collectors.capture import RERUN_FORMAT

    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: cannot read the re-run facts: {exc}") from None
    if not isinstance(facts, dict) or facts.get("format") != RERUN_FORMAT or not facts.get("workload"):
        raise CliError(f"{path}: not a {RERUN_FORMAT} file")
    return facts


def _capture_args(facts: dict[str, Any], change: str, out: Path) -> tuple[argparse.Namespace, str]:
    """The capture's arguments with ``change`` applied, and the equivalent command line."""
    name, sep, value = change.partition("=")
    if not sep or not name or not value:
        raise CliError(f"--what-if takes NAME=VALUE (e.g. dma-bandwidth=2, tp=2, batch=4), not {change!r}")
    compiled = facts.get("compiler_options") or {}
    if not isinstance(compiled, dict):
        raise CliError("rerun.json: compiler_options is not an object")
    args = argparse.Namespace(
        workload=facts["workload"], preset=facts.get("preset"), set=list(facts.get("set") or []),
        dtype=facts.get("dtype"), instance=facts.get("instance"), tp=int(facts.get("tp") or 1),
        core=int(facts.get("core") or 0), timing_only=bool(facts.get("timing_only", True)),
        seed=int(facts.get("seed") or 0), num_exec=int(facts.get("num_exec") or 2),
        profile_nth_exec=int(facts.get("profile_nth_exec") or 2),
        rank_slowdown=list(facts.get("rank_slowdown") or []),
        scale_hardware=list(facts.get("scale_hardware") or []), output=str(out), force=True,
        system_only=False, device_only=True, system_interval=0.1,
        no_power_throttling=facts.get("power_throttling", True) is False,
        auto_cast=compiled.get("auto_cast"), auto_cast_type=compiled.get("auto_cast_type"),
        quantize=compiled.get("quantize"),
        prefetch_weights=bool(compiled.get("prefetch_weights", False)),
        fp8_matmuls=bool(compiled.get("fp8_matmuls", False)))
    if name in HARDWARE_KNOBS:
        field = HARDWARE_KNOBS[name]
        try:
            factor = float(value)
        except ValueError:
            raise CliError(f"--what-if {name} takes a factor, not {value!r}") from None
        kept = [s for s in args.scale_hardware if not s.startswith(field + "=")]
        old = next((float(s.partition("=")[2]) for s in args.scale_hardware if s.startswith(field + "=")),
                   1.0)
        args.scale_hardware = [*kept, f"{field}={old * factor:g}"]
    elif name == "tp":
        try:
            args.tp = int(value)
        except ValueError:
            raise CliError(f"--what-if tp takes a whole number, not {value!r}") from None
        if args.tp < 2:
            args.rank_slowdown = []
    elif name == THROTTLING:
        if value not in ("on", "off"):
            raise CliError(f"--what-if {THROTTLING} takes on or off, not {value!r}")
        args.no_power_throttling = value == "off"
    elif name in (PREFETCH, FP8_MATMULS):
        if value not in ("on", "off"):
            raise CliError(f"--what-if {name} takes on or off, not {value!r}")
        setattr(args, name.replace("-", "_"), value == "on")
    elif name in ("auto-cast", "auto-cast-type", "quantize"):
        choices = {"auto-cast": AUTO_CAST, "auto-cast-type": AUTO_CAST_TYPES, "quantize": QUANTIZE}[name]
        if value not in choices:
            raise CliError(f"--what-if {name} takes one of {', '.join(choices)}, not {value!r}")
        setattr(args, name.replace("-", "_"), value)
    elif name == "instance":
        args.instance = value
    elif name == "dtype":
        args.dtype = value
    else:
        args.set = [s for s in args.set if not s.startswith(name + "=")] + [f"{name}={value}"]
    command = ["neuron-profile", "capture", "--workload", args.workload, "--device-only"]
    for flag, v in (("--preset", args.preset), ("--dtype", args.dtype), ("--instance", args.instance)):
        if v:
            command += [flag, str(v)]
    if args.tp > 1:
        command += ["--tp", str(args.tp)]
    if args.timing_only:
        command.append("--timing-only")
    if args.no_power_throttling:
        command.append("--no-power-throttling")
    if args.prefetch_weights:
        command.append("--prefetch-weights")
    if args.fp8_matmuls:
        command.append("--fp8-matmuls")
    for flag, v in (("--auto-cast", args.auto_cast), ("--auto-cast-type", args.auto_cast_type),
                    ("--quantize", args.quantize)):
        if v:
            command += [flag, str(v)]
    for flag, items in (("--set", args.set), ("--rank-slowdown", args.rank_slowdown),
                        ("--scale-hardware", args.scale_hardware)):
        for item in items:
            command += [flag, item]
    return args, " ".join(command) + " -o DIR"


def _note(change: str, instance: str | None) -> str | None:
    """What a precision change means on the instance's cores (the FP8 rate differs by generation)."""
    from neuroncore.hardware import INSTANCE_TYPES

    if change != f"{FP8_MATMULS}=on" or instance not in INSTANCE_TYPES:
        return None
    core = INSTANCE_TYPES[instance].chip.core
    if core.fp8_double_row:
        return (f"{core.name} runs FP8 matmuls double-row (K = 256 per MATMUL): twice the BF16 rate, "
                f"and weights move half the bytes")
    return (f"{core.name} runs FP8 at the BF16 rate: the matmuls are no faster, only the bytes moved "
            f"halve")


def _device_time(analyses: dict[str, Analysis]) -> int:
    """The step's device time: the longest rank's (all ranks of a step run together)."""
    return max((a.device_time_ns for a in analyses.values()), default=0)


def run_what_if(root: str, changes: list[str], baseline: dict[str, Any]) -> list[WhatIf]:
    """Re-simulate the capture ``root`` belongs to once per change (module docstring)."""
    from collectors.capture import capture_workload

    rerun = find_rerun(root)
    if rerun is None:
        raise CliError(f"{root}: no rerun.json beside this profile: --what-if re-runs captures of built-in "
                       f"workloads (neuron-profile capture --workload ...); this one cannot be re-run")
    facts = _load_rerun(rerun)
    before = _device_time(baseline["profiles"])
    out: list[WhatIf] = []
    quiet = Console(stderr=True, quiet=True)
    for change in changes:
        with tempfile.TemporaryDirectory(prefix="neuronscope-whatif-") as tmp:
            args, command = _capture_args(facts, change, Path(tmp) / "capture")
            try:
                capture_workload(args, quiet)
            except CliError:
                raise
            except (ValueError, KeyError) as exc:
                raise CliError(f"--what-if {change}: {exc}") from None
            result = analyze_dir(str(Path(tmp) / "capture" / "device"))
            profiles: dict[str, Analysis] = result["profiles"]
            first = next(iter(profiles.values()))
            share = first.critical_path.share() if first.critical_path is not None else {}
            out.append(WhatIf(change, command, before, _device_time(profiles), share,
                              _note(change, args.instance or facts.get("instance"))))
            shutil.rmtree(Path(tmp) / "capture", ignore_errors=True)
    return out


def _is_dma_finding(f: Finding) -> bool:
    return f.title.startswith("DMA queue") or "dma:" in f.title


def _is_throttle_finding(f: Finding) -> bool:
    return f.title == THROTTLE_FINDING


def _is_weight_finding(f: Finding) -> bool:
    """A finding about the weight-load queue (its share of the path, the Tensor engine waiting on it)."""
    return "qSyncWeight" in f.title


def _is_tensor_finding(f: Finding) -> bool:
    return "engine Tensor" in f.title or f.title.startswith("op dot") or _is_weight_finding(f)


# which measured change addresses which finding: (the change, the findings it answers)
ADDRESSES = (
    (lambda change: change.partition("=")[0] in HARDWARE_KNOBS, _is_dma_finding),
    (lambda change: change == f"{THROTTLING}=off", _is_throttle_finding),
    (lambda change: change == f"{PREFETCH}=on", _is_weight_finding),
    (lambda change: change == f"{FP8_MATMULS}=on", _is_tensor_finding),
)


def attach_gains(baseline: dict[str, Any], what_ifs: list[WhatIf]) -> None:
    """Give each finding the largest gain measured by a change that addresses it (in place; the
    evidence names the change): DMA findings by the DMA/HBM changes, the power-throttling finding
    by ``power-throttling=off``, weight-queue findings by ``prefetch-weights=on``, Tensor-engine and
    weight findings by ``fp8-matmuls=on``."""
    for name, analysis in baseline["profiles"].items():
        findings = []
        for f in analysis.findings:
            runs = [w for w in what_ifs for change, answers in ADDRESSES if change(w.change) and answers(f)]
            if runs:
                best = max(runs, key=lambda w: w.gain_ns)
                note = (f"; re-simulated with {best.change}: {fmt_ns(best.before_ns)} -> "
                        f"{fmt_ns(best.after_ns)}")
                f = replace(f, gain_ns=best.gain_ns, evidence=f.evidence + note)
            findings.append(f)
        baseline["profiles"][name] = replace(analysis, findings=findings)


def what_if_lines(what_ifs: list[WhatIf]) -> list[str]:
    lines = ["what-if (re-simulated; each is a fresh capture with the change):"]
    for w in what_ifs:
        gain = fmt_pct(w.gain_ns / w.before_ns) if w.before_ns else "-"
        lines.append(f"  {w.change:<24} device time {fmt_ns(w.before_ns)} -> {fmt_ns(w.after_ns)} "
                     f"(gain {fmt_ns(w.gain_ns)}, {gain})")
        if w.note:
            lines.append(f"    ({w.note})")
        lines.append(f"    = {w.capture}")
    return lines


class WhatIfAnalyzeCommand(AnalyzeCommand):
    """``neuron-profile analyze`` with ``--what-if``: the formats command plus re-simulation."""

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        super().prepare_parser(parser)
        parser.add_argument("--what-if", action="append", metavar="CHANGE",
                            help="re-simulate the captured workload with one change and compare "
                                 "(repeatable): dma-bandwidth=F, hbm-bandwidth=F, dma-latency=F, tp=N, "
                                 "instance=NAME, dtype=D, power-throttling=off, prefetch-weights=on, "
                                 "fp8-matmuls=on, auto-cast-type=T, any workload option KEY=VALUE, "
                                 "or auto")

    def run(self, args: argparse.Namespace) -> int:
        if not args.what_if:
            return super().run(args)
        result = analyze_dir(args.profile, include_incomplete=args.include_incomplete)
        changes: list[str] = []
        for change in args.what_if:
            if change == "auto":
                findings = [f for a in result["profiles"].values() for f in a.findings]
                wants_dma = any(_is_dma_finding(f) for f in findings)
                changes += [c for c in AUTO if wants_dma and c not in changes]
                if any(_is_throttle_finding(f) for f in findings) and f"{THROTTLING}=off" not in changes:
                    changes.append(f"{THROTTLING}=off")
                if any(_is_weight_finding(f) for f in findings) and f"{PREFETCH}=on" not in changes:
                    changes.append(f"{PREFETCH}=on")
            elif change not in changes:
                changes.append(change)
        what_ifs = run_what_if(args.profile, changes, result)
        attach_gains(result, what_ifs)
        if args.output_format == "json":
            data = to_json(result)
            data["what_if"] = [w.as_dict() for w in what_ifs]
            json.dump(data, sys.stdout, indent=1, allow_nan=False)
            print()
        else:
            for line in [*text_lines(result), *what_if_lines(what_ifs)]:
                print(line)
        return EXIT_OK


assert "json" in ANALYZE_FORMATS and "text" in ANALYZE_FORMATS
