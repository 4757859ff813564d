"""Contractions on the Tensor engine: LoadStationary (LDWEIGHTS) + MultiplyMoving (MATMUL) into PSUM.

``dot(lhs [.., M, K], rhs [.., K, N])`` is tiled to the PE limits (K <= 128 on partitions, stationary
free M <= 128, moving free N <= 512 = one PSUM bank of FP32). The stationary operand is ``lhs^T``
tiles ``[k, m]``, the moving operand ``rhs`` tiles ``[k, n]``; operands whose contracting dim is not
their row dim are transposed on the PE (matmul against an identity) unless they are weights, which
the compiler stores pre-transposed in HBM.

Operands that live in HBM are streamed in blocks ``(Mb, Nb, Kb)`` chosen by a small planner that
minimises max(PE time, DMA time, Vector time) within an SBUF budget: when K is split across blocks the
partial sums are accumulated in SBUF by the Vector engine (as the NKI tutorial's blocked kernel does).
PSUM banks are used in groups of up to four so eviction (alternating Scalar and Vector) overlaps the
next group's matmuls.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from neuroncore.compiler import costs
from neuroncore.compiler.context import Context
from neuroncore.compiler.counters import NodeCounters, shared_counters
from neuroncore.compiler.emitter import sbuf_key
from neuroncore.compiler.layer_runs import layer_of
from neuroncore.compiler.lower_elementwise import activate, drain, tensor_copy, tensor_scalar, tensor_tensor
from neuroncore.compiler.lower_reduce import RowParams, row_params
from neuroncore.compiler.lowering_state import Accumulation, DotOperandMode, HbmTensorKind, Layout
from neuroncore.compiler.node_semantics import NOP, LoadWeights, MatMul
from neuroncore.compiler.orientation import OrientedDot, epilogue_chain, stored_shape
from neuroncore.compiler.program import RES_TENSOR_LS, RES_TENSOR_MM, Buffer, Ref
from neuroncore.compiler.tiling import P, batch_rows_access, is_packed, locate, tile_grid, tiles_of
from neuroncore.dtypes import DType
from neuroncore.enums import Memory
from neuroncore.hardware import CoreSpec, Engine
from neuroncore.ir.graph import Op

BANK_COLS = 512  # FP32 elements per partition in one PSUM bank
GROUP_BANKS = 4
# a split-K block whose output takes at most this many PSUM banks accumulates over all its
# k-blocks in PSUM (the banks held until the last k-block) [assumption: half the 8 banks, the rest
# left for evacuation overlap and the PE transposes of the next blocks]
PSUM_ACCUMULATION_BANKS = 4
SBUF_BUDGET_FRACTION = 0.7


# -- PE instructions ---------------------------------------------------------------------------


def ldweights(ctx: Context, stationary: Ref, dtype: DType, pad: int = 0,
              stationary2: Ref | None = None) -> int:
    """LoadStationary; ``pad`` zero columns before it place its output rows at PSUM partition pad.
    ``stationary2`` makes it an FP8 double-row load ``[128, 2, M]`` (NC-v3): the 4x128 FP8 input
    path moves both rows in the time of one BF16 row (§2.2) [assumption for LS]."""
    rows, cols = stationary.p1 - stationary.p0, stationary.f1 - stationary.f0
    rows2 = -1 if stationary2 is None else stationary2.p1 - stationary2.p0
    memo = _memo(ctx.spec)[0]
    key = (rows, cols, pad, rows2, id(dtype))  # enum members by identity (Enum.__hash__ is Python)
    known = memo.get(key)
    if known is None:
        known = memo[key] = _ldweights_record(ctx.spec, rows, cols, pad, rows2, dtype)
    cost_ns, shape, counters = known
    reads = [sbuf_key(stationary)] if stationary2 is None else [sbuf_key(stationary), sbuf_key(stationary2)]
    return ctx.em.instruction(
        Engine.TENSOR, "LDWEIGHTS", cost_ns, reads=reads, writes=[], track=RES_TENSOR_LS,
        text=("src=", stationary, " ", shape),  # joined when read (operand_texts.Text)
        semantics=LoadWeights(stationary, stationary2), counters=counters,
    )


def _ldweights_record(spec: CoreSpec, rows: int, cols: int, pad: int, rows2: int,
                      dtype: DType) -> tuple[float, str, NodeCounters]:
    """A LoadStationary's cost, shape text and counters (the same for every load of its shape)."""
    cycles = costs.ldweights_cycles(spec, cols + pad, dtype)
    nbytes = (rows + max(rows2, 0)) * cols * dtype.itemsize
    shape = (f"[{rows}x{cols}]" if rows2 < 0 else f"[{rows}x2x{cols}] perf_mode=double_row")
    return (costs.cycles_to_ns(spec, Engine.TENSOR, cycles), f"{shape} {dtype.profile_name}",
            shared_counters(0, 0, 0, 0, 0, nbytes))  # sbuf_read_bytes


def matmul(ctx: Context, psum: Ref, moving: Ref, stationary: Ref, dtype: DType, position: Accumulation, *,
           transpose: bool = False, moving2: Ref | None = None) -> None:
    """One MultiplyMoving (two FP32_LO_HI passes for FP32 inputs, each recording half the FLOPs).
    ``moving2`` makes it an FP8 double-row MultiplyMoving (NC-v3): K up to 256 in the time of a
    K = 128 BF16 instruction (§3.1)."""
    k = moving.p1 - moving.p0 + (moving2.p1 - moving2.p0 if moving2 is not None else 0)
    m, n = stationary.f1 - stationary.f0, moving.f1 - moving.f0
    memo = _memo(ctx.spec)[1]
    key = (k, m, n, id(dtype), id(position), transpose, moving2 is not None)
    passes = memo.get(key)
    if passes is None:
        passes = memo[key] = _matmul_passes(ctx.spec, k, m, n, dtype, position, transpose,
                                            moving2 is not None)
    out = sbuf_key(psum)
    source = [sbuf_key(moving)] if moving2 is None else [sbuf_key(moving), sbuf_key(moving2)]
    for p, (cost_ns, accumulate, suffix, counters) in enumerate(passes):
        ctx.em.instruction(
            Engine.TENSOR, "MATMUL", cost_ns,
            reads=[*source, out] if accumulate else source.copy(),
            writes=[out], track=RES_TENSOR_MM,
            text=("src=", moving, " dst=", psum, " ", suffix),  # joined when read (operand_texts.Text)
            semantics=MatMul(psum, moving, position.accumulates, transpose, moving2)
            if p == 0 else NOP,
            tensor_instruction_type="TRANSPOSE" if transpose else "REGULAR",
            counters=counters,
        )


def _matmul_passes(spec: CoreSpec, k: int, m: int, n: int, dtype: DType, position: Accumulation,
                   transpose: bool, double: bool) -> tuple[tuple[float, bool, str, NodeCounters], ...]:
    """Each pass of a MultiplyMoving of this shape: (cost, accumulates, text after the operands,
    counters): the same for every instruction of its shape, so made once."""
    flops = 2 * k * m * n
    passes = 2 if dtype is DType.FP32 and not transpose else 1
    cycles: float
    if transpose:
        cycles = costs.pe_transpose_cycles(spec, k, m)
    else:
        cycles = costs.matmul_cycles(spec, n, dtype) / passes
    cost_ns = costs.cycles_to_ns(spec, Engine.TENSOR, cycles)
    nbytes_in = k * n * dtype.itemsize
    out = []
    for p in range(passes):
        label = ("lo", "hi")[p] if passes == 2 else ""
        # (raw, adjusted, transpose FLOPs, HBM read, write, SBUF read, write, PSUM read, write)
        if transpose:
            counters = shared_counters(0, 0, flops, 0, 0, nbytes_in, 0, 0, m * n * 4)
        else:
            counters = shared_counters(flops // passes,
                                       int(flops // passes * costs.adjusted_flops_factor(spec, dtype)),
                                       0, 0, 0, nbytes_in, 0, 0, m * n * 4)
        suffix = (f"acc={position}{' fp32_pass=' + label if label else ''}"
                  f"{' transpose' if transpose else ''}{' perf_mode=double_row' if double else ''}"
                  f" {dtype.profile_name} {k}x{m}x{n}")
        out.append((cost_ns, position.accumulates or p > 0, suffix, counters))
    return tuple(out)


_LsMemo = dict[tuple[object, ...], tuple[float, str, NodeCounters]]
_MmMemo = dict[tuple[object, ...], tuple[tuple[float, bool, str, NodeCounters], ...]]
# per core spec (by identity; the entry keeps the spec alive, so its id is not reused): shape ->
# a LoadStationary's / MultiplyMoving's record (``ldweights``, ``matmul``)
_MEMOS: dict[int, tuple[CoreSpec, _LsMemo, _MmMemo]] = {}
_MEMO_LIMIT = 4096  # records per spec kept at most (then the memo starts again)


def _memo(spec: CoreSpec) -> tuple[_LsMemo, _MmMemo]:
    entry = _MEMOS.get(id(spec))
    if entry is None or entry[0] is not spec or len(entry[1]) + len(entry[2]) > _MEMO_LIMIT:
        if len(_MEMOS) > 16:
            _MEMOS.clear()
        entry = _MEMOS[id(spec)] = (spec, {}, {})
    return entry[1], entry[2]


def pe_transpose(ctx: Context, src: Ref, dst: Ref, dtype: DType, evac_engine: Engine) -> None:
    """dst[f, p] = src[p, f]: LS the block, multiply an identity through it, evacuate PSUM."""
    ident = ctx.identity(dtype)
    bank = ctx.alloc_psum(P, BANK_COLS, "transpose")
    # the result lands on dst's partitions: the stationary goes in at that PE column offset
    out = Ref(bank.id, dst.p0, dst.p0 + src.cols, 0, src.rows)
    ldweights(ctx, src, dtype, pad=dst.p0)
    diagonal = Ref(ident.buf, src.p0, src.p1, src.p0, src.p1)  # the identity on src's partitions
    matmul(ctx, out, diagonal, src, dtype, Accumulation.WHOLE, transpose=True)
    tensor_copy(ctx, dst, out, evac_engine)
    ctx.free(bank)


def lower_pe_transpose(ctx: Context, op: Op) -> None:
    """A transpose of the last two dims, 128x128 blocks through the PE.

    Packed values (several small batches per tile, e.g. the 64-row heads of ``K^T``) are handled
    block by block: a batch's block sits at a partition offset of its source tile, and its
    transpose lands at its own offset of the output tile (the stationary placed at that PE column
    offset), so engines never move data across partitions."""
    src = op.operands[0]
    value = ctx.define(op)
    batches = math.prod(op.shape[:-2])
    out_rows, out_cols = op.shape[-2], op.shape[-1]  # source cols, source rows
    work: dict[int, list[tuple[int, int, int]]] = {}  # output tile -> (batch, first row, partition)
    for b in range(batches):
        for r0 in range(0, out_rows, P):
            t_out, p_out = locate(op.shape, Layout.ROW, b, r0)
            work.setdefault(t_out, []).append((b, r0, p_out))
    engines = _alternating()
    for t in range(len(value.tiles)):
        out = ctx.produce(op, t)
        for b, r0, p_out in work.get(t, []):
            r1 = min(out_rows, r0 + P)
            for s0 in range(0, out_cols, P):
                s1 = min(out_cols, s0 + P)
                t_src, p_src = locate(src.shape, Layout.ROW, b, s0)
                s_ref = ctx.tile(src, t_src)
                block = Ref(s_ref.buf, s_ref.p0 + p_src, s_ref.p0 + p_src + s1 - s0,
                            s_ref.f0 + r0, s_ref.f0 + r1)
                dst = Ref(out.buf, out.p0 + p_out, out.p0 + p_out + r1 - r0, out.f0 + s0, out.f0 + s1)
                pe_transpose(ctx, block, dst, op.dtype, next(engines))
                ctx.release(src, s_ref)
        ctx.produced(op, t, out)
        ctx.unpin_all()


def _alternating() -> Iterator[Engine]:
    while True:
        yield Engine.SCALAR
        yield Engine.VECTOR


# -- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    mb: int
    nb: int
    kb: int
    estimate_ns: float
    traffic_bytes: int
    # buffers (bytes per partition) that must fit at once, when resident values are to be spilled
    # to make room for them (``Context.make_room``); empty when the plan fits in what is free
    room: tuple[int, ...] = ()
    spill_bytes: int = 0  # the spill's DMA traffic counted in the estimate (stores + reloads)


def _row_efficiency(spec: CoreSpec, row_bytes: int) -> float:
    ideal = row_bytes * 1e9 / spec.dma_engine_bytes_per_s
    return ideal / (ideal + spec.dma_descriptor_overhead_ns)


def plan_blocks(spec: CoreSpec, m: int, k: int, n: int, dtype: DType, *, a_streamed: bool,
                b_streamed: bool, a_transposed: bool, b_transposed: bool, batches: int = 1,
                a_ktiled: bool = False, b_ktiled: bool = False,
                fits: Callable[[list[int]], bool] | None = None,
                resident_out: list[int] | None = None,
                spill: Callable[[list[int]], tuple[int, int] | None] | None = None,
                parts: tuple[int, ...] = ()) -> Plan:
    """Choose block sizes: least estimated time, then least traffic, then fewest blocks.

    Streamed blocks are double-buffered, so they count twice against the budget: a fraction of
    SBUF, or of what is free right now when resident values already take space. ``spill`` (the
    bytes of DMA traffic and the transfers that spilling resident values to make room for these
    buffers would cost, None if it cannot be done) lets a plan that does not fit in free SBUF
    compete, the spill's time added to its estimate: values the dot does not read are moved out
    rather than the dot shrunk to the smallest block (a 13B layer backward's qkv dots collapsed to
    128 x 512 x 128 under ~120 KB of resident gradients they do not read). A spilling plan is taken
    only for a strictly shorter estimate than the best without a spill, never to break a tie.

    ``parts``: the widths of dots sharing the stationary operand (``shared_stationary``), whose
    ``n`` is their sum: an n-block never spans two of them (each reads its own moving operand and
    writes its own output), so blocks are counted per part and ``nb`` is at most the widest.
    """
    item = dtype.itemsize
    widths = parts or (n,)
    widest = max(widths)

    def n_blocks(nb: int) -> int:
        return sum(math.ceil(w / nb) for w in widths)

    n_banks = n_blocks(BANK_COLS)
    budget = SBUF_BUDGET_FRACTION * spec.sbuf_bytes_per_partition

    def options(size: int, step: int) -> list[int]:
        values = {size}
        b = step
        while b < size:
            values.add(b)
            b *= 2
        return sorted(values)

    mm_cycles = costs.matmul_cycles(spec, BANK_COLS, dtype)

    def estimate(mb: int, nb: int, kb: int) -> tuple[float, int]:
        """(estimated ns, HBM traffic bytes) of one choice of blocks."""
        kt = math.ceil(kb / P)
        split_k = kb < k
        reloads_a = n_blocks(nb) if split_k else 1
        traffic_a = m * k * item * reloads_a if a_streamed else 0
        traffic_b = k * n * item * math.ceil(m / mb) if b_streamed else 0
        # k-tiled weights move one run per partition per block; others one row per k
        eff_a = _row_efficiency(spec, (kt if a_ktiled else 1) * min(mb, m) * item)
        eff_b = _row_efficiency(spec, (kt if b_ktiled else 1) * min(nb, widest) * item)
        dma_ns = (traffic_a / eff_a + traffic_b / eff_b) / spec.dma_bytes_per_s * 1e9 * batches
        mms = (math.ceil(m / P) * n_banks
               * math.ceil(k / costs.contraction_per_matmul(spec, dtype)) * batches)
        pe_ns = mms * mm_cycles * 1e9 / spec.pe_clock_hz
        if a_transposed:
            pe_ns += (math.ceil(m / P) * math.ceil(k / P) * reloads_a * batches
                      * P * 1e9 / spec.pe_clock_hz)
        acc_ops = math.ceil(m / P) * n_banks * math.ceil(k / kb) * batches
        dve_ns = acc_ops * costs.vector_cycles(spec, "tensor_tensor", BANK_COLS, inputs_in_psum=1) \
            * 1e9 / spec.vector_clock_hz if split_k else 0.0
        return max(pe_ns, dma_ns, dve_ns), traffic_a + traffic_b

    best: Plan | None = None  # the best that fits in what is free
    best_rank: tuple[float, int, int] | None = None
    spilling: Plan | None = None  # the best that fits once resident values are spilled
    spilling_rank: tuple[float, int, int] | None = None
    for mb, nb, kb in itertools.product(options(m, P), options(widest, BANK_COLS), options(k, P)):
        kt = math.ceil(kb / P)
        split_k = kb < k
        a_bytes = kt * mb * item if (a_streamed or a_transposed) else 0
        b_bytes = kt * nb * item * 2 if (b_streamed or b_transposed) else 0
        a_bytes *= 2 if split_k else 1
        acc_bytes = math.ceil(mb / P) * nb * 4 if split_k else 0
        stage = min(nb, BANK_COLS) * 4 * 2  # output staging, per partition
        if a_bytes + b_bytes + acc_bytes + stage > budget:
            continue
        ns, traffic = estimate(mb, nb, kb)
        blocks = math.ceil(m / mb) * n_blocks(nb) * math.ceil(k / kb)
        rank = (ns, traffic, blocks)
        if best_rank is not None and rank >= best_rank:
            continue  # cannot win even if it fits as it is
        if fits is not None:
            one_a = kt * mb * item if (a_streamed or a_transposed) else 0
            one_b = kt * nb * item if (b_streamed or b_transposed) else 0
            sizes = [x for x in (one_a, one_a if split_k else 0, one_b, one_b) if x]
            sizes += [acc_bytes] if split_k else []  # the partial sums: one allocation (_blocks)
            sizes = [*sizes, stage, *(resident_out or [])]
            if not fits(sizes):
                # a plan that evicts values to make its room takes at most the budget with its
                # resident outputs too: the rest is slack for the order buffers are placed in
                if (spill is None or sum(sizes) > budget
                        or (spilling_rank is not None and rank >= spilling_rank)):
                    continue
                spilt = spill(sizes)
                if spilt is None:
                    continue
                moved, transfers = spilt
                # the stores finish before the blocks land in the room they make, and a reload
                # before its reader: neither overlaps the dot's own work [assumption]. The DMA's
                # fixed cost is latency (the compiler's programs keep many transfers in flight:
                # Program.dma_queue_serial is False), paid once by the stores and once by the
                # reloads, not once per transfer in series (which priced a spill of BERT-large's
                # resident gradients, 16 row tiles each, above its q_proj dots' smallest blocks)
                ns += moved / spec.dma_bytes_per_s * 1e9 + min(transfers, 2) * spec.dma_fixed_latency_ns
                spill_rank = (ns, traffic + moved, blocks)
                if spilling_rank is None or spill_rank < spilling_rank:
                    spilling = Plan(mb, nb, kb, ns, traffic + moved, tuple(sizes), moved)
                    spilling_rank = spill_rank
                continue
        best = Plan(mb, nb, kb, ns, traffic)
        best_rank = rank
    # a spill is taken only for a strictly shorter estimate than the best without one (or than
    # the smallest blocks, what is done when nothing fits): never to break a tie
    if spilling is not None:
        unspilled = best.estimate_ns if best is not None else estimate(min(m, P), min(widest, BANK_COLS),
                                                                        min(k, P))[0]
        if spilling.estimate_ns < unspilled:
            return spilling
    if best is None:
        return Plan(min(m, P), min(widest, BANK_COLS), min(k, P), 0.0, 0)
    return best


def _spill_to_fit(ctx: Context, reads: list[Op]) -> Callable[[list[int]], tuple[int, int] | None]:
    """For :func:`plan_blocks`: the DMA bytes and transfers that spilling resident values (not the dot's own
    operands ``reads``, nor pinned tiles) in the spiller's order would cost to make room for a
    plan's buffers, None if even spilling all of them would not. The victims are listed once; the
    shortest prefix that makes room is found by bisection (freeing more never makes less room)."""
    # made at the first plan that needs it: the victims' ranges, cumulative bytes and transfers
    listed: list[tuple[list[tuple[int, int]], list[int], list[int]]] = []

    def cost(sizes: list[int]) -> tuple[int, int] | None:
        if not listed:
            victims = ctx.spill_victims({root.index for root in _roots(ctx, reads)})
            listed.append(([(v.buf.address, v.buf.bytes_per_partition) for v in victims],
                           list(itertools.accumulate((v.save_bytes + v.reload_bytes for v in victims),
                                                     initial=0)),
                           list(itertools.accumulate((bool(v.save_bytes) + bool(v.reload_bytes)
                                                      for v in victims), initial=0))))
        ranges, moved, transfers = listed[0]
        if not ranges or not ctx.sbuf.fits_freeing(sizes, ranges):
            return None
        lo, hi = 1, len(ranges)  # the answer is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if ctx.sbuf.fits_freeing(sizes, ranges[:mid]):
                hi = mid
            else:
                lo = mid + 1
        return moved[lo], transfers[lo]

    return cost


def _roots(ctx: Context, ops: list[Op]) -> list[Op]:
    """The values whose tiles reading ``ops`` touches: each op and what it aliases or views."""
    out: list[Op] = []
    for op in ops:
        value = ctx.values.get(op.index)
        out.append(op)
        while value is not None and (value.alias is not None or value.slice_root is not None):
            source = value.alias if value.alias is not None else value.slice_root
            assert source is not None
            out.append(source)
            value = ctx.values.get(source.index)
    return out


def _plan_dot(ctx: Context, reads: list[Op], plan: Callable[..., Plan]) -> Plan:
    """Plan a dot within what SBUF holds now, spilling resident values it does not read when a
    bigger block is worth the traffic (:func:`plan_blocks`). An operand that is an HBM view not yet
    made (a concatenation of resident gradients) is made first when a spill is chosen: its sources
    are then in HBM and spilling them costs no store."""
    chosen = plan(fits=ctx.sbuf.fits, spill=_spill_to_fit(ctx, reads))
    if not chosen.room:
        return chosen
    pending = [ctx.values[op.index] for op in _roots(ctx, reads)
               if op.index in ctx.values and ctx.values[op.index].lazy is not None
               and ctx.values[op.index].home is Memory.HBM]
    if pending:
        for value in pending:
            ctx.prepare(value)
        chosen = plan(fits=ctx.sbuf.fits, spill=_spill_to_fit(ctx, reads))
        if not chosen.room:
            return chosen
    keep = {root.index for root in _roots(ctx, reads)}
    ctx.make_room(list(chosen.room), ctx.spill_victims(keep))
    ctx.stats["plan_spill_bytes"] = ctx.stats.get("plan_spill_bytes", 0) + chosen.spill_bytes
    return chosen


# -- the dot lowering ----------------------------------------------------------------------------


def _batches(shape: tuple[int, ...]) -> int:
    """Logical batches of a row-layout value: every dim but the last two."""
    return math.prod(shape[:-2]) if len(shape) > 2 else 1


class _Operand:
    """Serves ``[k, x]`` tiles (K on partitions) of one dot operand, whatever its placement."""

    def __init__(self, ctx: Context, op: Op, contract_is_row: bool, free_size: int, k: int) -> None:
        self.ctx = ctx
        self.op = op
        self.value = ctx.values[op.index]
        while self.value.alias is not None:
            self.value = ctx.values[self.value.alias.index]
        self.k = k
        self.free_size = free_size
        # a feature-major value (compiler.orientation) holds its transpose: its last dim is on
        # partitions, so contracting over it reads the tiles in place
        self.shape = self.value.stored_shape
        if not self.value.transposed and _batches(op.shape) > 1 \
                and _batches(op.shape) != _batches(self.shape):
            # a reshape that regroups the rows it aliases into other batches (the same tiles, as
            # _try_alias checks): the dot's batch index counts the operand's batches, so its
            # tiles are located in the operand's shape. Split into more ([32, 16] read as
            # [2, 16, 16]): in the root's shape, batch 1 of SegFormer's attention was one tile
            # past the last. Merged into fewer (JAX's attention gradient reads a [2, 8, 1, 8]
            # value as [2, 8, 8]): batch 1 was the root's batch 1, one row, not eight (silently
            # wrong). A reshape to one batch is read in the root's shape, as before: its only
            # batch is 0.
            self.shape = op.shape
        if self.value.transposed:
            contract_is_row = not contract_is_row
        self.contract_is_row = contract_is_row
        self.pretransposed = getattr(ctx.values[op.index], "pretransposed", False)
        # resident in row layout -- the operand's own layout too: a reshape aliasing a [.., R, 1]
        # value can be its column view ([N, C, 1, 1] -> [N, C] in COL layout), not its rows
        resident = (self.value.home is Memory.SBUF and self.value.immediate is None
                    and self.value.lazy is None and self.value.layout == Layout.ROW
                    and ctx.values[op.index].layout == Layout.ROW)
        self.packed = is_packed(self.shape, Layout.ROW)
        self.mode = (DotOperandMode.DIRECT if contract_is_row and resident and not self.packed else
                     DotOperandMode.LOAD if contract_is_row or self.pretransposed else
                     DotOperandMode.TRANSPOSE)
        self.streamed = (self.mode is DotOperandMode.LOAD
                         or (self.mode is DotOperandMode.TRANSPOSE and not resident))
        tensor = ctx.hbm_tensors.get(ctx.values[op.index].hbm or "")
        self.ktiled = (self.mode is DotOperandMode.LOAD and tensor is not None
                       and tensor.kind is HbmTensorKind.WEIGHT)
        self.engines = _alternating()
        # DIRECT refs that are temporaries (not a resident tile), decided when handed out: a held
        # block is unpinned once the next one is multiplied, so a resident tile of it may be
        # spilled (its buffer freed) before the block is released
        self.temporary: set[int] = set()

    def block(self, b: int, k0: int, k1: int, x0: int, x1: int, pad_to: int = 0) -> list[Ref]:
        """Refs ``[k rows, x1-x0]`` for each 128-row k-tile in [k0, k1); temporaries pinned.

        Buffers are allocated ``pad_to`` wide (the plan's block width) so that every block of a dot
        has the same size and reuses the hole the previous one left, instead of fragmenting SBUF.
        """
        ctx, op = self.ctx, self.op
        refs: list[Ref] = []
        kt_per_batch = math.ceil(self.k / P)
        if self.mode is DotOperandMode.DIRECT:
            for kk in range(k0, k1, P):
                t = b * kt_per_batch + kk // P
                ref = ctx.tile(op, t)
                if not ctx.holds(op, ref):
                    self.temporary.add(ref.buf)
                refs.append(Ref(ref.buf, ref.p0, ref.p1, ref.f0 + x0, ref.f0 + x1))
            return refs
        if self.mode is DotOperandMode.LOAD:
            value = ctx.values[op.index]
            name = ctx.ensure_hbm(op)  # an on-chip value not in row layout is stored first
            stored = ctx.hbm_tensors[name].shape if name in ctx.hbm_tensors else \
                ctx.hbm_views[name].shape
            rows_per_batch = tile_grid(stored, Layout.ROW)[1]
            run = None
            if name in ctx.hbm_views:
                run = ctx.hbm_views[name].run_elements * op.dtype.itemsize
            tensor = ctx.hbm_tensors.get(name or "")
            if tensor is not None and tensor.kind is HbmTensorKind.WEIGHT:
                # weights are stored k-tiled by the compiler: one transfer, one run per partition
                kt = math.ceil((k1 - k0) / P)
                width = x1 - x0
                # a weight loaded whole is prefetched through the weight ring; one streamed in
                # several blocks is double-buffered by its dot (the plan's blocks of one size)
                whole_weight = k1 - k0 == self.k and width == self.free_size
                buf = ctx.alloc(min(P, k1 - k0), kt * max(width, pad_to), op.dtype, f"{op.name}.blk",
                                stream=whole_weight)
                whole = Ref(buf.id, 0, min(P, k1 - k0), 0, kt * width)
                access = batch_rows_access(name, stored, b, k0, k1, x0, x1)
                # the DMA moves the stored type (int8 for a quantised weight, cast in flight)
                ctx.dma_load(ctx.load_queue(value), access, whole, tensor.dtype,
                             rows_per_batch=rows_per_batch, ktiles=kt)
                for j, kk in enumerate(range(k0, k1, P)):
                    refs.append(Ref(buf.id, 0, min(P, k1 - kk), j * width, (j + 1) * width))
                return refs
            for kk in range(k0, k1, P):
                rows = min(P, k1 - kk)
                buf = ctx.alloc(rows, max(x1 - x0, pad_to), op.dtype, f"{op.name}.blk")
                ref = Ref(buf.id, 0, rows, 0, x1 - x0)
                queue = ctx.load_queue(value)
                access = batch_rows_access(name, stored, b, kk, kk + rows, x0, x1)
                ctx.dma_load(queue, access, ref, op.dtype, rows_per_batch=rows_per_batch,
                             run_bytes=run)
                refs.append(ref)
            return refs
        # transpose: rows of the operand are the free dim; its columns are K
        width = max(x1 - x0, pad_to)
        ks = list(range(k0, k1, P))
        buf = ctx.alloc(min(P, k1 - k0), len(ks) * width, op.dtype, f"{op.name}.T")
        bufs = [Ref(buf.id, 0, min(P, k1 - kk), j * width, j * width + x1 - x0)
                for j, kk in enumerate(ks)]
        for xx in range(x0, x1, P):
            t, p0 = locate(self.shape, Layout.ROW, b, xx)
            # row tiles whatever the value's own layout; only this k-block's columns (a value that
            # lives in HBM is not loaded whole when K is large)
            src = ctx.tile(op, t, Layout.ROW, (k0, k1))
            nrows = min(x1 - xx, src.rows - p0)
            for j, kk in enumerate(range(k0, k1, P)):
                rows = min(P, k1 - kk)
                block = Ref(src.buf, p0, p0 + nrows, src.f0 + kk - k0, src.f0 + kk - k0 + rows)
                dst = Ref(bufs[j].buf, 0, rows, bufs[j].f0 + xx - x0, bufs[j].f0 + xx - x0 + nrows)
                pe_transpose(ctx, block, dst, op.dtype, next(self.engines))
            ctx.release(op, src)
        return bufs

    def release(self, refs: list[Ref]) -> None:
        if self.mode is DotOperandMode.DIRECT:
            for buf_id in dict.fromkeys(ref.buf for ref in refs):
                if buf_id in self.temporary:
                    self.temporary.discard(buf_id)
                    self.ctx.free(self.ctx.buffers[buf_id])
            return
        for buf_id in dict.fromkeys(ref.buf for ref in refs):
            self.ctx.free(self.ctx.buffers[buf_id])


def lower_dot(ctx: Context, op: Op) -> None:
    """Blocks (Mb, Nb, Kb) from the planner; streamed blocks are double-buffered by releasing the
    previous block only after the next one is loaded."""
    drain(dot_steps(ctx, op))


def dot_steps(ctx: Context, op: Op) -> Iterator[bool]:
    """:func:`lower_dot` one batch at a time (yields True after each: a fusion group advances its
    ops in step)."""
    lhs, rhs = op.operands
    n_dims = len(op.shape)
    lc, rc = op.attrs["lhs_contract"], op.attrs["rhs_contract"]
    batches = math.prod(op.shape[:-2])
    m, n = op.shape[-2], op.shape[-1]
    k = lhs.shape[lc]
    dtype = lhs.dtype  # operand type sets PE cost; the result type (op.dtype) only the evacuation
    oriented = ctx.orientation.heads.get(op.index)
    if oriented is not None:
        yield from _oriented_steps(ctx, op, oriented)
        return
    a = _Operand(ctx, lhs, lc == n_dims - 2, m, k)
    bop = _Operand(ctx, rhs, rc == n_dims - 2, n, k)
    scaled = fused_scale(ctx, op)
    epilogue = fused_epilogue(ctx, op) if scaled is None else None
    target = op
    if scaled is not None:  # the dot writes the scaled product: the multiply's value
        target = scaled.product
        for fused in scaled.fused:
            ctx.lowered_with[fused.index] = op.index
    bias_rows: RowParams | None = None
    if epilogue is not None:  # the evacuation adds the bias and applies the activation
        target = epilogue.product
        for fused in epilogue.fused:
            if fused.index > op.index:
                ctx.lowered_with[fused.index] = op.index
        if epilogue.bias is not None:
            source = epilogue.bias
            if source.index not in ctx.values:  # a bias weight the graph declares after its dot
                from neuroncore.compiler.lower_layout import lower_weight

                lower_weight(ctx, source)
            bias_rows = row_params(ctx, op, source, min(P, m if batches == 1 else P))
    value = ctx.define(target)
    resident_out = ([value.cols * op.dtype.itemsize] * len(value.tiles)
                    if value.home is Memory.SBUF else [])
    reads = [lhs, rhs, *([epilogue.bias] if epilogue is not None and epilogue.bias is not None else []),
             *([scaled.scales] if scaled is not None else [])]
    planner = functools.partial(
        plan_blocks, ctx.spec, m, k, n=n, dtype=dtype, a_streamed=a.streamed, b_streamed=bop.streamed,
        a_transposed=a.mode is DotOperandMode.TRANSPOSE,
        b_transposed=bop.mode is DotOperandMode.TRANSPOSE,
        batches=batches, a_ktiled=a.ktiled, b_ktiled=bop.ktiled)
    siblings = _shared_parts(ctx, op, a, bop, planner, reads, resident_out)
    if siblings:
        widths = (n, *(part.n for part in siblings))
        reads += [r for part in siblings for r in (part.op.operands[1], *(
            [part.epilogue.bias] if part.epilogue is not None and part.epilogue.bias is not None else []))]
        resident_out += [size for part in siblings for size in _resident_bytes(ctx, _target(part))]
        plan = _plan_dot(ctx, reads, functools.partial(planner, n=sum(widths), parts=widths,
                                                       resident_out=resident_out))
        ctx.stats["shared_stationary_dots"] = ctx.stats.get("shared_stationary_dots", 0) + len(siblings)
    else:
        plan = _plan_dot(ctx, reads, functools.partial(planner, resident_out=resident_out))
    for part in (op, *(part.op for part in siblings)):
        ctx.stats.setdefault("dot_plans", {})[part.name] = (plan.mb, plan.nb, plan.kb)
    yield from _blocks(ctx, op, plan, a, bop, (m, n, k), batches, op.shape, scaled, epilogue,
                       bias_rows, None, siblings)
    for rows in [bias_rows, *(part.bias_rows for part in siblings)]:
        if rows is not None:
            ctx.free(ctx.buffers[rows.ready(ctx).buf])


def _target(part: _Part) -> Op:
    """The op whose value a part's evacuation writes (its epilogue's product, or the dot)."""
    return part.epilogue.product if part.epilogue is not None else part.op


def _resident_bytes(ctx: Context, target: Op) -> list[int]:
    """The planner's ``resident_out`` of a value defined as ``target``'s (its row tiles' bytes per
    partition when it stays in SBUF), before it is defined: ``Context.home_of``'s rule."""
    if ctx.home_of(target) is not Memory.SBUF:
        return []
    _, _, cols = tile_grid(target.shape, Layout.ROW)
    return [cols * target.dtype.itemsize] * len(tiles_of(target.shape, Layout.ROW))


COPY_OPS = frozenset({"reshape", "convert"})  # what a frontend repeats per linear (the view, the auto-cast)


def copies_of(ctx: Context, op: Op, x: Op) -> dict[int, tuple[Op, ...]]:
    """``x`` and the later copies of it that common-subexpression elimination would make one
    value: the same chain of reshapes and casts of the same source, each link read only by the
    next (torch's ``Linear`` reshapes its input, and the tracer's auto-cast casts it, once per
    linear: BERT's q, k and v each read their own cast of their own view of the hidden states).
    Maps each copy's index to its links not yet lowered (empty for ``x`` itself)."""
    chain = [x]
    while chain[-1].opcode in COPY_OPS:
        chain.append(chain[-1].operands[0])
    ops = ctx.graph.ops
    found: dict[int, tuple[Op, ...]] = {chain[-1].index: ()}
    for link in reversed(chain[:-1]):
        step: dict[int, tuple[Op, ...]] = {}
        for index, made in found.items():
            for user in ctx.uses[index]:
                u = ops[user]
                if user == link.index:
                    step[user] = made
                elif (u.opcode == link.opcode and u.shape == link.shape and u.dtype == link.dtype
                        and u.attrs == link.attrs and user > op.index and user not in ctx.values
                        and len(ctx.uses[user]) == 1 and user not in ctx.outputs):
                    step[user] = (*made, u)
        found = step
    return found


def shared_stationary(ctx: Context, op: Op) -> list[Op]:
    """Later dots of ``op``'s layer that read its left operand as ``op`` does, so that one PE
    transpose of each of its blocks serves all of them (docs/execution-core.md, "Dots that read
    one activation"): 2-D token-major linears ``x @ W`` (not feature-major, no fused scale) with
    the same attributes, the same ``x`` (the same op, or a copy of it: ``copies_of``), a right
    operand of the same type already lowered (a weight), the same output type and rows, lowered
    nowhere else yet and in the same layer (a layer is lowered, and relocated, as a whole). Q, K
    and V of an attention read the normalised hidden states so (XLA's DotMerger merges such dots;
    transformers-neuronx fuses the q/k/v weights)."""
    lhs, rhs = op.operands
    if (len(op.shape) != 2 or op.attrs.get("lhs_contract") != 1
            or op.index in ctx.orientation.heads or op.index in ctx.orientation.members):
        return []
    copies = copies_of(ctx, op, lhs)
    readers = sorted(u for c in copies for u in ctx.uses[c])
    if len(readers) < 2:
        return []
    ops = ctx.graph.ops
    key = layer_of(op)
    out: list[Op] = []
    for index in readers:
        other = ops[index]
        if (index <= op.index or other.opcode != "dot" or other.operands[0].index not in copies
                or other.operands[1].index in copies or other.attrs != op.attrs or other.dtype != op.dtype
                or other.shape[0] != op.shape[0] or other.operands[1].dtype != rhs.dtype
                or index in ctx.lowered_with or index in ctx.values
                or (other.operands[1].index not in ctx.values and not _is_weight(other.operands[1]))
                or index in ctx.orientation.heads or index in ctx.orientation.members
                or fused_scale(ctx, other) is not None):
            continue
        epilogue = fused_epilogue(ctx, other)
        last = max([index, *(f.index for f in epilogue.fused)] if epilogue is not None else [index])
        if (all(layer_of(ops[i]) == key for i in range(op.index, last + 1))
                and not any(link.index in ctx.orientation.members
                            for link in copies[other.operands[0].index])):
            out.append(other)
    return out


def _is_weight(op: Op) -> bool:
    """A weight (a constant with its values, or a cast of one: ``_lower_convert``), which
    ``lower_weight`` can declare at any time: it only names its HBM tensor."""
    source = op.operands[0] if op.opcode == "convert" else op
    return source.opcode == "constant" and "init" in source.attrs and source.dtype.is_float


def _shared_parts(ctx: Context, op: Op, a: _Operand, bop: _Operand, planner: Callable[..., Plan],
                  reads: list[Op], resident_out: list[int]) -> tuple[_Part, ...]:
    """The dots lowered with ``op``, sharing its transposed stationary blocks (``shared_stationary``),
    as parts of :func:`_blocks`; none unless the stationary operand is PE-transposed and the plan of
    all of them (their widths side by side) keeps K in one block, the only plan in which a block's
    transposes serve every n-block (with K split, each n-block transposes its k-block again, so the
    parts would gain nothing over separate dots). Decided before anything is placed; then the
    siblings' bias weights are lowered, their bias rows loaded and their values defined."""
    if op.index in ctx.lowered_with or a.mode is not DotOperandMode.TRANSPOSE or _batches(op.shape) > 1:
        return ()
    others = shared_stationary(ctx, op)
    if not others:
        return ()
    m, k = op.shape[0], op.operands[0].shape[1]
    candidates = []
    for other in others:
        if other.operands[1].index in ctx.values:
            operand = _Operand(ctx, other.operands[1], other.attrs["rhs_contract"] == 0, other.shape[1], k)
            kind = (operand.mode, operand.streamed, operand.ktiled)
        else:  # a weight not declared yet: loaded k-tiled from HBM, pre-transposed if need be
            kind = (DotOperandMode.LOAD, True, True)
        if kind != (bop.mode, bop.streamed, bop.ktiled):
            continue
        candidates.append(other)
    if not candidates:
        return ()
    epilogues = [fused_epilogue(ctx, other) for other in candidates]
    widths = (op.shape[1], *(other.shape[1] for other in candidates))
    extra = [r for other, epilogue in zip(candidates, epilogues) for r in (other.operands[1], *(
        [epilogue.bias] if epilogue is not None and epilogue.bias is not None else []))]
    outs = [size for other, epilogue in zip(candidates, epilogues)
            for size in _resident_bytes(ctx, epilogue.product if epilogue is not None else other)]
    joint = planner(n=sum(widths), parts=widths, resident_out=[*resident_out, *outs],
                    fits=ctx.sbuf.fits, spill=_spill_to_fit(ctx, [*reads, *extra]))
    if joint.kb < k:
        return ()
    # and only when the planner's own estimate of the dots together beats theirs apart (each
    # planned as if alone now): one m-block loop streams every weight once per m-block
    apart = planner(resident_out=resident_out, fits=ctx.sbuf.fits, spill=_spill_to_fit(ctx, reads))
    alone = apart.estimate_ns + sum(
        planner(n=other.shape[1], resident_out=_resident_bytes(
            ctx, epilogue.product if epilogue is not None else other), fits=ctx.sbuf.fits).estimate_ns
        for other, epilogue in zip(candidates, epilogues))
    if not joint.estimate_ns < alone:
        return ()
    parts = []
    for other, epilogue in zip(candidates, epilogues):
        weight = other.operands[1]
        if weight.index not in ctx.values:  # declared now (it emits nothing), not again at its place
            from neuroncore.compiler.lower_layout import lower_weight

            lower_weight(ctx, weight)
            ctx.lowered_with[weight.index] = op.index
        operand = _Operand(ctx, weight, other.attrs["rhs_contract"] == 0, other.shape[1], k)
        part = _Part(other, operand, other.shape[1], None, epilogue, None)
        bias_rows = None
        for fused in epilogue.fused if epilogue is not None else ():
            if fused.index > op.index:  # (the single dot's rule: what comes after it)
                ctx.lowered_with[fused.index] = op.index
        if epilogue is not None and epilogue.bias is not None:
            source = epilogue.bias
            if source.index not in ctx.values:  # a bias weight the graph declares after its dot
                from neuroncore.compiler.lower_layout import lower_weight

                lower_weight(ctx, source)
            bias_rows = row_params(ctx, part.op, source, min(P, m))
        ctx.lowered_with[part.op.index] = op.index
        for link in copies_of(ctx, op, op.operands[0]).get(other.operands[0].index, ()):
            ctx.lowered_with[link.index] = op.index  # a copy of x: its blocks are x's, made once
        ctx.define(_target(part))
        parts.append(_Part(part.op, part.operand, part.n, None, epilogue, bias_rows))
    return tuple(parts)


def _oriented_steps(ctx: Context, op: Op, oriented: OrientedDot) -> Iterator[bool]:
    """A 2-D linear written feature-major (compiler.orientation): the weight is the stationary
    operand and the activations the moving one, so PSUM holds ``[features, tokens]``; the bias is
    one value per partition, added (and the activation applied) by the evacuation."""
    lhs, rhs = op.operands
    m, n = op.shape
    k = lhs.shape[1]
    dtype = lhs.dtype
    a = _Operand(ctx, rhs, op.attrs["rhs_contract"] == 0, n, k)  # stationary: output features
    bop = _Operand(ctx, lhs, False, m, k)  # moving: tokens (in place when lhs is feature-major)
    for index in oriented.fused:
        if index > op.index:
            ctx.lowered_with[index] = op.index
    bias = ctx.graph.ops[oriented.bias] if oriented.bias is not None else None
    if bias is not None and bias.index not in ctx.values:  # a bias weight declared after its dot
        from neuroncore.compiler.lower_layout import lower_weight

        lower_weight(ctx, bias)
    target = ctx.graph.ops[oriented.product]
    value = ctx.define(target)
    assert value.transposed, f"{target.name} is planned feature-major"
    resident_out = ([value.cols * op.dtype.itemsize] * len(value.tiles)
                    if value.home is Memory.SBUF else [])
    reads = [lhs, rhs, *([bias] if bias is not None else [])]
    plan = _plan_dot(ctx, reads, functools.partial(
        plan_blocks, ctx.spec, n, k, m, dtype, a_streamed=a.streamed, b_streamed=bop.streamed,
        a_transposed=a.mode is DotOperandMode.TRANSPOSE,
        b_transposed=bop.mode is DotOperandMode.TRANSPOSE,
        a_ktiled=a.ktiled, b_ktiled=bop.ktiled, resident_out=resident_out))
    ctx.stats.setdefault("dot_plans", {})[op.name] = (plan.mb, plan.nb, plan.kb)
    ctx.stats["oriented_dots"] = ctx.stats.get("oriented_dots", 0) + 1
    # the bias as columns, one per 128 output features, loaded once before the weights stream
    columns = ([ctx.tile(bias, j, Layout.COL) for j in range(math.ceil(n / P))]
               if bias is not None else [])
    keep = [ctx.buffers[c.buf] for c in columns]
    yield from _blocks(ctx, op, plan, a, bop, (n, m, k), 1, stored_shape(op.shape), None, None,
                       None, (target, columns, oriented.func))
    for column in keep:
        ctx.free(column)


def _blocks(ctx: Context, op: Op, plan: Plan, a: _Operand, bop: _Operand, mnk: tuple[int, int, int],
            batches: int, out_shape: tuple[int, ...], scaled: FusedScale | None,
            epilogue: Epilogue | None, bias_rows: RowParams | None,
            oriented: tuple[Op, list[Ref], str | None] | None,
            siblings: tuple[_Part, ...] = ()) -> Iterator[bool]:
    """The block loops of a dot: ``a`` gives the stationary ``[k, m]`` tiles, ``bop`` the moving
    ``[k, n]`` ones; the output's row tiles are those of ``out_shape``. ``siblings``: later dots
    that read the same stationary operand (``shared_stationary``), multiplied in the same m-blocks
    after ``op``'s own n-blocks, each with its moving operand and into its own output.

    The blocks of the previous k-block are held until the next ones are loaded (double
    buffering). When SBUF has no room for a buffer once nothing more can be spilled, they are
    released there and then (``Context.unbuffer``, the last resort of ``Context.alloc``) and the
    dot goes on single-buffered, from the buffer that found no room: nothing placed or emitted is
    lost or made twice. Before, a failed block was started again from scratch after releasing
    them, and what its first attempt had placed was never freed: a transposed operand's ``.T``
    buffer (16 KiB per partition, twice in layer 1's ``gate_proj`` of Llama-2-70B's inf2 tp24
    b4 prefill) stayed allocated, unspillable, for the rest of the program, and layer 2's
    ``input_layernorm`` found no room; its PE transposes were emitted twice. Only the loads of a
    block fell back so: an output tile with no room at the evacuation (the same gate_proj with
    3 to 32 layers) stopped the compile."""
    evac = _alternating()
    held: list[tuple[_Operand, list[Ref]]] = []  # the blocks before, kept for double buffering

    def unbuffer() -> bool:
        """Fall back to single buffering (``Context.unbuffer``): release the held blocks."""
        if not held:
            return False
        for operand, refs in held:
            operand.release(refs)
        held.clear()
        return True

    parts = (_Part(op, bop, mnk[1], scaled, epilogue, bias_rows), *siblings)
    for b in range(batches):
        ctx.unbuffer = unbuffer  # only while this batch is lowered: no yield in between
        try:
            _batch_blocks(ctx, plan, a, parts, b, mnk, held, evac, out_shape, oriented)
        finally:
            ctx.unbuffer = None  # the context holds no closure over the operands (and itself)
        yield True


def _batch_blocks(ctx: Context, plan: Plan, a: _Operand, parts: tuple[_Part, ...], b: int,
                  mnk: tuple[int, int, int], held: list[tuple[_Operand, list[Ref]]],
                  evac: Iterator[Engine], out_shape: tuple[int, ...],
                  oriented: tuple[Op, list[Ref], str | None] | None) -> None:
    """Batch ``b`` of :func:`_blocks`; ``held`` (empty between batches) is updated in place."""
    m, _, k = mnk
    first_op = parts[0].op
    for m0 in range(0, m, plan.mb):
        m1 = min(m, m0 + plan.mb)
        a_cache: dict[int, list[Ref]] = {}
        for part, n0 in [(p, n0) for p in parts for n0 in range(0, p.n, plan.nb)]:
            op, bop, n = part.op, part.operand, part.n
            scaled, epilogue, bias_rows = part.scaled, part.epilogue, part.bias_rows
            if len(parts) > 1:  # its instructions are the sibling's (the shared transposes the first's)
                ctx.em.current_op = op.index
            n1 = min(n, n0 + plan.nb)
            k_blocks = list(range(0, k, plan.kb))
            acc_buf = None
            banks: dict[tuple[int, int], Buffer] | None = None
            if len(k_blocks) > 1 and _accumulates_in_psum(ctx.spec, op, m1 - m0, n1 - n0):
                banks = {}  # the block's PSUM banks, kept from its first k-block to its last
            elif len(k_blocks) > 1:  # partial sums of the whole block, one allocation
                acc_buf = ctx.alloc(P, math.ceil((m1 - m0) / P) * plan.nb,
                                    DType.FP32, f"{op.name}.acc")
            for kb_index, k0 in enumerate(k_blocks):
                k1 = min(k, k0 + plan.kb)
                first, last = kb_index == 0, kb_index == len(k_blocks) - 1
                a_refs = a_cache.get(k0)
                if a_refs is None:
                    a_refs = a.block(b, k0, k1, m0, m1, plan.mb)
                    if len(k_blocks) == 1 and a.mode is not DotOperandMode.DIRECT:
                        a_cache[k0] = a_refs
                b_refs = bop.block(b, k0, k1, n0, n1, plan.nb)
                _multiply_block(ctx, op, plan, a_refs, b_refs, b, (m0, m1), (n0, n1), (k0, k1),
                                first, last, acc_buf, evac, scaled, epilogue, bias_rows,
                                out_shape, oriented,
                                None if banks is None else (banks, k0 // P, math.ceil(k / P)))
                # release the previous block only now: the next load lands elsewhere
                for operand, refs in held:
                    operand.release(refs)
                held[:] = [(bop, b_refs)] + ([] if k0 in a_cache else [(a, a_refs)])
                ctx.unpin_all()
            if acc_buf is not None:
                ctx.free(acc_buf)
            assert not banks, "a split-K block's PSUM banks outlived its last k-block"
        for operand, refs in held:
            operand.release(refs)
        held.clear()
        for refs in a_cache.values():
            a.release(refs)
        ctx.unpin_all()
    if len(parts) > 1:
        ctx.em.current_op = first_op.index


@dataclass(frozen=True)
class _Part:
    """One dot of :func:`_blocks`: its moving operand (``n`` wide) and what its evacuation does."""

    op: Op
    operand: _Operand
    n: int
    scaled: FusedScale | None
    epilogue: Epilogue | None
    bias_rows: RowParams | None


@dataclass(frozen=True)
class FusedScale:
    """A dot whose only reader multiplies it by a row of per-column scales (int8 weight-only
    dequantisation, ``compiler.precision``), maybe then cast: the PSUM evacuation multiplies the
    FP32 sums by the scales and writes ``product``'s value (the multiply or its cast) directly."""

    product: Op  # the multiply, or the convert of it
    scales: Op  # the broadcast of the 1-D scale constant to the dot's shape
    fused: tuple[Op, ...]  # the ops lowered by the dot's lowering


def _only_user(ctx: Context, op: Op) -> Op | None:
    uses = ctx.uses[op.index]
    if len(uses) != 1 or op.index in ctx.outputs:
        return None
    return ctx.graph.ops[uses[0]]


def fused_scale(ctx: Context, op: Op) -> FusedScale | None:
    """The scale multiply (and cast) that can be folded into ``op``'s evacuation, if any."""
    user = _only_user(ctx, op)
    if user is None or user.opcode != "multiply" or user.operands[0] is not op:
        return None
    spread = user.operands[1]
    source = spread.operands[0] if spread.operands else None
    if (spread.opcode != "broadcast" or spread.index > op.index or source is None
            or source.opcode != "constant" or "init" not in source.attrs or len(source.shape) != 1
            or tuple(spread.attrs["dims"]) != (len(op.shape) - 1,)
            or {user.dtype, spread.dtype, op.dtype} != {DType.FP32}):
        return None
    cast = _only_user(ctx, user)
    if cast is not None and cast.opcode == "convert" and cast.dtype.is_float:
        return FusedScale(cast, spread, (user, cast))
    return FusedScale(user, spread, (user,))


BIAS_ROW_MAX_BYTES = 16 * 1024  # per partition: a longer bias row is not kept for the whole dot


@dataclass(frozen=True)
class Epilogue:
    """What the PSUM evacuation of a dot also does, as neuronx-cc fuses it: add a bias row (the
    dot's only reader adds a 1-D vector broadcast along the last dim) and apply an activation
    (the next only reader, on the Scalar engine, in place), then a cast of an FP32 dot's result to
    a 16-bit float (the last write's own type: engines convert on write, neuroncore.md §2.6),
    looking through reshapes that keep the last dim (``orientation.epilogue_chain``). ``product``
    is the last fused op, whose value the dot writes; every step before the cast keeps the dot's
    type, so each rounding is the one the unfused ops make and numerics do not change."""

    product: Op
    bias: Op | None  # the 1-D bias vector
    func: str | None  # ACTIVATE function of the fused activation (lower_elementwise names)
    fused: tuple[Op, ...]  # ops lowered by the dot's lowering (the add, its broadcast, the act)


def fused_epilogue(ctx: Context, op: Op) -> Epilogue | None:
    """The bias add and activation that can be folded into ``op``'s evacuation, if any.

    The answer must not depend on when it is asked: a dot in a fusion group asks once when the
    group opens (``streaming.units_of``) and again when the group is lowered, and a bias weight
    declared after the dot may be lowered (hoisted) in between. So a bias weight not lowered yet is
    taken as if it were, whatever else reads it (ALBERT's layers share theirs): the dot lowers it and
    it is not lowered again."""
    cur, bias, func = op, None, None
    fused: list[Op] = []
    user = _only_user(ctx, cur)
    if user is not None and user.opcode == "add" and user.dtype == op.dtype and len(op.shape) >= 1:
        a, b = user.operands
        other = b if a is cur else a
        src = other.operands[0] if other.opcode == "broadcast" and other.operands else None
        if (src is not None and other is not cur and ctx.uses[other.index] == [user.index]
                and tuple(other.attrs["dims"]) == (len(op.shape) - 1,) and src.shape == (op.shape[-1],)
                and src.dtype == op.dtype and other.index not in ctx.outputs
                and op.shape[-1] * src.dtype.itemsize <= BIAS_ROW_MAX_BYTES
                and (src.index in ctx.values
                     or (src.opcode == "constant" and "init" in src.attrs
                         and src.index not in ctx.outputs))):
            bias, cur = src, user
            fused += [other, user] + ([src] if src.index not in ctx.values else [])
    for last, function, more in epilogue_chain(cur, op, lambda o: _only_user(ctx, o)):
        if _same_row_tiles(last.shape, op.shape):  # the evacuation writes the dot's tiles
            cur, func = last, function
            fused += more
            break
    if cur is op:
        return None
    return Epilogue(cur, bias, func, tuple(fused))


def _same_row_tiles(shape: tuple[int, ...], dot_shape: tuple[int, ...]) -> bool:
    """Whether a value of ``shape`` has the row tiles of a dot of ``dot_shape`` (same rows in the
    same order, so the evacuation of the dot's tile ``t`` writes the value's tile ``t``)."""
    if tuple(shape) == tuple(dot_shape):
        return True
    if len(dot_shape) != 2 or len(shape) < 2 or is_packed(shape, Layout.ROW):
        return False
    return shape[-1] == dot_shape[-1] and shape[-2] % P == 0 and math.prod(shape[:-1]) == dot_shape[0]


def _accumulates_in_psum(spec: CoreSpec, op: Op, rows: int, cols: int) -> bool:
    """Whether a split-K block of ``rows x cols`` outputs keeps its sums in PSUM across its
    k-blocks (the NKI matmul tutorial's ``res_psum += nc_matmul(...)`` over every K tile): its
    banks fit in :data:`PSUM_ACCUMULATION_BANKS` (FP8 double-row pairs excluded: their groups
    straddle k-blocks)."""
    banks = math.ceil(rows / P) * math.ceil(cols / BANK_COLS)
    return banks <= PSUM_ACCUMULATION_BANKS and not costs.double_row(spec, op.operands[0].dtype)


def _multiply_block(ctx: Context, op: Op, plan: Plan, a_refs: list[Ref], b_refs: list[Ref], b: int,
                    ms: tuple[int, int], ns: tuple[int, int], ks: tuple[int, int], first: bool,
                    last: bool, acc_buf: Buffer | None, evac: Iterator[Engine],
                    scaled: FusedScale | None = None, epilogue: Epilogue | None = None,
                    bias_rows: RowParams | None = None, out_shape: tuple[int, ...] | None = None,
                    oriented: tuple[Op, list[Ref], str | None] | None = None,
                    in_psum: tuple[dict[tuple[int, int], Buffer], int, int] | None = None) -> None:
    """One (m, n, k) block: per 128-row m-tile and group of up to 4 PSUM banks, a LoadStationary
    per k-tile followed by one MultiplyMoving per bank, then the banks' evacuation.

    ``in_psum`` = (banks held by the whole split-K block, k-tiles before this k-block, k-tiles in
    all): the matmuls accumulate into the held banks across k-blocks and only the last k-block
    evacuates them, whole sums, as an unsplit dot does (no partial sums added on the Vector
    engine)."""
    (m0, m1), (n0, n1) = ms, ns
    dtype = op.operands[0].dtype
    double = costs.double_row(ctx.spec, dtype)  # FP8 double-row pairs of k-tiles (NC-v3)
    shape = op.shape if out_shape is None else out_shape
    for mm0 in range(m0, m1, P):
        mm1 = min(m1, mm0 + P)
        t, p0 = locate(shape, Layout.ROW, b, mm0)  # packed batches land at a partition offset
        n_rows = mm1 - mm0

        def accumulator(c0: int, c1: int, mm0: int = mm0, p0: int = p0, n_rows: int = n_rows) -> Ref | None:
            """The SBUF columns of a split-K partial sum this bank's columns add into, if any."""
            if acc_buf is None:
                return None
            base = (mm0 - m0) // P * plan.nb + c0 - n0
            return Ref(acc_buf.id, p0, p0 + n_rows, base, base + c1 - c0)

        for g0 in range(n0, n1, BANK_COLS * GROUP_BANKS):
            chunks = [(c, min(n1, c + BANK_COLS))
                      for c in range(g0, min(n1, g0 + BANK_COLS * GROUP_BANKS), BANK_COLS)]
            if in_psum is not None:
                held = in_psum[0]
                for c0, _ in chunks:
                    if (mm0, c0) not in held:
                        held[mm0, c0] = ctx.alloc_psum(P, BANK_COLS, f"{op.name}.psum")
                banks = [held[mm0, c0] for c0, _ in chunks]
            else:
                banks = [ctx.alloc_psum(P, BANK_COLS, f"{op.name}.psum") for _ in chunks]
            # k-tiles per MultiplyMoving: pairs in FP8 double-row mode (NC-v3), else one each;
            # the second tile of a pair must be full (K rows 128..255 of a [128, 2, x] operand)
            groups: list[list[int]] = []
            for j in range(len(a_refs)):
                if (groups and len(groups[-1]) == 1 and double
                        and a_refs[groups[-1][0]].rows == P):
                    groups[-1].append(j)
                else:
                    groups.append([j])
            for g, tiles in enumerate(groups):
                pos = (Accumulation.of(g, len(groups)) if in_psum is None
                       else Accumulation.of(in_psum[1] + g, in_psum[2]))
                a_ref = a_refs[tiles[0]]
                stationary = Ref(a_ref.buf, a_ref.p0, a_ref.p1, a_ref.f0 + mm0 - m0, a_ref.f0 + mm1 - m0)
                second = None
                if len(tiles) > 1:  # an FP8 double-row pair
                    a_ref = a_refs[tiles[1]]
                    second = Ref(a_ref.buf, a_ref.p0, a_ref.p1, a_ref.f0 + mm0 - m0, a_ref.f0 + mm1 - m0)
                ldweights(ctx, stationary, dtype, pad=p0, stationary2=second)
                b_ref = b_refs[tiles[0]]
                b_ref2 = b_refs[tiles[1]] if len(tiles) > 1 else None
                for bank, (c0, c1) in zip(banks, chunks):
                    moving = Ref(b_ref.buf, b_ref.p0, b_ref.p1, b_ref.f0 + c0 - n0, b_ref.f0 + c1 - n0)
                    moving2 = None if b_ref2 is None else Ref(
                        b_ref2.buf, b_ref2.p0, b_ref2.p1, b_ref2.f0 + c0 - n0, b_ref2.f0 + c1 - n0)
                    matmul(ctx, Ref(bank.id, p0, p0 + n_rows, 0, c1 - c0), moving, stationary,
                           dtype, pos, moving2=moving2)
            if in_psum is not None:
                if not last:
                    continue  # the sums stay in the held banks for the next k-block
                for c0, _ in chunks:
                    del in_psum[0][mm0, c0]
            # PSUM holds whole sums: evacuated as an unsplit dot's (first and last k-block)
            whole = (True, True) if in_psum is not None else (first, last)
            # a fused dequantisation scale: one load of the group's scale columns, for all its banks
            scale_tile = (ctx.tile(scaled.scales, t, Layout.ROW, (chunks[0][0], chunks[-1][1]))
                          if scaled is not None and last else None)
            if oriented is not None:  # feature-major: the bias is a column, one per partition
                target, columns, func = oriented
                column = columns[mm0 // P] if columns and last else None
                if column is not None:
                    ctx.pinned.add(column.buf)
                for bank, (c0, c1) in zip(banks, chunks):
                    psum = Ref(bank.id, p0, p0 + n_rows, 0, c1 - c0)
                    acc_ref = accumulator(c0, c1)
                    col = (Ref(column.buf, column.p0 + p0, column.p0 + p0 + n_rows, column.f0,
                               column.f0 + 1) if column is not None else None)
                    _evacuate_oriented(ctx, op, target, t, psum, (c0, c1), whole, acc_ref,
                                       next(evac), col, func)
                    ctx.free(bank)
                continue
            for bank, (c0, c1) in zip(banks, chunks):
                psum = Ref(bank.id, p0, p0 + n_rows, 0, c1 - c0)
                acc_ref = accumulator(c0, c1)
                scale = None
                if scale_tile is not None:
                    offset = scale_tile.f0 + c0 - chunks[0][0]
                    scale = Ref(scale_tile.buf, p0, p0 + n_rows, offset, offset + c1 - c0)
                rows_ref = bias_rows.ready(ctx) if bias_rows is not None else None
                bias = (Ref(rows_ref.buf, p0, p0 + n_rows, rows_ref.f0 + c0, rows_ref.f0 + c1)
                        if rows_ref is not None else None)
                _evacuate(ctx, op, t, psum, c0, c1, *whole, acc_ref, next(evac), scaled, scale,
                          epilogue, bias)
                ctx.free(bank)
            if scaled is not None and scale_tile is not None:
                ctx.release(scaled.scales, scale_tile)


def _evacuate_narrowing(ctx: Context, psum: Ref, out: Ref, acc: Ref | None, bias: Ref | None,
                        func: str | None, engine: Engine, *, per_partition_bias: bool = False) -> None:
    """An FP32 dot's evacuation whose product is cast to a 16-bit float (``epilogue_chain``): every
    step before the last stays FP32 (in the PSUM bank itself, which the engines read and write),
    and the last one writes the narrow type, so the one rounding is the cast's own. A partial sum
    (split K) and a bias row are added into PSUM by the Vector engine; the activation reads PSUM and
    writes ``out`` (a per-partition bias, feature-major, is ACT's own ``bias`` operand)."""
    if acc is not None:
        tensor_tensor(ctx, "add", psum, acc, psum)
    if bias is not None and func is not None and per_partition_bias:
        activate(ctx, func, out, psum, bias=bias)
    elif bias is not None and func is not None:
        tensor_tensor(ctx, "add", psum, psum, bias)
        activate(ctx, func, out, psum)
    elif bias is not None and per_partition_bias:
        tensor_scalar(ctx, out, psum, [("add", bias, False)])
    elif bias is not None:
        tensor_tensor(ctx, "add", out, psum, bias)
    elif func is not None:
        activate(ctx, func, out, psum)
    else:
        tensor_copy(ctx, out, psum, engine)


def _evacuate_oriented(ctx: Context, op: Op, target: Op, t: int, psum: Ref, cols: tuple[int, int],
                       steps: tuple[bool, bool], acc: Ref | None, engine: Engine, bias: Ref | None,
                       func: str | None) -> None:
    """PSUM -> SBUF of a feature-major dot: the bias is a per-partition scalar, so an FP32 dot's
    evacuation is one ``ACTIVATE func(psum + bias)`` (or one add); a 16-bit dot rounds its sums
    first, as the unfused ops do, then adds and applies the function: every rounding is the
    unfused ops' own."""
    (c0, c1), (first, last) = cols, steps
    if not last:
        assert acc is not None
        if first:
            tensor_copy(ctx, acc, psum, engine)
        else:
            tensor_tensor(ctx, "add", acc, acc, psum)
        return
    out = ctx.produce(target, t, c0, c1, (psum.p0, psum.p1))
    exact = op.dtype is DType.FP32  # the PSUM sums are the dot's value: no rounding skipped
    if exact and target.dtype is not op.dtype:
        _evacuate_narrowing(ctx, psum, out, acc if not first else None, bias, func, engine,
                            per_partition_bias=True)
        ctx.produced(target, t, out, c0, c1)
        return
    if not first:
        assert acc is not None
        tensor_tensor(ctx, "add", out, acc, psum)
    elif exact and func is not None:
        activate(ctx, func, out, psum, bias=bias if bias is not None else 0.0)
        bias = func = None
    elif exact and bias is not None:
        if engine is Engine.SCALAR:
            activate(ctx, "copy", out, psum, bias=bias)
        else:
            tensor_scalar(ctx, out, psum, [("add", bias, False)])
        bias = None
    else:
        tensor_copy(ctx, out, psum, engine)
    if bias is not None:
        tensor_scalar(ctx, out, out, [("add", bias, False)])
    if func is not None:
        activate(ctx, func, out, out)
    ctx.produced(target, t, out, c0, c1)


def _evacuate(ctx: Context, op: Op, t: int, psum: Ref, c0: int, c1: int, first: bool, last: bool,
              acc: Ref | None, engine: Engine, scaled: FusedScale | None = None,
              scale: Ref | None = None, epilogue: Epilogue | None = None,
              bias: Ref | None = None) -> None:
    """PSUM -> SBUF: straight into the output, or into an FP32 partial sum when K is split; with a
    fused scale the last step multiplies by the ``scale`` row (a Vector op in place of the copy);
    with an epilogue the last step also adds the bias row and applies the activation."""
    rows = (psum.p0, psum.p1)
    if epilogue is not None and last:
        out = ctx.produce(epilogue.product, t, c0, c1, rows)
        exact = op.dtype is DType.FP32  # the PSUM sums are the dot's value: no rounding skipped
        if exact and epilogue.product.dtype is not op.dtype:
            _evacuate_narrowing(ctx, psum, out, acc if not first else None, bias, epilogue.func, engine)
            ctx.produced(epilogue.product, t, out, c0, c1)
            return
        if not first:
            assert acc is not None
            tensor_tensor(ctx, "add", out, acc, psum)
        elif bias is not None and exact:
            tensor_tensor(ctx, "add", out, psum, bias)
            bias = None
        elif epilogue.func is not None and exact:
            activate(ctx, epilogue.func, out, psum)
            ctx.produced(epilogue.product, t, out, c0, c1)
            return
        else:
            tensor_copy(ctx, out, psum, engine)
        if bias is not None:
            tensor_tensor(ctx, "add", out, out, bias)
        if epilogue.func is not None:
            activate(ctx, epilogue.func, out, out)
        ctx.produced(epilogue.product, t, out, c0, c1)
        return
    if scaled is not None and last:
        assert scale is not None
        target = scaled.product
        out = ctx.produce(target, t, c0, c1, rows)
        if first:
            tensor_tensor(ctx, "mult", out, psum, scale)
        else:
            assert acc is not None
            tensor_tensor(ctx, "add", out, acc, psum)
            tensor_tensor(ctx, "mult", out, out, scale)
        ctx.produced(target, t, out, c0, c1)
        return
    if first and last:
        out = ctx.produce(op, t, c0, c1, rows)
        tensor_copy(ctx, out, psum, engine)
        ctx.produced(op, t, out, c0, c1)
        return
    assert acc is not None
    if first:
        tensor_copy(ctx, acc, psum, engine)
        return
    if not last:
        tensor_tensor(ctx, "add", acc, acc, psum)
        return
    out = ctx.produce(op, t, c0, c1, rows)
    tensor_tensor(ctx, "add", out, acc, psum)
    ctx.produced(op, t, out, c0, c1)
