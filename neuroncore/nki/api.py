"""Running kernels: ``nki.jit``, ``simulate_kernel``, ``baremetal``, ``benchmark``, ``profile``.

A kernel call runs the kernel's Python once per SPMD program (:mod:`neuroncore.nki.tracer`), then
loads the instructions it emitted onto a core of a simulated instance and executes them with the
runtime's timing model, reporting to the event sink like any model (so ``neuron-profile capture``
records it). Arguments may be NumPy arrays, PyTorch tensors or JAX arrays (outputs come back as the
same kind), or :class:`ShapeSpec` for a timing-only run from shapes.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuroncore.compiler.program import Program
from neuroncore.events import EventSink
from neuroncore.hardware import CoreSpec, core_spec
from neuroncore.nki import dtypes as ndt
from neuroncore.nki.errors import NkiError
from neuroncore.nki.tracer import HBM_BUFFERS, KernelTrace, Tensor, View, activate, as_view
from neuroncore.runtime import Instance
from neuroncore.runtime.device import ExecutionResult

DEFAULT_INSTANCE = "trn1.2xlarge"  # the tutorial's figures are for one trn1 NeuronCore


@dataclass(frozen=True)
class ShapeSpec:
    """An argument known only by shape and dtype (timing-only runs)."""

    shape: tuple[int, ...]
    dtype: str = "bfloat16"


@dataclass
class KernelRun:
    """One kernel call: its outputs (None when timing-only), the program it became, its execution."""

    outputs: Any
    program: Program
    execution: ExecutionResult

    @property
    def latency_ns(self) -> int:
        return self.execution.device_time_ns

    @property
    def latency_us(self) -> float:
        return self.latency_ns / 1000.0

    @property
    def flops(self) -> int:
        return int(self.program.raw_flops.sum())

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: PE FLOPs run (matmuls and PE transposes, BF16-equivalent) over
        the PE's BF16 peak for the kernel's duration (neuroncore.md §3.6)."""
        t = self.latency_ns * 1e-9
        work = float(self.program.adjusted_flops.sum() + self.program.transpose_flops.sum())
        peak = self.program.spec.pe_peak_bf16_flops_per_s
        return work / (peak * t) if t > 0 else 0.0

    @property
    def mfu(self) -> float:
        t = self.latency_ns * 1e-9
        peak = self.program.spec.pe_peak_bf16_flops_per_s
        return float(self.program.adjusted_flops.sum()) / (peak * t) if t > 0 else 0.0


class _Instances:
    """One simulated instance per (instance type, sink), made on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[tuple[str, int], Instance] = {}

    def get(self, name: str, sink: EventSink | None = None) -> Instance:
        key = (name, id(sink) if sink is not None else 0)
        with self._lock:
            inst = self._made.get(key)
            if inst is None:
                inst = Instance(name, sink=sink) if sink is not None else Instance(name)
                self._made[key] = inst
            return inst


INSTANCES = _Instances()


# -- arguments ----------------------------------------------------------------------------------


def _kind(x: Any) -> str:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return "jax"
    return "numpy"


def _to_numpy(x: Any) -> tuple[np.ndarray, ndt.NkiDtype]:
    kind = _kind(x)
    if kind == "torch":
        dtype = ndt.resolve(str(x.dtype))
        t = x.detach().cpu()
        if dtype.is_float:
            t = t.float()
        return t.numpy(), dtype
    arr = np.asarray(x)
    return arr, ndt.resolve(arr.dtype)


def _from_numpy(values: np.ndarray, dtype: ndt.NkiDtype, like: str) -> Any:
    out = (
        values.astype(ndt.numpy_storage(dtype))
        if dtype.is_float or dtype.kind == "b"
        else values.astype(dtype.name)
    )
    if like == "torch":
        import torch

        tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype.name)
        if tdtype is not None:
            return torch.from_numpy(values.astype(np.float32)).to(tdtype)
        return torch.from_numpy(np.ascontiguousarray(out))
    if like == "jax":
        import jax.numpy as jnp

        return jnp.asarray(out)
    return out


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, ShapeSpec)) or (_kind(x) in ("torch", "jax") and hasattr(x, "shape"))


# -- running --------------------------------------------------------------------------------------


def run_kernel(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], *,
               grid: tuple[int, ...] = (), timing_only: bool | None = None, target: str | None = None,
               instance: str | None = None, sink: EventSink | None = None) -> KernelRun:
    """Run ``fn`` as a kernel on the simulated core; see the module docstring."""
    instance_name = instance or DEFAULT_INSTANCE
    inst = INSTANCES.get(instance_name, sink)
    spec = core_spec(target) if target else inst.spec.chip.core
    trace, outputs = trace_kernel(fn, args, kwargs, spec=spec, grid=grid, timing_only=timing_only)
    program = trace.program()
    core = inst.core(0)
    model = core.load(program)
    execution = model.execute(timing_only=True)
    core.unload(model)  # a kernel call does not stay resident
    return KernelRun(outputs, program, execution)


def trace_kernel(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], *, spec: CoreSpec,
                 grid: tuple[int, ...] = (), timing_only: bool | None = None,
                 trace: KernelTrace | None = None) -> tuple[KernelTrace, Any]:
    """Run the kernel's Python (every SPMD program of ``grid``) into ``trace`` (a new one unless
    given); returns the trace and the outputs, as the kind of array the arguments were."""
    if timing_only is None:
        timing_only = any(isinstance(a, ShapeSpec) for a in [*args, *kwargs.values()])
    code = getattr(fn, "__code__", None)
    if trace is None:
        trace = KernelTrace(spec, name=getattr(fn, "__name__", "kernel"), code=code, numerics=not timing_only)
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    like = "numpy"
    bound: list[Any] = []
    for i, a in enumerate(args):
        bound.append(_bind(trace, names[i] if i < len(names) else f"arg{i}", a))
        if _is_array(a) and not isinstance(a, (np.ndarray, ShapeSpec)):
            like = _kind(a)
    bound_kw = {k: _bind(trace, k, v) for k, v in kwargs.items()}
    shape = tuple(int(g) for g in grid) or (1,)
    trace.grid_shape = shape
    previous = activate(trace)
    result: Any = None
    try:
        for position in itertools.product(*(range(g) for g in shape)):
            trace.start_program(tuple(position))
            out = fn(*bound, **bound_kw)
            if result is None:
                result = out
    finally:
        activate(previous)
    return trace, _outputs(trace, result, like)


def _bind(trace: KernelTrace, name: str, value: Any) -> Any:
    if isinstance(value, Tensor):  # already bound (a kernel embedded in a compiled model)
        return value
    if isinstance(value, ShapeSpec):
        return trace.input(name, value.shape, value.dtype, None)
    if _is_array(value):
        arr, dtype = _to_numpy(value)
        return trace.input(name, tuple(arr.shape), dtype, arr)
    return value


def _outputs(trace: KernelTrace, result: Any, like: str) -> Any:
    def one(t: Any) -> Any:
        if isinstance(t, View):
            t = t.tensor
        if not isinstance(t, Tensor):
            return t
        if t.buffer not in HBM_BUFFERS:
            raise trace.error(
                f"the kernel returned {t.name} in {t.buffer.upper()}; return HBM tensors "
                f"(nl.ndarray(..., buffer=nl.shared_hbm))"
            )
        trace.mark_output(t)
        if trace.returned is None:
            trace.returned = t
        if t.data is None:
            return None
        return _from_numpy(np.asarray(t.data), t.dtype, like)

    if isinstance(result, (tuple, list)):
        return type(result)(one(r) for r in result)
    return one(result)


# -- decorators ----------------------------------------------------------------------------------


class Kernel:
    """What ``@nki.jit`` makes: call it with arrays; ``kernel[grid](...)`` launches an SPMD grid."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        grid: tuple[int, ...] = (),
        mode: str = "auto",
        options: dict[str, Any] | None = None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.grid = grid
        self.mode = mode
        self.options = options or {}
        self.last_run: KernelRun | None = None
        self.benchmark_result: BenchmarkResult | None = None

    def __getitem__(self, grid: Any) -> Kernel:
        dims = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        flat: list[int] = []
        for d in dims:
            flat.append(int(getattr(d, "size", d)))
        return Kernel(self.fn, grid=tuple(flat), mode=self.mode, options=self.options)

    def run(self, *args: Any, timing_only: bool | None = None, **kwargs: Any) -> KernelRun:
        run = run_kernel(
            self.fn,
            args,
            kwargs,
            grid=self.grid,
            timing_only=timing_only,
            target=self.options.get("platform_target"),
        )
        self.last_run = run
        return run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from neuroncore.nki import embed

        if embed.is_torch_tracing(args):  # inside torch.export: one op the compiler lowers to this kernel
            return embed.call_in_torch(self.fn, args, kwargs)
        if embed.is_jax_tracing(args):  # inside a traced JAX function: one custom call, the same op
            return embed.call_in_jax(self.fn, args, kwargs)
        if self.mode == "benchmark":
            return self._benchmark(args, kwargs)
        if self.mode == "profile":
            return self._profile(args, kwargs)
        return self.run(*args, **kwargs).outputs

    def _benchmark(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        warmup = int(self.options.get("warmup", 2))
        iters = int(self.options.get("iters", 10))
        run = self.run(*args, **kwargs)
        model = INSTANCES.get(DEFAULT_INSTANCE).core(0)
        loaded = model.load(run.program)
        try:
            for _ in range(warmup):
                loaded.execute(timing_only=True)
            times = [loaded.execute(timing_only=True).device_time_ns for _ in range(iters)]
        finally:
            model.unload(loaded)
        self.benchmark_result = BenchmarkResult(LatencyStats(np.asarray(times, np.float64) / 1000.0))
        return run.outputs

    def _profile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        directory = self.options.get("working_directory") or os.getcwd()
        os.makedirs(directory, exist_ok=True)
        name = self.options.get("save_trace_name") or f"{self.fn.__name__}_profile"
        target = os.path.join(directory, str(name).removesuffix(".ntff"))
        from neuronscope import settings

        os.environ[settings.PROFILE_DIR.name] = target
        try:
            run = run_kernel(self.fn, args, kwargs, grid=self.grid, sink=EventSink())
        finally:
            os.environ.pop(settings.PROFILE_DIR.name, None)
        self.last_run = run
        return run.outputs


@dataclass
class LatencyStats:
    """``nc_latency`` of a benchmark: per-iteration device latency in microseconds."""

    samples_us: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def get_latency_percentile(self, percentile: float) -> float:
        return float(np.percentile(self.samples_us, percentile)) if self.samples_us.size else 0.0


@dataclass
class BenchmarkResult:
    nc_latency: LatencyStats


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@nki.jit`` (with or without options); ``mode='benchmark'``/``'profile'`` as the real one."""

    def wrap(f: Callable[..., Any]) -> Kernel:
        if isinstance(f, Kernel):
            f = f.fn
        return Kernel(f, mode=str(options.pop("mode", "auto")), options=options)

    return wrap(fn) if fn is not None else wrap


trace = jit  # older decorator name


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a kernel's numerics (and timing) on NumPy inputs; returns its outputs."""
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else ()
    return run_kernel(fn, args, kwargs, grid=grid).outputs


def baremetal(kernel: Any = None, **options: Any) -> Any:
    """``@nki.baremetal``: run on "the device" (here: the simulated core) with NumPy arrays."""

    def wrap(f: Any) -> Kernel:
        return Kernel(f.fn if isinstance(f, Kernel) else f, options=options)

    return wrap(kernel) if kernel is not None else wrap


def benchmark(kernel: Any = None, **options: Any) -> Any:
    """``@nki.benchmark(warmup=, iters=)``: afterwards ``kernel.benchmark_result.nc_latency
    .get_latency_percentile(50)`` is the simulated device latency in microseconds."""

    def wrap(f: Any) -> Kernel:
        return Kernel(f.fn if isinstance(f, Kernel) else f, mode="benchmark", options=options)

    return wrap(kernel) if kernel is not None else wrap


def profile(kernel: Any = None, **options: Any) -> Any:
    """``@nki.profile(working_directory=D)``: the call records one of our profiles in
    ``D/<save_trace_name or kernel>_profile`` (closed when the program exits)."""

    def wrap(f: Any) -> Kernel:
        return Kernel(f.fn if isinstance(f, Kernel) else f, mode="profile", options=options)

    return wrap(kernel) if kernel is not None else wrap


def tensor_values(x: Any) -> np.ndarray:
    """The values of a tile or HBM tensor (tests, debugging)."""
    v = as_view(x)
    return np.asarray(v.read())


__all__ = [
    "BenchmarkResult",
    "Kernel",
    "KernelRun",
    "LatencyStats",
    "NkiError",
    "ShapeSpec",
    "baremetal",
    "benchmark",
    "jit",
    "profile",
    "run_kernel",
    "simulate_kernel",
    "tensor_values",
    "trace",
]
