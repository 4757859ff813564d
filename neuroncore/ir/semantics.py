"""What every IR op computes, in NumPy: the reference the compiled program is checked against.

Values are FP32 working arrays; each op's result is rounded to its own dtype, as a framework that
stores every intermediate in that dtype would. Matmuls accumulate in FP32 (as PSUM does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from neuroncore.dtypes import round_to
from neuroncore.ir import philox, threefry
from neuroncore.ir.conv import conv_reference, reduce_window_reference
from neuroncore.ir.graph import Op

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x: np.ndarray, approximate: str = "tanh") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf, otypes=[np.float32])(x / math.sqrt(2.0)))


def gelu_dx(x: np.ndarray) -> np.ndarray:
    """d/dx of the exact GELU x Phi(x): Phi(x) + x phi(x)."""
    return (0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
            ).astype(np.float32)


def silu_dx(x: np.ndarray) -> np.ndarray:
    """d/dx of x sigmoid(x): sigmoid(x) (1 + x (1 - sigmoid(x)))."""
    s = logistic(x)
    return s * (1.0 + x * (1.0 - s))


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[np.float32])(x)


def logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exponential": np.exp,
    "tanh": np.tanh,
    "logistic": logistic,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sqrt": np.sqrt,
    "log": np.log,
    "negate": np.negative,
    "abs": np.abs,
    "cosine": np.cos,
    "sine": np.sin,
    "erf": lambda x: _erf(x),
    "silu": lambda x: x * logistic(x),
    "gelu_dx": gelu_dx,
    "silu_dx": silu_dx,
}

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
}

COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * gamma


def broadcast_in_dim(x: np.ndarray, shape: tuple[int, ...], dims: tuple[int, ...]) -> np.ndarray:
    """XLA broadcast_in_dim: operand dim i becomes output dim ``dims[i]``."""
    expanded = [1] * len(shape)
    for operand_dim, out_dim in enumerate(dims):
        expanded[out_dim] = x.shape[operand_dim]
    return np.broadcast_to(x.reshape(expanded), shape)


def dot_general(lhs: np.ndarray, rhs: np.ndarray, attrs: dict) -> np.ndarray:
    """Batched matmul with batch dims leading and one contracting dim per operand."""
    nb = attrs["batch_dims"]
    a = lhs if attrs["lhs_contract"] == lhs.ndim - 1 else np.swapaxes(lhs, -1, -2)
    b = rhs if attrs["rhs_contract"] == rhs.ndim - 2 else np.swapaxes(rhs, -1, -2)
    assert a.ndim == nb + 2 and b.ndim == nb + 2
    return np.matmul(a.astype(np.float32), b.astype(np.float32))


def evaluate(op: Op, args: list[np.ndarray]) -> np.ndarray:
    """The value of ``op`` given its operands' values (FP32 working arrays)."""
    result = _evaluate(op, args)
    return round_to(np.asarray(result, dtype=np.float32).reshape(op.shape), op.dtype)


def _evaluate(op: Op, args: list[np.ndarray]) -> np.ndarray:
    code, attrs = op.opcode, op.attrs
    if code == "constant":
        if "init" in attrs:
            return attrs["init"].materialize(op.shape)
        return np.full(op.shape, attrs["value"], np.float32)
    if code in UNARY:
        with np.errstate(all="ignore"):
            return UNARY[code](args[0])
    if code in BINARY:
        with np.errstate(all="ignore"):
            return BINARY[code](args[0], args[1])
    if code == "convert":
        return args[0]
    if code == "compare":
        return COMPARE[attrs["direction"]](args[0], args[1]).astype(np.float32)
    if code == "select":
        return np.where(args[0] != 0, args[1], args[2])
    if code == "broadcast":
        return broadcast_in_dim(args[0], op.shape, attrs["dims"])
    if code == "reshape":
        return args[0].reshape(op.shape)
    if code == "transpose":
        return np.transpose(args[0], attrs["permutation"])
    if code == "slice":
        index = tuple(
            slice(s, e, st) for s, e, st in zip(attrs["starts"], attrs["limits"], attrs["strides"])
        )
        return args[0][index]
    if code == "concatenate":
        return np.concatenate(args, axis=attrs["dimension"])
    if code == "reduce":
        fn = np.sum if attrs["kind"] == "sum" else np.max
        return fn(args[0], axis=tuple(attrs["dimensions"]))
    if code == "dot":
        return dot_general(args[0], args[1], attrs)
    if code == "gather":
        indices = args[1].astype(np.int64)
        return args[0][indices]
    if code == "rng" and attrs.get("algorithm") == "threefry2x32":  # JAX's generator, bit for bit
        return threefry.uniform(np.arange(op.size).reshape(op.shape), args[0],
                                attrs.get("key", threefry.DEFAULT_KEY))
    if code == "rng":
        seed, offset = philox.state_words(args[0])
        indices = np.arange(op.size).reshape(op.shape)
        if attrs.get("block") is not None:  # a rank's block: state word 2 is the rank
            indices = philox.block_indices(indices, attrs["block"], int(np.asarray(args[0]).reshape(-1)[2]))
        return philox.uniform(indices, seed, offset, attrs["stream"])
    if code == "iota":
        dim = attrs["dimension"]
        shape = [1] * len(op.shape)
        shape[dim] = op.shape[dim]
        return np.broadcast_to(np.arange(op.shape[dim], dtype=np.float32).reshape(shape), op.shape)
    if code == "softmax":
        return softmax(args[0])
    if code == "layer_norm":
        return layer_norm(args[0], args[1], args[2], attrs["eps"])
    if code == "rms_norm":
        return rms_norm(args[0], args[1], attrs["eps"])
    if code == "gelu":
        return gelu(args[0], attrs.get("approximate", "tanh"))
    if code == "convolution":
        return conv_reference(args[0], args[1], attrs)
    if code == "reduce-window":
        return reduce_window_reference(args[0], attrs)
    raise ValueError(f"no reference semantics for {op.describe()}")
