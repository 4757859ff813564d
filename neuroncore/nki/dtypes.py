"""NKI data types: what ``nl.bfloat16``, ``nl.float32``... are, and how values are rounded to them.

Values are held as NumPy float32 (float types) or int32/bool arrays; a tile of bf16 or fp16 holds
float32 values rounded to that type, which is how the engines compute (fp32 inside, cast on the
way in and out, neuroncore.md §2.6).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroncore.dtypes import DType, round_to


class NkiDtype:
    """A data type by canonical name; compares equal to NumPy dtypes, types and names of it."""

    __slots__ = ("itemsize", "kind", "name")

    def __init__(self, name: str, itemsize: int, kind: str) -> None:
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # "f" float, "i" signed int, "u" unsigned int, "b" bool

    def __repr__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        try:
            return resolve(other) is self
        except (TypeError, ValueError):
            return False

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def core_dtype(self) -> DType:
        """The execution core's closest type (its cost formulas know fp32, bf16, fp16, int32)."""
        return _CORE.get(self.name, DType.FP32 if self.is_float else DType.INT32)

    @property
    def working(self) -> np.dtype:
        """The NumPy type values of this type are held in."""
        if self.kind == "f":
            return np.dtype(np.float32)
        if self.kind == "b":
            return np.dtype(np.bool_)
        return np.dtype(np.int32) if self.itemsize <= 4 else np.dtype(np.int64)

    def cast(self, values: Any) -> np.ndarray:
        """``values`` rounded to this type, in its working representation."""
        arr = np.asarray(values)
        if self.kind == "f":
            arr = arr.astype(np.float32, copy=False)
            if self.name == "bfloat16":
                return round_to(arr, DType.BF16)
            if self.name == "float16":
                return arr.astype(np.float16).astype(np.float32)
            if self.name.startswith("float8"):
                return _round_mantissa(arr, 3 if "e4m3" in self.name else 2)
            if self.name == "tfloat32":
                return _round_mantissa(arr, 10)
            return arr
        if self.kind == "b":
            return arr != 0
        info = np.iinfo(np.dtype(self.name))
        if arr.dtype.kind == "f":
            arr = np.trunc(arr)
        return np.clip(arr, info.min, info.max).astype(self.working)


def _round_mantissa(values: np.ndarray, bits: int) -> np.ndarray:
    """Round float32 values to ``bits`` mantissa bits (tf32, fp8 without range limits)."""
    drop = 23 - bits
    raw = values.astype(np.float32).view(np.uint32)
    rounded = (raw + np.uint32((1 << (drop - 1)) - 1) + ((raw >> drop) & 1)) & np.uint32(
        ~((1 << drop) - 1) & 0xFFFFFFFF
    )
    return rounded.view(np.float32)


_CORE = {
    "float32": DType.FP32,
    "bfloat16": DType.BF16,
    "float16": DType.FP16,
    "tfloat32": DType.FP32,
    "int32": DType.INT32,
    "bool": DType.PRED,
}

_TYPES = [
    NkiDtype("float32", 4, "f"),
    NkiDtype("bfloat16", 2, "f"),
    NkiDtype("float16", 2, "f"),
    NkiDtype("tfloat32", 4, "f"),
    NkiDtype("float8_e4m3", 1, "f"),
    NkiDtype("float8_e5m2", 1, "f"),
    NkiDtype("int32", 4, "i"),
    NkiDtype("int16", 2, "i"),
    NkiDtype("int8", 1, "i"),
    NkiDtype("uint32", 4, "u"),
    NkiDtype("uint16", 2, "u"),
    NkiDtype("uint8", 1, "u"),
    NkiDtype("bool", 1, "b"),
    NkiDtype("float64", 8, "f"),
    NkiDtype("int64", 8, "i"),
]
BY_NAME = {t.name: t for t in _TYPES}
_ALIASES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float": "float32",
    "bool_": "bool",
    "tf32": "tfloat32",
    "fp8": "float8_e4m3",
    "float8_e4m3fn": "float8_e4m3",
    "float8e4": "float8_e4m3",
    "float8e5": "float8_e5m2",
    "int": "int32",
}

float32 = BY_NAME["float32"]
bfloat16 = BY_NAME["bfloat16"]
float16 = BY_NAME["float16"]
tfloat32 = BY_NAME["tfloat32"]
float8_e4m3 = BY_NAME["float8_e4m3"]
float8_e5m2 = BY_NAME["float8_e5m2"]
int32 = BY_NAME["int32"]
int16 = BY_NAME["int16"]
int8 = BY_NAME["int8"]
uint32 = BY_NAME["uint32"]
uint16 = BY_NAME["uint16"]
uint8 = BY_NAME["uint8"]
bool_ = BY_NAME["bool"]


def resolve(value: object) -> NkiDtype:
    """The NKI type named by ``value``: an NkiDtype, a NumPy dtype or type, a torch/jax dtype, a name."""
    if isinstance(value, NkiDtype):
        return value
    if value is None:
        raise TypeError("no dtype")
    if isinstance(value, str):
        key = value.lower().removeprefix("torch.").removeprefix("jnp.")
    elif isinstance(value, DType):
        key = {
            DType.FP32: "float32",
            DType.BF16: "bfloat16",
            DType.FP16: "float16",
            DType.INT32: "int32",
            DType.PRED: "bool",
        }[value]
    else:
        text = str(value)
        if text.startswith("torch."):
            key = text.removeprefix("torch.")
        else:
            try:
                key = np.dtype(value).name  # type: ignore[call-overload]
            except TypeError:
                key = getattr(value, "__name__", text).lower()
    key = _ALIASES.get(key, key)
    if key == "float64":
        key = "float32"  # NumPy's default float: kernels compute it as fp32
    if key not in BY_NAME:
        raise ValueError(f"unsupported NKI dtype {value!r}")
    return BY_NAME[key]


def numpy_storage(dtype: NkiDtype) -> np.dtype:
    """The NumPy type an output of ``dtype`` is returned as (bf16/fp8 as ml_dtypes when present)."""
    if dtype.name in ("bfloat16", "float8_e4m3", "float8_e5m2"):
        try:
            import ml_dtypes  # shipped with jax; optional

            return np.dtype(
                getattr(
                    ml_dtypes,
                    {"bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}[
                        dtype.name
                    ],
                )
            )
        except ImportError:
            return np.dtype(np.float32)
    if dtype.name == "tfloat32":
        return np.dtype(np.float32)
    return np.dtype(dtype.name if dtype.name != "bool" else np.bool_)
