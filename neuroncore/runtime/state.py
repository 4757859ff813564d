"""Device-resident state: tensors a core keeps in its HBM from one execution to the next.

A decoder's KV cache lives on the device while it generates: each step's program reads the cache
where it is and writes its new rows back in place, so no token costs a host round trip of the cache
(transformers-neuronx keeps it so; XLA calls the pairing of an input with an output buffer an
*input/output alias*). Here a core owns named :class:`ResidentTensor` s, and an execution is told by a
:class:`StateBinding` which of its parameters read one and which of its outputs write one back:

    core.allocate_state("cache.k0", (batch, heads, 512, head_dim), DType.FP32)
    binding = StateBinding(reads={5: "cache.k0"}, writes={1: "cache.k0"})
    result = model.execute([ids, pos, mask, slot, last, None], state=binding)  # None: resident

A program whose parameter is smaller than the resident tensor reads its *leading corner*
(``tensor[:s0, :s1, ...]``) and writes its output back there: the program of a 128-position bucket
works on the first 128 positions of a 512-position cache (transformers-neuronx's buckets share one
cache the same way). Only the host's own inputs and the outputs it gets back count as host
transfers (``ExecutionResult.host_to_device_bytes`` / ``device_to_host_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from neuroncore.dtypes import DType, round_to, to_storage


class StateError(ValueError):
    """A binding that does not fit the program or the core's resident tensors."""


@dataclass
class ResidentTensor:
    """One tensor in a core's HBM across executions. Its values exist only once an execution with
    numerics touched it (zeros until written); timing-only runs never allocate them."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    values: np.ndarray | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def _corner(self, shape: tuple[int, ...]) -> tuple[slice, ...]:
        if len(shape) != len(self.shape) or any(s > t for s, t in zip(shape, self.shape)):
            raise StateError(f"resident tensor {self.name} {list(self.shape)} has no leading corner "
                             f"of shape {list(shape)}")
        return tuple(slice(0, s) for s in shape)

    def _array(self) -> np.ndarray:
        if self.values is None:
            self.values = to_storage(np.zeros(self.shape, np.float32), self.dtype)
        return self.values

    def read(self, shape: tuple[int, ...]) -> np.ndarray:
        """The leading corner of ``shape`` (a view: the device reads it where it is)."""
        return self._array()[self._corner(shape)]

    def write(self, value: np.ndarray) -> None:
        """Store ``value`` into the leading corner of its shape, in place."""
        corner = self._corner(tuple(value.shape))
        array = self._array()
        array[corner] = to_storage(round_to(np.asarray(value, np.float32), self.dtype), self.dtype)


@dataclass(frozen=True)
class StateBinding:
    """Which parameters of a program read resident tensors and which outputs are written back to
    one instead of returned to the host (parameter and output numbers in the program's order)."""

    reads: Mapping[int, str] = field(default_factory=dict)
    writes: Mapping[int, str] = field(default_factory=dict)


class ResidentState:
    """The resident tensors of one core, by name."""

    def __init__(self) -> None:
        self.tensors: dict[str, ResidentTensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def __getitem__(self, name: str) -> ResidentTensor:
        tensor = self.tensors.get(name)
        if tensor is None:
            raise StateError(f"no resident tensor {name!r} on this core "
                             f"(has: {', '.join(self.tensors) or 'none'})")
        return tensor

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def bind_inputs(self, params: Sequence[tuple[int, ...]],
                    inputs: Sequence[np.ndarray | None], binding: StateBinding) -> list[np.ndarray]:
        """The program's inputs: the host's where given, the resident tensors' corners where bound
        (those slots of ``inputs`` are None)."""
        if len(inputs) != len(params):
            raise StateError(f"expected {len(params)} inputs (None where resident), got {len(inputs)}")
        arrays: list[np.ndarray] = []
        for number, (shape, value) in enumerate(zip(params, inputs)):
            name = binding.reads.get(number)
            if name is not None:
                if value is not None:
                    raise StateError(f"input {number} is read from resident {name}; pass None for it")
                arrays.append(self[name].read(shape))
            elif value is None:
                raise StateError(f"input {number} is not bound to a resident tensor; it needs a value")
            else:
                arrays.append(np.asarray(value))
        return arrays

    def store_outputs(self, outputs: list[np.ndarray], binding: StateBinding) -> list[np.ndarray]:
        """Write the bound outputs back in place; the others, in order, go to the host."""
        for number, name in binding.writes.items():
            self[name].write(outputs[number])
        return [o for i, o in enumerate(outputs) if i not in binding.writes]


def without_holes(inputs: Sequence[np.ndarray | None] | Mapping[str, np.ndarray]
                  ) -> Sequence[np.ndarray] | Mapping[str, np.ndarray]:
    """Inputs of an execution without resident state: a None is a mistake, said in one line."""
    if isinstance(inputs, Mapping):
        return inputs
    values = list(inputs)
    holes = [i for i, v in enumerate(values) if v is None]
    if holes:
        raise StateError(f"input {holes[0]} is None: only inputs bound to resident state "
                         f"(state=StateBinding(...)) may be left out")
    return [v for v in values if v is not None]


def host_bytes(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[DType],
               skip: Mapping[int, str]) -> int:
    """Bytes of the tensors the host sends or receives: every one not bound to resident state."""
    return sum(math.prod(s) * d.itemsize for i, (s, d) in enumerate(zip(shapes, dtypes)) if i not in skip)


__all__ = ["ResidentState", "ResidentTensor", "StateBinding", "StateError", "host_bytes", "without_holes"]
