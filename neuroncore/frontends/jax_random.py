"""JAX's random numbers in HLO, lowered to the IR's ``rng`` op with JAX's own generator.

``jax.random.uniform`` / ``bernoulli`` (dropout) with a key passed into a jitted function lower to HLO
that computes on uint32 words: the key's two words sliced out of the ``u32[2]`` input, counters built
from ``iota`` (u64 arithmetic), a ``call`` to a computation named ``threefry2x32`` (20 rounds of
add / rotate / xor in a ``while`` loop), ``xor`` of its two outputs, ``shift-right-logical`` by 9,
``or`` with ``0x3F800000`` and a ``bitcast-convert`` to f32 (a float in [1, 2)). The IR computes in
FP32, which cannot hold 32-bit words, so this module follows those values *symbolically*:

* compile-time constants (``iota``, ``constant`` and arithmetic on them) are NumPy integers;
* a uint32 input of the program is an FP32 parameter holding 16-bit halves
  (``neuroncore.ir.threefry.to_halves``, applied when the input is bound), followed as "words of that
  input" through ``slice`` / ``reshape`` / ``broadcast``;
* the ``threefry2x32`` call on the key's words and constant counters, and the bit manipulations after
  it, are recognised as JAX's uniform draw: the ``bitcast-convert`` becomes an ``rng`` op with
  ``algorithm="threefry2x32"`` (uniforms ``(bits >> 9) * 2**-23``, exactly JAX's) plus 1.0.

The counters must be the draw's linear positions (JAX's partitionable layout, its default); a key
computed inside the function (``jax.random.split`` / ``fold_in`` of the key passed in) and any other
use of the random words are refused in one line naming the instruction. A constant key (a key built
inside the function) is drawn at trace time, exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroncore.dtypes import DType
from neuroncore.frontends.hlo import HloInstruction, ints, literal_values
from neuroncore.frontends.tracing import TraceError
from neuroncore.ir import threefry
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    from neuroncore.frontends.jax_frontend import _Converter

UNSIGNED = {"u8": 8, "u16": 16, "u32": 32, "u64": 64}
_ONE_BITS = 0x3F800000  # 1.0f: JAX puts the random mantissa under it
_MANTISSA_SHIFT = 9  # 32 - 23 mantissa bits


@dataclass(frozen=True, eq=False)
class Const:
    """An unsigned integer array known at trace time."""

    values: np.ndarray  # uint64
    bits: int


@dataclass(frozen=True, eq=False)
class Words:
    """uint32 words of a program input: ``index`` holds, per element, the flat position of the word
    in the input (the input is an FP32 ``[..., 2]`` parameter of 16-bit halves)."""

    param: Op
    index: np.ndarray  # int64


@dataclass(frozen=True, eq=False)
class Threefry:
    """A ``threefry2x32`` call on a runtime key's two words and constant counters."""

    k0: Words
    k1: Words
    hi: np.ndarray  # uint64 counters
    lo: np.ndarray


@dataclass(frozen=True, eq=False)
class Half:
    """One of the two output words of a :class:`Threefry` call."""

    call: Threefry
    word: int


@dataclass(frozen=True, eq=False)
class Bits:
    """``((out0 ^ out1) >> shift) | mask`` of a :class:`Threefry` call: JAX's random bits on their way
    to a float."""

    call: Threefry
    shift: int = 0
    mask: int = 0


Sym = Const | Words | Half | Bits


def symbolic(value: Any) -> bool:
    return isinstance(value, (Const, Words, Half, Bits))


def key_input(param: Op, dims: Sequence[int]) -> Words:
    """A uint32 input of the program (declared as ``param``: FP32 halves, ``[*dims, 2]``)."""
    return Words(param, np.arange(int(np.prod(dims, dtype=np.int64))).reshape(tuple(dims)))


def _mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)


def _const(values: Any, bits: int) -> Const:
    return Const(np.asarray(values).astype(np.uint64) & _mask(bits), bits)


def _scalar(c: Sym) -> int | None:
    if isinstance(c, Const) and c.values.size and np.all(c.values == c.values.flat[0]):
        return int(c.values.flat[0])
    return None


def _broadcast(x: np.ndarray, shape: tuple[int, ...], dims: tuple[int, ...]) -> np.ndarray:
    """HLO ``broadcast``: operand dim i becomes result dim ``dims[i]``."""
    placed = [1] * len(shape)
    for i, d in enumerate(dims):
        placed[d] = x.shape[i]
    return np.broadcast_to(x.reshape(placed), shape)


def _slice(x: np.ndarray, ins: HloInstruction) -> np.ndarray:
    ranges = [tuple(int(v) for v in r.split(":")) for r in re.findall(r"\[([^\]]*)\]", ins.attrs["slice"])]
    return x[tuple(slice(r[0], r[1], r[2] if len(r) > 2 else 1) for r in ranges)]


def _refuse(ins: HloInstruction, what: str) -> TraceError:
    return TraceError(f"{ins.name} ({ins.opcode}): {what}")


def involved(ins: HloInstruction, operands: Sequence[Any]) -> bool:
    """Whether ``ins`` works on values this module follows (or makes one: an unsigned constant or
    iota)."""
    if any(symbolic(o) for o in operands):
        return True
    return not operands and ins.shape.dtype in UNSIGNED and ins.opcode in ("constant", "iota")


def evaluate(conv: _Converter, ins: HloInstruction, operands: Sequence[Any], name: str) -> Any:
    """The value of ``ins``, symbolic where it stays in the unsigned world, an IR op where JAX's random
    bits become a float; None when the instruction is not one this module follows (its symbolic
    operands are then materialised as IR by :func:`materialize`)."""
    code, dtype = ins.opcode, ins.shape.dtype
    shape = tuple(ins.shape.dims)
    bits = UNSIGNED.get(dtype or "")
    if code == "bitcast-convert" and dtype == "f32" and isinstance(operands[0], Bits):
        return _draw(conv, ins, operands[0], shape, name)
    if code == "bitcast-convert" and dtype == "f32" and isinstance(operands[0], Const):
        words = operands[0].values.astype(np.uint32)
        return conv.b.weight(name, shape, DType.FP32, array=words.view(np.float32).reshape(shape))
    if bits is None:
        return None
    if code == "constant":
        return _const(literal_values(ins.literal).reshape(shape) if shape else literal_values(ins.literal)[0],
                      bits)
    if code == "iota":
        dim = int(ins.attrs["iota_dimension"])
        return _const(_broadcast(np.arange(shape[dim]), shape, (dim,)), bits)
    x = operands[0] if operands else None
    if code in ("broadcast", "reshape", "slice", "transpose") and isinstance(x, (Const, Words)):
        array = x.values if isinstance(x, Const) else x.index
        if code == "broadcast":
            array = _broadcast(array, shape, ints(ins.attrs.get("dimensions")))
        elif code == "reshape":
            array = array.reshape(shape)
        elif code == "transpose":
            array = np.transpose(array, ints(ins.attrs.get("dimensions")))
        else:
            array = _slice(array, ins)
        return Const(np.ascontiguousarray(array), bits) if isinstance(x, Const) \
            else Words(x.param, np.ascontiguousarray(array))
    if code == "convert" and isinstance(x, Const):
        return _const(x.values, bits)
    if code == "convert" and isinstance(x, Words) and bits >= 32:
        return x
    if len(operands) == 2 and all(isinstance(o, Const) for o in operands):
        a, b = (o.values for o in operands if isinstance(o, Const))
        with np.errstate(over="ignore"):
            table = {"add": lambda: a + b, "subtract": lambda: a - b, "multiply": lambda: a * b,
                     "and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
                     "shift-left": lambda: np.where(b < bits, a << np.minimum(b, 63), 0),
                     "shift-right-logical": lambda: np.where(b < bits, a >> np.minimum(b, 63), 0),
                     "maximum": lambda: np.maximum(a, b), "minimum": lambda: np.minimum(a, b)}
            if code in table:
                return _const(table[code](), bits)
        return None
    if code == "xor" and all(isinstance(o, Half) for o in operands):
        h0, h1 = operands
        if h0.call is h1.call and {h0.word, h1.word} == {0, 1}:
            return Bits(h0.call)
    if isinstance(x, Bits) and len(operands) == 2:
        k = _scalar(operands[1])
        if code == "shift-right-logical" and k is not None and x.shift == 0 and x.mask == 0:
            return Bits(x.call, k, 0)
        if code == "or" and k is not None and x.mask == 0:
            return Bits(x.call, x.shift, k)
    return None


def threefry_call(ins: HloInstruction, operands: Sequence[Any]) -> tuple[Any, Any]:
    """A ``call`` to JAX's ``threefry2x32`` computation: ``(key0, key1, count_hi, count_lo)`` ->
    its two output words (computed now when the key is a constant)."""
    if len(operands) != 4:
        raise _refuse(ins, f"a threefry2x32 call with {len(operands)} operands (4 expected)")
    k0, k1, hi, lo = operands
    if not (isinstance(hi, Const) and isinstance(lo, Const)):
        raise _refuse(ins, "threefry2x32 on counters computed at run time is not lowered")
    if isinstance(k0, Const) and isinstance(k1, Const):
        key = (int(k0.values.reshape(-1)[0]), int(k1.values.reshape(-1)[0]))
        out0, out1 = threefry.threefry2x32(key, hi.values.astype(np.uint32), lo.values.astype(np.uint32))
        return _const(out0, 32), _const(out1, 32)
    if not (isinstance(k0, Words) and isinstance(k1, Words) and k0.index.size == 1 and k1.index.size == 1):
        raise _refuse(ins, "a random key computed inside the function (jax.random.split or fold_in of "
                           "the key passed in) is not lowered: split the key outside the step and pass "
                           "the keys in")
    if k0.param is not k1.param:
        raise _refuse(ins, "the two words of a threefry2x32 key come from different inputs")
    call = Threefry(k0, k1, hi.values, lo.values)
    return Half(call, 0), Half(call, 1)


def _draw(conv: _Converter, ins: HloInstruction, bits: Bits, shape: tuple[int, ...], name: str) -> Op:
    """JAX's ``bitcast((bits >> 9) | 1.0f)`` as an ``rng`` op (threefry2x32) plus 1.0."""
    call = bits.call
    if bits.shift != _MANTISSA_SHIFT or bits.mask != _ONE_BITS:
        raise _refuse(ins, f"random bits shifted by {bits.shift} under mask {bits.mask:#x} are not a "
                           f"uniform draw the core lowers")
    idx = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64).reshape(shape)
    if call.hi.shape != tuple(shape) or not (np.array_equal(call.hi, idx >> np.uint64(32))
                                              and np.array_equal(call.lo, idx & np.uint64(0xFFFFFFFF))):
        raise _refuse(ins, "random bits drawn with counters other than each element's position (set "
                           "jax_threefry_partitionable=True, JAX's default) are not lowered")
    b = conv.b
    param = call.k0.param
    words = int(np.prod(param.shape[:-1], dtype=np.int64))
    flat = b.reshape(param, (words * 2,))
    i0, i1 = int(call.k0.index.reshape(-1)[0]), int(call.k1.index.reshape(-1)[0])
    if i1 == i0 + 1:
        state = flat if words == 2 and i0 == 0 else b.slice(flat, (2 * i0,), (2 * i0 + 4,))
    else:
        state = b.concatenate([b.slice(flat, (2 * i0,), (2 * i0 + 2,)),
                               b.slice(flat, (2 * i1,), (2 * i1 + 2,))], 0)
    u = conv._emit("rng", [state], shape, DType.FP32, name, distribution="uniform", stream=0,
                   algorithm="threefry2x32")
    return b.add(u, 1.0)


def materialize(conv: _Converter, ins: HloInstruction, value: Any, name: str) -> Op:
    """A symbolic value read by an instruction this module does not follow, as IR: a constant as
    before (FP32 working values), a whole uint32 input from its halves; random words are refused."""
    if isinstance(value, Const):
        shape = tuple(value.values.shape)
        first = _scalar(value)
        if first is not None:
            return conv._constant(float(first), shape, DType.INT32, conv._aux(name, "u"))
        return conv.b.weight(conv._aux(name, "u"), shape, DType.INT32,
                             array=value.values.astype(np.float32).reshape(shape))
    if isinstance(value, Words) and np.array_equal(value.index.reshape(-1),
                                                   np.arange(value.index.size)):
        b = conv.b
        dims = tuple(value.index.shape)
        halves = b.reshape(value.param, (value.index.size, 2))
        high = b.slice(halves, (0, 0), (value.index.size, 1))
        low = b.slice(halves, (0, 1), (value.index.size, 2))
        whole = b.add(b.multiply(high, 65536.0), low)
        return b.convert(b.reshape(whole, dims), DType.INT32)
    raise _refuse(ins, "JAX random words (threefry2x32) used other than as a uniform draw "
                       "(jax.random.uniform / bernoulli) are not lowered; a key made inside the function "
                       "(jax.random.split / fold_in) is such a use: split the key outside the step and "
                       "pass the keys in")


__all__ = ["UNSIGNED", "Sym", "evaluate", "involved", "key_input", "materialize", "symbolic", "threefry_call"]
