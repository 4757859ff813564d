"""Extra ATen handlers for the PyTorch frontend, registered by op name.

``torch_frontend._Converter`` looks an ATen op up as a ``_aten_<name>`` method first and in
:data:`HANDLERS` next, so op families (masks and index arithmetic, convolutions, routing) live in
their own small modules (``torch_masks``, ``torch_conv``, ``torch_routing``) instead of growing the
converter. A handler gets the converter, the FX node and its normalised keyword arguments, and
returns the IR value (an ``Op``, a ``Scalar``, a tuple of them) or ``NotImplemented``, which keeps
the node as an unsupported ``aten.<name>`` op for ``check`` to list.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from neuroncore.frontends.torch_frontend import _Converter

Handler = Callable[["_Converter", "torch.fx.Node", dict[str, Any]], Any]
HANDLERS: dict[str, Handler] = {}


def handles(*names: str) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of the ATen ops ``names`` (overload-free names: ``cumsum``)."""

    def register(fn: Handler) -> Handler:
        for name in names:
            if name in HANDLERS:
                raise ValueError(f"aten.{name} has two handlers")
            HANDLERS[name] = fn
        return fn

    return register


MODULES = ("neuroncore.frontends.torch_masks", "neuroncore.frontends.torch_conv",
           "neuroncore.frontends.torch_scatter", "neuroncore.frontends.torch_backward",
           "neuroncore.frontends.torch_nki", "neuroncore.frontends.torch_random",
           "neuroncore.frontends.torch_rounding", "neuroncore.frontends.torch_special")


def load_handlers() -> None:
    """Import the op-family modules (each registers its handlers on import)."""
    for module in MODULES:
        importlib.import_module(module)


__all__ = ["HANDLERS", "Handler", "handles", "load_handlers"]
