"""Threefry-2x32 (Salmon et al., SC'11), JAX's default random-number generator, exactly as JAX
computes it, for the ``rng`` op with ``algorithm="threefry2x32"``.

A JAX program draws ``jax.random.uniform`` / ``bernoulli`` numbers from a key (two uint32 words):
the random word of element ``i`` of a draw of shape S is ``out0 ^ out1`` of
``threefry2x32(key, (i >> 32, i & 0xFFFFFFFF))`` (JAX's partitionable layout, the default), and the
uniform in [0, 1) is its top 23 bits as a float's mantissa: ``bitcast((bits >> 9) | 0x3F800000) - 1``,
which equals ``(bits >> 9) * 2**-23`` exactly. Like Philox it is counter based: every tile of a tensor
computes its own elements, and the device's numbers equal the reference semantics and JAX's bit for
bit.

The core computes in FP32 working values, which hold integers exactly only below 2**24, so a uint32
key travels as 16-bit halves: a ``[..., 2]`` FP32 tensor (high, low) made by :func:`to_halves` when a
uint32 input is bound to a program; the ``rng`` op's state operand is that input's words in halves,
and its ``key`` attribute says how the draw's two key words come from them (:func:`evaluate_key`:
a word of the input, or Threefry of such words, as ``jax.random.split`` / ``fold_in`` derive keys).
"""

from __future__ import annotations

import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key: tuple[int, int], x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds, as ``jax._src.prng._threefry2x32_lowering`` computes it."""
    k0, k1 = np.uint32(key[0] & 0xFFFFFFFF), np.uint32(key[1] & 0xFFFFFFFF)
    ks = (k0, k1, np.uint32(k0 ^ k1 ^ _PARITY))
    a = np.asarray(x0, np.uint32).copy()
    b = np.asarray(x1, np.uint32).copy()
    with np.errstate(over="ignore"):
        a += ks[0]
        b += ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                a += b
                b = _rotl(b, r)
                b ^= a
            a += ks[(i + 1) % 3]
            b += ks[(i + 2) % 3] + np.uint32(i + 1)
    return a, b


def random_bits(indices: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """JAX's 32-bit random words of the elements ``indices`` (linear positions in the draw)."""
    idx = np.asarray(indices, np.int64)
    hi = (idx >> 32).astype(np.uint32)
    lo = (idx & 0xFFFFFFFF).astype(np.uint32)
    out0, out1 = threefry2x32(key, hi, lo)
    return out0 ^ out1


KeyExpression = tuple  # ("input", i) | ("threefry", k0, k1, hi, lo, out): see evaluate_key
DEFAULT_KEY: tuple[KeyExpression, KeyExpression] = (("input", 0), ("input", 1))


def evaluate_key(expression: KeyExpression, words: np.ndarray) -> int:
    """A key word: word i of the key input (``words``, uint32), or output word ``out`` of Threefry
    on two key words and the counter (hi, lo): how ``jax.random.split`` / ``fold_in`` inside a
    function derive keys from the key passed in."""
    if expression[0] == "input":
        return int(words[int(expression[1])])
    _, k0, k1, hi, lo, out = expression
    pair = threefry2x32((evaluate_key(k0, words), evaluate_key(k1, words)),
                        np.array([hi], np.uint32), np.array([lo], np.uint32))
    return int(pair[int(out)][0])


def uniform(indices: np.ndarray, state: np.ndarray,
            key: tuple[object, ...] = DEFAULT_KEY) -> np.ndarray:
    """FP32 uniforms in [0, 1), ``(bits >> 9) * 2**-23``, keyed by the key input's words in 16-bit
    halves (``state``) and the two key words' expressions (:func:`evaluate_key`)."""
    words = from_halves(np.asarray(state, np.float64).reshape(-1, 2))
    k0, k1 = key
    assert isinstance(k0, tuple) and isinstance(k1, tuple)
    bits = random_bits(indices, (evaluate_key(k0, words), evaluate_key(k1, words)))
    return ((bits >> np.uint32(9)).astype(np.float32) * np.float32(2.0 ** -23)).astype(np.float32)


def to_halves(values: np.ndarray) -> np.ndarray:
    """uint32 values as FP32 ``[..., 2]`` (high 16 bits, low 16 bits): exact in FP32."""
    v = np.asarray(values).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    return np.stack([(v >> np.uint64(16)), v & np.uint64(0xFFFF)], axis=-1).astype(np.float32)


def from_halves(halves: np.ndarray) -> np.ndarray:
    """The uint32 values of :func:`to_halves`' ``[..., 2]`` form."""
    h = np.asarray(halves, np.float64).astype(np.uint64)
    return ((h[..., 0] << np.uint64(16)) | h[..., 1]).astype(np.uint32)


__all__ = ["DEFAULT_KEY", "evaluate_key", "from_halves", "random_bits", "threefry2x32", "to_halves",
           "uniform"]
