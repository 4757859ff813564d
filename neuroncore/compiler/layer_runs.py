"""Repeated layers of a graph: runs of transformer layers with the same ops, shapes and wiring.

A model's layers (``model/layers.0``, ``model/layers.1``, ...) are lowered the same way when they
are the same graph up to a relocation: same opcodes, shapes, dtypes and attributes in the same
order, each operand either inside the layer (same relative position), in the previous layer (same
relative position), an op shared by every layer (the rotary tables), or a per-layer input outside the
layer (its KV cache) of the same kind. The compiler uses these runs to start each repeated layer
from a canonical state and to lower a layer once and relocate it (``layer_replay``).

A layer's ops must be contiguous in program order; anything else is simply not a run.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroncore.compiler.lowering_state import Layout
from neuroncore.compiler.tiling import tile_grid, tiles_of
from neuroncore.ir.graph import BINARY_OPS, COLLECTIVE_OPS, UNARY_OPS, Graph, Op

_LAYER_COMPONENT = re.compile(r"^([A-Za-z_]\w*)\.(\d+)$")
MIN_RUN = 3  # a run shorter than this gains nothing from relocation


@dataclass(frozen=True)
class LayerSpan:
    """Ops [start, stop) of one layer, ``prefix`` its path without the number (``model/layers``)."""

    prefix: str
    number: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class LayerRun:
    """Consecutive layers with equal signatures; ``externals[k]`` maps, for layer k of the run, each
    per-layer external slot to the op index it reads (the same slot in every layer)."""

    layers: tuple[LayerSpan, ...]
    externals: tuple[tuple[int, ...], ...]
    # offsets of the last layer's ops read after it, by other ops than the run's layers' (the
    # model's last layer, read by the final norm: ``with_final_layer``); empty for equal layers
    loose: tuple[int, ...] = ()
    # the first layer matches only with its reads of the layer before counted back from its own
    # start (the model's layer 1, whose previous layer the causal mask splits in two spans): it
    # stays in the run only where the run's first boundary moves nothing (``without_first``)
    joined: bool = False

    @property
    def stride(self) -> int:
        return self.layers[0].size

    def without_first(self) -> LayerRun:
        """The run from its second layer on (as found before a joined first layer could match)."""
        return LayerRun(self.layers[1:], self.externals[1:], self.loose)

    def op_map(self, source: int, target: int) -> dict[int, int]:
        """Op index in layer ``source`` of the run (or its per-layer externals) -> the same op in
        layer ``target``."""
        a, b = self.layers[source], self.layers[target]
        mapping = {a.start + i: b.start + i for i in range(a.size)}
        mapping.update(zip(self.externals[source], self.externals[target], strict=True))
        return mapping


def layer_of(op: Op) -> tuple[str, int] | None:
    """(path prefix, layer number) of the first ``name.N`` component of the op's layer path."""
    parts = op.layer.split("/")
    for i, part in enumerate(parts):
        match = _LAYER_COMPONENT.match(part)
        if match:
            return "/".join([*parts[:i], match.group(1)]), int(match.group(2))
    return None


def layer_spans(graph: Graph) -> list[LayerSpan]:
    """Maximal contiguous op ranges of one layer each, in program order."""
    spans: list[LayerSpan] = []
    current: tuple[str, int] | None = None
    start = 0
    for op in graph.ops:
        key = layer_of(op)
        if key != current:
            if current is not None:
                spans.append(LayerSpan(current[0], current[1], start, op.index))
            current, start = key, op.index
    if current is not None:
        spans.append(LayerSpan(current[0], current[1], start, len(graph.ops)))
    return spans


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.shape, str(value.dtype))
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _attr_key(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


_PER_LAYER_ATTRS = frozenset({"init", "label"})  # a layer's own weights: same shape, other values


def _signature(graph: Graph, span: LayerSpan, previous: LayerSpan | None,
               output_pos: dict[int, int], uses: list[list[int]], *,
               back: bool = True) -> tuple[tuple[Any, ...], list[int]]:
    """The layer's structure with every index made relative, and its external operands in order.
    A read of the previous layer counts back from the layer's own start (``back``; else from the
    previous layer's start, which tells a layer whose previous layer is laid out otherwise)."""
    rows: list[Any] = []
    externals: list[int] = []
    number = f".{span.number}"
    for op in graph.ops[span.start:span.stop]:
        refs: list[Any] = []
        for operand in op.operands:
            i = operand.index
            if span.start <= i < span.stop:
                refs.append(("in", i - span.start))
            elif previous is not None and previous.start <= i < previous.stop:
                # counted back from the layer's own start: the model's layer 1 reads the last
                # span of layer 0 (the causal mask splits it in two) as any layer reads the one before
                refs.append(("prev", i - (span.start if back else previous.start)))
            else:
                externals.append(i)
                refs.append(("ext", operand.opcode, operand.shape, operand.dtype))
        attrs = tuple(sorted((k, _attr_key(v)) for k, v in op.attrs.items() if k not in _PER_LAYER_ATTRS))
        # where the value is read: inside the layer, in the next layer, or further on
        read = tuple(u - span.start if u < span.stop else (-1 if u < span.stop + span.size else -2)
                     for u in uses[op.index])
        out = output_pos.get(op.index)
        rows.append((op.opcode, op.shape, op.dtype, attrs, op.layer.replace(number, ".#", 1), tuple(refs),
                     read, out is not None, "init" in op.attrs))
    return tuple(rows), externals


def find_runs(graph: Graph) -> list[LayerRun]:
    """Runs of at least ``MIN_RUN`` consecutive layers with the same signature, each layer's
    external slots either shared by all or distinct per layer (and then of one kind)."""
    spans = layer_spans(graph)
    output_pos = {o.index: i for i, o in enumerate(graph.outputs)}
    uses: list[list[int]] = [[] for _ in graph.ops]
    for op in graph.ops:
        for operand in op.operands:
            uses[operand.index].append(op.index)
    runs: list[LayerRun] = []
    i = 0
    while i < len(spans):
        span = spans[i]
        if span.size == 0:
            i += 1
            continue
        first_sig, first_ext = _signature(graph, span, spans[i - 1] if i else None, output_pos, uses)
        members = [span]
        exts = [first_ext]
        j = i + 1
        while j < len(spans):
            nxt = spans[j]
            if nxt.prefix != span.prefix or nxt.size != span.size or nxt.number != members[-1].number + 1:
                break
            sig, ext = _signature(graph, nxt, spans[j - 1], output_pos, uses)
            if sig != first_sig or len(ext) != len(first_ext):
                break
            members.append(nxt)
            exts.append(ext)
            j += 1
        run = _consistent(members, exts, output_pos)
        if run is not None:
            first, second = run.layers[0], run.layers[1]
            if (i and _signature(graph, first, spans[i - 1], output_pos, uses, back=False)[0]
                    != _signature(graph, second, first, output_pos, uses, back=False)[0]):
                run = dataclasses.replace(run, joined=True)
            runs.append(run)
        i = max(j, i + 1)
    return runs


def _consistent(members: list[LayerSpan], exts: list[list[int]],
                output_pos: dict[int, int]) -> LayerRun | None:
    """Each external slot is one op for the whole run (shared) or a distinct op per layer; outputs
    of the layers sit at a constant stride in the graph's output list."""
    while len(members) >= MIN_RUN:
        slots = list(zip(*exts, strict=True)) if exts[0] else []
        per_layer: list[int] = []
        ok = True
        for k, slot in enumerate(slots):
            if len(set(slot)) == 1:
                continue
            if len(set(slot)) != len(slot) or any(members[0].start <= x < members[-1].stop for x in slot):
                ok = False
                break
            per_layer.append(k)
        strides = {output_pos[b.start + i] - output_pos[a.start + i]
                   for a, b in itertools.pairwise(members)
                   for i in range(a.size) if a.start + i in output_pos}
        if ok and len(strides) <= 1:
            return LayerRun(tuple(members), tuple(tuple(e[k] for k in per_layer) for e in exts))
        members, exts = members[:-1], exts[:-1]
    return None


def with_final_layer(graph: Graph, run: LayerRun, hbm_home_bytes: int, planned: frozenset[int]) -> LayerRun:
    """``run`` with the layer right after it appended when that layer differs from the run's only
    in who reads its values after it: the model's last layer, whose output the final norm reads
    instead of a next layer's norm and residual add. Such a layer lowers as the run's layers do
    when nothing in its lowering looks at those readers, which holds (and is required here) for
    each value read after the layer that is

    * elementwise (its lowering never reads its own readers), with no operand read by it alone
      unless that operand is a collective (a dot's epilogue and bias fusion look through a dot's
      only readers), not made of broadcasts alone (``streaming.joins`` reads those ops' readers);
    * HBM-home by size (``Context.define``: larger than ``hbm_home_bytes`` per partition, not kept
      on chip): its tiles are staged to HBM as they are made, so no spill ranks it by its next use,
      and it is released after its last reader, after the layer in both cases;

    and each op of the layer is planned (``planned``: the values kept on chip and the feature-major
    ones) exactly as the same op of the run's last layer. ``layer_replay`` also checks, before it
    relocates over this layer, that the template's values at those offsets live in HBM.
    Anything else: ``run`` unchanged."""
    last = run.layers[-1]
    spans = layer_spans(graph)
    index = next((i for i, s in enumerate(spans) if s.start == last.stop), None)
    if index is None or len(run.layers) < 2:
        return run
    final = spans[index]
    if final.prefix != last.prefix or final.number != last.number + 1 or final.size != last.size:
        return run
    output_pos = {o.index: i for i, o in enumerate(graph.outputs)}
    uses: list[list[int]] = [[] for _ in graph.ops]
    for op in graph.ops:
        for operand in op.operands:
            uses[operand.index].append(op.index)
    sigs, exts = [], []
    for k, layer in enumerate(run.layers):
        sig, ext = _signature(graph, layer, run.layers[k - 1] if k else spans[spans.index(layer) - 1]
                              if spans.index(layer) else None, output_pos, uses)
        sigs.append(sig)
        exts.append(ext)
    sig, ext = _signature(graph, final, last, output_pos, uses)
    if len(sig) != len(sigs[-1]) or len(ext) != len(exts[-1]):
        return run
    loose: list[int] = []
    for offset, (row, ref) in enumerate(zip(sig, sigs[-1], strict=True)):
        inside, outside = [u for u in row[6] if u >= 0], [u for u in row[6] if u < 0]
        if row != ref and (row[:6] != ref[:6] or row[7:] != ref[7:] or inside != [u for u in ref[6] if u >= 0]
                           or not outside or all(u >= 0 for u in ref[6])):
            return run  # differs in more than where it is read after the layer
        if not outside:
            continue
        # read after the layer (by other ops than the same op of a run layer, whatever the codes)
        op, same = graph.ops[final.start + offset], graph.ops[last.start + offset]
        if (op.opcode not in BINARY_OPS | UNARY_OPS or value_rows_bytes(op) <= hbm_home_bytes
                or not uses[op.index] or not uses[same.index]
                or all(o.opcode == "broadcast" for o in op.operands)
                or any(uses[o.index] == [op.index] and o.opcode not in COLLECTIVE_OPS for o in op.operands)):
            return run
        loose.append(offset)
    if any((final.start + o in planned) != (last.start + o in planned) for o in range(final.size)):
        return run
    extended = _consistent([*run.layers, final], [*exts, ext], output_pos)
    if (extended is None or len(extended.layers) != len(run.layers) + 1
            or extended.externals[:-1] != run.externals):
        return run
    return dataclasses.replace(extended, loose=tuple(loose), joined=run.joined)


def value_rows_bytes(op: Op) -> int:
    """Bytes per partition of ``op``'s value in row tiles (``Context.define``'s measure)."""
    _, _, cols = tile_grid(op.shape, Layout.ROW)
    return len(tiles_of(op.shape, Layout.ROW)) * cols * op.dtype.itemsize


__all__ = ["MIN_RUN", "LayerRun", "LayerSpan", "find_runs", "layer_of", "layer_spans", "value_rows_bytes",
           "with_final_layer"]
