"""The joint forward + backward graph of a PyTorch loss, through torch's own autograd.

    joint = joint_graph(module, example_inputs)      # JointGraph: an FX graph of core ATen ops

Two steps, both torch's: ``torch.export`` captures the module's forward (training IR, with every
node's ``nn_module_stack`` and user stack trace), then ``make_fx`` traces a function that replays
that graph with ``torch.fx.Interpreter`` (so each node's metadata is current while it runs:
``preserve_node_meta``) and calls ``torch.autograd.grad`` on the loss. Autograd's backward formulas
run under the tracer and torch's core-ATen decomposition table turns their ``*_backward`` ops
(``native_layer_norm_backward``, ``threshold_backward``, ``embedding_dense_backward``,
``_softmax_backward_data``, ``convolution_backward`` ...) into core ops the frontend lowers already.

The result has one placeholder per trainable parameter (in ``named_parameters`` order), then one per
user input; its outputs are the loss and one gradient per parameter. Nodes keep their phase in
``node.meta["train_phase"]`` (``forward`` for what the replay made, ``backward`` for what autograd
made) and backward nodes borrow the layer path and source frames of the forward nodes they read, so
a profile's hierarchy holds layer -> HLO op -> instruction inside each phase.

Activation checkpointing (``torch.utils.checkpoint``, ``gradient_checkpointing_enable()``):
``torch.export`` traces through a checkpoint as if it were not there, so while exporting every
checkpointed call is marked (:func:`checkpoint_regions`: its nodes carry ``custom["checkpoint_region"]``)
and the joint graph then recomputes each region's values in the backward, right before their
first backward reader, instead of keeping them from the forward (:func:`_recompute_checkpoints`),
as the checkpoint does in eager PyTorch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
import torch.fx.traceback as fx_traceback
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch._decomp import core_aten_decompositions
from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from neuroncore.frontends.torch_composites import COMPOSITES
from neuroncore.frontends.torch_conv import nearest_positions
from neuroncore.frontends.torch_frontend import export_failure, quiet_export
from neuroncore.frontends.torch_moe import all_experts
from neuroncore.frontends.tracing import TraceError

FORWARD, BACKWARD = "forward", "backward"
CHECKPOINT_REGION = "checkpoint_region"
"""Key in a node's ``meta["custom"]``: the number of the checkpointed call it was traced in."""
RECOMPUTE_OF = "recompute_of"
"""Key in the meta of a backward node that recomputes a checkpointed forward value: that node's name."""


class CheckpointingIgnored(UserWarning):
    """A form of activation checkpointing a traced step does not follow: a selective policy
    (``context_fn``); the region is recomputed whole."""


@dataclass
class JointGraph:
    """An FX graph computing ``(loss, grad_1, ..., grad_P)`` from ``(param_1..P, buffers, inputs)``."""

    module: torch.fx.GraphModule
    param_names: list[str]  # qualified names of the trainable parameters, in placeholder order
    buffer_names: list[str]  # buffers and constants the forward reads (inputs after the params)
    buffers: list[torch.Tensor]
    n_inputs: int  # user inputs (after the buffers)
    constants: frozenset[str] = frozenset()  # buffer names that are lifted constants (never updated)


class LossModule(torch.nn.Module):
    """``loss_fn(model(*inputs[:-1]), inputs[-1])`` when a loss function is given, else the model's
    own output (a tensor, or the ``loss`` of a Hugging Face ``ModelOutput``, or its first element).

    With ``keys`` the inputs are keyword inputs, in that order: the model is called
    ``model(**dict(zip(keys, inputs)))`` (the last entry goes to ``loss_fn`` instead, when given),
    as users call transformers models (``model(input_ids=..., attention_mask=..., labels=...)``)."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., Any] | None, scale: float,
                 keys: Sequence[str] = ()) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.scale = scale
        self.keys = tuple(keys)

    def _model(self, inputs: Sequence[Any]) -> Any:
        if self.keys:
            return self.model(**dict(zip(self.keys, inputs)))
        return self.model(*inputs)

    def forward(self, *inputs: Any) -> torch.Tensor:
        if self.loss_fn is not None:
            out = self._model(inputs[:-1])
            loss = self.loss_fn(out, inputs[-1])  # LOSS_FN_CALL: how its ops' traces are known
        else:
            out = self._model(inputs)
            loss = _loss_of(out)
        return loss * self.scale if self.scale != 1.0 else loss


LOSS_FN_CALL = "loss = self.loss_fn(out, inputs[-1])"
"""The source line of :meth:`LossModule.forward` that calls the user's ``loss_fn``: an FX stack
trace holding it, and no user frame, is an op of ``loss_fn`` (torch records no frame inside it)."""


def _weight_norm_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                          saved_norms: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_weight_norm_interface_backward`` (the gradient of ``w = g * v / ||v||``, the norm over
    every dim but ``dim``; ``torch.nn.utils.weight_norm`` and its parametrization, wav2vec2's
    positional convolution) as ATen's ``_weight_norm_differentiable_backward`` computes it, in
    core ops: ``grad_g = sum(grad_w * v) / ||v||`` and ``grad_v = g / ||v|| * (grad_w - v *
    sum(grad_w * v) / ||v||^2)``. Autograd records the fused op's own backward, which torch's
    decomposition table does not cover (refused before, listed with its layer)."""
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    per_dir = torch.sum(grad_w * saved_v, dim=dims, keepdim=True)
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (per_dir / (saved_norms * saved_norms)))
    return grad_v, per_dir / saved_norms


def _taken_backward(grad: torch.Tensor, size: Sequence[int],
                    taken: Sequence[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """The gradient of a forward that read ``x`` (of ``size``) at constant positions along some
    dims, one ``(dim, positions)`` after the other (``frontends.flip.take_constant``: replication
    padding, nearest resizes): the output gradient added back at those positions, the last dim
    first, one ``index_add`` per dim (positions read twice, a padded border, add up)."""
    shape = list(grad.shape)
    for dim, positions in reversed(taken):
        shape[dim] = size[dim]
        grad = grad.new_zeros(shape).index_add(dim, positions, grad)
    return grad


def _replication_pad_backward(grad_output: torch.Tensor, x: torch.Tensor,
                              padding: Sequence[int]) -> torch.Tensor:
    """``replication_pad{1,2,3}d_backward``: the forward (torch's decomposition) reads each padded
    dim at ``clamp(arange(-left, n + right), 0, n - 1)``."""
    spatial = len(padding) // 2
    taken = []
    for i in range(spatial):
        dim = x.dim() - spatial + i
        left, right = padding[2 * (spatial - 1 - i)], padding[2 * (spatial - 1 - i) + 1]
        reads = torch.arange(-left, x.shape[dim] + right, device=grad_output.device)
        taken.append((dim, torch.clamp(reads, 0, x.shape[dim] - 1)))
    return _taken_backward(grad_output, x.shape, taken)


def _upsample_nearest_backward(exact: bool) -> Callable[..., torch.Tensor]:
    """``upsample_nearest{1,2,3}d_backward`` / ``_upsample_nearest_exact*_backward``: the forward
    reads each spatial dim at torch's nearest positions (``floor((o + 0.5 * exact) * in / out)``,
    torch's own ``_compute_upsample_nearest_indices``)."""

    def backward(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                 *scales: float | None) -> torch.Tensor:
        reads = nearest_positions(input_size, output_size, scales, exact, grad_output.device)
        first = len(input_size) - len(output_size)
        return _taken_backward(grad_output, input_size, [(first + k, r) for k, r in enumerate(reads)])

    return backward


def _avg_pool_backward(grad_output: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                       stride: Sequence[int], padding: Sequence[int], ceil_mode: bool,
                       count_include_pad: bool, divisor_override: int | None) -> torch.Tensor:
    """``avg_pool{2,3}d_backward`` (``nn.AvgPool*``, ``nn.LocalResponseNorm``'s channel window),
    which no decomposition table covers: each output gradient divided by its window's divisor (the
    forward's, ``torch_conv.avg_pool``'s rule) and spread over its window, a transposed convolution
    of the images (channels folded into the batch) with a kernel of ones, then cropped to the input
    (the padding off, and ``ceil_mode``'s windows past the end)."""
    spatial = len(kernel_size)
    kernel = list(kernel_size)
    strides = list(stride) or kernel
    pads = list(padding) if len(padding) == spatial else list(padding) * spatial
    sizes, out = list(x.shape[-spatial:]), list(grad_output.shape[-spatial:])
    divisor = torch.ones((), dtype=grad_output.dtype, device=grad_output.device)
    for k, s, p, n, o in zip(kernel, strides, pads, sizes, out):
        starts = torch.arange(o, device=grad_output.device) * s - p
        ends = torch.clamp(starts + k, max=n + p)
        if not count_include_pad:
            starts, ends = torch.clamp(starts, 0, n), torch.clamp(ends, 0, n)
        divisor = divisor.unsqueeze(-1) * (ends - starts).to(grad_output.dtype)
    if divisor_override:
        divisor = torch.full_like(divisor, float(divisor_override))
    lead = grad_output.shape[:-spatial]
    images = (grad_output / divisor).reshape(-1, 1, *out)
    ones = torch.ones((1, 1, *kernel), dtype=grad_output.dtype, device=grad_output.device)
    transposed = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[spatial - 1]
    full = transposed(images, ones, stride=strides)  # [.., (o - 1) * s + k] per dim, padded coordinates
    pad_after: list[int] = []  # F.pad's order: the last dim first
    for k, s, p, n, o in zip(kernel, strides, pads, sizes, out):
        pad_after = [0, max(0, n + p - ((o - 1) * s + k)), *pad_after]
    full = F.pad(full, pad_after)
    crop = full[(slice(None), slice(None), *(slice(p, p + n) for p, n in zip(pads, sizes)))]
    return crop.reshape(*lead, *sizes)


def _decompositions() -> dict[Any, Callable[..., Any]]:
    """torch's core-ATen decompositions, plus the backward ops of fused kernels it leaves whole."""
    table = dict(core_aten_decompositions())
    aten = torch.ops.aten
    table[aten._weight_norm_interface_backward.default] = _weight_norm_backward
    table[aten.avg_pool2d_backward.default] = _avg_pool_backward
    table[aten.avg_pool3d_backward.default] = _avg_pool_backward
    for op in (aten.replication_pad1d_backward, aten.replication_pad2d_backward,
               aten.replication_pad3d_backward):
        table[op.default] = _replication_pad_backward
    for exact, ops in ((False, (aten.upsample_nearest1d_backward, aten.upsample_nearest2d_backward,
                                aten.upsample_nearest3d_backward)),
                       (True, (aten._upsample_nearest_exact1d_backward,
                               aten._upsample_nearest_exact2d_backward,
                               aten._upsample_nearest_exact3d_backward))):
        for op in ops:
            table[op.default] = _upsample_nearest_backward(exact)
    return table


def _no_mkldnn() -> contextlib.AbstractContextManager[Any]:
    """oneDNN off while the joint graph is traced: on a CPU with it on, autograd runs ``nn.LSTM`` as
    the fused ``mkldnn_rnn_layer`` (and its ``_backward``), ops no accelerator has; off, torch
    runs its generic LSTM, each step's gates as matmuls and pointwise ops that autograd
    differentiates (what torch-neuronx traces, as XLA has no oneDNN)."""
    return torch.backends.mkldnn.flags(enabled=False)


def _loss_of(out: Any) -> torch.Tensor:
    """The loss a model returned: a 0-d tensor, ``out.loss``, or the first element of a tuple."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, (tuple, list)) and out:
        loss = out[0]
    if loss is None and isinstance(out, torch.Tensor):
        loss = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TraceError("the model's forward must return the loss (a tensor with one element, "
                         "or an output with .loss: pass labels), or pass loss_fn=")
    return loss


def distinct_inputs(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``inputs`` with every tensor that shares memory with an earlier one replaced by a copy.

    Why: the causal-LM call ``{"input_ids": ids, "labels": ids}`` passes one tensor twice, and
    both ``torch.export`` and ``make_fx`` key their placeholders on the tensor object, so the two
    inputs become ONE placeholder and the second is silently dropped from the graph: a later call
    with distinct labels (``-100`` padding) then feeds the labels where the ids were read (an
    out-of-range gather) or trains on the wrong targets. A copy gives each input its own
    placeholder; its values are the same, so the trace is unchanged otherwise."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        ptr = x.untyped_storage().data_ptr() if x.numel() else 0
        key = ptr or id(x)
        out.append(x.detach().clone() if key in seen else x)
        seen.add(key)
    return out


def check_step_inputs(model: torch.nn.Module, n_inputs: int, loss_fn: Callable[..., Any] | None,
                      keys: Sequence[str] = ()) -> None:
    """One line when a step's example inputs cannot be split as :class:`LossModule` splits them: a
    ``loss_fn`` with no target after the model's inputs, or model inputs the model's ``forward``
    does not take (torch's own error named the wrapper's argument, ``forward() missing 1 required
    positional argument: 'input'``, without saying the last input goes to ``loss_fn``)."""
    name = type(model).__name__
    if loss_fn is not None and n_inputs < 2:
        what = f"the last entry ({keys[-1]!r})" if keys else "the last example input"
        raise TraceError(f"{name}: with loss_fn, {what} is the target (loss_fn(model(*inputs[:-1]), "
                         f"inputs[-1])), so the step needs the model's inputs and then the target; "
                         f"got {n_inputs} input")
    model_inputs = list(keys[:n_inputs - 1] if loss_fn is not None else keys) if keys else None
    n_model = n_inputs - 1 if loss_fn is not None else n_inputs
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # no Python signature to check against
        return
    try:
        if model_inputs is not None:
            signature.bind(**dict.fromkeys(model_inputs))
        else:
            signature.bind(*([None] * n_model))
    except TypeError as exc:
        role = ("the last one is loss_fn's target" if loss_fn is not None else
                "without loss_fn every input goes to the model, whose forward must return the loss; "
                "pass loss_fn= to make the last input the target")
        given = f"keywords {model_inputs}" if model_inputs is not None else f"{n_model} positional input(s)"
        raise TraceError(f"{name}.forward cannot take the step's {given} ({exc}): {role}") from None


def export_loss(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *,
                loss_fn: Callable[..., Any] | None = None, loss_scale: float = 1.0,
                input_keys: Sequence[str] = (),
                ) -> tuple[LossModule, torch.export.ExportedProgram, dict[str, str]]:
    """``torch.export`` of the loss (training IR, every node with its ``nn_module_stack``), and
    each parameter name's canonical name: a tied weight (GPT-2's lm_head is its token embedding)
    is one parameter under two names, both uses read one placeholder, and its gradient sums over
    both, as autograd's does. ``input_keys``: the keyword each example input is passed to the
    model by (:class:`LossModule`); empty: positionally."""
    check_step_inputs(model, len(example_inputs), loss_fn, input_keys)
    wrapper = LossModule(model, loss_fn, loss_scale, input_keys)
    example_inputs = distinct_inputs(example_inputs)
    try:
        # all_experts: a transformers MoE layer's default grouped_mm plan (sort, histc, grouped
        # GEMM over data-dependent sizes) has no static shape; it trains as NxD's forward_all_experts
        # (every token through every expert, scaled by its top-k masked affinity: same values and
        # gradients), as inference compiles it (frontends/torch_moe.py)
        with quiet_export(), warnings.catch_warnings(), all_experts(model), \
                checkpoint_regions() as selective:
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|copyreg)")
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch")
            ep = torch.export.export(wrapper, tuple(example_inputs))
    except TraceError:
        raise
    except Exception as exc:  # torch raises many types; every one is a failed trace
        raise export_failure(type(model).__name__, exc) from exc
    if selective[0]:
        warnings.warn(f"{type(model).__name__}: {selective[0]} checkpointed call(s) with a selective policy "
                      f"(context_fn): a traced step does not follow it, it recomputes each such region "
                      f"whole", CheckpointingIgnored, stacklevel=2)
    if selective[1]:
        warnings.warn(f"{type(model).__name__}: activations offloaded to host memory (save_on_cpu, "
                      f"activation_checkpointing_enable(offload=True)) stay in the core's HBM in a "
                      f"traced step, and no copies are timed", CheckpointingIgnored, stacklevel=2)
    canonical = {id(p): n for n, p in wrapper.named_parameters()}
    alias = {n: canonical[id(p)] for n, p in wrapper.named_parameters(remove_duplicate=False)}
    return wrapper, ep, alias


def joint_graph(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *,
                loss_fn: Callable[..., Any] | None = None, loss_scale: float = 1.0,
                input_grads: Sequence[int] = (), input_keys: Sequence[str] = ()) -> JointGraph:
    """Trace the loss and the gradients of every parameter that requires grad (see module doc).

    ``input_grads``: user inputs whose gradients are outputs too, after the parameters'.
    ``input_keys``: the keyword each example input is passed to the model by (:class:`LossModule`);
    empty: positionally."""
    example_inputs = distinct_inputs(example_inputs)  # one placeholder per input, in both traces
    wrapper, ep, alias = export_loss(model, example_inputs, loss_fn=loss_fn, loss_scale=loss_scale,
                                     input_keys=input_keys)
    name = type(model).__name__
    sig = ep.graph_signature
    named = dict(wrapper.named_parameters())
    tables = {**ep.state_dict, **ep.constants}
    params: list[str] = []
    others: list[str] = []
    positions: list[tuple[str, int]] = []  # (kind, index) per graph input, in graph order
    constants: set[str] = set()  # tensors the forward creates from literals (``x[..., [-2], :]``)
    n_user = 0
    for spec in sig.input_specs:
        target = alias.get(spec.target or "", spec.target or "")
        if spec.kind is InputKind.PARAMETER and target in params:
            positions.append(("param", params.index(target)))
        elif spec.kind is InputKind.PARAMETER and named.get(target) is not None \
                and named[target].requires_grad:
            positions.append(("param", len(params)))
            params.append(target)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            positions.append(("buffer", len(others)))
            others.append(target)
            if spec.kind is InputKind.CONSTANT_TENSOR:
                constants.add(target)
        elif spec.kind is InputKind.USER_INPUT:
            positions.append(("input", n_user))
            n_user += 1
        else:
            raise TraceError(f"{name}: inputs of kind {spec.kind.name} are not supported in a "
                             f"training step")
    mutated = [s for s in sig.output_specs if s.kind is not OutputKind.USER_OUTPUT]
    if mutated:
        kinds = ", ".join(sorted({s.kind.name.lower() for s in mutated}))
        raise TraceError(f"{name}: the forward mutates state ({kinds}: e.g. BatchNorm running "
                         f"statistics in train mode); a training step cannot carry it yet: use "
                         f"eval-mode normalisation or LayerNorm/GroupNorm")
    if not params:
        raise TraceError(f"{name} has no parameters that require grad: nothing to train")
    buffers = [tables[t].detach().clone() for t in others]
    gm = ep.graph_module
    _static_one_hot(gm)
    _replay_composites(gm)
    if _mutated_intermediates(gm):  # T5's labels shifted into decoder ids: see _functional_forward
        examples_in_order = [named[params[i]].detach() if kind == "param" else
                             buffers[i] if kind == "buffer" else example_inputs[i]
                             for kind, i in positions]
        gm = _functional_forward(name, gm, examples_in_order)

    def joint(param_values: list[torch.Tensor], buffer_values: list[torch.Tensor],
              *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args: list[torch.Tensor] = []
        for kind, index in positions:
            args.append(param_values[index] if kind == "param" else
                        buffer_values[index] if kind == "buffer" else inputs[index])
        with fx_traceback.preserve_node_meta():
            outs = torch.fx.Interpreter(gm).run(*args)
        loss = outs[0] if isinstance(outs, (tuple, list)) else outs
        wrt = [*param_values, *(inputs[i] for i in input_grads)]
        grads = _grads(loss, wrt)
        return (loss, *[g if g is not None else torch.zeros_like(p) for g, p in zip(grads, wrt)])

    values = [named[p].detach().clone().requires_grad_(True) for p in params]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch")
            # attention and RNNs as ops autograd differentiates
            with sdpa_kernel([SDPBackend.MATH]), _no_mkldnn():
                examples = [x.detach().clone().requires_grad_(True) if i in input_grads else x
                            for i, x in enumerate(example_inputs)]
                traced = make_fx(joint, decomposition_table=_decompositions())(
                    values, [b.clone() for b in buffers], *examples)  # tracing runs the
                # forward for real: BatchNorm's running statistics must not move in the model's
                # buffers, nor in the values the step starts from
    except Exception as exc:  # any tracer failure is a failed trace
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise TraceError(f"{name}: tracing the backward pass failed: {first}") from exc
    _drop_pool_indices(traced)
    _functional_copies(traced)
    _stack_select_gradients(traced)
    _tag_phases(traced.graph, params)
    _recompute_checkpoints(traced)
    return JointGraph(traced, params, others, buffers, len(example_inputs), frozenset(constants))


def _one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``F.one_hot(labels, num_classes)`` without its range check: the labels compared with
    ``arange(num_classes)``, as ``jax.nn.one_hot`` computes it."""
    classes = torch.arange(num_classes, device=labels.device)
    return (labels.unsqueeze(-1) == classes).to(torch.int64)


def _static_one_hot(gm: torch.fx.GraphModule) -> None:
    """``aten.one_hot`` with a given ``num_classes`` replayed as :func:`_one_hot`. Its ATen kernel
    checks the labels' range with ``.item()`` (``_local_scalar_dense``), which ``make_fx`` cannot
    trace: a ``loss_fn`` building one-hot targets (``F.mse_loss(out, F.one_hot(y, 10).float())``)
    stopped with "tracing the backward pass failed". Out-of-range labels give an all-zero row
    instead of torch's error. ``num_classes=-1`` (the count read from the labels) is left."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.one_hot.default:
            classes = node.args[1] if len(node.args) > 1 else node.kwargs.get("num_classes", -1)
            if isinstance(classes, int) and classes > 0:
                node.target = _one_hot
                node.args, node.kwargs = (node.args[0], classes), {}
                changed = True
    if changed:
        gm.recompile()


def _replay_composites(gm: torch.fx.GraphModule) -> None:
    """Forward nodes of ops in ``torch_composites.COMPOSITES`` (``nn.EmbeddingBag``) replayed as
    their compositions of core ops, so autograd differentiates those (the ops' own ``*_backward``
    kernels have no decomposition); the inference path decomposes them with the same functions."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in COMPOSITES:
            node.target = COMPOSITES[node.target]
            changed = True
    if changed:
        gm.recompile()


def _grads(loss: torch.Tensor, wrt: Sequence[torch.Tensor]) -> Sequence[torch.Tensor | None]:
    """``torch.autograd.grad(loss, wrt)`` with every op autograd runs marked, as AOTAutograd marks
    them, with the sequence number of the forward op whose backward formula it belongs to
    (``node.meta["seq_nr"]``, the same number the forward op's node carries): :func:`_tag_phases`
    files each backward op under the layer of that forward op. A weight gradient is then the
    layer owning the weight, not whatever module last touched the gradient it reads (GPT-2's
    ``c_proj`` gradients read the dropout-masked gradient of ``resid_dropout``)."""
    if loss.grad_fn is not None:
        setup_stacktrace_preservation_hooks([loss.grad_fn])
    with fx_traceback.preserve_node_meta():
        return torch.autograd.grad(loss, wrt, allow_unused=True)


_METADATA_ONLY = {torch.ops.aten.detach_.default}  # in place, but no value changes (KV caches)


def _mutated_intermediates(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """In-place ops of the exported forward whose target is a value computed in the forward (a
    view of a fresh tensor, or the tensor itself) rather than an input. torch.export's training IR
    keeps them in place (``copy_(slice(full), labels[:, :-1])`` in T5's ``_shift_right``); replayed
    as they are, later readers of the tensor would not see the update (the converter reads each
    node's value once), and trace-time folding would take the tensor for the constant it started
    as: T5 trained on all-zero decoder ids, silently."""
    found = []
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable or not node.args \
                or node.target in _METADATA_ONLY:
            continue
        target = node.args[0]
        if isinstance(target, torch.fx.Node) and target.op != "placeholder":
            found.append(node)
    return found


def _functional_forward(name: str, gm: torch.fx.GraphModule,
                        examples: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """The forward retraced through functionalization: every in-place update of a forward value
    becomes the out-of-place op that produces the updated tensor (``slice_scatter``,
    ``select_scatter``, ``masked_fill``), and its readers read that, as ``run_decompositions``
    does for inference. Nodes keep their module stacks and source lines (``preserve_node_meta``).
    Only graphs that mutate forward values are retraced, so every other step is traced as before."""

    def forward(*args: torch.Tensor) -> Any:
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch")
            with sdpa_kernel([SDPBackend.MATH]):
                functional = torch.func.functionalize(forward, remove="mutations")
                return make_fx(functional)(*[x.detach() for x in examples])
    except Exception as exc:  # any tracer failure is a failed trace
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise TraceError(f"{name}: functionalizing the forward's in-place updates failed: {first}") from exc


def stage_joint_graph(name: str, module: torch.fx.GraphModule, params: Sequence[tuple[str, torch.Tensor]],
                      buffers: Sequence[tuple[str, torch.Tensor]], example_inputs: Sequence[torch.Tensor], *,
                      input_grads: Sequence[int], output_grads: Sequence[int] | None) -> JointGraph:
    """The joint graph of one pipeline stage: ``module`` (a part of an exported loss graph, whose
    placeholders are its parameters, buffers and inputs) replayed like :func:`joint_graph` replays
    a whole one, so every op keeps its layer and source line.

    ``output_grads`` None: the stage's output is the loss, and the outputs are ``(loss, param grads,
    input grads)``. Otherwise the stage's outputs are what it sends on, ``output_grads`` lists those
    whose gradient comes back, and the joint graph takes those gradients as extra inputs (after
    ``example_inputs``) and returns ``(sum(out * grad), param grads, input grads, *outputs)``: the
    vector-Jacobian products the stage sends back, then the forward's outputs."""
    example_inputs = distinct_inputs(example_inputs)  # one placeholder per input (see there)
    mutated = _mutated_intermediates(module)
    if mutated:  # replayed as they are, the stage would train on stale values (see there)
        raise TraceError(f"{name}: the forward updates its own values in place ({mutated[0].name}, e.g. "
                         f"T5's labels shifted into decoder ids); pipeline stages do not carry that "
                         f"yet: train it on one core, with data or tensor parallelism")

    def joint(param_values: list[torch.Tensor], buffer_values: list[torch.Tensor],
              *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = inputs[:len(example_inputs)]
        with fx_traceback.preserve_node_meta():
            outs = torch.fx.Interpreter(module).run(*param_values, *buffer_values, *given)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        if output_grads is None:
            loss, sent = outs[0], ()
        else:
            sent = outs
            back = inputs[len(example_inputs):]
            loss = sum(((outs[i] * g).sum() for i, g in zip(output_grads, back)),
                       torch.zeros((), dtype=torch.float32))
        wrt = [*param_values, *(given[i] for i in input_grads)]
        grads = _grads(loss, wrt) if loss.requires_grad else [None] * len(wrt)
        return (loss, *[g if g is not None else torch.zeros_like(p) for g, p in zip(grads, wrt)],
                *sent)

    values = [p.detach().clone().requires_grad_(True) for _, p in params]
    examples = [x.detach().clone().requires_grad_(True) if i in input_grads else x
                for i, x in enumerate(example_inputs)]
    if output_grads is not None:
        with torch.no_grad():
            outs = torch.fx.Interpreter(module).run(*[p for _, p in params], *[b for _, b in buffers],
                                                    *example_inputs)
        examples += [torch.zeros_like(outs[i]) for i in output_grads]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch")
            with sdpa_kernel([SDPBackend.MATH]), _no_mkldnn():
                traced = make_fx(joint, decomposition_table=_decompositions())(
                    values, [b.clone() for _, b in buffers], *examples)
    except Exception as exc:  # any tracer failure is a failed trace
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise TraceError(f"{name}: tracing the backward pass failed: {first}") from exc
    _drop_pool_indices(traced)
    _functional_copies(traced)
    _stack_select_gradients(traced)
    _tag_phases(traced.graph, [n for n, _ in params])  # no _recompute_checkpoints: a stage's backward
    # program replays the stage's forward already (the pipeline checkpoints whole stages)
    return JointGraph(traced, [n for n, _ in params], [n for n, _ in buffers],
                      [b.detach().clone() for _, b in buffers], len(examples))


def saved_activations(joint: JointGraph) -> int:
    """Bytes of the forward values the backward reads (what autograd saves between the passes),
    plus, with activation checkpointing, the largest working set of one recomputed region (the
    recomputed values its backward reads: they exist once, one region at a time, as in Megatron's
    and NxD's arithmetic, ``training.memory``)."""
    total = 0
    working: dict[Any, int] = {}
    for node in joint.module.graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        phase = node.meta.get("train_phase")
        if phase == FORWARD and any(u.meta.get("train_phase") == BACKWARD for u in node.users):
            total += val.numel() * val.element_size()
        elif RECOMPUTE_OF in node.meta and any(RECOMPUTE_OF not in u.meta for u in node.users
                                               if u.op == "call_function"):
            region = checkpoint_region(node)
            working[region] = working.get(region, 0) + val.numel() * val.element_size()
    return total + max(working.values(), default=0)


def checkpoint_region(node: torch.fx.Node) -> int | None:
    """The checkpointed call a node was traced in (:func:`checkpoint_regions`), or None."""
    custom = node.meta.get("custom")
    region = custom.get(CHECKPOINT_REGION) if isinstance(custom, dict) else None
    return region if isinstance(region, int) else None


@contextlib.contextmanager
def checkpoint_regions() -> Iterator[list[int]]:
    """While exporting: every ``torch.utils.checkpoint.checkpoint`` call (non-reentrant, the
    transformers and torch default, and reentrant) traces its function with the nodes it makes
    marked ``meta["custom"]["checkpoint_region"] = k``, one ``k`` per call (a checkpoint inside a
    checkpoint belongs to the outer one: the outer recompute reruns it).

    How: ``checkpoint`` looks up ``_checkpoint_without_reentrant_generator`` (its set-up and
    tear-down around the function) and ``CheckpointFunction`` in its module at every call; both
    are wrapped here for the export only, and the function runs under ``fx.traceback.annotate``
    (with ``preserve_node_meta``, which makes the tracer copy ``custom`` onto the nodes). Under
    export the checkpoint's own machinery does nothing the graph keeps (the saved-tensor hooks see
    fake tensors), so this is what tells the joint graph where its regions are. A reentrant
    checkpoint runs its function directly (its autograd.Function's no-grad forward cannot be
    exported); when none of its tensor inputs requires grad, eager PyTorch gives the parameters
    inside no gradient, and so does this (the function runs without grad). A selective policy
    (``context_fn``) is not followed: the region is recomputed whole; nor is offloading saved
    activations to the host (``torch.autograd.graph.save_on_cpu``, transformers'
    ``offload=True``): its copies are not traced, they stay in HBM. The list yielded counts such
    calls and offloads (the caller warns once for each)."""
    counter = itertools.count()
    depth = [0]
    selective = [0, 0]
    offload = torch.autograd.graph.save_on_cpu
    offload_init = offload.__init__

    def offloading(self: Any, *args: Any, **kwargs: Any) -> None:  # saved tensors stay where they are
        selective[1] += 1
        torch.autograd.graph.saved_tensors_hooks.__init__(self, _same, _same)

    generator = torch_checkpoint._checkpoint_without_reentrant_generator
    function_class = torch_checkpoint.CheckpointFunction

    @contextlib.contextmanager
    def region() -> Iterator[None]:
        if depth[0]:
            yield
            return
        depth[0] += 1
        try:
            with fx_traceback.preserve_node_meta(), \
                    fx_traceback.annotate({CHECKPOINT_REGION: next(counter)}):
                yield
        finally:
            depth[0] -= 1

    def without_reentrant(fn: Any, preserve: Any, context_fn: Any, *rest: Any, **kwargs: Any) -> Any:
        if context_fn is not torch_checkpoint.noop_context_fn:
            selective[0] += 1
        inner = generator(fn, preserve, context_fn, *rest, **kwargs)
        next(inner)
        with region():
            yield
        next(inner, None)

    class Reentrant:
        @staticmethod
        def apply(fn: Callable[..., Any], preserve: bool, *args: Any) -> Any:
            grads = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            with region(), torch.set_grad_enabled(grads and torch.is_grad_enabled()):
                return fn(*args)

    torch_checkpoint._checkpoint_without_reentrant_generator = without_reentrant  # type: ignore[assignment]
    torch_checkpoint.CheckpointFunction = Reentrant  # type: ignore[assignment,misc]
    offload.__init__ = offloading  # type: ignore[method-assign]
    try:
        yield selective
    finally:
        offload.__init__ = offload_init  # type: ignore[method-assign]
        torch_checkpoint._checkpoint_without_reentrant_generator = generator
        torch_checkpoint.CheckpointFunction = function_class  # type: ignore[misc]


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _copied(copies: dict[torch.fx.Node, torch.fx.Node], node: torch.fx.Node) -> torch.fx.Node:
    return copies.get(node, node)


def _recompute_checkpoints(module: torch.fx.GraphModule) -> None:
    """Recompute every checkpointed region's values in the backward instead of keeping them.

    For each region (the forward nodes of one checkpointed call, :func:`checkpoint_region`): the
    values the rest of the forward reads (its outputs) are kept, as are its inputs; every other
    value of the region that the backward reads is computed again, from those, by copies of the
    forward nodes it depends on, placed right before the first backward node that reads one of
    them, and the backward reads the copies. The originals then live only as long as the forward
    needs them. The copies are backward nodes (``meta["recompute_of"]`` names the node each
    recomputes; they keep its layer, source line and region), so the step's time includes the
    recompute and its profile shows it under ``model/backward/recompute``. A random draw
    recomputed reads the same stream as the original (``frontends/torch_random``): the same
    dropout mask, as the checkpoint's saved RNG state gives in eager PyTorch."""
    graph = module.graph
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    regions: dict[int, set[torch.fx.Node]] = {}
    for node in nodes:
        region = checkpoint_region(node)
        if node.op == "call_function" and region is not None and node.meta.get("train_phase") == FORWARD:
            regions.setdefault(region, set()).add(node)
    changed = False

    def backward(user: torch.fx.Node) -> bool:
        return user.op == "call_function" and user.meta.get("train_phase") == BACKWARD

    for _, members in sorted(regions.items()):
        kept = {n for n in members
                if any(u.op == "output" or (u not in members and not backward(u)) for u in n.users)}
        needed = [n for n in members - kept if any(backward(u) for u in n.users)]
        if not needed:
            continue
        closure: set[torch.fx.Node] = set()
        todo = list(needed)
        while todo:
            node = todo.pop()
            if node in closure:
                continue
            closure.add(node)
            todo += [m for m in node.all_input_nodes if m in members and m not in kept]
        first = min((u for n in needed for u in n.users if backward(u)), key=order.__getitem__)
        copies: dict[torch.fx.Node, torch.fx.Node] = {}
        with graph.inserting_before(first):
            for node in sorted(closure, key=order.__getitem__):
                copy = graph.node_copy(node, functools.partial(_copied, copies))
                copy.meta = {**node.meta, "train_phase": BACKWARD, RECOMPUTE_OF: node.name}
                copies[node] = copy
        made = set(copies.values())
        for node in needed:
            for user in list(node.users):
                if backward(user) and user not in made:
                    user.replace_input_with(node, copies[node])
        changed = True
    if changed:
        module.recompile()


_POOL_BACKWARD = {torch.ops.aten.max_pool2d_with_indices_backward.default: 8,
                  torch.ops.aten.max_pool3d_with_indices_backward.default: 8,
                  torch.ops.aten.adaptive_max_pool2d_backward.default: 3}
"""Max-pool backward ops (their argument count): the saved indices are their last argument."""


def _drop_pool_indices(module: torch.fx.GraphModule) -> None:
    """Max-pool backward recomputes its window maxima (torch_backward.py) instead of reading the
    forward's argmax indices, so the forward need not produce them: the indices argument is
    replaced by the gradient (same shape, never read) and the dead index outputs go."""
    graph = module.graph
    changed = False
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _POOL_BACKWARD \
                and len(node.args) == _POOL_BACKWARD[node.target]:
            node.args = (*node.args[:-1], node.args[0])
            changed = True
    if changed:
        graph.eliminate_dead_code()
        module.recompile()


def _functional_copies(module: torch.fx.GraphModule) -> None:
    """In-place writes the core-ATen decompositions emit into a value nothing reads afterwards,
    replaced by the value they write: ``copy_(dst, src)`` by ``src`` itself (expanded to ``dst``'s
    shape), and any other in-place op (``clamp_min_(x, eps)`` in ``cosine_similarity``,
    ``logical_and_(ge, le)`` in ``clamp``'s backward) by its out-of-place form
    (:func:`_out_of_place`). Cross-entropy with ``label_smoothing`` writes its smoothing term's
    ``masked_fill_`` at ignored targets as ``copy_(neg, where(...))``. The frontend lowers values,
    not writes, so such steps were refused (``aten.copy_``, ``aten.clamp_min_``, listed with no
    source line). A write whose target is read later, is a view of another value or an input, or
    (``copy_``) converts the dtype, is left (and stays unsupported)."""
    graph = module.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.args:
            continue
        dst = node.args[0]
        if node.target is torch.ops.aten.copy_.default and _whole_base_copy(graph, node, order):
            changed = True
            continue
        if node.target is torch.ops.aten.copy_.default:
            if len(node.args) < 2 or not _overwritable(dst, node, order):
                continue
            src = node.args[1]
            if not isinstance(src, torch.fx.Node):
                continue
            want, got = dst.meta.get("val"), src.meta.get("val")
            if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor) \
                    or want.dtype != got.dtype:
                continue
            value = src
            if tuple(got.shape) != tuple(want.shape):
                with graph.inserting_before(node):
                    value = graph.call_function(torch.ops.aten.expand.default, (src, list(want.shape)))
                value.meta = dict(node.meta)
            node.replace_all_uses_with(value)
            graph.erase_node(node)
            changed = True
            continue
        functional = _out_of_place(node.target)
        if functional is None:
            continue
        if node.target in _RESTRIDES:  # a view's shape changed in place, no value written: only
            if not isinstance(dst, torch.fx.Node) or dst.op == "placeholder" or any(  # its readers count
                    order[u] > order[node] for u in dst.users if u is not node):
                continue
        elif not _overwritable(dst, node, order):
            continue
        node.target = functional  # its readers read the node already; the value keeps dst's dtype
        changed = True
    if changed:  # the target, now read by nobody, is left: the step program prunes what nothing reads
        module.recompile()
    _refuse_lost_writes(module)


_VIEW_OF_ALL = {torch.ops.aten.as_strided.default, torch.ops.aten.view.default,
                torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default,
                torch.ops.aten.alias.default}


def _whole_base_copy(graph: torch.fx.Graph, node: torch.fx.Node, order: dict[torch.fx.Node, int]) -> bool:
    """``copy_(view(base), src)`` where the view is all of a fresh ``base`` laid out contiguously
    (``as_strided`` at offset 0 with contiguous strides, or a reshape), and later readers read
    ``base`` through other views: ``as_strided_scatter``'s decomposition, which the backward of
    ``adaptive_avg_pool1d`` (Swin's pooler) writes its gradient with. Replaced by ``src`` reshaped
    to ``base``'s shape, read by every later reader of ``base`` and of the view. Before, the copy
    was dropped (nothing reads its result) and the readers read the zeros ``base`` started as: the
    layers below the pool got no gradient, silently."""
    if len(node.args) < 2 or not isinstance(node.args[0], torch.fx.Node) or \
            not isinstance(node.args[1], torch.fx.Node):
        return False
    view, src = node.args[0], node.args[1]
    if view.op != "call_function" or view.target not in _VIEW_OF_ALL:
        return False
    base = view.args[0]
    base_schema = getattr(base.target, "_schema", None) if isinstance(base, torch.fx.Node) else None
    if not isinstance(base, torch.fx.Node) or base.op != "call_function" or base_schema is None \
            or any(r.alias_info is not None for r in base_schema.returns):  # a fresh value only
        return False
    want, got, whole = view.meta.get("val"), src.meta.get("val"), base.meta.get("val")
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor) \
            or not isinstance(whole, torch.Tensor) or want.dtype != got.dtype \
            or want.numel() != whole.numel() or tuple(got.shape) != tuple(want.shape):
        return False
    if view.target is torch.ops.aten.as_strided.default:
        offset = view.args[3] if len(view.args) > 3 else view.kwargs.get("storage_offset", 0)
        if offset not in (0, None) or not want.is_contiguous():
            return False
    with graph.inserting_after(node):
        value = graph.call_function(torch.ops.aten.reshape.default, (src, list(whole.shape)))
    value.meta = dict(node.meta)
    value.meta["val"] = whole
    for user in list(base.users):
        if order.get(user, -1) > order[node]:
            user.replace_input_with(base, value)
    for user in list(view.users):
        if user is not node and order.get(user, -1) > order[node]:
            user.replace_input_with(view, src)
    node.replace_all_uses_with(src)
    graph.erase_node(node)
    return True


def _refuse_lost_writes(module: torch.fx.GraphModule) -> None:
    """An in-place write left in the joint graph whose result nothing reads, into a view of a value
    that is read after it: the converter lowers values, so the write would be dropped and those
    readers would read the value as it was before (silently wrong gradients). One line instead."""
    nodes = list(module.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable or node.users \
                or node.target in _METADATA_ONLY or not node.args \
                or not isinstance(node.args[0], torch.fx.Node):
            continue
        root: torch.fx.Node = node.args[0]
        while _is_view(root):
            parent = root.args[0]
            assert isinstance(parent, torch.fx.Node)  # _is_view checked it
            root = parent
        if root is node.args[0] or root.op == "placeholder":
            continue
        if any(order[u] > order[node] for u in root.users):
            raise TraceError(f"{node.name} ({node.target}) writes in place into a view of {root.name}, "
                             f"which is read afterwards{_located(node)}: a training step cannot "
                             f"carry that write yet")


def _is_view(node: torch.fx.Node) -> bool:
    """An op whose result aliases its first operand (a view: ``as_strided``, ``slice``, ``view``)."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and bool(node.args) \
        and isinstance(node.args[0], torch.fx.Node) and any(r.alias_info is not None for r in schema.returns)


def _located(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    layer = list(stack.values())[-1][0] if stack else ""
    return f" (in {layer})" if layer else ""


def _overwritable(dst: Any, node: torch.fx.Node, order: dict[torch.fx.Node, int]) -> TypeGuard[torch.fx.Node]:
    """Whether the in-place write ``node`` into ``dst`` can be its value instead: ``dst`` is a value
    the graph computed (not an input), not a view of another value (a write through a view
    changes its base), and nothing but ``node`` reads it after the write (make_fx traces later
    reads of a mutated tensor as reads of the in-place node). One piece of a split (``chunk``,
    ``split``, ``unbind``: disjoint views) may be written too when the split tensor itself is such
    a value that nothing reads after the write: ``nn.GRU``'s decomposed cell adds into, and takes
    ``sigmoid_`` / ``tanh_`` of, the pieces of its gate projections (``hgates[0].add_(igates[0])``);
    the other pieces it reads later are untouched by the write."""
    if not isinstance(dst, torch.fx.Node) or dst.op != "call_function":
        return False
    if any(order[u] > order[node] for u in dst.users if u is not node):
        return False
    if dst.target is operator.getitem:
        split = dst.args[0]
        return isinstance(split, torch.fx.Node) and split.op == "call_function" \
            and split.target in _SPLITS and _overwritable(split.args[0], node, order)
    schema = getattr(dst.target, "_schema", None)
    return schema is not None and all(r.alias_info is None for r in schema.returns)


_RESTRIDES = {torch.ops.aten.transpose_.default, torch.ops.aten.t_.default,
              torch.ops.aten.unsqueeze_.default, torch.ops.aten.squeeze_.dim}
"""In-place ops that change a tensor's shape and strides, not its values (``nn.GRU`` with
``batch_first`` transposes its output's view in place): another view of the same memory does not
see them, so only the tensor's own later readers matter."""

_SPLITS = {torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default,
           torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.unsafe_split_with_sizes.default,
           torch.ops.aten.unsafe_chunk.default, torch.ops.aten.chunk.default,
           torch.ops.aten.unbind.int}


def _out_of_place(target: Any) -> Any:
    """The out-of-place overload of an ATen in-place op (``aten.clamp_min_.Tensor`` ->
    ``aten.clamp_min.Tensor``; ``transpose_`` -> ``transpose.int``, whose overloads are named
    apart), or None (not in place, or no such overload)."""
    if target is torch.ops.aten.transpose_.default:
        return torch.ops.aten.transpose.int
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.is_mutable or target in _METADATA_ONLY:
        return None
    namespace, _, name = schema.name.partition("::")
    if namespace != "aten" or not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    overload = getattr(packet, target._overloadname, None) if packet is not None else None
    functional = getattr(overload, "_schema", None)
    if functional is None or functional.is_mutable:
        return None
    return overload


_aten = torch.ops.aten


def _zeros_like_node(node: Any, shape: torch.Size) -> bool:
    """Whether ``node`` is a ``full`` of zeros (or ``zeros``) of ``shape``."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(shape):
        return False
    if node.target is _aten.full.default:
        return len(node.args) >= 2 and isinstance(node.args[1], (int, float)) \
            and not isinstance(node.args[1], bool) and node.args[1] == 0
    return node.target is _aten.zeros.default


def _target(node: Any, *targets: Any) -> TypeGuard[torch.fx.Node]:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _select_slot(node: torch.fx.Node) -> tuple[int, int, torch.fx.Node] | None:
    """``(dim, index, value)`` when ``node`` is ``value`` written at constant ``index`` of ``dim``
    into zeros: ``select_backward`` as the core-ATen decompositions spell it,
    ``where(arange(n).view(..., -1, ...) == index, value.unsqueeze(dim).expand(shape), zeros)``,
    or ``select_scatter(zeros, value, dim, index)``."""
    val = node.meta.get("val")
    if node.op != "call_function" or not isinstance(val, torch.Tensor) or val.ndim == 0:
        return None
    shape, ndim = val.shape, val.ndim
    if node.target is _aten.select_scatter.default and len(node.args) == 4 and not node.kwargs:
        base, value, dim, index = node.args
        if not _zeros_like_node(base, shape) or not isinstance(value, torch.fx.Node) \
                or not isinstance(dim, int) or not isinstance(index, int):
            return None
        dim %= ndim
        return dim, index % shape[dim], value
    if node.target is not _aten.where.self or len(node.args) != 3 or node.kwargs:
        return None
    mask, expanded, base = node.args
    if not _zeros_like_node(base, shape) or not _target(mask, _aten.eq.Scalar) \
            or not isinstance(mask.args[1], int) or isinstance(mask.args[1], bool):
        return None
    ids, index = mask.args[0], mask.args[1]
    if not _target(ids, _aten.view.default, _aten.reshape.default) \
            or not isinstance(ids.meta.get("val"), torch.Tensor):
        return None
    ids_shape, arange = ids.meta["val"].shape, ids.args[0]
    long_dims = [d for d, size in enumerate(ids_shape) if size != 1]
    if len(ids_shape) != ndim or len(long_dims) != 1:
        return None
    dim = long_dims[0]
    n = shape[dim]
    if ids_shape[dim] != n or not _target(arange, _aten.arange.start_step, _aten.arange.default) \
            or tuple(arange.args) not in ((n,), (0, n), (0, n, 1)) or not 0 <= index < n:
        return None
    if not _target(expanded, _aten.expand.default) or not _target(expanded.args[0], _aten.unsqueeze.default):
        return None
    unsqueezed = expanded.args[0]
    value = unsqueezed.args[0]
    if not isinstance(unsqueezed.args[1], int) or unsqueezed.args[1] % ndim != dim \
            or not isinstance(value, torch.fx.Node):
        return None
    want = (*shape[:dim], *shape[dim + 1:])
    value_val = value.meta.get("val")
    if not isinstance(value_val, torch.Tensor) or tuple(value_val.shape) != want \
            or value_val.dtype != val.dtype:
        return None
    return dim, index, value


def _new_node(graph: torch.fx.Graph, like: torch.Tensor, shape: Sequence[int], meta_of: torch.fx.Node,
              target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
    """A node taking ``meta_of``'s metadata, its example value of ``shape`` made like ``like``
    (same fake mode, dtype and device)."""
    from torch._guards import detect_fake_mode
    node = graph.call_function(target, args, kwargs)
    node.meta = {k: v for k, v in meta_of.meta.items() if k not in ("val", "tensor_meta")}
    mode = detect_fake_mode([like])
    with mode if mode is not None else contextlib.nullcontext():
        node.meta["val"] = torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    return node


def _stack_select_gradients(module: torch.fx.GraphModule) -> None:
    """A sum of ``select_backward`` gradients of one tensor at constant indices becomes one
    concatenation of the per-index gradients. A mixture-of-experts layer reads each expert's
    weights from one stacked parameter (``gate_up_proj[e]``, ``[E, 2I, H]``): autograd gives each
    read a gradient of the whole ``[E, ...]`` tensor, zero but at ``e``, and sums the E of them,
    E^2 slices of traffic (each a Vector-engine select of the full stack, then a full-size add).
    Torch's own ``unbind`` backward stacks the per-expert gradients instead, and XLA's algebraic
    simplifier (``HandleAdd``) rewrites ``add(lhs, dynamic-update-slice(zeros, g, e))`` into an
    update of ``lhs``'s slice ``e`` alone, so a real compiler moves each slice once. The result
    is the same values bit for bit: adding a zero is exact, and two gradients at one index are
    added in the order autograd added them. Only sums of two or more such gradients, each read
    only by its sum, are rewritten (one ``select_backward`` alone is left as it is)."""
    graph = module.graph
    # node -> (dim, {index: (gradient node, node whose meta it takes)})
    parts: dict[torch.fx.Node, tuple[int, dict[int, tuple[torch.fx.Node, torch.fx.Node]]]] = {}
    absorbed: set[torch.fx.Node] = set()
    for node in list(graph.nodes):
        slot = _select_slot(node)
        if slot is not None:
            dim, index, value = slot
            parts[node] = (dim, {index: (value, node)})
            continue
        if not _target(node, _aten.add.Tensor) or len(node.args) != 2 or node.kwargs:
            continue
        a, b = node.args
        if not isinstance(a, torch.fx.Node) or not isinstance(b, torch.fx.Node) or a not in parts \
                or b not in parts or a is b or len(a.users) != 1 or len(b.users) != 1:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or any(
                tuple(x.meta["val"].shape) != tuple(val.shape) or x.meta["val"].dtype != val.dtype
                for x in (a, b)):
            continue
        (dim_a, slots_a), (dim_b, slots_b) = parts[a], parts[b]
        if dim_a != dim_b:
            continue
        merged = dict(slots_a)
        for index, (value, source) in slots_b.items():
            if index in merged:  # two reads of one index: summed in autograd's order
                with graph.inserting_before(node):
                    summed = _new_node(graph, val, value.meta["val"].shape, node, _aten.add.Tensor,
                                       (merged[index][0], value))
                merged[index] = (summed, node)
            else:
                merged[index] = (value, source)
        parts[node] = (dim_a, merged)
        absorbed.update((a, b))
    roots = [n for n in parts if n not in absorbed and _target(n, _aten.add.Tensor)]
    for root in roots:
        dim, slots = parts[root]
        val = root.meta["val"]
        shape = val.shape
        pieces: list[torch.fx.Node] = []
        with graph.inserting_before(root):
            index = 0
            while index < shape[dim]:
                if index in slots:
                    value, source = slots[index]
                    pieces.append(_new_node(graph, val, [*shape[:dim], 1, *shape[dim + 1:]], source,
                                            _aten.unsqueeze.default, (value, dim)))
                    index += 1
                    continue
                end = index
                while end < shape[dim] and end not in slots:
                    end += 1
                run = [*shape[:dim], end - index, *shape[dim + 1:]]
                pieces.append(_new_node(graph, val, run, root, _aten.full.default, (run, 0.0), {
                    "dtype": val.dtype, "layout": torch.strided, "device": val.device,
                    "pin_memory": False}))
                index = end
            stacked = _new_node(graph, val, shape, root, _aten.cat.default, (pieces, dim))
        root.replace_all_uses_with(stacked)
        dead = [root]
        while dead:  # what only the folded sum read
            node = dead.pop()
            if node.users or node.op != "call_function" or node.is_impure():
                continue
            inputs = node.all_input_nodes
            graph.erase_node(node)
            dead.extend(inputs)
    if roots:
        module.recompile()


def _module_path(stack: Any) -> str:
    """The innermost module's qualified name in an ``nn_module_stack`` ("" for the root)."""
    return str(list(stack.values())[-1][0]) if stack else ""


def _tag_phases(graph: torch.fx.Graph, params: list[str]) -> None:
    """``train_phase`` on every op node, and a layer for each backward node, chosen in order:
    the layer of the forward op whose backward formula made it (autograd's own link, the
    ``seq_nr`` :func:`_grads` records: both gradients of a linear layer belong to that layer),
    else the module of a forward node it reads (a layer's saved activations: LayerNorm's mean and
    rstd), else the parameter module whose gradient is all it feeds, else the layer of whatever
    it reads (what autograd runs between formulas: summing a gradient that two uses produced).
    The hierarchy then holds layer -> HLO op inside each phase."""
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    origin: dict[int, torch.fx.Node] = {}  # seq_nr -> the forward op that made that autograd node
    for node in nodes:
        if "nn_module_stack" in node.meta and "from_node" in node.meta:
            node.meta["train_phase"] = FORWARD
            if "seq_nr" in node.meta:
                origin.setdefault(node.meta["seq_nr"], node)
        else:
            node.meta["train_phase"] = BACKWARD
    feeds: dict[torch.fx.Node, str | None] = {}
    output = next(n for n in graph.nodes if n.op == "output")
    results = list(output.args[0])
    owners = [p.rpartition(".")[0] for p in params]
    for node, owner in zip(results[1:], owners):
        feeds[node] = owner
    for node in reversed(nodes):
        if node.meta["train_phase"] != BACKWARD or node in feeds:
            continue
        labels = {feeds.get(u) for u in node.users if u.op == "call_function"
                  and u.meta.get("train_phase") == BACKWARD}
        feeds[node] = labels.pop() if len(labels) == 1 else None
    for node in nodes:
        if node.meta["train_phase"] != BACKWARD:
            continue
        # a gradient two uses produced is summed by the engine, between formulas (is_gradient_acc):
        # its seq_nr is whichever node ran last, so it takes its layer from what it reads
        made_by = origin.get(node.meta["seq_nr"]) if node.meta.get("autograd_backward") \
            and not node.meta.get("is_gradient_acc") and "seq_nr" in node.meta else None
        if made_by is not None:
            node.meta["nn_module_stack"] = made_by.meta["nn_module_stack"]
            if "stack_trace" in made_by.meta:
                node.meta["stack_trace"] = made_by.meta["stack_trace"]
            continue
        read = [n for n in node.all_input_nodes if "nn_module_stack" in n.meta]
        layered = [n for n in read if n.meta.get("train_phase") == FORWARD
                   and _module_path(n.meta["nn_module_stack"]) not in ("", "model")]
        donor = layered[-1] if layered else None
        fed = feeds.get(node)
        if donor is None and fed is not None:
            node.meta["nn_module_stack"] = {"owner": (fed or "model", None)}
            continue
        donor = donor or (read[-1] if read else None)
        if donor is not None:
            node.meta["nn_module_stack"] = donor.meta["nn_module_stack"]
            if "stack_trace" in donor.meta:
                node.meta["stack_trace"] = donor.meta["stack_trace"]


__all__ = ["BACKWARD", "CHECKPOINT_REGION", "FORWARD", "RECOMPUTE_OF", "CheckpointingIgnored", "JointGraph",
           "LossModule", "checkpoint_region", "checkpoint_regions", "distinct_inputs", "export_loss",
           "joint_graph", "saved_activations", "stage_joint_graph"]
