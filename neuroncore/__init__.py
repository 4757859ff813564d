"""neuroncore: an instrumented model of AWS NeuronCore-v2/v3.

Build a program (``GraphBuilder`` or a workload), ``compile`` it for a core, load it on an
``Instance`` and execute it: with numerics (real outputs) or timing only (shapes only). Everything the
core does is reported through ``neuroncore.events.sink``.

The names below are imported on first use (PEP 562), so that ``formats`` can read the shared
vocabularies of ``neuroncore.enums`` and ``neuroncore.record_kinds`` without loading the compiler,
runtime and frontends.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuroncore.compiler import CompileError, Program, UnsupportedOpsError, compile  # noqa: A004
    from neuroncore.compiler.options import AutoCast, AutoCastType, CompilerOptions, Quantization
    from neuroncore.events import EventBatch, EventSink, sink
    from neuroncore.frontends import TracedModel, TraceError, check, trace
    from neuroncore.hardware import INSTANCE_TYPES, NC_V2, NC_V3, CoreSpec, Engine
    from neuroncore.ir import Graph, GraphBuilder, GraphError, run_reference
    from neuroncore.runtime import ExecutionError, ExecutionResult, Instance
    from neuroncore.training import TrainStep, trace_train_step

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("CompileError", "Program", "UnsupportedOpsError", "compile"), "neuroncore.compiler"),
    **dict.fromkeys(("AutoCast", "AutoCastType", "CompilerOptions", "Quantization"),
                    "neuroncore.compiler.options"),
    **dict.fromkeys(("EventBatch", "EventSink", "sink"), "neuroncore.events"),
    **dict.fromkeys(("TracedModel", "TraceError", "check", "trace"), "neuroncore.frontends"),
    **dict.fromkeys(("INSTANCE_TYPES", "NC_V2", "NC_V3", "CoreSpec", "Engine"), "neuroncore.hardware"),
    **dict.fromkeys(("Graph", "GraphBuilder", "GraphError", "run_reference"), "neuroncore.ir"),
    **dict.fromkeys(("ExecutionError", "ExecutionResult", "Instance"), "neuroncore.runtime"),
    **dict.fromkeys(("TrainStep", "trace_train_step"), "neuroncore.training"),
}

__all__ = [
    "INSTANCE_TYPES",
    "NC_V2",
    "NC_V3",
    "AutoCast",
    "AutoCastType",
    "CompileError",
    "CompilerOptions",
    "CoreSpec",
    "Engine",
    "EventBatch",
    "EventSink",
    "ExecutionError",
    "ExecutionResult",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "Instance",
    "Program",
    "Quantization",
    "TraceError",
    "TracedModel",
    "TrainStep",
    "UnsupportedOpsError",
    "check",
    "compile",
    "run_reference",
    "sink",
    "trace",
    "trace_train_step",
]


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` the first time it is asked for, then keep it."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'neuroncore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
