"""Megatron-style tensor parallelism as a graph pass: one full graph in, one per-rank graph out.

Every value of the full graph gets a *sharding* on the ``tp`` ranks: replicated (every rank holds
all of it), split along one dim (rank r holds the r-th of ``tp`` equal blocks), or partial (every rank
holds a summand). The pass walks the graph once, in order, and decides the sharding of each op from
its operands' the way Megatron-LM lays a transformer out:

* a linear whose input is replicated is **column-parallel**: its weight is split along the output
  features, so its output is split along its last dim (q/k/v, MLP up/gate, LM head: vocab-parallel);
* a linear whose input is split along the contracted dim is **row-parallel**: its weight is split
  along the input features, its output is partial, and an **all-reduce** makes it replicated;
* a split flows through elementwise ops, reshapes (``[.., H*hd] -> [.., H, hd]`` moves it onto the
  heads, so attention runs on ``H / tp`` heads per rank), transposes, broadcasts and batched matmuls;
* a replicated leaf that meets a split value (a bias, a KV-cache input, a broadcast mask) is split
  the same way without communication: weights are sliced per rank, inputs are sliced by the runtime;
* the token embedding (the largest gathered table) is **vocab-parallel**: each rank looks up the ids
  in its slice of the vocabulary, zeroes the others, and an all-reduce sums the rows;
* anything else that needs a whole split value (a norm over a split dim, a slice across it) gets it
  from an **all-gather**: correct, never silently wrong, and visible in the profile.

All ranks run the same program (only weights and some inputs differ), so the result is one local
:class:`~neuroncore.ir.Graph` plus the slicing rules for weights, inputs and outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from neuroncore.dtypes import DType
from neuroncore.ir.builder import GraphBuilder
from neuroncore.ir.graph import (
    BINARY_OPS,
    UNARY_OPS,
    Graph,
    IndexedInitializer,
    Initializer,
    Op,
    reachable,
)


@dataclass(frozen=True)
class Split:
    """A value split along ``dim``: that dim, viewed as ``[outer, n]``, is cut into ``tp`` contiguous
    blocks of ``n`` and rank r holds block r of every outer row. ``outer`` is 1 for a plain split;
    it is the batch when heads were folded into it (``[b, H, ..] -> [b*H, ..]``)."""

    dim: int
    outer: int = 1


Sharding = Split | None  # None: every rank holds the whole value
PARTIAL = Split(-1)  # a value every rank holds a summand of (only ever the result of a dot or a sum)


class ShardingError(ValueError):
    """A graph that cannot be split over ``tp`` ranks as asked (a size ``tp`` does not divide)."""


@dataclass(frozen=True)
class ShardedInitializer:
    """A rank's block of a weight: the full weight's values, sliced along ``dim``."""

    base: Initializer | IndexedInitializer | ShardedInitializer
    full_shape: tuple[int, ...]
    split: Split
    tp: int

    def materialize(self, shape: tuple[int, ...], rank: int = 0) -> np.ndarray:
        full = self.base.materialize(self.full_shape, 0)
        return np.ascontiguousarray(block_of(full, self.split, self.tp, rank)).reshape(shape)


@dataclass
class ShardedGraph:
    """The per-rank program of a tensor-parallel model and how to feed it and read it back.

    ``input_splits[i]`` is the dim the runtime slices the full graph's i-th input along (None: every
    rank gets all of it); ``rank_inputs`` are extra inputs appended after them whose values depend on
    the rank (vocabulary offsets). ``output_splits[i]`` is the dim along which the ranks' i-th outputs
    are concatenated (None: every rank holds the whole output).
    """

    full: Graph
    local: Graph
    tp: int
    input_splits: list[Sharding]
    output_splits: list[Sharding]
    rank_inputs: list[Callable[[int], np.ndarray]] = field(default_factory=list)

    @property
    def collectives(self) -> list[Op]:
        return [op for op in self.local.ops if op.opcode in ("all-reduce", "all-gather", "reduce-scatter")]

    def rank_arrays(self, inputs: list[np.ndarray], rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s inputs, from the full graph's inputs."""
        arrays = [block_of(np.asarray(a), split, self.tp, rank)
                  for a, split in zip(inputs, self.input_splits)]
        return arrays + [make(rank) for make in self.rank_inputs]

    def gather_outputs(self, per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
        """The full graph's outputs from every rank's local outputs."""
        return [self.join_output(i, [outs[i] for outs in per_rank]) for i in range(len(self.output_splits))]

    def join_output(self, i: int, parts: list[np.ndarray]) -> np.ndarray:
        """Output ``i`` whole from every rank's block; a padded vocabulary's padding (the last
        rank's block past V, logits of no token) is cut off, so it never reaches the caller."""
        split = self.output_splits[i]
        if split is None:
            return parts[0]
        return join_blocks(parts, split, self.full.outputs[i].shape[split.dim])


def block_of(array: np.ndarray, split: Sharding, tp: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s block of a whole value. A split dim ``tp`` does not divide (a padded
    vocabulary) is padded with zeros to a multiple of ``tp`` first, as Megatron pads its tables."""
    if split is None:
        return array
    d, outer = split.dim, split.outer
    inner = array.shape[d] // outer
    if inner % tp:
        padded = np.zeros((*array.shape[:d], outer, _padded_size(inner, tp), *array.shape[d + 1:]),
                          array.dtype)
        padded[(slice(None),) * (d + 1) + (slice(0, inner),)] = \
            array.reshape(*array.shape[:d], outer, inner, *array.shape[d + 1:])
        array = padded.reshape(*array.shape[:d], outer * padded.shape[d + 1], *array.shape[d + 1:])
    shape = array.shape
    viewed = array.reshape(*shape[:d], outer, tp, shape[d] // outer // tp, *shape[d + 1:])
    block = np.take(viewed, rank, axis=d + 1)
    return block.reshape(*shape[:d], shape[d] // tp, *shape[d + 1:])


def rank_block(array: np.ndarray, split: Sharding, tp: int, rank: int) -> np.ndarray:
    """:func:`block_of` as a C-contiguous array of the block's own shape: ``np.ascontiguousarray``
    alone turns a 0-d value into ``[1]`` (T5's lifted scalar constant: its rank state no longer
    matched the program's input, and a tensor-parallel T5 step stopped with a shape error)."""
    block = block_of(array, split, tp, rank)
    return np.ascontiguousarray(block).reshape(block.shape)


def join_blocks(parts: list[np.ndarray], split: Split, size: int | None = None) -> np.ndarray:
    """The whole value from every rank's block (the inverse of :func:`block_of`); ``size``: the
    split dim's whole size, when the blocks hold padding past it (a padded vocabulary)."""
    d, outer = split.dim, split.outer
    shape = parts[0].shape
    viewed = [p.reshape(*shape[:d], outer, shape[d] // outer, *shape[d + 1:]) for p in parts]
    whole = np.concatenate(viewed, axis=d + 1)
    if size is not None and size != shape[d] * len(parts):
        whole = whole[(slice(None),) * (d + 1) + (slice(0, size // outer),)]
        return whole.reshape(*shape[:d], size, *shape[d + 1:])
    return whole.reshape(*shape[:d], shape[d] * len(parts), *shape[d + 1:])


def _padded_size(size: int, tp: int) -> int:
    """``size`` rounded up to a multiple of ``tp`` (Megatron's padded vocabulary)."""
    return -(-size // tp) * tp


_PARTIAL_USERS = frozenset({"add", "reshape", "transpose", "convert"})  # keep a partial sum partial


def _rank_rows(rows: int, total: int, rank: int) -> np.ndarray:
    """The one-hot matrix that picks rank ``rank``'s ``rows`` rows of ``total`` (rows past
    ``total``, a padded vocabulary's, pick nothing: zeros)."""
    select = np.zeros((rows, total), np.float32)
    picked = np.arange(rank * rows, (rank + 1) * rows)
    keep = picked < total
    select[np.arange(rows)[keep], picked[keep]] = 1.0
    return select


def _rank_start(rows: int, dtype: npt.DTypeLike, rank: int) -> np.ndarray:
    """A ``tp_start`` input: where rank ``rank``'s block of ``rows`` starts along the split dim."""
    return np.array(rank * rows, dtype)


def _rank_word(rank: int) -> np.ndarray:
    """The ``tp_rank`` input: the rank as one FP32 word (a random op's block needs it)."""
    return np.array([rank], np.float32)


def _vocab_offset(shape: tuple[int, ...], rows: int, dtype: np.dtype | type, rank: int) -> np.ndarray:
    """The vocabulary-parallel gather's per-rank input: every id's offset into this rank's rows."""
    return np.full(shape, rank * rows, dtype)


class _Restart(Exception):
    """Graph inputs turned out to be needed split after they were placed whole: start over with them
    split from the beginning (their whole uses then all-gather them)."""

    def __init__(self, splits: dict[int, Split], whole_dots: frozenset[int] = frozenset()) -> None:
        super().__init__(", ".join(map(str, splits)))
        self.splits = splits
        self.whole_dots = whole_dots  # linears to compute whole on every rank (replicated KV heads)


def shard(graph: Graph, tp: int, *, trained: frozenset[str] = frozenset(),
          sequence_parallel: bool = False, input_splits: Mapping[str, Sharding] | None = None,
          output_splits: dict[int, Sharding] | None = None) -> ShardedGraph:
    """Split ``graph`` over ``tp`` ranks (see the module docstring).

    A pass that finds inputs it should have split goes on to the end, collecting every such input,
    and the next pass splits them all from the start: a Llama graph settles in two or three passes,
    not one pass per layer's KV-cache input.

    ``trained`` names graph *inputs* that are trained weights (a training step's parameters, which
    stay resident on the ranks rather than being constants): linears reading them are split like
    linears reading constant weights, and a replicated value that has to meet a split one (the
    gradient of a weight whose forward ran whole, e.g. the LM head after the all-gather the
    cross-entropy needs) is cut to the rank's block locally (:meth:`_Sharder._rank_block`) instead of
    all-gathering the split side, so a weight's update, gradient and optimizer state stay split the
    way its forward split it. The token table of a training step is vocabulary-split too (a trained
    input: its lookup masked, the one-hot of its backward built on the rank's rows only), and a
    log-softmax over vocabulary-split logits takes its row maxima by an all-reduce of maxima.

    ``sequence_parallel`` (Megatron's sequence parallelism, Korthikanti et al. 2022): a partial sum
    of token-major activations (``[batch, seq, hidden]``: a row-parallel linear's output, a
    column-parallel linear's input gradient, the vocabulary-parallel lookup) is reduce-scattered
    along the sequence instead of all-reduced, so norms, dropout and residuals run on ``seq / tp``
    tokens per rank; a linear reading such a sequence-split value all-gathers it first.

    ``input_splits`` splits the named inputs from the start, so that a second program over the same
    resident tensors (a training step's accumulate program, whose gradient buffers nothing else
    would tell to split) reads and writes them the way the first program does; None keeps an input
    whole (a split value meeting it is gathered instead). Under
    ``sequence_parallel`` an input split along dim 1 of a 3-D float value is a sequence-split
    activation (a pipeline stage's received hidden states, or their gradient): linears all-gather it.

    ``output_splits`` asks for outputs (by position) split as given (None: whole on every rank): a
    pipeline stage's send of the gradient of what it received, which must leave split as the
    previous stage reads it. A pipeline send (``collective-permute``) converts its operand before
    the transfer: an all-gather where a whole value is wanted, the rank's block (no communication)
    where a whole value is to leave split; other outputs are converted where they are made.
    """
    if not isinstance(tp, int) or tp < 1:
        raise ShardingError(f"tp_degree must be a positive integer, not {tp!r}")
    wanted = input_splits or {}
    presplit: dict[int, Split] = {}
    kept_whole: set[int] = set()
    for p in graph.parameters:
        if p.name in wanted:
            split = wanted[p.name]
            if split is None:
                kept_whole.add(p.index)
            else:
                presplit[p.index] = split
    whole_dots: set[int] = set()
    for _ in range(len(graph.parameters) + 2):
        try:
            return _Sharder(graph, tp, presplit, trained, sequence_parallel, output_splits,
                            frozenset(kept_whole), frozenset(whole_dots)).run()
        except _Restart as restart:
            presplit.update(restart.splits)
            whole_dots |= restart.whole_dots
    raise ShardingError(f"could not settle how to split the inputs of {graph.name}")


_WEIGHT_INITS = (Initializer, IndexedInitializer)
_HUGE = 3.0e38  # what a padded vocabulary entry is in a maximum: below every real logit


def _local_shape(shape: tuple[int, ...], split: Sharding, tp: int,
                 padded: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """A rank's block's shape; a dim whose blocks are a padded size (the vocabulary) rounds up."""
    if split is None or split == PARTIAL:
        return shape
    out = list(shape)
    inner = out[split.dim] // split.outer
    out[split.dim] = split.outer * (_padded_size(inner, tp) // tp if inner in padded else inner // tp)
    return tuple(out)


def _fits(size: int, split: Split, tp: int, padded: frozenset[int] = frozenset()) -> bool:
    """Whether ``split`` of a dim of ``size`` gives every rank an equal block: ``tp`` divides the
    dim's blocks, or they are the padded vocabulary."""
    return size % split.outer == 0 and ((size // split.outer) % tp == 0 or size // split.outer in padded)


def _reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of source dims with runs of target dims that hold the same elements."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= src[i]
                i += 1
            else:
                gj.append(j)
                pj *= dst[j]
                j += 1
        groups.append((gi, gj))
    if groups:  # trailing size-1 dims join the last run
        groups[-1][0].extend(range(i, len(src)))
        groups[-1][1].extend(range(j, len(dst)))
    return groups


def _moved_split(src: tuple[int, ...], dst: tuple[int, ...], split: Split,
                 tp: int, padded: frozenset[int] = frozenset()) -> tuple[Split | None, int]:
    """Where a split of ``src`` lands after a reshape to ``dst``: (the split, or None if it is not one
    contiguous block per outer row any more; the size of the dst dim it should land on, for errors)."""
    for src_dims, dst_dims in _reshape_groups(src, dst):
        if split.dim not in src_dims:
            continue
        before = 1
        for d in src_dims[:src_dims.index(split.dim)]:
            before *= src[d]
        outer = before * split.outer  # blocks repeat this many times in the group's elements
        position = 1
        for e in dst_dims:
            if position <= outer < position * dst[e] and outer % position == 0:
                moved = Split(e, outer // position)
                return (moved if _fits(dst[e], moved, tp, padded) else None), dst[e] // moved.outer
            position *= dst[e]
        return None, 0
    return None, 0


class _Sharder:
    def __init__(self, graph: Graph, tp: int, presplit: dict[int, Split],
                 trained: frozenset[str] = frozenset(), sequence_parallel: bool = False,
                 output_splits: dict[int, Sharding] | None = None,
                 kept_whole: frozenset[int] = frozenset(),
                 whole_dots: frozenset[int] = frozenset()) -> None:
        self.graph = graph
        self.kept_whole = kept_whole  # inputs never split
        self.whole_dots = whole_dots  # linears computed whole (KV heads fewer than the ranks)
        self.found_whole_dots: set[int] = set()  # ... found in this pass: the next one has them
        self.wanted_out = {graph.outputs[i].index: split for i, split in (output_splits or {}).items()}
        self.sequence_parallel = sequence_parallel and tp > 1
        self.seq: set[int] = set()  # values split along the sequence (sequence parallelism)
        self.seq_gathered: dict[int, Op] = {}  # ... and their values with all tokens
        self.tp = tp
        self.presplit = presplit
        self.trained = trained
        self.b = GraphBuilder(graph.name, root_layer="")
        self.local: dict[int, Op] = {}
        self.split: dict[int, Sharding] = {}
        self.localized: dict[tuple[int, Split], Op] = {}
        self.gathered: dict[int, Op] = {}
        self.params: dict[int, Op] = {}
        self.rank_params: list[Op] = []
        self.rank_inputs: list[Callable[[int], np.ndarray]] = []
        self.rank_word: Op | None = None  # the rank, for random ops drawing a rank's block
        self.rank_keyed: dict[int, Op] = {}  # RNG state (by local op index) -> (seed, offset, rank)
        self.padded = self._padded_vocabulary()
        self.valid_masks: dict[tuple[tuple[int, ...], int], Op] = {}
        self.vocab_tables = self._vocab_parallel_tables()
        self.current: Op = graph.ops[0]
        self.wanted_split: dict[int, Split] = {}  # inputs placed whole that a later op wants split
        self.replaced: dict[int, Op] = {}  # training: inputs split on demand -> their whole op
        self.users: dict[int, list[Op]] = {}
        for user in graph.ops:
            for operand in user.operands:
                self.users.setdefault(operand.index, []).append(user)
        self.output_indices = {o.index for o in graph.outputs}
        self.copied: set[int] = set()  # ids of ops named after the full graph's (``_add``)

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> ShardedGraph:
        for op in self.graph.ops:
            self.current = op
            self._reduce_partial_operands(op)
            try:
                with self.b.located(op.layer, op.frames):
                    if op.opcode == "collective-permute" and op.index in self.wanted_out:
                        local, split = self._send_as(op, self.wanted_out[op.index])
                    else:
                        local, split = self._lower_partial(op) or self._lower(op)
            except ShardingError:
                if not (self.wanted_split or self.found_whole_dots):
                    raise
                # the detour of a misplaced input, which the next pass avoids: this pass's graph is
                # thrown away, so the op is made whole (every rank computes it) and the pass goes on
                # to find the later layers' misplaced inputs too (a Llama decode at a tp that does
                # not divide the hidden size met one per layer: a pass per layer, quadratic)
                local, split = self._detour(op)
            if split == PARTIAL and not self._sums_partials(op):  # Megatron reduces right where
                with self.b.located(op.layer, op.frames):       # the partial sums are made
                    local, split = self._reduce_sum(op, local)
            elif split not in (None, PARTIAL) and op.opcode != "dot" and \
                    any(o.index in self.seq for o in op.operands):
                self.seq.add(op.index)  # a norm, dropout or residual on the rank's tokens
            self.local[op.index], self.split[op.index] = local, split
        if self.wanted_split or self.found_whole_dots:
            raise _Restart(self.wanted_split, frozenset(self.found_whole_dots))
        for o in self.graph.outputs:
            if o.index in self.wanted_out and self.split[o.index] != self.wanted_out[o.index]:
                with self.b.located(o.layer, o.frames):
                    self.local[o.index] = self._resplit(o, self.wanted_out[o.index])
                self.split[o.index] = self.wanted_out[o.index]
        outputs = [self.local[o.index] for o in self.graph.outputs]
        if self.replaced:
            stale = _still_read(outputs, self.replaced)
            if stale:
                raise _Restart({i: s for i, s in self.split.items() if i in stale and s is not None})
        output_splits = [self.split[o.index] for o in self.graph.outputs]
        params = [self.params[p.index] for p in self.graph.parameters] + self.rank_params
        for number, param in enumerate(params):
            param.attrs["number"] = number
        local_graph = self.b.build(outputs, params).pruned()
        _unique_names(local_graph, self.copied)
        _unique_weight_labels(local_graph)
        input_splits = [self.split[p.index] for p in self.graph.parameters]
        return ShardedGraph(self.graph, local_graph, self.tp, input_splits, output_splits, self.rank_inputs)

    def _detour(self, op: Op) -> tuple[Op, Sharding]:
        """``op`` computed whole on every rank from its operands' whole values, in a pass that will
        restart (``wanted_split`` is not empty): only the inputs it finds misplaced further on are
        kept. If even that fails, restart with what was found so far."""
        try:
            with self.b.located(op.layer, op.frames):
                return self._add(op, [self._whole(o) for o in op.operands], op.shape), None
        except ShardingError:
            raise _Restart(self.wanted_split, frozenset(self.found_whole_dots)) from None

    def _sums_partials(self, op: Op) -> bool:
        """Training: a partial sum read only by additions stays partial, so the additions sum the
        partials first and one all-reduce follows (autograd adds the input gradients of q/k/v, or
        gate/up, then Megatron's ``f`` all-reduces that sum once)."""
        if not self.trained or self.tp == 1 or op.index in self.output_indices:
            return False
        users = self.users.get(op.index, [])
        return bool(users) and all(u.opcode in _PARTIAL_USERS for u in users)

    def _send_as(self, op: Op, want: Sharding) -> tuple[Op, Sharding]:
        """A pipeline send whose value must leave split as ``want``: its operand converted first
        (:meth:`_resplit`), so the transfer carries what the peer reads."""
        src = op.operands[0]
        moved = self._resplit(src, want)
        made = self._add(op, [moved], self._shape(op, want))
        if want == Split(1) and src.index in self.seq:
            self.seq.add(op.index)
        return made, want

    def _resplit(self, op: Op, want: Sharding) -> Op:
        """``op``'s value split as ``want``: an all-gather of a split value wanted whole, the rank's
        block of a whole one (no communication), else refused in one line."""
        have = self.split[op.index]
        if have == want:
            return self.local[op.index]
        if want is None:
            return self._whole(op)
        block = self._as_split(op, want) if have is None else None
        if block is None:
            raise ShardingError(f"{op.describe()} is split as {have} but must leave the program split as "
                                f"{want}: no layout change is built for that")
        return block

    def _lower_partial(self, op: Op) -> tuple[Op, Sharding] | None:
        """A relayout of a partial sum is a partial sum (the autograd of a linear on a 3-D input
        views its 2-D input gradient back to 3-D before the additions)."""
        if op.opcode == "add" or op.opcode not in _PARTIAL_USERS:
            return None
        if self.split.get(op.operands[0].index) != PARTIAL:
            return None
        return self._add(op, [self.local[op.operands[0].index]], op.shape), PARTIAL

    def _reduce_partial_operands(self, op: Op) -> None:
        """All-reduce the partial operands of ``op`` unless it adds only partials (the sum stays
        partial); what was reduced is replicated from here on."""
        operands = [o for o in op.operands if self.split.get(o.index) == PARTIAL]
        if not operands:
            return
        if op.opcode in _PARTIAL_USERS and len(operands) == len(op.operands):
            return
        for o in dict.fromkeys(operands):
            with self.b.located(o.layer, o.frames):
                self.local[o.index], self.split[o.index] = self._reduce_sum(o, self.local[o.index])

    def _add(self, op: Op, operands: list[Op], shape: tuple[int, ...], suffix: str = "",
             **attrs: object) -> Op:
        merged = {**op.attrs, **attrs}
        made = self.b.add_op(op.opcode, operands, shape, op.dtype, name=op.name + suffix, **merged)
        self.copied.add(id(made))
        return made

    def _shape(self, op: Op, split: Sharding) -> tuple[int, ...]:
        return _local_shape(op.shape, split, self.tp, self.padded)

    # -- collectives -----------------------------------------------------------------------
    def _reduce_sum(self, op: Op, local: Op) -> tuple[Op, Sharding]:
        """The sum of the ranks' partial ``local`` (``op``'s value): all-reduced, or with sequence
        parallelism, for token-major activations, reduce-scattered along the sequence (Megatron's
        ``g`` becomes a reduce-scatter, and the backward of its all-gather too)."""
        if self.tp == 1:
            return local, None
        seq = Split(1)
        if self.sequence_parallel and len(op.shape) == 3 and _fits(op.shape[1], seq, self.tp):
            self.seq.add(op.index)
            scattered = self.b.add_op("reduce-scatter", [local], self._shape(op, seq), local.dtype,
                                      reduction="sum", dimension=1, outer=1,
                                      name=f"reduce-scatter.{local.name}")
            return scattered, seq
        return self._all_reduce(local), None

    def _all_tokens(self, op: Op) -> Op:
        """A sequence-split value with all its tokens: all-gathered where it was made, before the
        reshapes and casts each linear applies to its input, so q, k and v (gate and up) share one
        all-gather of their common input, as Megatron's sequence-parallel block gathers once."""
        done = self.seq_gathered.get(op.index)
        if done is not None:
            return done
        src = op.operands[0] if op.opcode in ("reshape", "convert") and op.operands else None
        if src is not None and src.index in self.seq:
            with self.b.located(op.layer, op.frames):
                done = self._add(op, [self._all_tokens(src)], op.shape, ".sp_whole")
        else:
            done = self._gather_split(op)
        self.seq_gathered[op.index] = done
        return done

    def _all_reduce(self, local: Op, reduction: str = "sum") -> Op:
        """The sum (or the maximum) of every rank's ``local``, named after the value it reduces
        (``all-reduce.dot.12``), so a profile's collective says which tensor it carries."""
        return self.b.add_op("all-reduce", [local], local.shape, local.dtype, reduction=reduction,
                             name=f"all-reduce.{local.name}")

    def _whole(self, op: Op) -> Op:
        """``op``'s value on every rank: its local value, or an all-gather of its blocks (of a
        sequence-split value, :meth:`_all_tokens`)."""
        if op.index in self.seq:
            return self._all_tokens(op)
        return self._gather_split(op)

    def _gather_split(self, op: Op) -> Op:
        split = self.split[op.index]
        local = self.local[op.index]
        if split is None:
            return local
        if op.index not in self.gathered:
            padded = self._is_padded(op, split)
            shape = list(op.shape)
            if padded:  # the blocks hold the padded vocabulary: gather it, then cut the padding off
                if split.outer != 1:
                    self._valid(op, split)  # refuses, in one line
                shape[split.dim] = local.shape[split.dim] * self.tp
            with self.b.located(self.current.layer, self.current.frames):
                whole = self.b.add_op(
                    "all-gather", [local], tuple(shape), op.dtype, dimension=split.dim, outer=split.outer,
                    name=f"all-gather.{op.name}")  # after the tensor it gathers: all-gather.dot.12
                if padded:
                    whole = self.b.slice(whole, [0] * len(shape), list(op.shape), [1] * len(shape))
            self.gathered[op.index] = whole
        return self.gathered[op.index]

    def _as_split(self, op: Op, split: Split) -> Op | None:
        """``op`` split as ``split`` without communication, or None if that is not possible."""
        current = self.split[op.index]
        if current == split:
            return self.local[op.index]
        if current is not None:
            return None
        local = self._localize(op, split)
        if local is None and self.trained and op.opcode != "parameter":
            local = self._rank_block(op, split)
        return local

    def _split_input(self, op: Op, split: Split) -> Op:
        """A training step's input split where it is first wanted split (a weight by the linear that
        reads it, a state tensor by the update that meets its weight), as a constant weight is: the
        runtime feeds each rank its block. Ops lowered before that read the whole input; if one of
        them is still used at the end, the next pass splits the input from the start instead."""
        extra = {k: v for k, v in op.attrs.items() if k != "number"}
        local = self.b.add_op("parameter", [], self._shape(op, split), op.dtype, name=op.name,
                              number=0, **extra)
        self.replaced[op.index] = self.local[op.index]
        self.params[op.index] = self.local[op.index] = local
        self.split[op.index] = split
        return local

    def _rank_block(self, op: Op, split: Split) -> Op | None:
        """The rank's block of a replicated value every rank computed whole: its rows picked by a
        rank-dependent one-hot selection matrix (no communication). Training, and the replicated
        KV heads of an inference program (:meth:`_localize`).

        A matmul rather than a row gather: the gather's lowering reads its table as a stored
        tensor, and the values cut here are usually views (a slice of a fused projection)."""
        if split.outer != 1 or not _fits(op.shape[split.dim], split, self.tp, self.padded) or not op.shape:
            return None
        key = (op.index, split)
        if key in self.localized:
            return self.localized[key]
        b, d = self.b, split.dim
        rows = self._shape(op, split)[d]
        start = b.n_ops
        with b.located(self.current.layer, self.current.frames):
            value = self.local[op.index]
            order = [d, *(i for i in range(len(op.shape)) if i != d)]
            moved = value if d == 0 else b.transpose(value, order)
            rest = moved.shape[1:]
            table = b.reshape(moved, (moved.shape[0], int(np.prod(rest, dtype=np.int64))))
            if table.dtype not in (DType.FP32, DType.BF16, DType.FP16):
                return None
            select = b.add_op("parameter", [], (rows, op.shape[d]), table.dtype,
                              name=f"tp_rank_rows.{len(self.rank_params)}", number=0)
            self.rank_params.append(select)
            self.rank_inputs.append(functools.partial(_rank_rows, rows, op.shape[d]))
            picked = b.reshape(b.dot(select, table, lhs_contract=1, rhs_contract=0), (rows, *rest))
            inverse = [order.index(i) for i in range(len(order))]
            block = picked if d == 0 else b.transpose(picked, inverse)
        for k, made in enumerate(b.ops_since(start)):  # copied ops keep the full graph's names:
            if made.opcode != "parameter":             # builder-made ones must not collide
                made.name = f"{op.name}.tp_block.{k}"
        self.localized[key] = block
        return block

    # -- splitting replicated values where they are made -----------------------------------------
    def _localize(self, op: Op, split: Split) -> Op | None:
        key = (op.index, split)
        if key in self.localized:
            return self.localized[key]
        current = self.split.get(op.index)
        if current == split:
            return self.local[op.index]
        if current is not None:
            return None
        if not _fits(op.shape[split.dim], split, self.tp, self.padded):
            return None
        made = self._make_local(op, split)
        if made is None and self.whole_dots and op.opcode == "reshape" and not self.trained:
            # replicated KV heads, regrouped to the query heads (repeat_kv: [b, kv, g, s, hd] ->
            # [b, H, s, hd]): the rank's query heads' keys or values picked from the whole tensor
            made = self._rank_block(op, split)
        if made is not None:
            self.localized[key] = made
        return made

    def _make_local(self, op: Op, split: Split) -> Op | None:
        code, dim = op.opcode, split.dim
        shape = self._shape(op, split)
        suffix = f".tp{dim}"
        with self.b.located(op.layer, op.frames):
            if code == "parameter" and op.index in self.kept_whole:
                return None
            if code == "parameter" and self.sequence_parallel and not op.dtype.is_float:
                return None  # token ids meeting sequence-split gradients: the gradient is gathered,
                # the ids stay whole on every rank (Megatron)
            if code == "parameter" and self.trained:  # split from here on, as a constant weight is
                return self._split_input(op, split)
            if code == "parameter":  # split it from the start next pass; this pass goes on without
                self.wanted_split.setdefault(op.index, split)
                return None
            if code == "constant":
                if "init" not in op.attrs:
                    return self._add(op, [], shape, suffix)
                init = ShardedInitializer(op.attrs["init"], op.shape, split, self.tp)
                return self._add(op, [], shape, suffix, init=init)
            if code == "iota" and op.attrs["dimension"] == dim:
                return self._iota_block(op, split, shape, suffix)
            if code == "iota":
                return self._add(op, [], shape, suffix)
            if code == "dot" and self.trained:
                return self._dot_block(op, split, shape, suffix)
            if code == "rng":
                return self._rng_block(op, split, shape, suffix)
            if code == "broadcast":
                src = op.operands[0]
                dims = op.attrs["dims"]
                if dim in dims and src.shape[dims.index(dim)] != 1:
                    inner = self._localize(src, Split(dims.index(dim), split.outer))
                else:
                    inner = self._whole(src)
                return None if inner is None else self._add(op, [inner], shape, suffix)
            if code == "transpose":
                inner = self._localize(op.operands[0], Split(op.attrs["permutation"][dim], split.outer))
                return None if inner is None else self._add(op, [inner], shape, suffix)
            if code == "reshape" and _sliced_weight(op):  # one expert, reshaped: a weight too
                return self._local_slice(op, split, shape, suffix)
            if code == "reshape":
                src_split, _ = _moved_split(op.shape, op.operands[0].shape, split, self.tp, self.padded)
                inner = None if src_split is None else self._localize(op.operands[0], src_split)
                return None if inner is None else self._add(op, [inner], shape, suffix)
            if code == "slice":
                return self._local_slice(op, split, shape, suffix)
            if code in ("convert", *UNARY_OPS, *BINARY_OPS, "compare", "select"):
                localized = [self._localize(o, split) for o in op.operands]
                inners = [i for i in localized if i is not None]
                if len(inners) != len(localized):
                    return None
                return self._add(op, inners, shape, suffix)
        return None

    def _local_slice(self, op: Op, split: Split, shape: tuple[int, ...], suffix: str) -> Op | None:
        """A rank's block of a slice. Of a trained weight (one expert of a stacked experts
        tensor, the gate half of a fused gate/up projection, through reshapes): a weight of its own
        holding that part, then split, so each rank stores only its block. Of anything else: the
        slice of the operand's block, when the split dim is not cut."""
        src = op.operands[0]
        view = _weight_view(op)
        if view is not None:
            init, root, label = view
            sharded = ShardedInitializer(init, op.shape, split, self.tp)
            attrs = {k: v for k, v in root.attrs.items() if k != "init"}
            attrs["label"] = label  # a weight of its own in HBM, where weights are stored by label
            return self.b.add_op("constant", [], shape, op.dtype, name=op.name + suffix, init=sharded,
                                 **attrs)
        if op.opcode != "slice":
            return None
        starts, limits, strides = op.attrs["starts"], op.attrs["limits"], op.attrs["strides"]
        d = split.dim
        if not (starts[d] == 0 and limits[d] == src.shape[d] and strides[d] == 1):
            return None
        inner = self._localize(src, split)
        if inner is None:
            return None
        local_limits = list(limits)
        local_limits[d] = inner.shape[d]
        return self._add(op, [inner], shape, suffix, limits=tuple(local_limits))

    # -- ops -------------------------------------------------------------------------------
    def _lower(self, op: Op) -> tuple[Op, Sharding]:
        code = op.opcode
        if code == "parameter":
            return self._parameter(op)
        if code in ("constant", "iota"):
            return self._add(op, [], op.shape), None
        if code == "dot":
            return self._dot(op)
        if code == "gather":
            return self._gather(op)
        if code == "reshape":
            return self._reshape(op)
        if code == "transpose":
            return self._transpose(op)
        if code == "broadcast":
            return self._broadcast(op)
        if code == "reduce":
            return self._reduce(op)
        if code in ("softmax", "layer_norm", "rms_norm"):
            return self._last_dim_op(op)
        if code == "slice":
            return self._slice(op)
        if code == "concatenate":
            return self._elementwise(op, exclude=op.attrs["dimension"])
        return self._elementwise(op)

    def _parameter(self, op: Op) -> tuple[Op, Sharding]:
        split = self.presplit.get(op.index)
        extra = {k: v for k, v in op.attrs.items() if k != "number"}
        local = self.b.add_op("parameter", [], self._shape(op, split), op.dtype, name=op.name,
                              number=0, **extra)
        if self.sequence_parallel and split == Split(1) and len(op.shape) == 3 and op.dtype.is_float:
            self.seq.add(op.index)  # activations arriving split along the sequence
        self.params[op.index] = local
        return local, split

    def _elementwise(self, op: Op, exclude: int | None = None) -> tuple[Op, Sharding]:
        """Ops that work position by position: all operands take the split of the split ones."""
        splits = {self.split[o.index] for o in op.operands} - {None}
        if len(splits) == 1:
            split = splits.pop()
            assert split is not None
            if split.dim != exclude:
                as_split = [self._as_split(o, split) for o in op.operands]
                operands = [o for o in as_split if o is not None]
                if len(operands) == len(as_split):
                    return self._add(op, operands, self._shape(op, split)), split
        return self._add(op, [self._whole(o) for o in op.operands], op.shape), None

    def _transpose(self, op: Op) -> tuple[Op, Sharding]:
        src = op.operands[0]
        split = self.split[src.index]
        moved = None if split is None else Split(op.attrs["permutation"].index(split.dim), split.outer)
        return self._add(op, [self.local[src.index]], self._shape(op, moved)), moved

    def _broadcast(self, op: Op) -> tuple[Op, Sharding]:
        src = op.operands[0]
        split = self.split[src.index]
        moved = None if split is None else Split(op.attrs["dims"][split.dim], split.outer)
        return self._add(op, [self.local[src.index]], self._shape(op, moved)), moved

    def _reshape(self, op: Op) -> tuple[Op, Sharding]:
        src = op.operands[0]
        split = self.split[src.index]
        if split is None:
            return self._add(op, [self.local[src.index]], op.shape), None
        moved, size = _moved_split(src.shape, op.shape, split, self.tp, self.padded)
        if moved is None and size and size < self.tp and not self.trained and self._grouped(op, size):
            linear = self._column_linear(src)
            if linear is not None:  # fewer KV heads than ranks: every rank computes all of them,
                self.found_whole_dots.add(linear.index)  # from the next pass on; this pass goes on
                return self._add(op, [self._whole(src)], op.shape), None  # to find the others
        if moved is None and size:
            raise ShardingError(
                f"tp_degree {self.tp} does not divide the {size} heads (or groups) that "
                f"{op.describe()} splits {list(src.shape)} into {list(op.shape)}: choose a "
                f"tp_degree that divides the number of attention and KV heads")
        if moved is None:
            return self._add(op, [self._whole(src)], op.shape), None
        return self._add(op, [self.local[src.index]], self._shape(op, moved)), moved

    def _grouped(self, op: Op, heads: int) -> bool:
        """``op`` makes KV heads that the attention then repeats for their query groups
        (transformers' ``repeat_kv``: ``[b, kv, 1, s, hd]`` broadcast to ``[b, kv, g, s, hd]``),
        found among the ops of its layer that read it, directly or not. Query heads, and the KV
        heads of multi-head attention, are not repeated."""
        seen, stack = {op.index}, [op]
        while stack:
            for user in self.users.get(stack.pop().index, []):
                if user.index in seen or user.layer != op.layer:
                    continue
                seen.add(user.index)
                src = user.operands[0].shape
                if user.opcode == "broadcast" and len(src) == len(user.shape) and any(
                        src[d] == heads and src[d + 1] == 1 and user.shape[d + 1] > 1
                        for d in range(len(src) - 1)):
                    return True
                stack.append(user)
        return False

    def _column_linear(self, op: Op) -> Op | None:
        """The column-parallel linear ``op`` comes from, through its bias add and reshapes, or None."""
        while op.opcode != "dot":
            if op.opcode not in ("reshape", "convert", "add") or op.index in self.whole_dots:
                return None
            varying = [o for o in op.operands if not _is_weight(o) and o.opcode != "broadcast"]
            if len(varying) != 1:
                return None
            op = varying[0]
        return op if op.index not in self.whole_dots and any(_is_weight(o) for o in op.operands) else None

    def _reduce(self, op: Op) -> tuple[Op, Sharding]:
        src = op.operands[0]
        split = self.split[src.index]
        dims = op.attrs["dimensions"]
        if split is None:
            return self._add(op, [self.local[src.index]], op.shape), None
        if split.dim in dims:
            kept = self.local[src.index]
            if self._is_padded(src, split) and op.attrs["kind"] in ("sum", "max"):  # padding reduces
                kept = self._masked(src, kept, split, 0.0 if op.attrs["kind"] == "sum" else -_HUGE)
            if op.attrs["kind"] == "sum":
                return self._add(op, [kept], op.shape), PARTIAL
            if op.attrs["kind"] == "max" and self.trained:  # a vocabulary-parallel softmax's
                local = self._add(op, [kept], op.shape)  # row maxima, as
                return self._all_reduce(local, "max"), None  # Megatron's cross-entropy
            return self._add(op, [self._whole(src)], op.shape), None
        moved = Split(split.dim - sum(1 for d in dims if d < split.dim), split.outer)
        return self._add(op, [self.local[src.index]], self._shape(op, moved)), moved

    def _last_dim_op(self, op: Op) -> tuple[Op, Sharding]:
        """Softmax and norms work along the last dim: split elsewhere they stay split."""
        x = op.operands[0]
        split = self.split[x.index]
        params = [self._whole(p) for p in op.operands[1:]]
        if split is None or split.dim == len(op.shape) - 1:
            return self._add(op, [self._whole(x), *params], op.shape), None
        return self._add(op, [self.local[x.index], *params], self._shape(op, split)), split

    def _slice(self, op: Op) -> tuple[Op, Sharding]:
        src = op.operands[0]
        split = self.split[src.index]
        attrs = op.attrs
        if split is None:
            return self._add(op, [self.local[src.index]], op.shape), None
        d = split.dim
        if not (attrs["starts"][d] == 0 and attrs["limits"][d] == src.shape[d] and attrs["strides"][d] == 1):
            return self._add(op, [self._whole(src)], op.shape), None
        limits = list(attrs["limits"])
        limits[d] = self._shape(op, split)[d]
        return self._add(op, [self.local[src.index]], self._shape(op, split), limits=tuple(limits)), split

    def _dot(self, op: Op) -> tuple[Op, Sharding]:
        lhs, rhs = op.operands
        n = len(op.shape)
        lc, rc = op.attrs["lhs_contract"], op.attrs["rhs_contract"]
        lf = n - 2 if lc == n - 1 else n - 1
        rf = n - 1 if rc == n - 2 else n - 2
        sl, sr = self.split[lhs.index], self.split[rhs.index]
        local_l, local_r = self.local[lhs.index], self.local[rhs.index]
        if lhs.index in self.seq:  # sequence parallelism: a linear reads all the tokens
            local_l, sl = self._all_tokens(lhs), None
        if rhs.index in self.seq:
            local_r, sr = self._all_tokens(rhs), None

        def build(a: Op | None, b: Op | None, out: Sharding) -> tuple[Op, Sharding] | None:
            if a is None or b is None:
                return None
            if out == PARTIAL and lhs.shape[lc] in self.padded:  # a contraction over the padded
                a = self._masked(lhs, a, Split(lc))  # vocabulary: the padding adds nothing
            made = self._add(op, [a, b], self._shape(op, out))
            free = rhs if out == Split(n - 1) else lhs if out == Split(n - 2) else None
            if out is not None and self._is_padded(op, out) and not (free is not None and _is_weight(free)):
                made = self._masked(op, made, out)  # kept zero on the padding (a constant weight's
            return made, out                        # padding is zeros: its products are already)

        if op.index in self.whole_dots:  # a KV projection every rank computes whole
            return self._add(op, [self._whole(lhs), self._whole(rhs)], op.shape), None
        attempts: list[Callable[[], tuple[Op, Sharding] | None]] = []
        if sl is not None and sl.dim < n - 2:  # batch dims (attention heads) on both sides
            attempts.append(lambda: build(local_l, self._as_split(rhs, sl), sl))
        if sr is not None and sr.dim < n - 2:
            attempts.append(lambda: build(self._as_split(lhs, sr), local_r, sr))
        if sl is not None and sl.dim == lc:  # row-parallel: the contracted dim is split on both sides
            attempts.append(lambda: build(local_l, self._as_split(rhs, Split(rc, sl.outer)), PARTIAL))
        if sr is not None and sr.dim == rc:
            attempts.append(lambda: build(self._as_split(lhs, Split(lc, sr.outer)), local_r, PARTIAL))
        if sl is not None and sl.dim == lf and sr is None:
            attempts.append(lambda: build(local_l, local_r, Split(n - 2, sl.outer)))
        if sr is not None and sr.dim == rf and sl is None:
            attempts.append(lambda: build(local_l, local_r, Split(n - 1, sr.outer)))
        for attempt in attempts:
            result = attempt()
            if result is not None:
                return result
        a, b = self._whole(lhs), self._whole(rhs)
        if self._is_weight(rhs) and not self._is_weight(lhs) and self._column_splittable(rhs, rf):
            column = self._localize(rhs, Split(rf))  # column-parallel
            if column is not None:
                return self._add(op, [a, column], self._shape(op, Split(n - 1))), Split(n - 1)
        if self._is_weight(lhs) and not self._is_weight(rhs) and self._column_splittable(lhs, lf):
            column = self._localize(lhs, Split(lf))
            if column is not None:
                return self._add(op, [column, b], self._shape(op, Split(n - 2))), Split(n - 2)
        return self._add(op, [a, b], op.shape), None

    def _is_weight(self, op: Op) -> bool:
        """A trained weight: a constant (:func:`_is_weight`) or, in a training step, a trained input."""
        if _is_weight(op):
            return True
        while op.opcode in ("convert", "transpose", "reshape", "slice"):
            op = op.operands[0]
        return op.opcode == "parameter" and op.name in self.trained and len(op.shape) >= 1

    def _column_splittable(self, weight: Op, dim: int) -> bool:
        """Linears are split by output features; fewer features than ranks (a 2-class head) stay
        whole on every rank, and so does a head whose features ``tp`` does not divide (a 3-label
        classifier at tp 2: no other matmul reads its result, as NxD keeps such a head a plain
        replicated ``nn.Linear``); any other size ``tp`` does not divide is an error, as in
        Megatron."""
        features = weight.shape[dim]
        if self.tp == 1 or features < self.tp:
            return False
        if features % self.tp and features not in self.padded:
            if self._is_head(self.current):
                return False
            raise ShardingError(
                f"tp_degree {self.tp} does not divide the {features} output features of "
                f"{self.current.describe()}: choose a tp_degree that divides the layer sizes")
        return True

    def _is_head(self, op: Op) -> bool:
        """No matmul or convolution reads ``op``'s result, directly or through other ops: the
        network's last linear on its path to the outputs (a classifier head)."""
        seen, stack = {op.index}, [op]
        while stack:
            for user in self.users.get(stack.pop().index, []):
                if user.opcode in ("dot", "convolution"):
                    return False
                if user.index not in seen:
                    seen.add(user.index)
                    stack.append(user)
        return True

    def _iota_block(self, op: Op, split: Split, shape: tuple[int, ...], suffix: str) -> Op | None:
        """A rank's block of an iota along the split dim: the local iota plus the rank's first
        position (a per-rank input), e.g. the vocabulary ids a one-hot over a vocabulary-split
        tensor compares with (a cross-entropy's target mask, the embedding's backward). Training
        only (inference keeps its layouts)."""
        if not self.trained or split.outer != 1:
            return None
        rows = shape[split.dim]
        b = self.b
        local = self._add(op, [], shape, suffix)
        start = b.add_op("parameter", [], (), op.dtype, name=f"tp_start.{len(self.rank_params)}",
                         number=0)
        self.rank_params.append(start)
        self.rank_inputs.append(functools.partial(_rank_start, rows, op.dtype.numpy))
        return b.add(local, b.broadcast(start, shape, ()))

    def _dot_block(self, op: Op, split: Split, shape: tuple[int, ...], suffix: str) -> Op | None:
        """A rank's block of a dot every rank would compute whole, split along a free dim: the dot of
        the operand that dim comes from, cut to its block, with the other whole (the gradient of a
        vocabulary-split embedding: ``one_hot(ids)^T @ grad`` on the rank's vocabulary rows)."""
        lhs, rhs = op.operands
        n, dim = len(op.shape), split.dim
        lc, rc = op.attrs["lhs_contract"], op.attrs["rhs_contract"]
        lf = n - 2 if lc == n - 1 else n - 1
        rf = n - 1 if rc == n - 2 else n - 2
        a: Op | None
        c: Op | None
        if dim == n - 2:
            a, c = self._localize(lhs, Split(lf, split.outer)), self._whole(rhs)
        elif dim == n - 1:
            a, c = self._whole(lhs), self._localize(rhs, Split(rf, split.outer))
        else:
            a, c = self._localize(lhs, split), self._localize(rhs, split)
        if a is None or c is None:
            return None
        made = self._add(op, [a, c], shape, suffix)
        return self._masked(op, made, split) if self._is_padded(op, split) else made

    def _rng_block(self, op: Op, split: Split, shape: tuple[int, ...], suffix: str) -> Op:
        """A rank's block of a random tensor (dropout's uniforms in a parallel region: its heads of an
        attention-probability mask), drawn alone: the rng reads (seed, offset, rank) and counts each
        element at its place in the whole tensor (``ir.philox.block_indices``), so the ranks' blocks
        are exactly the one-core tensor's and no rank draws the others' numbers. Where the random
        value meets only replicated ones it stays whole, drawn alike on every rank from the same
        state (Megatron: dropout in the replicated regions is the same on every rank)."""
        b = self.b
        if self.rank_word is None:
            with b.located("model", ()):
                self.rank_word = b.add_op("parameter", [], (1,), DType.FP32, name="tp_rank", number=0)
            self.rank_params.append(self.rank_word)
            self.rank_inputs.append(_rank_word)
        state = self._whole(op.operands[0])
        keyed = self.rank_keyed.get(state.index)
        if keyed is None:
            keyed = b.concatenate([state, self.rank_word], 0)
            keyed.name = f"{state.name}.tp_rank"
            self.rank_keyed[state.index] = keyed
        made = b.rng_uniform(keyed, shape, int(op.attrs["stream"]),
                             block=(op.shape, split.dim, split.outer, self.tp))
        made.name = op.name + suffix
        return made

    # -- embeddings and the cross-entropy -------------------------------------------------------
    def _target_pick(self, op: Op) -> Op | None:
        """Megatron's vocabulary-parallel cross-entropy, its target logit: a gather of one entry per
        row from a ``[rows, vocab]`` value split along the vocabulary (the log-probabilities of a
        column-parallel LM head), flattened to ``[rows * vocab, 1]`` and indexed by
        ``row * vocab + target``. Each rank looks the target up in its own block when the target
        falls in its vocabulary range and gives 0 otherwise; the partial sums are all-reduced, so the
        whole logits are never gathered. None when ``op`` is not such a pick."""
        table, ids = op.operands
        if not self.trained or table.opcode != "reshape" or len(table.shape) != 2 or table.shape[1] != 1:
            return None
        src = table.operands[0]
        if len(src.shape) != 2 or self.split.get(src.index) != Split(1):
            return None
        rows, vocab = src.shape
        target = _row_offsets(ids, vocab)
        if target is None or ids.shape[0] != rows or op.shape[0] != rows:
            return None
        cols = self._shape(src, Split(1))[1]
        b = self.b
        offset = b.add_op("parameter", [], target.shape, target.dtype,
                          name=f"tp_vocab_offset.{op.name}", number=0)
        self.rank_params.append(offset)
        self.rank_inputs.append(functools.partial(_vocab_offset, target.shape, cols, target.dtype.numpy))
        local_target = b.subtract(self._whole(target), offset)
        clamped = b.maximum(b.minimum(local_target, float(cols - 1)), 0.0)
        mine = b.compare(clamped, local_target, "EQ")
        starts = b.multiply(b.iota(target.shape, 0, target.dtype), float(cols))
        block = b.reshape(self.local[src.index], (rows * cols, 1))
        looked_up = self._add(op, [block, b.add(starts, clamped)], op.shape)
        keep = b.broadcast(mine, op.shape, tuple(range(len(target.shape))))
        return b.select(keep, looked_up, 0.0)


    def _padded_vocabulary(self) -> frozenset[int]:
        """The vocabulary size to pad (Megatron's and NxD's padded vocabulary, transformers-neuronx's
        ``pad_vocab_size``): the rows of the largest gathered table (a training step's trained one,
        an inference program's weight: the token embedding) when ``tp`` does not divide them. Every
        split dim of that size is split in blocks of ``ceil(V / tp)``, the last rank's padded past V:
        weights (the embedding's rows, the LM head's columns) and optimizer state with zeros, the
        padded positions masked out of every reduction and contraction over the vocabulary
        (:meth:`_valid`) and cut off where the value is gathered (:meth:`_gather_split`) or
        returned (:meth:`ShardedGraph.join_output`), so the program equals one core's."""
        if self.tp == 1:
            return frozenset()
        tables = [op.operands[0] for op in self.graph.ops if op.opcode == "gather"]
        tables = [t for t in tables if (self._trained_table(t) if self.trained else _is_weight(t))
                  and len(t.shape) == 2]
        if not tables:
            return frozenset()
        rows = max(tables, key=lambda t: t.size).shape[0]
        return frozenset({rows}) if rows % self.tp else frozenset()

    def _is_padded(self, op: Op, split: Sharding) -> bool:
        """Whether ``op`` split as ``split`` holds padding (its split dim is the padded vocabulary)."""
        return split not in (None, PARTIAL) and split is not None and \
            op.shape[split.dim] // split.outer in self.padded

    def _valid(self, op: Op, split: Split) -> Op:
        """A PRED of ``op``'s local shape: true where the rank's block holds a real vocabulary entry,
        false on the padding (the local iota along the split dim plus the rank's start, below V)."""
        shape = self._shape(op, split)
        key = (shape, split.dim)
        if key in self.valid_masks:
            return self.valid_masks[key]
        if split.outer != 1:
            raise ShardingError(f"{self.current.describe()}: a padded vocabulary folded under another "
                                f"dim ({list(op.shape)}) is not supported: choose a tp_degree that "
                                f"divides the vocabulary")
        b = self.b
        rows = shape[split.dim]
        start = b.add_op("parameter", [], (), DType.INT32, name=f"tp_start.{len(self.rank_params)}",
                         number=0)
        self.rank_params.append(start)
        self.rank_inputs.append(functools.partial(_rank_start, rows, np.dtype(np.int32)))
        position = b.add(b.iota(shape, split.dim, DType.INT32), b.broadcast(start, shape, ()))
        valid = b.compare(position, float(op.shape[split.dim]), "LT")
        self.valid_masks[key] = valid
        return valid

    def _masked(self, op: Op, local: Op, split: Split, fill: float = 0.0) -> Op:
        """``local`` (``op``'s block) with its padded positions set to ``fill``."""
        return self.b.select(self._valid(op, split), local, fill)

    def _vocab_parallel_tables(self) -> set[int]:
        """The gathered weight tables to split by rows: the largest one (the token embedding). In a
        training step, a trained input's (``VocabParallelEmbedding``: its gradient comes out split
        too, the one-hot of the backward cut to the rank's vocabulary rows)."""
        tables = [op.operands[0] for op in self.graph.ops if op.opcode == "gather"]
        tables = [t for t in tables if (self._trained_table(t) if self.trained else _is_weight(t))
                  and len(t.shape) == 2 and (t.shape[0] % self.tp == 0 or t.shape[0] in self.padded)]
        if not tables or self.tp == 1:
            return set()
        largest = max(t.size for t in tables)
        return {t.index for t in tables if t.size == largest}

    def _trained_table(self, op: Op) -> bool:
        while op.opcode == "convert":  # bf16-sr: bf16 weights read as FP32
            op = op.operands[0]
        return op.opcode == "parameter" and op.name in self.trained

    def _gather(self, op: Op) -> tuple[Op, Sharding]:
        table, ids = op.operands
        picked = self._target_pick(op)
        if picked is not None:
            return picked, PARTIAL
        ids_local = self._whole(ids)
        split = self.split[table.index]
        if table.index not in self.vocab_tables or split not in (None, Split(0)):
            return self._add(op, [self._whole(table), ids_local], op.shape), None
        rows = self._shape(table, Split(0))[0]
        part = self._localize(table, Split(0))
        assert part is not None
        b = self.b
        offset = b.add_op("parameter", [], ids.shape, DType.INT32, name=f"tp_vocab_offset.{op.name}",
                          number=0)
        self.rank_params.append(offset)
        self.rank_inputs.append(functools.partial(_vocab_offset, ids.shape, rows, np.int32))
        local_ids = b.subtract(ids_local, offset)
        clamped = b.maximum(b.minimum(local_ids, float(rows - 1)), 0.0)
        mine = b.compare(clamped, local_ids, "EQ")
        looked_up = self._add(op, [part, clamped], op.shape)
        keep = b.broadcast(mine, op.shape, tuple(range(len(ids.shape))))
        return b.select(keep, looked_up, 0.0), PARTIAL


def _row_offsets(op: Op, width: int) -> Op | None:
    """``t`` when ``op`` computes ``iota(rows) * width + t`` (how a gather along the last dim of a
    ``[rows, width]`` value is flattened: a cross-entropy's target pick), else None."""
    if op.opcode != "add":
        return None
    for scaled, t in (op.operands, op.operands[::-1]):
        if scaled.opcode != "multiply":
            continue
        for iota, factor in (scaled.operands, scaled.operands[::-1]):
            while factor.opcode == "broadcast":
                factor = factor.operands[0]
            if (iota.opcode == "iota" and iota.attrs["dimension"] == 0 and factor.opcode == "constant"
                    and factor.attrs.get("value") == width and t.shape == op.shape):
                return t
    return None


def _unique_weight_labels(graph: Graph) -> None:
    """Give each layout of one weight a label of its own. Weights share the HBM tensor of their
    label on purpose (a tied or re-read weight: ``Context.hbm_tensor``), but a weight the model
    reads in two places (ALBERT's one layer, called for every layer) can be split one way where it
    meets a whole input and another way (or kept whole) elsewhere: those are different values, and
    sharing one tensor would make a rank read one layout as the other. Layouts after the first get
    the split in their label (``.../query/bias.tp0``); a weight with one layout keeps its label."""
    layouts: dict[str, dict[Split | None, list[Op]]] = {}
    for op in graph.ops:
        if op.opcode == "constant" and "init" in op.attrs and "label" in op.attrs:
            init = op.attrs["init"]
            split = init.split if isinstance(init, ShardedInitializer) else None
            layouts.setdefault(op.attrs["label"], {}).setdefault(split, []).append(op)
    for label, by_split in layouts.items():
        if len(by_split) < 2:
            continue
        first = next(iter(by_split))
        for split, ops in by_split.items():
            if split is first:
                continue
            outer = f"x{split.outer}" if split is not None and split.outer != 1 else ""
            tag = "whole" if split is None else f"tp{split.dim}{outer}"
            for op in ops:
                op.attrs["label"] = f"{label}.{tag}"


def _unique_names(graph: Graph, copied: set[int]) -> None:
    """Rename ops so that no two share a name. The compiler keys a value's HBM tensor by its op's
    name (``Context.hbm_tensor`` returns the tensor already declared under a name), so two ops of
    one name that both reach HBM would silently share one buffer. The pass's own helper ops are
    named ``<opcode>.<n>`` by the builder's counter, which can equal a name copied from the full
    graph (``compare.257``); which names collide depends on the order ops are made, e.g. on which
    inputs are split from the start. The op keeping a name is a parameter, else one named after the
    full graph's op (profiles attribute it), else the first; the others get ``.<k>`` appended."""
    by_name: dict[str, list[Op]] = {}
    for op in graph.ops:
        by_name.setdefault(op.name, []).append(op)
    taken = set(by_name)
    for name, ops in by_name.items():
        if len(ops) < 2:
            continue
        keeper = min(ops, key=lambda o: (o.opcode != "parameter", id(o) not in copied, o.index))
        k = 0
        for op in ops:
            if op is keeper:
                continue
            while f"{name}.{k}" in taken:
                k += 1
            op.name = f"{name}.{k}"
            taken.add(op.name)


def _still_read(outputs: list[Op], replaced: dict[int, Op]) -> set[int]:
    """Graph inputs whose whole (replaced) op a live op still reads."""
    whole = {id(op): index for index, op in replaced.items()}
    return {whole[id(op)] for op in reachable(outputs) if id(op) in whole}


def _weight_view(op: Op) -> tuple[Initializer | IndexedInitializer, Op, str] | None:
    """``op``'s values as an initializer of its own when it is a trained weight seen through
    slices and reshapes (an initializer materialises at any shape of its size): the initializer,
    the weight constant it reads and a label naming the part."""
    if op.opcode == "constant":
        init = op.attrs.get("init")
        if not isinstance(init, _WEIGHT_INITS):
            return None
        return init, op, str(op.attrs.get("label", op.name))
    if op.opcode not in ("reshape", "slice"):
        return None
    src = op.operands[0]
    inner = _weight_view(src)
    if inner is None or op.opcode == "reshape":
        return None if inner is None else (inner[0], inner[1], f"{inner[2]}{list(op.shape)}")
    init, root, label = inner
    current = src.shape
    parts = []
    for axis, (start, limit, stride) in enumerate(zip(op.attrs["starts"], op.attrs["limits"],
                                                       op.attrs["strides"])):
        parts.append(f"{start}:{limit}" + (f":{stride}" if stride != 1 else ""))
        if (start, limit, stride) != (0, current[axis], 1):
            init = IndexedInitializer(init, current, axis, tuple(range(start, limit, stride)))
            current = (*current[:axis], len(range(start, limit, stride)), *current[axis + 1:])
    return init, root, f"{label}[{','.join(parts)}]"


def _sliced_weight(op: Op) -> bool:
    """``op`` reads part of a trained weight through slices and reshapes (at least one slice)."""
    sliced = False
    while op.opcode in ("reshape", "slice"):
        sliced = sliced or op.opcode == "slice"
        op = op.operands[0]
    return sliced and _weight_view(op) is not None


def _is_weight(op: Op) -> bool:
    """A trained constant, possibly cast, relaid out or sliced (one expert of a stacked experts
    tensor): what a linear layer's weight looks like."""
    while op.opcode in ("convert", "transpose", "reshape", "slice"):
        op = op.operands[0]
    return op.opcode == "constant" and "init" in op.attrs and len(op.shape) >= 1



__all__ = ["PARTIAL", "ShardedGraph", "ShardedInitializer", "Sharding", "ShardingError", "Split", "block_of",
           "join_blocks", "rank_block", "shard"]

