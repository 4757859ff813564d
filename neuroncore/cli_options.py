"""Options that ``neuroncore run`` and ``neuron-profile capture`` share, each defined once.

Both commands compile a workload for a simulated instance, so the choices that change how it is
compiled or simulated -- the precision options of ``neuronx-cc`` and Trainium2's power throttling --
mean the same in both; a second copy of an option drifted before (capture spelled the auto-cast
choices by hand while ``run`` read the enums, and only capture had ``--no-power-throttling``). The
core's command may not import the collectors, so the one definition lives here.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

from neuroncore.compiler.options import AutoCast, AutoCastType, CompilerOptions, Quantization

if TYPE_CHECKING:
    from neuroncore.runtime.device import Instance


def add_precision_options(parser: argparse.ArgumentParser) -> None:
    """``--auto-cast``, ``--auto-cast-type``, ``--quantize``, ``--prefetch-weights``, ``--fp8-matmuls``
    (read back with ``precision_options(args)``)."""
    parser.add_argument("--auto-cast", choices=[m.value for m in AutoCast],
                        help="cast FP32 matmuls (matmult) or all FP32 ops to --auto-cast-type, as "
                             "neuronx-cc --auto-cast (default: none, the workload's own types)")
    parser.add_argument("--auto-cast-type", choices=[m.value for m in AutoCastType],
                        help="the auto-cast target type (default bf16; alone it means --auto-cast "
                             "matmult); like neuronx-cc it casts FP32 operations only")
    parser.add_argument("--quantize", choices=[m.value for m in Quantization],
                        help="int8-weight-only: linear weights stored int8 with per-channel scales")
    parser.add_argument("--prefetch-weights", action="store_true",
                        help="issue each layer's weight loads during the layer before (compiler schedule)")
    parser.add_argument("--fp8-matmuls", action="store_true",
                        help="every bf16/fp16/fp32 matmul reads FP8 E4M3 operands (a model quantised to "
                             "FP8; what-if studies)")


def precision_options(args: argparse.Namespace) -> CompilerOptions:
    """The ``CompilerOptions`` of ``add_precision_options``' flags (``OptionsError`` when refused)."""
    return CompilerOptions.parse(getattr(args, "auto_cast", None), getattr(args, "auto_cast_type", None),
                                 getattr(args, "quantize", None),
                                 prefetch_weights=bool(getattr(args, "prefetch_weights", False)),
                                 fp8_matmuls=bool(getattr(args, "fp8_matmuls", False)))


def add_power_throttling_option(parser: argparse.ArgumentParser) -> None:
    """``--no-power-throttling`` (``args.no_power_throttling``)."""
    parser.add_argument("--no-power-throttling", action="store_true",
                        help="simulate Trainium2 without its power throttling (what-if studies; "
                             "trn1/inf2 never throttle)")


def disable_power_throttling(instance: Instance) -> None:
    """Turn off Trainium2's power throttling on every core of ``instance`` (and in the spec programs
    are compiled for): ``--no-power-throttling``, the what-if ``power-throttling=off``."""
    core = replace(instance.spec.chip.core, power_throttling=False)
    instance.spec = replace(instance.spec, chip=replace(instance.spec.chip, core=core))
    for c in instance.cores:
        c.spec = core


__all__ = ["add_power_throttling_option", "add_precision_options", "disable_power_throttling",
           "precision_options"]
