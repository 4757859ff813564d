"""Training on the core: a PyTorch or JAX training step compiled to one program per step, the
precisions Trainium trains in, and the memory a run needs per rank (docs/training.md).

Names are imported on first use, so ``neuroncore.training.memory`` needs neither torch nor JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuroncore.training.jax_step import JaxTrainStep, trace_jax_train_step
    from neuroncore.training.precision import Precision
    from neuroncore.training.torch_step import TrainStep, trace_train_step

_EXPORTS = {
    "JaxTrainStep": "neuroncore.training.jax_step",
    "trace_jax_train_step": "neuroncore.training.jax_step",
    "Precision": "neuroncore.training.precision",
    "TrainStep": "neuroncore.training.torch_step",
    "trace_train_step": "neuroncore.training.torch_step",
}

__all__ = ["JaxTrainStep", "Precision", "TrainStep", "trace_jax_train_step", "trace_train_step"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'neuroncore.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
