"""``neuronscope::nki_kernel``: an NKI kernel called inside a traced model (``neuroncore.nki.embed``)
becomes one IR op ``nki_kernel`` whose ``kernel`` attribute names the call; the compiler lowers it by
running the kernel into the program."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuroncore.frontends.torch_ops import handles
from neuroncore.ir.graph import Op

if TYPE_CHECKING:
    import torch

    from neuroncore.frontends.torch_frontend import _Converter


@handles("nki_kernel")
def _nki_kernel(conv: _Converter, node: torch.fx.Node, args: dict[str, Any]) -> Any:
    tensors, kernel = node.args[0], node.args[1]
    operands = [conv._value(n) for n in tensors]  # type: ignore[union-attr]
    if not all(isinstance(o, Op) for o in operands):
        return NotImplemented
    meta = node.meta["val"]
    return conv.b.add_op(
        "nki_kernel", operands, tuple(int(d) for d in meta.shape), conv._out_dtype(meta), kernel=str(kernel)
    )
