"""Optimizer updates as graph ops, with torch.optim's exact formulas.

    spec = optimizer_spec(torch_optimizer)                 # AdamWSpec / SGDSpec, per param group
    new_param, new_state = emit_update(b, spec, param, grad, state, scalars)

The per-step numbers torch computes on the host from Python floats (``lr``, ``1 - lr * wd``, the bias
corrections ``1 - beta ** step``; torch's default, non-capturable path) are computed on the host
here too and fed to the program as one small FP32 input per group (:func:`host_scalars`), from the
param group's values at each step, so a scheduler changing ``lr`` between steps is honoured without
recompiling, and so are SGD's ``momentum`` and ``dampening`` (OneCycleLR cycles the momentum) and
AdamW's ``weight_decay``. The other hyper-parameters are immediates of the program (Adam's
``betas`` and ``eps``, SGD's weight decay and Nesterov momentum, Adam's L2 weight decay): a change
of one after tracing is refused in one line (:func:`host_scalars`), never silently ignored.
Everything per element runs on the core in the order torch's single-tensor kernels use
(``_single_tensor_adam`` with decoupled weight decay, ``_single_tensor_sgd``), in FP32.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import Op


class OptimizerKind(enum.Enum):
    ADAMW = "adamw"  # decoupled weight decay: AdamW, and Adam(decoupled_weight_decay=True)
    ADAM = "adam"  # L2 weight decay (added to the gradient)
    SGD = "sgd"


@dataclass(frozen=True)
class OptimizerSpec:
    """One param group's hyper-parameters (the ones fixed at trace time; ``lr`` is read per step)."""

    kind: OptimizerKind
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    maximize: bool = False

    @property
    def state_names(self) -> tuple[str, ...]:
        """Per-parameter state tensors, named as ``optimizer.state_dict()`` names them."""
        if self.kind is OptimizerKind.SGD:
            return ("momentum_buffer",) if self.momentum else ()
        return ("exp_avg", "exp_avg_sq")

    @property
    def scalar_names(self) -> tuple[str, ...]:
        """The host-computed scalars of one step, in the order of :func:`host_scalars`."""
        if self.kind is OptimizerKind.SGD:
            return ("lr", "buf_keep", "grad_in") if self.momentum else ("lr",)
        return ("decay", "step_size", "bias_correction2_sqrt")


class OptimizerError(ValueError):
    """An optimizer (or an option of one) the training step cannot run."""


def optimizer_spec(optimizer: object, group: Mapping[str, object]) -> OptimizerSpec:
    """The spec of one param group of a ``torch.optim`` AdamW, Adam or SGD optimizer."""
    return _spec(type(optimizer).__name__, group)


def _spec(name: str, group: Mapping[str, object]) -> OptimizerSpec:
    if group.get("amsgrad"):
        raise OptimizerError(f"{name}(amsgrad=True) is not supported by the training step")
    if group.get("differentiable"):
        raise OptimizerError(f"{name}(differentiable=True) is not supported by the training step")
    maximize = bool(group.get("maximize", False))
    wd = float(group.get("weight_decay", 0.0) or 0.0)  # type: ignore[arg-type]
    if name in ("AdamW", "Adam"):
        # Adam's weight_decay is L2 (added to the gradient), unless decoupled as AdamW's
        decoupled = name == "AdamW" or bool(group.get("decoupled_weight_decay", False))
        betas = group["betas"]
        assert isinstance(betas, (tuple, list))
        return OptimizerSpec(OptimizerKind.ADAMW if decoupled else OptimizerKind.ADAM,
                             weight_decay=wd, betas=(float(betas[0]), float(betas[1])),
                             eps=float(group["eps"]), maximize=maximize)  # type: ignore[arg-type]
    if name == "SGD":
        return OptimizerSpec(OptimizerKind.SGD, weight_decay=wd,
                             momentum=float(group.get("momentum", 0.0) or 0.0),  # type: ignore[arg-type]
                             dampening=float(group.get("dampening", 0.0) or 0.0),  # type: ignore[arg-type]
                             nesterov=bool(group.get("nesterov", False)), maximize=maximize)
    raise OptimizerError(f"optimizer {name} is not supported by the training step "
                         f"(supported: AdamW, Adam, SGD)")


def _fixed(spec: OptimizerSpec) -> dict[str, object]:
    """What a spec's program holds as immediates or in its shape (not fed per step)."""
    fixed: dict[str, object] = {"momentum on": bool(spec.momentum), "nesterov": spec.nesterov,
                                "maximize": spec.maximize, "weight_decay on": bool(spec.weight_decay)}
    if spec.kind is OptimizerKind.SGD:
        fixed["weight_decay"] = spec.weight_decay
        if spec.nesterov:
            fixed["momentum"] = spec.momentum
    else:
        fixed.update(betas=spec.betas, eps=spec.eps)
        if spec.kind is OptimizerKind.ADAM:
            fixed["weight_decay"] = spec.weight_decay
    return fixed


def host_scalars(spec: OptimizerSpec, group: Mapping[str, object], step: int) -> np.ndarray:
    """The group's per-step scalars (``step`` counts from 1), as torch computes them in Python
    from the param group's current values. A hyper-parameter the program holds as an immediate
    that differs from its traced value is one :class:`OptimizerError` (see the module doc)."""
    name = {OptimizerKind.SGD: "SGD", OptimizerKind.ADAM: "Adam"}.get(spec.kind, "AdamW")
    now = _spec(name, group)
    was, new = _fixed(spec), _fixed(now)
    changed = next((k for k in was if was[k] != new.get(k)), None)
    if changed is not None:
        key = changed.removesuffix(" on")
        raise OptimizerError(
            f"{name} {key} changed from {getattr(spec, key)} to {getattr(now, key)} after the "
            f"training step was traced (a scheduler's cycle_momentum?); the step's program holds "
            f"it fixed (lr, SGD's momentum and dampening and AdamW's weight_decay may change): "
            f"keep it as traced, e.g. OneCycleLR(..., cycle_momentum=False)")
    lr = float(group["lr"])  # type: ignore[arg-type]
    if spec.kind is OptimizerKind.SGD:
        if not spec.momentum:
            return np.array([lr], np.float32)
        first = step == 1  # torch clones the gradient into a fresh buffer on the first step
        keep, take = (0.0, 1.0) if first else (now.momentum, 1.0 - now.dampening)
        return np.array([lr, keep, take], np.float32)
    beta1, beta2 = spec.betas
    decay = 1.0 - lr * now.weight_decay if spec.kind is OptimizerKind.ADAMW else 1.0
    step_size = lr / (1.0 - beta1 ** step)
    return np.array([decay, step_size, math.sqrt(1.0 - beta2 ** step)], np.float32)


def split_scalars(b: GraphBuilder, spec: OptimizerSpec, scalars: Op) -> list[Op]:
    """The group's scalar vector (one program input) as one [1] tensor per scalar, made once per
    group and broadcast to each parameter."""
    return [b.slice(scalars, [i], [i + 1], [1]) for i in range(len(spec.scalar_names))]


def _per_row(b: GraphBuilder, scalar: Op, shape: tuple[int, ...]) -> Op:
    """A per-step scalar ([1]) as an operand of ``shape``: for a tensor of two or more dims, one
    value per row broadcast along the last dim, which the compiler reads as a per-partition scalar
    operand (``TENSOR_SCALAR``) instead of a materialised tile of the tensor's size."""
    if len(shape) < 2:
        return b.broadcast_to(scalar, shape)
    rows = b.broadcast(scalar, shape[:-1], (0,))
    return b.broadcast(rows, shape, tuple(range(len(shape) - 1)))


def emit_update(b: GraphBuilder, spec: OptimizerSpec, param: Op, grad: Op, state: Sequence[Op],
                s: Sequence[Op], rounding: DType | None = None) -> tuple[Op, list[Op]]:
    """The updated parameter and state (FP32 ops), as torch.optim's single-tensor kernels compute;
    ``s`` are the group's scalars from :func:`split_scalars`.

    ``rounding`` (BF16 or FP16): the parameters and state are tensors of that type (a model loaded
    or cast to bf16, trained without FP32 master weights), and every in-place op of torch's kernel
    writes a value of that type: each such result is rounded to it (round to nearest even) and
    computed on from there, as torch's CPU kernels compute each op in FP32 and store it narrow
    (AdamW: the decay, ``lerp_``, ``mul_``, ``addcmul_``, ``sqrt``, the division, ``add_(eps)``,
    ``addcdiv_``). The ``alpha`` of an ``add`` (SGD's ``param.add_(grad, alpha=-lr)``, the weight
    decay and Nesterov terms, Adam's L2 term) is itself rounded to the type first, as torch's CPU
    ``add`` kernel converts it to the tensors' type (``mul_``'s, ``lerp_``'s, ``addcmul_``'s and
    ``addcdiv_``'s scalars stay FP32 there). The operands and results stay FP32 ops; the caller
    stores them narrow."""
    def rnd(x: Op) -> Op:
        return x if rounding is None else b.convert(b.convert(x, rounding), DType.FP32)

    def alpha(x: float) -> float:
        return x if rounding is None else float(np.asarray(x, np.float32).astype(rounding.numpy))

    if spec.maximize:
        grad = b.negate(grad)
    if spec.kind is OptimizerKind.SGD:
        if spec.weight_decay:
            grad = rnd(b.add(grad, b.multiply(param, alpha(spec.weight_decay))))
        new_state: list[Op] = []
        if spec.momentum:
            lr, keep, take = s
            kept = rnd(b.multiply(state[0], _per_row(b, keep, param.shape)))  # buf.mul_(momentum)
            buf = rnd(b.add(kept, b.multiply(grad, _per_row(b, rnd(take), param.shape))))  # .add_(grad)
            new_state = [buf]
            grad = rnd(b.add(grad, b.multiply(buf, alpha(spec.momentum)))) if spec.nesterov else buf
        else:
            (lr,) = s
        step = b.multiply(grad, _per_row(b, rnd(lr), param.shape))
        return rnd(b.subtract(param, step)), new_state
    decay, step_size, bc2_sqrt = (_per_row(b, x, param.shape) for x in s)
    beta1, beta2 = spec.betas
    if spec.kind is OptimizerKind.ADAMW and spec.weight_decay:
        param = rnd(b.multiply(param, decay))
    elif spec.weight_decay:  # Adam: L2, the decay term added to the gradient
        grad = rnd(b.add(grad, b.multiply(param, alpha(spec.weight_decay))))
    exp_avg, exp_avg_sq = state
    exp_avg = rnd(b.add(exp_avg, b.multiply(b.subtract(grad, exp_avg), 1.0 - beta1)))  # lerp, w < 0.5
    exp_avg_sq = rnd(b.multiply(exp_avg_sq, beta2))
    exp_avg_sq = rnd(b.add(exp_avg_sq, b.multiply(b.multiply(grad, 1.0 - beta2), grad)))
    denom = rnd(b.add(rnd(b.divide(rnd(b.sqrt(exp_avg_sq)), bc2_sqrt)), spec.eps))
    if rounding is None:
        update = b.divide(b.multiply(exp_avg, step_size), denom)
    else:  # addcdiv_(exp_avg, denom, value=-step_size): the quotient first, as torch's kernel
        update = b.multiply(b.divide(exp_avg, denom), step_size)
    return rnd(b.subtract(param, update)), [exp_avg, exp_avg_sq]


__all__ = ["OptimizerError", "OptimizerKind", "OptimizerSpec", "emit_update", "host_scalars",
           "optimizer_spec", "split_scalars"]
