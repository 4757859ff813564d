"""Running a kernel: tensors, tiles and the trace that turns each NKI call into engine instructions.

A kernel runs eagerly, as plain Python: every ``nl``/``nisa`` call computes its values on NumPy at
once (unless the run is timing-only, when tensors carry shapes and no values) and appends the
instructions it stands for to a :class:`KernelTrace`, through the compiler's own
:class:`~neuroncore.compiler.emitter.Emitter` with the compiler's cost formulas
(``neuroncore.compiler.costs``). The emitter derives every dependency from the memory ranges each
instruction reads and writes (tile by tile) and turns cross-engine ones into semaphores; loads and
stores become DMA transfers on queues. ``affine_range`` loops are unrolled with no ordering between
iterations beyond their data, so the scheduler overlaps them as the compiler pipelines them;
``sequential_range`` iterations wait for everything of the previous iteration. When the kernel
returns, :meth:`KernelTrace.program` is an ordinary :class:`~neuroncore.compiler.program.Program`
that the runtime loads, times and reports like any compiled model.

Each instruction remembers the kernel line that made it (``nki_source_location``) and the kernel's
frames down to that line, as the ops of the program's graph: the profile links both ways.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

import numpy as np

from neuroncore.compiler import costs
from neuroncore.compiler.counters import NO_COUNTERS, NodeCounters
from neuroncore.compiler.emitter import (
    QUEUE_SEMAPHORE_BASE,
    WHOLE_BUFFER,
    WHOLE_TENSOR,
    Emitter,
    MemoryKey,
    Rect,
)
from neuroncore.compiler.lowering_state import HbmTensorKind
from neuroncore.compiler.node_semantics import NOP
from neuroncore.compiler.program import RES_DMA, DmaQueue, HbmTensor, Program
from neuroncore.enums import DmaQueueType
from neuroncore.hardware import CoreSpec, Engine
from neuroncore.ir.graph import Graph, Op, SourceFrame
from neuroncore.nki import dtypes as ndt
from neuroncore.nki.errors import NkiError
from neuroncore.nki.indexing import AccessPlan, IndexError_, Mask, resolve_key

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_EXAMPLES_DIR = os.path.join(_PKG_DIR, "examples")


def _internal(filename: str) -> bool:
    """A frame of this package (not of a kernel, including our example kernels)."""
    return filename.startswith(_PKG_DIR) and not filename.startswith(_EXAMPLES_DIR)


SBUF = "sbuf"
PSUM = "psum"
HBM = "hbm"
SHARED_HBM = "shared_hbm"
PRIVATE_HBM = "private_hbm"
HBM_BUFFERS = (HBM, SHARED_HBM, PRIVATE_HBM)
ON_CHIP = (SBUF, PSUM)


class _Local(threading.local):
    trace: KernelTrace | None = None


_LOCAL = _Local()


def current() -> KernelTrace | None:
    """The trace of the kernel running on this thread, if any."""
    return _LOCAL.trace


def require_trace(api: str) -> KernelTrace:
    trace = _LOCAL.trace
    if trace is None:
        raise NkiError(
            f"{api} can only be called inside an NKI kernel (a function decorated with "
            f"@nki.jit, called with arrays)"
        )
    return trace


# ---------------------------------------------------------------------------------------------
# tensors and views


class _ElementwiseOperators:
    """Python operators on tiles and views, as nki.language's element-wise functions.

    One copy for `Tensor` and `View`: a kernel writes `a + b` on either, and both trace the same
    `language.binary` call. The in-place operators differ (a view accumulates into its region) and
    stay on each class.
    """

    __slots__ = ()

    def _bin(self, other: Any, op: str, reverse: bool = False) -> Tensor:
        from neuroncore.nki import language

        return (
            language.binary(op, other, self, reverse_name=True)
            if reverse
            else language.binary(op, self, other)
        )

    def __add__(self, o: Any) -> Tensor:
        return self._bin(o, "add")

    def __radd__(self, o: Any) -> Tensor:
        return self._bin(o, "add", True)

    def __sub__(self, o: Any) -> Tensor:
        return self._bin(o, "subtract")

    def __rsub__(self, o: Any) -> Tensor:
        return self._bin(o, "subtract", True)

    def __mul__(self, o: Any) -> Tensor:
        return self._bin(o, "multiply")

    def __rmul__(self, o: Any) -> Tensor:
        return self._bin(o, "multiply", True)

    def __truediv__(self, o: Any) -> Tensor:
        return self._bin(o, "divide")

    def __rtruediv__(self, o: Any) -> Tensor:
        return self._bin(o, "divide", True)

    def __pow__(self, o: Any) -> Tensor:
        return self._bin(o, "power")

    def __neg__(self) -> Tensor:
        from neuroncore.nki import language

        return language.negative(self)


class Tensor(_ElementwiseOperators):
    """An NKI tensor: in HBM (kernel inputs and outputs) or on chip (a tile in SBUF or PSUM).

    ``pdim`` is the partition dimension of an on-chip tensor (0 unless declared with ``nl.par_dim``
    further in); the dimensions before it are blocks of tiles, the ones after it the free dims.
    """

    __array_priority__ = 100

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: ndt.NkiDtype,
        buffer: str,
        trace: KernelTrace,
        *,
        name: str,
        data: np.ndarray | None = None,
        pdim: int = 0,
        key: MemoryKey | None = None,
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.buffer = buffer
        self.trace = trace
        self.name = name
        self.data = data
        self.pdim = pdim
        self.key: MemoryKey = key if key is not None else trace.new_key(buffer)
        self.fresh_node: int | None = None  # made by one instruction and not used yet: may be retargeted

    # -- shape ------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def __repr__(self) -> str:
        return f"{self.name}: {self.dtype}{list(self.shape)} in {self.buffer}"

    def __len__(self) -> int:
        return self.shape[0]

    # -- indexing ---------------------------------------------------------------------------
    def whole(self) -> View:
        return View(self, resolve_key(self.shape, ...), None)

    def __getitem__(self, key: Any) -> View:
        return View(self, self.trace.resolve(self, key), None)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.trace.assign(self[key], value)

    def reshape(self, shape: Any, *more: int) -> Tensor:
        new = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape), *more)
        if math.prod(new) != self.size:
            raise self.trace.error(f"cannot reshape {list(self.shape)} to {list(new)}")
        data = None if self.data is None else self.data.reshape(new)
        return Tensor(new, self.dtype, self.buffer, self.trace, name=self.name, data=data, key=self.key)

    def broadcast_to(self, shape: tuple[int, ...]) -> View:
        return self.whole().broadcast_to(shape)

    def view(self, dtype: Any) -> Tensor:
        new = ndt.resolve(dtype)
        if new.itemsize != self.dtype.itemsize:
            raise self.trace.error("view() between types of different sizes is not supported")
        return Tensor(
            self.shape,
            new,
            self.buffer,
            self.trace,
            name=self.name,
            data=self.data,
            key=self.key,
            pdim=self.pdim,
        )

    def __iadd__(self, o: Any) -> Tensor:
        self.whole().__iadd__(o)
        return self

    def __isub__(self, o: Any) -> Tensor:
        self.whole().__isub__(o)
        return self

    def __imul__(self, o: Any) -> Tensor:
        self.whole().__imul__(o)
        return self


class View(_ElementwiseOperators):
    """A region of a tensor selected by an index (and optionally a mask or a broadcast)."""

    __array_priority__ = 100

    def __init__(
        self, tensor: Tensor, plan: AccessPlan, mask: Mask | None, bcast: tuple[int, ...] | None = None
    ) -> None:
        self.tensor = tensor
        self.plan = plan
        self.mask = mask
        self.bcast = bcast

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bcast if self.bcast is not None else self.plan.shape

    @property
    def dtype(self) -> ndt.NkiDtype:
        return self.tensor.dtype

    @property
    def buffer(self) -> str:
        return self.tensor.buffer

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"{self.tensor.name}[...]: {self.dtype}{list(self.shape)} in {self.buffer}"

    def __getitem__(self, key: Any) -> View:
        if key is Ellipsis or (
            isinstance(key, tuple) and all(k is Ellipsis or k == slice(None) for k in key)
        ):
            return self
        if self.bcast is None and self.plan.basic:
            return self.tensor.trace.compose(self, key)
        raise self.tensor.trace.error(
            "indexing an indexed or broadcast tile again is not supported; index the tensor once"
        )

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tensor.trace.assign(self[key], value)

    def broadcast_to(self, shape: tuple[int, ...]) -> View:
        shape = tuple(int(s) for s in shape)
        try:
            np.broadcast_shapes(self.plan.shape, shape)
        except ValueError:
            raise self.tensor.trace.error(
                f"cannot broadcast {list(self.plan.shape)} to {list(shape)}"
            ) from None
        return View(self.tensor, self.plan, self.mask, shape)

    # -- values ---------------------------------------------------------------------------
    def read(self) -> np.ndarray:
        data = self.tensor.data
        assert data is not None
        values = data[self.plan.key]
        if self.bcast is not None:
            values = np.broadcast_to(values, self.bcast)
        return values

    def write(self, values: Any, mask: Mask | None = None) -> None:
        data = self.tensor.data
        assert data is not None
        plan = self.plan
        arr = self.tensor.dtype.cast(np.broadcast_to(np.asarray(values), plan.shape))
        mask = mask if mask is not None else self.mask
        if mask is None and plan.outside is None:
            data[plan.key] = arr
            return
        keep = np.ones(plan.shape, bool)
        if mask is not None:
            keep &= np.broadcast_to(mask.values, plan.shape)
        if plan.outside is not None:
            keep &= ~plan.outside
        if plan.basic:
            data[plan.key] = np.where(keep, arr, data[plan.key])
            return
        # element by element where the mask is on (clipped out-of-range indexes repeat elements)
        index = tuple(np.broadcast_to(k, plan.shape)[keep] for k in plan.key)
        data[index] = arr[keep]

    # -- geometry -------------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        """Partitions an on-chip access spans (rows of the first result axis for HBM)."""
        t = self.tensor
        if self.bcast is not None:
            return self.bcast[0] if self.bcast else 1
        if t.on_chip:
            return self.plan.spans[t.pdim].count
        return self.plan.shape[0] if self.plan.shape else 1

    @property
    def free(self) -> int:
        """Elements per partition."""
        return max(1, self.size // max(1, self.partitions))

    def active(self, mask: Mask | None) -> tuple[int, int]:
        """(partitions, free elements) the access really touches under ``mask``."""
        p, f = self.partitions, self.free
        mask = mask if mask is not None else self.mask
        if mask is None:
            return p, f
        m = mask.values
        if m.ndim == 0:
            return (p, f) if bool(m) else (0, 0)
        m2 = m.reshape(m.shape[0], -1) if m.ndim >= 2 else m.reshape(-1, 1)
        rows = int(m2.any(axis=1).sum())
        cols = int(m2.any(axis=0).sum())
        p_eff = rows if m2.shape[0] > 1 else p
        f_eff = cols * (f // max(1, m2.shape[1])) if m2.shape[1] > 1 else f
        return min(p, p_eff), min(f, f_eff)

    def rect(self) -> Rect:
        """The bounding rectangle the access touches: (partitions or rows) x flattened free."""
        t = self.tensor
        spans = self.plan.spans
        pd = t.pdim if t.on_chip else 0
        p = spans[pd] if spans else None
        lo = hi = 0
        stride = 1
        for d in range(len(spans) - 1, -1, -1):
            if d == pd:
                continue
            s = spans[d]
            lo += s.lo * stride
            hi += max(s.hi - 1, s.lo) * stride
            stride *= t.shape[d]
        if p is None:
            return (0, 1, 0, 1)
        return (p.lo, max(p.hi, p.lo + 1), lo, hi + 1)

    def contiguous_run(self) -> int:
        """Elements of the longest contiguous run of this access in its tensor's row-major memory."""
        t = self.tensor
        run = 1
        for d in range(len(self.plan.spans) - 1, -1, -1):
            s = self.plan.spans[d]
            if s.count <= 1:
                continue
            if s.step != 1:
                return run
            run *= s.count
            if s.count != t.shape[d]:
                return run
        return run

    # -- in-place arithmetic -------------------------------------------------------------------
    # `view += x` accumulates into the view's region and stays the view (NKI's semantics), while
    # `view + x` makes a new tile; mypy wants the in-place result to be the binary one's type, hence
    # the `override` ignores.
    def __iadd__(self, o: Any) -> View:  # type: ignore[override]
        self.tensor.trace.accumulate(self, o, "add")
        return self

    def __isub__(self, o: Any) -> View:  # type: ignore[override]
        self.tensor.trace.accumulate(self, o, "subtract")
        return self

    def __imul__(self, o: Any) -> View:  # type: ignore[override]
        self.tensor.trace.accumulate(self, o, "multiply")
        return self


Operand = Tensor | View


def as_view(x: Operand) -> View:
    return x if isinstance(x, View) else x.whole()


# ---------------------------------------------------------------------------------------------
# the trace


@dataclass
class _SeqLoop:
    start: int  # first node of the current iteration
    barrier: list[int]  # nodes the current iteration waits for (the previous one's last per lane)


class KernelTrace:
    """Everything one kernel run emits; see the module docstring."""

    def __init__(self, spec: CoreSpec, *, name: str, code: CodeType | None, numerics: bool,
                 emitter: Emitter | None = None, queues: list[DmaQueue] | None = None,
                 host_op: int | None = None) -> None:
        """``emitter``, ``queues`` and ``host_op`` embed the kernel in a program being compiled (a
        kernel called inside a traced model): its instructions join that program as parts of IR op
        ``host_op``, on queues of its own added to ``queues``."""
        self.spec = spec
        self.name = name
        self.code = code
        self.numerics = numerics
        self.em = emitter if emitter is not None else Emitter(spec)
        self.host_op = host_op
        self._node_base = self.em.n_nodes
        self._queue_purpose_prefix = "Nki" if emitter is not None else ""
        self.queues: list[DmaQueue] = queues if queues is not None else []
        self._queue_by_name: dict[str, DmaQueue] = {q.name: q for q in self.queues}
        self.ops: list[Op] = []
        self._sites: dict[tuple[str, tuple[SourceFrame, ...]], int] = {}
        self._site_count: dict[str, int] = {}
        self.node_location: list[str | None] = []
        self._seq: list[_SeqLoop] = []
        self._next_key = 0
        self._psum_ring: list[MemoryKey | None] = [None] * spec.psum_banks
        self._psum_next = 0
        self._hbm_written: set[MemoryKey] = set()
        self._dma_slots: dict[tuple[int, str, Engine], int] = {}
        self._dma_slot_count: dict[tuple[str, Engine], int] = {}
        self.hbm_tensors: dict[str, HbmTensor] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.location: str | None = None
        self.frames: tuple[SourceFrame, ...] = ()
        self.api = ""
        self.returned: Tensor | None = None  # the HBM tensor the kernel returned (first, if several)
        self.grid_shape: tuple[int, ...] = (1,)
        self.grid_position: tuple[int, ...] = (0,)
        self._hbm_allocs: list[Tensor] = []
        self._hbm_alloc_index = 0

    # -- keys, errors, call sites -------------------------------------------------------------
    def new_key(self, buffer: str) -> MemoryKey:
        self._next_key += 1
        key: MemoryKey = ("hbm" if buffer in HBM_BUFFERS else "buf", self._next_key)
        if buffer == PSUM:
            self.em.psum_keys.add(key)
        return key

    def error(self, message: str) -> NkiError:
        return NkiError(message, self._locate()[0] or self.location)

    def _locate(self) -> tuple[str | None, tuple[SourceFrame, ...]]:
        """The kernel frames of the current NKI call, outermost first, and the innermost as file:line."""
        frame = sys._getframe(1)
        frames: list[SourceFrame] = []
        while frame is not None:
            code = frame.f_code
            if not _internal(code.co_filename):
                frames.append(SourceFrame(code.co_filename, frame.f_lineno, code.co_name))
                if code is self.code:
                    break
            elif frames:
                break  # back inside our package (the jit wrapper): the kernel's frames are done
            frame = frame.f_back  # type: ignore[assignment]
        if self.code is None:
            frames = frames[:1]
        frames.reverse()
        if not frames:
            return None, ()
        return f"{frames[-1].file}:{frames[-1].line}", tuple(frames)

    def enter(self, api: str) -> None:
        """Called by every NKI API function first: where in the kernel the call is made."""
        self.api = api
        self.location, self.frames = self._locate()

    def _site(self, shape: tuple[int, ...], dtype: ndt.NkiDtype) -> int:
        if self.host_op is not None:
            return self.host_op
        key = (self.api, self.frames)
        index = self._sites.get(key)
        if index is None:
            n = self._site_count.get(self.api, 0)
            self._site_count[self.api] = n + 1
            index = len(self.ops)
            self.ops.append(
                Op(
                    index,
                    self.api,
                    f"{self.api}.{n}",
                    (),
                    tuple(shape) or (1,),
                    dtype.core_dtype,
                    {},
                    self.name,
                    self.frames,
                )
            )
            self._sites[key] = index
        return index

    def start_program(self, position: tuple[int, ...]) -> None:
        """The next SPMD program of the launch grid: HBM tensors it allocates are the first program's
        (``shared_hbm`` outputs are one tensor for the whole grid)."""
        self.grid_position = position
        self._hbm_alloc_index = 0

    # -- tensors --------------------------------------------------------------------------
    def tensor(
        self,
        shape: tuple[int, ...],
        dtype: Any,
        buffer: str,
        *,
        name: str | None = None,
        pdim: int = 0,
        data: np.ndarray | None = None,
        zero: bool = False,
    ) -> Tensor:
        dt = ndt.resolve(dtype)
        shape = tuple(int(s) for s in shape)
        if (buffer in HBM_BUFFERS and any(p > 0 for p in self.grid_position)
                and self._hbm_alloc_index < len(self._hbm_allocs)):
            shared = self._hbm_allocs[self._hbm_alloc_index]
            self._hbm_alloc_index += 1
            return shared
        if any(s <= 0 for s in shape):
            raise self.error(f"tensor shape {list(shape)} has an empty dimension")
        if buffer in ON_CHIP:
            self._check_tile_shape(shape, dt, buffer, pdim)
        if data is None and self.numerics:
            # uninitialised memory: NaN like the real simulator, so a read before a write shows
            data = (
                np.zeros(shape, dt.working)
                if (zero or buffer == PSUM or not dt.is_float)
                else np.full(shape, np.nan, np.float32)
            )
        t = Tensor(
            shape, dt, buffer, self, name=name or f"{buffer}{self._next_key + 1}", data=data, pdim=pdim
        )
        if buffer == PSUM:
            self._claim_psum(t)
        elif buffer in HBM_BUFFERS:
            if name is None:
                t.name = f"hbm_{self._next_key}"
            if not any(p > 0 for p in self.grid_position):
                self._hbm_allocs.append(t)
        return t

    def _check_tile_shape(self, shape: tuple[int, ...], dt: ndt.NkiDtype, buffer: str, pdim: int) -> None:
        spec = self.spec
        if len(shape) == 0:
            return
        partitions = shape[pdim]
        if partitions > spec.partitions:
            raise self.error(
                f"partition dimension {partitions} of a {buffer} tile exceeds "
                f"{spec.partitions} (nl.tile_size.pmax)"
            )
        per_partition = math.prod(shape[pdim + 1 :]) * dt.itemsize
        blocks = math.prod(shape[:pdim])
        if buffer == SBUF and per_partition * blocks > spec.sbuf_bytes_per_partition:
            raise self.error(
                f"SBUF tensor {list(shape)} {dt} needs {per_partition * blocks} bytes per "
                f"partition; SBUF has {spec.sbuf_bytes_per_partition}"
            )
        if buffer == PSUM:
            bank = spec.psum_bank_bytes_per_partition
            if per_partition > bank:
                raise self.error(
                    f"PSUM tile {list(shape)} {dt} needs {per_partition} bytes per "
                    f"partition; a PSUM bank holds {bank} (nl.tile_size.psum_fmax = "
                    f"{bank // 4} fp32)"
                )
            if blocks > spec.psum_banks:
                raise self.error(
                    f"PSUM tensor {list(shape)} needs {blocks} banks; PSUM has {spec.psum_banks}"
                )

    def _claim_psum(self, t: Tensor) -> None:
        """Place a PSUM tensor in the next bank(s) of the ring of 8: it waits until every earlier
        user of those banks is done (the compiler's PSUM allocation, neuroncore.md §3.3)."""
        banks = max(1, math.prod(t.shape[: t.pdim]))
        for _ in range(banks):
            slot = self._psum_next
            self._psum_next = (slot + 1) % len(self._psum_ring)
            old = self._psum_ring[slot]
            if old is not None:
                self.em.inherit(t.key, WHOLE_BUFFER, self.em.users(old))
            self._psum_ring[slot] = t.key

    def input(self, name: str, shape: tuple[int, ...], dtype: Any, data: np.ndarray | None) -> Tensor:
        dt = ndt.resolve(dtype)
        t = Tensor(
            shape,
            dt,
            HBM,
            self,
            name=name,
            data=None if data is None or not self.numerics else dt.cast(data).copy(),
        )
        self.inputs.append(name)
        self.hbm_tensors[name] = HbmTensor(name, tuple(shape) or (1,), dt.core_dtype, HbmTensorKind.INPUT, -1)
        self._site_param(name, shape, dt)
        return t

    def _site_param(self, name: str, shape: tuple[int, ...], dt: ndt.NkiDtype) -> None:
        index = len(self.ops)
        self.ops.append(
            Op(index, "parameter", name, (), tuple(shape) or (1,), dt.core_dtype, {}, self.name, ())
        )

    def mark_output(self, t: Tensor) -> None:
        self.outputs.append(t.name)
        self.hbm_tensors[t.name] = HbmTensor(
            t.name, t.shape or (1,), t.dtype.core_dtype, HbmTensorKind.OUTPUT, -1
        )

    # -- indexing -------------------------------------------------------------------------
    def resolve(self, t: Tensor, key: Any) -> AccessPlan:
        try:
            return resolve_key(t.shape, key)
        except IndexError_ as exc:
            raise self.error(f"out-of-bounds access to {t.name} {list(t.shape)}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise self.error(f"bad index for {t.name} {list(t.shape)}: {exc}") from None

    def compose(self, view: View, key: Any) -> View:
        """``t[a:b, c:d][key]``: one index into ``t`` (basic indexes only)."""
        try:
            inner = resolve_key(view.plan.shape, key)
        except IndexError_ as exc:
            raise self.error(f"out-of-bounds access to a tile of {view.tensor.name}: {exc}") from None
        if not inner.basic:
            raise self.error(
                "index expressions on an already sliced tile are not supported; index the tensor once"
            )
        keys: list[Any] = []
        axis = 0
        for dim_key in view.plan.key:
            if isinstance(dim_key, slice):
                start, step = dim_key.start, dim_key.step or 1
                k = inner.key[axis]
                axis += 1
                if isinstance(k, slice):
                    kstep = k.step or 1
                    keys.append(slice(start + k.start * step, start + k.stop * step, step * kstep))
                else:
                    keys.append(start + int(k) * step)
            else:
                keys.append(dim_key)
        return View(view.tensor, self.resolve(view.tensor, tuple(keys)), view.mask)

    def check_bounds(self, v: View, mask: Mask | None) -> None:
        """An index expression past the tensor's end is allowed only where the mask is off."""
        outside = v.plan.outside
        if outside is None:
            return
        mask = mask if mask is not None else v.mask
        if mask is not None:
            m = np.broadcast_to(mask.values, outside.shape) if mask.values.ndim <= outside.ndim else None
            if m is not None and not (outside & m).any():
                return
        raise self.error(
            f"out-of-bounds access to {v.tensor.name} {list(v.tensor.shape)}: "
            f"{v.plan.outside_text}" + ("" if mask is not None else " (no mask covers it)")
        )

    # -- loops ----------------------------------------------------------------------------
    def sequential(self, iterations: range) -> Iterator[int]:
        loop = _SeqLoop(self.em.n_nodes, [])
        self._seq.append(loop)
        try:
            for i in iterations:
                if self.em.n_nodes > loop.start:
                    loop.barrier = self.em.compact(list(range(loop.start, self.em.n_nodes)))
                    loop.start = self.em.n_nodes
                yield i
        finally:
            self._seq.remove(loop)

    def _barrier(self) -> set[int]:
        deps: set[int] = set()
        for loop in self._seq:
            deps.update(loop.barrier)
        return deps

    # -- emission -------------------------------------------------------------------------
    def key_rect(self, v: View, write: bool) -> list[tuple[MemoryKey, Rect]]:
        t = v.tensor
        if not t.on_chip:
            if t.key[1].__class__ is str:  # a tensor of the model the kernel is embedded in
                return [(t.key, WHOLE_TENSOR)]
            if write:
                self._hbm_written.add(t.key)
            elif t.key not in self._hbm_written:
                return []  # never written by the kernel: no hazard to order against
        return [(t.key, v.rect())]

    def _after_emit(self, site_shape: tuple[int, ...], dtype: ndt.NkiDtype) -> None:
        pad = self.em.n_nodes - self._node_base - len(self.node_location)
        self.node_location.extend([self.location] * pad)

    def instruction(
        self,
        engine: Engine,
        opcode: str,
        cycles: float,
        *,
        reads: list[View],
        writes: list[View],
        text: str,
        track: int | None = None,
        counters: NodeCounters = NO_COUNTERS,
        activation_fn: str | None = None,
        tensor_instruction_type: str | None = None,
        shape: tuple[int, ...] = (1,),
        dtype: ndt.NkiDtype = ndt.float32,
    ) -> int:
        self.em.current_op = self._site(shape, dtype)
        r = [kr for v in reads for kr in self.key_rect(v, False)]
        w = [kr for v in writes for kr in self.key_rect(v, True)]
        node = self.em.instruction(
            engine,
            opcode,
            costs.cycles_to_ns(self.spec, engine, cycles),
            reads=r,
            writes=w,
            text=text,
            semantics=NOP,
            track=track,
            activation_fn=activation_fn,
            tensor_instruction_type=tensor_instruction_type,
            extra_deps=self._barrier() or None,
            counters=counters,
        )
        self._after_emit(shape, dtype)
        return node

    def _queue(self, name: str, qtype: DmaQueueType, engine: Engine) -> DmaQueue:
        q = self._queue_by_name.get(name)
        if q is None:
            q = DmaQueue(len(self.queues), name, qtype, engine, QUEUE_SEMAPHORE_BASE + len(self.queues))
            self.queues.append(q)
            self._queue_by_name[name] = q
        return q

    def dma(self, dst: View, src: View, *, mask: Mask | None = None, engine: Engine | None = None) -> int:
        """A DMA transfer from ``src`` to ``dst``: descriptors from the HBM side's contiguous runs and
        the SBUF side's partition rows (neuroncore.md §5.2-5.3), costed by the compiler's formula."""
        self.check_bounds(src, mask)
        self.check_bounds(dst, mask)
        self.em.current_op = self._site(dst.shape, dst.dtype)
        p, f = dst.active(mask) if dst.tensor.on_chip else src.active(mask)
        itemsize = max(src.dtype.itemsize, dst.dtype.itemsize)
        elements = p * f
        nbytes = elements * itemsize
        runs = [v.contiguous_run() for v in (src, dst) if not v.tensor.on_chip]
        chip = [v for v in (src, dst) if v.tensor.on_chip]
        run = min(runs) if runs else elements
        if chip:
            run = min(run, max(1, f))  # every partition row is its own buffer
        run = max(1, min(run, max(1, elements)))
        descriptors = max(1, math.ceil(elements / run))
        if src.tensor.on_chip and not dst.tensor.on_chip:
            purpose, qtype = "Out", DmaQueueType.OUTPUT
        elif not src.tensor.on_chip and dst.tensor.on_chip:
            purpose, qtype = "IO", DmaQueueType.INPUT
        else:
            purpose, qtype = "Data", DmaQueueType.DATA
        trigger = engine
        if trigger is None and src.tensor.on_chip:
            # stores are triggered by the engine that produced the data (as the compiler does)
            writer = self.em.last_writer_engine(src.tensor.key)
            trigger = writer if writer not in (None, Engine.TENSOR) else Engine.SYNC
        trigger = trigger or Engine.SYNC
        # each DMA statement of the kernel gets its own queue (of the 16 an engine has), so the
        # transfers of one statement are issued in order and different statements' overlap
        slot_key = (self.em.current_op, purpose, trigger)
        slot = self._dma_slots.get(slot_key)
        if slot is None:
            used = self._dma_slot_count.get((purpose, trigger), 0)
            slot = used % self.spec.dma_queues_per_engine
            self._dma_slot_count[(purpose, trigger)] = used + 1
            self._dma_slots[slot_key] = slot
        qname = f"q{trigger.label}{self._queue_purpose_prefix}{purpose}{slot}"
        queue = self._queue(qname, qtype, trigger)
        counters = NodeCounters(
            hbm_read_bytes=0 if src.tensor.on_chip else nbytes,
            hbm_write_bytes=0 if dst.tensor.on_chip else nbytes,
            sbuf_read_bytes=nbytes if src.buffer == SBUF else 0,
            sbuf_write_bytes=nbytes if dst.buffer == SBUF else 0,
            psum_read_bytes=nbytes if src.buffer == PSUM else 0,
            psum_write_bytes=nbytes if dst.buffer == PSUM else 0,
            dma_bytes=nbytes,
        )
        reads = self.key_rect(src, False)
        writes = self.key_rect(dst, True)
        node = self.em.dma(
            queue,
            reads=reads,
            writes=writes,
            engines=costs.dma_engines_used(self.spec, descriptors),
            engine_ns=costs.dma_engine_ns(self.spec, descriptors, max(1, nbytes // descriptors)),
            trigger_cost_ns=costs.cycles_to_ns(self.spec, trigger, self.spec.sync_instruction_cycles),
            text=f"{src.tensor.name} -> {dst.tensor.name} {nbytes}B {descriptors}x{nbytes // descriptors}B",
            semantics=NOP,
            counters=counters,
        )
        barrier = self._barrier()
        if barrier:
            self.add_deps(node - 1, barrier)
        self._after_emit(dst.shape, dst.dtype)
        return node

    def add_deps(self, node: int, deps: set[int]) -> None:
        """Make an already emitted node wait for more (earlier) nodes."""
        em = self.em
        extra = {em.ls_alias(d) for d in deps if d < node}
        if extra:
            em.deps[node] = em.compact(set(em.deps[node]) | extra)

    def retarget(self, node: int, dst: View) -> None:
        """A fresh tile's producer writes ``dst`` directly (``dst[...] = nl.load(...)``)."""
        em = self.em
        writes = self.key_rect(dst, True)
        waiter = node - 1 if em.resource[node] == RES_DMA else node
        lane = em.lane_of(node)
        self.add_deps(waiter, em.hazards_for(lane, [], writes))
        em.record_access(node, lane, [], writes)

    # -- assignment and accumulation ----------------------------------------------------------
    def assign(self, dst: View, value: Any) -> None:
        from neuroncore.nki import language

        self.enter("assign")
        if (
            isinstance(value, View)
            and value.tensor.key == dst.tensor.key
            and value.bcast is None
            and value.plan.spans == dst.plan.spans
        ):
            return  # ``t[i] += x`` assigns the updated view back to itself
        if (isinstance(value, Tensor) and value.fresh_node is not None and value.shape == dst.shape) or (
            isinstance(value, Tensor) and value.fresh_node is not None and math.prod(value.shape) == dst.size
        ):
            assert isinstance(value, Tensor) and value.fresh_node is not None
            self.retarget(value.fresh_node, dst)
            value.fresh_node = None
            if self.numerics:
                dst.write(
                    np.asarray(value.data).reshape(dst.plan.shape)
                    if value.data is not None and value.data.size == dst.plan.size
                    else value.data
                )
            return
        language.copy_into(dst, value)

    def accumulate(self, dst: View, value: Any, op: str) -> None:
        from neuroncore.nki import language

        self.enter("accumulate")
        if (
            op == "add"
            and dst.buffer == PSUM
            and isinstance(value, Tensor)
            and value.fresh_node is not None
            and self.em.opcode[value.fresh_node] == "MATMUL"
        ):
            # ``psum[...] += nl.matmul(...)``: the matmul accumulates into the PSUM tile itself
            self.retarget(value.fresh_node, dst)
            value.fresh_node = None
            if self.numerics:
                dst.write(dst.read() + np.asarray(value.data).reshape(dst.plan.shape))
            return
        language.binary_into(dst, op, dst, value)

    # -- the program ----------------------------------------------------------------------
    def program(self) -> Program:
        """The kernel's instructions as a runtime program (see ``neuroncore.compiler._finalize``)."""
        from neuroncore.compiler import assemble

        graph = Graph(self.name, list(self.ops), [o for o in self.ops if o.opcode == "parameter"], [])
        pad = self.em.n_nodes - len(self.node_location)
        self.node_location.extend([None] * pad)
        program = assemble(
            self.em,
            graph,
            self.spec,
            self.queues,
            buffers={},
            hbm_tensors=dict(self.hbm_tensors),
            input_tensors=list(self.inputs),
            output_tensors=list(self.outputs),
            nki_source_location=list(self.node_location),
            stats={"nki_kernel": self.name},
        )
        program.dma_queue_serial = True
        return program


def activate(trace: KernelTrace | None) -> KernelTrace | None:
    previous = _LOCAL.trace
    _LOCAL.trace = trace
    return previous


__all__ = [
    "HBM",
    "HBM_BUFFERS",
    "ON_CHIP",
    "PRIVATE_HBM",
    "PSUM",
    "SBUF",
    "SHARED_HBM",
    "KernelTrace",
    "Operand",
    "Tensor",
    "View",
    "activate",
    "as_view",
    "current",
    "require_trace",
]
