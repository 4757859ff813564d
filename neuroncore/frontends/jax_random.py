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

A key derived inside the function (``jax.random.split`` / ``fold_in`` of the key passed in: Threefry
of its words at constant counters, stacked and sliced) is followed the same way, and the draw's
``rng`` op gets the derivation as its ``key`` attribute (``neuroncore.ir.threefry.evaluate_key``),
evaluated at run time. The counters must be the draw's linear positions (JAX's partitionable layout,
its default); any other use of the random words is refused in one line naming the instruction. A
key whose words are unsigned constants is drawn at trace time, exactly (a key made from an integer
seed inside the function is not: JAX computes its words in ``s32``, which is not followed). A typed
key (``jax.random.key``) is the same ``u32[2]`` parameter behind a ``Sharding`` custom-call, which the
frontend passes through.
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
    """A ``threefry2x32`` call on a runtime key's two words (an input's, or words an earlier call
    made: ``jax.random.split`` / ``fold_in`` inside the function) and constant counters."""

    k0: Words | Half
    k1: Words | Half
    hi: np.ndarray  # uint64 counters
    lo: np.ndarray


@dataclass(frozen=True, eq=False)
class Half:
    """Output words of a :class:`Threefry` call: per element, which word (``word``, 0 or 1) at
    which counter position (``index``); ``jax.random.split`` stacks the two."""

    call: Threefry
    word: np.ndarray  # int64, 0 or 1
    index: np.ndarray  # int64 positions in the call's counter arrays


def _whole(call: Threefry) -> np.ndarray:
    return np.arange(call.hi.size, dtype=np.int64).reshape(call.hi.shape)


def key_expression(word: Words | Half) -> tuple[Any, ...]:
    """A scalar key word as an expression the ``rng`` op evaluates at run time (exactly, in uint32):
    ``("input", i)`` for word i of the key input, ``("threefry", k0, k1, hi, lo, out)`` for output
    word ``out`` of Threefry on two such words and constant counters."""
    if isinstance(word, Words):
        return ("input", int(word.index.reshape(-1)[0]))
    call, at = word.call, int(word.index.reshape(-1)[0])
    return ("threefry", key_expression(call.k0), key_expression(call.k1),
            int(call.hi.reshape(-1)[at]), int(call.lo.reshape(-1)[at]), int(word.word.reshape(-1)[0]))


def _root(word: Words | Half) -> Op:
    return word.param if isinstance(word, Words) else _root(word.call.k0)


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


def _move(array: np.ndarray, ins: HloInstruction, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` through a data-movement instruction (broadcast, reshape, transpose, slice)."""
    code = ins.opcode
    if code == "broadcast":
        array = _broadcast(array, shape, ints(ins.attrs.get("dimensions")))
    elif code == "reshape":
        array = array.reshape(shape)
    elif code == "transpose":
        array = np.transpose(array, ints(ins.attrs.get("dimensions")))
    else:
        array = _slice(array, ins)
    return np.ascontiguousarray(array)


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
    if code in ("broadcast", "reshape", "slice", "transpose") and isinstance(x, (Const, Words, Half)):
        if isinstance(x, Half):
            return Half(x.call, _move(x.word, ins, shape), _move(x.index, ins, shape))
        if isinstance(x, Const):
            return Const(_move(x.values, ins, shape), bits)
        return Words(x.param, _move(x.index, ins, shape))
    if code == "concatenate" and operands and all(isinstance(o, Half) and o.call is operands[0].call
                                                  for o in operands):
        dim = int(ints(ins.attrs.get("dimensions"))[0])
        halves = [o for o in operands if isinstance(o, Half)]
        return Half(halves[0].call, np.concatenate([h.word for h in halves], dim),
                    np.concatenate([h.index for h in halves], dim))
    if code == "concatenate" and operands and all(isinstance(o, Const) for o in operands):
        dim = int(ints(ins.attrs.get("dimensions"))[0])
        return Const(np.concatenate([o.values for o in operands if isinstance(o, Const)], dim), bits)
    if code == "convert" and isinstance(x, Const):
        return _const(x.values, bits)
    if code == "convert" and isinstance(x, (Words, Half)) and bits >= 32:
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
        whole = _whole(h0.call)
        if h0.call is h1.call and np.array_equal(h0.index, whole) and np.array_equal(h1.index, whole) \
                and {int(h0.word.max()), int(h1.word.max())} == {0, 1} \
                and {int(h0.word.min()), int(h1.word.min())} == {0, 1}:
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
    if not (isinstance(k0, (Words, Half)) and isinstance(k1, (Words, Half))
            and k0.index.size == 1 and k1.index.size == 1):
        raise _refuse(ins, "a threefry2x32 key that is neither a key passed in nor one split or "
                           "folded from it is not lowered")
    if _root(k0) is not _root(k1):
        raise _refuse(ins, "the two words of a threefry2x32 key come from different inputs")
    call = Threefry(k0, k1, hi.values, lo.values)
    whole = _whole(call)
    return Half(call, np.zeros_like(whole), whole), Half(call, np.ones_like(whole), whole)


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
    param = _root(call.k0)
    words = int(np.prod(param.shape[:-1], dtype=np.int64))
    state = b.reshape(param, (words * 2,))  # every word of the key input, in 16-bit halves
    u = conv._emit("rng", [state], shape, DType.FP32, name, distribution="uniform", stream=0,
                   algorithm="threefry2x32", key=(key_expression(call.k0), key_expression(call.k1)))
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
    raise _refuse(ins, "JAX random words (threefry2x32) used other than as a key or a uniform draw "
                       "(jax.random.uniform / bernoulli / split / fold_in) are not lowered")


__all__ = ["UNSIGNED", "Sym", "evaluate", "involved", "key_input", "materialize", "symbolic", "threefry_call"]
