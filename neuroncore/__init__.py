"""neuroncore: an instrumented model of AWS NeuronCore-v2/v3.

Build a program (``GraphBuilder`` or a workload), ``compile`` it for a core, load it on an
``Instance`` and execute it: with numerics (real outputs) or timing only (shapes only). Everything the
core does is reported through ``neuroncore.events.sink``.
"""

from neuroncore.compiler import CompileError, Program, UnsupportedOpsError, compile  # noqa: A004
from neuroncore.events import EventBatch, EventSink, sink
from neuroncore.frontends import TracedModel, TraceError, check, trace
from neuroncore.hardware import INSTANCE_TYPES, NC_V2, NC_V3, CoreSpec, Engine
from neuroncore.ir import Graph, GraphBuilder, GraphError, run_reference
from neuroncore.runtime import ExecutionError, ExecutionResult, Instance

__version__ = "0.1.0"

__all__ = [
    "INSTANCE_TYPES", "NC_V2", "NC_V3", "CompileError", "CoreSpec", "Engine", "EventBatch",
    "EventSink", "ExecutionError", "ExecutionResult", "Graph", "GraphBuilder", "GraphError",
    "Instance", "Program", "TraceError", "TracedModel", "UnsupportedOpsError", "check", "compile",
    "run_reference", "sink", "trace",
]
