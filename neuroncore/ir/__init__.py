"""HLO-level IR: the graph, its builder API, and NumPy reference semantics."""

from neuroncore.ir.builder import GraphBuilder, GraphError
from neuroncore.ir.graph import ALL_OPS, Graph, Initializer, Op, SourceFrame
from neuroncore.ir.reference import run_reference

__all__ = ["ALL_OPS", "Graph", "GraphBuilder", "GraphError", "Initializer", "Op", "SourceFrame",
           "run_reference"]
