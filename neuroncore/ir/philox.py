"""Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11), as the core's RNG computes them.

A counter-based generator has no sequential state: the random word of element ``i`` is a pure
function of a key and a counter, ``philox(key=(seed, offset), counter=(i, i >> 32, stream, 0))``.
That is what a device needs: every tile of a tensor computes its own elements independently, in any
order, on any engine, and the program's reference semantics give the same numbers. The key is the
program's RNG state input (a seed and a per-execution offset, fed by the host, so each step draws new
numbers); ``stream`` tells apart the random ops of one program. PyTorch's CUDA generator is Philox
too (with its own counter layout), so the values differ from torch's bit for bit but not in law.

A tensor-parallel rank that needs only its block of a random tensor (its heads of an attention
dropout mask) draws that block alone: its RNG state carries a third word, the rank, and its op a
``block`` attribute, and each element's counter is its position in the *whole* tensor
(:func:`block_indices`), so the ranks' blocks put together equal what one core draws.

Values are exact in FP32: the state words are integers below 2**24, the uniform is the top 24 bits
of the first output word times 2**-24, in [0, 1).
"""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
STATE_LIMIT = 1 << 24
"""State words (seed, offset) are integers below this: exact in the FP32 tensors that carry them."""


def philox4x32(counter: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
               key: tuple[int, int], rounds: int = 10) -> tuple[np.ndarray, ...]:
    """The four 32-bit output words of Philox4x32 for arrays of counters (uint32 each)."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint32) for c in counter)
    k0, k1 = np.uint32(key[0] & 0xFFFFFFFF), np.uint32(key[1] & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        for _ in range(rounds):
            p0 = _M0 * c0.astype(np.uint64)
            p1 = _M1 * c2.astype(np.uint64)
            hi0, lo0 = (p0 >> _SHIFT).astype(np.uint32), (p0 & _LOW).astype(np.uint32)
            hi1, lo1 = (p1 >> _SHIFT).astype(np.uint32), (p1 & _LOW).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0, k1 = np.uint32(k0 + _W0), np.uint32(k1 + _W1)
    return c0, c1, c2, c3


def uniform(indices: np.ndarray, seed: int, offset: int, stream: int) -> np.ndarray:
    """FP32 uniforms in [0, 1) for the elements ``indices`` (linear positions in their tensor)."""
    idx = np.asarray(indices, np.int64)
    low = (idx & 0xFFFFFFFF).astype(np.uint32)
    high = (idx >> 32).astype(np.uint32)
    streams = np.full(idx.shape, stream & 0xFFFFFFFF, np.uint32)
    word = philox4x32((low, high, streams, np.zeros(idx.shape, np.uint32)), (int(seed), int(offset)))[0]
    return ((word >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


def block_indices(local: np.ndarray, block: tuple[tuple[int, ...], int, int, int], rank: int) -> np.ndarray:
    """The linear positions in the whole tensor of a rank's block's elements (``local``: their linear
    positions in the block), so that a block draws exactly the numbers the whole tensor would have at
    those places: how a tensor-parallel rank draws its slice of a dropout mask
    (``neuroncore.parallel.sharding``). ``block`` = (the whole shape, the split dim, ``outer``,
    ``tp``), a ``Split`` as the sharding pass cuts it: the dim, viewed as ``[outer, n]``, cut into
    ``tp`` blocks of ``n // tp`` per outer row, rank r holding block r of every row."""
    whole, dim, outer, tp = block
    shape = list(whole)
    shape[dim] //= tp
    coords = list(np.unravel_index(np.asarray(local, np.int64), shape))
    per = shape[dim] // outer  # elements of the dim per outer row in the block
    c = coords[dim]
    coords[dim] = (c // per) * (per * tp) + rank * per + c % per
    return np.ravel_multi_index(tuple(coords), tuple(whole)).astype(np.int64)


def state_words(state: np.ndarray) -> tuple[int, int]:
    """(seed, offset) from an RNG state tensor's first two values (FP32 integers)."""
    flat = np.asarray(state, np.float64).reshape(-1)
    return int(flat[0]), int(flat[1])


__all__ = ["STATE_LIMIT", "block_indices", "philox4x32", "state_words", "uniform"]
