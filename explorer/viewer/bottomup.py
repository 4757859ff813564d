"""The bottom-up view: one row per *op kind* across layers, as XProf's op profile groups ops.

A decoder has 32 ``down_proj`` matmuls; each is 1-3 % of the run, so a top-down tree (and a problem
that names "the op with the largest wait") points at one of them while the cost is in all 32. The
bottom-up tree groups every HLO op by its kind -- the module kind of its layer
(``formats.attribution.module_kind``: the layer path's last part without its list index, the one
definition ``formats.findings`` and summary-text use too)::

    model/layers.3/mlp/down_proj + dot.217      ->   down_proj
    encoder/layer.0/attention/self + softmax.31 ->   self
    (an op in no layer)             dot.12      ->   dot

Each kind row's time is ``formats.attribution``'s kind time (the union of its ops' events across
layers; Σ of its ops' times when that is not known); it sums its instances' HBM bytes and per-engine
instructions; MFU is model FLOPs over the summed op time, the same formula as an op's; it counts them
(``×32``) and carries the Tensor engine's semaphore wait; its children are the
instances themselves (the same ``H:`` nodes as the top-down tree, so opening one pages its
instructions as there). ``kind_of`` is also what the problem rules group by, so a problem and this
view name the same kind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from explorer.viewer.text import fmt_ns
from explorer.viewer.view_model import Hierarchy, Node, NodeStats, frozen_map
from formats.read_api import add_known, module_kind

_OP_NUMBER = re.compile(r"\.\d+$")  # as formats.findings strips it
KIND_PREFIX = "K:"


@dataclass(frozen=True)
class Kind:
    """One op kind: ``key`` (the full pattern, unique) and ``label`` (short, for the tree)."""

    key: str
    label: str


def op_kind(name: str) -> str:
    """``dot.217`` -> ``dot``; ``layer_norm.3`` -> ``layer_norm``; a name without a number stays."""
    return _OP_NUMBER.sub("", name) or name


def kind_of(layer: str | None, op_name: str) -> Kind:
    """The kind of an op named ``op_name`` in layer ``layer`` (None: no layer): the module kind of its
    layer (``formats.attribution.module_kind``, as ``formats.findings`` groups), else the op's name
    without its number."""
    name = module_kind(layer) if layer else op_kind(op_name)
    return Kind(KIND_PREFIX + name, name)


def build(
    top_down: Hierarchy,
    tensor_wait: Mapping[str, int | None] | None = None,
    kind_time: Mapping[str, int] | None = None,
) -> Hierarchy:
    """The bottom-up tree of ``top_down``'s HLO ops; ``tensor_wait``: op key -> Tensor wait ns;
    ``kind_time``: module kind -> its time (``formats.attribution``: the union of its ops' events
    across layers), used for a kind's time when known, else the Σ of its ops' times."""
    waits = tensor_wait or {}
    times = kind_time or {}
    groups: dict[str, tuple[Kind, list[Node]]] = {}
    for node in top_down.nodes.values():
        if node.kind != "hlo":
            continue
        kind = kind_of(node.layer, node.name)
        groups.setdefault(kind.key, (kind, []))[1].append(node)
    nodes: dict[str, Node] = {}
    children: dict[str, tuple[str, ...]] = {}
    roots = []
    for key, (kind, ops) in groups.items():
        time = hbm = start = end = instructions = None
        counts: list[int | None] = [None] * len(ops[0].stats.counts)
        model = 0.0
        mfu_known = False
        wait = None
        for op in ops:
            s = op.stats
            time, hbm = add_known(time, s.time_ns), add_known(hbm, s.hbm_bytes)
            instructions = add_known(instructions, s.instructions)
            start = s.start_ts if start is None or (s.start_ts is not None and s.start_ts < start) else start
            end = s.end_ts if end is None or (s.end_ts is not None and s.end_ts > end) else end
            counts = [add_known(a, b) for a, b in zip(counts, s.counts)]
            if s.mfu is not None and s.time_ns:
                model += s.mfu * s.time_ns  # model FLOPs / PEAK, summed
                mfu_known = True
            wait = add_known(wait, waits.get(op.key))
            nodes[op.key] = replace(op, parent=key, name=f"{op.name}  {op.layer or ''}".rstrip())
        union = times.get(kind.label)
        stats = NodeStats(
            time_ns=union if union is not None else time,
            summed=any(op.stats.summed for op in ops),
            start_ts=start,
            end_ts=end,
            hbm_bytes=hbm,
            mfu=model / time if mfu_known and time else None,  # over the Σ of op times
            counts=tuple(counts),
            instructions=instructions,
        )
        detail = f"×{len(ops)}" + (f"  Tensor wait {fmt_ns(wait)}" if wait else "")
        nodes[key] = Node(key, "kind", kind.label, "", stats, expandable=True, detail=detail)
        children[key] = tuple(op.key for op in ops)
        roots.append(key)
    children[""] = tuple(roots)
    return Hierarchy(frozen_map(nodes), frozen_map(children), "op kinds across layers (bottom-up)", True)
