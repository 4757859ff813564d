"""Image groups: the leading blocks of a batched convolution network lowered a few images at a time.

Why: a convolution network's first stages have the largest activations (ResNet-50's stage 1 block
outputs are ``[N, 256, 56x56]``, 25 KB per partition and image in FP32), so at a batch of 8 every
block output is larger than SBUF holds beside the rest and goes to HBM and back, while the same
blocks at one or two images keep everything on chip. neuronx-cc's loop nest for such a segment
can run the batch as the outer loop [assumption, docs/execution-core.md "Convolutions"]: the
segment's weights are few (ResNet-50's stem and stages 1-2: 42 KB per partition in BF16) and
stay in SBUF while its images pass through it a group at a time, and only the segment's last
value is needed for the whole batch at once.

What (a graph rewrite before lowering, after ``channel_major``): the *per-image prefix* of the
graph is the ops that compute image ``n`` of their value from image ``n`` of their operands
(convolutions, pools, elementwise ops over ``[N, C, L]``, their per-channel broadcasts and splat
constants), starting from a batch input. A prefix position's *frontier* is the prefix values read
after it. ``plan`` takes, of every group size ``g`` (a proper divisor of the batch) and every end
whose convolution weights, counted from the start, fit ``WEIGHT_FRACTION`` of SBUF per partition,
the one that removes the most HBM traffic in bytes: segment values over half of SBUF per partition
at the whole batch (no live set keeps those, ``compiler.residency``) and within the quarter
(``Context.hbm_home_bytes``) at ``g`` images, less the frontier for the whole batch and the
segment's weights once per extra group; nothing when that is not positive. The segment is emitted
``N / g`` times, each copy reading a slice of the inputs and the same weight ops, and the copies'
frontier values are concatenated along the batch, under their original names, for the rest of
the graph. Every image's values are computed by the same instructions in the same order as
before, so results are bit-identical.

Left as is: each copy's convolutions load their weights again (one DMA per 128-channel output
block, as a convolution does per execution; keeping them from the first copy to the last
fragmented SBUF); the concatenation is an HBM view (ResNet-50 b8's stage 2 output for the whole
batch is 100 KB per partition in FP32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from neuroncore.compiler.channel_major import ELEMENTWISE
from neuroncore.compiler.residency import RESIDENT_SBUF_FRACTION
from neuroncore.compiler.tiling import P
from neuroncore.compiler.weight_ring import NOT_ACTIVATIONS, value_bytes_per_partition
from neuroncore.hardware import CoreSpec
from neuroncore.ir.conv import ConvChannels, WindowGeometry
from neuroncore.ir.graph import Graph, Op

WEIGHT_FRACTION = 0.25  # of SBUF per partition: the segment's convolution weights, kept across groups
HBM_HOME_FRACTION = 0.25  # Context.define's rule: a value over this much of SBUF per partition is in HBM
PER_IMAGE = frozenset({"convolution", "reduce-window", *ELEMENTWISE})


def conv_weight_bytes(op: Op) -> int:
    """SBUF bytes per partition of a convolution's whole weight (``lower_conv``'s blocks)."""
    geo, ch = WindowGeometry.of(op.attrs), ConvChannels.of(op.attrs)
    return (ch.n_group_blocks * ch.n_oblocks * math.ceil(ch.cb / P) * geo.k_total * P
            * op.operands[1].dtype.itemsize)


class _Plan:
    """The per-image prefix of ``graph`` (batch ``n``) and, per prefix position, the prefix values
    read after it (its *frontier*)."""

    def __init__(self, graph: Graph, n: int) -> None:
        self.graph, self.n = graph, n
        self.image: set[int] = set()  # ops whose value is per image (sources included)
        self.resized: set[int] = set()  # batch-free ops of shape [n, ...] that a copy re-emits at g
        self.sources: list[Op] = []  # batch inputs the copies slice
        last_read = {op.index: op.index for op in graph.ops}
        for op in graph.ops:
            for o in op.operands:
                last_read[o.index] = max(last_read[o.index], op.index)
        for o in graph.outputs:
            last_read[o.index] = len(graph.ops)
        self.prefix: list[Op] = []
        self.frontiers: list[list[Op] | None] = []  # None: a batch input is still read after it
        live: dict[int, Op] = {}
        for op in graph.ops:
            if op.opcode == "parameter":
                if len(op.shape) >= 2 and op.shape[0] == n:
                    self.image.add(op.index)
                    self.sources.append(op)
                    live[op.index] = op
                continue
            if not any(o.index in self.image for o in op.operands):
                continue  # batch-free (a weight, a per-channel scale): shared by the copies
            if not self._per_image(op):
                break
            self.image.add(op.index)
            self.prefix.append(op)
            live[op.index] = op
            live = {i: v for i, v in live.items() if last_read[i] > op.index}
            frontier = list(live.values())
            self.frontiers.append(None if any(v.opcode == "parameter" for v in frontier) else frontier)

    def _per_image(self, op: Op) -> bool:
        if op.opcode not in PER_IMAGE and op.opcode not in ("reshape", "concatenate"):
            return False
        if not op.shape or op.shape[0] != self.n:
            return False
        if op.opcode == "reshape":
            return op.operands[0].shape[0] == self.n
        if op.opcode == "concatenate" and op.attrs["dimension"] == 0:
            return False
        for o in op.operands:
            if o.index in self.image:
                continue
            if op.opcode == "convolution" and o is op.operands[1]:
                continue  # the weight
            if o.shape and o.shape[0] == self.n and len(o.shape) == len(op.shape):
                if not self._resizable(o):
                    return False
                self.resized.add(o.index)
        return True

    def _resizable(self, o: Op) -> bool:
        """A batch-free value of the batch's shape that a copy can make at ``g`` images: a splat, or
        a broadcast of a value without a batch axis or of such a value (a batch norm's scale seen
        as ``[N, C]``, then as ``[N, C, L]``)."""
        while True:
            if o.opcode == "constant":
                return "init" not in o.attrs  # a splat
            if o.opcode != "broadcast":
                return False
            dims = tuple(o.attrs["dims"])
            if 0 not in dims:
                return True  # the source has no batch axis
            src = o.operands[0]
            if dims[0] != 0 or src.shape[0] != self.n:
                return False
            o = src


@dataclass(frozen=True)
class Decision:
    """Lower the first ``length`` prefix ops ``group`` images at a time; ``saved`` bytes of HBM
    traffic fewer (what the whole batch sends to HBM, less what the groups still do)."""

    group: int
    length: int
    saved: int


def plan(graph: Graph, spec: CoreSpec) -> Decision | None:
    """Whether and how to lower ``graph``'s leading per-image segment in image groups: the group
    size and segment end that remove the most HBM traffic, net of what the rewrite adds, or None
    when nothing is gained.

    Counted in bytes, each value once: a segment value is in HBM at the whole batch when it is over
    the quarter of SBUF and residency does not keep it (``residency.kept_on_chip``, the program's
    own rule), and in a group of ``g`` images when it is over the quarter at ``g`` images; the
    rewrite adds the frontier's values for the whole batch (the concatenation is an HBM view) and
    the segment's weights once more per extra group (each copy's convolutions load them)."""
    convs = [op for op in graph.ops if op.opcode == "convolution"]
    if not convs or convs[0].shape[0] < 2:
        return None
    n = convs[0].shape[0]
    p = _Plan(graph, n)
    if not p.prefix:
        return None
    quarter = int(spec.sbuf_bytes_per_partition * HBM_HOME_FRACTION)
    half = int(spec.sbuf_bytes_per_partition * RESIDENT_SBUF_FRACTION)
    budget = WEIGHT_FRACTION * spec.sbuf_bytes_per_partition
    best: Decision | None = None
    for g in (d for d in range(1, n) if n % d == 0):
        removed = weights = weight_bytes = 0
        for pos, op in enumerate(p.prefix):
            if op.opcode == "convolution":
                weights += conv_weight_bytes(op)
                weight_bytes += op.operands[1].nbytes
                if weights > budget:
                    break
            if op.opcode not in NOT_ACTIVATIONS and (value_bytes_per_partition(op) > half
                                                     and value_bytes_per_partition(_at(op, g)) <= quarter):
                removed += op.nbytes
            frontier = p.frontiers[pos]
            if frontier is None:
                continue
            net = removed - sum(v.nbytes for v in frontier) - (n // g - 1) * weight_bytes
            if net > 0 and (best is None or net > best.saved):
                best = Decision(g, pos + 1, net)
    return best


def _at(op: Op, images: int) -> Op:
    """A stand-in of ``op`` with ``images`` images (for sizes only)."""
    return Op(index=-1, opcode=op.opcode, name=op.name, operands=(), shape=(images, *op.shape[1:]),
              dtype=op.dtype, attrs={}, layer=op.layer, frames=())


def image_groups(graph: Graph, spec: CoreSpec) -> Graph:
    """``graph`` with its leading per-image segment lowered in image groups (``plan``); unchanged
    when that gains nothing."""
    decided = plan(graph, spec)
    if decided is None:
        return graph
    return _rewrite(graph, decided.group, decided.length)


def _rewrite(graph: Graph, g: int, length: int) -> Graph:
    p = _Plan(graph, _batch(graph))
    segment = p.prefix[:length]
    in_segment = {op.index for op in segment}
    frontier = p.frontiers[length - 1]
    assert frontier is not None
    last = segment[-1]
    names = {op.name for op in graph.ops}
    ops: list[Op] = []
    new: dict[int, Op] = {}

    def emit(like: Op, opcode: str, operands: tuple[Op, ...], shape: tuple[int, ...],
             attrs: dict[str, Any], name: str) -> Op:
        op = Op(index=len(ops), opcode=opcode, name=name, operands=operands, shape=shape,
                dtype=like.dtype, attrs=attrs, layer=like.layer, frames=like.frames)
        ops.append(op)
        return op

    def fresh(name: str) -> str:
        candidate, k = name, 0
        while candidate in names:
            k += 1
            candidate = f"{name}.{k}"
        names.add(candidate)
        return candidate

    resized: dict[int, Op] = {}
    for op in graph.ops:
        if op.index in in_segment and op is not last:
            continue
        if op is not last:
            new[op.index] = emit(op, op.opcode, tuple(new[o.index] for o in op.operands), op.shape,
                                 dict(op.attrs), op.name)
            continue
        parts: dict[int, list[Op]] = {v.index: [] for v in frontier}
        for k in range(p.n // g):
            local: dict[int, Op] = {}
            for src in p.sources:
                starts = (k * g,) + (0,) * (len(src.shape) - 1)
                limits = ((k + 1) * g, *src.shape[1:])
                local[src.index] = emit(src, "slice", (new[src.index],), (g, *src.shape[1:]),
                                        {"starts": starts, "limits": limits,
                                         "strides": (1,) * len(src.shape)},
                                        fresh(f"{src.name}.images{k * g}"))
            for member in segment:
                operands = []
                for o in member.operands:
                    if o.index in local:
                        operands.append(local[o.index])
                        continue
                    if o.index in p.resized:
                        chain = [o]  # the broadcasts down to one without a batch axis
                        while chain[-1].opcode == "broadcast" and 0 in tuple(chain[-1].attrs["dims"]):
                            chain.append(chain[-1].operands[0])
                        for b in reversed(chain):
                            if b.index not in resized:
                                srcs = tuple(resized.get(s.index, new[s.index]) for s in b.operands)
                                resized[b.index] = emit(b, b.opcode, srcs, (g, *b.shape[1:]),
                                                        dict(b.attrs), fresh(f"{b.name}.g{g}"))
                        operands.append(resized[o.index])
                        continue
                    operands.append(new[o.index])
                local[member.index] = emit(member, member.opcode, tuple(operands),
                                           (g, *member.shape[1:]), dict(member.attrs),
                                           fresh(f"{member.name}.images{k * g}"))
            for v in frontier:
                parts[v.index].append(local[v.index])
        for v in frontier:
            new[v.index] = emit(v, "concatenate", tuple(parts[v.index]), v.shape, {"dimension": 0},
                                v.name)
    parameters = [new[q.index] for q in graph.parameters]
    outputs = [new[o.index] for o in graph.outputs]
    return Graph(graph.name, ops, parameters, outputs).pruned()


def _batch(graph: Graph) -> int:
    return next(op for op in graph.ops if op.opcode == "convolution").shape[0]


__all__ = ["Decision", "conv_weight_bytes", "image_groups", "plan"]
