"""``NeuronCausalLM``: a Hugging Face causal LM generating on the execution core, served the way
transformers-neuronx serves one.

    gen = NeuronCausalLM(model, n_positions=(128, 256, 512), batch_size=2, tp_degree=2)
    ids = gen.generate(input_ids, attention_mask, max_new_tokens=32)          # like model.generate
    gen.last_timing.ttft_ns, gen.last_timing.tpot_ns                         # simulated latency

* **Context encoding** (prefill): the prompt, right-padded to the smallest ``context_length_estimate``
  bucket, runs once; it returns the logits of each row's last prompt token and writes every
  layer's keys and values into the KV cache **on the device**.
* **Token generation**: each new token runs the program of the smallest ``n_positions`` bucket that
  holds its context. The program reads the leading ``bucket`` positions of the resident cache, attends
  over them (slots not yet written and the prompt's padding are masked), and writes its token's
  keys and values into the cache slot in place (``index_copy``: the scatter ops of
  ``frontends/torch_scatter.py``). Only the token, its position, the mask and the slot go to the
  device, and only the logits come back (``neuroncore.runtime.state``).
* One program per phase and bucket, each compiled on first use (or all by :meth:`to_neuron`) and
  kept; all load on the same cores, which hold the cache.

The traced programs are the model's own forward (``model.base_model`` with a ``DynamicCache`` of the
bucket's cached positions, then the output embedding on the last hidden state), so any family whose
forward takes ``position_ids`` and ``past_key_values`` works with its default settings. Every
execution is an ordinary one on the core: ``neuron-profile capture`` records one per step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np
import torch

from neuroncore.compiler.options import CompilerOptions
from neuroncore.dtypes import DType
from neuroncore.frontends.tracing import TracedModel, TraceError, trace
from neuroncore.generation.buckets import BucketError, normalize_buckets, select_bucket
from neuroncore.generation.heads import with_heads_for
from neuroncore.generation.sampling import Processors, Sampling, SamplingError, next_tokens, process_logits
from neuroncore.generation.windows import SLIDING, AttentionWindows, WindowError, attention_windows
from neuroncore.parallel.heads import HeadLayout
from neuroncore.runtime import Instance, StateBinding
from neuroncore.runtime.device import ExecutionResult, LoadedModel, NeuronCore
from neuroncore.runtime.host_io import request_latency_ns

_IDS = itertools.count()
_M = TypeVar("_M", bound=torch.nn.Module)


_TORCH_FLOATS = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}


class GenerationError(ValueError):
    """A generation that cannot run as asked (batch, lengths, model family), in one line."""


class Phase(StrEnum):
    """transformers-neuronx's two kinds of program."""

    CONTEXT_ENCODING = "context_encoding"  # the prompt: prefill, time to first token
    TOKEN_GENERATION = "token_generation"  # one new token per sequence: a decode step


@dataclass(frozen=True)
class StepTiming:
    """One execution of a generation: its program (phase, bucket), the context it attended over,
    its simulated device time and what crossed between host and device."""

    phase: Phase
    bucket: int
    context: int
    start_ns: int
    device_time_ns: int
    latency_ns: int  # as the host sees it: launch, input copy, execution, output copy (host_io),
    # in whole ns as every time the core reports (device_time_ns, the records' timestamps)
    execution_ids: tuple[int, ...]  # one per rank
    model_ids: tuple[int, ...]  # the loaded program on each rank: which bucket's program ran
    host_to_device_bytes: int
    device_to_host_bytes: int


@dataclass(frozen=True)
class GenerationTiming:
    """The steps of one ``generate`` call, in order (the first is the context encoding)."""

    steps: tuple[StepTiming, ...]

    @property
    def ttft_ns(self) -> int:
        """Time to first token: the context encoding's latency as the host sees it
        (``neuroncore.runtime.host_io.request_latency_ns``, as ``bench/llm_decode.py`` reports it)."""
        return self.steps[0].latency_ns

    @property
    def token_steps(self) -> tuple[StepTiming, ...]:
        return tuple(s for s in self.steps if s.phase is Phase.TOKEN_GENERATION)

    @property
    def tpot_ns(self) -> int:
        """Time per output token: the mean latency of the token-generation steps, rounded to whole ns
        (0 when the generation made one token, which the context encoding produced)."""
        steps = self.token_steps
        return round(sum(s.latency_ns for s in steps) / len(steps)) if steps else 0

    @property
    def per_token_ns(self) -> list[int]:
        """Latency behind each output token: the prefill's for the first, then each step's."""
        return [s.latency_ns for s in self.steps]

    @property
    def device_ns(self) -> list[int]:
        """The simulated device time of each step (what a device profile of it shows)."""
        return [s.device_time_ns for s in self.steps]

    @property
    def buckets(self) -> list[int]:
        """The bucket of the program each step ran (the context encoding's first)."""
        return [s.bucket for s in self.steps]


def _cache_tensors(cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's keys and values of a transformers cache ([batch, kv heads, positions, dim])."""
    if hasattr(cache, "layers"):
        return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    return list(cache.key_cache), list(cache.value_cache)


class _LastToken(torch.nn.Module):
    """Each row's hidden state at its ``last`` prompt position (a one-hot sum over the bucket, as
    transformers-neuronx's ``last_token_id`` picks it before the output embedding). A module of its
    own so its ops are a layer in profiles (``model/last_token``), not loose ops at the top."""

    def forward(self, hidden: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        if last is None:  # a token-generation step: its one token is the last position
            return hidden[:, -1]
        pick = (torch.arange(hidden.shape[1]) == last[:, None]).to(hidden.dtype)
        return (hidden * pick[:, :, None]).sum(1)


class _CacheWrite(torch.nn.Module):
    """The token's keys and values written into the cache at ``slots`` (``model/kv_cache_write``)."""

    def forward(self, cache: tuple[torch.Tensor, ...], new: list[torch.Tensor], slots: torch.Tensor,
                width: int) -> list[torch.Tensor]:
        return [torch.index_copy(old, 2, slots, fresh[:, :, -width:]) for old, fresh in zip(cache, new)]


class _Program(torch.nn.Module):
    """A program over a transformers causal LM whose modules keep the model's own names: its base
    model and output embedding are registered under the attribute names the model gives them
    (``model`` and ``lm_head`` for Llama, ``transformer`` for GPT-2), so layer paths in profiles
    read as a trace of the model itself does (``model/model/layers.0/self_attn``), not through
    this wrapper."""

    def __init__(self, model: Any, select: bool, windows: AttentionWindows | None = None) -> None:
        super().__init__()
        self.windows = windows  # sliding windows: the program builds the masks (generation/windows.py)
        children = dict(model.named_children())
        head = model.get_output_embeddings()
        self._base_name = str(model.base_model_prefix)
        self._head_name = next((n for n, m in children.items() if m is head), "lm_head")
        if self._base_name == self._head_name or children.get(self._base_name) is not model.base_model:
            self._base_name = "base_model"  # not a direct child: a name of its own
        self.add_module(self._base_name, model.base_model)
        self.add_module(self._head_name, head)
        self.select = select  # return the greedy token (on-device generation), not the logits
        self.last_token = _LastToken()
        self.kv_cache_write = _CacheWrite()

    def base(self, **kwargs: Any) -> Any:
        return getattr(self, self._base_name)(**kwargs)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = getattr(self, self._head_name)(hidden)
        return torch.argmax(logits, dim=-1) if self.select else logits


class _ContextEncoding(_Program):
    """The prompt: all layers over the bucket, the logits of each row's ``last`` position and
    every layer's keys, then values (written into the resident cache)."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                last: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.windows is None:
            out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=True)
        else:  # a cache of every position (not the model's sliding layers), masks built here
            from transformers import DynamicCache

            out = self.base(input_ids=input_ids, attention_mask=self.windows.prefill(attention_mask),
                            position_ids=position_ids, past_key_values=DynamicCache(), use_cache=True)
        logits = self.head(self.last_token(out.last_hidden_state, last))
        keys, values = _cache_tensors(out.past_key_values)
        return (logits, *keys, *values)


class _RollingContextEncoding(_ContextEncoding):
    """The prompt into a rolling cache of ``window`` slots: each layer's keys and values of the
    positions ``keep`` names (slot s holds position ``keep[s]``, -1: none), so the cache holds the
    prompt's last ``window`` positions at slot ``position % window``. The re-layout is a one-hot
    matmul built on the device from ``keep``: nothing of the cache crosses to the host."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,  # type: ignore[override]
                attention_mask: torch.Tensor, last: torch.Tensor,
                keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits, *cache = super().forward(input_ids, position_ids, attention_mask, last)
        pick = (torch.arange(input_ids.shape[1])[None, :] == keep[:, None]).to(cache[0].dtype)
        return (logits, *[torch.matmul(pick, c) for c in cache])


class _TokenGeneration(_Program):
    """One new token per row over a ``bucket``-position cache: its logits, and the cache with the
    token's keys and values written at ``slots`` (the same slot for every row)."""

    def __init__(self, model: Any, select: bool, windows: AttentionWindows | None, layers: int) -> None:
        super().__init__(model, select, windows)
        self.layers = layers

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                slots: torch.Tensor, *cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        keys, values = cache[:self.layers], cache[self.layers:]
        past = DynamicCache(ddp_cache_data=list(zip(keys, values)))
        mask = attention_mask if self.windows is None else self.windows.decode(attention_mask, slots)
        out = self.base(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                        past_key_values=past, use_cache=True)
        logits = self.head(self.last_token(out.last_hidden_state, None))
        new_keys, new_values = _cache_tensors(out.past_key_values)
        updated = self.kv_cache_write(cache, [*new_keys, *new_values], slots, input_ids.shape[1])
        return (logits, *updated)


@dataclass
class _Compiled:
    """One compiled phase/bucket and how its parameters and outputs meet the resident cache."""

    traced: TracedModel
    names: list[str]  # graph parameter names, in order
    binding: StateBinding

    @property
    def runnable(self) -> Any:
        return self.traced.variants[0].model


def _as_numpy(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # anything that is not array-like
        raise GenerationError(f"{what} must be a tensor or an array, not {type(value).__name__}") from exc


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return [int(v) for v in value]
    return [int(value)]


class NeuronCausalLM:
    """A transformers causal LM compiled for the execution core, generating as transformers-neuronx
    does (see the module docstring). Names follow transformers-neuronx: ``n_positions`` (the
    token-generation buckets; the largest is the KV cache length), ``context_length_estimate``
    (the prompt buckets; default: ``n_positions``), ``batch_size``, ``tp_degree``, :meth:`to_neuron`.
    ``options`` (a ``CompilerOptions``) compiles every program with that precision, e.g.
    ``CompilerOptions(quantize=Quantization.INT8_WEIGHT_ONLY)`` as transformers-neuronx's
    ``quantized`` configuration (docs/frontends.md, "Data types").
    """

    def __init__(self, model: Any, *, n_positions: int | Sequence[int] = (128, 256, 512),
                 context_length_estimate: int | Sequence[int] | None = None, batch_size: int = 1,
                 tp_degree: int = 1, instance: str | Instance | None = None, dtype: str | None = None,
                 core: int = 0, on_device_generation: bool = False,
                 options: CompilerOptions | None = None, rolling_cache: bool = False) -> None:
        try:
            self.n_positions = normalize_buckets(n_positions)
            self.context_length_estimate = normalize_buckets(
                self.n_positions if context_length_estimate is None else context_length_estimate,
                name="context_length_estimate")
        except BucketError as exc:
            raise GenerationError(str(exc)) from None
        if self.context_length_estimate[-1] > self.n_positions[-1] and not rolling_cache:
            raise GenerationError(f"context_length_estimate {self.context_length_estimate[-1]} is larger "
                                  f"than the KV cache (n_positions {self.n_positions[-1]})")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise GenerationError(f"batch_size must be a positive integer, not {batch_size!r}")
        config = getattr(model, "config", None)
        if config is None or not hasattr(model, "base_model") or model.get_output_embeddings() is None:
            raise GenerationError(f"{type(model).__name__} is not a transformers causal LM "
                                  f"(it needs a config, base_model and an output embedding)")
        if getattr(config, "is_encoder_decoder", False):
            raise GenerationError(f"{type(model).__name__} is an encoder-decoder model; NeuronCausalLM "
                                  f"serves decoder-only causal LMs (trace its encoder and decoder with "
                                  f"neuroncore.trace and run the decode loop on the host)")
        try:
            self.windows = attention_windows(model)  # sliding windows: masks the programs build
        except WindowError as exc:
            raise GenerationError(str(exc)) from None
        # a rolling cache of the window's length (slot = position % window): steps mask on the host
        self.rolling: int | None = None
        self._step_windows = self.windows
        if rolling_cache:
            if self.windows is None or self.windows.by_layer_type:
                raise GenerationError(f"rolling_cache needs one sliding window for every layer (Mistral's "
                                      f"sliding_window); {type(model).__name__} has "
                                      f"{'none' if self.windows is None else 'full and sliding layers'}")
            window = self.windows.windows[0][1]
            assert window is not None
            self.rolling = window
            self.n_positions = normalize_buckets([b for b in self.n_positions if b < window] + [window])
            self._step_windows = AttentionWindows(((SLIDING, None),), False, self.windows.additive)
        self.model = model.eval()
        # the model the programs trace: itself, or a copy with KV heads replicated for the ranks
        self.head_layout: HeadLayout | None = None
        self._source = self.model
        if isinstance(tp_degree, int) and not isinstance(tp_degree, bool) and tp_degree > 1:
            try:
                self._source, self.head_layout = with_heads_for(self.model, tp_degree)
            except ValueError as exc:
                raise GenerationError(str(exc)) from None
        self.batch_size = batch_size
        self.on_device_generation = on_device_generation
        self.tp_degree = tp_degree
        self.dtype = dtype
        self.options = options  # precision: auto-cast, int8 weight-only (transformers-neuronx quant)
        self.core = core
        self.instance = instance if isinstance(instance, Instance) else Instance(instance)
        self.layers = 0
        self.vocab_size = 0
        self._prefix = f"kv{next(_IDS)}"
        self._programs: dict[tuple[Phase, int], _Compiled] = {}
        self._cache: list[str] = []
        self.last_timing: GenerationTiming | None = None

    # -- compiling ---------------------------------------------------------------------------
    @property
    def compiled(self) -> list[tuple[Phase, int]]:
        """The (phase, bucket) programs compiled so far."""
        return sorted(self._programs)

    def to_neuron(self) -> NeuronCausalLM:
        """Compile every context-encoding and token-generation bucket now (transformers-neuronx's
        ``to_neuron``); without it each compiles on first use."""
        for bucket in self.context_length_estimate:
            self._program(Phase.CONTEXT_ENCODING, bucket)
        for bucket in self.n_positions:
            self._program(Phase.TOKEN_GENERATION, bucket)
        return self

    def _trace(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> TracedModel:
        try:
            with torch.no_grad():
                return trace(module, inputs, instance=self.instance, dtype=self.dtype, core=self.core,
                             tp_degree=self.tp_degree, options=self.options)
        except TraceError as exc:
            raise GenerationError(str(exc)) from None

    def _program(self, phase: Phase, bucket: int) -> _Compiled:
        key = (phase, bucket)
        program = self._programs.get(key)
        if program is None:
            if phase is Phase.TOKEN_GENERATION and not self._cache:
                self._program(Phase.CONTEXT_ENCODING, self.context_length_estimate[0])
            program = self._compile(phase, bucket)
            self._programs[key] = program
        return program

    def _named(self, cls: type[_M], phase: Phase, bucket: int) -> type[_M]:
        """``cls`` under the name its program shows in profiles (``model=``):
        ``LlamaForCausalLM.token_generation.256``."""
        return type(f"{type(self.model).__name__}.{phase}.{bucket}", (cls,), {})

    def _compile(self, phase: Phase, bucket: int) -> _Compiled:
        b = self.batch_size
        ids = torch.zeros(b, bucket if phase is Phase.CONTEXT_ENCODING else 1, dtype=torch.int64)
        if phase is Phase.CONTEXT_ENCODING:
            encoding = _ContextEncoding if self.rolling is None else _RollingContextEncoding
            inputs: tuple[torch.Tensor, ...] = (ids, ids.clone(), torch.ones_like(ids),
                                                torch.zeros(b, dtype=torch.int64))
            if self.rolling is not None:
                inputs = (*inputs, torch.zeros(self.rolling, dtype=torch.int64))
            traced = self._trace(self._named(encoding, phase, bucket)(self._source, self.on_device_generation,
                                                                      self.windows), inputs)
            if not self._cache:
                self._allocate_cache(traced)
            return self._bind(traced, reads=False)
        shapes = [self._cache_shape(i, bucket) for i in range(2 * self.layers)]
        cache = tuple(torch.zeros(s, dtype=d) for s, d in zip(shapes, self._cache_dtypes))
        traced = self._trace(self._named(_TokenGeneration, phase, bucket)(self._source,
                                                                          self.on_device_generation,
                                                                          self._step_windows, self.layers),
                             (ids, ids.clone(), torch.ones(b, bucket + 1, dtype=torch.int64),
                              torch.zeros(1, dtype=torch.int64), *cache))
        return self._bind(traced, reads=True)

    def _allocate_cache(self, traced: TracedModel) -> None:
        """The KV cache: one resident tensor per layer's keys and values on every core of the group,
        as long as the largest bucket (each core holds its rank's heads)."""
        outputs = traced.graph.outputs
        if len(outputs) < 3 or (len(outputs) - 1) % 2:
            raise GenerationError(f"{type(self.model).__name__}: the context encoding returned "
                                  f"{len(outputs)} tensors, not logits and per-layer keys and values")
        self.layers = (len(outputs) - 1) // 2
        self.vocab_size = int(getattr(self.model.config, "vocab_size", 0) or outputs[0].shape[-1])
        self._full_shapes = [tuple(o.shape) for o in outputs[1:]]
        # the cache in the model's own type: a model loaded in bf16/fp16 attends with bf16/fp16 keys
        self._cache_dtypes = [_TORCH_FLOATS.get(o.dtype, torch.float32) for o in outputs[1:]]
        self._cache = [f"{self._prefix}.{kind}{i}" for kind in ("k", "v") for i in range(self.layers)]
        local = traced.variants[0].program.graph.outputs[1:]
        for core in _cores(traced.variants[0].model):
            for name, out in zip(self._cache, local):
                shape = (*out.shape[:2], self.n_positions[-1], *out.shape[3:])
                try:
                    core.allocate_state(name, shape, out.dtype)
                except ValueError as exc:
                    raise GenerationError(str(exc)) from None

    def _cache_shape(self, index: int, bucket: int) -> tuple[int, ...]:
        shape = self._full_shapes[index]
        return (*shape[:2], bucket, *shape[3:])

    def _bind(self, traced: TracedModel, *, reads: bool) -> _Compiled:
        graph = traced.graph
        names = [p.name for p in graph.parameters]
        if len(graph.outputs) != 1 + 2 * self.layers:
            raise GenerationError(f"{type(self.model).__name__}: a program returned {len(graph.outputs)} "
                                  f"tensors, expected logits and {2 * self.layers} cache tensors")
        read_map = {}
        if reads:
            for i, name in enumerate(self._cache):
                if f"cache_{i}" not in names:
                    raise GenerationError(f"{type(self.model).__name__}: the token-generation program "
                                          f"does not read cache tensor {i}")
                read_map[names.index(f"cache_{i}")] = name
        writes = {1 + i: name for i, name in enumerate(self._cache)}
        return _Compiled(traced, names, StateBinding(reads=read_map, writes=writes))

    def model_ids(self, phase: Phase, bucket: int) -> tuple[int, ...]:
        """The loaded-model ids of one compiled program (one per rank), as profiles name them."""
        program = self._programs.get((phase, bucket))
        if program is None:
            raise GenerationError(f"no {phase} program for bucket {bucket} is compiled")
        runnable = program.runnable
        models = [runnable] if isinstance(runnable, LoadedModel) else list(runnable.models)
        return tuple(m.model_id for m in models)

    # -- running -----------------------------------------------------------------------------
    def _run(self, phase: Phase, bucket: int, context: int, values: dict[str, np.ndarray]) -> tuple[
            np.ndarray, StepTiming]:
        program = self._program(phase, bucket)
        inputs: list[np.ndarray | None] = [None if i in program.binding.reads else values[name]
                                           for i, name in enumerate(program.names)]
        result = program.runnable.execute(inputs, state=program.binding)
        ranks: list[ExecutionResult] = result.ranks if hasattr(result, "ranks") else [result]
        logits = np.asarray(result.outputs[0])  # [batch, vocab], or [batch] token ids (on device)
        first = ranks[0]  # every rank copies its own inputs and outputs at the same time
        latency = request_latency_ns(first.program.spec, result.device_time_ns,
                                     first.host_to_device_bytes, first.device_to_host_bytes)
        step = StepTiming(phase, bucket, context, result.start_ns, result.device_time_ns, round(latency),
                          tuple(r.execution_id for r in ranks), tuple(r.model_id for r in ranks),
                          sum(r.host_to_device_bytes for r in ranks),
                          sum(r.device_to_host_bytes for r in ranks))
        return logits, step

    def generate(self, input_ids: Any, attention_mask: Any = None, *, max_new_tokens: int | None = None,
                 do_sample: bool | None = None, top_k: int | None = None, top_p: float | None = None,
                 temperature: float | None = None, seed: int | None = None,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                 max_length: int | None = None, generation_config: Any = None, tokenizer: Any = None,
                 **options: Any) -> Any:
        """The prompt followed by up to ``max_new_tokens`` new tokens per row, as
        ``transformers``' ``generate`` returns them (a row that produced an end-of-sequence token is
        filled with ``pad_token_id``; generation stops when every row has). ``input_ids`` is
        [batch_size, length], left-padded where rows differ, with ``attention_mask`` 1 on real
        tokens. Returns a torch tensor for a torch input, else a NumPy array. The simulated timing of
        every step is in :attr:`last_timing`.

        As in transformers, ``max_length`` counts the prompt, and what is not given comes from
        ``generation_config`` (else the model's): the length (20 new tokens when neither sets
        one), ``do_sample``, ``top_k`` (50), ``top_p`` (1.0), ``temperature`` (1.0), eos and pad.
        transformers' logits processors (``sequence_bias``, ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``bad_words_ids``, ``min_length``, ``min_new_tokens``,
        ``suppress_tokens``, ``begin_suppress_tokens``: arguments or either config) process the
        logits on the host, greedy or sampling; its warpers (``min_p``, ``typical_p``,
        ``epsilon_cutoff``, ``eta_cutoff``) filter them when sampling; ``stop_strings`` (with
        ``tokenizer=``, as transformers requires) ends a row as an end-of-sequence id does. Other
        transformers options are accepted at their neutral values (``num_beams=1``,
        ``use_cache=True``, ...); one that would change the tokens is a one-line error."""
        configs = [c for c in (generation_config, getattr(self.model, "generation_config", None))
                   if c is not None]  # the given one first, then the model's
        _check_options(options, generation_config, getattr(self.model, "generation_config", None))
        raw = _as_numpy(input_ids, "input_ids")
        if raw.dtype.kind not in "iu":  # a float tensor would be truncated into other tokens
            raise GenerationError(f"input_ids must hold integer token ids, not {raw.dtype} values "
                                  "(transformers' embedding refuses them too)")
        ids = raw.astype(np.int64)
        if ids.ndim != 2 or ids.shape[0] != self.batch_size or ids.shape[1] < 1:
            raise GenerationError(f"input_ids must be [batch_size={self.batch_size}, length], "
                                  f"not {list(ids.shape)}")
        mask = np.ones_like(ids) if attention_mask is None else \
            _as_numpy(attention_mask, "attention_mask").astype(np.int64)
        if mask.shape != ids.shape:
            raise GenerationError(f"attention_mask {list(mask.shape)} does not match input_ids "
                                  f"{list(ids.shape)}")
        vocab = int(getattr(self.model.config, "vocab_size", 0) or 0)
        if vocab and ((ids < 0) | (ids >= vocab)).any():
            bad = int(ids[(ids < 0) | (ids >= vocab)][0])
            raise GenerationError(f"input_ids holds token {bad}, outside the vocabulary (0..{vocab - 1})")
        max_new_tokens = _new_tokens(max_new_tokens, max_length, configs, ids.shape[1])
        do_sample, top_k, top_p, temperature = (
            _setting(given, configs, name, default) for given, name, default in (
                (do_sample, "do_sample", False), (top_k, "top_k", 50), (top_p, "top_p", 1.0),
                (temperature, "temperature", 1.0)))
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
        eos = _eos_ids(_setting(eos_token_id, configs, "eos_token_id", None))
        # as transformers: temperature and the warpers shape sampling only; greedy ignores them
        # (a generation_config with temperature=0.0 and do_sample=False is greedy, not an error)
        try:
            sampling = Sampling(True, top_k, top_p, temperature, **{
                name: _setting(options.get(name), configs, name, default)
                for name, default in _WARPER_OPTIONS.items()}) if do_sample else Sampling(False)
            processors = Processors(**{name: _setting(options.get(name), configs, name, default)
                                       for name, default in _PROCESSOR_OPTIONS.items()},
                                    eos=tuple(eos), prompt_length=ids.shape[1],
                                    padding=tuple(int(p) for p in (mask != 0).argmax(axis=1)))
        except SamplingError as exc:
            raise GenerationError(f"generate: {exc}") from None
        outside = [t for t in processors.token_ids if vocab and t >= vocab]
        if outside:
            raise GenerationError(f"generate: sequence_bias / bad_words_ids name token {outside[0]}, "
                                  f"outside the vocabulary (0..{vocab - 1})")
        stop = _stop_strings(_setting(options.get("stop_strings"), configs, "stop_strings", None), tokenizer)
        if processors.active and self.on_device_generation:
            raise GenerationError("on_device_generation compiles greedy selection into the programs; "
                                  "transformers' logits processors (repetition_penalty, bad_words_ids, "
                                  "...) need the logits (build it with on_device_generation=False)")
        if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
                                 or seed < 0):
            raise GenerationError(f"seed must be a non-negative integer, not {seed!r}")
        if do_sample and self.on_device_generation:
            raise GenerationError("on_device_generation compiles greedy selection into the programs; "
                                  "sampling needs the logits (build it with on_device_generation=False)")
        prompt = ids.shape[1]
        if self.rolling is None and prompt + max_new_tokens - 1 > self.n_positions[-1]:
            raise GenerationError(f"a {prompt}-token prompt and {max_new_tokens} new tokens need "
                                  f"{prompt + max_new_tokens - 1} cache positions; n_positions holds "
                                  f"{self.n_positions[-1]}")
        table = _position_table(self.model)
        used = int(mask.sum(axis=1).max()) + max_new_tokens - 1  # position ids 0 .. used - 1
        if table is not None and used > table[1]:
            raise GenerationError(f"{type(self.model).__name__}'s position table ({table[0]}) holds "
                                  f"{table[1]} positions; a {int(mask.sum(axis=1).max())}-token prompt "
                                  f"and {max_new_tokens} new tokens need {used}")
        try:
            prefill = select_bucket(self.context_length_estimate, prompt)
        except BucketError:  # name the setting that would hold it (the bucket's message does not)
            buckets = ", ".join(map(str, self.context_length_estimate))
            raise GenerationError(f"a {prompt}-token prompt is longer than every context_length_estimate "
                                  f"bucket ({buckets}); add a bucket of at least {prompt}") from None
        pad = _setting(pad_token_id, configs, "pad_token_id", None)
        if pad is None:
            pad = eos[0] if eos else 0
        rng = np.random.default_rng(seed)
        steps: list[StepTiming] = []

        # context encoding: right-padded into its bucket, logits of the last prompt position
        b = self.batch_size
        padded = np.zeros((b, prefill), np.int64)
        padded[:, :prompt] = ids
        # sequence indices a token may attend to (without a rolling cache, also its cache slots)
        valid = np.zeros((b, max(self.n_positions[-1], prefill, prompt + max_new_tokens)), np.int64)
        valid[:, :prompt] = mask
        positions = np.cumsum(valid[:, :prefill], axis=-1) - 1
        positions[valid[:, :prefill] == 0] = 1  # as transformers' generate places padding
        inputs = {"input_ids": padded, "position_ids": positions, "attention_mask": valid[:, :prefill],
                  "last": np.full(b, prompt - 1, np.int64)}
        held = np.full(self.rolling or 0, -1, np.int64)  # a rolling cache: the position each slot holds
        if self.rolling is not None:
            for index in range(max(0, prompt - self.rolling), prompt):
                held[index % self.rolling] = index
            inputs["keep"] = held.copy()
        logits, step = self._run(Phase.CONTEXT_ENCODING, prefill, prompt, inputs)
        steps.append(step)
        unfinished = np.ones(b, bool)
        generated: list[np.ndarray] = []
        slot = prompt
        sequences = ids
        while True:
            scores = logits.astype(np.float32)
            if processors.active:
                scores = process_logits(scores, sequences, processors)
            token = (logits.astype(np.int64) if self.on_device_generation
                     else next_tokens(scores, sampling, rng))
            if eos:  # as transformers: a finished row is padded only when an eos id is set (a row
                token = np.where(unfinished, token, pad)  # a stop string ended runs on otherwise)
            generated.append(token)
            sequences = np.concatenate([sequences, token[:, None]], axis=1)
            if eos:
                unfinished &= ~np.isin(token, eos)
            if stop is not None:  # transformers' own criterion, on the sequences so far
                unfinished &= ~stop(torch.from_numpy(sequences), None).numpy()
            if len(generated) == max_new_tokens or not unfinished.any():
                break
            # token generation: the new token attends to the valid slots and itself
            context = slot + 1
            if self.rolling is None:
                bucket, write = select_bucket(self.n_positions, context), slot
                attend = np.concatenate([valid[:, :bucket], np.ones((b, 1), np.int64)], axis=1)
            else:  # the slots holding positions inside the window, then the token itself
                bucket = select_bucket(self.n_positions, min(context, self.rolling))
                write = slot % self.rolling
                inside = (held[:bucket] >= 0) & (slot - held[:bucket] < self.rolling)
                attend = np.concatenate([np.where(inside, valid[:, np.maximum(held[:bucket], 0)], 0),
                                         np.ones((b, 1), np.int64)], axis=1)
                held[write] = slot
            logits, step = self._run(Phase.TOKEN_GENERATION, bucket, context, {
                "input_ids": token[:, None], "position_ids": valid.sum(axis=1, keepdims=True),
                "attention_mask": attend, "slots": np.array([write], np.int64)})
            steps.append(step)
            valid[:, slot] = 1
            slot += 1
        self.last_timing = GenerationTiming(tuple(steps))
        out = np.concatenate([ids, np.stack(generated, axis=1)], axis=1)
        return torch.from_numpy(out) if isinstance(input_ids, torch.Tensor) else out

    def sample(self, input_ids: Any, sequence_length: int, *, attention_mask: Any = None, top_k: int = 50,
               top_p: float = 1.0, temperature: float = 1.0, seed: int | None = None) -> Any:
        """transformers-neuronx's ``sample``: top-k (and top-p) sampling until every row is
        ``sequence_length`` tokens long, prompt included (``top_k=1`` is greedy)."""
        ids = _as_numpy(input_ids, "input_ids")
        if ids.ndim != 2 or not isinstance(sequence_length, int) or sequence_length <= ids.shape[1]:
            raise GenerationError(f"sequence_length must be longer than the prompt "
                                  f"({ids.shape[-1] if ids.ndim else 0} tokens), not {sequence_length!r}")
        return self.generate(input_ids, attention_mask, max_new_tokens=sequence_length - ids.shape[1],
                             do_sample=True, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed)

    def cache_values(self, layer: int, kind: str = "k", core_rank: int = 0) -> np.ndarray:
        """The resident KV cache of one layer as rank ``core_rank``'s core holds it (a view)."""
        cores = _cores(next(iter(self._programs.values())).runnable) if self._programs else []
        if not cores:
            raise GenerationError("nothing has been compiled yet: there is no cache")
        tensor = cores[core_rank].resident[f"{self._prefix}.{kind}{layer}"]
        return tensor.read(tensor.shape)


# transformers' generation options that change the tokens and are not implemented, with the value
# that leaves them off (None always does); options absent here and from generate's signature that
# do not change the tokens are accepted and ignored
_UNSUPPORTED_OPTIONS: dict[str, Any] = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": 0.0,
    "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0,
    "force_words_ids": (), "top_h": 1.0, "diversity_penalty": 0.0, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "exponential_decay_length_penalty": None, "num_return_sequences": 1,
    "guidance_scale": 1.0, "prompt_lookup_num_tokens": None, "max_time": None,
    "return_dict_in_generate": False, "assistant_model": None, "logits_processor": (),
    "stopping_criteria": (), "prefix_allowed_tokens_fn": None, "streamer": None, "constraints": (),
}
# transformers' logits processors ``generate`` applies on the host (sampling.Processors), in the
# dataclass's order, with their neutral values
_PROCESSOR_OPTIONS: dict[str, Any] = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0,
                                      "min_new_tokens": 0, "sequence_bias": (), "bad_words_ids": (),
                                      "suppress_tokens": (), "begin_suppress_tokens": ()}
# transformers' warpers beyond temperature / top-k / top-p, applied when sampling (sampling.Sampling)
_WARPER_OPTIONS: dict[str, Any] = {"min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
_IGNORED_OPTIONS = frozenset({"use_cache", "output_scores", "output_logits", "output_attentions",
                              "output_hidden_states", "length_penalty", "early_stopping",
                              "renormalize_logits", "synced_gpus", "low_memory", "cache_implementation"})


def _stop_strings(value: Any, tokenizer: Any) -> Any:
    """transformers' ``StopStringCriteria`` for ``stop_strings`` (a string or a list of them), or
    None when there are none. It needs the tokenizer, as in transformers: it matches the strings
    against each token's text, so a stop string may end inside a token or span several."""
    if value is None or (hasattr(value, "__len__") and len(value) == 0):
        return None
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, (list, tuple)) or not all(isinstance(v, str) and v for v in strings):
        raise GenerationError(f"generate: stop_strings must be a string or a list of non-empty strings, "
                              f"not {value!r}")
    if tokenizer is None:
        raise GenerationError("generate: stop_strings needs the model's tokenizer: pass tokenizer= "
                              "to generate (transformers requires it too)")
    from transformers.generation.stopping_criteria import StopStringCriteria

    try:
        return StopStringCriteria(tokenizer=tokenizer, stop_strings=list(strings))
    except ValueError as exc:  # e.g. characters no token of the vocabulary holds
        raise GenerationError(f"generate: stop_strings {value!r}: {exc}") from None


def _neutral(name: str, value: Any) -> bool:
    off = _UNSUPPORTED_OPTIONS[name]
    if value is None or value == off:
        return True
    return isinstance(off, tuple) and not off and hasattr(value, "__len__") and len(value) == 0


def _check_options(options: dict[str, Any], given: Any, model_config: Any) -> None:
    """One line for a transformers option ``generate`` does not implement: given as an argument,
    in the ``generation_config`` given, or in the model's own (unless an argument turns it off)."""
    for name in options:
        if not any(name in known for known in (_UNSUPPORTED_OPTIONS, _IGNORED_OPTIONS, _PROCESSOR_OPTIONS,
                                               _WARPER_OPTIONS, ("stop_strings",))):
            raise GenerationError(f"generate: unknown argument {name!r}")
    for source, values in (("", options), (" in generation_config", given),
                           (" in the model's generation_config", model_config)):
        if values is None:
            continue
        for name in _UNSUPPORTED_OPTIONS:
            if name in options and source:
                continue  # the argument decides
            value = values.get(name) if isinstance(values, dict) else getattr(values, name, None)
            if not _neutral(name, value):
                hint = (f"; pass {name}={_UNSUPPORTED_OPTIONS[name]!r} to generate without it"
                        if values is model_config else "")
                raise GenerationError(f"generate: {name}={value!r}{source} is not supported (greedy "
                                      f"and sampling with transformers' per-token logits processors, "
                                      f"warpers and stop criteria only: docs/generation.md){hint}")


def _setting(given: Any, configs: Sequence[Any], name: str, default: Any) -> Any:
    """An argument, else the first generation config that sets it, else transformers' default."""
    if given is not None:
        return given
    for config in configs:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _new_tokens(max_new_tokens: int | None, max_length: int | None, configs: Sequence[Any],
                prompt: int) -> Any:
    """How many tokens to make: ``max_new_tokens``, else ``max_length`` minus the prompt (the
    arguments, then each generation config: new tokens first, as transformers), else 20."""
    for new, length in [(max_new_tokens, max_length),
                        *((getattr(c, "max_new_tokens", None), getattr(c, "max_length", None))
                          for c in configs)]:
        if new is not None:
            return new
        if length is not None:
            if not isinstance(length, int) or length <= prompt:
                raise GenerationError(f"max_length {length!r} leaves no room for new tokens after the "
                                      f"{prompt}-token prompt (it counts the prompt, as in transformers)")
            return length - prompt
    return 20


_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")  # GPT-2/GPT-Neo, OPT, BERT-like


def _position_table(model: Any) -> tuple[str, int] | None:
    """A learned absolute position table of the model (its module path, the positions it holds),
    or None for rotary and other position encodings that have no end. OPT's table carries an offset
    of 2 rows before position 0."""
    for name, module in model.base_model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rpartition(".")[2] in _POSITION_TABLES:
            offset = getattr(module, "offset", 0)
            rows = module.num_embeddings - (offset if isinstance(offset, int) else 0)
            return f"{model.base_model_prefix}.{name}", rows
    return None


def _cores(runnable: Any) -> list[NeuronCore]:
    """The cores a loaded program runs on (one, or a tensor-parallel group's in rank order)."""
    if isinstance(runnable, LoadedModel):
        return [runnable.core]
    models = getattr(runnable, "models", None)
    if models is None:
        raise GenerationError(f"{type(runnable).__name__} cannot hold a resident KV cache")
    return [m.core for m in models]


__all__ = ["GenerationError", "GenerationTiming", "NeuronCausalLM", "Phase", "StepTiming"]
