"""Loading compiled programs onto cores and executing them (timing and numerics)."""

from neuroncore.runtime.device import ExecutionResult, Instance, LoadedModel, NeuronCore
from neuroncore.runtime.interpreter import ExecutionError
from neuroncore.runtime.scheduler import Timeline, schedule
from neuroncore.runtime.state import StateBinding, StateError

__all__ = ["ExecutionError", "ExecutionResult", "Instance", "LoadedModel", "NeuronCore", "StateBinding",
           "StateError", "Timeline", "schedule"]
