"""Evaluate a graph op by op in NumPy: the ground truth for the compiled program's numerics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from neuroncore.dtypes import round_to, to_storage, to_working
from neuroncore.ir import threefry
from neuroncore.ir.graph import Graph
from neuroncore.ir.semantics import evaluate


def bind_inputs(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Inputs in parameter order, checked against the declared shapes."""
    if isinstance(inputs, Mapping):
        missing = [p.name for p in graph.parameters if p.name not in inputs]
        if missing:
            raise ValueError(f"missing inputs: {', '.join(missing)}")
        ordered = [inputs[p.name] for p in graph.parameters]
    else:
        ordered = list(inputs)
        if len(ordered) != len(graph.parameters):
            raise ValueError(f"expected {len(graph.parameters)} inputs, got {len(ordered)}")
    for k, (param, value) in enumerate(zip(graph.parameters, ordered)):
        if param.attrs.get("u32_halves") and tuple(np.shape(value)) == param.shape[:-1]:
            value = ordered[k] = threefry.to_halves(value)  # a uint32 input (a JAX key): exact halves
        if tuple(np.shape(value)) != param.shape:
            raise ValueError(
                f"input {param.name!r}: shape {list(np.shape(value))} given, "
                f"compiled for {list(param.shape)}"
            )
    return [np.asarray(v) for v in ordered]


def run_reference(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``graph`` in the storage dtypes of its output ops."""
    values: dict[int, np.ndarray] = {}
    for param, value in zip(graph.parameters, bind_inputs(graph, inputs)):
        values[param.index] = round_to(to_working(value), param.dtype)
    for op in graph.ops:
        if op.opcode == "parameter":
            continue
        values[op.index] = evaluate(op, [values[o.index] for o in op.operands])
    return [to_storage(values[o.index], o.dtype) for o in graph.outputs]
