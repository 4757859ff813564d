"""How much device memory a training run needs per rank, and a refusal before compiling when it
does not fit.

    need = training_memory(7e9, Precision.BF16, OptimizerKind.ADAMW,
                           activations=transformer_activations(...), tp=8, dp=4, zero1=True)
    check_fits(need, hbm_bytes=core.spec.hbm_bytes, what="llama2-7b")   # one line if it does not

The arithmetic is the one Neuron's training guides use (and Megatron/NxD's papers behind them):

* weights: 2 B/param in bf16, 4 B/param in FP32; sharded by tensor (``tp``) and pipeline (``pp``)
  parallelism: a rank holds ``params / (tp * pp)``.
* FP32 master weights (bf16 auto-cast with an FP32 optimizer): +4 B/param.
* gradients: the dtype the optimizer reads (FP32 with FP32 or master weights, bf16 with pure bf16).
* optimizer state: AdamW/Adam ``exp_avg`` + ``exp_avg_sq`` in FP32 = 8 B/param; SGD with momentum
  4 B/param; plain SGD none. ZeRO-1 shards the optimizer state *and the master weights* over the
  data-parallel ranks (``/ dp``).
  So 7B in bf16 is 14 GB of weights + 56 GB of FP32 Adam state (+ 28 GB of FP32 master weights):
  more than one trn1 chip, which is why such runs shard.
* activations: for transformers, Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models", the formula NxD's docs quote): per layer and micro-batch
  ``s*b*h*(34 + 5*a*s/h)`` bytes with 16-bit activations, ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` with
  tensor parallel degree ``t`` and sequence parallelism, and ``2*s*b*h`` with full activation
  checkpointing (only each layer's input is kept; one layer is recomputed at a time). A pipeline
  stage of 1F1B holds ``pp`` micro-batches in flight. Other models: the bytes of the forward values
  the backward reads, measured on the traced graph (:func:`saved_activation_bytes`).

One definition of each figure: the breakdown's ``line()`` is what the refusal prints, and ``rows()``
is what a table shows; both come from the same fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from neuroncore.ir.graph import Graph
from neuroncore.training.optimizers import OptimizerKind
from neuroncore.training.precision import Precision

GB = 1e9  # the guides' arithmetic is in decimal gigabytes (7B * 2 B = 14 GB)


class MemoryCheckError(ValueError):
    """A run that does not fit in a core's HBM; the message is one line with the breakdown."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank, by category."""

    weights: int
    master_weights: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def rows(self) -> list[tuple[str, int]]:
        """``(category, bytes)`` in a fixed order, zero categories included."""
        return [(f.name.replace("_", " "), int(getattr(self, f.name))) for f in fields(self)]

    def line(self) -> str:
        """``weights 14.0 GB + optimizer state 56.0 GB + ... = 98.0 GB`` (non-zero categories)."""
        parts = [f"{name} {_gb(n)}" for name, n in self.rows() if n]
        return " + ".join(parts) + f" = {_gb(self.total)}"


def _gb(n: float) -> str:
    if n >= 0.1 * GB:
        return f"{n / GB:.1f} GB"
    return f"{n / 2**20:.1f} MiB" if n >= 0.1 * 2**20 else f"{n / 2**10:.1f} KiB"


def optimizer_state_bytes_per_param(kind: OptimizerKind, momentum: bool = True) -> int:
    """FP32 optimizer state per parameter: Adam(W) m + v = 8 B; SGD momentum buffer 4 B."""
    if kind is OptimizerKind.SGD:
        return 4 if momentum else 0
    return 8


def training_memory(n_params: float, precision: Precision, optimizer: OptimizerKind, *,
                    activations: int = 0, tp: int = 1, pp: int = 1, dp: int = 1, zero1: bool = False,
                    momentum: bool = True, master_copy: bool = True) -> MemoryBreakdown:
    """One rank's memory for a model of ``n_params`` parameters (see the module doc).

    ``master_copy=False``: bf16 auto-cast without a bf16 copy of the weights -- the FP32 weights are
    the master and each matmul casts its operands as it reads them (a single-core traced step does
    this): weights 4 B/param, no separate master.

    ``activations``: bytes of saved activations on this rank (from :func:`transformer_activations`
    or :func:`saved_activation_bytes`); already per rank."""
    for label, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be a positive integer, not {value!r}")
    local = n_params / (tp * pp)
    sharded = local / dp if zero1 else local
    grad_bytes = 2 if precision is Precision.BF16_SR else 4
    separate = master_copy or precision is not Precision.BF16
    return MemoryBreakdown(
        weights=round(local * (precision.weight_bytes if separate else 4)),
        master_weights=round(sharded * precision.master_bytes) if separate else 0,
        gradients=round(local * grad_bytes),
        optimizer_state=round(sharded * optimizer_state_bytes_per_param(optimizer, momentum)),
        activations=int(activations),
    )


def transformer_activations(*, seq_len: int, micro_batch: int, hidden: int, layers: int, heads: int,
                            tp: int = 1, pp: int = 1, sequence_parallel: bool = False,
                            checkpointing: bool = False, bytes_per_value: int = 2,
                            in_flight: int | None = None) -> int:
    """Saved activation bytes of one rank's layers (Korthikanti et al. 2022; see the module doc).

    ``bytes_per_value``: 2 for bf16 activations (the formula's own unit), 4 for FP32 (doubles it).
    ``in_flight``: micro-batches a pipeline stage holds (1F1B: ``pp``; default)."""
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    local_layers = -(-layers // pp)
    if checkpointing:
        per_layer = 2 * s * b * h / (t if sequence_parallel else 1)
        # the recomputed layer's full working set exists once, during its backward
        working = _layer_bytes(s, b, h, a, t, sequence_parallel)
    else:
        per_layer = _layer_bytes(s, b, h, a, t, sequence_parallel)
        working = 0.0
    flights = in_flight if in_flight is not None else pp
    scale = bytes_per_value / 2
    return int((per_layer * local_layers * flights + working) * scale)


def _layer_bytes(s: int, b: int, h: int, a: int, t: int, sequence_parallel: bool) -> float:
    if t == 1:
        return s * b * h * (34 + 5 * a * s / h)
    if sequence_parallel:
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def check_fits(need: MemoryBreakdown, *, hbm_bytes: int, what: str, where: str = "one NeuronCore") -> None:
    """Raise :class:`MemoryCheckError` (one line: needs, has, the breakdown) when ``need`` does
    not fit in ``hbm_bytes``."""
    if need.total > hbm_bytes:
        raise MemoryCheckError(
            f"{what} does not fit: it needs {_gb(need.total)} per rank but {where} has "
            f"{_gb(hbm_bytes)} of HBM ({need.line()})")


def saved_activation_bytes(forward_outputs: Sequence[tuple[int, bool]]) -> int:
    """Bytes of forward values that the backward reads: ``(nbytes, read_by_backward)`` per value."""
    return sum(n for n, saved in forward_outputs if saved)


def program_saved_activations(graph: Graph) -> int:
    """Bytes of the forward values a training step program's backward reads, counted on its IR
    graph (ops under ``model/forward`` read by an op under ``model/backward``): for a
    tensor-parallel rank's sharded program, what that rank saves (its blocks, plus what it holds
    whole). With activation checkpointing, plus the largest working set of one recomputed region:
    the values of a contiguous run of ops under ``model/backward/recompute`` that the rest of the
    backward reads (as ``torch_joint.saved_activations`` counts on the joint graph)."""
    backward_reads: set[int] = set()  # read by the backward (a recompute reads the kept inputs)
    gradient_reads: set[int] = set()  # read by the backward's own formulas
    for op in graph.ops:
        if _phase(op.layer) == "backward":
            backward_reads.update(id(o) for o in op.operands)
            if not _recomputed(op.layer):
                gradient_reads.update(id(o) for o in op.operands)
    kept = saved_activation_bytes([(op.nbytes, id(op) in backward_reads) for op in graph.ops
                                   if _phase(op.layer) == "forward" and op.opcode != "parameter"])
    working = block = 0
    for op in graph.ops:
        if not _recomputed(op.layer):
            block = 0
            continue
        block += op.nbytes if id(op) in gradient_reads else 0
        working = max(working, block)
    return kept + working


def _recomputed(layer: str) -> bool:
    return layer.startswith("model/backward/recompute/") or layer == "model/backward/recompute"


def _phase(layer: str) -> str:
    parts = layer.split("/")
    return parts[1] if len(parts) > 1 and parts[0] == "model" else ""


__all__ = ["GB", "MemoryBreakdown", "MemoryCheckError", "check_fits", "optimizer_state_bytes_per_param",
           "program_saved_activations", "saved_activation_bytes", "training_memory",
           "transformer_activations"]
