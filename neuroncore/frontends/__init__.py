"""Framework frontends: PyTorch (torch.export) and JAX (jitted HLO) onto the execution core."""

from neuroncore.frontends.tracing import Converted, TracedModel, TraceError, check, frontend_for, trace

__all__ = ["Converted", "TraceError", "TracedModel", "check", "frontend_for", "trace"]
