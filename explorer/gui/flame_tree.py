"""The hierarchy as a flame chart: framework layers (module paths) over HLO ops, over time.

    tree = load_flame_tree(loaded)
    tree.nodes[0].name, tree.nodes[0].depth, tree.nodes[0].intervals   # 'model', 0, [[s, e], ...]
    tree.where(node)     # SQL over Instruction selecting the node's instructions (for highlighting)

Sources, best first: the hierarchy tables as ``formats.hierarchy_read`` loads them (``FrameworkNode``
layers over ``HloInstruction`` ops -- the same model, times and malformed-id count the terminal viewer
shows), else a real profile without ``FrameworkNode`` gets its tree from one grouped scan of
``Instruction`` by (layer, HLO op, time bucket) (``formats.hierarchy_read.from_instructions``). This
module only lays the tree out as flame nodes.

Each node is drawn at its busy intervals (not one bar from first to last), so gaps where a layer
waited show as gaps. Depth is the module path's depth; ops sit one level under their layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from explorer.gui.session import LoadedProfile
from formats.read_api import FrameworkHierarchy, from_instructions, literal
from formats.read_api import load_hierarchy as read_hierarchy

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
class FlameTree:
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


def load_flame_tree(loaded: LoadedProfile) -> FlameTree:
    """The flame chart's tree: from the hierarchy tables when the profile has layers, else rebuilt
    from the instructions. Runs on a worker thread; the result is not shared until it returns."""
    tables = read_hierarchy(loaded.profile)
    if tables.layers:
        return from_hierarchy(tables)
    if not loaded.profile.num_rows("Instruction"):
        return FlameTree(note="no hierarchy: the profile has neither FrameworkNode nor instructions")
    with loaded.queries.lock:
        scanned = from_instructions(loaded.profile, loaded.queries.con)
    tree = from_hierarchy(scanned, max_intervals=None)  # the scan is bounded already
    if not tree.nodes:
        tree.note = "no hierarchy: the instructions carry no layer or HLO op"
    return tree


def from_hierarchy(tables: FrameworkHierarchy, max_intervals: int | None = MAX_INTERVALS) -> FlameTree:
    """Flame nodes for the hierarchy ``formats.hierarchy_read`` loaded (the one the terminal viewer
    shows too): a layer's depth is its path's, an op sits one level under its layer (0 without one).
    Past ``MAX_INTERVALS`` spans in all, a node is drawn as one bar from its first start to last end."""
    tree = FlameTree(source=tables.source, malformed=tables.malformed.note())
    total = 0

    def spans(intervals: np.ndarray, start: int | None, end: int | None) -> np.ndarray:
        nonlocal total
        total += len(intervals)
        if max_intervals is not None and total > max_intervals and start is not None and end is not None:
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
