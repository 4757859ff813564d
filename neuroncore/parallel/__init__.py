"""Tensor and data parallelism: shard a graph over ranks (``sharding``), run the ranks (``group``)."""

from neuroncore.parallel.group import DataParallelModel, GroupResult, TensorParallelModel
from neuroncore.parallel.sharding import ShardedGraph, ShardingError, shard

__all__ = ["DataParallelModel", "GroupResult", "ShardedGraph", "ShardingError", "TensorParallelModel",
           "shard"]
