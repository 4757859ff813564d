"""Element types of the IR and how their values are rounded when stored.

Engines compute in FP32 internally (neuroncore.md §2.6); rounding happens when a result is written
to a tensor of a narrower type. ``ml_dtypes`` provides an exact bfloat16 (round to nearest even), so
bf16 storage is emulated with it rather than with hand-written bit tricks.
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

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.FP32, DType.BF16, DType.FP16)

    @property
    def numpy(self) -> np.dtype:
        """The NumPy type a tensor of this dtype is stored as in HBM and returned to the user."""
        return np.dtype(_NUMPY[self])

    @property
    def profile_name(self) -> str:
        """Spelling used in operand strings, like the real tool (``bfloat16``, ``fp16`` ...)."""
        return _PROFILE_NAME[self]

    @property
    def flops_multiplier(self) -> float:
        """BF16-equivalent FLOP multiplier for ``adjusted_flops`` (profile-schema §2.10)."""
        return 4.0 if self is DType.FP32 else 1.0


_ITEMSIZE = {DType.FP32: 4, DType.BF16: 2, DType.FP16: 2, DType.INT32: 4, DType.PRED: 1}
_NUMPY = {
    DType.FP32: np.float32,
    DType.BF16: ml_dtypes.bfloat16,
    DType.FP16: np.float16,
    DType.INT32: np.int32,
    DType.PRED: np.bool_,
}
_PROFILE_NAME = {
    DType.FP32: "fp32",
    DType.BF16: "bfloat16",
    DType.FP16: "fp16",
    DType.INT32: "int32",
    DType.PRED: "uint8",
}
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
    raise ValueError(f"unsupported dtype {value!r}; supported: fp32, bf16, fp16, int32, pred")


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


def to_storage(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert FP32 working values to the NumPy storage type of ``dtype`` (for outputs)."""
    if dtype is DType.PRED:
        return values != 0
    if dtype is DType.INT32:
        return np.trunc(values).astype(np.int32)
    return values.astype(dtype.numpy)


def to_working(values: np.ndarray) -> np.ndarray:
    """Any stored array as FP32 working values (engines compute in FP32)."""
    return np.asarray(values).astype(np.float32)
