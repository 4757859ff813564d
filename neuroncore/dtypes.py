"""Element types of the IR and how their values are rounded when stored.

Engines compute in FP32 internally (neuroncore.md §2.6); rounding happens when a result is written
to a tensor of a narrower type. ``ml_dtypes`` provides exact bfloat16 and FP8 (e4m3 "fn" and e5m2)
conversions (round to nearest even), so narrow storage is emulated with it rather than with
hand-written bit tricks.

The narrow types beyond the 16-bit ones: ``TF32`` (FP32 storage, the mantissa cut to 10 bits as the
Tensor engine reads it -- an auto-cast target for matmuls), ``FP8_E4M3`` / ``FP8_E5M2`` (one byte;
the Tensor engine's 8-bit float inputs, neuroncore.md §2.2/§3.1) and ``INT8`` (one byte; weights of
int8 weight-only quantised linears, dequantised before the matmul). Conversions to FP8 and INT8
saturate at the type's largest finite value [assumption: ml_dtypes turns an out-of-range e4m3fn
value into NaN; a quantising cast on the device clamps].
"""

from __future__ import annotations

from enum import Enum

import ml_dtypes
import numpy as np


class DType(Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    INT32 = "int32"
    PRED = "pred"  # booleans from compare, stored as 0/1
    TF32 = "tf32"  # FP32 storage, 10-bit mantissa: the Tensor engine's TF32 input format
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    INT8 = "int8"  # quantised weights (weight-only int8); never an engine compute type

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self._value_]  # _value_: a plain attribute (.value is a descriptor)

    @property
    def is_float(self) -> bool:
        return self._value_ in _FLOATS

    @property
    def is_fp8(self) -> bool:
        return self in (DType.FP8_E4M3, DType.FP8_E5M2)

    @property
    def numpy(self) -> np.dtype:
        """The NumPy type a tensor of this dtype is stored as in HBM and returned to the user."""
        return np.dtype(_NUMPY[self._value_])

    @property
    def profile_name(self) -> str:
        """Spelling used in operand strings, like the real tool (``bfloat16``, ``fp16`` ...)."""
        return _PROFILE_NAME[self._value_]

    @property
    def flops_multiplier(self) -> float:
        """BF16-equivalent FLOP multiplier for ``adjusted_flops`` on NC-v2 (neuroncore.md §3.6:
        x4 for FP32, x1 for BF16/FP16/TF32/FP8); NC-v3's FP8 factor is
        ``compiler.costs.adjusted_flops_factor``."""
        return 4.0 if self is DType.FP32 else 1.0


_FLOATS = frozenset({"fp32", "bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2"})
_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "int32": 4, "pred": 1, "tf32": 4, "fp8_e4m3": 1,
             "fp8_e5m2": 1, "int8": 1}
_NUMPY = {
    "fp32": np.float32,
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "int32": np.int32,
    "pred": np.bool_,
    "tf32": np.float32,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "int8": np.int8,
}
_PROFILE_NAME = {
    "fp32": "fp32",
    "bf16": "bfloat16",
    "fp16": "fp16",
    "int32": "int32",
    "pred": "uint8",
    "tf32": "tf32",
    "fp8_e4m3": "fp8e4",
    "fp8_e5m2": "fp8e5",
    "int8": "int8",
}
# largest finite value: conversions saturate here (see the module docstring)
_SATURATE = {"fp8_e4m3": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
             "fp8_e5m2": float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max),
             "int8": 127.0}
_ALIASES = {
    "fp32": DType.FP32,
    "float32": DType.FP32,
    "f32": DType.FP32,
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "fp16": DType.FP16,
    "float16": DType.FP16,
    "f16": DType.FP16,
    "half": DType.FP16,
    "int32": DType.INT32,
    "s32": DType.INT32,
    "i32": DType.INT32,
    "pred": DType.PRED,
    "bool": DType.PRED,
    "tf32": DType.TF32,
    "fp8_e4m3": DType.FP8_E4M3,
    "fp8e4": DType.FP8_E4M3,
    "float8_e4m3fn": DType.FP8_E4M3,
    "f8e4m3fn": DType.FP8_E4M3,
    "fp8_e5m2": DType.FP8_E5M2,
    "fp8e5": DType.FP8_E5M2,
    "float8_e5m2": DType.FP8_E5M2,
    "f8e5m2": DType.FP8_E5M2,
    "int8": DType.INT8,
    "s8": DType.INT8,
    "i8": DType.INT8,
}


def as_dtype(value: str | DType | np.dtype | type) -> DType:
    """Accept the spellings users and frameworks write (``"bf16"``, ``np.float32``, ``"bfloat16"``)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        key = value.lower()
    else:
        key = np.dtype(value).name
    if key in _ALIASES:
        return _ALIASES[key]
    raise ValueError(f"unsupported dtype {value!r}; supported: "
                     f"{', '.join(d.value for d in DType)}")


def round_to(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Round FP32 working values to what a ``dtype`` tensor can hold, returned as FP32 working values."""
    if dtype is DType.FP32:
        return values.astype(np.float32, copy=False)
    if dtype is DType.BF16:
        return values.astype(ml_dtypes.bfloat16).astype(np.float32)
    if dtype is DType.FP16:
        return values.astype(np.float16).astype(np.float32)
    if dtype is DType.INT32:
        return np.trunc(values).astype(np.float32)
    if dtype is DType.TF32:
        return _round_mantissa(values.astype(np.float32, copy=False), 10)
    if dtype is DType.INT8:
        return np.clip(np.rint(values), -127.0, 127.0).astype(np.float32)
    if dtype.is_fp8:
        limit = _SATURATE[dtype.value]
        return np.clip(values, -limit, limit).astype(dtype.numpy).astype(np.float32)
    return (values != 0).astype(np.float32)


def stochastic_round(values: np.ndarray, dtype: DType, rng: np.random.Generator) -> np.ndarray:
    """Round FP32 working values to ``dtype`` stochastically (bf16 only; other dtypes as
    :func:`round_to`): a uniform random 16-bit integer is added to the low half of each FP32 bit
    pattern before it is cut off, so a value between two bf16 neighbours becomes the upper one with
    probability equal to its distance from the lower one: the expected value is the FP32 value
    (``NEURON_RT_STOCHASTIC_ROUNDING_EN=1`` on Trainium). Non-finite values round to nearest."""
    if dtype is not DType.BF16:
        return round_to(values, dtype)
    x = np.ascontiguousarray(values, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    noise = rng.integers(0, 1 << 16, size=x.shape, dtype=np.uint64)
    cut = ((bits + noise) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    finite = np.isfinite(x) & np.isfinite(cut)
    return np.where(finite, cut, round_to(x, dtype)).astype(np.float32)


def _round_mantissa(values: np.ndarray, bits: int) -> np.ndarray:
    """FP32 values rounded (to nearest even) to ``bits`` explicit mantissa bits, exponent kept:
    TF32 is FP32's 8-bit exponent with a 10-bit mantissa."""
    raw = np.ascontiguousarray(values, np.float32).view(np.uint32)
    drop = 23 - bits
    half = np.uint32(1 << (drop - 1))
    lsb = (raw >> np.uint32(drop)) & np.uint32(1)
    rounded = (raw + half - np.uint32(1) + lsb) & ~np.uint32((1 << drop) - 1)
    finite = np.isfinite(values)
    return np.where(finite, rounded.view(np.float32), values).astype(np.float32)


def to_storage(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert FP32 working values to the NumPy storage type of ``dtype`` (for outputs)."""
    if dtype is DType.PRED:
        return values != 0
    if dtype is DType.INT32:
        return np.trunc(values).astype(np.int32)
    if dtype is DType.INT8 or dtype.is_fp8:
        return round_to(values, dtype).astype(dtype.numpy)
    return values.astype(dtype.numpy)


def to_working(values: np.ndarray) -> np.ndarray:
    """Any stored array as FP32 working values (engines compute in FP32)."""
    return np.asarray(values).astype(np.float32)
