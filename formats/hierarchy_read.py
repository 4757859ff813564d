"""The profile's framework hierarchy (layer -> HLO op), read once, for every view.

    tree = load_hierarchy(open_profile("out/bert"))
    tree.layers[0].path, tree.layers[0].parent, tree.layers[0].spans   # 'encoder', '', (n, 2) ns
    tree.ops[0].name, tree.ops[0].layer                                # 'dot.1', 'encoder/layer.0'
    tree.malformed.note()                                              # '2 malformed ids skipped'

Sources are the two small hierarchy tables (profile-schema §3.4): ``FrameworkNode`` (one row per
module path, its merged busy ``time_intervals``) and ``HloInstruction`` (one row per op and
execution). An op belongs to the layer whose ``children_ids`` lists its ``raw_framework_id``
(the schema's join, §2.7). The terminal viewer (``explorer.viewer.tree_build``) and the GUI flame
chart (``explorer.gui.flame_tree``) both render this one model, so they show the same tree, the
same times and the same count of malformed values; they differ only in presentation.

Definitions (one per figure):

* a node's busy time is its ``active_time_ns`` (our extension column) when present, else the length
  of the union of its ``time_intervals``; an op's is the sum over its rows (one row per execution);
* a layer's instruction count is ``instruction_count`` when present, else the sum of its known
  per-engine counts; FrameworkNode ``mfu`` is read as 0-100 percent (our writer's scale; the real
  tool's is unverified, §9.2) and kept here as a fraction like every other utilisation;
* ops are keyed by ``raw_hlo_id``, or by ``hlo_name`` when the id is null; rows of one key merge
  (times, bytes and counts add, the span widens, spans concatenate);
* a layer's parent is its ``parent_name`` when that is a layer of the table, else it is a root.

A profile without the tables can have its tree rebuilt from ``Instruction`` (``from_instructions``:
layer paths and HLO names, op times summed).

Bad input never raises: ids that are not integers are skipped, unreadable ``time_intervals`` give
no spans, rows without a name are dropped -- and each is counted in ``malformed``.

Immutable after construction (frozen dataclasses, read-only arrays): safe to hand between threads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from formats.hierarchy_rollup import ENGINE_STEMS
from formats.nullable import add_known, max_known, min_known
from formats.text_lists import Intervals, parse_ids, parse_intervals

if TYPE_CHECKING:
    import duckdb

    from formats.reader import Profile

Row = Mapping[str, object]
FRAMEWORK_TABLE = "FrameworkNode"
HLO_TABLE = "HloInstruction"
NOTHING = "nothing yet"
SCANNED = "Instruction (layer, hlo_name)"
SCAN_BUCKETS = 4096  # time resolution of a hierarchy rebuilt from the instructions
SCAN_ROWS = 200_000  # (layer, op, bucket) groups read at most


@dataclass(frozen=True)
class OpKey:
    """How an op is identified: by ``raw_hlo_id``, or by ``hlo_name`` when the id is null."""

    raw_hlo_id: int | None
    name: str | None

    @property
    def column(self) -> str:
        return "raw_hlo_id" if self.raw_hlo_id is not None else "hlo_name"

    @property
    def value(self) -> int | str:
        return self.raw_hlo_id if self.raw_hlo_id is not None else str(self.name)


@dataclass(frozen=True)
class Malformed:
    """What the loader skipped, per kind, so a view can say so (tools survive bad input)."""

    ids: int = 0  # elements of ``children_ids`` that are not integers
    intervals: int = 0  # ``time_intervals`` values that could not be read
    rows: int = 0  # rows without a node name / op identity, or a repeated layer path

    @property
    def total(self) -> int:
        return self.ids + self.intervals + self.rows

    def note(self) -> str:
        """One line for the views, e.g. ``2 malformed ids skipped``; empty when nothing was skipped."""
        parts = [f"{n} malformed {what} skipped" for n, what in (
            (self.ids, "ids"), (self.intervals, "time_intervals"), (self.rows, "rows")) if n]
        return "; ".join(parts)


def display_name(path: str, parent: str) -> str:
    """The last part of a layer path when the parent is its prefix (a tree shows the nesting)."""
    if parent and path.startswith(parent + "/"):
        return path[len(parent) + 1:]
    return path


def _frozen(spans: Intervals) -> Intervals:
    out = np.ascontiguousarray(spans, dtype=np.int64).reshape(-1, 2)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class Layer:
    """One ``FrameworkNode`` row: a module path (``encoder/layer.0``) and its figures."""

    path: str
    parent: str  # parent layer's path; "" for a root
    spans: Intervals  # (n, 2) absolute ns, as the table lists them (read-only)
    op_ids: tuple[int, ...]  # framework-op ids of the ops directly in this layer (children_ids)
    start_ts: int | None = None
    end_ts: int | None = None
    time_ns: int | None = None  # busy time (see the module docstring)
    hbm_bytes: int | None = None
    mfu: float | None = None  # fraction
    counts: tuple[int | None, ...] = (None,) * len(ENGINE_STEMS)  # per engine, ENGINE_STEMS order
    instructions: int | None = None

    @property
    def name(self) -> str:
        return display_name(self.path, self.parent)

    @property
    def depth(self) -> int:
        return self.path.count("/")


@dataclass(frozen=True)
class Op:
    """One HLO op: its ``HloInstruction`` rows (one per execution) merged."""

    key: OpKey
    name: str
    layer: str | None  # path of the layer that lists it; None: no layer claims it
    spans: Intervals  # (n, 2) absolute ns, all executions' spans concatenated (read-only)
    start_ts: int | None = None
    end_ts: int | None = None
    time_ns: int | None = None  # busy time summed over executions
    hbm_bytes: int | None = None
    instructions: int | None = None
    executions: int = 1


@dataclass(frozen=True)
class FrameworkHierarchy:
    """The hierarchy tables as one tree: layers in order of first activity, then ops likewise."""

    layers: tuple[Layer, ...] = ()
    ops: tuple[Op, ...] = ()
    malformed: Malformed = field(default_factory=Malformed)
    tables: tuple[str, ...] = ()  # which hierarchy tables had rows
    scanned: bool = False  # rebuilt from Instruction (``from_instructions``): op times are sums

    @property
    def source(self) -> str:
        """``FrameworkNode + HloInstruction`` (the tables that had rows), ``Instruction (layer,
        hlo_name)`` for a tree rebuilt from the instructions, or ``nothing yet``."""
        if self.scanned:
            return SCANNED
        return " + ".join(self.tables) or NOTHING

    @property
    def empty(self) -> bool:
        return not self.layers and not self.ops


def _int(value: object) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return None


def _float(value: object) -> float | None:
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)
    return None


def _start_order(rows: Sequence[Row]) -> list[Row]:
    """Rows by ``start_ts`` (nulls last), ties in table order."""
    def key(item: tuple[int, Row]) -> tuple[bool, int, int]:
        start = _int(item[1].get("start_ts"))
        return start is None, start if start is not None else 0, item[0]
    return [row for _, row in sorted(enumerate(rows), key=key)]


def from_rows(framework: Sequence[Row], hlo: Sequence[Row]) -> FrameworkHierarchy:
    """The hierarchy the two tables' rows describe (either may be empty)."""
    bad_ids = bad_intervals = bad_rows = 0
    framework = _start_order(framework)
    names = {str(r["node_name"]) for r in framework if r.get("node_name") not in (None, "")}
    layers: list[Layer] = []
    seen: set[str] = set()
    op_layer: dict[int, str] = {}
    for row in framework:
        path = str(row.get("node_name") or "")
        if not path or path in seen:
            bad_rows += 1
            continue
        seen.add(path)
        parent_name = str(row.get("parent_name") or "")
        intervals = parse_intervals(row.get("time_intervals"))
        ids = parse_ids(row.get("children_ids"))
        bad_ids += ids.malformed
        bad_intervals += intervals.malformed
        counts = tuple(_int(row.get(f"{s}_engine_instruction_count")) for s in ENGINE_STEMS)
        known = [c for c in counts if c is not None]
        active = _int(row.get("active_time_ns"))
        mfu = _float(row.get("mfu"))
        instructions = _int(row.get("instruction_count"))
        layers.append(Layer(
            path=path,
            parent=parent_name if parent_name in names and parent_name != path else "",
            spans=_frozen(intervals.spans),
            op_ids=ids.ids,
            start_ts=_int(row.get("start_ts")),
            end_ts=_int(row.get("end_ts")),
            time_ns=active if active is not None else (intervals.union_ns if intervals.spans.size else None),
            hbm_bytes=add_known(_int(row.get("hbm_read_bytes")), _int(row.get("hbm_write_bytes"))),
            mfu=None if mfu is None else mfu / 100.0,
            counts=counts,
            instructions=instructions if instructions is not None else (sum(known) if known else None),
        ))
        for op_id in ids.ids:
            op_layer[op_id] = path
    merged: dict[OpKey, Op] = {}
    parts: dict[OpKey, list[Intervals]] = {}
    for row in _start_order(hlo):
        raw = _int(row.get("raw_hlo_id"))
        name = row.get("hlo_name")
        if raw is None and name is None:
            bad_rows += 1
            continue
        key = OpKey(raw, None if name is None else str(name))
        framework_id = _int(row.get("raw_framework_id"))
        layer = op_layer.get(framework_id) if framework_id is not None else None
        intervals = parse_intervals(row.get("time_intervals"))
        bad_intervals += intervals.malformed
        active = _int(row.get("active_time_ns"))
        op = Op(
            key=key,
            name=str(name if name is not None else raw),
            layer=layer,
            spans=intervals.spans,
            start_ts=_int(row.get("start_ts")),
            end_ts=_int(row.get("end_ts")),
            time_ns=active if active is not None else (intervals.union_ns if intervals.spans.size else None),
            hbm_bytes=add_known(_int(row.get("hbm_read_bytes")), _int(row.get("hbm_write_bytes"))),
            instructions=_int(row.get("instruction_count")),
        )
        found = merged.get(key)
        if found is None:
            merged[key] = op
            parts[key] = [intervals.spans]
            continue
        parts[key].append(intervals.spans)
        merged[key] = Op(
            key=key,
            name=found.name,
            layer=found.layer or op.layer,
            spans=found.spans,
            start_ts=min_known(found.start_ts, op.start_ts),
            end_ts=max_known(found.end_ts, op.end_ts),
            time_ns=add_known(found.time_ns, op.time_ns),
            hbm_bytes=add_known(found.hbm_bytes, op.hbm_bytes),
            instructions=add_known(found.instructions, op.instructions),
            executions=found.executions + 1,
        )
    ops = tuple(
        Op(op.key, op.name, op.layer, _frozen(np.concatenate(parts[key])), op.start_ts, op.end_ts,
           op.time_ns, op.hbm_bytes, op.instructions, op.executions)
        for key, op in merged.items()
    )
    tables = tuple(name for name, rows in ((FRAMEWORK_TABLE, framework), (HLO_TABLE, hlo)) if rows)
    return FrameworkHierarchy(tuple(layers), ops, Malformed(bad_ids, bad_intervals, bad_rows), tables)


def _table_rows(profile: Profile, name: str) -> list[Row]:
    if not profile.num_rows(name):
        return []
    rows: list[Row] = profile.table(name).to_pylist()
    return rows


def load_hierarchy(profile: Profile) -> FrameworkHierarchy:
    """The hierarchy of an opened profile, from its ``FrameworkNode`` and ``HloInstruction`` tables
    (small: read whole). A profile with neither gives an empty hierarchy (``source`` says so); the
    views then build theirs from ``Instruction.layer`` / ``hlo_name``."""
    return from_rows(_table_rows(profile, FRAMEWORK_TABLE), _table_rows(profile, HLO_TABLE))


def _merge_spans(spans: list[tuple[int, int]], slack: int) -> Intervals:
    """Sorted intervals with overlaps (and gaps up to ``slack``) merged, as an (n, 2) array."""
    out: list[list[int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1] + slack:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return _frozen(np.asarray(out, np.int64))


def from_instructions(profile: Profile, con: duckdb.DuckDBPyConnection, *, buckets: int = SCAN_BUCKETS,
                      max_rows: int = SCAN_ROWS) -> FrameworkHierarchy:
    """The tree of a profile without hierarchy tables, from one grouped scan of ``Instruction`` by
    (layer, HLO op, time bucket): layers are the ``layer`` paths and all their prefixes, ops sit
    under their layer; each node gets the buckets it ran in, merged into spans (a layer that runs many
    times shows many spans). An op's ``time_ns`` is the *sum* of its instruction durations
    (``scanned``: overlapping instructions count twice); layers have no busy time of their own.
    ``con`` is the caller's DuckDB connection (used from this thread only for the call)."""
    from formats.sqlsource import TableSource

    source = TableSource(profile, "Instruction")
    if not source.present:
        return FrameworkHierarchy(scanned=True)
    bounds = con.execute(f"SELECT min(start_ts), max(end_ts) FROM {source.relation()}").fetchall()
    if not bounds or bounds[0][0] is None or bounds[0][1] is None:
        return FrameworkHierarchy(scanned=True)
    first, last = int(bounds[0][0]), int(bounds[0][1])
    width = max(1, (last - first) // buckets + 1)
    rows = con.execute(f"""
        SELECT {source.col("layer")} AS layer, {source.col("hlo_name")} AS hlo, min(start_ts) AS s,
               max(end_ts) AS e, count(*) AS n, sum(duration_ns) AS t
        FROM {source.relation()} GROUP BY layer, hlo, (start_ts - {first}) // {width}
        ORDER BY s LIMIT {int(max_rows)}""").fetchall()
    layer_spans: dict[str, list[tuple[int, int]]] = {}
    layer_counts: dict[str, int] = {}
    op_spans: dict[tuple[str | None, str], list[tuple[int, int]]] = {}
    op_sums: dict[tuple[str | None, str], list[int]] = {}
    for layer_value, hlo, start, end, count, total in rows:
        span = (int(start), int(end))
        layer = None if layer_value is None else str(layer_value)
        if layer is not None:
            parts = layer.split("/")
            for depth in range(len(parts)):
                path = "/".join(parts[: depth + 1])
                layer_spans.setdefault(path, []).append(span)
                layer_counts[path] = layer_counts.get(path, 0) + int(count)
        if hlo is not None:
            key = (layer, str(hlo))
            op_spans.setdefault(key, []).append(span)
            sums = op_sums.setdefault(key, [0, 0])
            sums[0] += int(count)
            sums[1] += int(total or 0)
    layers = []
    for path, spans in layer_spans.items():
        merged = _merge_spans(spans, width)
        layers.append(Layer(path, path.rpartition("/")[0], merged, (), int(merged[0, 0]),
                            int(merged[:, 1].max()), instructions=layer_counts[path]))
    ops = []
    for (layer, name), spans in op_spans.items():
        merged = _merge_spans(spans, width)
        count, total = op_sums[(layer, name)]
        ops.append(Op(OpKey(None, name), name, layer, merged, int(merged[0, 0]), int(merged[:, 1].max()),
                      time_ns=total, instructions=count))
    return FrameworkHierarchy(tuple(layers), tuple(ops), scanned=True)
