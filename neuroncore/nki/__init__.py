"""NKI on the simulated NeuronCore: run Neuron Kernel Interface kernels unchanged, timed and profiled.

    from neuroncore import nki
    import neuroncore.nki.language as nl
    import neuroncore.nki.isa as nisa

or, for a kernel file written for the real toolchain (``import neuronxcc.nki as nki`` or the newer
``import nki``), unchanged: ``python -m neuroncore.nki kernel.py [ARGS]``, which makes those imports
resolve here when the real package is not installed (docs/nki.md).

Every ``nl``/``nisa`` call computes on NumPy and becomes the engine instructions the compiler emits
for it (``neuroncore.nki.tracer``); the runtime times them with the same cost model as compiled
models and reports them to the event sink, each instruction carrying the kernel line that made it.
"""

from __future__ import annotations

from neuroncore.nki import isa, language, typing
from neuroncore.nki.api import (
    BenchmarkResult,
    Kernel,
    KernelRun,
    ShapeSpec,
    baremetal,
    benchmark,
    jit,
    profile,
    run_kernel,
    simulate_kernel,
    trace,
)
from neuroncore.nki.errors import NkiError

__all__ = [
    "BenchmarkResult",
    "Kernel",
    "KernelRun",
    "NkiError",
    "ShapeSpec",
    "baremetal",
    "benchmark",
    "isa",
    "jit",
    "language",
    "profile",
    "run_kernel",
    "simulate_kernel",
    "trace",
    "typing",
]
