"""The hierarchy as a flame chart: framework layers (module paths) over HLO ops, over time.

    tree = load_hierarchy(loaded)
    tree.nodes[0].name, tree.nodes[0].depth, tree.nodes[0].intervals   # 'model', 0, [[s, e], ...]
    tree.where(node)     # SQL over Instruction selecting the node's instructions (for highlighting)

Sources, best first: ``FrameworkNode`` (one row per module path, with its merged busy intervals) and
``HloInstruction`` (per op and execution; an op belongs to the layer whose ``children_ids`` list its
``raw_framework_id``); a real profile without them gets the same tree from one grouped scan of
``Instruction`` by (layer, HLO op) -- each node then spans first start to last end.

Each node is drawn at its busy intervals (not one bar from first to last), so gaps where a layer
waited show as gaps. Depth is the module path's depth; ops sit one level under their layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorer.gui.session import LoadedProfile
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
    note: str = ""

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


def _intervals(text: object) -> np.ndarray:
    """``time_intervals`` (text ``[[s, e], ...]`` or a list) as an (n, 2) int64 array."""
    if text is None:
        return np.zeros((0, 2), np.int64)
    values = json.loads(text) if isinstance(text, str) else text
    array = np.asarray(values, dtype=np.int64)
    return array.reshape(-1, 2) if array.size else np.zeros((0, 2), np.int64)


def _ids(text: object) -> list[int]:
    if text is None:
        return []
    if isinstance(text, str):
        return [int(t) for t in text.strip("[] ").split(",") if t.strip()]
    return [int(t) for t in text]  # type: ignore[attr-defined]


def load_hierarchy(loaded: LoadedProfile) -> Hierarchy:
    if loaded.profile.num_rows("FrameworkNode"):
        return _from_tables(loaded)
    if loaded.profile.num_rows("Instruction"):
        return _from_instructions(loaded)
    return Hierarchy(note="no hierarchy: the profile has neither FrameworkNode nor instructions")


def _from_tables(loaded: LoadedProfile) -> Hierarchy:
    nodes = loaded.queries.rows(
        f"SELECT node_name, parent_name, children_ids, start_ts, end_ts, time_intervals, "
        f"{TableSource(loaded.profile, 'FrameworkNode').col('instruction_count')} AS n, "
        f"{TableSource(loaded.profile, 'FrameworkNode').col('active_time_ns')} AS active "
        f"FROM {TableSource(loaded.profile, 'FrameworkNode').relation()} ORDER BY start_ts"
    )
    tree = Hierarchy(source="FrameworkNode + HloInstruction")
    layer_of: dict[int, str] = {}
    depth_of: dict[str, int] = {}
    total = 0
    for r in nodes:
        name = str(r["node_name"])
        depth = name.count("/")
        depth_of[name] = depth
        spans = _intervals(r["time_intervals"])
        total += len(spans)
        if total > MAX_INTERVALS:
            spans = np.array([[r["start_ts"], r["end_ts"]]], np.int64)
        tree.nodes.append(
            FlameNode(
                name,
                name.rsplit("/", 1)[-1],
                "layer",
                depth,
                int(r["start_ts"]),
                int(r["end_ts"]),
                spans,
                r["n"],
                r["active"],
                parent=r["parent_name"] or None,
            )
        )
        for op in _ids(r["children_ids"]):
            layer_of[op] = name
    if loaded.profile.num_rows("HloInstruction"):
        source = TableSource(loaded.profile, "HloInstruction")
        ops: dict[tuple[int, str], FlameNode] = {}
        for r in loaded.queries.rows(
            f"SELECT raw_framework_id AS fw, raw_hlo_id AS hlo, hlo_name, start_ts, end_ts, time_intervals, "
            f"{source.col('instruction_count')} AS n, {source.col('active_time_ns')} AS active "
            f"FROM {source.relation()} ORDER BY start_ts"
        ):
            layer = layer_of.get(int(r["fw"]))
            depth = depth_of.get(layer, -1) + 1 if layer else 0
            key = (int(r["hlo"]), str(r["hlo_name"]))
            spans = _intervals(r["time_intervals"])
            total += len(spans)
            if total > MAX_INTERVALS:
                spans = np.array([[r["start_ts"], r["end_ts"]]], np.int64)
            node = ops.get(key)
            if node is None:
                ops[key] = FlameNode(
                    str(r["hlo_name"]),
                    str(r["hlo_name"]),
                    "hlo",
                    depth,
                    int(r["start_ts"]),
                    int(r["end_ts"]),
                    spans,
                    r["n"],
                    r["active"],
                    raw_id=int(r["hlo"]),
                    parent=layer,
                )
            else:
                node.start, node.end = min(node.start, int(r["start_ts"])), max(node.end, int(r["end_ts"]))
                node.intervals = np.concatenate([node.intervals, spans])
                node.instructions = (node.instructions or 0) + int(r["n"] or 0)
                node.active_ns = (node.active_ns or 0) + int(r["active"] or 0)
        tree.nodes += list(ops.values())
    return tree


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
