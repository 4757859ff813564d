"""JAX frontend: a jittable function -> its un-optimized HLO -> HLO-level IR.

    converted = convert(fn, (x, mask), autocast=None)   # used by neuroncore.trace / neuroncore.check

``jax.jit(fn, keep_unused=True).lower(*example_inputs)`` gives the HLO module JAX hands to XLA before
any optimization (no fusions, no layout assignment). It is read from its text form, printed with
metadata and large constants, and the stack-frame table is read from the serialized HloModuleProto.
Each HLO instruction becomes IR ops located at:

* **name**: the instruction's own HLO name (``dot_general.3``, ``add.7``) on the op that computes
  it; helper ops a mapping needs get ``<hlo name>.<role>`` (``dot_general.3.lhs_transpose``). An
  instruction of a computation inlined twice gets ``<name>@<call name>`` the second time.
* **layer**: the ``op_name`` metadata, split on ``/``, without its last component (the primitive,
  ``dot_general``). ``jit(f)`` (and other ``transform(f)`` wrappers) become ``f``; ``jit(main)``
  and JAX's private helpers (``jit(_where)``, ``jit(_take)``) are dropped; named scopes and einsum
  specs are kept: ``jit(attention)/bqhd,bkhd->bhqk/dot_general`` -> ``attention/bqhd,bkhd->bhqk``.
  Inside a called computation op names are relative, so they are appended to the call's op name.
  An instruction without metadata (constants, broadcasts of constants) takes the location of its
  first user.
* **frames**: the instruction's stack frame chain (outermost first, at most ``MAX_FRAMES``, frames
  from neuroncore's own files dropped), after the call site's frames for called computations; or
  ``source_file``/``source_line`` when that is all the metadata has.

Closed-over arrays become weights (``constant`` with an array initializer), scalar and splat
constants become immediates, and scalar arithmetic on constants is folded. ``call`` (and
``fusion``, should optimized HLO ever be given) is inlined;
``reduce`` with an add/max/min/and/or computation becomes ``reduce`` sum/max; ``dot_general`` is
arranged into the IR's ``dot`` (batch dims first, one contracting dim) with transposes/reshapes;
``erf`` becomes XLA's own rational approximation; an ascending ``sort`` (one key or several) is
a rank sort. Anything else (a ``while`` reading data, a ``sort`` with another comparator,
``custom-call`` ...) is emitted under its HLO opcode, so ``neuroncore.check`` lists it.
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import re
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from neuroncore.dtypes import DType, round_to
from neuroncore.frontends import conv_lowering, jax_indexing, jax_random
from neuroncore.frontends.flip import flip
from neuroncore.frontends.hlo import (
    FrameTable,
    HloComputation,
    HloInstruction,
    HloShape,
    frames_from_proto,
    frames_from_text,
    ints,
    literal_values,
    parse_hlo_module,
)
from neuroncore.frontends.rank_sort import rank_sort
from neuroncore.frontends.tracing import Converted, TraceError
from neuroncore.ir import semantics, threefry
from neuroncore.ir.builder import MAX_FRAMES, GraphBuilder
from neuroncore.ir.graph import ALL_OPS, BINARY_OPS, UNARY_OPS, Graph, Op, SourceFrame

NKI_CALL_TARGET_PREFIX = "neuronscope_nki:"
MAX_UNROLL = 4096  # iterations of a trace-time-known ``while`` (scan, fori_loop) unrolled at most
"""``custom_call_target`` of an NKI kernel called inside a traced function (``neuroncore.nki.embed``),
followed by the call's key."""

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _package_dir(package: types.ModuleType) -> str:
    """The directory a package was imported from, with a trailing separator."""
    if package.__file__ is None:
        raise ImportError(f"{package.__name__} has no __file__: cannot tell its frames from user code")
    return os.path.dirname(os.path.abspath(package.__file__)) + os.sep


_LIBRARY_DIRS = tuple(_package_dir(m) for m in (jax, jaxlib, np))

# HLO element types -> IR dtypes. Integers travel as int32 (JAX uses 32-bit ints unless x64 is on).
_DTYPES = {
    "f32": DType.FP32, "f64": DType.FP32, "bf16": DType.BF16, "f16": DType.FP16, "pred": DType.PRED,
    "f8e4m3fn": DType.FP8_E4M3, "f8e5m2": DType.FP8_E5M2,  # the Tensor engine's FP8 inputs
    **{t: DType.INT32 for t in ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64")},
}
# HLO opcodes the IR has under the same name; erf keeps XLA's own approximation (_op_erf), which
# is what JAX computes, rather than the IR's exact erf
_UNARY = UNARY_OPS - {"erf"}
_BINARY = BINARY_OPS
_COMBINERS = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "prod", "and": "and",
              "or": "or"}
_IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf, "and": 1.0, "or": 0.0}
# XLA's f32 erf (Eigen's generic_fast_erf_float): x * P(x^2) / Q(x^2) on x clamped to [-4, 4]
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)


def _is_own_file(path: str) -> bool:
    path = os.path.abspath(path)
    return path.startswith(_PACKAGE_DIR + os.sep) and "/workloads/" not in path


# =============================================================================================
# Layer paths
# =============================================================================================

_WRAPPED = re.compile(r"^[\w\-]+\((.*)\)$")


def _unwrap(component: str) -> tuple[str, bool]:
    """``jit(f)`` -> (``f``, True); ``transpose(jvp(f))`` -> (``f``, True); ``enc`` -> (``enc``, False)."""
    wrapped = False
    while (m := _WRAPPED.match(component)) is not None:
        component, wrapped = m.group(1), True
    return component, wrapped


def layer_path(components: Sequence[str]) -> str:
    """The layer path of an op_name's scope components (see the module docstring)."""
    out: list[str] = []
    for component in components:
        name, wrapped = _unwrap(component)
        if not name or (out and wrapped and (name == "main" or name.startswith("_"))):
            continue
        out.append(name)
    return "/".join(out)


# =============================================================================================
# Conversion
# =============================================================================================

Val = Any  # an Op, or a tuple of Vals for tuple-shaped HLO values


@dataclass(frozen=True)
class _Scope:
    """Where a computation is being inlined: the call's op_name components and frames."""

    path: tuple[str, ...]
    frames: tuple[SourceFrame, ...]
    layer: str
    call: str  # the call instruction's name ("" at the entry)


class _Unmappable(Exception):
    """Raised by a mapping that does not cover this form of its HLO opcode (the message says why)."""


class _Converter:
    def __init__(self, computations: dict[str, HloComputation], frame_table: FrameTable,
                 graph_name: str, fn_name: str, autocast: str | None,
                 def_frame: SourceFrame | None) -> None:
        self.computations = computations
        self.entry = next(c for c in computations.values() if c.is_entry)
        self.frame_table = frame_table
        self.b = GraphBuilder(graph_name, root_layer="", autocast=autocast)
        self.known: dict[int, float] = {}  # id(op) -> value of a scalar or splat constant
        self.primitive: dict[int, str] = {}  # id(op) -> JAX primitive (op_name's last component)
        self.reserved = {i.name for c in computations.values() for i in c.instructions}
        self.used: set[str] = set()
        self.def_frames = (def_frame,) if def_frame is not None else ()
        self.root_component = f"jit({fn_name})"
        for ins in self.entry.instructions:
            op_name = ins.metadata.get("op_name", "")
            if "/" in op_name:
                self.root_component = op_name.split("/")[0]
                break
        self.root_layer = layer_path([self.root_component]) or fn_name
        self._chains: dict[int, tuple[SourceFrame, ...]] = {}

    # -- names, locations -----------------------------------------------------------------------
    def _unique(self, name: str, scope: _Scope | None = None) -> str:
        if name in self.used and scope is not None and scope.call:
            name = f"{name}@{scope.call}"
        candidate, k = name, 0
        while candidate in self.used:
            k += 1
            candidate = f"{name}.{k}"
        self.used.add(candidate)
        return candidate

    def _aux(self, base: str, role: str) -> str:
        name, k = f"{base}.{role}", 0
        candidate = name
        while candidate in self.used or candidate in self.reserved:
            k += 1
            candidate = f"{name}{k}"
        self.used.add(candidate)
        return candidate

    def _chain(self, frame_id: int) -> tuple[SourceFrame, ...]:
        if frame_id not in self._chains:
            frames: list[SourceFrame] = []
            seen: set[int] = set()
            current = frame_id
            while current in self.frame_table and current not in seen:
                seen.add(current)
                frame, parent = self.frame_table[current]
                frames.append(frame)
                current = parent
            self._chains[frame_id] = tuple(reversed(frames))
        return self._chains[frame_id]

    def _own_frames(self, metadata: dict[str, str]) -> tuple[SourceFrame, ...] | None:
        if "stack_frame_id" in metadata:
            chain = self._chain(int(metadata["stack_frame_id"]))
            if chain:
                return chain
        if "source_file" in metadata:
            return (SourceFrame(metadata["source_file"], int(metadata.get("source_line", 0)), ""),)
        return None

    @staticmethod
    def _finish_frames(frames: Sequence[SourceFrame]) -> tuple[SourceFrame, ...]:
        kept = [f for f in frames if not _is_own_file(f.file)]
        return tuple(kept[-MAX_FRAMES:])

    def _locations(self, comp: HloComputation, scope: _Scope
                   ) -> dict[str, tuple[str, tuple[str, ...], tuple[SourceFrame, ...]]]:
        """(layer, op_name components, frames) of every instruction of one inlined computation."""
        users: dict[str, list[str]] = {i.name: [] for i in comp.instructions}
        for ins in comp.instructions:
            for operand in ins.operands:
                users.setdefault(operand, []).append(ins.name)
        result: dict[str, tuple[str, tuple[str, ...], tuple[SourceFrame, ...]]] = {}
        for ins in reversed(comp.instructions):
            op_name = ins.metadata.get("op_name", "")
            components: tuple[str, ...] | None = None
            if op_name and ins.opcode != "parameter":
                components = tuple(op_name.split("/"))
                if scope.call and components[0] != self.root_component:
                    components = scope.path + components
            frames = self._own_frames(ins.metadata)
            if frames is not None:
                frames = scope.frames + frames
            inherited = next((result[u] for u in users.get(ins.name, []) if u in result), None)
            if components is not None:
                layer = layer_path(components[:-1]) or self.root_layer
            elif inherited is not None:
                layer, components = inherited[0], inherited[1]
            else:
                layer, components = scope.layer, scope.path
            if frames is None:
                frames = inherited[2] if inherited is not None and not op_name else scope.frames
            result[ins.name] = (layer, components, frames)
        return result

    # -- driving ----------------------------------------------------------------------------------
    def convert(self) -> Graph:
        params: list[Op] = []
        entry_params = sorted((i for i in self.entry.instructions if i.opcode == "parameter"),
                              key=lambda i: int(i.literal))
        with self.b.located(self.root_layer, self._finish_frames(self.def_frames)):
            for ins in entry_params:
                if ins.shape.dtype is None:
                    raise TraceError(f"tuple-shaped parameter {ins.name} is not supported")
                if ins.shape.dtype == "u32":  # a key (or other 32-bit words): exact 16-bit halves
                    halves = self.b.parameter(self._unique(ins.name), (*ins.shape.dims, 2), DType.FP32)
                    halves.attrs["u32_halves"] = True
                    params.append(jax_random.key_input(halves, ins.shape.dims))  # type: ignore[arg-type]
                    continue
                params.append(self.b.parameter(self._unique(ins.name), ins.shape.dims,
                                               self._dtype(ins.shape, ins)))
        scope = _Scope((), (), self.root_layer, "")
        root = self._computation(self.entry, params, scope)
        outputs = self._outputs(_leaves(root))
        if not outputs:
            raise TraceError(f"{self.root_layer} returns no arrays: nothing to compile")
        graph = self.b.build(outputs)
        return _prune(graph)

    def _outputs(self, leaves: list[Op]) -> list[Op]:
        outputs: list[Op] = []
        for op in leaves:
            if any(op is o for o in outputs):  # the same value returned twice: give it a copy
                with self.b.located(op.layer, op.frames):
                    op = self.b.add_op("convert", [op], op.shape, op.dtype,
                                       name=self._aux(op.name, "copy"))
            outputs.append(op)
        return outputs

    def _computation(self, comp: HloComputation, args: Sequence[Val], scope: _Scope) -> Val:
        locations = self._locations(comp, scope)
        env: dict[str, Val] = {}
        for ins in comp.instructions:
            if ins.opcode == "parameter":
                env[ins.name] = args[int(ins.literal)]
                continue
            layer, components, frames = locations[ins.name]
            operands = [env[o] for o in ins.operands]
            if ins.opcode == "while":
                unrolled = self._while(ins, operands, components, frames, layer)
                if unrolled is not None:
                    env[ins.name] = unrolled
                    continue
            if ins.opcode in ("call", "fusion"):  # fusions only appear in optimized HLO
                callee = self.computations[_callee(ins.attrs.get("to_apply") or ins.attrs["calls"])]
                if callee.name.startswith("threefry2x32"):  # JAX's random bits: jax_random.py
                    env[ins.name] = jax_random.threefry_call(ins, operands)
                    continue
                inner = _Scope(components, frames, layer_path(components) or self.root_layer,
                               ins.name)
                env[ins.name] = self._computation(callee, operands, inner)
                continue
            with self.b.located(layer, self._finish_frames(frames)):
                value = env[ins.name] = self._instruction(ins, operands, scope)
            if isinstance(value, Op) and components:
                self.primitive.setdefault(id(value), components[-1])
        return env[comp.root.name]

    def _while(self, ins: HloInstruction, operands: list[Val], components: tuple[str, ...],
               frames: tuple[SourceFrame, ...], layer: str) -> Val | None:
        """A ``while`` whose condition is known at trace time on every iteration (``lax.scan``,
        ``fori_loop`` with constant bounds: a counter from a constant, a compare with a constant),
        unrolled: the body inlined once per iteration (``<name>@<while>.<k>``), its loop counter
        folded, so ``scan``'s per-step ``dynamic-slice`` / ``dynamic-update-slice`` of the stacked
        values are slices at constant offsets. neuronx-cc compiles static graphs; a loop whose trip
        count depends on data, or longer than ``MAX_UNROLL``, returns None and stays an
        unsupported ``while``."""
        cond = self.computations[_callee(ins.attrs["condition"])]
        body = self.computations[_callee(ins.attrs["body"])]
        state = operands[0]
        for k in range(MAX_UNROLL + 1):
            scope = _Scope(components, frames, layer_path(components) or self.root_layer,
                           f"{ins.name}.{k}")
            go = self._computation(cond, [state], scope)
            if not isinstance(go, Op) or id(go) not in self.known:
                return None
            if not self.known[id(go)]:
                return state
            if k == MAX_UNROLL:
                return None
            state = self._computation(body, [state], scope)
        return None

    # -- helpers for emitting ---------------------------------------------------------------------
    def _dtype(self, shape: HloShape, ins: HloInstruction, strict: bool = True) -> DType:
        assert shape.dtype is not None
        if shape.dtype not in _DTYPES:
            if not strict:  # an unsupported op's own result: listed by check(), never placed
                return DType.FP32
            raise TraceError(f"{ins.name} ({ins.opcode}): element type {shape.dtype} is not supported "
                             f"(supported: {', '.join(sorted(_DTYPES))})")
        return _DTYPES[shape.dtype]

    def _emit(self, opcode: str, operands: Sequence[Op], shape: Sequence[int], dtype: DType,
              name: str, **attrs: Any) -> Op:
        return self.b.add_op(opcode, operands, tuple(shape), dtype, name=name, **attrs)

    def _constant(self, value: float, shape: Sequence[int], dtype: DType, name: str) -> Op:
        value = float(round_to(np.asarray([value], np.float32), dtype)[0]) if math.isfinite(value) \
            else float(value)
        op = self._emit("constant", [], shape, dtype, name, value=value)
        self.known[id(op)] = value
        return op

    def _splat(self, x: Op, shape: Sequence[int], name: str) -> Op:
        """``x`` (a scalar) broadcast to ``shape``."""
        if tuple(shape) == x.shape:
            return x
        op = self._emit("broadcast", [x], shape, x.dtype, name, dims=())
        if id(x) in self.known:
            self.known[id(op)] = self.known[id(x)]
        return op

    def _binary(self, opcode: str, a: Op, b: Op, name: str) -> Op:
        folded = self._fold(opcode, [a, b], a.dtype)
        if folded is not None:
            return self._constant(folded, a.shape, a.dtype, name)
        fused = self._fusion(opcode, a, b, name)
        if fused is not None:
            return fused
        return self._emit(opcode, [a, b], a.shape, a.dtype, name)

    # -- fusions: exact expression shapes of jax.nn.softmax / gelu / sigmoid / silu ----------------
    def _fusion(self, opcode: str, a: Op, b: Op, name: str) -> Op | None:
        if opcode == "divide":
            x = self._softmax_input(a, b)
            if x is not None:
                return self._emit("softmax", [x], x.shape, x.dtype, name, axis=len(x.shape) - 1)
            x = self._logistic_input(a, b)
            if x is not None:
                return self._emit("logistic", [x], x.shape, x.dtype, name)
        if opcode != "multiply" or not a.dtype.is_float:
            return None
        for x, rest in ((a, b), (b, a)):
            if rest.opcode == "logistic" and rest.operands[0] is x:
                return self._emit("silu", [x], x.shape, x.dtype, name)
            if self._is_gelu_tanh_cdf(rest, x):
                return self._emit("gelu", [x], x.shape, x.dtype, name, approximate="tanh")
            gelu_input = self._gelu_erf_input(x, rest)
            if gelu_input is not None:
                return self._emit("gelu", [gelu_input], x.shape, x.dtype, name, approximate="none")
        return None

    def _is_splat(self, op: Op, value: float) -> bool:
        known = self.known.get(id(op))
        tolerance = 1e-6 if op.dtype is DType.FP32 else 1e-2  # constants rounded to bf16/fp16
        return known is not None and math.isclose(known, value, rel_tol=tolerance)

    @staticmethod
    def _orders(op: Op, opcode: str) -> list[tuple[Op, Op]]:
        """Both operand orders of a commutative ``opcode`` op; none if ``op`` is something else."""
        if op.opcode != opcode or len(op.operands) != 2:
            return []
        a, b = op.operands
        return [(a, b), (b, a)]

    def _softmax_input(self, e: Op, total: Op) -> Op | None:
        """``exp(x - max(x)) / sum(exp(...))`` over the last dim (max optionally clamped at -inf)."""
        n = len(e.shape)
        rows = tuple(range(n - 1))
        if (n == 0 or e.opcode != "exponential" or total.opcode != "broadcast"
                or total.attrs["dims"] != rows):
            return None
        s = total.operands[0]
        if s.opcode != "reduce" or s.attrs["kind"] != "sum" or s.attrs["dimensions"] != (n - 1,) \
                or s.operands[0] is not e or e.operands[0].opcode != "subtract":
            return None
        x, shift = e.operands[0].operands
        if shift.opcode != "broadcast" or shift.attrs["dims"] != rows:
            return None
        m = shift.operands[0]
        m = next((r for r, inf in self._orders(m, "maximum") if self._is_splat(inf, -math.inf)), m)
        if m.opcode != "reduce" or m.attrs["kind"] != "max" or m.attrs["dimensions"] != (n - 1,) \
                or m.operands[0] is not x:
            return None
        return x

    def _logistic_input(self, one: Op, denominator: Op) -> Op | None:
        """``1 / (1 + exp(-x))`` (how JAX lowers ``logistic``)."""
        if not self._is_splat(one, 1.0):
            return None
        for e, one_again in self._orders(denominator, "add"):
            if (self._is_splat(one_again, 1.0) and e.opcode == "exponential"
                    and e.operands[0].opcode == "negate"):
                return e.operands[0].operands[0]
        return None

    def _is_gelu_tanh_cdf(self, cdf: Op, x: Op) -> bool:
        """``0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``."""
        for p, half in self._orders(cdf, "multiply"):
            for t, one in self._orders(p, "add") if self._is_splat(half, 0.5) else []:
                if not self._is_splat(one, 1.0) or t.opcode != "tanh":
                    continue
                for q, c in self._orders(t.operands[0], "multiply"):
                    if not self._is_splat(c, math.sqrt(2.0 / math.pi)):
                        continue
                    for x1, r in self._orders(q, "add"):
                        for cube, k in self._orders(r, "multiply") if x1 is x else []:
                            if self._is_splat(k, 0.044715) and self._is_cube(cube, x):
                                return True
        return False

    def _is_cube(self, cube: Op, x: Op) -> bool:
        """``(x * x) * x`` in either order (how JAX expands ``x ** 3``)."""
        return any(x3 is x and any(u is x and v is x for u, v in self._orders(square, "multiply"))
                   for square, x3 in self._orders(cube, "multiply"))

    def _gelu_erf_input(self, half: Op, e: Op) -> Op | None:
        """``(x * 0.5) * erfc(-x * sqrt(1/2))``, erfc being the ops JAX tagged ``erfc``."""
        z = self._erfc_input(e)
        if z is None:
            return None
        for x, h in self._orders(half, "multiply"):
            if not self._is_splat(h, 0.5):
                continue
            for u, c in self._orders(z, "multiply"):
                if u.opcode == "negate" and u.operands[0] is x and self._is_splat(c, math.sqrt(0.5)):
                    return x
                if u is x and self._is_splat(c, -math.sqrt(0.5)):
                    return x
        return None

    def _erfc_input(self, e: Op) -> Op | None:
        """The one non-constant input of the ops tagged ``erfc`` that compute ``e``."""
        if self.primitive.get(id(e)) != "erfc":
            return None
        inputs: dict[int, Op] = {}
        seen: set[int] = set()
        stack = [e]
        while stack and len(seen) < 1000:
            op = stack.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            for o in op.operands:
                if id(o) in self.known:
                    continue
                if self.primitive.get(id(o)) == "erfc":
                    stack.append(o)
                else:
                    inputs[id(o)] = o
        return next(iter(inputs.values())) if len(inputs) == 1 and not stack else None

    def _unary(self, opcode: str, x: Op, name: str) -> Op:
        folded = self._fold(opcode, [x], x.dtype)
        if folded is not None:
            return self._constant(folded, x.shape, x.dtype, name)
        if not x.dtype.is_float and opcode in ("negate", "abs"):
            minus = self._constant(-1.0, (), x.dtype, self._aux(name, "minus_one"))
            negated = self._emit("multiply", [x, self._splat(minus, x.shape, self._aux(name, "bcast"))],
                                 x.shape, x.dtype, name if opcode == "negate" else self._aux(name, "neg"))
            if opcode == "negate":
                return negated
            return self._emit("maximum", [x, negated], x.shape, x.dtype, name)
        return self._emit(opcode, [x], x.shape, x.dtype, name)

    def _compare(self, a: Op, b: Op, direction: str, name: str) -> Op:
        folded = self._fold("compare", [a, b], DType.PRED, direction)
        if folded is not None:
            return self._constant(folded, a.shape, DType.PRED, name)
        return self._emit("compare", [a, b], a.shape, DType.PRED, name, direction=direction)

    def _scalar_like(self, value: float, like: Op, base: str, role: str) -> Op:
        c = self._constant(value, (), like.dtype, self._aux(base, role))
        return self._splat(c, like.shape, self._aux(base, role + "_bcast"))

    def _fold(self, opcode: str, operands: Sequence[Op], dtype: DType,
              direction: str | None = None) -> float | None:
        if not all(id(o) in self.known for o in operands):
            return None
        args = [np.asarray([self.known[id(o)]], np.float32) for o in operands]
        with np.errstate(all="ignore"):
            if opcode in semantics.UNARY:
                result = semantics.UNARY[opcode](args[0])
            elif opcode in semantics.BINARY:
                result = semantics.BINARY[opcode](args[0], args[1])
            elif opcode == "compare":
                result = semantics.COMPARE[direction or "EQ"](args[0], args[1])
            elif opcode == "convert":
                result = args[0]
            else:
                return None
        return float(round_to(np.asarray(result, np.float32), dtype)[0])

    def _reshape(self, x: Op, shape: Sequence[int], name: str) -> Op:
        """Reshape that aliases an identity and reads through a previous reshape."""
        shape = tuple(shape)
        while x.opcode == "reshape":
            x = x.operands[0]
        if x.shape == shape:
            return x
        if id(x) in self.known:
            return self._constant(self.known[id(x)], shape, x.dtype, name)
        return self._emit("reshape", [x], shape, x.dtype, name)

    def _transpose(self, x: Op, permutation: Sequence[int], name: str) -> Op:
        permutation = tuple(permutation)
        if permutation == tuple(range(len(permutation))):
            return x
        shape = tuple(x.shape[p] for p in permutation)
        if id(x) in self.known:
            return self._constant(self.known[id(x)], shape, x.dtype, name)
        return self._emit("transpose", [x], shape, x.dtype, name, permutation=permutation)

    def _convert(self, x: Op, dtype: DType, name: str) -> Op:
        if x.dtype is dtype:
            return x
        folded = self._fold("convert", [x], dtype)
        if folded is not None:
            return self._constant(folded, x.shape, dtype, name)
        return self._emit("convert", [x], x.shape, dtype, name)

    def _unsupported(self, ins: HloInstruction, operands: Sequence[Val]) -> Val:
        """An op the IR has no mapping for, under its HLO opcode (check() lists it). Extra tuple
        elements are zero stand-ins: a graph with an unsupported op is never executed."""
        leaves = ins.shape.leaves or [HloShape("f32", ())]
        flat = [o for v in operands for o in _leaves(v)]
        attrs = {k: v for k, v in ins.attrs.items() if k in (
            "to_apply", "custom_call_target", "dimensions", "condition", "body", "window")}
        first = self._emit(ins.opcode, flat, leaves[0].dims, self._dtype(leaves[0], ins, False),
                           ins.name,
                           **attrs)
        if ins.shape.dtype is not None:
            return first
        values = [first] + [self._emit("constant", [], leaf.dims, self._dtype(leaf, ins, False),
                                       self._aux(ins.name, f"element{k}"), value=0.0,
                                       stands_in_for=first.name)
                            for k, leaf in enumerate(leaves[1:], 1)]
        return _rebuild(ins.shape, iter(values))

    # -- instructions -----------------------------------------------------------------------------
    def _instruction(self, ins: HloInstruction, operands: list[Val], scope: _Scope) -> Val:
        code = ins.opcode
        if code == "tuple":
            return tuple(operands)
        if code == "get-tuple-element":
            return operands[0][int(ins.attrs["index"])]
        if code in ("copy", "optimization-barrier"):
            return operands[0]
        if code == "custom-call" and str(ins.attrs.get("custom_call_target", "")).strip("\"") == "Sharding":
            return operands[0]  # a sharding annotation (a typed jax.random.key is wrapped in one): identity
        name = self._unique(ins.name, scope)
        if jax_random.involved(ins, operands):  # 32/64-bit words: followed symbolically
            value = jax_random.evaluate(self, ins, operands, name)
            if value is not None:
                return value
            operands = [jax_random.materialize(self, ins, o, name) if jax_random.symbolic(o) else o
                        for o in operands]
        if code == "topk" and operands and isinstance(operands[0], Op) and operands[0].shape \
                and operands[0].dtype.is_float:
            return self._topk(ins, operands[0], name)
        if code == "sort":
            ordered = self._sort(ins, operands, name)
            if ordered is not None:
                return ordered
        if code == "reduce" and len(operands) == 4:
            arg = self._arg_extreme(ins, operands, name)
            if arg is not None:
                return arg
        if ins.shape.dtype not in _DTYPES:  # tuples (while, sort ...), complex numbers, tokens
            detail = "variadic" if ins.shape.dtype is None else ins.shape.dtype
            return self._unsupported_named(ins, operands, name, detail if code in ALL_OPS else "")
        shape, dtype = ins.shape.dims, self._dtype(ins.shape, ins)
        handler = getattr(self, "_op_" + code.replace("-", "_"), None)
        if code in _UNARY:
            return self._unary(code, operands[0], name)
        if code in _BINARY:
            return self._binary(code, operands[0], operands[1], name)
        if handler is not None:
            try:
                return handler(ins, operands, name, shape, dtype)
            except _Unmappable as unmappable:
                return self._unsupported_named(ins, operands, name, str(unmappable))
        return self._unsupported_named(ins, operands, name)

    def _arg_extreme(self, ins: HloInstruction, operands: list[Val], name: str
                     ) -> tuple[Op, Op] | None:
        """``jnp.argmax`` / ``jnp.argmin``: a variadic reduce of (values, indices) whose
        computation keeps the larger (smaller) value and, on a tie, the smaller index. Its result
        is the extreme value and the smallest index holding it: ``max(x)``, then the minimum of
        the indices where ``x`` equals it (fp32, exact below 2^24). None for any other variadic
        reduce, which stays unsupported. A NaN is not picked as JAX picks it."""
        x, index, _init_value, _init_index = operands
        kind = self._arg_kind(ins.attrs.get("to_apply", ""))
        if kind is None or not isinstance(x, Op) or not isinstance(index, Op) \
                or not x.dtype.is_float or index.dtype is not DType.INT32 or index.shape != x.shape:
            return None
        dims = ints(ins.attrs.get("dimensions"))
        kept = [d for d in range(len(x.shape)) if d not in dims]
        start = self.b.n_ops
        work = self.b.convert(x, DType.FP32) if x.dtype is not DType.FP32 else x
        if kind == "min":
            work = self.b.negate(work)
        best = self.b.reduce(work, dims, "max")
        hit = self.b.compare(work, self.b.broadcast(best, x.shape, tuple(kept)), "EQ")
        # the smallest index among the hits, as a max of negated indices (misses: -2^24)
        negated = self.b.negate(self.b.convert(index, DType.FP32))
        candidates = self.b.select(hit, negated, self.b.constant(-float(2 ** 24), DType.FP32,
                                                                 shape=x.shape))
        first = self.b.convert(self.b.negate(self.b.reduce(candidates, dims, "max")), DType.INT32)
        value = self.b.negate(best) if kind == "min" else best
        if value.dtype is not x.dtype:
            value = self.b.convert(value, x.dtype)
        for k, op in enumerate(self.b.ops_since(start)):
            op.name = self._aux(name, f"{op.opcode}{k}")
        value.name, first.name = self._aux(name, "value"), self._aux(name, "index")
        return value, first

    def _sort(self, ins: HloInstruction, operands: list[Val], name: str) -> Val | None:
        """``jnp.sort`` / ``jnp.argsort`` / ``lax.sort`` / ``jnp.lexsort`` keyed on the first
        ``num_keys`` operands (HLO ``sort`` whose comparator is JAX's ascending lexicographic order
        on them, the float form canonicalising -0 and NaN first) as a stable rank sort
        (``rank_sort``; ``sort(is_stable=false)`` may order ties any way, so this order is one of
        its). None (the op stays unsupported) for any other comparator: descending comparators,
        a ``lambda`` of the keys."""
        dim = ints(ins.attrs.get("dimensions"))
        if len(dim) != 1 or not all(isinstance(o, Op) for o in operands):
            return None
        keys = self._sort_keys(ins.attrs.get("to_apply", ""))
        ops = [o for o in operands if isinstance(o, Op)]
        if keys is None or keys > len(ops):
            return None
        shape, d = ops[0].shape, dim[0]
        if any(o.shape != shape or o.dtype not in (DType.FP32, DType.BF16, DType.FP16, DType.INT32)
               for o in ops):
            return None
        start = self.b.n_ops
        results = rank_sort(self.b, ops[0] if keys == 1 else ops[:keys], ops, d)
        for k, op in enumerate(self.b.ops_since(start)):
            op.name = self._aux(name, f"{op.opcode}{k}")
        for k, op in enumerate(results):
            op.name = self._aux(name, f"sorted{k}")
        return results[0] if ins.shape.dtype is not None else tuple(results)

    def _sort_keys(self, reference: str) -> int | None:
        """How many keys a sort comparator orders by when it is JAX's ascending lexicographic order
        (``lax.sort(num_keys=n)``): for one key ``compare(a0, b0), direction=LT``; for more,
        ``or(compare(a0, b0) LT, and(compare(a0, b0) EQ, <the same on keys 1..>))``, parameters
        ``2k`` and ``2k + 1`` being key ``k``'s two sides, each as itself or through JAX's
        canonicalisation of floats (``select(a != a, nan, select(a == 0, 0, a))``). None for any
        other comparator."""
        comp = self.computations.get(_callee(reference))
        if comp is None:
            return None
        by_name = {i.name: i for i in comp.instructions}

        def param(ins: HloInstruction) -> int | None:
            return int(ins.literal.strip()) if ins.opcode == "parameter" else None

        def constant(ref: str, value: float) -> bool:
            c = by_name.get(ref)
            if c is None or c.opcode != "constant":
                return False
            got = float(literal_values(c.literal).flat[0])
            return math.isnan(got) if math.isnan(value) else got == value

        def canonical(ref: str) -> int | None:
            ins = by_name.get(ref)
            if ins is None:
                return None
            if ins.opcode == "parameter":
                return param(ins)
            if ins.opcode != "select" or len(ins.operands) != 3:
                return None
            test, on_true, on_false = (by_name.get(o) for o in ins.operands)
            if test is None or on_true is None or on_false is None or test.opcode != "compare":
                return None
            if test.attrs.get("direction") == "NE" and constant(ins.operands[1], math.nan):
                inner = canonical(ins.operands[2])  # NaN -> canonical NaN, then the zero case
                tested = by_name.get(test.operands[0])
                same = test.operands[0] == test.operands[1] and tested is not None
                return inner if same and tested is not None and param(tested) == inner else None
            if test.attrs.get("direction") == "EQ" and constant(ins.operands[1], 0.0) \
                    and constant(test.operands[1], 0.0) and test.operands[0] == ins.operands[2]:
                return param(on_false)
            return None

        def compares(ins: HloInstruction | None, direction: str, key: int) -> bool:
            return (ins is not None and ins.opcode == "compare" and ins.attrs.get("direction") == direction
                    and len(ins.operands) == 2
                    and [canonical(o) for o in ins.operands] == [2 * key, 2 * key + 1])

        ins, key = comp.root, 0  # the lexicographic "less than" of the keys from ``key`` on
        while not compares(ins, "LT", key):
            if ins.opcode != "or" or len(ins.operands) != 2:
                return None
            less, tie = (by_name.get(o) for o in ins.operands)
            if not compares(less, "LT", key) or tie is None or tie.opcode != "and" or len(tie.operands) != 2:
                return None
            rest = next((by_name.get(b) for a, b in (tie.operands, tie.operands[::-1])
                         if compares(by_name.get(a), "EQ", key)), None)
            if rest is None:
                return None
            ins, key = rest, key + 1
        return key + 1

    def _arg_kind(self, reference: str) -> str | None:
        """"max" or "min" when a reduce computation is JAX's argmax/argmin comparator: values
        compared GT (LT) and, on equality, indices compared LT; None otherwise."""
        comp = self.computations.get(_callee(reference))
        if comp is None:
            return None
        params = {i.name: i.literal.strip() for i in comp.instructions if i.opcode == "parameter"}
        if sorted(params.values()) != ["0", "1", "2", "3"] or comp.root.opcode != "tuple":
            return None
        role = {name: int(k) for name, k in params.items()}
        values, indices = {0, 2}, {1, 3}
        found = set()
        for i in comp.instructions:
            if i.opcode != "compare" or len(i.operands) != 2:
                continue
            sides = {role.get(o) for o in i.operands}
            direction = i.attrs.get("direction", "")
            if sides == values:
                found.add({"GT": "max", "LT": "min"}.get(direction, direction))
            elif sides == indices and direction != "LT":
                return None
        kinds = found & {"max", "min"}
        return kinds.pop() if len(kinds) == 1 else None

    def _topk(self, ins: HloInstruction, x: Op, name: str) -> tuple[Op, Op]:
        """``jax.lax.top_k`` (HLO ``topk``: the last dim, values descending, ties to the lower
        index) as the torch frontend's ``topk`` runs it (``torch_masks.topk``): k rounds of "the
        row's maximum, the first position holding it, then mask that position out"; JAX MoE
        routers pick their experts with it. ``largest=false`` works on the negated values."""
        k = int(ins.attrs["k"])
        largest = str(ins.attrs.get("largest", "true")).strip().lower() != "false"
        dim, n = len(x.shape) - 1, x.shape[-1]
        keep = (*x.shape[:-1], 1)
        rows = x.shape[:-1]
        work = self._convert(x, DType.FP32, self._aux(name, "f32"))
        if not largest:
            work = self._emit("negate", [work], x.shape, DType.FP32, self._aux(name, "negated"))
        position = self._emit("iota", [], x.shape, DType.FP32, self._aux(name, "position"), dimension=dim)
        from_end = self._binary("subtract", self._scalar_like(float(n), position, name, "n"), position,
                                self._aux(name, "from_end"))
        values: list[Op] = []
        indices: list[Op] = []
        for r in range(k):
            best = self._emit("reduce", [work], rows, DType.FP32, self._aux(name, f"max{r}"),
                              dimensions=(dim,), kind="max")
            best_row = self._emit("reshape", [best], keep, DType.FP32, self._aux(name, f"max_row{r}"))
            spread = self._emit("broadcast", [best_row], x.shape, DType.FP32, self._aux(name, f"spread{r}"),
                                dims=tuple(range(len(keep))))
            hit = self._compare(work, spread, "EQ", self._aux(name, f"hit{r}"))
            score = self._emit("select", [hit, from_end, self._scalar_like(0.0, position, name, f"zero{r}")],
                               x.shape, DType.FP32, self._aux(name, f"score{r}"))
            first = self._emit("reduce", [score], rows, DType.FP32, self._aux(name, f"first{r}"),
                               dimensions=(dim,), kind="max")
            index = self._binary("subtract", self._scalar_like(float(n), first, name, f"n{r}"), first,
                                 self._aux(name, f"index{r}"))
            index_row = self._emit("reshape", [index], keep, DType.FP32, self._aux(name, f"index_row{r}"))
            values.append(best_row)
            indices.append(index_row)
            if r + 1 < k:
                at = self._emit("broadcast", [index_row], x.shape, DType.FP32, self._aux(name, f"at{r}"),
                                dims=tuple(range(len(keep))))
                taken = self._compare(position, at, "EQ", self._aux(name, f"taken{r}"))
                work = self._emit("select", [taken, self._scalar_like(-math.inf, position, name, f"inf{r}"),
                                             work], x.shape, DType.FP32, self._aux(name, f"masked{r}"))
        out_shape = (*rows, k)
        value = values[0] if k == 1 else self._emit("concatenate", values, out_shape, DType.FP32,
                                                    self._aux(name, "values_f32"), dimension=dim)
        index = indices[0] if k == 1 else self._emit("concatenate", indices, out_shape, DType.FP32,
                                                     self._aux(name, "indices_f32"), dimension=dim)
        if not largest:
            value = self._emit("negate", [value], out_shape, DType.FP32, self._aux(name, "unnegated"))
        return (self._convert(value, x.dtype, self._aux(name, "values")),
                self._convert(index, DType.INT32, self._aux(name, "indices")))

    def _unsupported_named(self, ins: HloInstruction, operands: list[Val], name: str,
                           detail: str = "") -> Val:
        """An IR op named after the HLO opcode; a form of an opcode the IR has in another form
        gets the reason appended (``reduce(variadic)``), so that the compiler rejects it."""
        opcode = ins.opcode
        if opcode in ALL_OPS or detail:
            opcode = f"{opcode}({detail or 'unsupported form'})"
        renamed = HloInstruction(name, ins.shape, opcode, ins.operands, ins.literal, ins.attrs,
                                 ins.metadata)
        return self._unsupported(renamed, operands)

    def _op_constant(self, ins: HloInstruction, operands: list[Val], name: str,
                     shape: tuple[int, ...], dtype: DType) -> Op:
        values = literal_values(ins.literal)
        if values.size == 1 or (values.size and np.all(values == values.flat[0])):
            return self._constant(float(values.flat[0]), shape, dtype, name)
        if values.size and np.all(np.isnan(values)):
            return self._constant(math.nan, shape, dtype, name)
        op = self.b.weight(name, shape, dtype, array=values.astype(np.float32).reshape(shape))
        op.name = name
        return op

    def _op_custom_call(self, ins: HloInstruction, operands: list[Val], name: str,
                        shape: tuple[int, ...], dtype: DType) -> Val:
        """An NKI kernel called inside the function (``neuroncore.nki.embed``) is the IR op
        ``nki_kernel``, as from PyTorch; any other custom call stays unsupported under its name."""
        target = str(ins.attrs.get("custom_call_target", "")).strip("\"")
        if not target.startswith(NKI_CALL_TARGET_PREFIX):
            return self._unsupported_named(ins, operands, name)
        flat = [o for v in operands for o in _leaves(v)]
        return self._emit("nki_kernel", flat, shape, dtype, name,
                          kernel=target.removeprefix(NKI_CALL_TARGET_PREFIX))

    def _op_iota(self, ins: HloInstruction, operands: list[Val], name: str,
                 shape: tuple[int, ...], dtype: DType) -> Op:
        return self._emit("iota", [], shape, dtype, name, dimension=int(ins.attrs["iota_dimension"]))

    def _op_convert(self, ins: HloInstruction, operands: list[Val], name: str,
                    shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        if x.dtype is dtype:
            self.used.discard(name)
            return x
        return self._convert(x, dtype, name)

    def _op_broadcast(self, ins: HloInstruction, operands: list[Val], name: str,
                      shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        dims = ints(ins.attrs.get("dimensions"))
        if tuple(shape) == x.shape and dims == tuple(range(len(shape))):
            self.used.discard(name)
            return x
        op = self._emit("broadcast", [x], shape, dtype, name, dims=dims)
        if id(x) in self.known:
            self.known[id(op)] = self.known[id(x)]
        return op

    def _op_reshape(self, ins: HloInstruction, operands: list[Val], name: str,
                    shape: tuple[int, ...], dtype: DType) -> Op:
        op = self._reshape(operands[0], shape, name)
        if op.name != name:
            self.used.discard(name)
        return op

    def _op_transpose(self, ins: HloInstruction, operands: list[Val], name: str,
                      shape: tuple[int, ...], dtype: DType) -> Op:
        op = self._transpose(operands[0], ints(ins.attrs["dimensions"]), name)
        if op is operands[0]:
            self.used.discard(name)
        return op

    def _op_slice(self, ins: HloInstruction, operands: list[Val], name: str,
                  shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        ranges = [tuple(int(v) for v in r.split(":")) for r in re.findall(r"\[([^\]]*)\]",
                                                                            ins.attrs["slice"])]
        starts = tuple(r[0] for r in ranges)
        limits = tuple(r[1] for r in ranges)
        strides = tuple(r[2] if len(r) > 2 else 1 for r in ranges)
        if tuple(shape) == x.shape:
            self.used.discard(name)
            return x
        if id(x) in self.known:
            return self._constant(self.known[id(x)], shape, dtype, name)
        return self._emit("slice", [x], shape, dtype, name, starts=starts, limits=limits,
                          strides=strides)

    def _op_reverse(self, ins: HloInstruction, operands: list[Val], name: str,
                    shape: tuple[int, ...], dtype: DType) -> Op:
        """``reverse`` (``x[::-1]``, ``jnp.flip``, a descending ``jnp.sort``): ``frontends.flip``,
        its ops named after the instruction."""
        x = operands[0]
        if id(x) in self.known:
            return self._constant(self.known[id(x)], shape, dtype, name)
        start = self.b.n_ops
        x = flip(self.b, x, ints(ins.attrs.get("dimensions")))
        made = self.b.ops_since(start)
        if not made:
            self.used.discard(name)
            return x
        for k, op in enumerate(made[:-1]):
            op.name = self._aux(name, f"{op.opcode}{k}")
        made[-1].name = name
        return x

    def _op_dynamic_slice(self, ins: HloInstruction, operands: list[Val], name: str,
                          shape: tuple[int, ...], dtype: DType) -> Op:
        x, starts = operands[0], operands[1:]
        if not all(id(s) in self.known for s in starts):
            raise _Unmappable("dynamic start")
        begin = [min(max(int(self.known[id(s)]), 0), n - k) for s, n, k in zip(starts, x.shape, shape)]
        limits = tuple(b + k for b, k in zip(begin, shape))
        if tuple(shape) == x.shape:
            self.used.discard(name)
            return x
        return self._emit("slice", [x], shape, dtype, name, starts=tuple(begin), limits=limits,
                          strides=(1,) * len(shape))

    def _op_dynamic_update_slice(self, ins: HloInstruction, operands: list[Val], name: str,
                                 shape: tuple[int, ...], dtype: DType) -> Op:
        """``x`` with ``update`` written at constant starts (clamped as XLA clamps them so the
        update fits): along each dim the update does not span, the slices of ``x`` before and
        after it concatenated around it (``lax.scan`` stacking its outputs, ``.at[i].set`` with
        a folded ``i``)."""
        x, update, starts = operands[0], operands[1], operands[2:]
        if not all(id(s) in self.known for s in starts):
            raise _Unmappable("dynamic start")
        begin = [min(max(int(self.known[id(s)]), 0), n - k) for s, n, k in zip(starts, x.shape, update.shape)]

        def place(region: Op, dim: int) -> Op:
            while dim < len(shape) and update.shape[dim] == region.shape[dim]:
                dim += 1
            if dim == len(shape):
                return update
            b, k, n = begin[dim], update.shape[dim], region.shape[dim]

            def cut(lo: int, hi: int, role: str) -> Op:
                starts_, limits = [0] * len(shape), list(region.shape)
                starts_[dim], limits[dim] = lo, hi
                return self._emit("slice", [region], [e - s for s, e in zip(starts_, limits)], dtype,
                                  self._aux(name, f"{role}{dim}"), starts=tuple(starts_),
                                  limits=tuple(limits), strides=(1,) * len(shape))

            parts = ([cut(0, b, "before")] if b > 0 else []) + [place(cut(b, b + k, "at"), dim + 1)] + \
                ([cut(b + k, n, "after")] if b + k < n else [])
            if len(parts) == 1:
                return parts[0]
            return self._emit("concatenate", parts, region.shape, dtype, self._aux(name, f"dim{dim}"),
                              dimension=dim)

        result = place(x, 0)
        if result is update or result is x:
            self.used.discard(name)
            return result
        result.name = name  # the last op computes the instruction's value
        return result

    def _op_concatenate(self, ins: HloInstruction, operands: list[Val], name: str,
                        shape: tuple[int, ...], dtype: DType) -> Op:
        if len(operands) == 1:
            self.used.discard(name)
            return operands[0]
        dimension = ints(ins.attrs["dimensions"])[0]
        return self._emit("concatenate", operands, shape, dtype, name, dimension=dimension)

    def _op_pad(self, ins: HloInstruction, operands: list[Val], name: str,
                shape: tuple[int, ...], dtype: DType) -> Op:
        x, value = operands
        spec = [tuple(int(v) for v in d.split("_")) for d in ins.attrs["padding"].split("x")]
        if any(len(s) > 2 and s[2] != 0 for s in spec):
            raise _Unmappable("interior padding")
        result = x
        for dim, (low, high, *_) in enumerate(spec):
            if low < 0 or high < 0:
                starts = [0] * len(result.shape)
                limits = list(result.shape)
                starts[dim] = max(-low, 0)
                limits[dim] = result.shape[dim] - max(-high, 0)
                cut = [e - s for s, e in zip(starts, limits)]
                result = self._emit("slice", [result], cut, dtype, self._aux(name, f"crop{dim}"),
                                    starts=tuple(starts), limits=tuple(limits),
                                    strides=(1,) * len(cut))
                low, high = max(low, 0), max(high, 0)
            pieces = []
            for size, role in ((low, "low"), (high, "high")):
                if size > 0:
                    piece_shape = list(result.shape)
                    piece_shape[dim] = size
                    pieces.append((role, self._splat(value, piece_shape,
                                                     self._aux(name, f"{role}{dim}"))))
            if pieces:
                parts = [p for r, p in pieces if r == "low"] + [result] + \
                        [p for r, p in pieces if r == "high"]
                new_shape = list(result.shape)
                new_shape[dim] = sum(p.shape[dim] for p in parts)
                result = self._emit("concatenate", parts, new_shape, dtype,
                                    self._aux(name, f"dim{dim}"), dimension=dim)
        if result is x:
            self.used.discard(name)
            return x
        result.name = name  # the last op computes the instruction's value
        return result

    def _op_select(self, ins: HloInstruction, operands: list[Val], name: str,
                   shape: tuple[int, ...], dtype: DType) -> Op:
        pred, on_true, on_false = operands
        if id(pred) in self.known:
            self.used.discard(name)
            return on_true if self.known[id(pred)] else on_false
        return self._emit("select", [pred, on_true, on_false], shape, dtype, name)

    def _op_clamp(self, ins: HloInstruction, operands: list[Val], name: str,
                  shape: tuple[int, ...], dtype: DType) -> Op:
        low, x, high = operands
        low = self._splat(low, shape, self._aux(name, "low"))
        high = self._splat(high, shape, self._aux(name, "high"))
        return self._binary("minimum", self._binary("maximum", x, low, self._aux(name, "max")), high,
                            name)

    def _op_compare(self, ins: HloInstruction, operands: list[Val], name: str,
                    shape: tuple[int, ...], dtype: DType) -> Op:
        return self._compare(operands[0], operands[1], ins.attrs["direction"], name)

    def _op_and(self, ins: HloInstruction, operands: list[Val], name: str,
                shape: tuple[int, ...], dtype: DType) -> Op:
        if dtype is not DType.PRED:
            raise _Unmappable(dtype.value)  # bitwise integer ops have no IR op
        return self._binary("multiply", operands[0], operands[1], name)

    def _op_or(self, ins: HloInstruction, operands: list[Val], name: str,
               shape: tuple[int, ...], dtype: DType) -> Op:
        if dtype is not DType.PRED:
            raise _Unmappable(dtype.value)
        return self._binary("maximum", operands[0], operands[1], name)

    def _op_xor(self, ins: HloInstruction, operands: list[Val], name: str,
                shape: tuple[int, ...], dtype: DType) -> Op:
        if dtype is not DType.PRED:
            raise _Unmappable(dtype.value)
        return self._compare(operands[0], operands[1], "NE", name)

    def _op_not(self, ins: HloInstruction, operands: list[Val], name: str,
                shape: tuple[int, ...], dtype: DType) -> Op:
        if dtype is not DType.PRED:
            raise _Unmappable(dtype.value)
        x = operands[0]
        return self._compare(x, self._scalar_like(0.0, x, name, "false"), "EQ", name)

    def _op_sign(self, ins: HloInstruction, operands: list[Val], name: str,
                 shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        zero = self._scalar_like(0.0, x, name, "zero")
        positive = self._compare(x, zero, "GT", self._aux(name, "positive"))
        negative = self._compare(x, zero, "LT", self._aux(name, "negative"))
        minus = self._emit("select", [negative, self._scalar_like(-1.0, x, name, "minus_one"), x],
                           shape, dtype, self._aux(name, "select_negative"))
        return self._emit("select", [positive, self._scalar_like(1.0, x, name, "one"), minus], shape,
                          dtype, name)

    def _op_is_finite(self, ins: HloInstruction, operands: list[Val], name: str,
                      shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        magnitude = self._unary("abs", x, self._aux(name, "abs"))
        return self._compare(magnitude, self._scalar_like(math.inf, x, name, "inf"), "LT", name)

    def _rounded(self, x: Op, direction: str | None, name: str) -> Op:
        """``x`` (FP32) rounded toward zero (``direction`` None), down ("GT") or up ("LT"), as
        ``torch_rounding`` rounds: an engine's write of FP32 into INT32 truncates, then 1 is taken
        off where truncation went up (or added where it went down). Values of magnitude 2^23 and
        more are integers already (and would overflow INT32), and NaN and infinities are their own
        rounding: those pass through unchanged."""
        whole = self._convert(self._convert(x, DType.INT32, self._aux(name, "int")), DType.FP32,
                              self._aux(name, "trunc"))
        if direction is not None:
            off = self._convert(self._compare(whole, x, direction, self._aux(name, "off")), DType.FP32,
                                self._aux(name, "off_f32"))
            whole = self._binary("subtract" if direction == "GT" else "add", whole, off,
                                 self._aux(name, "step"))
        small = self._compare(self._unary("abs", x, self._aux(name, "abs")),
                              self._scalar_like(2.0**23, x, name, "integral"), "LT", self._aux(name, "small"))
        return self._emit("select", [small, whole, x], x.shape, DType.FP32, name)

    def _float_op(self, x: Op, name: str, fn: Callable[[Op, str], Op]) -> Op:
        """``fn`` computed in FP32 (the engines' internal type), converted back to ``x``'s type."""
        if x.dtype is DType.FP32:
            return fn(x, name)
        wide = self._convert(x, DType.FP32, self._aux(name, "f32"))
        return self._convert(fn(wide, self._aux(name, "wide")), x.dtype, name)

    def _op_floor(self, ins: HloInstruction, operands: list[Val], name: str,
                  shape: tuple[int, ...], dtype: DType) -> Op:
        return self._float_op(operands[0], name, lambda v, n: self._rounded(v, "GT", n))

    def _op_ceil(self, ins: HloInstruction, operands: list[Val], name: str,
                 shape: tuple[int, ...], dtype: DType) -> Op:
        return self._float_op(operands[0], name, lambda v, n: self._rounded(v, "LT", n))

    def _op_remainder(self, ins: HloInstruction, operands: list[Val], name: str,
                      shape: tuple[int, ...], dtype: DType) -> Op:
        """HLO ``remainder`` is C's ``fmod`` (the sign of the dividend; ``jnp``'s ``%`` adds the
        divisor where the signs differ around it): ``a - trunc(a / b) * b``, in FP32, so integers
        are exact below 2^24 as in ``torch_rounding``."""
        a, b = operands

        def fmod(x: Op, n: str) -> Op:
            y = b if b.dtype is DType.FP32 else self._convert(b, DType.FP32, self._aux(n, "b_f32"))
            quotient = self._binary("divide", x, y, self._aux(n, "quotient"))
            whole = self._rounded(quotient, None, self._aux(n, "whole"))
            return self._binary("subtract", x, self._binary("multiply", whole, y, self._aux(n, "product")), n)

        return self._float_op(a, name, fmod)

    def _op_exponential_minus_one(self, ins: HloInstruction, operands: list[Val], name: str,
                                  shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        e = self._unary("exponential", x, self._aux(name, "exp"))
        return self._binary("subtract", e, self._scalar_like(1.0, x, name, "one"), name)

    def _op_log_plus_one(self, ins: HloInstruction, operands: list[Val], name: str,
                         shape: tuple[int, ...], dtype: DType) -> Op:
        x = operands[0]
        return self._unary("log", self._binary("add", x, self._scalar_like(1.0, x, name, "one"),
                                               self._aux(name, "add_one")), name)

    def _op_power(self, ins: HloInstruction, operands: list[Val], name: str,
                  shape: tuple[int, ...], dtype: DType) -> Op:
        x, y = operands
        if id(y) not in self.known:
            base = self.known.get(id(x))
            if base is None or not base > 0 or not math.isfinite(base) or not dtype.is_float:
                raise _Unmappable("non-constant exponent")
            # a positive constant to a runtime power (Adam's bias correction beta ** count):
            # exp(y * ln(base)), ln taken in double precision
            scaled = self._binary("multiply", y, self._scalar_like(math.log(base), y, name, "ln_base"),
                                  self._aux(name, "scaled"))
            return self._unary("exponential", scaled, name)
        p = self.known[id(y)]
        if p == 0.5:
            return self._unary("sqrt", x, name)
        if p == -0.5:
            return self._unary("rsqrt", x, name)
        if not math.isfinite(p) or p != int(p) or abs(p) > 8:
            raise _Unmappable(f"exponent {p:g}")
        n = abs(int(p))
        if n == 0:
            return self._scalar_like(1.0, x, name, "one")
        result = x
        for k in range(1, n):
            last = k == n - 1 and p > 0
            result = self._binary("multiply", result, x, name if last else self._aux(name, f"pow{k + 1}"))
        if p < 0:
            return self._binary("divide", self._scalar_like(1.0, x, name, "one"), result, name)
        if result is x:
            self.used.discard(name)
        return result

    def _op_erf(self, ins: HloInstruction, operands: list[Val], name: str,
                shape: tuple[int, ...], dtype: DType) -> Op:
        """XLA's f32 erf: x * P(x^2) / Q(x^2) with x clamped to [-4, 4] (bf16/fp16 in FP32)."""
        x = operands[0]
        if dtype is not DType.FP32:
            wide = self._convert(x, DType.FP32, self._aux(name, "f32"))
            value = self._op_erf(ins, [wide], self._aux(name, "erf_f32"), shape, DType.FP32)
            return self._convert(value, dtype, name)
        clamped = self._binary("minimum", self._binary(
            "maximum", x, self._scalar_like(-4.0, x, name, "lo"), self._aux(name, "clamp_lo")),
            self._scalar_like(4.0, x, name, "hi"), self._aux(name, "clamp"))
        x2 = self._binary("multiply", clamped, clamped, self._aux(name, "x2"))

        def poly(coefficients: Sequence[float], role: str) -> Op:
            acc = self._scalar_like(coefficients[0], x, name, f"{role}0")
            for k, c in enumerate(coefficients[1:], 1):
                acc = self._binary("multiply", acc, x2, self._aux(name, f"{role}_mul{k}"))
                acc = self._binary("add", acc, self._scalar_like(c, x, name, f"{role}{k}"),
                                   self._aux(name, f"{role}_add{k}"))
            return acc

        numerator = self._binary("multiply", clamped, poly(_ERF_ALPHA, "p"), self._aux(name, "xp"))
        return self._binary("divide", numerator, poly(_ERF_BETA, "q"), name)

    def _dot_operand(self, x: Op, batch_dims: list[int], contract: list[int], free: list[int],
                     batch: list[int], k: int, size: int, name: str, role: str, *,
                     k_last_on_tie: bool) -> tuple[Op, int]:
        """``x`` as [batch, K, free] (contracting dim -2) or [batch, free, K] (-1), whichever is
        the cheaper rearrangement; ``k_last_on_tie`` breaks ties."""
        k_rows = batch_dims + contract + free
        k_last = batch_dims + free + contract
        cost_rows, cost_last = _arrangement_cost(k_rows), _arrangement_cost(k_last)
        if cost_last < cost_rows or (cost_last == cost_rows and k_last_on_tie):
            return self._arrange(x, k_last, [*batch, size, k], name, role), -1
        return self._arrange(x, k_rows, [*batch, k, size], name, role), -2

    def _op_dot(self, ins: HloInstruction, operands: list[Val], name: str,
                shape: tuple[int, ...], dtype: DType) -> Op:
        lhs, rhs = operands
        a = ins.attrs
        lb, lc = list(ints(a.get("lhs_batch_dims"))), list(ints(a.get("lhs_contracting_dims")))
        rb, rc = list(ints(a.get("rhs_batch_dims"))), list(ints(a.get("rhs_contracting_dims")))
        lf = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
        rf = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
        batch = [lhs.shape[d] for d in lb]
        m = math.prod(lhs.shape[d] for d in lf)
        n = math.prod(rhs.shape[d] for d in rf)
        k = math.prod(lhs.shape[d] for d in lc)
        # lhs as [batch, M, K] or [batch, K, M], rhs as [batch, K, N] or [batch, N, K]: whichever
        # needs no transpose, else one that keeps the last dim (a DMA reading contiguous runs)
        lhs2, lhs_contract = self._dot_operand(lhs, lb, lc, lf, batch, k, m, name, "lhs",
                                               k_last_on_tie=True)
        rhs2, rhs_contract = self._dot_operand(rhs, rb, rc, rf, batch, k, n, name, "rhs",
                                               k_last_on_tie=False)
        if lhs2.dtype is not rhs2.dtype:
            lhs2 = self._convert(lhs2, dtype, self._aux(name, "lhs_convert"))
            rhs2 = self._convert(rhs2, dtype, self._aux(name, "rhs_convert"))
        out_dtype = dtype if dtype is not lhs2.dtype else None
        op = self.b.dot(lhs2, rhs2, lhs_contract=lhs_contract, rhs_contract=rhs_contract,
                        out_dtype=out_dtype)
        op.name = name
        for role, (given, used) in (("lhs", (lhs2, op.operands[0])), ("rhs", (rhs2, op.operands[1]))):
            if used is not given:  # the builder's autocast
                used.name = self._aux(name, f"{role}_{used.dtype.value}")
        if op.shape != tuple(shape):
            return self._emit("reshape", [op], shape, op.dtype, self._aux(name, "out"))
        return op

    def _arrange(self, x: Op, order: list[int], shape: list[int], name: str, role: str) -> Op:
        x = self._transpose(x, order, self._aux(name, f"{role}_transpose"))
        if x.shape != tuple(shape):
            x = self._reshape(x, shape, self._aux(name, f"{role}_reshape"))
        return x

    def _op_reduce(self, ins: HloInstruction, operands: list[Val], name: str,
                   shape: tuple[int, ...], dtype: DType) -> Op:
        if len(operands) != 2:
            raise _Unmappable("variadic")  # argmax and friends
        x, init = operands
        kind = self._combiner(ins.attrs.get("to_apply", ""))
        if kind is None or kind == "prod":
            raise _Unmappable(kind or "custom computation")
        dims = ints(ins.attrs.get("dimensions"))
        identity = id(init) in self.known and self.known[id(init)] == _IDENTITY[kind]
        if math.prod(x.shape[d] for d in dims) == 1:
            result = self._reshape(x, shape, self._aux(name, "squeeze") if not identity else name)
        elif kind in ("and", "or") or dtype is DType.PRED:
            as_float = self._convert(x, DType.FP32, self._aux(name, "as_f32"))
            if kind in ("and", "min"):  # all(x) = not any(not x)
                as_float = self._binary("subtract", self._scalar_like(1.0, as_float, name, "one"),
                                        as_float, self._aux(name, "not"))
            any_ = self._reduce_op(as_float, dims, "max", self._aux(name, "any"))
            zero = self._scalar_like(0.0, any_, name, "zero")
            result = self._compare(any_, zero, "EQ" if kind in ("and", "min") else "NE",
                                   name if identity else self._aux(name, "value"))
        elif kind == "min":
            negated = self._unary("negate", x, self._aux(name, "negate_in"))
            reduced = self._reduce_op(negated, dims, "max", self._aux(name, "max"))
            result = self._unary("negate", reduced, name if identity else self._aux(name, "value"))
        else:
            result = self._reduce_op(x, dims, kind, name if identity else self._aux(name, "value"))
        if identity:
            return result
        combine = {"sum": "add", "max": "maximum", "min": "minimum", "and": "multiply",
                   "or": "maximum"}[kind]
        return self._binary(combine, result, self._splat(init, result.shape, self._aux(name, "init")),
                            name)

    def _reduce_op(self, x: Op, dims: Sequence[int], kind: str, name: str) -> Op:
        op = self.b.reduce(x, dims, kind)
        op.name = name
        return op

    def _combiner(self, reference: str) -> str | None:
        comp = self.computations.get(_callee(reference))
        if comp is None:
            return None
        params = [i.name for i in comp.instructions if i.opcode == "parameter"]
        root = comp.root
        if len(params) != 2 or sorted(root.operands) != sorted(params):
            return None
        return _COMBINERS.get(root.opcode)

    def _named_helpers(self, start: int, name: str, result: Op) -> Op:
        """Name the ops a shared lowering added since ``start`` after the instruction
        (``<name>.<opcode><k>``), the last one, which computes its value, ``name`` itself."""
        for k, op in enumerate(self.b.ops_since(start)):
            if op is not result:
                op.name = self._aux(name, f"{op.opcode}{k}")
        result.name = name
        return result

    def _op_convolution(self, ins: HloInstruction, operands: list[Val], name: str,
                        shape: tuple[int, ...], dtype: DType) -> Op:
        """``conv_general_dilated``: the operands are brought to [N, C, *spatial] and [O, I, *k]
        and lowered as the PyTorch frontend lowers ``aten.convolution`` (``conv_lowering``: im2col
        + one matmul; feature groups a batched matmul; input dilation spreads the input with
        zeros, as a transposed convolution does)."""
        lhs, rhs = operands
        a = ins.attrs
        labels = re.fullmatch(r"(\w+)_(\w+)->(\w+)", a.get("dim_labels", ""))
        if labels is None:
            raise _Unmappable("dim_labels")
        lhs_l, rhs_l, out_l = labels.groups()
        spatial = len(lhs_l) - 2
        if int(a.get("batch_group_count", 1)) != 1:
            raise _Unmappable("batch_group_count")
        if not lhs.dtype.is_float or not rhs.dtype.is_float:
            raise _Unmappable("integer convolution")
        window = _window(a.get("window", ""), spatial)
        if any(window["rhs_reversal"]):
            raise _Unmappable("window reversal")
        digits = [str(k) for k in range(spatial)]
        x = self._transpose(lhs, [lhs_l.index("b"), lhs_l.index("f"), *map(lhs_l.index, digits)],
                            self._aux(name, "lhs_transpose"))
        w = self._transpose(rhs, [rhs_l.index("o"), rhs_l.index("i"), *map(rhs_l.index, digits)],
                            self._aux(name, "rhs_transpose"))
        if lhs.dtype is not rhs.dtype:
            x, w = self._convert(x, dtype, self._aux(name, "lhs_convert")), \
                self._convert(w, dtype, self._aux(name, "rhs_convert"))
        start = self.b.n_ops
        y = conv_lowering.conv(self.b, x, w, None, window["stride"], window["pad"],
                               window["rhs_dilate"], int(a.get("feature_group_count", 1)),
                               lhs_dilation=window["lhs_dilate"])
        source = {"b": 0, "f": 1, **{d: 2 + k for k, d in enumerate(digits)}}
        order = [source[label] for label in out_l]
        if not _is_identity(order):
            y = self.b.transpose(y, order)
        if y.dtype is not dtype:
            y = self.b.convert(y, dtype)
        if y.shape != tuple(shape):
            raise _Unmappable(f"shape {list(y.shape)} != {list(shape)}")
        return self._named_helpers(start, name, y)

    def _op_reduce_window(self, ins: HloInstruction, operands: list[Val], name: str,
                          shape: tuple[int, ...], dtype: DType) -> Op:
        """``reduce_window`` (pooling: ``lax.reduce_window``, flax's ``max_pool`` / ``avg_pool``)
        with an add or max computation: one strided slice per window offset, combined on the
        Vector engine, as the PyTorch frontend pools."""
        if len(operands) != 2:
            raise _Unmappable("variadic")
        x, init = operands
        kind = self._combiner(ins.attrs.get("to_apply", ""))
        if kind not in ("sum", "max") or not dtype.is_float:
            raise _Unmappable(kind or "custom computation")
        rank = len(x.shape)
        window = _window(ins.attrs.get("window", ""), rank)
        if any(d != 1 for d in window["lhs_dilate"]):
            raise _Unmappable("base dilation")
        start = self.b.n_ops
        lowest = -3.3895e38 if dtype is DType.BF16 else -3.4028234e38
        pooled = self._channel_major_pool(x, window, kind, lowest)
        if pooled is not None:
            result_op: Op = pooled
            if not (id(init) in self.known and self.known[id(init)] == _IDENTITY[kind]):
                init_b = self.b.broadcast(init, result_op.shape, ())
                result_op = (self.b.add(result_op, init_b) if kind == "sum"
                             else self.b.maximum(result_op, init_b))
            return self._named_helpers(start, name, result_op)
        padded = x
        for dim, (low, high) in enumerate(window["pad"]):
            if low or high:
                padded = conv_lowering.pad_axis(self.b, padded, dim, low, high,
                                                0.0 if kind == "sum" else lowest)
        result: Op | None = None
        for offset in itertools.product(*(range(k) for k in window["size"])):
            starts = [o * d for o, d in zip(offset, window["rhs_dilate"])]
            limits = [b + (n - 1) * st + 1 for b, n, st in zip(starts, shape, window["stride"])]
            whole = starts == [0] * rank and limits == list(padded.shape) and \
                all(st == 1 for st in window["stride"])
            piece = padded if whole else self.b.slice(padded, starts, limits, window["stride"])
            result = piece if result is None else (
                self.b.add(result, piece) if kind == "sum" else self.b.maximum(result, piece))
        assert result is not None
        if not (id(init) in self.known and self.known[id(init)] == _IDENTITY[kind]):
            init_b = self.b.broadcast(init, result.shape, ())
            result = self.b.add(result, init_b) if kind == "sum" else self.b.maximum(result, init_b)
        if result is x:
            self.used.discard(name)
            return x
        return self._named_helpers(start, name, result)

    def _channel_major_pool(self, x: Op, window: dict[str, Any], kind: str, lowest: float
                            ) -> Op | None:
        """A pool whose window spans all but two dims (batch and feature, NCHW or NHWC) as one
        ``reduce-window`` op on the channel-major input (``conv_lowering.reduce_window``), with a
        transpose on each side when the layout is not NCHW; None for any other window."""
        rank = len(x.shape)
        trivial = [d for d in range(rank) if window["size"][d] == 1 and window["stride"][d] == 1
                   and tuple(window["pad"][d]) == (0, 0) and window["rhs_dilate"][d] == 1]
        if rank < 3 or len(trivial) != 2 or any(p < 0 for pair in window["pad"] for p in pair):
            return None
        spatial = [d for d in range(rank) if d not in trivial]
        perm = [*trivial, *spatial]
        moved = x if perm == list(range(rank)) else self.b.transpose(x, perm)
        y = conv_lowering.reduce_window(
            self.b, moved, [window["size"][d] for d in spatial], [window["stride"][d] for d in spatial],
            [tuple(window["pad"][d]) for d in spatial], [window["rhs_dilate"][d] for d in spatial],
            kind, 0.0 if kind == "sum" else lowest)
        if perm == list(range(rank)):
            return y
        inverse = [perm.index(d) for d in range(rank)]
        return self.b.transpose(y, inverse)

    def _op_gather(self, ins: HloInstruction, operands: list[Val], name: str,
                   shape: tuple[int, ...], dtype: DType) -> Op:
        """The embedding lookup (rows of a 2-D table) as one IR gather; any other gather
        (``take_along_axis``: integer-label cross-entropy) element by element
        (``jax_indexing.gather``)."""
        try:
            return self._row_lookup(ins, operands, name, shape)
        except _Unmappable:
            pass
        x, indices = operands
        a = ins.attrs
        dims = jax_indexing.GatherDims(
            ints(a.get("offset_dims")), ints(a.get("collapsed_slice_dims")), ints(a.get("start_index_map")),
            ints(a.get("operand_batching_dims")), ints(a.get("start_indices_batching_dims")),
            int(a.get("index_vector_dim", len(indices.shape))), ints(a.get("slice_sizes")))
        start = self.b.n_ops
        out = jax_indexing.gather(self.b, x, indices, dims, tuple(shape))
        if out is None:
            raise _Unmappable("not an element or row gather")
        return self._named_helpers(start, name, out)

    def _op_scatter(self, ins: HloInstruction, operands: list[Val], name: str,
                    shape: tuple[int, ...], dtype: DType) -> Op:
        """A scatter-add (the gradient of a gather: ``take_along_axis``, ``take``, an embedding;
        ``.at[...].add``) as ``jax_indexing.scatter_add`` lowers it; ``.at[...].set/mul/max/min``
        as ``jax_indexing.scatter_update`` does. Indices may address several dims
        (``.at[i, j]``)."""
        if len(operands) != 3:
            raise _Unmappable("variadic")
        region = ins.attrs.get("to_apply", "")
        combine = self._combiner(region) or self._assigner(region)
        if combine is None:
            raise _Unmappable("combiner")
        x, indices, updates = operands
        a = ins.attrs
        dims = jax_indexing.ScatterDims(
            ints(a.get("update_window_dims")), ints(a.get("inserted_window_dims")),
            ints(a.get("scatter_dims_to_operand_dims")), ints(a.get("input_batching_dims")),
            ints(a.get("scatter_indices_batching_dims")), int(a.get("index_vector_dim", len(indices.shape))))
        start = self.b.n_ops
        if combine == "sum":
            out = jax_indexing.scatter_add(self.b, x, indices, updates, dims)
        else:
            out = jax_indexing.scatter_update(self.b, x, indices, updates, dims, combine)
        if out is None:
            raise _Unmappable(f"{combine}: not whole windows along the unindexed dims"
                              + ("" if combine == "sum" else
                                 f", or over {jax_indexing.MAX_SLOTS} updates, or batching dims"))
        return self._named_helpers(start, name, out)

    def _assigner(self, reference: str) -> str | None:
        """``"set"`` when a scatter's computation returns its second parameter (``.at[].set``)."""
        comp = self.computations.get(_callee(reference))
        if comp is None:
            return None
        params = [i for i in comp.instructions if i.opcode == "parameter"]
        root = comp.root
        if len(params) == 2 and root.opcode == "parameter" and root.literal.strip() == "1":
            return "set"
        return None

    def _row_lookup(self, ins: HloInstruction, operands: list[Val], name: str,
                    shape: tuple[int, ...]) -> Op:
        """The embedding lookup (rows of a 2-D table); HLO clamps out-of-range rows, the IR gather
        expects ids in range."""
        table, indices = operands
        a = ins.attrs
        if (len(table.shape) != 2 or ints(a.get("collapsed_slice_dims")) != (0,)
                or ints(a.get("start_index_map")) != (0,)
                or ints(a.get("slice_sizes")) != (1, table.shape[1])
                or ints(a.get("offset_dims")) != (len(shape) - 1,)
                or ints(a.get("operand_batching_dims")) or indices.dtype is not DType.INT32):
            raise _Unmappable("not a row lookup")
        vector_dim = int(a.get("index_vector_dim", len(indices.shape)))
        if vector_dim == len(indices.shape) - 1 and indices.shape and indices.shape[-1] == 1:
            indices = self._reshape(indices, indices.shape[:-1], self._aux(name, "ids"))
        elif vector_dim != len(indices.shape):
            raise _Unmappable("not a row lookup")
        if (*indices.shape, table.shape[1]) != tuple(shape):
            raise _Unmappable("not a row lookup")
        op = self.b.gather(table, indices)
        op.name = name
        return op


def _window(text: str, rank: int) -> dict[str, list[Any]]:
    """An HLO ``window={size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=.. rhs_dilate=..}`` per dim,
    with XLA's defaults for what is not printed."""
    fields = dict(re.findall(r"(\w+)=([-\d_x]+)", text))

    def per_dim(key: str, default: int) -> list[int]:
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * rank

    pads = [(0, 0)] * rank
    if "pad" in fields:
        pads = [(int(lo), int(hi)) for lo, hi in (p.split("_") for p in fields["pad"].split("x"))]
    window: dict[str, list[Any]] = {
        "size": per_dim("size", 1), "stride": per_dim("stride", 1), "pad": pads,
        "lhs_dilate": per_dim("lhs_dilate", 1), "rhs_dilate": per_dim("rhs_dilate", 1),
        "rhs_reversal": per_dim("rhs_reversal", 0)}
    if any(len(v) != rank for v in window.values()):
        raise _Unmappable(f"window {text}")
    return window


def _callee(reference: str) -> str:
    return reference.strip().lstrip("%")


def _is_identity(order: Sequence[int]) -> bool:
    return list(order) == list(range(len(order)))


def _arrangement_cost(order: Sequence[int]) -> int:
    """0: no transpose; 1: a transpose that keeps the last dim; 2: one that moves it."""
    if _is_identity(order):
        return 0
    return 1 if order and order[-1] == len(order) - 1 else 2


def _leaves(value: Val) -> list[Op]:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _rebuild(shape: HloShape, values: Iterator[Op]) -> Val:
    if shape.dtype is not None:
        return next(values)
    return tuple(_rebuild(e, values) for e in shape.elements)


def _prune(graph: Graph) -> Graph:
    """Drop ops nothing reads (aliases and folds leave some); ops the compiler cannot lower are
    kept, so that check() still reports them."""
    return graph.pruned(keep=lambda op: op.opcode not in ALL_OPS)


# =============================================================================================
# Tracing
# =============================================================================================


def _function_name(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) \
        or type(target).__name__


def _definition_frame(fn: Any) -> SourceFrame | None:
    target = inspect.unwrap(getattr(fn, "func", fn))
    try:
        file = inspect.getsourcefile(target)
        _, line = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return None
    if file is None:
        return None
    return SourceFrame(os.path.abspath(file), line, getattr(target, "__name__", "<fn>"))


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost traceback frame in user code (not JAX, NumPy or neuroncore)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_LIBRARY_DIRS) and not _is_own_file(path):
            return frame
    return None


def _trace_error(fn_name: str, exc: Exception) -> TraceError:
    frame = _user_frame(exc)
    where = f" at {frame.filename}:{frame.lineno}" if frame is not None else ""
    code = f" (`{frame.line.strip()}`)" if frame is not None and frame.line else ""
    if isinstance(exc, jax.errors.ConcretizationTypeError | jax.errors.TracerArrayConversionError
                  | jax.errors.TracerIntegerConversionError):
        return TraceError(
            f"cannot trace {fn_name}: Python control flow or a NumPy conversion depends on a traced "
            f"value{where}{code}; use jnp.where / jax.lax.cond, or make the value static "
            f"({type(exc).__name__})")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return TraceError(f"cannot trace {fn_name}{where}{code}: {type(exc).__name__}: {first}")


def lower(fn: Any, example_inputs: Sequence[Any]) -> Any:
    """``jax.jit(fn, keep_unused=True).lower(*example_inputs)``; failures become TraceError."""
    fn_name = _function_name(fn)
    try:
        return jax.jit(fn, keep_unused=True).lower(*example_inputs)
    except TraceError:
        raise
    except Exception as exc:  # tracing runs arbitrary user code
        raise _trace_error(fn_name, exc) from exc


def hlo_text(lowered: Any) -> tuple[str, bytes]:
    """The un-optimized HLO module as text (with metadata and large constants) and as a serialized
    HloModuleProto (for the stack-frame table)."""
    computation = lowered.compiler_ir("hlo")
    proto = computation.as_serialized_hlo_module_proto()
    try:
        import jaxlib._hlo as _hlo  # HloPrintOptions: the only way to get metadata into the text

        options = _hlo.HloPrintOptions()
        options.print_metadata = True
        options.print_large_constants = True
        options.print_operand_shape = False
        options.include_layout_in_shapes = False
        return computation.get_hlo_module().to_string(options), proto
    except (ImportError, AttributeError):
        return computation.as_hlo_text(print_large_constants=True), proto


def convert(fn: Callable[..., Any], example_inputs: Sequence[Any], *,
            autocast: str | None) -> Converted:
    """Trace ``fn`` on the example inputs (each a JAX array, NumPy array or pytree of them)."""
    fn_name = _function_name(fn)
    lowered = lower(fn, example_inputs)
    text, proto = hlo_text(lowered)
    try:
        frame_table = frames_from_proto(proto)
    except (ValueError, IndexError, UnicodeDecodeError):
        frame_table = frames_from_text(text)
    computations = parse_hlo_module(text)
    graph_name = re.sub(r"\W+", "_", fn_name.replace("<lambda>", "lambda")).strip("_") or "jax_fn"
    converter = _Converter(computations, frame_table, graph_name, fn_name, autocast,
                           _definition_frame(fn))
    graph = converter.convert()
    n_params = len(graph.parameters)
    n_leaves = len(jax.tree_util.tree_leaves(tuple(example_inputs)))
    if n_params != n_leaves:  # e.g. a JAX that passes closed-over constants as extra arguments
        raise TraceError(f"{fn_name}: the lowered HLO has {n_params} parameters for {n_leaves} "
                         f"input arrays; cannot map the inputs onto it")
    out_dtypes = [np.dtype(leaf.dtype) for leaf in jax.tree_util.tree_leaves(lowered.out_info)]
    out_tree = lowered.out_tree

    def to_arrays(inputs: Sequence[Any]) -> list[np.ndarray]:
        leaves = jax.tree_util.tree_leaves(tuple(inputs))
        if len(leaves) != n_params:
            raise TraceError(f"{fn_name} was traced with {n_params} input array(s), "
                             f"called with {len(leaves)}")
        return [threefry.to_halves(host_array(leaf)) if p.attrs.get("u32_halves") else host_array(leaf)
                for leaf, p in zip(leaves, graph.parameters)]  # a uint32 input (a key): 16-bit halves

    def from_arrays(arrays: list[np.ndarray]) -> Any:
        leaves = [jnp.asarray(np.asarray(a).astype(dt, copy=False)) for a, dt in zip(arrays, out_dtypes)]
        return jax.tree_util.tree_unflatten(out_tree, leaves)

    return Converted(graph, to_arrays, from_arrays)


def host_array(leaf: Any) -> np.ndarray:
    """An input leaf as a NumPy array; a typed PRNG key (``jax.random.key``, JAX's recommended keys)
    as its ``uint32`` words (``jax.random.key_data``), which is what its HLO parameter holds."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def resize(example_inputs: Sequence[Any], dim: int, length: int) -> tuple[Any, ...]:
    """Example inputs whose ``dim`` has the first input's length, zero-padded or cut to ``length``."""
    leaves = jax.tree_util.tree_leaves(tuple(example_inputs))
    first = np.shape(leaves[0]) if leaves else ()
    if dim >= len(first):
        raise TraceError(f"bucket_dim {dim} is not a dimension of the first input (shape {first})")
    reference = first[dim]

    def fit(leaf: Any) -> Any:
        shape = np.shape(leaf)
        if len(shape) <= dim or shape[dim] != reference or reference == length:
            return leaf
        array = np.asarray(leaf)
        if reference > length:
            array = np.take(array, np.arange(length), axis=dim)
        else:
            pad = [(0, 0)] * array.ndim
            pad[dim] = (0, length - reference)
            array = np.pad(array, pad)
        return jnp.asarray(array)

    return tuple(jax.tree_util.tree_map(fit, x) for x in example_inputs)


__all__ = ["convert", "frames_from_proto", "frames_from_text", "hlo_text", "host_array", "layer_path",
           "lower", "parse_hlo_module", "resize"]
