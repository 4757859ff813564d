"""Index expressions and masks: ``nl.arange``, ``nl.mgrid``, ``i * 128 + i_p``, ``i_p < n``.

NKI kernels address tiles with affine expressions of index ranges; here an expression is the NumPy
integer array of its values with broadcastable shape (``nl.arange(128)[:, None]`` is a ``[128, 1]``
column), so arithmetic and comparisons are NumPy's, and indexing a tensor with them is NumPy
advanced indexing. :func:`resolve_key` turns any index (ints, slices, ``...``, expressions) into an
:class:`AccessPlan`: the result shape, the range each tensor dimension spans (for timing, hazards and
bounds checks) and the NumPy key (for numerics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


class IndexExpr:
    """An affine index expression: integer values with a broadcastable shape."""

    __array_priority__ = 100

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def __getitem__(self, key: Any) -> IndexExpr:
        return IndexExpr(self.values[key])

    def _op(self, other: Any, fn: Any) -> IndexExpr:
        return IndexExpr(fn(self.values, _values(other)))

    def __add__(self, o: Any) -> IndexExpr:
        return self._op(o, np.add)

    def __radd__(self, o: Any) -> IndexExpr:
        return self._op(o, np.add)

    def __sub__(self, o: Any) -> IndexExpr:
        return self._op(o, np.subtract)

    def __rsub__(self, o: Any) -> IndexExpr:
        return IndexExpr(_values(o) - self.values)

    def __mul__(self, o: Any) -> IndexExpr:
        return self._op(o, np.multiply)

    def __rmul__(self, o: Any) -> IndexExpr:
        return self._op(o, np.multiply)

    def __floordiv__(self, o: Any) -> IndexExpr:
        return self._op(o, np.floor_divide)

    def __mod__(self, o: Any) -> IndexExpr:
        return self._op(o, np.mod)

    def __neg__(self) -> IndexExpr:
        return IndexExpr(-self.values)

    def _cmp(self, other: Any, fn: Any) -> Mask:
        return Mask(fn(self.values, _values(other)))

    def __lt__(self, o: Any) -> Mask:
        return self._cmp(o, np.less)

    def __le__(self, o: Any) -> Mask:
        return self._cmp(o, np.less_equal)

    def __gt__(self, o: Any) -> Mask:
        return self._cmp(o, np.greater)

    def __ge__(self, o: Any) -> Mask:
        return self._cmp(o, np.greater_equal)

    def __eq__(self, o: object) -> Mask:  # type: ignore[override]
        return self._cmp(o, np.equal)

    def __ne__(self, o: object) -> Mask:  # type: ignore[override]
        return self._cmp(o, np.not_equal)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IndexExpr(shape={self.shape})"


def _values(x: Any) -> Any:
    return x.values if isinstance(x, IndexExpr) else x


class Mask:
    """A predicate over an index space (``mask=`` of loads, stores and compute): a boolean array."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, bool)

    def __and__(self, o: Mask) -> Mask:
        return Mask(self.values & _mask_values(o))

    __rand__ = __and__

    def __or__(self, o: Mask) -> Mask:
        return Mask(self.values | _mask_values(o))

    __ror__ = __or__

    def __invert__(self) -> Mask:
        return Mask(~self.values)

    def __bool__(self) -> bool:
        raise TypeError(
            "an NKI mask is a predicate over tile indices; combine masks with & | ~, not 'and'/'or'"
        )


def _mask_values(m: Any) -> np.ndarray:
    return m.values if isinstance(m, Mask) else np.asarray(m, bool)


def arange(*args: int) -> IndexExpr:
    """``nl.arange(n)`` / ``nl.arange(start, stop[, step])``."""
    return IndexExpr(np.arange(*args, dtype=np.int64))


class Grid:
    """What ``nl.mgrid[0:128, 0:512]`` returns: ``.p`` (partition), ``.x``, ``.y``, ``.z``; unpacks."""

    def __init__(self, exprs: list[IndexExpr]) -> None:
        self.exprs = exprs

    def __iter__(self) -> Any:
        return iter(self.exprs)

    def __getitem__(self, i: int) -> IndexExpr:
        return self.exprs[i]

    def __len__(self) -> int:
        return len(self.exprs)

    @property
    def p(self) -> IndexExpr:
        return self.exprs[0]

    @property
    def x(self) -> IndexExpr:
        return self.exprs[1]

    @property
    def y(self) -> IndexExpr:
        return self.exprs[2]

    @property
    def z(self) -> IndexExpr:
        return self.exprs[3]


class _MGrid:
    def __getitem__(self, key: Any) -> Grid:
        keys = key if isinstance(key, tuple) else (key,)
        n = len(keys)
        exprs = []
        for axis, k in enumerate(keys):
            if not isinstance(k, slice):
                raise TypeError("nl.mgrid takes slices, e.g. nl.mgrid[0:128, 0:512]")
            start = k.start or 0
            values = np.arange(start, k.stop, k.step or 1, dtype=np.int64)
            shape = [1] * n
            shape[axis] = values.size
            exprs.append(IndexExpr(values.reshape(shape)))
        return Grid(exprs)


mgrid = _MGrid()


@dataclass(frozen=True)
class DimSpan:
    """The values one tensor dimension is indexed with: [lo, hi) with ``count`` distinct values,
    contiguous if ``step == 1``; ``axis`` is the result axis it varies along (-1: a single value)."""

    lo: int
    hi: int
    count: int
    step: int
    axis: int


@dataclass(frozen=True)
class AccessPlan:
    """A resolved index: result shape, per-tensor-dim spans, and the NumPy key for numerics."""

    shape: tuple[int, ...]
    spans: tuple[DimSpan, ...]
    key: tuple[Any, ...]
    basic: bool  # True when ``key`` is ints and slices only (a NumPy view, writable in place)
    outside: np.ndarray | None = None  # where an index expression points outside the tensor
    outside_text: str = ""

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class IndexError_(IndexError):
    """An access outside the tensor (the caller turns it into an NkiError with the kernel line)."""


def resolve_key(shape: tuple[int, ...], key: Any) -> AccessPlan:
    """Resolve ``tensor[key]`` for a tensor of ``shape``."""
    keys = list(key) if isinstance(key, tuple) else [key]
    if any(k is Ellipsis for k in keys):
        at = next(i for i, k in enumerate(keys) if k is Ellipsis)
        fill = len(shape) - (len(keys) - 1)
        keys[at : at + 1] = [slice(None)] * max(fill, 0)
    if len(keys) > len(shape):
        raise IndexError_(f"{len(keys)} indices for a tensor of {len(shape)} dimensions {list(shape)}")
    keys += [slice(None)] * (len(shape) - len(keys))
    if any(isinstance(k, IndexExpr) or (isinstance(k, np.ndarray) and k.ndim > 0) for k in keys):
        return _advanced(shape, keys)
    spans: list[DimSpan] = []
    out: list[int] = []
    np_key: list[Any] = []
    for dim, (k, n) in enumerate(zip(keys, shape)):
        if isinstance(k, slice):
            start, stop, step = k.start, k.stop, k.step or 1
            start = 0 if start is None else int(start)
            stop = n if stop is None else int(stop)
            if start < 0:
                start += n
            if stop < 0:
                stop += n
            if start < 0 or stop > n or (stop < start and step > 0):
                raise IndexError_(f"slice {start}:{stop} of dimension {dim} is outside [0, {n})")
            count = max(0, math.ceil((stop - start) / step))
            spans.append(
                DimSpan(start, start + (count - 1) * step + 1 if count else start, count, step, len(out))
            )
            out.append(count)
            np_key.append(slice(start, stop, step))
        else:
            v = int(k)
            if v < 0:
                v += n
            if not 0 <= v < n:
                raise IndexError_(f"index {int(k)} of dimension {dim} is outside [0, {n})")
            spans.append(DimSpan(v, v + 1, 1, 1, -1))
            np_key.append(v)
    return AccessPlan(tuple(out), tuple(spans), tuple(np_key), True)


def _span(values: np.ndarray, varying: list[int]) -> DimSpan:
    """The range one dimension's index values cover (fast for the usual single-axis ramps)."""
    axis = varying[0] if len(varying) == 1 else (-1 if not varying else varying[-1])
    flat = values.ravel()
    if flat.size == 0:
        return DimSpan(0, 0, 0, 1, axis)
    if flat.size == 1:
        v = int(flat[0])
        return DimSpan(v, v + 1, 1, 1, axis)
    if len(varying) == 1:
        step = int(flat[1] - flat[0])
        if step > 0 and int(flat[-1]) - int(flat[0]) == step * (flat.size - 1) and \
                (flat.size < 3 or bool(np.all(np.diff(flat) == step))):
            return DimSpan(int(flat[0]), int(flat[-1]) + 1, int(flat.size), step, axis)
    uniq = np.unique(flat)
    count = int(uniq.size)
    step = int(uniq[1] - uniq[0]) if count > 1 else 1
    if count > 1 and not np.all(np.diff(uniq) == step):
        step = 0  # irregular
    return DimSpan(int(uniq[0]), int(uniq[-1]) + 1, count, step, axis)


def _advanced(shape: tuple[int, ...], keys: list[Any]) -> AccessPlan:
    arrays: list[np.ndarray] = []
    for k in keys:
        if isinstance(k, IndexExpr):
            arrays.append(k.values)
        elif isinstance(k, np.ndarray):
            arrays.append(k.astype(np.int64))
    ndim = max(a.ndim for a in arrays)
    slice_dims = sum(1 for k in keys if isinstance(k, slice))
    result_ndim = ndim + slice_dims
    np_key: list[Any] = []
    spans: list[DimSpan] = []
    next_axis = ndim
    shapes: list[tuple[int, ...]] = []
    outside: np.ndarray | None = None
    text = ""
    for dim, (k, n) in enumerate(zip(keys, shape)):
        if isinstance(k, (IndexExpr, np.ndarray)):
            values = k.values if isinstance(k, IndexExpr) else k.astype(np.int64)
            values = values.reshape((1,) * (ndim - values.ndim) + values.shape)
            values = values.reshape(values.shape + (1,) * slice_dims)
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            values = np.arange(start, stop, step, dtype=np.int64)
            shp = [1] * result_ndim
            shp[next_axis] = values.size
            values = values.reshape(shp)
            next_axis += 1
        else:
            values = np.full((1,) * result_ndim, int(k) + (n if int(k) < 0 else 0), np.int64)
        if values.size:
            lo, hi = int(values.min()), int(values.max())
            if lo < 0 or hi >= n:
                # allowed only where a mask turns the access off: checked by the instruction
                bad = (values < 0) | (values >= n)
                outside = bad if outside is None else (outside | bad)
                text = text or f"index range [{lo}, {hi}] of dimension {dim} is outside [0, {n})"
                values = np.clip(values, 0, n - 1)
        varying = [a for a in range(values.ndim) if values.shape[a] > 1]
        spans.append(_span(values, varying))
        np_key.append(values)
        shapes.append(values.shape)
    out_shape = tuple(int(s) for s in np.broadcast_shapes(*shapes))
    if outside is not None:
        outside = np.broadcast_to(outside, out_shape)
    return AccessPlan(out_shape, tuple(spans), tuple(np_key), False, outside, text)


__all__ = [
    "AccessPlan",
    "DimSpan",
    "Grid",
    "IndexError_",
    "IndexExpr",
    "Mask",
    "arange",
    "mgrid",
    "resolve_key",
]
