"""A JAX training step with an optax optimizer, compiled for one NeuronCore as one program.

    step = neuroncore.training.trace_jax_train_step(loss_fn, params, optax.adamw(1e-3), (x, y))
    loss = step(x, y)              # one execution; step.params / step.opt_state: the new pytrees

The step is the function every JAX training loop writes::

    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)

``jax.jit`` of that whole update lowers to one HLO module (forward, backward and the optimizer's
arithmetic), which the JAX frontend turns into IR and the compiler into one program. Parameters and
optimizer state are its inputs and outputs and stay on the core between calls
(:class:`neuroncore.runtime.device.DeviceState`); only the batch goes in and only the loss comes
out. ``step.params`` and ``step.opt_state`` are brought up to date on the host after every call.

Each op's phase comes from its HLO ``op_name``: JAX names what the backward pass computes
``transpose(jvp(loss_fn))/...`` and the forward ``jvp(loss_fn)/...``; the rest is the optimizer. The
layer path becomes ``model/<phase>/<JAX scope>`` (as the PyTorch step's), so a profile shows the
three phases as levels of the hierarchy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler.options import CompilerOptions
from neuroncore.compiler.program import Program
from neuroncore.frontends import jax_frontend
from neuroncore.frontends.hlo import parse_hlo_module
from neuroncore.frontends.tracing import TraceError
from neuroncore.ir.graph import Graph, Op
from neuroncore.runtime import Instance
from neuroncore.runtime.device import DeviceState, ExecutionResult
from neuroncore.training.memory import MemoryBreakdown, MemoryCheckError, check_fits
from neuroncore.training.precision import Precision, check_options, parse_precision
from neuroncore.training.step_records import emit_step


def _phase(op_name: str) -> str | None:
    """``backward`` for what JAX's linearization computed (``transpose(jvp(...))`` and tangents
    ``jvp(...)`` the loss does not depend on), ``optimizer`` for the rest; None without a name."""
    if not op_name:
        return None
    if "transpose(" in op_name or "jvp(" in op_name:
        return "backward"
    return "optimizer"


def _op_names(lowered: Any) -> dict[str, str]:
    """HLO instruction name -> its full ``op_name``, over every computation of the module (the
    names inside a called computation are relative: the call's own op_name is put in front)."""
    text, _proto = jax_frontend.hlo_text(lowered)
    computations = parse_hlo_module(text)
    prefix: dict[str, str] = {}
    callers: dict[str, tuple[str, str]] = {}  # callee -> (calling computation, the call's op_name)
    for comp in computations.values():
        for ins in comp.instructions:
            target = ins.attrs.get("to_apply") or ins.attrs.get("calls")
            if ins.opcode in ("call", "fusion") and target:
                callers.setdefault(target.lstrip("%"), (comp.name, ins.metadata.get("op_name", "")))

    def full_prefix(name: str, depth: int = 0) -> str:
        if name in prefix:
            return prefix[name]
        caller = callers.get(name)
        if caller is None or depth > 50:
            value = ""
        else:
            outer = full_prefix(caller[0], depth + 1)
            value = "/".join(p for p in (outer, caller[1]) if p)
        prefix[name] = value
        return value

    names: dict[str, str] = {}
    for comp in computations.values():
        outer = full_prefix(comp.name)
        for ins in comp.instructions:
            own = ins.metadata.get("op_name", "")
            full = own if not outer or own.startswith(outer) else "/".join(p for p in (outer, own) if p)
            names.setdefault(ins.name, full)
    return names


def _hlo_name(op: Op, known: dict[str, str]) -> str | None:
    """The HLO instruction an IR op came from (its name, without ``@call`` or ``.role`` suffixes)."""
    name = op.name.split("@")[0]
    while name and name not in known:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name or None


def place_phases(graph: Graph, op_names: dict[str, str]) -> None:
    """Set every op's layer to ``model/<phase>/<scope>``: ``forward`` for everything the loss (the
    first output) depends on, else by :func:`_phase` of its HLO op_name; ops without metadata take
    their first user's phase; parameters stay at ``model``."""
    forward: set[int] = set()
    stack = [graph.outputs[0]]
    while stack:
        op = stack.pop()
        if op.index not in forward:
            forward.add(op.index)
            stack.extend(op.operands)
    phases: dict[int, str] = {}
    for op in graph.ops:
        if op.index in forward:
            phases[op.index] = "forward"
            continue
        hlo = _hlo_name(op, op_names)
        phase = _phase(op_names.get(hlo, "")) if hlo else None
        if phase is not None:
            phases[op.index] = phase
    users = graph.users()
    for op in reversed(graph.ops):
        if op.index not in phases:
            phases[op.index] = next((phases[u.index] for u in users[op.index] if u.index in phases),
                                    "optimizer")
    for op in graph.ops:
        if op.opcode == "parameter":
            op.layer = "model"
            continue
        scope = op.layer.split("/", 1)[1] if "/" in op.layer else ""
        op.layer = f"model/{phases[op.index]}" + (f"/{scope}" if scope else "")


class JaxTrainStep:
    """A compiled JAX training step: call it with a batch; it returns the loss (a JAX scalar)."""

    def __init__(self, loss_fn: Callable[..., Any], params: Any, optimizer: Any,
                 example_batch: Sequence[Any], *, precision: Precision, instance: str | None,
                 core: int, options: CompilerOptions | None = None) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.params = params
        self.opt_state = optimizer.init(params)
        self.steps = 0
        self.last_result: ExecutionResult | None = None
        self.name = getattr(loss_fn, "__name__", "loss_fn")

        def update(params: Any, opt_state: Any, *batch: Any) -> tuple[Any, Any, Any]:
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            import optax  # the caller uses optax already: its optimizer is an optax transformation

            return loss, optax.apply_updates(params, updates), opt_state

        update.__name__ = update.__qualname__ = f"{self.name}_train_step"  # the program's name
        state_leaves, self._state_tree = jax.tree_util.tree_flatten((params, self.opt_state))
        self.n_state = len(state_leaves)
        self.instance = Instance(instance)
        self.core = self.instance.core(core)
        self.memory = self._check_memory(state_leaves)
        examples = (params, self.opt_state, *example_batch)
        autocast = "bf16" if precision is Precision.BF16 else None
        converted = jax_frontend.convert(update, examples, autocast=autocast)
        place_phases(converted.graph, _op_names(jax_frontend.lower(update, examples)))
        self.converted = converted
        self.program: Program = compile_graph(converted.graph, self.core.spec, options)
        self.loaded = self.core.load(self.program)
        names = [p.name for p in converted.graph.parameters]
        self.input_names = names
        self.state = DeviceState(self.core, {
            name: np.asarray(leaf, np.float32) for name, leaf in zip(names, state_leaves)})
        self.batch_shapes = [np.shape(b) for b in jax.tree_util.tree_leaves(tuple(example_batch))]

    def _check_memory(self, leaves: list[Any]) -> MemoryBreakdown:
        """Weights, gradients (one per weight, in the step) and optimizer state against free HBM."""
        param_bytes = sum(np.size(x) * np.dtype(x.dtype).itemsize
                          for x in jax.tree_util.tree_leaves(self.params))
        state_bytes = sum(np.size(x) * np.dtype(x.dtype).itemsize for x in leaves) - param_bytes
        need = MemoryBreakdown(weights=int(param_bytes), master_weights=0, gradients=int(param_bytes),
                               optimizer_state=int(state_bytes), activations=0)
        try:
            check_fits(need, hbm_bytes=self.core.spec.hbm_bytes - self.core.hbm_used_bytes,
                       what=f"{self.name} training step",
                       where=f"core {self.core.index} of {self.instance.name}")
        except MemoryCheckError as exc:
            raise TraceError(str(exc)) from None
        return need

    @property
    def graph(self) -> Graph:
        return self.converted.graph

    def __call__(self, *batch: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(tuple(batch))
        shapes = [np.shape(b) for b in leaves]
        if shapes != self.batch_shapes:
            raise TraceError(f"{self.name} step: batch of shapes {shapes} given; traced with "
                             f"{self.batch_shapes}")
        names = self.input_names
        host_start = time.time_ns()
        host = {name: jax_frontend.host_array(leaf) for name, leaf in zip(names[self.n_state:], leaves)}
        result = self.loaded.execute(self.state.inputs(names, host))
        outputs = result.outputs or []
        self.state.update(dict(zip(names[: self.n_state], outputs[1: 1 + self.n_state])))
        self.last_result = result
        self.steps += 1
        shape = np.shape(leaves[0]) if leaves else ()
        integer = bool(leaves) and np.issubdtype(jax_frontend.host_array(leaves[0]).dtype, np.integer)
        emit_step(self.loaded, [result], step=self.steps, global_batch=int(shape[0]) if shape else 1,
                  seq=int(shape[1]) if len(shape) == 2 and integer else 0, name=self.name,
                  bf16=self.precision is not Precision.FP32, host_start_ns=host_start)
        templates = jax.tree_util.tree_leaves((self.params, self.opt_state))
        new = [jax.numpy.asarray(np.asarray(self.state.tensors[n]).astype(np.dtype(t.dtype)))
               .reshape(np.shape(t)) for n, t in zip(names, templates)]
        self.params, self.opt_state = jax.tree_util.tree_unflatten(self._state_tree, new)
        return jax.numpy.asarray(np.asarray(outputs[0], np.float32).reshape(()))


def trace_jax_train_step(loss_fn: Callable[..., Any], params: Any, optimizer: Any,
                         example_batch: Sequence[Any], *, precision: str | Precision = "fp32",
                         instance: str | None = None, core: int = 0,
                         options: CompilerOptions | None = None) -> JaxTrainStep:
    """Compile ``loss_fn(params, *batch)``'s value-and-grad step with an optax ``optimizer``.

    ``precision``: ``"fp32"`` or ``"bf16"`` (auto-cast matmuls to bf16; FP32 parameters and state)."""
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TraceError(f"optimizer must be an optax GradientTransformation, not "
                         f"{type(optimizer).__name__}")
    try:
        prec = parse_precision(precision)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    if prec is Precision.BF16_SR:
        raise TraceError("bf16-sr is supported by PyTorch training steps; a JAX step takes fp32 or bf16")
    check_options(options)
    return JaxTrainStep(loss_fn, params, optimizer, tuple(example_batch), precision=prec,
                        instance=instance, core=core, options=options)


__all__ = ["JaxTrainStep", "place_phases", "trace_jax_train_step"]
