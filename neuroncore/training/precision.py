"""Training precisions, as Trainium runs them.

* ``fp32``: everything in FP32.
* ``bf16``: bf16 auto-cast (the Neuron compiler's ``--auto-cast matmult``): matmul operands in bf16
  with FP32 accumulation; master weights, gradients and optimizer state stay FP32.
* ``bf16-sr``: bf16 weights (``XLA_USE_BF16=1``-style, as Neuron's BERT pretraining runs) whose
  updates are rounded to bf16 stochastically (``NEURON_RT_STOCHASTIC_ROUNDING_EN=1``): the rounded
  value's expected value is the FP32 update, so small updates are not lost to round-to-nearest.
  Optimizer state stays FP32.
"""

from __future__ import annotations

import enum

from neuroncore.compiler.options import CompilerOptions, Quantization
from neuroncore.frontends.tracing import TraceError


class Precision(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    BF16_SR = "bf16-sr"

    @property
    def weight_bytes(self) -> int:
        """Bytes per parameter of the weights the forward reads."""
        return 4 if self is Precision.FP32 else 2

    @property
    def master_bytes(self) -> int:
        """Bytes per parameter of an FP32 master copy kept next to bf16 weights (none otherwise)."""
        return 4 if self is Precision.BF16 else 0


def parse_precision(value: str | Precision) -> Precision:
    """A Precision from its name (``fp32``, ``bf16``, ``bf16-sr``; ``bf16+sr`` also accepted)."""
    if isinstance(value, Precision):
        return value
    text = str(value).strip().lower().replace("+", "-").replace("_", "-")
    for p in Precision:
        if p.value == text:
            return p
    raise ValueError(f"precision must be one of fp32, bf16, bf16-sr; not {value!r}")


def check_options(options: CompilerOptions | None) -> None:
    """Compiler options a training step takes: auto-cast yes, weight quantisation no."""
    if options is None:
        return
    if not isinstance(options, CompilerOptions):
        raise TraceError(f"options must be a CompilerOptions, not {type(options).__name__}")
    if options.quantize is not Quantization.NONE:
        raise TraceError(f"quantize={options.quantize.value} is for inference: a training step's "
                         f"weights are what it updates")


__all__ = ["Precision", "check_options", "parse_precision"]
