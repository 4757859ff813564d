"""Build the viewer's hierarchy (framework layer -> HLO op) from whatever the profile holds.

Two sources, merged:

* **The hierarchy tables** (``FrameworkNode``, ``HloInstruction``): small, read in full when the
  profile opens, so the tree is on screen before any big scan. A layer's busy time is the union of
  its ``time_intervals``; an op's is the sum over its rows (one row per op and execution). Layer ->
  op links follow the schema's join: ``FrameworkNode.children_ids`` lists the framework-op ids of the
  ops directly in the layer, matched against ``HloInstruction.raw_framework_id``.
* **The Instruction scan** (``OpAggregate`` rows, one grouped DuckDB query in a worker thread): adds
  per-engine instruction counts and FLOPs (so MFU), and builds whatever the tables lacked -- a real
  profile without ``FrameworkNode`` gets its layers from ``Instruction.layer`` (``a/b/c`` paths), one
  without ``HloInstruction`` its ops from ``hlo_name``/``raw_hlo_id`` with times that are *sums* of
  instruction durations (marked, since overlapping instructions count twice).

FrameworkNode ``mfu`` is read as 0-100 percent (our writer's scale; the real tool's is unverified,
profile-schema §9.2) and stored here as a fraction like every other utilisation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from explorer.viewer.model import ENGINES, Hierarchy, Node, NodeStats, frozen_map

NO_LAYER = "(no layer)"
STEMS = tuple(e.lower() for e in ENGINES)


def layer_key(path: str) -> str:
    return "L:" + path


def hlo_key(ref: tuple[str, str | int] | None) -> str:
    if ref is None:
        return "H:?"
    column, value = ref
    return f"H:{value}" if column == "raw_hlo_id" else f"H:name:{value}"


def union_ns(text: str | None) -> int | None:
    """Total length of the union of a ``time_intervals`` text list (``[[1, 10], [20, 50]]``)."""
    if not text:
        return None
    try:
        spans = sorted((int(a), int(b)) for a, b in json.loads(text))
    except (ValueError, TypeError):
        return None
    total, reach = 0, None
    for a, b in spans:
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def text_ids(text: str | None) -> list[int]:
    """``children_ids`` / ``stack_frame_ids`` text lists (``[1, 2, 3]``) as integers; junk is skipped."""
    if not text:
        return []
    out = []
    for part in text.strip().strip("[]").split(","):
        part = part.strip()
        if part.lstrip("-").isdigit():
            out.append(int(part))
    return out


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def display_name(path: str, parent: str) -> str:
    """The last part of a layer path when the parent is its prefix (the tree shows the nesting)."""
    if parent and path.startswith(parent + "/"):
        return path[len(parent) + 1 :]
    return path


# -- from the hierarchy tables ------------------------------------------------------------------


def from_tables(framework: Sequence[Mapping[str, Any]], hlo: Sequence[Mapping[str, Any]]) -> Hierarchy:
    """The tree the two hierarchy tables describe (either may be empty)."""
    nodes: dict[str, Node] = {}
    children: dict[str, list[str]] = {}
    op_layer: dict[int, str] = {}
    names = {str(r["node_name"]) for r in framework if r.get("node_name") is not None}
    for row in framework:
        path = str(row.get("node_name") or "")
        if not path:
            continue
        parent_name = str(row.get("parent_name") or "")
        parent = layer_key(parent_name) if parent_name in names and parent_name != path else ""
        counts = tuple(_int(row.get(f"{s}_engine_instruction_count")) for s in STEMS)
        known = [c for c in counts if c is not None]
        active = _int(row.get("active_time_ns"))
        mfu = row.get("mfu")
        stats = NodeStats(
            time_ns=active if active is not None else union_ns(row.get("time_intervals")),
            start_ts=_int(row.get("start_ts")),
            end_ts=_int(row.get("end_ts")),
            hbm_bytes=_add(_int(row.get("hbm_read_bytes")), _int(row.get("hbm_write_bytes"))),
            mfu=None if mfu is None else float(mfu) / 100.0,
            counts=counts,
            instructions=_int(row.get("instruction_count"))
            if row.get("instruction_count") is not None
            else (sum(known) if known else None),
        )
        key = layer_key(path)
        nodes[key] = Node(
            key,
            "layer",
            display_name(path, parent_name if parent else ""),
            parent,
            stats,
            expandable=True,
            layer=path,
        )
        children.setdefault(parent, []).append(key)
        for op in text_ids(row.get("children_ids")):
            op_layer[op] = path
    ops: dict[str, Node] = {}
    for row in hlo:
        raw = _int(row.get("raw_hlo_id"))
        name = row.get("hlo_name")
        ref: tuple[str, str | int] | None = (
            ("raw_hlo_id", raw)
            if raw is not None
            else (("hlo_name", str(name)) if name is not None else None)
        )
        key = hlo_key(ref)
        framework_id = _int(row.get("raw_framework_id"))
        layer = op_layer.get(framework_id) if framework_id is not None else None
        active = _int(row.get("active_time_ns"))
        time_ns = active if active is not None else union_ns(row.get("time_intervals"))
        stats = NodeStats(
            time_ns=time_ns,
            start_ts=_int(row.get("start_ts")),
            end_ts=_int(row.get("end_ts")),
            hbm_bytes=_add(_int(row.get("hbm_read_bytes")), _int(row.get("hbm_write_bytes"))),
            instructions=_int(row.get("instruction_count")),
        )
        found = ops.get(key)
        if found is not None:
            stats = _merge(found.stats, stats)
            layer = found.layer or layer
        ops[key] = Node(
            key,
            "hlo",
            str(name if name is not None else raw),
            "",
            stats,
            expandable=True,
            hlo_ref=ref,
            layer=layer,
        )
    for key, op in ops.items():
        parent = layer_key(op.layer) if op.layer and layer_key(op.layer) in nodes else ""
        nodes[key] = replace(op, parent=parent)
        children.setdefault(parent, []).append(key)
    _orphans_under_no_layer(nodes, children, bool(framework))
    parts = [name for name, rows in (("FrameworkNode", framework), ("HloInstruction", hlo)) if rows]
    return Hierarchy(
        frozen_map(nodes),
        frozen_map({k: tuple(v) for k, v in children.items()}),
        " + ".join(parts) or "nothing yet",
    )


def _merge(a: NodeStats, b: NodeStats) -> NodeStats:
    """Two rows of one op (two executions): times and bytes add, the span widens."""
    return NodeStats(
        time_ns=_add(a.time_ns, b.time_ns),
        summed=a.summed or b.summed,
        start_ts=_min(a.start_ts, b.start_ts),
        end_ts=_max(a.end_ts, b.end_ts),
        hbm_bytes=_add(a.hbm_bytes, b.hbm_bytes),
        mfu=None,
        counts=tuple(_add(x, y) for x, y in zip(a.counts, b.counts)),
        instructions=_add(a.instructions, b.instructions),
    )


def _orphans_under_no_layer(nodes: dict[str, Node], children: dict[str, list[str]], has_layers: bool) -> None:
    """Ops no layer claims go under one "(no layer)" root when there are layers at all."""
    orphans = [k for k in children.get("", []) if nodes[k].kind == "hlo"]
    if not has_layers or not orphans:
        return
    key = layer_key(NO_LAYER)
    stats = NodeStats()
    for k in orphans:
        stats = _merge(stats, nodes[k].stats)
        nodes[k] = replace(nodes[k], parent=key)
    nodes[key] = Node(key, "layer", NO_LAYER, "", stats, expandable=True)
    children[""] = [k for k in children[""] if k not in orphans] + [key]
    children[key] = orphans


# -- from the Instruction scan ------------------------------------------------------------------


@dataclass
class OpAggregate:
    """One op's sums from the grouped Instruction scan (over all its engines and stacks)."""

    ref: tuple[str, str | int] | None
    name: str
    layer: str | None
    counts: list[int] = field(default_factory=lambda: [0] * len(ENGINES))
    instructions: int = 0
    duration_ns: int = 0
    start_ts: int | None = None
    end_ts: int | None = None
    model_flops: int | None = None
    pe_flops: int | None = None
    transpose_flops: int | None = None
    hbm_bytes: int | None = None
    spill_reload_bytes: int | None = None
    tensor_wait_ns: int | None = None
    layer_votes: dict[str | None, int] = field(default_factory=dict)

    def add(self, row: Mapping[str, Any]) -> None:
        n = int(row["n"])
        engine = row.get("engine")
        if engine in ENGINES:
            self.counts[ENGINES.index(engine)] += n
        self.instructions += n
        self.duration_ns += int(row["dur"] or 0)
        self.start_ts = _min(self.start_ts, _int(row["t0"]))
        self.end_ts = _max(self.end_ts, _int(row["t1"]))
        self.model_flops = _add(self.model_flops, _int(row["model"]))
        self.pe_flops = _add(self.pe_flops, _int(row["pe"]))
        self.transpose_flops = _add(self.transpose_flops, _int(row["ft"]))
        self.hbm_bytes = _add(self.hbm_bytes, _int(row["hbm"]))
        self.spill_reload_bytes = _add(self.spill_reload_bytes, _int(row["spill"]))
        if engine == "Tensor":
            self.tensor_wait_ns = _add(self.tensor_wait_ns, _int(row["wait"]))
        self.layer_votes[row.get("layer")] = self.layer_votes.get(row.get("layer"), 0) + n

    @property
    def main_layer(self) -> str | None:
        return max(self.layer_votes.items(), key=lambda kv: kv[1])[0] if self.layer_votes else None


def mfu(model_flops: int | None, time_ns: int | None, peak_flops_per_s: float | None) -> float | None:
    if model_flops is None or not time_ns or not peak_flops_per_s:
        return None
    return model_flops / (peak_flops_per_s * time_ns * 1e-9)


def merge_scan(
    base: Hierarchy,
    ops: Iterable[OpAggregate],
    peak_flops_per_s: float | None,
    dma_hbm: Mapping[int, int] | None = None,
) -> Hierarchy:
    """``base`` (from the tables) completed with the Instruction scan's ops."""
    nodes = dict(base.nodes)
    children = {k: list(v) for k, v in base.children.items()}
    has_layers = any(n.kind == "layer" and n.key != layer_key(NO_LAYER) for n in nodes.values())
    has_ops = any(n.kind == "hlo" for n in nodes.values())
    for agg in ops:
        key = hlo_key(agg.ref)
        found = nodes.get(key)
        if found is not None and has_ops:
            stats = found.stats
            nodes[key] = replace(
                found,
                stats=replace(
                    stats,
                    counts=tuple(agg.counts),
                    instructions=agg.instructions,
                    mfu=mfu(agg.model_flops, stats.time_ns, peak_flops_per_s),
                    hbm_bytes=stats.hbm_bytes if stats.hbm_bytes is not None else agg.hbm_bytes,
                    start_ts=_min(stats.start_ts, agg.start_ts),
                    end_ts=_max(stats.end_ts, agg.end_ts),
                ),
            )
            continue
        layer = agg.main_layer
        parent = ""
        if layer is not None and (has_layers or not has_ops):
            parent = _ensure_layer(nodes, children, layer)
        elif has_layers:
            parent = _ensure_layer(nodes, children, NO_LAYER)
        hbm = agg.hbm_bytes
        if dma_hbm and agg.ref is not None and agg.ref[0] == "raw_hlo_id":
            hbm = _add(hbm, dma_hbm.get(int(agg.ref[1])))
        stats = NodeStats(
            time_ns=agg.duration_ns,
            summed=True,
            start_ts=agg.start_ts,
            end_ts=agg.end_ts,
            hbm_bytes=hbm,
            mfu=mfu(agg.model_flops, agg.duration_ns, peak_flops_per_s),
            counts=tuple(agg.counts),
            instructions=agg.instructions,
        )
        if found is not None:
            old = found.parent
            if old in children and key in children[old]:
                children[old].remove(key)
        nodes[key] = Node(key, "hlo", agg.name, parent, stats, expandable=True, hlo_ref=agg.ref, layer=layer)
        children.setdefault(parent, []).append(key)
    _roll_up_layers(nodes, children, peak_flops_per_s, list(ops) if not isinstance(ops, list) else ops)
    source = base.source if base.source != "nothing yet" else "Instruction"
    if base.source != "nothing yet" and (not has_layers or not has_ops):
        source += " + Instruction"
    return Hierarchy(
        frozen_map(nodes), frozen_map({k: tuple(v) for k, v in children.items()}), source, analysed=True
    )


def _ensure_layer(nodes: dict[str, Node], children: dict[str, list[str]], path: str) -> str:
    """The key of layer ``path``, creating it and its ancestors (``a``, ``a/b``) when absent."""
    key = layer_key(path)
    if key in nodes:
        return key
    if path == NO_LAYER:
        parent_path = ""
    else:
        parent_path = path.rpartition("/")[0]
    parent = _ensure_layer(nodes, children, parent_path) if parent_path else ""
    nodes[key] = Node(
        key,
        "layer",
        display_name(path, parent_path),
        parent,
        NodeStats(summed=True),
        expandable=True,
        layer=path if path != NO_LAYER else None,
    )
    children.setdefault(parent, []).append(key)
    return key


def _roll_up_layers(
    nodes: dict[str, Node], children: dict[str, list[str]], peak: float | None, ops: list[OpAggregate]
) -> None:
    """Layers built here (``summed``) get their figures from their ops; layers read from FrameworkNode
    get only what the table lacked (per-engine counts) and keep their own times."""
    flops = {hlo_key(a.ref): a.model_flops for a in ops}

    def visit(key: str) -> tuple[NodeStats, int | None]:
        node = nodes[key]
        total = NodeStats(summed=True)
        model: int | None = None
        for child in children.get(key, ()):
            if nodes[child].kind == "hlo":
                stats, child_model = nodes[child].stats, flops.get(child)
            else:
                stats, child_model = visit(child)
            total = _merge(total, stats)
            model = _add(model, child_model)
        if node.kind != "layer":
            return node.stats, model
        if node.stats.summed:
            stats = replace(total, summed=True, mfu=mfu(model, total.time_ns, peak))
        else:
            counts = node.stats.counts if any(c is not None for c in node.stats.counts) else total.counts
            stats = replace(
                node.stats,
                counts=counts,
                mfu=node.stats.mfu if node.stats.mfu is not None else mfu(model, node.stats.time_ns, peak),
            )
        nodes[key] = replace(node, stats=stats)
        return stats, model

    for root in children.get("", ()):
        if nodes[root].kind == "layer":
            visit(root)


# -- ordering and filtering (pure, used by the UI) ------------------------------------------------

SORT_KEYS = ("time", "start", "name", "mfu", "hbm", "instructions")


def sort_value(node: Node, key: str) -> Any:
    s = node.stats
    if key == "name":
        return node.name.lower()
    if key == "start":
        return s.start_ts if s.start_ts is not None else float("inf")
    value = {"time": s.time_ns, "mfu": s.mfu, "hbm": s.hbm_bytes, "instructions": s.instructions}[key]
    return -(value if value is not None else -1)


def ordered(hierarchy: Hierarchy, keys: Sequence[str], sort: str, reverse: bool) -> list[str]:
    """Child keys in display order: by ``sort`` (largest first for figures), "(no layer)" last."""
    nodes = hierarchy.nodes
    out = sorted(keys, key=lambda k: (nodes[k].key == layer_key(NO_LAYER), sort_value(nodes[k], sort), k))
    return out[::-1] if reverse else out


def matches(hierarchy: Hierarchy, text: str) -> set[str]:
    """Layers and ops whose name (or full layer path) contains ``text``, case-insensitively."""
    needle = text.lower()
    found = set()
    for key, node in hierarchy.nodes.items():
        if needle in node.name.lower() or (
            node.kind == "layer" and node.layer and needle in node.layer.lower()
        ):
            found.add(key)
    return found
