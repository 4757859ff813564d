"""``nki.typing``: argument annotations; ``nt.tensor[shape, dtype]`` is also an argument given by
shape alone (the matmul tutorial benchmarks its kernels that way), a timing-only run."""

from __future__ import annotations

from typing import Any

from neuroncore.nki.api import ShapeSpec
from neuroncore.nki.dtypes import resolve


class tensor:
    """``nt.tensor[shape, dtype]``: a :class:`ShapeSpec`."""

    def __class_getitem__(cls, item: Any) -> Any:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (list, tuple)):
            return ShapeSpec(tuple(int(d) for d in item[0]), resolve(item[1]).name)
        return cls


class mutable_tensor(tensor):
    """``nt.mutable_tensor``: an argument the kernel writes."""


class scalar:
    """A scalar argument."""


__all__ = ["mutable_tensor", "scalar", "tensor"]
