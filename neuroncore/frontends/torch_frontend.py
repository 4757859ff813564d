"""PyTorch frontend: ``torch.export`` -> core ATen -> HLO-level IR.

    converted = convert(module, (x,), autocast=None)     # what neuroncore.trace calls

The module is exported (in eval mode: this is an inference compiler), decomposed to core ATen and
walked node by node. Every FX node is emitted inside ``GraphBuilder.located`` with

* the layer path of its innermost ``nn.Module`` (``model/layers.0/self_attn/q_proj``: the module's
  qualified name, one path component per submodule, list indices kept with their list), and
* the stack frames of ``node.meta["stack_trace"]`` (innermost last), without frames inside torch
  itself, so ``op.source`` is the user's (or the model library's) line, not ``torch/nn/...``.

Parameters and buffers become weight constants at their first use (named after the owning module's
layer path + ``/weight``; the qualified name is kept in ``attrs["qualified_name"]``); user inputs
become parameters in ``forward``'s argument order. int64 becomes int32 and float64 becomes FP32
(as on Neuron: no 64-bit datapath; outputs come back in their torch types), bool becomes pred.
ATen ops without an IR mapping are emitted as ``aten.<name>`` ops with their real output shape,
so ``neuroncore.check`` and the compiler's ``UnsupportedOpsError`` list them with layer and line.

Outputs come back as torch tensors in the module's structure (a tensor, or tuples/lists/dicts of
them). A Hugging Face ``ModelOutput`` comes back as a tuple of the tensors ``torch.export`` kept, in
field order: the same as ``ModelOutput.to_tuple()``, so ``out[0]`` is the logits in both.

Two rewrites an XLA compiler would also make: a matmul whose contraction has size 1 (RoPE's
``inv_freq @ positions``) is an outer product, emitted as a broadcast multiply (and so never
auto-cast to bf16); a matmul operand that is a transposed view of a tensor is read through the
``dot``'s contracting dimension (``rhs_contract=-1`` for a linear layer's ``[out, in]`` weight)
instead of a separate transpose. Values that do not depend on inputs or parameters are evaluated by
torch at trace time *only* to recognise constant-index gathers (the padding mask's
``mask[batch_idx, kv_idx]``) as slices and broadcasts; they are still emitted as IR. Ops whose
result is unused are dropped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import itertools
import logging
import math
import operator
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.overrides import TorchFunctionMode

from neuroncore.dtypes import DType
from neuroncore.frontends import torch_rounding
from neuroncore.frontends.flip import flip, take, take_constant
from neuroncore.frontends.torch_composites import COMPOSITES
from neuroncore.frontends.torch_masks import first_index_of_extreme, runtime_index
from neuroncore.frontends.torch_moe import all_experts
from neuroncore.frontends.torch_ops import HANDLERS, load_handlers
from neuroncore.frontends.torch_rope import traceable_dynamic_rope
from neuroncore.frontends.tracing import Converted, TraceError
from neuroncore.ir.builder import MAX_FRAMES, GraphBuilder, GraphError
from neuroncore.ir.graph import Graph, Op, SourceFrame

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_OWN_FILE = os.path.abspath(__file__)  # _Module.forward: the wrapper of a plain function
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
KNOWN_MAX_ELEMENTS = 1 << 20  # trace-time evaluation of input-independent values stops here

_DTYPES = {
    torch.float32: DType.FP32,
    # NeuronCores have no FP64 datapath: torch-xla keeps a float64 tensor's dtype but its device
    # data is f32 on Neuron (pytorch/xla test/neuron/test_neuron_data_types.py), and neuronx-cc
    # lists no FP64 type; so float64 values are computed in FP32 and outputs return as float64
    torch.float64: DType.FP32,
    torch.bfloat16: DType.BF16,
    torch.float16: DType.FP16,
    torch.float8_e4m3fn: DType.FP8_E4M3,  # the Tensor engine's FP8 inputs (NC-v3 double-row)
    torch.float8_e5m2: DType.FP8_E5M2,
    torch.int64: DType.INT32,
    torch.int32: DType.INT32,
    torch.bool: DType.PRED,
    torch.uint8: DType.INT32,  # torch.eye's index ranges; held as int32 like int64
    torch.int8: DType.INT32,
    torch.int16: DType.INT32,
}

# ops that only check metadata or are no-ops at inference
_SKIPPED = {"_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_constrain_range",
            "sym_constrain_range_for_size", "_functional_sym_constrain_range",
            "_functional_assert_async"}
_IDENTITY = {"clone", "alias", "contiguous", "detach", "lift_fresh_copy", "lift_fresh", "dropout",
             "feature_dropout", "alpha_dropout", "view_as", "_unsafe_view_as"}
_UNARY = {"exp": "exp", "tanh": "tanh", "sigmoid": "logistic", "rsqrt": "rsqrt", "sqrt": "sqrt",
          "log": "log", "cos": "cosine", "sin": "sine",
          "erf": "erf"}
_BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide",
           "maximum": "maximum", "minimum": "minimum", "fmax": "maximum", "fmin": "minimum"}
_COMPARE = {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}
_LOGICAL = {"logical_and": "minimum", "bitwise_and": "minimum", "__and__": "minimum",
            "logical_or": "maximum", "bitwise_or": "maximum", "__or__": "maximum",
            "logical_xor": "NE", "bitwise_xor": "NE", "__xor__": "NE"}
_FACTORIES = {"full", "zeros", "ones", "empty", "full_like", "zeros_like", "ones_like", "empty_like",
              "new_full", "new_zeros", "new_ones", "new_empty", "empty_strided", "new_empty_strided",
              "scalar_tensor", "fill"}


@dataclass(frozen=True)
class Scalar:
    """A 0-d constant tensor (``full([], v)``, ``scalar_tensor``): an immediate, never a tile."""

    value: float
    dtype: DType


# -- helpers ------------------------------------------------------------------------------------


def _contiguous_strides(size: Sequence[int], stride: Sequence[int]) -> bool:
    """``stride`` is the row-major layout of ``size`` (a dimension of size 1 may have any stride)."""
    expected = 1
    for n, st in zip(reversed(size), reversed(stride)):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def ir_dtype(dtype: torch.dtype, where: str = "") -> DType:
    try:
        return _DTYPES[dtype]
    except KeyError:
        supported = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        raise TraceError(f"{str(dtype).replace('torch.', '')} tensors are not supported{where} "
                         f"(supported: {supported})") from None


def layer_path(stack: dict[str, tuple[str, Any]] | None) -> str:
    """``model/<qualified name>`` with one component per submodule (``layers.0`` kept together)."""
    if not stack:
        return "model"
    path = list(stack.values())[-1][0]
    parts: list[str] = []
    for part in re.sub(r"\[(\d+)\]", r".\1", path).split("."):
        if not part:
            continue
        if part.isdigit() and parts:
            parts[-1] = f"{parts[-1]}.{part}"
        else:
            parts.append(part)
    return "/".join(["model", *parts])


def stack_frames(trace: str | None, stack: dict[str, tuple[str, Any]] | None = None
                 ) -> tuple[SourceFrame, ...]:
    """Frames of an FX ``stack_trace`` (outermost first), without torch's own files or generated
    code (``<eval_with_key>``). A node with no such frame (code torch generated, e.g. an autocast
    region) gets the ``forward`` of its innermost module, when that module's source is known."""
    frames = [SourceFrame(os.path.abspath(f), int(line), fn)
              for f, line, fn in _FRAME_RE.findall(trace or "") if not f.startswith("<")]
    frames = [f for f in frames if not f.file.startswith(_TORCH_DIR + os.sep) and f.file != _OWN_FILE]
    if not frames and stack:
        fallback = _forward_frame(list(stack.values())[-1][1])
        frames = [fallback] if fallback is not None else []
    return tuple(frames[-MAX_FRAMES:])


@functools.lru_cache(maxsize=256)
def _forward_frame(cls: Any) -> SourceFrame | None:
    """Where ``cls.forward`` is defined (``cls`` a class or its dotted name)."""
    try:
        if isinstance(cls, str):
            module_name, _, attr = cls.rpartition(".")
            cls = getattr(importlib.import_module(module_name), attr)
        forward = inspect.unwrap(cls.forward)
        path = inspect.getsourcefile(forward)
        line = inspect.getsourcelines(forward)[1]
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return None
    if not path or os.path.abspath(path).startswith(_TORCH_DIR + os.sep) or \
            os.path.abspath(path) == _OWN_FILE:
        return None
    return SourceFrame(os.path.abspath(path), line, "forward")


def _dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _opname(node: torch.fx.Node) -> str:
    """The op's name without namespace or overload (``add`` for ``aten.add.Tensor``)."""
    target = node.target
    return str(getattr(target, "_opname", None) or getattr(target, "__name__", target))


def _int_arg(value: object) -> int:
    """A dimension or index argument: a Python int in every graph torch.export makes (shapes are
    static), so anything else is an op this frontend does not know how to read."""
    if not isinstance(value, int):
        raise TraceError(f"expected an integer argument, got {type(value).__name__}")
    return value


def _int_list_arg(value: object) -> list[int]:
    """A list of dimensions (``permute``'s order, ``sum``'s dims)."""
    if not isinstance(value, (list, tuple)):
        raise TraceError(f"expected a list of integers, got {type(value).__name__}")
    return [_int_arg(v) for v in value]


def _number_arg(value: object) -> float:
    """A scalar argument (``fill``'s value, ``add``'s alpha) as a float."""
    if not isinstance(value, (bool, int, float)):
        raise TraceError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _meta(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
                   torch.float64):  # float64: copied to the device as FP32, as torch-xla does on Neuron
        t = t.float()
    if t.dtype == torch.int64:
        t = t.to(torch.int32)
    return t.numpy()


def _from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        a = a.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


class _Module(torch.nn.Module):
    """Wraps a plain callable so that ``torch.export`` can take it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


# -- shapes-only models ---------------------------------------------------------------------------


class _EmptyOnMeta(TorchFunctionMode):
    """``torch.empty`` without a device makes a meta tensor: how ``nn.Linear``, ``nn.Embedding``,
    convolutions and transformers' experts allocate their parameters before initialising them."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.empty and kwargs.get("device") is None:
            kwargs = {**kwargs, "device": torch.device("meta")}
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """Build a model inside this to give it **parameters on the meta device** (shapes, no values,
    no memory, no initialisation time) and everything else as usual: buffers computed in
    ``__init__`` (RoPE frequencies, position ids) keep their values, so the traced program is the
    one the real model compiles to. Such a model traces to a shapes-only ``TracedModel`` that runs
    :meth:`~neuroncore.frontends.tracing.TracedModel.timing_only`: a full-size model (Llama-3-8B,
    Mixtral-8x7B) compiles and times on a laptop. ``torch.device("meta")`` works too, but puts the
    buffers on meta as well, so constants the frontend would fold are computed on the device.
    Not thread-safe: it patches ``nn.Module.register_parameter`` while active."""
    original = torch.nn.Module.register_parameter

    def register_on_meta(module: torch.nn.Module, name: str,
                         param: torch.nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:  # made with ones/zeros/full: small
            param = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign,assignment]
    try:
        with _EmptyOnMeta():
            yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


# -- export -------------------------------------------------------------------------------------


def _register_cache_outputs(module: torch.nn.Module) -> None:
    """Let ``torch.export`` return a Hugging Face ``DynamicCache`` (``use_cache=True``, the default
    of causal LMs), with transformers' own pytree registration for export
    (``integrations.executorch.register_dynamic_cache_export_support``): the cache flattens to its
    key tensors, layer by layer, then its value tensors. Only for transformers models, and only if
    transformers is already imported (nothing is imported for other modules)."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(module, transformers.PreTrainedModel):
        return
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:  # an older transformers: the cache stays an export error
        return
    register_dynamic_cache_export_support()
    _register_encoder_decoder_cache(transformers)


def _register_encoder_decoder_cache(transformers: Any) -> None:
    """An encoder-decoder model's ``EncoderDecoderCache`` (BART, T5, Whisper with ``use_cache``, their
    default) flattens to its two ``DynamicCache``s, self-attention then cross-attention (each as
    above); transformers registers none for it, so export refused BART's default outputs."""
    cache_type = getattr(getattr(transformers, "cache_utils", None), "EncoderDecoderCache", None)
    if cache_type is None:
        return
    names = ("self_attention_cache", "cross_attention_cache")
    try:
        pytree.register_pytree_node(
            cache_type,
            lambda cache: ([getattr(cache, n) for n in names], None),
            lambda children, _context: cache_type(*children),
            serialized_type_name=f"{cache_type.__module__}.{cache_type.__name__}",
            flatten_with_keys_fn=lambda cache: ([(pytree.GetAttrKey(n), getattr(cache, n)) for n in names],
                                                None),
        )
    except ValueError as exc:  # registered already (an earlier trace in this process)
        if "already registered" not in str(exc):
            raise


def _alias_lifted_constants(ep: ExportedProgram) -> None:
    """Tensors a model creates in ``forward`` (``DynamicLayer``'s empty ``torch.tensor([])``) are
    lifted as constants named ``<module path>.lifted_tensor_N``; ``run_decompositions`` in torch
    2.13 re-lifts them under the bare ``lifted_tensor_N`` and its verifier then finds no such
    constant. Each gets its bare name as an alias (the first one keeps a shared bare name); the
    converter reads constants by the names in the decomposed program's signature."""
    for key, value in list(ep.constants.items()):
        bare = key.rpartition(".")[2]
        if bare != key and bare.startswith("lifted_tensor") and bare not in ep.constants:
            ep.constants[bare] = value


@contextlib.contextmanager
def _keep_lifted_constants(ep: ExportedProgram) -> Iterator[None]:
    """Constants that ``run_decompositions`` lifts anew are kept in ``ep.constants``. A cache passed
    back in as an input (a manual decode loop: ``model(next_ids, cache=out.cache)``) is rebuilt in
    the re-traced forward, whose ``DynamicLayer`` makes new ``torch.tensor([])`` constants
    (``lifted_tensor_4`` after the export's 0-3); torch 2.13 lifts them (in ``export._trace``) but
    builds the decomposed program with the old constants table, and its verifier then finds no such
    constant. Both modules that call the lifting pass read it from their globals at call time."""
    from torch._export.passes import lift_constants_pass
    from torch.export import _trace

    modules: list[Any] = [m for m in (_trace, lift_constants_pass)
                          if hasattr(m, "_materialize_and_lift_constants")]
    real = {m: m._materialize_and_lift_constants for m in modules}

    def keeping(lift: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        def keep(*args: Any, **kwargs: Any) -> dict[str, Any]:
            constants = lift(*args, **kwargs)
            for key, value in constants.items():
                ep.constants.setdefault(key, value)
            return constants
        return keep

    for module, lift in real.items():
        module._materialize_and_lift_constants = keeping(lift)
    try:
        yield
    finally:
        for module, lift in real.items():
            module._materialize_and_lift_constants = lift


def _views_as_reshapes(ep: ExportedProgram) -> None:
    """``aten.view`` nodes become ``aten.reshape`` before decomposition. The decomposed CPU
    ``scaled_dot_product_attention`` gives its output other strides than eager torch does, so a
    later ``.view`` that was valid when exported (GPT-2's ``Conv1D``: ``x.view(-1, x.size(-1))``)
    fails when the decomposition re-runs it on fake tensors. The IR has no strides: a view and a
    reshape are the same op to it."""
    changed = False
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        ep.graph_module.recompile()


# ops kept whole although core ATen decomposes them: linear and bicubic interpolation become gathers
# at index tensors computed from aranges, while torch_conv.upsample_linear contracts each spatial
# dim with one constant interpolation matrix (bilinear2d.vec already stays whole)
_KEPT_WHOLE = ("upsample_linear1d.default", "upsample_linear1d.vec", "upsample_trilinear3d.vec",
               "upsample_bicubic2d.vec", "im2col.default")  # im2col: torch_conv.im2col, not gathers


def _decompositions() -> dict[Any, Any]:
    """torch.export's core-ATen decomposition table without the ops in ``_KEPT_WHOLE``, with the
    compositions of ``torch_composites``."""
    table = torch.export.default_decompositions()
    for name in _KEPT_WHOLE:
        packet, _, overload = name.partition(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return {**table, **COMPOSITES}


def is_shapes_only(tensor: torch.Tensor) -> bool:
    """A tensor with a shape but no values: on the meta device, or the fake CPU stand-in
    ``_cpu_stand_ins`` exports it as."""
    return tensor.is_meta or isinstance(tensor, FakeTensor)


@contextlib.contextmanager
def _cpu_stand_ins(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None
                   ) -> Iterator[tuple[tuple[Any, ...], dict[str, Any] | None]]:
    """Export a module with meta parameters (or buffers) as if they were on the CPU: fake CPU
    tensors (no memory) stand in for them while ``torch.export`` runs, and the inputs become fake
    too. Exported on the meta device, every activation would be a meta tensor and torch would
    decompose attention for another device than the CPU the real model exports on."""
    swapped: list[tuple[dict[str, Any], str, Any]] = []
    mode: FakeTensorMode | None = None
    for sub in module.modules():
        tables: tuple[dict[str, Any], ...] = (sub._parameters, sub._buffers)
        for table in tables:
            for key, value in list(table.items()):
                if value is None or not value.is_meta:
                    continue
                mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
                with mode:
                    stand_in = torch.empty(value.shape, dtype=value.dtype, device="cpu")
                if isinstance(value, torch.nn.Parameter):
                    stand_in = torch.nn.Parameter(stand_in, requires_grad=False)
                swapped.append((table, key, value))
                table[key] = stand_in
    if mode is None:
        yield args, kwargs
        return
    fake_mode = mode

    def fake(x: Any) -> Any:
        return fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) and not x.is_meta else x

    try:
        yield pytree.tree_map(fake, args), (None if kwargs is None else pytree.tree_map(fake, kwargs))
    finally:
        for table, key, value in swapped:
            table[key] = value


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """What torch prints while exporting, minus the failure dumps: ``torch.export`` prints a failed
    trace's partial FX graph to stderr (twice, unconditionally) and logs a warning when it cannot
    find the user line of a data-dependent value, hundreds of lines before the one-line error the
    caller gets; a shape error in the model (``x @ w`` with mismatched sizes) is logged by the fake
    tensor mode as a 19-line traceback of the error the caller gets in one line. Everything else
    written to stderr (warnings) is passed on when the export ends."""
    failed: list[BaseException] = []
    captured, real = io.StringIO(), sys.stderr
    quieted = {logging.getLogger("torch.fx.experimental.symbolic_shapes"): logging.ERROR,
               logging.getLogger("torch._subclasses.fake_tensor"): logging.CRITICAL}
    levels = {log: log.level for log in quieted}
    sys.stderr = captured
    for log, quiet in quieted.items():
        log.setLevel(quiet)
    try:
        yield
    except BaseException as exc:
        failed.append(exc)
        raise
    finally:
        sys.stderr = real
        for log, level in levels.items():
            log.setLevel(level)
        text = captured.getvalue()
        for error in failed:
            graph = str(getattr(error, "partial_fx_graph", "") or "")
            if graph:
                text = text.replace(graph + "\n", "").replace(graph, "")
        if text.strip():
            real.write(text)


_GRAPH_FRAME_RE = re.compile(r"# File: (\S+):(\d+) in ")
_CAUSED_BY_RE = re.compile(r"Caused by: \((\S+):(\d+) in ")


def _data_dependent_where(exc: BaseException, text: str) -> str:
    """The user line a data-dependent failure comes from: the call torch names, else the line in its
    "Caused by" (the branch), else the last op of the partial graph it traced (the ``.item()`` that
    made the value)."""
    calls = _FRAME_RE.findall(text.split("The following call raised this error:")[-1])
    if calls:
        return f"{calls[0][0]}:{calls[0][1]}"
    frames = _GRAPH_FRAME_RE.findall(str(getattr(exc, "partial_fx_graph", "") or ""))
    caused = _CAUSED_BY_RE.search(text)
    if caused:  # torch shortens the path ("transformers/models/..."): the full one, if it is known
        short, line = caused.groups()
        full = [f for f, _ in frames if f.endswith(short)] + [
            os.path.join(root, short) for root in sys.path
            if root and os.path.isfile(os.path.join(root, short))]
        return f"{full[0] if full else short}:{line}"
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


def export_failure(name: str, exc: BaseException) -> TraceError:
    """The one line a failed ``torch.export`` of ``name`` becomes."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    if "data-dependent" in text or "data dependent" in text or "DataDependent" in type(exc).__name__:
        line = _data_dependent_where(exc, text)
        where = f" at {line}" if line else ""
        return TraceError(f"{name}: data-dependent control flow cannot be traced (a branch or "
                          f"shape depends on a tensor's values){where}: {first}")
    if "pytree flattening function should be applied to DynamicCache" in text:
        # a state-space (Mamba) or other non-attention cache layer in a DynamicCache output
        return TraceError(f"{name}: its cache holds layers that are not attention keys and values "
                          "(a state-space model's), which cannot be a traced output: trace it with "
                          "use_cache=False in its config")
    return TraceError(f"{name}: torch.export failed: {first}")


def export(fn: Any, example_inputs: Sequence[Any] | dict[str, Any]) -> ExportedProgram:
    """``torch.export`` + core ATen decompositions, with export failures as one-line TraceErrors.
    ``example_inputs`` is a tuple of positional inputs or a dict of keyword inputs."""
    module = fn if isinstance(fn, torch.nn.Module) else _Module(fn)
    args, kwargs = ((), dict(example_inputs)) if isinstance(example_inputs, dict) \
        else (tuple(example_inputs), None)
    _register_cache_outputs(module)
    name = type(fn).__name__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", "function")
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        before = _tensor_attributes(module)
        with quiet_export(), warnings.catch_warnings(), all_experts(module), \
                traceable_dynamic_rope(module), \
                _cpu_stand_ins(module, args, kwargs) as (args, kwargs):  # MoE, RoPE: torch_moe/_rope.py
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|copyreg)")
            try:
                ep = torch.export.export(module, args, kwargs)
            finally:
                _restore_lazy_attributes(module, before)
            _alias_lifted_constants(ep)
            _views_as_reshapes(ep)
            with _keep_lifted_constants(ep):
                return ep.run_decompositions(_decompositions())
    except Exception as exc:  # torch raises many types; every one is a failed trace
        raise export_failure(name, exc) from exc
    finally:
        for m, training in modes.items():
            m.training = training


def _tensor_attributes(module: torch.nn.Module) -> dict[tuple[int, str], tuple[torch.nn.Module, Any]]:
    """Plain tensor attributes of every submodule (not parameters or buffers, which live in their
    own tables), keyed by module and name."""
    return {(id(m), key): (m, value) for m in module.modules() for key, value in vars(m).items()
            if isinstance(value, torch.Tensor)}


def _restore_lazy_attributes(module: torch.nn.Module,
                             before: dict[tuple[int, str], tuple[torch.nn.Module, Any]]) -> None:
    """Undo tensor attributes a forward set while exporting: fake tensors left on the user's model
    (Phi-3's longrope caches ``long_inv_freq`` on first use), which the next export of the same model
    (``check`` then ``trace``) read as a constant without values ('weights on the meta device')."""
    from torch._subclasses.fake_tensor import FakeTensor

    for (ident, key), (m, value) in _tensor_attributes(module).items():
        if isinstance(value, FakeTensor):
            if (ident, key) in before:
                setattr(m, key, before[(ident, key)][1])
            else:
                delattr(m, key)


# -- conversion ---------------------------------------------------------------------------------


def _function_frame(fn: Any) -> tuple[SourceFrame, ...]:
    """Where a plain function traced through ``_Module`` is defined: torch records only the
    wrapper's ``forward`` frame, so this is the best line its ops have."""
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    if code is None or code.co_filename.startswith("<"):
        return ()
    return (SourceFrame(os.path.abspath(code.co_filename), code.co_firstlineno, code.co_name),)


class _Converter:
    def __init__(self, ep: ExportedProgram, name: str, autocast: str | None,
                 default_frames: tuple[SourceFrame, ...] = ()) -> None:
        self.ep = ep
        self.default_frames = default_frames  # for ops without a user frame of their own
        self.meta_weights: list[str] = []  # weights on the meta device: shapes, no values
        self.b = GraphBuilder(name, autocast=autocast)
        self.env: dict[torch.fx.Node, Any] = {}
        self.known: dict[torch.fx.Node, torch.Tensor] = {}
        self.transposed: dict[int, Op] = {}  # id(op) -> X with op == swap_last_two(X)
        self.weights: dict[str, Op] = {}
        self.consts: dict[str, torch.Tensor] = {}  # placeholder name -> parameter/buffer tensor
        self.const_names: dict[str, str] = {}
        self.user_inputs: list[torch.fx.Node] = []
        self.node: torch.fx.Node | None = None
        self.frames: tuple[SourceFrame, ...] = ()
        sig = ep.graph_signature
        tables = {**ep.state_dict, **ep.constants}
        for spec in sig.input_specs:
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                tensor = tables[spec.target]
                self.consts[spec.arg.name] = tensor
                self.const_names[spec.arg.name] = spec.target
            elif spec.kind is InputKind.USER_INPUT:
                pass
            elif spec.kind is not InputKind.TOKEN:
                raise TraceError(f"{name}: inputs of kind {spec.kind.name} are not supported")
        self.buffers = {spec.arg.name for spec in sig.input_specs
                        if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR)}
        self.tokens = {spec.arg.name for spec in sig.input_specs if spec.kind is InputKind.TOKEN}

    # -- driver --------------------------------------------------------------------------------
    def run(self) -> tuple[Graph, list[Any], list[tuple[torch.dtype, tuple[int, ...]] | None]]:
        nodes = {n.name: n for n in self.ep.graph.nodes}
        for node in self.ep.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "call_function":
                layer = layer_path(node.meta.get("nn_module_stack"))
                frames = stack_frames(node.meta.get("stack_trace"),
                                      node.meta.get("nn_module_stack")) or self.default_frames
                self.frames = frames
                with self.b.located(layer, frames):
                    self._evaluate_known(node)
                    try:
                        self.env[node] = self._call(node)
                    except GraphError as exc:  # an operand the IR refuses: say which op and where
                        raise TraceError(f"{self.b.name}: aten.{_opname(node)} cannot be lowered: "
                                         f"{exc}{self._where(node)}") from None
            elif node.op == "get_attr":
                raise TraceError(f"graph attribute {node.target!r} (a submodule or control-flow "
                                 f"branch) is not supported{self._where(node)}")
        out_specs = self.ep.graph_signature.output_specs
        results: list[Any] = []
        dtypes: list[tuple[torch.dtype, tuple[int, ...]] | None] = []  # and shapes
        outputs: list[Op] = []
        for spec in out_specs:
            if spec.kind is not OutputKind.USER_OUTPUT:
                continue
            arg_name = getattr(spec.arg, "name", None)
            if arg_name is None or arg_name not in nodes:
                results.append(getattr(spec.arg, "value", None))
                dtypes.append(None)
                continue
            node = nodes[arg_name]
            value = self.env.get(node)
            meta = _meta(node)
            with self.b.located("model", stack_frames(node.meta.get("stack_trace"))
                                or self.default_frames):
                op = self._as_op(value, tuple(meta.shape), ir_dtype(meta.dtype))
            if op not in outputs:
                outputs.append(op)
            results.append(outputs.index(op))
            dtypes.append((meta.dtype, tuple(meta.shape)))
        if not outputs:
            raise TraceError(f"{self.b.name} returns no tensors")
        graph = self.b.build(outputs).pruned()
        return graph, results, dtypes

    def _where(self, node: torch.fx.Node | None) -> str:
        """`` at layer [file:line]`` of ``node`` for error messages; empty without one."""
        if node is None:
            return ""
        layer = layer_path(node.meta.get("nn_module_stack"))
        frames = stack_frames(node.meta.get("stack_trace"),
                              node.meta.get("nn_module_stack")) or self.default_frames
        return f" at {layer}" + (f" [{frames[-1].file}:{frames[-1].line}]" if frames else "")

    def _placeholder(self, node: torch.fx.Node) -> None:
        if node.name in self.tokens:  # side-effect ordering tokens: nothing to compute
            self.env[node] = None
            return
        if node.name in self.consts:
            tensor = self.consts[node.name]
            if node.name in self.buffers and tensor.numel() <= KNOWN_MAX_ELEMENTS \
                    and not is_shapes_only(tensor):
                self.known[node] = tensor.detach()
            self.env[node] = _LazyWeight(node.name)
            return
        meta = _meta(node)
        if not isinstance(meta, torch.Tensor):
            self.env[node] = meta
            return
        dtype = ir_dtype(meta.dtype, f" (input {node.name!r})")
        self.user_inputs.append(node)
        with self.b.located("model", ()):
            self.env[node] = self.b.parameter(node.name, tuple(meta.shape), dtype)

    def _weight(self, key: str) -> Op:
        cached = self.weights.get(key)
        if cached is not None:
            return cached
        tensor = self.consts[key]
        qualified = self.const_names[key]
        module, _, leaf = qualified.rpartition(".")
        layer = layer_path({"": (module, None)}) if module else "model"
        dtype = ir_dtype(tensor.dtype, f" (weight {qualified!r})")
        with self.b.located(layer, self.frames):  # the frames of its first use
            if is_shapes_only(tensor):  # a seeded stand-in no timing-only run materialises
                self.meta_weights.append(qualified)
                op = self.b.weight(leaf or qualified, tuple(tensor.shape), dtype)
            else:
                array = _to_numpy(tensor).astype(np.float32)
                op = self.b.weight(leaf or qualified, tuple(tensor.shape), dtype, array=array)
        op.attrs["qualified_name"] = qualified
        self.weights[key] = op
        return op

    # -- trace-time values of input-independent nodes --------------------------------------------
    def _evaluate_known(self, node: torch.fx.Node) -> None:
        meta = _meta(node)
        target = node.target
        if isinstance(target, str) or any(a not in self.known for a in node.all_input_nodes):
            return  # (a call_function's target is the function itself, never a name)
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            return  # random numbers are not constants
        vals = meta if isinstance(meta, (list, tuple)) else [meta]
        if not all(isinstance(v, torch.Tensor) and v.numel() <= KNOWN_MAX_ELEMENTS for v in vals):
            return
        args, kwargs = pytree.tree_map_only(torch.fx.Node, lambda n: self.known[n],
                                            (node.args, node.kwargs))
        if kwargs.get("device") == torch.device("meta"):  # a model built on the meta device
            kwargs = {**kwargs, "device": torch.device("cpu")}
        try:
            with torch.no_grad():
                value = target(*args, **kwargs)
        except Exception:  # anything torch cannot run eagerly is simply not known
            return
        if isinstance(value, torch.Tensor) and not is_shapes_only(value):
            self.known[node] = value

    # -- value access -------------------------------------------------------------------------
    def _value(self, x: Any) -> Any:
        if isinstance(x, torch.fx.Node):
            v = self.env[x]
            return self._weight(v.key) if isinstance(v, _LazyWeight) else v
        if isinstance(x, (list, tuple)):
            return type(x)(self._value(i) for i in x)
        return x

    def _as_op(self, v: Any, shape: tuple[int, ...], dtype: DType) -> Op:
        """Any value (op, Scalar, Python number) as an op of ``shape``."""
        if isinstance(v, Op):
            return v
        if isinstance(v, Scalar):
            return self.b.constant(v.value, v.dtype, shape=shape)
        if isinstance(v, (bool, int, float)):
            return self.b.constant(float(v), dtype, shape=shape)
        raise TraceError(f"cannot use {type(v).__name__} as a tensor{self._where(self.node)}")

    def _op(self, x: Any, dtype: DType | None = None) -> Op:
        """A tensor argument as an op (Scalars become 0-d constants), cast to ``dtype`` if given."""
        v = self._value(x)
        if isinstance(v, Scalar):
            op = self.b.constant(v.value, dtype or v.dtype, shape=())
        elif isinstance(v, Op):
            op = v
        else:
            raise TraceError(f"expected a tensor, got {type(v).__name__}{self._where(self.node)}")
        return self._cast(op, dtype) if dtype is not None else op

    def _cast(self, op: Op, dtype: DType) -> Op:
        return op if op.dtype is dtype else self.b.convert(op, dtype)

    def _operand(self, x: Any, dtype: DType) -> Op | float:
        """An elementwise operand: an op in ``dtype``, or a Python float (an immediate)."""
        v = self._value(x)
        if isinstance(v, Scalar):
            return float(v.value)
        if isinstance(v, (bool, int, float)):
            return float(v)
        return self._cast(self._op(v), dtype)

    # -- dispatch -----------------------------------------------------------------------------
    def _call(self, node: torch.fx.Node) -> Any:
        target = node.target
        if target is operator.getitem:
            seq = self._value(node.args[0])
            return seq[node.args[1]]
        name = _opname(node)
        if name in _SKIPPED:
            return None
        if name == "with_effects":  # an ordered side effect (error checks): (token, results...)
            meta = _meta(node)
            return tuple(None for _ in meta) if isinstance(meta, (list, tuple)) else None
        meta = _meta(node)
        for val in (meta if isinstance(meta, (list, tuple)) else [meta]):
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                    isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape)):
                raise TraceError(f"{self.b.name}: aten.{name} has a data-dependent result"
                                 f"{self._where(node)}: a value or shape computed from tensor "
                                 f"contents (boolean-mask indexing, .item(), nonzero) cannot be "
                                 f"compiled; shapes must be static")
        if isinstance(meta, torch.Tensor) and meta.dtype.is_complex:
            # the core has no complex type: every op making a complex value (torch.polar, a complex
            # product) is listed with its layer and line, not a dtype error that stops ``check``
            return self._unsupported(node, name)
        if isinstance(meta, torch.Tensor) and meta.dtype in _DTYPES:
            # (an op whose result type the core has not -- complex -- is not folded: it is
            # unsupported, or refused by its handler, with its op name, layer and line)
            dtype = ir_dtype(meta.dtype, self._where(node))
            known = self.known.get(node)
            if known is not None and name not in ("arange",) and _uniform(known):
                value = float(known.reshape(-1)[0]) if known.numel() else 0.0
                if not meta.shape:
                    return Scalar(value, dtype)
                return self.b.constant(value, dtype, shape=tuple(meta.shape))
        handler = getattr(self, f"_aten_{name}", None)
        if handler is None and name in HANDLERS:
            handler = functools.partial(HANDLERS[name], self)
        if handler is None:
            for table, method in ((_UNARY, self._unary), (_BINARY, self._binary),
                                  (_COMPARE, self._compare), (_LOGICAL, self._logical)):
                if name in table:
                    result = method(node, table[name])
                    if result is NotImplemented:
                        return self._folded(node) or self._unsupported(node, name)
                    return result
            if name in _IDENTITY:
                return self._identity(node)
            if name in _FACTORIES:
                return self._factory(node)
            return self._folded(node) or self._unsupported(node, name)
        try:
            kw = node.normalized_arguments(self.ep.graph_module, normalize_to_only_use_kwargs=True)
        except Exception:
            kw = None
        args = dict(kw.kwargs) if kw is not None else {}
        if "input" in args and "self" not in args:  # fx names ``self`` ``input``
            args["self"] = args["input"]
        result = handler(node, args)
        if result is NotImplemented:
            return self._folded(node) or self._unsupported(node, name)
        return result

    def _folded(self, node: torch.fx.Node) -> Op | None:
        """An op the IR has no form for whose value is known at trace time (computed only from
        constants: ALiBi's slopes, ``pow(base, arange(heads))`` in BLOOM and MPT) becomes a constant
        tensor of that value, stored like a buffer -- XLA folds such constants too. None otherwise."""
        known = self.known.get(node)
        meta = _meta(node)
        if known is None or not isinstance(meta, torch.Tensor) or meta.dtype not in _DTYPES:
            return None
        array = _to_numpy(known).astype(np.float32)
        op = self.b.weight(f"{node.name}_folded", tuple(meta.shape), ir_dtype(meta.dtype), array=array)
        op.attrs["qualified_name"] = f"{node.name}_folded"
        return op

    def _unsupported(self, node: torch.fx.Node, name: str, only: set[int] | None = None) -> Any:
        """An op the IR has no mapping for: kept, with its real output shape, for the error list."""
        operands: list[Op] = []
        for a in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(a, torch.fx.Node):
                v = self._value(a)
                if isinstance(v, Op) and v not in operands:
                    operands.append(v)
        meta = _meta(node)
        outs = meta if isinstance(meta, (list, tuple)) else [meta]
        ops = []
        for i, val in enumerate(outs):
            if not isinstance(val, torch.Tensor):
                ops.append(val)
                continue
            dtype = _DTYPES.get(val.dtype, DType.FP32)
            used = isinstance(meta, torch.Tensor) or any(
                u.target is operator.getitem and u.args[1] == i for u in node.users)
            if not used or (only is not None and i not in only):
                ops.append(None)
                continue
            attrs: dict[str, Any] = {"torch_op": str(node.target)}  # Op.attrs
            if val.dtype not in _DTYPES:
                attrs["torch_dtype"] = str(val.dtype)
            if not isinstance(meta, torch.Tensor):
                attrs["output"] = i
            ops.append(self.b.add_op(f"aten.{name}", operands, tuple(val.shape), dtype, **attrs))
        return ops[0] if isinstance(meta, torch.Tensor) else tuple(ops)

    def _out_dtype(self, meta: Any) -> DType:
        """The IR dtype of one output's metadata (a multi-output op's element)."""
        return ir_dtype(meta.dtype, self._where(self.node))

    def _out(self, node: torch.fx.Node) -> tuple[tuple[int, ...], DType]:
        meta = _meta(node)
        return tuple(meta.shape), ir_dtype(meta.dtype, self._where(node))

    # -- elementwise --------------------------------------------------------------------------
    def _unary(self, node: torch.fx.Node, method: str) -> Any:
        _shape, dtype = self._out(node)
        x = self._op(node.args[0], dtype)
        return getattr(self.b, method)(x)

    def _binary(self, node: torch.fx.Node, opcode: str) -> Any:
        shape, dtype = self._out(node)
        a, b = node.args[0], node.args[1]
        if opcode == "divide" and node.kwargs.get("rounding_mode") is not None:
            return torch_rounding.divide(self, node, str(node.kwargs["rounding_mode"]))
        alpha = _number_arg(node.kwargs.get("alpha", 1))
        x, y = self._operand(a, dtype), self._operand(b, dtype)
        if alpha != 1:
            y = y * alpha if isinstance(y, float) else self.b.multiply(y, alpha)
        if opcode == "divide" and not dtype.is_float:
            return NotImplemented
        return self._emit_binary(opcode, x, y, shape, dtype)

    def _emit_binary(self, opcode: str, x: Op | float, y: Op | float, shape: tuple[int, ...],
                     dtype: DType) -> Op:
        if not isinstance(x, Op) and not isinstance(y, Op):
            folds: dict[str, Callable[[float, float], float]] = {
                "add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
                "divide": operator.truediv, "maximum": max, "minimum": min}
            fn = folds[opcode]
            return self.b.constant(fn(x, y), dtype, shape=shape)
        identity = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}.get(opcode)
        if identity is not None and isinstance(y, float) and y == identity and isinstance(x, Op) \
                and x.shape == shape:
            return x
        if opcode in ("add", "multiply") and isinstance(x, float) and x == identity \
                and isinstance(y, Op) and y.shape == shape:
            return y
        out = getattr(self.b, opcode)(x, y)
        return self.b.broadcast_to(out, shape)

    def _compute_dtype(self, node: torch.fx.Node) -> DType:
        """The dtype torch computes a comparison in (type promotion of both operands)."""
        probes: list[torch.Tensor | bool | int | float] = []
        for a in node.args[:2]:
            if isinstance(a, torch.fx.Node):
                m = _meta(a)
                probes.append(torch.empty((0,) if m.dim() else (), dtype=m.dtype))
            elif isinstance(a, (bool, int, float)):
                probes.append(a)
            else:
                raise TraceError(f"aten.{_opname(node)} compares a {type(a).__name__}{self._where(node)}")
        if len(probes) == 1 and isinstance(probes[0], torch.Tensor):
            return ir_dtype(probes[0].dtype)
        first, second = probes
        return ir_dtype(torch.result_type(first, second))

    def _compare(self, node: torch.fx.Node, direction: str) -> Any:
        shape, _ = self._out(node)
        dtype = self._compute_dtype(node)
        x, y = self._operand(node.args[0], dtype), self._operand(node.args[1], dtype)
        if not isinstance(x, Op):
            x = self.b.constant(x, dtype, shape=())
        return self.b.broadcast_to(self.b.compare(x, y, direction), shape)

    def _logical(self, node: torch.fx.Node, how: str) -> Any:
        shape, dtype = self._out(node)
        if dtype is not DType.PRED:
            return NotImplemented
        x, y = (self._pred(a) for a in node.args[:2])
        if how == "NE":
            return self.b.broadcast_to(self.b.compare(x, y, "NE"), shape)
        return self.b.broadcast_to(getattr(self.b, how)(x, y), shape)

    def _pred(self, x: Any) -> Op | float:
        v = self._operand(x, DType.PRED)
        if isinstance(v, Op) and v.dtype is not DType.PRED:
            return self.b.compare(v, 0.0, "NE")
        return v

    def _aten_logical_not(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._pred(node.args[0])
        return self.b.compare(x, 0.0, "EQ")

    def _aten_bitwise_not(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        if dtype is not DType.PRED:
            return NotImplemented
        return self._aten_logical_not(node, kw)

    def _aten_abs(self, node: torch.fx.Node, kw: Any) -> Any:
        """|x|; an integer one (T5's and ModernBERT's relative-position buckets) as max(x, -x), the
        way the JAX frontend lowers integer ``abs`` (the engines' Abs activation is float only)."""
        _, dtype = self._out(node)
        x = self._op(node.args[0], dtype)
        return self.b.abs(x) if dtype.is_float else self.b.maximum(x, self.b.multiply(x, -1.0))

    def _aten_sign(self, node: torch.fx.Node, kw: Any) -> Any:
        """sign(x) as two selects, ``x > 0 ? 1 : (x < 0 ? -1 : 0)`` (the JAX frontend's ``sign``,
        but with torch's 0 for NaN). The backward of ``abs``, ``l1_loss`` and ``smooth_l1_loss``
        reads it, so an L1 or Huber loss did not train (``aten.sign`` unsupported)."""
        shape, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        negative = self._select(self.b.compare(x, 0.0, "LT"), -1.0, 0.0, shape, dtype)
        return self._select(self.b.compare(x, 0.0, "GT"), 1.0, negative, shape, dtype)

    _aten_sgn = _aten_sign

    def _float_test(self, node: torch.fx.Node, direction: str, against: float | None,
                    magnitude: bool = False) -> Any:
        """A floating-point class test as one compare: ``x`` with itself (NaN is the one value not
        equal to itself), or ``x`` / ``|x|`` with an infinity; an integer tensor is never NaN nor
        infinite. T5 in fp16 clamps its hidden states when ``isinf(h).any()``."""
        shape, _ = self._out(node)
        source = node.args[0]
        dtype = ir_dtype(source.meta["val"].dtype) if isinstance(source, torch.fx.Node) else DType.FP32
        if not dtype.is_float:
            finite = direction == "LT"  # isfinite: every integer is; isnan, isinf: none
            return self.b.constant(1.0 if finite else 0.0, DType.PRED, shape=shape)
        x = self._op(source, dtype)
        if against is None:
            return self.b.compare(x, x, direction)
        return self.b.compare(self.b.abs(x) if magnitude else x, against, direction)

    def _aten_isnan(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._float_test(node, "NE", None)

    def _aten_isinf(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._float_test(node, "EQ", math.inf, magnitude=True)

    def _aten_isfinite(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._float_test(node, "LT", math.inf, magnitude=True)  # NaN < inf is false

    def _aten_isposinf(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._float_test(node, "EQ", math.inf)

    def _aten_isneginf(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._float_test(node, "EQ", -math.inf)

    def _aten_log1p(self, node: torch.fx.Node, kw: Any) -> Any:
        """log(1 + x), as the JAX frontend lowers ``log-plus-one`` (the engines have no log1p:
        below |x| ~ 1e-7 the FP32 sum rounds to 1, an absolute error of at most |x|). torch's
        ``softplus`` (Mamba's time step) decomposes to it."""
        _, dtype = self._out(node)
        return self.b.log(self.b.add(self._op(node.args[0], dtype), 1.0))

    def _aten_expm1(self, node: torch.fx.Node, kw: Any) -> Any:
        """exp(x) - 1 (the engines have no expm1: the same absolute-error rule as ``log1p``)."""
        _, dtype = self._out(node)
        return self.b.subtract(self.b.exp(self._op(node.args[0], dtype)), 1.0)

    def _aten_elu(self, node: torch.fx.Node, kw: Any) -> Any:
        """``elu(x, alpha, scale, input_scale)`` (``nn.ELU``; ``nn.SELU`` with its constants):
        ``scale * x`` where ``x > 0``, else ``alpha * scale * (exp(input_scale * x) - 1)``, as
        torch's kernel computes it (a select, so the exponential of a large positive ``x`` is never
        read)."""
        _, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        alpha, scale = float(kw.get("alpha", 1.0)), float(kw.get("scale", 1.0))
        input_scale = float(kw.get("input_scale", 1.0))
        inner = x if input_scale == 1.0 else self.b.multiply(x, input_scale)
        negative = self.b.multiply(self.b.subtract(self.b.exp(inner), 1.0), alpha * scale)
        positive = x if scale == 1.0 else self.b.multiply(x, scale)
        return self.b.select(self.b.compare(x, 0.0, "GT"), positive, negative)

    def _aten_neg(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        x = self._op(node.args[0], dtype)
        return self.b.negate(x) if dtype.is_float else self.b.multiply(x, -1.0)

    def _aten_rsub(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        x, y = self._operand(kw["self"], dtype), self._operand(kw["other"], dtype)
        alpha = kw.get("alpha", 1)
        if alpha != 1:
            x = x * alpha if isinstance(x, float) else self.b.multiply(x, float(alpha))
        return self._emit_binary("subtract", y, x, shape, dtype)

    def _aten_reciprocal(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        return self._emit_binary("divide", 1.0, self._op(kw["self"], dtype), shape, dtype)

    def _aten_relu(self, node: torch.fx.Node, kw: Any) -> Any:
        _shape, dtype = self._out(node)
        return self.b.maximum(self._op(kw["self"], dtype), 0.0)

    def _aten_gelu(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        approximate = kw.get("approximate", "none")
        return self.b.gelu(self._op(kw["self"], dtype), approximate=approximate)

    def _aten_silu(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        return self.b.silu(self._op(kw["self"], dtype))

    def _aten_clamp(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        x: Op = self._op(kw["self"], dtype)
        lo, hi = kw.get("min"), kw.get("max")
        if lo is not None:
            x = self._emit_binary("maximum", x, self._operand(lo, dtype), shape, dtype)
        if hi is not None:
            x = self._emit_binary("minimum", x, self._operand(hi, dtype), shape, dtype)
        return x

    def _aten_clamp_min(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        return self._emit_binary("maximum", self._op(kw["self"], dtype),
                                 self._operand(kw["min"], dtype), shape, dtype)

    def _aten_clamp_max(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        return self._emit_binary("minimum", self._op(kw["self"], dtype),
                                 self._operand(kw["max"], dtype), shape, dtype)

    def _aten_hardtanh(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        x = self._emit_binary("maximum", self._op(kw["self"], dtype), float(kw["min_val"]), shape, dtype)
        return self._emit_binary("minimum", x, float(kw["max_val"]), shape, dtype)

    def _aten_pow(self, node: torch.fx.Node, kw: Any) -> Any:
        """``x ** e``: the small integer and half exponents as multiplies, ``sqrt``, ``rsqrt`` or a
        reciprocal; any other float exponent known at trace time (a number, or a tensor of
        constants: dynamic NTK RoPE's ``base ** (arange(0, dim, 2) / dim)`` with a computed base) as
        ``exp(e * log x)`` (``_pow_exp_log``)."""
        shape, dtype = self._out(node)
        exponent = kw.get("exponent")
        base = kw.get("self")
        if isinstance(base, (int, float)):
            return NotImplemented
        folds = node in self.known  # a value computed from constants alone stays a folded constant
        if isinstance(exponent, torch.fx.Node):
            value = self._value(exponent)
            if isinstance(value, Scalar):
                exponent = value.value
            else:
                known = self.known.get(exponent)
                if known is None or not dtype.is_float or folds:
                    return NotImplemented
                return self._pow_exp_log(self._op(base, dtype), _to_numpy(known), node, shape, dtype)
        x = self._op(base, dtype)
        e = float(exponent)
        if e == 1:
            return x
        if e == 2:
            return self.b.multiply(x, x)
        if e == 3:
            return self.b.multiply(self.b.multiply(x, x), x)
        if e == 0.5 and dtype.is_float:
            return self.b.sqrt(x)
        if e == -0.5 and dtype.is_float:
            return self.b.rsqrt(x)
        if e == -1 and dtype.is_float:
            return self.b.divide(1.0, x)
        if e == 0:
            return self.b.constant(1.0, dtype, shape=shape)
        if dtype.is_float and not folds:
            return self._pow_exp_log(x, np.asarray(e, np.float32), node, shape, dtype)
        return NotImplemented

    def _pow_exp_log(self, x: Op, exponent: np.ndarray, node: torch.fx.Node, shape: tuple[int, ...],
                     dtype: DType) -> Op:
        """``x ** y`` for exponents known at trace time, as ``exp(y * log|x|)`` on the Scalar
        engine, with torch's values where that differs: a negative base gives NaN for a
        non-integer exponent (``log`` of it) and ``-|x|**y`` for an odd one; ``x ** 0`` is 1 for
        every ``x``. A zero base gives 0 (``exp(-inf)``) for positive exponents, inf for negative
        ones, as torch. Rounding: the FP32 product ``y * log|x|`` carries a relative error of
        ~``|y log x|`` ulps into the result (torch's ``pow`` rounds once)."""
        y = np.asarray(exponent, np.float32)
        integer = y == np.round(y)
        odd = integer & (np.abs(np.fmod(y, 2)) == 1)
        zero = y == 0
        if y.ndim == 0:
            e: Op | float = float(y)
        else:
            e = self.b.weight(f"{node.name}_exponent", tuple(y.shape), dtype, array=y)
            e.attrs["qualified_name"] = f"{node.name}_exponent"
        log = self.b.log(self.b.abs(x) if integer.any() else x)
        out = self.b.broadcast_to(self.b.exp(self.b.multiply(log, e)), shape)
        if integer.any() and (odd.any() or not integer.all()):
            # a negative base: -r where the exponent is odd, NaN where it is not an integer
            factor = np.where(odd, -1.0, np.where(integer, 1.0, np.nan)).astype(np.float32)
            signed = self.b.multiply(out, float(factor) if factor.ndim == 0 else self.b.weight(
                f"{node.name}_sign", tuple(factor.shape), dtype, array=factor))
            out = self.b.select(self.b.compare(x, 0.0, "LT"), signed, out)
        if zero.any():
            ones = self.b.constant(1.0, dtype, shape=shape)
            out = ones if zero.all() else self.b.select(self.b.compare(e, 0.0, "EQ"), ones, out)
        return self.b.broadcast_to(out, shape)

    def _aten_where(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        cond = self._pred(kw["condition"])
        a, b = self._operand(kw["self"], dtype), self._operand(kw["other"], dtype)
        if not isinstance(cond, Op):
            chosen = a if cond else b
            return self._as_op(chosen, shape, dtype) if not isinstance(chosen, Op) \
                else self.b.broadcast_to(chosen, shape)
        return self._select(cond, a, b, shape, dtype)

    def _select(self, cond: Op, a: Op | float, b: Op | float, shape: tuple[int, ...],
                dtype: DType) -> Op:
        if not isinstance(a, Op) and not isinstance(b, Op):
            a = self.b.constant(a, dtype, shape=shape)
        return self.b.select(cond, a, b)

    def _aten_masked_fill(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        cond = self._pred(kw["mask"])
        x = self._op(kw["self"], dtype)
        value = self._operand(kw["value"], dtype)
        if not isinstance(cond, Op):
            return self._as_op(value, shape, dtype) if cond else x
        return self._select(cond, value, x, shape, dtype)

    # -- dtype and layout ---------------------------------------------------------------------
    def _identity(self, node: torch.fx.Node) -> Any:
        v = self._value(node.args[0])
        return v

    def _aten__to_copy(self, node: torch.fx.Node, kw: Any) -> Any:
        _shape, dtype = self._out(node)
        v = self._value(kw["self"])
        if isinstance(v, Scalar):
            return Scalar(v.value, dtype)
        return self._cast(v, dtype)

    _aten_to = _aten__to_copy
    _aten_type_as = _aten__to_copy

    def _aten_copy(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        src = self._operand(kw["src"], dtype)
        return self._as_op(src, shape, dtype) if not isinstance(src, Op) else self.b.broadcast_to(src, shape)

    def _reshape(self, node: torch.fx.Node) -> Any:
        shape, dtype = self._out(node)
        v = self._value(node.args[0])
        if isinstance(v, Scalar) or not isinstance(v, Op):
            return self._as_op(v, shape, dtype) if shape else v
        if v.shape == shape:
            return v
        return self.b.reshape(v, shape)

    def _aten_view(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._reshape(node)

    def _aten_as_strided(self, node: torch.fx.Node, kw: Any) -> Any:
        """``as_strided`` that lays a contiguous tensor's elements out contiguously again (offset 0,
        same count): a reshape. Core ATen's ``adaptive_avg_pool1d`` (Swin's pooler) ends in one.
        Any other striding reads the storage in an order the IR (no strides) cannot express."""
        source = node.args[0]
        size, stride = list(node.args[1]), list(node.args[2])  # type: ignore[arg-type]
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        meta = _meta(source) if isinstance(source, torch.fx.Node) else None
        if not isinstance(meta, torch.Tensor) or (offset or 0) != 0 or not meta.is_contiguous() \
                or meta.numel() != math.prod(size) or not _contiguous_strides(size, stride):
            return NotImplemented
        return self._reshape(node)

    _aten__unsafe_view = _aten_view
    _aten_reshape = _aten_view
    _aten_squeeze = _aten_view
    _aten_unsqueeze = _aten_view
    _aten_flatten = _aten_view
    _aten_unflatten = _aten_view
    _aten_view_copy = _aten_view

    def _aten_expand(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        v = self._value(node.args[0])
        if not isinstance(v, Op):
            return self._as_op(v, shape, dtype)
        return self.b.broadcast_to(v, shape)

    _aten_expand_copy = _aten_expand
    _aten_broadcast_to = _aten_expand

    def _aten_permute(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(node.args[0])
        rank = len(x.shape)
        perm = [_dim(d, rank) for d in _int_list_arg(node.args[1])]
        return self._transpose(x, perm)

    def _transpose(self, x: Op, perm: list[int]) -> Op:
        rank = len(x.shape)
        if perm == list(range(rank)):
            return x
        # moving only size-1 dims is a reshape
        moved = [d for d in perm if x.shape[d] != 1]
        if moved == sorted(moved):
            return self.b.reshape(x, [x.shape[d] for d in perm])
        out = self.b.transpose(x, perm)
        if rank >= 2 and perm == [*range(rank - 2), rank - 1, rank - 2]:
            self.transposed[id(out)] = x
        return out

    def _aten_transpose(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(node.args[0])
        rank = len(x.shape)
        d0, d1 = _dim(_int_arg(node.args[1]), rank), _dim(_int_arg(node.args[2]), rank)
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self._transpose(x, perm)

    def _aten_t(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(node.args[0])
        return self._transpose(x, [1, 0]) if len(x.shape) == 2 else x

    _aten_numpy_T = _aten_t

    def _aten_slice(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(kw["self"])
        rank = len(x.shape)
        dim = _dim(kw.get("dim", 0), rank)
        n = x.shape[dim]
        start, end, step = kw.get("start"), kw.get("end"), kw.get("step", 1) or 1
        start, end, _ = slice(start, end, step).indices(n)
        if start == 0 and end >= n and step == 1:
            return x
        if end <= start:
            return self._unsupported(node, "slice")  # empty result: nothing to place
        starts, limits, strides = [0] * rank, list(x.shape), [1] * rank
        starts[dim], limits[dim], strides[dim] = start, end, step
        return self.b.slice(x, starts, limits, strides)

    def _aten_select(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, _ = self._out(node)
        x = self._op(kw["self"])
        rank = len(x.shape)
        dim = _dim(kw["dim"], rank)
        index = kw["index"] % x.shape[dim]
        starts, limits = [0] * rank, list(x.shape)
        starts[dim], limits[dim] = index, index + 1
        sliced = x if x.shape[dim] == 1 else self.b.slice(x, starts, limits)
        return self.b.reshape(sliced, shape)

    def _aten_cat(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        tensors = [t for t in kw["tensors"] if math.prod(_meta(t).shape) > 0 or len(kw["tensors"]) == 1]
        ops = [self._op(t, dtype) for t in tensors]
        if len(ops) == 1:
            return ops[0]
        return self.b.concatenate(ops, _dim(kw.get("dim", 0), len(shape)))

    _aten_concat = _aten_cat

    def _split(self, x: Op, dim: int, sizes: list[int]) -> tuple[Op, ...]:
        rank = len(x.shape)
        parts, start = [], 0
        for size in sizes:
            if start == 0 and size == x.shape[dim]:
                parts.append(x)
            else:
                starts, limits = [0] * rank, list(x.shape)
                starts[dim], limits[dim] = start, start + size
                parts.append(self.b.slice(x, starts, limits))
            start += size
        return tuple(parts)

    def _aten_split_with_sizes(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(kw["self"])
        return self._split(x, _dim(kw.get("dim", 0), len(x.shape)), list(kw["split_sizes"]))

    def _aten_split(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(kw["self"])
        dim = _dim(kw.get("dim", 0), len(x.shape))
        size = kw["split_size"]
        if not isinstance(size, int):
            return self._split(x, dim, list(size))
        n = x.shape[dim]
        return self._split(x, dim, [min(size, n - s) for s in range(0, n, size)])

    def _aten_repeat(self, node: torch.fx.Node, kw: Any) -> Any:
        """``x.repeat(r0, r1, ...)``: broadcast a new dim before each dim, then merge the pairs."""
        shape, _ = self._out(node)
        x = self._op(kw["self"])
        repeats = list(kw["repeats"])
        dims = [1] * (len(repeats) - len(x.shape)) + list(x.shape)
        split = [v for d in dims for v in (1, d)]
        expanded = [v for r, d in zip(repeats, dims) for v in (r, d)]
        out = self.b.broadcast_to(self.b.reshape(x, split), expanded)
        return self.b.reshape(out, shape)

    def _aten_chunk(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(kw["self"])
        dim = _dim(kw.get("dim", 0), len(x.shape))
        n = x.shape[dim]
        size = -(-n // kw["chunks"])
        return self._split(x, dim, [min(size, n - s) for s in range(0, n, size)])

    def _aten_stack(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        dim = _dim(kw.get("dim", 0), len(shape))
        parts = [self._op(t, dtype) for t in kw["tensors"]]
        expanded = [self.b.reshape(p, (*p.shape[:dim], 1, *p.shape[dim:])) for p in parts]
        return expanded[0] if len(expanded) == 1 else self.b.concatenate(expanded, dim)

    def _aten_unbind(self, node: torch.fx.Node, kw: Any) -> Any:
        x = self._op(kw["self"])
        dim = _dim(kw.get("dim", 0), len(x.shape))
        shape = [d for i, d in enumerate(x.shape) if i != dim]
        return tuple(self.b.reshape(p, shape) for p in self._split(x, dim, [1] * x.shape[dim]))

    # -- matmuls ------------------------------------------------------------------------------
    def _untransposed(self, op: Op) -> Op | None:
        """X with ``op == swap_last_two(X)``, when ``op`` is a transpose seen through batch-only
        reshapes and broadcasts; None otherwise (the new views of X are memoised)."""
        if id(op) in self.transposed:
            return self.transposed[id(op)]
        if op.opcode not in ("reshape", "broadcast") or len(op.shape) < 2:
            return None
        src = op.operands[0]
        if len(src.shape) < 2 or src.shape[-2:] != op.shape[-2:]:
            return None
        inner = self._untransposed(src)
        if inner is None:
            return None
        swapped = (*op.shape[:-2], op.shape[-1], op.shape[-2])
        if op.opcode == "reshape":
            result = self.b.reshape(inner, swapped)
        else:
            dims = op.attrs["dims"]
            n = len(op.shape)
            if tuple(dims[-2:]) != (n - 2, n - 1):
                return None
            result = self.b.broadcast(inner, swapped, dims)
        self.transposed[id(op)] = result
        return result

    def _dot(self, a: Op, b: Op, dtype: DType) -> Op:
        """``a @ b`` for equal-rank float operands with equal batch dims."""
        a, b = self._cast(a, dtype), self._cast(b, dtype)
        n = len(a.shape)
        if a.shape[-1] == 1:  # an outer product: a broadcast multiply (no contraction to cast)
            shape = (*a.shape[:-2], a.shape[-2], b.shape[-1])
            col = self.b.broadcast(self.b.reshape(a, a.shape[:-1]), shape,
                                   (*range(n - 2), n - 2))
            row = self.b.broadcast(self.b.reshape(b, (*b.shape[:-2], b.shape[-1])), shape,
                                   (*range(n - 2), n - 1))
            return self.b.multiply(col, row)
        lhs_contract, rhs_contract = -1, -2
        ua = self._untransposed(a)
        if ua is not None:
            a, lhs_contract = ua, -2
        ub = self._untransposed(b)
        if ub is not None:
            b, rhs_contract = ub, -1
        return self.b.dot(a, b, lhs_contract=lhs_contract, rhs_contract=rhs_contract)

    def _aten_mm(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        if not dtype.is_float:
            return NotImplemented
        return self._dot(self._op(kw["self"]), self._op(kw["mat2"]), dtype)

    _aten_bmm = _aten_mm

    def _aten_addmm(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        if not dtype.is_float:
            return NotImplemented
        out = self._dot(self._op(kw["mat1"]), self._op(kw["mat2"]), dtype)
        alpha, beta = kw.get("alpha", 1), kw.get("beta", 1)
        if alpha != 1:
            out = self.b.multiply(out, float(alpha))
        if beta == 0:
            return out
        bias = self._operand(kw["self"], dtype)
        if beta != 1:
            bias = bias * beta if isinstance(bias, float) else self.b.multiply(bias, float(beta))
        return self._emit_binary("add", out, bias, shape, dtype)

    def _aten_matmul(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        a, b = self._op(kw["self"]), self._op(kw["other"])
        return self._matmul(a, b, shape, dtype)

    def _matmul(self, a: Op, b: Op, shape: tuple[int, ...], dtype: DType) -> Any:
        if not dtype.is_float:
            return NotImplemented
        if len(a.shape) == 1 or len(b.shape) == 1:
            a2 = self.b.reshape(a, (1, a.shape[0])) if len(a.shape) == 1 else a
            b2 = self.b.reshape(b, (b.shape[0], 1)) if len(b.shape) == 1 else b
            full = self._matmul(a2, b2, (), dtype)
            return self.b.reshape(full, shape)
        if len(b.shape) == 2 and len(a.shape) > 2:  # flatten the batch into rows
            flat = self.b.reshape(a, (-1, a.shape[-1]))
            return self.b.reshape(self._dot(flat, b, dtype), (*a.shape[:-2], a.shape[-2], b.shape[-1]))
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        a = self.b.broadcast_to(a, (*batch, *a.shape[-2:]))
        b = self.b.broadcast_to(b, (*batch, *b.shape[-2:]))
        return self._dot(a, b, dtype)

    def _aten_linear(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        x, w = self._op(kw["input"], dtype), self._op(kw["weight"], dtype)
        flat = self.b.reshape(x, (-1, x.shape[-1])) if len(x.shape) != 2 else x
        out = self.b.dot(flat, w, rhs_contract=-1)
        out = self.b.reshape(out, shape) if out.shape != shape else out
        if kw.get("bias") is not None:
            out = self._emit_binary("add", out, self._operand(kw["bias"], dtype), shape, dtype)
        return out

    # -- reductions and fused ops -------------------------------------------------------------
    def _reduce_dims(self, x: Op, dims: Any) -> list[int]:
        rank = len(x.shape)
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            return list(range(rank))
        if isinstance(dims, int):
            dims = [dims]
        return sorted({_dim(d, rank) for d in dims})

    def _reduce(self, node: torch.fx.Node, kw: Any, kind: str, mean: bool = False) -> Any:
        shape, dtype = self._out(node)
        x = self._op(kw["self"])
        return self._reduce_to(x, self._reduce_dims(x, kw.get("dim")), kind, shape, dtype, mean)

    def _reduce_to(self, x: Op, dims: list[int], kind: str, shape: tuple[int, ...], dtype: DType,
                   mean: bool = False) -> Op:
        x = self._cast(x, dtype)
        if not x.shape:
            return x
        if kind == "min":
            neg = self.b.negate(x) if dtype.is_float else self.b.multiply(x, -1.0)
            out = self.b.reduce(neg, dims, "max")
            out = self.b.negate(out) if dtype.is_float else self.b.multiply(out, -1.0)
        else:
            out = self.b.reduce(x, dims, kind)
        if mean:
            count = math.prod(x.shape[d] for d in dims)
            out = self.b.multiply(out, 1.0 / count)
        return self.b.reshape(out, shape) if out.shape != shape else out

    def _aten_sum(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._reduce(node, kw, "sum")

    def _aten_mean(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        if not dtype.is_float:
            return NotImplemented
        return self._reduce(node, kw, "sum", mean=True)

    def _aten_linalg_vector_norm(self, node: torch.fx.Node, kw: Any) -> Any:
        """The 2-norm (``ord=2``, torch's default) over ``dim``: sqrt(Σ x²) -- weight normalisation
        (wav2vec2's positional convolution, ``nn.utils.parametrizations.weight_norm``),
        ``F.normalize``. Other orders are not lowered."""
        shape, dtype = self._out(node)
        if float(kw.get("ord", 2)) != 2.0 or not dtype.is_float:
            return NotImplemented
        x = self._op(kw["self"], dtype)
        squares = self._reduce_to(self.b.multiply(x, x), self._reduce_dims(x, kw.get("dim")), "sum",
                                  shape, dtype)
        return self.b.sqrt(squares)

    def _aten_amax(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._reduce(node, kw, "max")

    def _aten_amin(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._reduce(node, kw, "min")

    def _aten_max(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._extreme(node, kw, "max")

    def _aten_min(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._extreme(node, kw, "min")

    def _extreme(self, node: torch.fx.Node, kw: Any, kind: str) -> Any:
        """max/min: of two tensors (elementwise), of all elements, or along a dim with indices
        (the values reduce; the indices, when read, are the first position holding the extreme
        value, as ``argmax`` finds it and as torch documents for ties). Before, the indices were
        an unsupported ``aten.max``: ``values, idx = logits.max(-1)``, and every training step
        whose loss reads ``x.max(dim).values`` (its backward scatters the gradient at them)."""
        meta = _meta(node)
        if "other" in kw:
            shape, dtype = self._out(node)
            return self._emit_binary("maximum" if kind == "max" else "minimum",
                                     self._op(kw["self"], dtype), self._operand(kw["other"], dtype),
                                     shape, dtype)
        if isinstance(meta, torch.Tensor):
            return self._reduce(node, kw, kind)
        x = self._op(kw["self"])
        dims = [_dim(kw["dim"], len(x.shape))]
        values = self._reduce_to(x, dims, kind, tuple(meta[0].shape), ir_dtype(meta[0].dtype))
        used = any(u.target is operator.getitem and u.args[1] == 1 for u in node.users)
        if not used:
            return values, None
        if not x.shape:
            return values, self.b.constant(0.0, ir_dtype(meta[1].dtype), shape=tuple(meta[1].shape))
        index = first_index_of_extreme(self, x, dims[0], kind)
        indices = self.b.reshape(self._cast(index, ir_dtype(meta[1].dtype)), tuple(meta[1].shape))
        return values, indices

    def _variance(self, x: Op, dims: list[int], correction: float) -> tuple[Op, Op]:
        """(mean, variance) over ``dims``, both with the reduced dims kept as size 1."""
        keep = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        count = math.prod(x.shape[d] for d in dims)
        mean = self.b.reshape(self.b.multiply(self.b.reduce(x, dims, "sum"), 1.0 / count), keep)
        centred = self.b.subtract(x, self.b.broadcast_to(mean, x.shape))
        sq = self.b.reduce(self.b.multiply(centred, centred), dims, "sum")
        var = self.b.reshape(self.b.multiply(sq, 1.0 / max(count - correction, 1)), keep)
        return mean, var

    def _aten_var(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        dims = self._reduce_dims(x, kw.get("dim"))
        correction = kw.get("correction")
        _, var = self._variance(x, dims, 1.0 if correction is None else float(correction))
        return self.b.reshape(var, shape)

    def _aten_var_mean(self, node: torch.fx.Node, kw: Any) -> Any:
        meta = _meta(node)
        dtype = ir_dtype(meta[0].dtype)
        x = self._op(kw["self"], dtype)
        dims = self._reduce_dims(x, kw.get("dim"))
        correction = kw.get("correction")
        mean, var = self._variance(x, dims, 1.0 if correction is None else float(correction))
        return self.b.reshape(var, tuple(meta[0].shape)), self.b.reshape(mean, tuple(meta[1].shape))

    def _softmax_last(self, x: Op, dim: int) -> tuple[Op, list[int] | None]:
        rank = len(x.shape)
        if dim == rank - 1:
            return x, None
        perm = [d for d in range(rank) if d != dim] + [dim]
        return self.b.transpose(x, perm), perm

    def _aten__softmax(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        if not x.shape:
            return self.b.constant(1.0, dtype, shape=())
        moved, perm = self._softmax_last(x, _dim(kw["dim"], len(x.shape)))
        out = self.b.softmax(moved)
        return out if perm is None else self.b.transpose(out, list(np.argsort(perm)))

    _aten_softmax = _aten__softmax

    def _aten__log_softmax(self, node: torch.fx.Node, kw: Any) -> Any:
        _, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        moved, perm = self._softmax_last(x, _dim(kw["dim"], len(x.shape)))
        last = len(moved.shape) - 1
        m = self.b.broadcast_to(self.b.reshape(self.b.reduce(moved, [last], "max"),
                                               (*moved.shape[:-1], 1)), moved.shape)
        shifted = self.b.subtract(moved, m)
        total = self.b.reduce(self.b.exp(shifted), [last], "sum")
        lse = self.b.broadcast_to(self.b.reshape(self.b.log(total), (*moved.shape[:-1], 1)), moved.shape)
        out = self.b.subtract(shifted, lse)
        return out if perm is None else self.b.transpose(out, list(np.argsort(perm)))

    _aten_log_softmax = _aten__log_softmax

    def _aten_native_layer_norm(self, node: torch.fx.Node, kw: Any) -> Any:
        meta = _meta(node)
        dtype = ir_dtype(meta[0].dtype)
        x = self._op(kw["input"], dtype)
        normalized = list(kw["normalized_shape"])
        eps = float(kw["eps"])
        width = math.prod(normalized)
        flat = self.b.reshape(x, (*x.shape[: len(x.shape) - len(normalized)], width)) \
            if len(normalized) != 1 else x

        def param(arg: Any, fill: float) -> Op:
            if arg is None:
                return self.b.weight(f"{node.name}_{'ones' if fill else 'zeros'}", (width,), dtype,
                                     array=np.full((width,), fill, np.float32))
            op = self._op(arg, dtype)
            return self.b.reshape(op, (width,)) if op.shape != (width,) else op

        gamma, beta = param(kw.get("weight"), 1.0), param(kw.get("bias"), 0.0)
        out = self.b.layer_norm(flat, gamma, beta, eps)
        out = self.b.reshape(out, x.shape) if out.shape != x.shape else out
        used = {u.args[1] for u in node.users if u.target is operator.getitem}
        stats: list[Op | None] = [None, None]
        if used & {1, 2}:
            last = len(flat.shape) - 1
            mean, var = self._variance(flat, [last], 0.0)
            rstd = self.b.rsqrt(self.b.add(var, eps))
            stats = [self.b.reshape(mean, tuple(meta[1].shape)), self.b.reshape(rstd, tuple(meta[2].shape))]
        return out, stats[0], stats[1]

    def _aten_layer_norm(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._aten_native_layer_norm(node, kw)[0]

    # -- gathers, index ranges, masks ----------------------------------------------------------
    def _aten_embedding(self, node: torch.fx.Node, kw: Any) -> Any:
        table = self._op(kw["weight"])
        ids = self._op(kw["indices"], DType.INT32)
        if len(table.shape) != 2:
            return NotImplemented
        return self.b.gather(table, ids)

    def _aten_index_select(self, node: torch.fx.Node, kw: Any) -> Any:
        """``index_select(x, dim, index)``: rows of a 2-D table are one gather; a constant index
        on any dim (XLNet's relative shift) is slices; otherwise ``dim`` is moved first, the rest
        flattened into a row, the rows gathered and the result moved back."""
        shape, _dtype = self._out(node)
        table = self._op(kw["self"])
        rank = len(table.shape)
        dim = _dim(kw["dim"], rank) if rank else 0
        index = kw["index"]
        if rank == 2 and dim == 0:
            return self.b.gather(table, self._op(index, DType.INT32))
        if not rank or len(shape) != rank:
            return NotImplemented
        known = self.known.get(index) if isinstance(index, torch.fx.Node) else None
        if known is not None and known.dtype != torch.bool:
            out = self._constant_index(table, [dim], [known.reshape(-1)], shape)
            if out is not None:
                return out
        ids = self._op(index, DType.INT32)
        if len(ids.shape) != 1:
            ids = self.b.reshape(ids, (math.prod(ids.shape),))
        return take(self.b, table, dim, ids)

    def _aten_flip(self, node: torch.fx.Node, kw: Any) -> Any:
        """``flip(x, dims)`` (wav2vec2's reverse cumsum of its feature mask): ``frontends.flip``."""
        _shape, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        rank = len(x.shape)
        return flip(self.b, x, [_dim(d, rank) for d in kw["dims"]]) if rank else x

    def _aten_index(self, node: torch.fx.Node, kw: Any) -> Any:
        """``x[i0, i1, ...]``: constant strided indices become slices + broadcasts; one runtime
        index into the rows of a 2-D table is a gather; anything else stays unsupported."""
        shape, _dtype = self._out(node)
        x = self._op(kw["self"])
        indices = list(kw["indices"])
        rank = len(x.shape)
        positions = [i for i, ix in enumerate(indices) if ix is not None]
        if not positions:
            return x
        idx_nodes = [indices[i] for i in positions]
        if all(n in self.known and self.known[n].dtype != torch.bool for n in idx_nodes):
            values = [self.known[n] for n in idx_nodes]
            out = self._constant_index(x, positions, values, shape)
            if out is None:
                out = self._constant_takes(node, x, positions, values, shape)
            if out is not None:
                return out
        if positions == [0] and rank == 2 and len(indices) == 1:
            return self.b.gather(x, self._op(idx_nodes[0], DType.INT32))
        gathered = runtime_index(self, x, indices, shape)
        return NotImplemented if gathered is None else gathered

    def _constant_takes(self, node: torch.fx.Node, x: Op, positions: list[int],
                        values: list[torch.Tensor], shape: tuple[int, ...]) -> Op | None:
        """``x[..., i, j, ...]`` at constant positions that are no strided slice, each index
        varying along its own dim of the result in order (an outer product: torch's decompositions
        of reflection / replication padding and ``nearest-exact`` resizes): one
        ``frontends.flip.take_constant`` per indexed dim. None for any other pattern (diagonals)."""
        bshape = tuple(torch.broadcast_shapes(*(v.shape for v in values)))
        if positions != list(range(positions[0], positions[0] + len(positions))) \
                or len(bshape) != len(positions):
            return None
        for k, (pos, v) in enumerate(zip(positions, values)):
            full = v.expand(bshape).to(torch.int64) % x.shape[pos]
            line = full[tuple(slice(None) if d == k else 0 for d in range(len(bshape)))]
            if not bool((full == line.reshape([-1 if d == k else 1 for d in range(len(bshape))])).all()):
                return None
            x = take_constant(self.b, x, pos, line.tolist(), f"{node.name}_positions_{k}")
        return x if tuple(x.shape) == shape else None

    def _constant_index(self, x: Op, positions: list[int], values: list[torch.Tensor],
                        shape: tuple[int, ...]) -> Op | None:
        rank = len(x.shape)
        bshape = tuple(torch.broadcast_shapes(*(v.shape for v in values)))
        # the broadcast index dims land where the indexed dims were when those are adjacent, else first
        adjacent = positions == list(range(positions[0], positions[-1] + 1))
        first = positions[0] if adjacent else 0
        starts, limits, strides = [0] * rank, list(x.shape), [1] * rank
        source_dim_of: dict[int, int] = {}  # output dim -> dim of the sliced x
        for pos, v in zip(positions, values):
            full = v.expand(bshape).to(torch.int64) % x.shape[pos]
            varying = [d for d in range(len(bshape)) if bshape[d] > 1
                       and not bool((full == full.narrow(d, 0, 1)).all())]
            if len(varying) > 1:
                return None
            origin = int(full.reshape(-1)[0].item())
            if not varying:
                starts[pos], limits[pos] = origin, origin + 1
                continue
            d = varying[0]
            idx = [0] * len(bshape)
            seq = [int(full[tuple([*idx[:d], j, *idx[d + 1:]])].item()) for j in range(bshape[d])]
            step = seq[1] - seq[0] if len(seq) > 1 else 1
            if step <= 0 or any(b - a != step for a, b in itertools.pairwise(seq)):
                return None
            if first + d in source_dim_of:
                return None  # two indices varying together: a diagonal, not a slice
            starts[pos], limits[pos], strides[pos] = seq[0], seq[-1] + 1, step
            source_dim_of[first + d] = pos
        sliced = x if (starts == [0] * rank and limits == list(x.shape) and strides == [1] * rank) \
            else self.b.slice(x, starts, limits, strides)
        # drop the indexed dims, remembering where each kept dim goes in the output
        kept: list[tuple[int, int]] = []  # (output dim, sliced dim)
        out_rank = len(shape)
        for dim in range(rank):
            if dim in positions:
                continue
            if adjacent:
                out_dim = dim if dim < first else out_rank - (rank - dim)
            else:
                out_dim = len(bshape) + sum(1 for p in range(dim) if p not in positions)
            kept.append((out_dim, dim))
        kept += [(out_dim, src) for out_dim, src in source_dim_of.items()]
        kept.sort(key=lambda t: t[1])
        order = [src for _, src in kept]
        targets = [out for out, _ in kept]
        reduced = self.b.reshape(sliced, [sliced.shape[d] for d in order]) \
            if len(order) != rank else sliced
        perm = list(np.argsort(targets))
        if perm != list(range(len(perm))):
            reduced = self.b.transpose(reduced, perm)
            targets = sorted(targets)
        if tuple(reduced.shape) == shape:
            return reduced
        return self.b.broadcast(reduced, shape, targets)

    def _aten_arange(self, node: torch.fx.Node, kw: Any) -> Any:
        shape, dtype = self._out(node)
        start = kw.get("start", 0) or 0
        step = kw.get("step", 1) or 1
        out = self.b.iota(shape, 0, dtype)
        if step != 1:
            out = self.b.multiply(out, float(step))
        if start != 0:
            out = self.b.add(out, float(start))
        return out

    def _factory(self, node: torch.fx.Node) -> Any:
        shape, dtype = self._out(node)
        known = self.known.get(node)
        if known is None:
            name = _opname(node)
            if name in ("fill", "full_like", "new_full"):
                value = node.args[1] if name != "new_full" else node.args[2]
                if isinstance(value, torch.fx.Node):
                    return NotImplemented
            elif name in ("ones_like", "new_ones", "ones"):
                value = 1.0
            elif name == "scalar_tensor":
                value = node.args[0]
            else:
                value = 0.0
            known = torch.full((1,), _number_arg(value))
        value = float(known.reshape(-1)[0]) if known.numel() else 0.0
        return Scalar(value, dtype) if not shape else self.b.constant(value, dtype, shape=shape)

    def _aten_triu(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._triangle(node, kw, upper=True)

    def _aten_tril(self, node: torch.fx.Node, kw: Any) -> Any:
        return self._triangle(node, kw, upper=False)

    def _triangle(self, node: torch.fx.Node, kw: Any, upper: bool) -> Any:
        """triu/tril: keep x where col - row >= k (triu) or <= k (tril), else 0."""
        shape, dtype = self._out(node)
        x = self._op(kw["self"], dtype)
        k = int(kw.get("diagonal", 0) or 0)
        rows, cols = shape[-2], shape[-1]
        r = self.b.iota((rows, cols), 0, "int32")
        c = self.b.iota((rows, cols), 1, "int32")
        keep = self.b.compare(self.b.subtract(c, r), float(k), "GE" if upper else "LE")
        return self.b.select(keep, x, self.b.constant(0.0, dtype, shape=shape))


@dataclass(frozen=True)
class _LazyWeight:
    key: str


def _uniform(t: torch.Tensor) -> bool:
    if t.numel() == 0:
        return True
    flat = t.reshape(-1)
    return bool((flat == flat[0]).all())


# -- the frontend protocol ----------------------------------------------------------------------


def convert(fn: Any, example_inputs: Sequence[Any] | dict[str, Any], *,
            autocast: str | None) -> Converted:
    """Export ``fn`` (an ``nn.Module`` or a callable) on the example inputs (a tuple, or a dict of
    keyword inputs) and emit IR."""
    name = type(fn).__name__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", "function")
    examples = dict(example_inputs) if isinstance(example_inputs, dict) else tuple(example_inputs)
    frames = () if isinstance(fn, torch.nn.Module) else _function_frame(fn)
    return from_exported(export(fn, examples), autocast=autocast, name=name, default_frames=frames)


def from_exported(ep: ExportedProgram, *, autocast: str | None = None,
                  name: str | None = None, default_frames: tuple[SourceFrame, ...] = ()
                  ) -> Converted:
    """IR for an ``ExportedProgram`` (e.g. from ``torch.export.load``). Core ATen
    (``ep.run_decompositions()``) is what ``convert`` produces; the un-decomposed ATen of
    ``torch.export.export`` (``linear``, ``matmul``, ``silu``, ``triu`` ...) is understood too."""
    name = name or "model"
    load_handlers()
    converter = _Converter(ep, name, autocast, default_frames)
    graph, results, out_meta = converter.run()
    in_meta = [(_meta(n).dtype, n.name) for n in converter.user_inputs]
    out_spec = ep.call_spec.out_spec
    builtin = _is_builtin_spec(out_spec)

    def to_arrays(inputs: Sequence[Any]) -> list[np.ndarray]:
        if converter.meta_weights:
            raise TraceError(f"{name} has weights on the meta device ({converter.meta_weights[0]}"
                             f"{' ...' if len(converter.meta_weights) > 1 else ''}): shapes only, "
                             f"so it runs timing-only (TracedModel.timing_only()), not on inputs")
        leaves = [x for x in pytree.tree_leaves(tuple(inputs))
                  if isinstance(x, (torch.Tensor, np.ndarray))]
        if len(leaves) != len(in_meta):
            names = ", ".join(n for _, n in in_meta)
            raise TraceError(f"{name} was traced with {len(in_meta)} tensor input"
                             f"{'s' if len(in_meta) != 1 else ''} ({names}); {len(leaves)} given")
        arrays = []
        for value, (dtype, arg) in zip(leaves, in_meta):
            tensor = torch.as_tensor(value)
            if tensor.dtype != dtype:
                raise TraceError(f"input {arg!r}: dtype {str(tensor.dtype).replace('torch.', '')} "
                                 f"given, traced with {str(dtype).replace('torch.', '')}")
            arrays.append(_to_numpy(tensor))
        return arrays

    def from_arrays(arrays: list[np.ndarray]) -> Any:
        leaves = []
        for result, meta in zip(results, out_meta):
            if meta is None:
                leaves.append(result)
            else:
                dtype, shape = meta
                tensor = _from_numpy(arrays[result], dtype)
                # a 0-d output comes back as [1]; bucketed outputs are already cut to their length
                leaves.append(tensor.reshape(shape) if tensor.dim() != len(shape) else tensor)
        if builtin:
            return pytree.tree_unflatten(leaves, out_spec)
        return tuple(leaves)

    return Converted(graph=graph, to_arrays=to_arrays, from_arrays=from_arrays,
                     shapes_only=bool(converter.meta_weights))


def _is_builtin_spec(spec: Any) -> bool:
    if spec.is_leaf():
        return True
    if spec.type not in (tuple, list, dict) and not (
            isinstance(spec.type, type) and issubclass(spec.type, tuple) and hasattr(spec.type, "_fields")):
        return False
    return all(_is_builtin_spec(child) for child in spec.children())


def resize(example_inputs: Sequence[Any] | dict[str, Any], dim: int,
           length: int) -> Any:
    """Inputs whose ``dim`` has the first input's length, zero-padded (or cut) to ``length``
    (a dict of keyword inputs stays a dict)."""
    if isinstance(example_inputs, dict):
        resized = resize(tuple(example_inputs.values()), dim, length)
        return dict(zip(example_inputs, resized))
    inputs = tuple(example_inputs)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors or tensors[0].dim() <= dim:
        raise TraceError(f"cannot bucket dim {dim}: the first input has no such dimension")
    current = tensors[0].shape[dim]
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > dim and x.shape[dim] == current:
            if length <= current:
                x = x.narrow(dim, 0, length)
            else:
                pad_shape = list(x.shape)
                pad_shape[dim] = length - current
                x = torch.cat([x, torch.zeros(pad_shape, dtype=x.dtype)], dim=dim)
        out.append(x)
    return tuple(out)


__all__ = ["Scalar", "convert", "export", "from_exported", "is_shapes_only", "layer_path",
           "meta_parameters", "resize", "stack_frames"]
