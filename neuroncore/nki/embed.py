"""NKI kernels inside traced PyTorch models and JAX functions: a kernel replacing a layer, as users do
with attention.

Calling an ``@nki.jit`` kernel on tensors while ``torch.export`` traces a model (``neuroncore.trace``)
records one ``neuronscope::nki_kernel`` op; the PyTorch frontend turns it into an IR op ``nki_kernel``.
Calling it on JAX tracers records one ``custom-call`` whose target names the call
(``neuronscope_nki:<key>``); the JAX frontend turns that into the same IR op
and the compiler lowers it here: the kernel's Python runs once more, timing-only, emitting straight into
the program being compiled (its operands and result are that program's HBM tensors, its instructions
parts of the IR op, each with its kernel line). Its values come from one ``KernelCall`` semantics
record that the interpreter executes by running the kernel's numerics on the HBM contents.

Limits: the kernel's SBUF/PSUM tiles are not allocated against the model's own live tiles (the
kernel's instructions order against the model's only through the HBM tensors they share), and the
kernel's arguments must be tensors, with numbers and other constants passed as keyword arguments.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np

from neuroncore.compiler.context import Context
from neuroncore.compiler.node_semantics import KernelCall
from neuroncore.enums import Memory
from neuroncore.ir.graph import Op
from neuroncore.nki import dtypes as ndt
from neuroncore.nki.api import trace_kernel
from neuroncore.nki.tracer import HBM, KernelTrace, Tensor

_LOCK = threading.Lock()
_IDS = itertools.count()
CALLS: dict[str, tuple[Any, dict[str, Any]]] = {}
"""Kernel calls seen by the PyTorch op, by key: the kernel function and its constant keyword arguments."""


def register_call(fn: Any, constants: dict[str, Any]) -> str:
    with _LOCK:
        for key, (f, c) in CALLS.items():
            if f is fn and c == constants:
                return key
        key = f"{getattr(fn, '__name__', 'kernel')}#{next(_IDS)}"
        CALLS[key] = (fn, dict(constants))
        return key


def compute_call(key: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The kernel's output for HBM contents ``inputs`` (numerics only: no timing, no events)."""
    from neuroncore.hardware import core_spec

    fn, constants = CALLS[key]
    _, out = trace_kernel(
        fn,
        [np.asarray(x, np.float32) for x in inputs],
        dict(constants),
        spec=core_spec("trn1"),
        timing_only=False,
    )
    return np.asarray(out, np.float32)


def result_shape(key: str, args: list[tuple[Any, str]]) -> tuple[int, ...]:
    """The shape of the HBM tensor call ``key`` returns for arguments of these (shape, dtype name)s:
    the kernel runs once from shapes alone, timing-only (what a framework's abstract evaluation needs)."""
    from neuroncore.hardware import core_spec
    from neuroncore.nki.api import ShapeSpec

    fn, constants = CALLS[key]
    shapes = [ShapeSpec(tuple(int(d) for d in shape), dtype) for shape, dtype in args]
    trace, _ = trace_kernel(fn, shapes, dict(constants), spec=core_spec("trn1"), timing_only=True)
    result = trace.returned
    if result is None:
        raise ValueError(f"NKI kernel {trace.name} returned no HBM tensor")
    return tuple(int(d) for d in result.shape)


def lower_call(ctx: Context, op: Op) -> None:
    """Emit the kernel call ``op`` into the program ``ctx`` is compiling (see the module docstring)."""
    key = str(op.attrs["kernel"])
    fn, constants = CALLS[key]
    names = [ctx.ensure_hbm(operand) for operand in op.operands]
    value = ctx.define(op, home=Memory.HBM)
    assert value.hbm is not None
    start = ctx.em.n_nodes
    trace = KernelTrace(
        ctx.spec,
        name=getattr(fn, "__name__", "kernel"),
        code=getattr(fn, "__code__", None),
        numerics=False,
        emitter=ctx.em,
        queues=ctx.queues,
        host_op=op.index,
    )
    args = [
        Tensor(tuple(o.shape), ndt.resolve(o.dtype), HBM, trace, name=name, key=("hbm", name))
        for o, name in zip(op.operands, names, strict=True)
    ]
    _, _ = trace_kernel(fn, args, dict(constants), spec=ctx.spec, timing_only=True, trace=trace)
    result = trace.returned
    if result is None:
        raise ValueError(f"NKI kernel {trace.name} returned no HBM tensor")
    ctx.em.rename(result.key, ("hbm", value.hbm))
    if ctx.em.n_nodes == start:
        raise ValueError(f"NKI kernel {trace.name} emitted no instructions")
    last = ctx.em.n_nodes - 1
    ctx.em.semantics[last] = KernelCall(key, tuple(names), value.hbm)
    for i, location in enumerate(trace.node_location):
        if location is not None:
            ctx.nki_locations[start + i] = location
    value.in_hbm = [True] * len(value.in_hbm)  # the kernel's stores wrote every tile


# -- the PyTorch custom op ----------------------------------------------------------------------------

_TORCH_OP: Any = None


def torch_op() -> Any:
    """``torch.ops.neuronscope.nki_kernel`` (registered on first use)."""
    global _TORCH_OP
    if _TORCH_OP is not None:
        return _TORCH_OP
    import torch

    @torch.library.custom_op(
        "neuronscope::nki_kernel", mutates_args=(), schema="(Tensor[] args, str kernel) -> Tensor"
    )
    def nki_kernel(args: list[torch.Tensor], kernel: str) -> torch.Tensor:
        out = compute_call(kernel, [a.detach().cpu().float().numpy() for a in args])
        return torch.from_numpy(np.ascontiguousarray(out)).to(args[0].dtype if args else torch.float32)

    @nki_kernel.register_fake
    def _(args: list[torch.Tensor], kernel: str) -> torch.Tensor:
        return args[0].new_empty(result_shape(kernel, [(a.shape, str(a.dtype).removeprefix("torch."))
                                                       for a in args]))

    _TORCH_OP = torch.ops.neuronscope.nki_kernel.default
    return _TORCH_OP


def is_torch_tracing(args: tuple[Any, ...]) -> bool:
    """True when the arguments are tensors of a ``torch.export`` / fake-tensor trace."""
    for a in args:
        mod = type(a).__module__
        if mod.startswith("torch") and type(a).__name__ in ("FakeTensor", "FunctionalTensor"):
            return True
    return False


def call_in_torch(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    key = register_call(fn, kwargs)
    return torch_op()(list(args), key)


# -- JAX: an XLA custom call ---------------------------------------------------------------------------

def is_jax_tracing(args: tuple[Any, ...]) -> bool:
    """True when an argument is a JAX tracer (inside ``jax.jit`` / ``neuroncore.trace`` of a function)."""
    return any(type(a).__module__.startswith("jax") and type(a).__name__.endswith("Tracer") for a in args)


def call_in_jax(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One ``custom-call`` in the traced function's HLO, which the JAX frontend turns into the IR op
    ``nki_kernel`` (the same op a PyTorch call becomes). Only lowering to HLO is asked of JAX: the target
    is never registered with XLA, so the function runs on the core, not under ``jax.jit`` on the CPU."""
    import jax

    from neuroncore.frontends.jax_frontend import NKI_CALL_TARGET_PREFIX

    key = register_call(fn, kwargs)
    shape = result_shape(key, [(a.shape, str(a.dtype)) for a in args])
    result = jax.ShapeDtypeStruct(shape, args[0].dtype)
    return jax.ffi.ffi_call(NKI_CALL_TARGET_PREFIX + key, result)(*args)


__all__ = [
    "CALLS",
    "call_in_jax",
    "call_in_torch",
    "compute_call",
    "is_jax_tracing",
    "is_torch_tracing",
    "lower_call",
    "register_call",
    "result_shape",
    "torch_op",
]
