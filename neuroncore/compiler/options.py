"""Compiler options: the precision choices ``neuronx-cc`` offers, as enums in one frozen record, and
one scheduling choice (``prefetch_weights``).

    program = neuroncore.compile(graph, "trn2", CompilerOptions(auto_cast=AutoCast.MATMULT,
                                                                auto_cast_type=AutoCastType.FP8_E4M3))

``auto_cast`` / ``auto_cast_type`` follow ``neuronx-cc --auto-cast {matmult,all,none}`` and
``--auto-cast-type {bf16,fp16,tf32,fp8_e4m3}`` (Neuron's mixed-precision guide: by default the real
compiler casts FP32 matmuls to BF16; ours keeps the model's own types unless asked, so FP32 numerics
stay FP32). ``quantize`` is int8 weight-only quantisation as transformers-neuronx / NxD Inference run
it (``quantized=True``): int8 weights with one scale per output channel, dequantised before a
16-bit matmul. The graph rewrite itself is ``compiler.precision.apply_options``.

``prefetch_weights`` issues each layer's weight loads during the layer before it
(``compiler.prefetch``): a scheduling change, not a graph rewrite (what-if studies, issue 18).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from neuroncore.dtypes import DType


class AutoCast(Enum):
    """Which FP32 operations the compiler casts to ``auto_cast_type`` (``--auto-cast``)."""

    NONE = "none"  # the model's own types
    MATMULT = "matmult"  # FP32 matmul operands only; the result stays FP32 (FP32 accumulation)
    ALL = "all"  # every FP32 operation; program inputs and outputs keep their FP32 interface


class AutoCastType(Enum):
    """The type FP32 operations are cast to (``--auto-cast-type``)."""

    BF16 = "bf16"
    FP16 = "fp16"
    TF32 = "tf32"
    FP8_E4M3 = "fp8_e4m3"

    @property
    def dtype(self) -> DType:
        return DType(self.value)


class Quantization(Enum):
    """Weight quantisation applied when compiling."""

    NONE = "none"
    INT8_WEIGHT_ONLY = "int8-weight-only"


E = TypeVar("E", bound=Enum)


class OptionsError(ValueError):
    """A combination of options the compiler refuses (one line, said before anything compiles)."""


@dataclass(frozen=True)
class CompilerOptions:
    """Precision options of one compilation; the default changes nothing."""

    auto_cast: AutoCast = AutoCast.NONE
    auto_cast_type: AutoCastType = AutoCastType.BF16
    quantize: Quantization = Quantization.NONE
    prefetch_weights: bool = False  # each layer's weight loads issued during the layer before
    # every BF16/FP16/FP32 matmul reads FP8 E4M3 operands: a model quantised to FP8 (what-if "bf16 ->
    # fp8 matmuls"); not a neuronx-cc flag: its --auto-cast rewrites FP32 operations only
    fp8_matmuls: bool = False

    def __post_init__(self) -> None:
        for name, kind in (("auto_cast", AutoCast), ("auto_cast_type", AutoCastType),
                           ("quantize", Quantization)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise OptionsError(f"{name} must be a {kind.__name__} "
                                   f"({', '.join(k.name for k in kind)}), not {value!r}")
        for flag in ("prefetch_weights", "fp8_matmuls"):
            if not isinstance(getattr(self, flag), bool):
                raise OptionsError(f"{flag} must be True or False, not {getattr(self, flag)!r}")
        if self.fp8_matmuls and self.quantize is not Quantization.NONE:
            raise OptionsError("fp8_matmuls cannot be combined with int8 weight quantisation")
        if self.auto_cast is AutoCast.ALL and self.auto_cast_type is AutoCastType.FP8_E4M3:
            raise OptionsError("auto_cast=ALL with FP8_E4M3 is refused: FP8 is a Tensor-engine input "
                               "format (matmuls); cast matmuls only (AutoCast.MATMULT)")

    @property
    def is_default(self) -> bool:
        return self == CompilerOptions()

    @property
    def precision_is_default(self) -> bool:
        """Whether the precision choices (the graph rewrite) are the defaults."""
        return (self.auto_cast, self.auto_cast_type, self.quantize, self.fp8_matmuls) == (
            AutoCast.NONE, AutoCastType.BF16, Quantization.NONE, False)

    @classmethod
    def parse(cls, auto_cast: str | None = None, auto_cast_type: str | None = None,
              quantize: str | None = None, prefetch_weights: bool = False,
              fp8_matmuls: bool = False) -> CompilerOptions:
        """From the CLI's spellings (``matmult``, ``fp8_e4m3``, ``int8-weight-only``); a type
        without a mode means ``matmult``, as ``neuronx-cc``'s default mode is."""
        cast = _member(AutoCast, auto_cast, AutoCast.MATMULT if auto_cast_type else AutoCast.NONE)
        return cls(auto_cast=cast,
                   auto_cast_type=_member(AutoCastType, auto_cast_type, AutoCastType.BF16),
                   quantize=_member(Quantization, quantize, Quantization.NONE),
                   prefetch_weights=bool(prefetch_weights), fp8_matmuls=bool(fp8_matmuls))


def _member(kind: type[E], text: str | None, default: E) -> E:
    if text is None:
        return default
    for m in kind:
        if text.lower().replace("_", "-") == str(m.value).replace("_", "-"):
            return m
    raise OptionsError(f"unknown {kind.__name__} {text!r}; choose from "
                       f"{', '.join(str(m.value) for m in kind)}")


__all__ = ["AutoCast", "AutoCastType", "CompilerOptions", "OptionsError", "Quantization"]
