"""The hierarchy as a flame chart: framework layers (module paths) over HLO ops, over time.

    tree = load_hierarchy(loaded)
    tree.nodes[0].name, tree.nodes[0].depth, tree.nodes[0].intervals   # 'model', 0, [[s, e], ...]
    tree.where(node)     # SQL over Instruction selecting the node's instructions (for highlighting)

Sources, best first: the hierarchy tables as ``formats.hierarchy_read`` loads them (``FrameworkNode``
layers over ``HloInstruction`` ops -- the same model, times and malformed-id count the terminal viewer
shows; this module only lays it out), else a real profile without ``FrameworkNode`` gets its tree from
one grouped scan of ``Instruction`` by (layer, HLO op, time bucket).

Each node is drawn at its busy intervals (not one bar from first to last), so gaps where a layer
waited show as gaps. Depth is the module path's depth; ops sit one level under their layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorer.gui.session import LoadedProfile
from formats.hierarchy_read import FrameworkHierarchy
from formats.hierarchy_read import load_hierarchy as read_hierarchy
from formats.sqlsource import TableSource, literal

MAX_INTERVALS = 200_000  # beyond this, nodes keep only their first-to-last span


@dataclass
class FlameNode:
    name: str  # full path for layers, op name for HLO ops
    label: str  # what is written on the bar
    kind: str  # "layer" or "hlo"
    depth: int
    start: int  # absolute ns
    end: int
    intervals: np.ndarray  # (n, 2) absolute ns
    instructions: int | None = None
    active_ns: int | None = None
    raw_id: int | None = None  # raw_hlo_id of an op
    parent: str | None = None


@dataclass
class Hierarchy:
    nodes: list[FlameNode] = field(default_factory=list)
    source: str = ""
    note: str = ""  # replaces the chart's caption: why there is no tree
    malformed: str = ""  # what the reader skipped, e.g. "2 malformed ids skipped"

    @property
    def depth(self) -> int:
        return max((n.depth for n in self.nodes), default=-1) + 1

    def where(self, node: FlameNode) -> str:
        """Instructions of a node as a SQL condition over Instruction."""
        if node.kind == "layer":
            return f"(layer = {literal(node.name)} OR starts_with(layer, {literal(node.name + '/')}))"
        if node.raw_id is not None:
            return f"raw_hlo_id = {int(node.raw_id)}"
        condition = f"hlo_name = {literal(node.name)}"
        if node.parent:
            condition += f" AND layer = {literal(node.parent)}"
        return condition


def load_hierarchy(loaded: LoadedProfile) -> Hierarchy:
    """The flame chart's tree: from the hierarchy tables when the profile has layers, else rebuilt
    from the instructions. Runs on a worker thread; the result is not shared until it returns."""
    tables = read_hierarchy(loaded.profile)
    if tables.layers:
        return from_hierarchy(tables)
    if loaded.profile.num_rows("Instruction"):
        return _from_instructions(loaded)
    return Hierarchy(note="no hierarchy: the profile has neither FrameworkNode nor instructions")


def from_hierarchy(tables: FrameworkHierarchy) -> Hierarchy:
    """Flame nodes for the hierarchy ``formats.hierarchy_read`` loaded (the one the terminal viewer
    shows too): a layer's depth is its path's, an op sits one level under its layer (0 without one).
    Past ``MAX_INTERVALS`` spans in all, a node is drawn as one bar from its first start to last end."""
    tree = Hierarchy(source=tables.source, malformed=tables.malformed.note())
    total = 0

    def spans(intervals: np.ndarray, start: int | None, end: int | None) -> np.ndarray:
        nonlocal total
        total += len(intervals)
        if total > MAX_INTERVALS and start is not None and end is not None:
            return np.array([[start, end]], np.int64)
        return intervals

    depth_of = {layer.path: layer.depth for layer in tables.layers}
    for layer in tables.layers:
        start, end = _bounds(layer.start_ts, layer.end_ts, layer.spans)
        tree.nodes.append(
            FlameNode(
                layer.path,
                layer.path.rsplit("/", 1)[-1],
                "layer",
                layer.depth,
                start,
                end,
                spans(layer.spans, layer.start_ts, layer.end_ts),
                layer.instructions,
                layer.time_ns,
                parent=layer.parent or None,
            )
        )
    for op in tables.ops:
        layer_path = op.layer if op.layer in depth_of else None
        start, end = _bounds(op.start_ts, op.end_ts, op.spans)
        tree.nodes.append(
            FlameNode(
                op.name,
                op.name,
                "hlo",
                depth_of[layer_path] + 1 if layer_path is not None else 0,
                start,
                end,
                spans(op.spans, op.start_ts, op.end_ts),
                op.instructions,
                op.time_ns,
                raw_id=op.key.raw_hlo_id,
                parent=layer_path,
            )
        )
    return tree


def _bounds(start: int | None, end: int | None, intervals: np.ndarray) -> tuple[int, int]:
    """A node's first start and last end: the table's, else its spans' (else 0)."""
    if start is None:
        start = int(intervals[:, 0].min()) if len(intervals) else 0
    if end is None:
        end = int(intervals[:, 1].max()) if len(intervals) else start
    return start, end


FALLBACK_BUCKETS = 4096  # time resolution of a hierarchy rebuilt from the instructions


def _merge(spans: list[tuple[int, int]], slack: int) -> np.ndarray:
    """Sorted intervals with overlaps (and gaps up to ``slack``) merged, as an (n, 2) array."""
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1] + slack:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return np.asarray(out, np.int64).reshape(-1, 2)


def _from_instructions(loaded: LoadedProfile) -> Hierarchy:
    """The tree from one grouped scan of Instruction by (layer, HLO op, time bucket): each node gets
    the time buckets it ran in (merged into intervals), so a layer that runs many times shows many
    bars, not one bar from its first start to its last end."""
    source = TableSource(loaded.profile, "Instruction")
    bounds = loaded.queries.rows(f"SELECT min(start_ts) AS s, max(end_ts) AS e FROM {source.relation()}")[0]
    first, last = int(bounds["s"]), int(bounds["e"])
    width = max(1, (last - first) // FALLBACK_BUCKETS + 1)
    rows = loaded.queries.rows(f"""
        SELECT {source.col("layer")} AS layer, {source.col("hlo_name")} AS hlo, min(start_ts) AS s,
               max(end_ts) AS e, count(*) AS n, sum(duration_ns) AS t
        FROM {source.relation()} GROUP BY layer, hlo, (start_ts - {first}) // {width}
        ORDER BY s LIMIT {MAX_INTERVALS}""")
    tree = Hierarchy(source="Instruction (layer, hlo_name)")
    layers: dict[str, list[Any]] = {}
    ops: dict[tuple[Any, str], list[Any]] = {}
    for r in rows:
        span = (int(r["s"]), int(r["e"]))
        if r["layer"] is not None:
            parts = str(r["layer"]).split("/")
            for depth in range(len(parts)):
                entry = layers.setdefault("/".join(parts[: depth + 1]), [[], 0])
                entry[0].append(span)
                entry[1] += int(r["n"])
        if r["hlo"] is not None:
            entry = ops.setdefault((r["layer"], str(r["hlo"])), [[], 0, 0])
            entry[0].append(span)
            entry[1] += int(r["n"])
            entry[2] += int(r["t"] or 0)
    for path, (spans, n) in layers.items():
        merged = _merge(spans, width)
        tree.nodes.append(
            FlameNode(
                path,
                path.rsplit("/", 1)[-1],
                "layer",
                path.count("/"),
                int(merged[0, 0]),
                int(merged[:, 1].max()),
                merged,
                n,
                parent=path.rsplit("/", 1)[0] if "/" in path else None,
            )
        )
    for (layer, hlo), (spans, n, t) in ops.items():
        merged = _merge(spans, width)
        depth = str(layer).count("/") + 1 if layer is not None else 0
        tree.nodes.append(
            FlameNode(
                hlo, hlo, "hlo", depth, int(merged[0, 0]), int(merged[:, 1].max()), merged, n, t, parent=layer
            )
        )
    if not tree.nodes:
        tree.note = "no hierarchy: the instructions carry no layer or HLO op"
    return tree
