"""Build the viewer's hierarchy (framework layer -> HLO op) from whatever the profile holds.

Two sources, merged:

* **The hierarchy tables**, read by ``formats.hierarchy_read`` (the one loader the GUI's flame chart
  uses too: same layers, ops, times, layer -> op links and count of skipped malformed ids) when the
  profile opens, so the tree is on screen before any big scan; ``from_hierarchy`` only turns that
  model into the viewer's rows (keys, display names, the "(no layer)" group).
* **The Instruction scan** (``OpAggregate`` rows, one grouped DuckDB query in a worker thread): adds
  per-engine instruction counts and FLOPs (so MFU), and builds whatever the tables lacked -- a real
  profile without ``FrameworkNode`` gets its layers from ``Instruction.layer`` (``a/b/c`` paths), one
  without ``HloInstruction`` its ops from ``hlo_name``/``raw_hlo_id`` with times that are *sums* of
  instruction durations (marked, since overlapping instructions count twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from explorer.viewer.view_model import ENGINES, Hierarchy, Node, NodeStats, frozen_map
from formats.read_api import FrameworkHierarchy, add_known, display_name, max_known, min_known

NO_LAYER = "(no layer)"


def layer_key(path: str) -> str:
    return "L:" + path


def hlo_key(ref: tuple[str, str | int] | None) -> str:
    if ref is None:
        return "H:?"
    column, value = ref
    return f"H:{value}" if column == "raw_hlo_id" else f"H:name:{value}"


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# -- from the hierarchy tables ------------------------------------------------------------------


def from_hierarchy(tables: FrameworkHierarchy) -> Hierarchy:
    """The viewer's rows for the hierarchy the tables describe (``formats.hierarchy_read``)."""
    nodes: dict[str, Node] = {}
    children: dict[str, list[str]] = {}
    for layer in tables.layers:
        key = layer_key(layer.path)
        parent = layer_key(layer.parent) if layer.parent else ""
        stats = NodeStats(
            time_ns=layer.time_ns,
            start_ts=layer.start_ts,
            end_ts=layer.end_ts,
            hbm_bytes=layer.hbm_bytes,
            mfu=layer.mfu,
            counts=layer.counts,
            instructions=layer.instructions,
        )
        nodes[key] = Node(key, "layer", layer.name, parent, stats, expandable=True, layer=layer.path)
        children.setdefault(parent, []).append(key)
    for op in tables.ops:
        ref: tuple[str, str | int] = (op.key.column, op.key.value)
        key = hlo_key(ref)
        parent = layer_key(op.layer) if op.layer and layer_key(op.layer) in nodes else ""
        stats = NodeStats(
            time_ns=op.time_ns,
            start_ts=op.start_ts,
            end_ts=op.end_ts,
            hbm_bytes=op.hbm_bytes,
            instructions=op.instructions,
        )
        nodes[key] = Node(key, "hlo", op.name, parent, stats, expandable=True, hlo_ref=ref, layer=op.layer)
        children.setdefault(parent, []).append(key)
    _orphans_under_no_layer(nodes, children, bool(tables.layers))
    return Hierarchy(
        frozen_map(nodes),
        frozen_map({k: tuple(v) for k, v in children.items()}),
        tables.source,
        malformed=tables.malformed.note(),
    )


def _merge(a: NodeStats, b: NodeStats) -> NodeStats:
    """Two rows of one op (two executions): times and bytes add, the span widens."""
    return NodeStats(
        time_ns=add_known(a.time_ns, b.time_ns),
        summed=a.summed or b.summed,
        start_ts=min_known(a.start_ts, b.start_ts),
        end_ts=max_known(a.end_ts, b.end_ts),
        hbm_bytes=add_known(a.hbm_bytes, b.hbm_bytes),
        mfu=None,
        counts=tuple(add_known(x, y) for x, y in zip(a.counts, b.counts)),
        instructions=add_known(a.instructions, b.instructions),
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
        self.start_ts = min_known(self.start_ts, _int(row["t0"]))
        self.end_ts = max_known(self.end_ts, _int(row["t1"]))
        self.model_flops = add_known(self.model_flops, _int(row["model"]))
        self.pe_flops = add_known(self.pe_flops, _int(row["pe"]))
        self.transpose_flops = add_known(self.transpose_flops, _int(row["ft"]))
        self.hbm_bytes = add_known(self.hbm_bytes, _int(row["hbm"]))
        self.spill_reload_bytes = add_known(self.spill_reload_bytes, _int(row["spill"]))
        if engine == "Tensor":
            self.tensor_wait_ns = add_known(self.tensor_wait_ns, _int(row["wait"]))
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
                    start_ts=min_known(stats.start_ts, agg.start_ts),
                    end_ts=max_known(stats.end_ts, agg.end_ts),
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
            hbm = add_known(hbm, dma_hbm.get(int(agg.ref[1])))
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
        frozen_map(nodes),
        frozen_map({k: tuple(v) for k, v in children.items()}),
        source,
        analysed=True,
        malformed=base.malformed,
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
            model = add_known(model, child_model)
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
