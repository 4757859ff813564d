"""``trace`` and ``check``: run PyTorch modules and JAX functions on the execution core.

    model = neuroncore.trace(torch_module, (x,))       # torch.export -> HLO-level IR -> program
    y = model(x)                                        # a torch tensor, computed on the core
    neuroncore.check(torch_module, (x,))                # unsupported ops, nothing executed

The frontend is picked from the example inputs' types; each frontend module (``torch_frontend``,
``jax_frontend``) is imported only when its framework's values are passed, so neither framework is
needed to use the other. As on real Neuron, shapes are static: a call with a shape that was not
compiled is an error, unless ``buckets`` compiled one program per size of ``bucket_dim`` (inputs are
zero-padded to the smallest bucket that fits; attention masks use the 1 = attend convention, so
padded positions are masked, and outputs are cut back).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler import unsupported_ops
from neuroncore.compiler.options import AutoCast, CompilerOptions
from neuroncore.compiler.program import Program
from neuroncore.dtypes import DType
from neuroncore.ir.graph import Graph, Op
from neuroncore.runtime import Instance


class TraceError(ValueError):
    """A program that cannot be traced (export failure, data-dependent control flow, bad inputs)."""


@dataclass
class Converted:
    """A framework program as IR, with adapters between the framework's values and NumPy."""

    graph: Graph
    to_arrays: Callable[[Sequence[Any]], list[np.ndarray]]  # user inputs -> one array per parameter
    from_arrays: Callable[[list[np.ndarray]], Any]  # output arrays -> the framework's outputs
    # weights without values (a PyTorch model built on the meta device): it runs timing-only
    shapes_only: bool = False


class Frontend(Protocol):
    """What a framework frontend module provides (as module-level functions)."""

    def convert(self, fn: Any, example_inputs: Sequence[Any], *, autocast: str | None) -> Converted:
        """Trace ``fn`` on the example inputs into IR (weights become constants)."""
        ...

    def resize(self, example_inputs: Sequence[Any], dim: int, length: int) -> tuple[Any, ...]:
        """Example inputs whose ``dim`` has the first input's length, zero-padded/cut to ``length``."""
        ...


FRONTEND_MODULES = {"torch": "neuroncore.frontends.torch_frontend",
                    "jax": "neuroncore.frontends.jax_frontend", "jaxlib": "neuroncore.frontends.jax_frontend"}


def _leaves(value: Any) -> Iterator[Any]:
    """Values inside nested lists, tuples and dicts (the inputs' pytree leaves)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


def frontend_for(example_inputs: Sequence[Any]) -> Any:
    """The frontend module for these example inputs (by the package their leaves' types come from)."""
    for value in _leaves(tuple(example_inputs)):
        package = type(value).__module__.split(".")[0]
        if package in FRONTEND_MODULES:
            return importlib.import_module(FRONTEND_MODULES[package])
    kinds = ", ".join(sorted({type(v).__name__ for v in _leaves(tuple(example_inputs))})) or "no inputs"
    raise TraceError(f"example inputs must be torch tensors or JAX arrays, got {kinds}")


@dataclass(frozen=True, eq=False)
class UnsupportedOp:
    """One op ``check`` found the core cannot run. Printed -- alone or in the list ``check`` returns --
    as ``sort.3 (sort) at model/layers.0/sort [model.py:42]``: what it is, which layer, which line, as
    README promises; the IR op itself is ``op``."""

    op: Op

    @property
    def opcode(self) -> str:
        return self.op.opcode

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def layer(self) -> str:
        return self.op.layer

    @property
    def source(self) -> str:
        """``file:line`` of the innermost user frame, or ``<unknown>``."""
        return self.op.source

    @property
    def shape(self) -> tuple[int, ...]:
        return self.op.shape

    @property
    def dtype(self) -> DType:
        return self.op.dtype

    @property
    def attrs(self) -> dict[str, Any]:
        return self.op.attrs

    def __str__(self) -> str:
        return self.op.describe()

    def __repr__(self) -> str:
        return f"UnsupportedOp({self.op.describe()})"


def _examples(example_inputs: Sequence[Any] | Mapping[str, Any]) -> Any:
    """Positional example inputs as a tuple; keyword ones (a dict, PyTorch only) as a dict."""
    if isinstance(example_inputs, Mapping):
        if not all(isinstance(k, str) for k in example_inputs):
            raise TraceError("keyword example inputs need string keys (the argument names)")
        return dict(example_inputs)
    return tuple(example_inputs)


def _frontend(examples: Any) -> Any:
    frontend = frontend_for([examples] if isinstance(examples, dict) else examples)
    if isinstance(examples, dict) and not frontend.__name__.endswith("torch_frontend"):
        raise TraceError("keyword example inputs (a dict) are for PyTorch modules; pass JAX "
                         "arrays positionally")
    return frontend


LEAF_OPCODES = frozenset({"parameter", "constant"})  # inputs and weights: not ops to cover


@dataclass(frozen=True)
class OpCount:
    """One row of a coverage table: an IR opcode, how many ops of it the model has, whether the
    core runs it (unsupported framework ops keep their framework name: ``aten.sort``, ``sort``)."""

    opcode: str
    count: int
    supported: bool


@dataclass(frozen=True)
class Coverage:
    """What ``neuroncore check`` prints for one model: every opcode with its count, and the
    unsupported ops one by one (with layer and file:line)."""

    frontend: str
    rows: tuple[OpCount, ...]
    unsupported: tuple[UnsupportedOp, ...]

    @property
    def total(self) -> int:
        return sum(r.count for r in self.rows)

    @property
    def unsupported_count(self) -> int:
        return len(self.unsupported)


def coverage(fn: Any, example_inputs: Sequence[Any] | Mapping[str, Any]) -> Coverage:
    """The model's ops by opcode (supported first, then unsupported; most frequent first), without
    inputs and weights; nothing is compiled or executed."""
    examples = _examples(example_inputs)
    frontend = _frontend(examples)
    converted = frontend.convert(fn, examples, autocast=None)
    missing = [UnsupportedOp(op) for op in unsupported_ops(converted.graph)]
    missing_codes = {m.opcode for m in missing}
    counts: dict[str, int] = {}
    for op in converted.graph.ops:
        if op.opcode not in LEAF_OPCODES:
            counts[op.opcode] = counts.get(op.opcode, 0) + 1
    rows = sorted((OpCount(code, n, code not in missing_codes) for code, n in counts.items()),
                  key=lambda r: (not r.supported, -r.count, r.opcode))
    name = frontend.__name__.rsplit(".", 1)[-1].replace("_frontend", "")
    return Coverage(name, tuple(rows), tuple(missing))


def check(fn: Any, example_inputs: Sequence[Any] | Mapping[str, Any]) -> list[UnsupportedOp]:
    """Every op the compiler cannot lower, with its layer and source line; nothing is executed.
    ``example_inputs`` is a tuple (positional) or, for PyTorch, a dict of keyword inputs."""
    examples = _examples(example_inputs)
    converted = _frontend(examples).convert(fn, examples, autocast=None)
    return [UnsupportedOp(op) for op in unsupported_ops(converted.graph)]


def _with_length(value: np.ndarray, dim: int, length: int) -> np.ndarray:
    if dim >= value.ndim or value.shape[dim] == length:
        return value
    if value.shape[dim] > length:
        return np.take(value, np.arange(length), axis=dim)
    pad = [(0, 0)] * value.ndim
    pad[dim] = (0, length - value.shape[dim])
    return np.pad(value, pad)


class Runnable(Protocol):
    """What a traced variant runs on: one loaded model, a tensor-parallel group, or replicas."""

    def execute(self, inputs: Any = None, *, timing_only: bool = False) -> Any:
        ...


@dataclass
class _Variant:
    length: int | None
    converted: Converted
    program: Program
    model: Runnable
    shapes: list[tuple[int, ...]]


@dataclass
class TracedModel:
    """A compiled framework program: call it like the original with inputs of the traced shapes."""

    frontend: Any
    variants: list[_Variant]
    bucket_dim: int
    last_result: Any = field(default=None)  # ExecutionResult, or a GroupResult when sharded
    keywords: tuple[str, ...] | None = None  # traced with keyword inputs: their names, in order

    @property
    def graph(self) -> Graph:
        return self.variants[0].converted.graph

    @property
    def program(self) -> Program:
        return self.variants[0].program

    @property
    def programs(self) -> dict[int | None, Program]:
        return {v.length: v.program for v in self.variants}

    @property
    def shapes_only(self) -> bool:
        """True when the weights have shapes but no values (a PyTorch model built on
        ``torch.device("meta")``): only :meth:`timing_only` runs it."""
        return self.variants[0].converted.shapes_only

    def timing_only(self, length: int | None = None) -> Any:
        """One execution with the cost model alone: shapes only, no inputs, no weights allocated
        (the runtime's ``execute(timing_only=True)``); the variant of bucket ``length`` (default:
        the first). Returns the ExecutionResult (a GroupResult when sharded), also kept in
        ``last_result``; its ``device_time_ns`` is the simulated latency."""
        variant = self.variants[0]
        if length is not None:
            chosen = next((v for v in self.variants if v.length == length), None)
            if chosen is None:
                sizes = ", ".join(str(v.length) for v in self.variants)
                raise TraceError(f"no bucket of length {length} (compiled: {sizes or 'none'})")
            variant = chosen
        self.last_result = variant.model.execute(timing_only=True)
        return self.last_result

    def _positional(self, inputs: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, ...]:
        """Inputs in the traced order: positional ones first, then keywords by name."""
        if self.keywords is None:
            if named:
                raise TraceError(f"traced with positional inputs; keyword inputs "
                                 f"({', '.join(named)}) given")
            return inputs
        if len(inputs) > len(self.keywords):
            raise TraceError(f"traced with {len(self.keywords)} inputs "
                             f"({', '.join(self.keywords)}); {len(inputs)} given")
        values = dict(zip(self.keywords, inputs))
        for key, value in named.items():
            if key not in self.keywords or key in values:
                why = "given twice" if key in values else "was not traced"
                raise TraceError(f"input {key!r} {why} (traced: {', '.join(self.keywords)})")
            values[key] = value
        missing = [k for k in self.keywords if k not in values]
        if missing:
            raise TraceError(f"missing input{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
        return tuple(values[k] for k in self.keywords)

    def __call__(self, *inputs: Any, **named: Any) -> Any:
        """Run on the core: inputs positionally, or (when traced with a dict) by name too."""
        inputs = self._positional(inputs, named)
        variant = self.variants[0]
        arrays = variant.converted.to_arrays(inputs)
        given = [tuple(a.shape) for a in arrays]
        length = None
        if variant.length is not None:
            length = _sequence_length(arrays, variant, self.bucket_dim)
            fitting = [(v, v.length) for v in self.variants if v.length is not None and v.length >= length]
            if not fitting:
                sizes = ", ".join(str(v.length) for v in self.variants)
                raise TraceError(f"sequence length {length} is larger than every bucket ({sizes})")
            variant, bucket = fitting[0]
            arrays = [_with_length(a, self.bucket_dim, bucket)
                      if a.ndim > self.bucket_dim and a.shape[self.bucket_dim] == length else a
                      for a in arrays]
        if [tuple(a.shape) for a in arrays] != variant.shapes:
            raise TraceError(f"inputs of shapes {given} given; compiled for {variant.shapes}")
        result = variant.model.execute(arrays)
        self.last_result = result
        outputs = result.outputs or []
        if length is not None and variant.length != length:
            outputs = [self._cut(o, k, variant, length) for k, o in enumerate(outputs)]
        return variant.converted.from_arrays(outputs)

    def _cut(self, value: np.ndarray, k: int, variant: _Variant, length: int) -> np.ndarray:
        """Output ``k`` of ``variant`` cut back to the call's ``length`` along every dim that grows
        with the bucket: with several buckets, a dim that is each bucket's length in its program
        (a KV cache's positions, ``[batch, heads, positions, head_dim]``, not only ``bucket_dim``);
        with one bucket, ``bucket_dim`` where it has the bucket's length."""
        dims = {self.bucket_dim} if value.ndim > self.bucket_dim else set()
        if len(self.variants) > 1:
            shapes = [(v.length, v.converted.graph.outputs[k].shape) for v in self.variants]
            dims = {d for d in range(value.ndim)
                    if all(len(shape) == value.ndim and shape[d] == bucket for bucket, shape in shapes)}
        for d in sorted(dims):
            if value.shape[d] == variant.length:
                value = _with_length(value, d, length)
        return value


def _sequence_length(arrays: list[np.ndarray], variant: _Variant, dim: int) -> int:
    lengths = {a.shape[dim] for a, s in zip(arrays, variant.shapes)
               if a.ndim > dim and len(s) > dim and s[dim] == variant.length}
    if len(lengths) != 1:
        raise TraceError(f"inputs disagree on the length of dim {dim}: {sorted(lengths)}")
    return lengths.pop()


def trace(fn: Any, example_inputs: Sequence[Any] | Mapping[str, Any], *,
          instance: str | Instance | None = None, dtype: str | None = None,
          buckets: Sequence[int] | None = None, bucket_dim: int = 1,
          core: int = 0, tp_degree: int = 1, replicas: int = 1,
          options: CompilerOptions | None = None) -> TracedModel:
    """Compile ``fn`` (a torch module or a JAX-traceable function) for one core of ``instance``.

    ``dtype="bf16"`` auto-casts matmuls to bf16 with FP32 accumulation (``--auto-cast matmult``);
    anything else runs in the model's own dtypes. ``options`` (a ``CompilerOptions``) chooses any
    other auto-cast (``AutoCast.MATMULT``/``ALL`` to BF16, FP16, TF32 or FP8_E4M3) and int8
    weight-only quantisation (``Quantization.INT8_WEIGHT_ONLY``). Unsupported ops fail with the full
    list.
    ``example_inputs`` is a tuple, or for PyTorch a dict of keyword inputs
    (``{"input_ids": ids, "attention_mask": mask}``, as ``model(**inputs)`` is called); the traced
    model then takes them by name or positionally in that order.
    ``instance`` is an instance type, or an :class:`Instance` whose cores already hold other programs
    (programs that share device-resident state, such as a decoder's bucket programs, load on one).
    ``tp_degree=N`` shards the model Megatron-style over N cores from ``core`` on
    (``neuroncore.parallel``); ``replicas=K`` loads K such copies on the following cores and sends
    each call to the copy that is free first (data parallelism).
    """
    if dtype not in (None, "fp32", "bf16"):
        raise TraceError(f"dtype must be 'fp32' or 'bf16', not {dtype!r}; other precisions: options="
                         f"CompilerOptions(auto_cast=AutoCast.MATMULT, auto_cast_type=AutoCastType.FP16 "
                         f"(or TF32, FP8_E4M3)) or quantize=Quantization.INT8_WEIGHT_ONLY")
    if options is not None and not isinstance(options, CompilerOptions):
        raise TraceError(f"options must be a CompilerOptions, not {type(options).__name__}")
    if dtype == "bf16" and options is not None and options.auto_cast is not AutoCast.NONE:
        raise TraceError("dtype='bf16' is an auto-cast already; give the auto-cast in options only")
    for name, value in (("tp_degree", tp_degree), ("replicas", replicas)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TraceError(f"{name} must be a positive integer, not {value!r}")
    autocast = "bf16" if dtype == "bf16" else None
    examples = _examples(example_inputs)
    frontend = _frontend(examples)
    inst = instance if isinstance(instance, Instance) else Instance(instance)
    variants: list[_Variant] = []
    lengths: Sequence[int | None] = sorted(set(buckets)) if buckets else [None]
    for length in lengths:
        inputs = examples if length is None else frontend.resize(examples, bucket_dim, length)
        converted = frontend.convert(fn, inputs, autocast=autocast)
        program, model = _load(converted.graph, inst, core, tp_degree, replicas, options)
        shapes = [tuple(p.shape) for p in converted.graph.parameters]
        variants.append(_Variant(length, converted, program, model, shapes))
    keywords = tuple(examples) if isinstance(examples, dict) else None
    return TracedModel(frontend, variants, bucket_dim, keywords=keywords)


def _load(graph: Graph, inst: Instance, core: int, tp_degree: int,
          replicas: int, options: CompilerOptions | None = None) -> tuple[Program, Runnable]:
    """Compile and load on one core, or sharded over ``tp_degree`` cores, ``replicas`` times."""
    if tp_degree == 1 and replicas == 1:
        program = compile_graph(graph, inst.spec.chip.core, options)
        return program, inst.core(core).load(program)
    from neuroncore.parallel import DataParallelModel, ShardingError, TensorParallelModel, shard
    from neuroncore.parallel.group import check_placement
    from neuroncore.topology import instance_topology

    try:
        check_placement(instance_topology(inst.name, nodes=inst.nodes), tp_degree, core, replicas)
        sharded = shard(graph, tp_degree)
        program = compile_graph(sharded.local, inst.spec.chip.core, options)
        copies = [TensorParallelModel(sharded, program, inst, first_rank=core + k * tp_degree)
                  for k in range(replicas)]
    except ShardingError as exc:
        raise TraceError(str(exc)) from None
    return program, copies[0] if replicas == 1 else DataParallelModel(copies)


__all__ = ["Converted", "Coverage", "OpCount", "TraceError", "TracedModel", "UnsupportedOp", "check",
           "coverage", "frontend_for", "trace"]
