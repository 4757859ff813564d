"""The channel-major pass: the activations of a convolution network stay ``[N, C, H*W]``.

The compiler tiles a value ``[.., R, C]`` with ``R`` on the partitions, so an image ``[N, C, H, W]``
would be ``N * C`` tiles of ``[H, W]``: a batch norm or ReLU after a 2048-channel convolution would
be 2048 instructions on 7 partitions each, and the next convolution would have to bring channels
back onto the partitions through HBM. neuronx-cc keeps such activations channel-major (channels on
partitions, the image along the free dim) from one convolution to the next. This pass does the
same on the graph, before lowering: starting from the ``convolution`` and ``reduce-window`` ops
(whose operands and results are ``[N, C, L]``, ``neuroncore/ir/conv.py``) it rewrites what reads
their ``[N, C, *spatial]`` reshapes so that it works on ``[N, C, L]`` directly:

* an elementwise op (unary, binary, compare, select, convert, gelu, silu) whose operands are all
  channel-major, per-channel broadcasts (``broadcast`` along dims 0 and 1 only: a batch norm's
  scale becomes a per-partition scalar) or splat constants, is computed on ``[N, C, L]``;
* a concatenation along the channels (a UNet's skip connection) likewise;
* a reshape of a channel-major value reads the ``[N, C, L]`` value (a reshape of a reshape);
  the reshape that feeds a convolution disappears; a reshape back to ``[N, C, *spatial]`` read by
  an elementwise op (group norm's ``[N, G, C/G, L]``) regroups once into ``[N, C, L]``;
* ``transpose(x, (0, 2, .., 1))`` read as ``[N, L, C]`` (attention over pixels) becomes a transpose
  of the last two dims of ``[N, C, L]`` (the PE transposes it on chip), and the way back likewise.

Trained constants move to the front of the graph (they read nothing), so that a convolution's
lowering can fuse the per-channel scale and shift that follow it (a batch norm folded by the
frontend) into its PSUM evacuation. Values are the same element for element (every rewrite only
regroups trailing dims), so the rewritten graph computes what the original does; ``program.graph``
is it. Graphs without window ops are returned unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from neuroncore.ir.graph import BINARY_OPS, UNARY_OPS, WINDOW_OPS, Graph, Op

ELEMENTWISE = UNARY_OPS | BINARY_OPS | {"convert", "compare", "select", "gelu", "silu", "gelu_dx",
                                         "silu_dx"}


def channel_major(graph: Graph) -> Graph:
    """``graph`` with channel-major activations around its window ops (unchanged without any)."""
    if not any(op.opcode in WINDOW_OPS for op in graph.ops):
        return graph
    return _Pass(graph).run()


def _flat_shape(shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    if len(shape) < 3:
        return None
    return shape[0], shape[1], math.prod(shape[2:])


class _Pass:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.ops: list[Op] = []
        self.new: dict[int, Op] = {}  # old op index -> its value in the new graph (same shape)
        self.flat: dict[int, Op] = {}  # old op index -> its [N, C, L] value in the new graph
        self.names = {op.name for op in graph.ops}
        self.users = graph.users()

    def emit(self, like: Op, opcode: str, operands: tuple[Op, ...], shape: tuple[int, ...],
             attrs: dict[str, Any], name: str, dtype: Any = None) -> Op:
        op = Op(index=len(self.ops), opcode=opcode, name=name, operands=operands, shape=shape,
                dtype=like.dtype if dtype is None else dtype, attrs=attrs, layer=like.layer,
                frames=like.frames)
        self.ops.append(op)
        return op

    def fresh(self, name: str) -> str:
        candidate, k = name, 0
        while candidate in self.names:
            k += 1
            candidate = f"{name}.cm{k}"
        self.names.add(candidate)
        return candidate

    def full(self, op: Op) -> Op:
        """``op``'s value in its own shape (a reshape of its channel-major value if needed)."""
        value = self.new.get(op.index)
        if value is None:
            flat = self.flat[op.index]
            if flat.shape == op.shape:
                value = flat
            else:
                name = op.name if flat.name != op.name else self.fresh(f"{op.name}.nchw")
                value = self.emit(op, "reshape", (flat,), op.shape, {}, name)
            self.new[op.index] = value
        return value

    def flat_operand(self, x: Op, shape: tuple[int, int, int]) -> Op | None:
        """``x`` as ``shape`` [N, C, L] without moving data, or None."""
        if x.index in self.flat and self.flat[x.index].shape == shape:
            return self.flat[x.index]
        if x.opcode == "broadcast" and len(x.shape) >= 3:
            # per-channel (or per-image) values: constant along every spatial dim
            dims, source = tuple(x.attrs["dims"]), x.operands[0]
            keep = [i for i, d in enumerate(dims) if d in (0, 1)]
            if any(source.shape[i] != 1 for i, d in enumerate(dims) if d >= 2):
                return None
            src = self.full(source)
            if len(keep) != len(dims):
                src = self.emit(x, "reshape", (src,), tuple(source.shape[i] for i in keep), {},
                                self.fresh(f"{x.name}.cm_src"))
            kept = tuple(dims[i] for i in keep)
            if kept and kept != (0, 1):
                # through [N, C]: one value per row, which the engines read as a per-partition
                # scalar (a batch norm's scale is not materialised over the image)
                src = self.emit(x, "broadcast", (src,), shape[:2], {"dims": kept},
                                self.fresh(f"{x.name}.cm_rows"))
                kept = (0, 1)
            return self.emit(x, "broadcast", (src,), shape, {"dims": kept}, self.fresh(f"{x.name}.cm"))
        if x.opcode == "constant" and "init" not in x.attrs and x.shape:
            return self.emit(x, "constant", (), shape, dict(x.attrs), self.fresh(f"{x.name}.cm"))
        return None

    def run(self) -> Graph:
        # trained constants first (they read nothing): a convolution's epilogue can then use a
        # batch norm's folded scale and shift, which the frontend creates after the convolution
        weights = [op for op in self.graph.ops if op.opcode == "constant" and "init" in op.attrs]
        weights += [op for op in self.graph.ops if op.opcode == "convert"
                    and op.operands[0].opcode == "constant" and "init" in op.operands[0].attrs]
        for op in weights:
            operands = tuple(self.new[o.index] for o in op.operands)
            self.new[op.index] = self.emit(op, op.opcode, operands, op.shape, dict(op.attrs), op.name)
        for op in self.graph.ops:
            if op.index in self.new:
                continue
            if not self.rewrite(op):
                operands = tuple(self.full(o) for o in op.operands)
                self.new[op.index] = self.emit(op, op.opcode, operands, op.shape, dict(op.attrs),
                                               op.name)
        parameters = [self.new[p.index] for p in self.graph.parameters]
        outputs = [self.full(o) for o in self.graph.outputs]
        return Graph(self.graph.name, self.ops, parameters, outputs).pruned()

    def rewrite(self, op: Op) -> bool:
        """Give ``op`` a channel-major form (or a cheaper form through one); False if none."""
        code = op.opcode
        if code == "reshape":
            return self._reshape(op)
        if code == "transpose":
            return self._from_pixels(op)
        shape = _flat_shape(op.shape)
        if shape is None or len(op.shape) < 4:
            return False
        if code in ELEMENTWISE or (code == "concatenate" and op.attrs["dimension"] == 1):
            if not any(o.index in self.flat for o in op.operands):
                return False
            operands = []
            for o in op.operands:
                target = shape if code != "concatenate" else _flat_shape(o.shape)
                flat = self.flat_operand(o, target) if target is not None else None
                if flat is None:
                    return False
                operands.append(flat)
            self.flat[op.index] = self.emit(op, code, tuple(operands), shape, dict(op.attrs), op.name)
            return True
        return False

    def _reshape(self, op: Op) -> bool:
        src = op.operands[0]
        if len(op.shape) >= 4 and len(src.shape) == 3 and _flat_shape(op.shape) == src.shape:
            self.flat[op.index] = self.full(src)  # [N, C, L] -> [N, C, *spatial]: the same value
            return True
        if src.index in self.flat:
            flat = self.flat[src.index]
            self.new[op.index] = flat if flat.shape == op.shape else self.emit(
                op, "reshape", (flat,), op.shape, {}, op.name)
            return True
        flat_shape = _flat_shape(op.shape)
        if (len(op.shape) >= 4 and flat_shape is not None and len(src.shape) >= 4
                and src.opcode != "transpose"
                and any(u.opcode in ELEMENTWISE for u in self.users[op.index])):
            # e.g. group norm's [N, G, C/G, L] back to [N, C, H, W]: one regrouping into
            # [N, C, L], so the per-channel affine and activation after it run channel-major
            self.flat[op.index] = self.emit(op, "reshape", (self.full(src),), flat_shape, {},
                                            self.fresh(f"{op.name}.cm"))
            return True
        if src.opcode == "transpose" and src.operands[0].index in self.flat:
            x = src.operands[0]
            rank = len(x.shape)
            n, c, length = self.flat[x.index].shape
            if tuple(src.attrs["permutation"]) == (0, *range(2, rank), 1) and op.shape == (n, length, c):
                self.new[op.index] = self.emit(op, "transpose", (self.flat[x.index],), op.shape,
                                               {"permutation": (0, 2, 1)}, op.name)
                return True
        return False

    def _from_pixels(self, op: Op) -> bool:
        """``transpose(reshape(y [N, L, C], [N, *spatial, C]), (0, k, 1, .., k-1))``: the transpose
        of ``y``'s last two dims, channel-major."""
        src = op.operands[0]
        rank = len(op.shape)
        if rank < 4 or src.opcode != "reshape" or tuple(op.attrs["permutation"]) != (
                0, rank - 1, *range(1, rank - 1)):
            return False
        y = src.operands[0]
        n, c = op.shape[0], op.shape[1]
        length = math.prod(op.shape[2:])
        if y.shape != (n, length, c):
            return False
        self.flat[op.index] = self.emit(op, "transpose", (self.full(y),), (n, c, length),
                                        {"permutation": (0, 2, 1)}, op.name)
        return True


__all__ = ["channel_major"]
