"""HloInstruction and FrameworkNode rows: per-op and per-layer rollups, built while recording.

An op's events are its instructions and its DMA packets; its busy spans (``time_intervals``,
profile-schema §3.4) are the union of their intervals within one execution. Unions merge: the union
of per-batch unions is the union of the events. So each incoming batch is reduced at once to its
spans per op, an execution's HloInstruction rows are written when it ends, and memory is bounded by
the number of spans of one execution -- not by the instruction count of the profile. FrameworkNode
rows (one per module path, over all executions) are merged from the ops' spans at close.

Spans also carry FLOP sums, so FrameworkNode gets its utilisation per span (``hfu_per_interval``
...) and both tables get per-node totals in our extension columns (``instruction_count``,
``active_time_ns``, ``raw_flops``, ``flops_transpose``, ``adjusted_flops``). What the rollups cannot
know is left as the schema allows: per-span element counts are nulls (the core reports no element
counts); per-engine time ranges (``total_time_<e>``) are added at close from the Instruction table.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from formats.text_lists import format_intervals, format_list

ENGINE_STEMS = ("tensor", "vector", "scalar", "gpsimd", "sync")  # Engine code order of the core


@dataclass(frozen=True, slots=True)
class EventSums:
    """What each event adds to its op's span, one array per field (one value per event; ``None``:
    the events carry none, summed as 0). A closed record: an unknown or misspelt name is a
    ``TypeError`` at the call, never a silently recorded 0. Per-engine instruction counts come from
    ``events(engine=...)``, not from here."""

    hbm_read: np.ndarray | None = None  # HBM bytes read
    hbm_write: np.ndarray | None = None  # HBM bytes written
    sbuf_read: np.ndarray | None = None  # SBUF bytes read
    sbuf_write: np.ndarray | None = None  # SBUF bytes written
    load_weight: np.ndarray | None = None  # bytes loaded by LDWEIGHTS
    instructions: np.ndarray | None = None  # 1 per instruction, 0 for a DMA packet
    raw_flops: np.ndarray | None = None  # Instruction.raw_flops
    flops_transpose: np.ndarray | None = None  # Instruction.flops_transpose (>= 0)
    adjusted_flops: np.ndarray | None = None  # Instruction.adjusted_flops
    pe_flops: np.ndarray | None = None  # PE FLOPs: greatest(raw, transpose) per instruction


SUM_FIELDS = tuple(f.name for f in fields(EventSums))
# The span columns that add up when spans merge: the EventSums fields, then per-engine counts.
SUMS = (*SUM_FIELDS, *(f"n_{s}" for s in ENGINE_STEMS))
NONE = np.iinfo(np.int64).max  # "no instruction" in the id minima

Spans = dict[str, np.ndarray]  # op, s, e, iid, rid and the SUMS columns, equal lengths
Columns = dict[str, list[Any]]


def events(op: np.ndarray, start: np.ndarray, end: np.ndarray, *, rid: np.ndarray,
           iid: np.ndarray | None = None, engine: np.ndarray | None = None,
           sums: EventSums = EventSums()) -> Spans:
    """Degenerate spans, one per event (instruction or packet) that belongs to an op (op >= 0)."""
    keep = op >= 0
    n = int(keep.sum())
    cols: Spans = {"op": op[keep].astype(np.int64), "s": start[keep].astype(np.int64),
                   "e": end[keep].astype(np.int64), "rid": rid[keep].astype(np.int64),
                   "iid": iid[keep].astype(np.int64) if iid is not None else np.full(n, NONE, np.int64)}
    for name in SUMS:
        if name.startswith("n_"):
            code = ENGINE_STEMS.index(name[2:])
            counted = engine[keep] == code if engine is not None else np.zeros(n, bool)
            cols[name] = counted.astype(np.int64)
        else:
            value = getattr(sums, name)
            cols[name] = value[keep].astype(np.int64) if value is not None else np.zeros(n, np.int64)
    return cols


def concat(parts: Sequence[Spans]) -> Spans:
    parts = [p for p in parts if p["op"].size]
    if not parts:
        return {}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def merge(spans: Spans) -> Spans:
    """Union of intervals per op: touching or overlapping spans become one, their sums added."""
    if not spans or not spans["op"].size:
        return {}
    order = np.lexsort((spans["e"], spans["s"], spans["op"]))
    cols = {k: v[order] for k, v in spans.items()}
    op, s, e = cols["op"], cols["s"], cols["e"]
    n = op.size
    bounds = np.flatnonzero(np.r_[True, op[1:] != op[:-1], True])
    new = np.empty(n, dtype=bool)
    for a, b in itertools.pairwise(bounds.tolist()):
        new[a] = True
        if b - a > 1:
            reach = np.maximum.accumulate(e[a:b])
            new[a + 1:b] = s[a + 1:b] > reach[:-1]
    idx = np.flatnonzero(new)
    out: Spans = {"op": op[idx], "s": s[idx], "e": np.maximum.reduceat(e, idx),
                  "iid": np.minimum.reduceat(cols["iid"], idx), "rid": np.minimum.reduceat(cols["rid"], idx)}
    for name in SUMS:
        out[name] = np.add.reduceat(cols[name], idx)
    return out


def _groups(op: np.ndarray) -> list[tuple[int, int]]:
    bounds = np.flatnonzero(np.r_[True, op[1:] != op[:-1], True])
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def hlo_rows(spans: Spans, run: int, base: int, names: Mapping[int, str]) -> Columns:
    """HloInstruction rows (one per op) of one execution from its merged spans."""
    out: Columns = {k: [] for k in (
        "id", "raw_bir_id", "raw_penguin_id", "raw_hlo_id", "raw_framework_id", "hlo_name",
        "modular_flow_invocation_idx", "start_ts", "end_ts", "time_intervals", "element_count_per_interval",
        "transpose_element_count_per_interval", "hbm_transfer_size_per_interval", "hbm_read_bytes",
        "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes", "load_weight_bytes")}
    if not spans:
        return out
    for a, b in _groups(spans["op"]):
        op = int(spans["op"][a])
        iid = int(spans["iid"][a:b].min())
        first = iid if iid != NONE else int(spans["rid"][a:b].min())
        starts, ends = spans["s"][a:b].tolist(), spans["e"][a:b].tolist()
        unknown = [None] * (b - a)
        row = {
            "id": first, "raw_bir_id": first - base, "raw_penguin_id": op, "raw_hlo_id": op,
            "raw_framework_id": op, "hlo_name": names.get(op, str(op)), "modular_flow_invocation_idx": run,
            "start_ts": starts[0], "end_ts": max(ends), "time_intervals": format_intervals(starts, ends),
            "element_count_per_interval": unknown, "transpose_element_count_per_interval": unknown,
            "hbm_transfer_size_per_interval": (spans["hbm_read"][a:b] + spans["hbm_write"][a:b]).tolist(),
            "hbm_read_bytes": int(spans["hbm_read"][a:b].sum()),
            "hbm_write_bytes": int(spans["hbm_write"][a:b].sum()),
            "sbuf_read_bytes": int(spans["sbuf_read"][a:b].sum()),
            "sbuf_write_bytes": int(spans["sbuf_write"][a:b].sum()),
            "load_weight_bytes": int(spans["load_weight"][a:b].sum()),
            **_totals(spans, a, b),
        }
        for key, value in row.items():
            out.setdefault(key, []).append(value)
    return out


def _totals(spans: Spans, a: int, b: int) -> dict[str, int]:
    """The extension columns: instruction count, busy time and FLOP sums of one node."""
    return {"instruction_count": int(spans["instructions"][a:b].sum()),
            "active_time_ns": int((spans["e"][a:b] - spans["s"][a:b]).sum()),
            "raw_flops": int(spans["raw_flops"][a:b].sum()),
            "flops_transpose": int(spans["flops_transpose"][a:b].sum()),
            "adjusted_flops": int(spans["adjusted_flops"][a:b].sum())}


def _percent(num: np.ndarray, den: np.ndarray) -> list[float | None]:
    """Utilisation as 0-100 percent (FrameworkNode's examples are 0-100: §2.3, §9.2), 3 decimals."""
    out: list[float | None] = []
    for n, d in zip(num.tolist(), den.tolist()):
        out.append(None if d <= 0 else round(100.0 * n / d, 3))
    return out


class FrameworkTree:
    """The module tree of the recorded programs (``encoder``, ``encoder/layer.0``, ...) and the merged
    busy spans of each node. Spans are folded in execution by execution, so memory grows with the
    spans the nodes really have, not with the instruction count -- but still with the number of
    executions. Past ``max_spans`` the tree gives up (``overflow``) rather than break the writer's
    memory bound; the summary layer can compute FrameworkNode from the Instruction table instead."""

    def __init__(self, max_spans: int = 50_000) -> None:
        self.max_spans = max_spans
        self.overflow = False
        self.nodes: list[str] = []
        self._index: dict[str, int] = {}
        self._op_nodes: dict[int, list[int]] = {}
        self._direct: dict[str, list[int]] = {}
        self.spans: Spans = {}

    def add_op(self, op: int, layer: str | None) -> None:
        if not layer:
            return
        parts = layer.split("/")
        self._direct.setdefault(layer, []).append(op)
        ids = []
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            if path not in self._index:
                self._index[path] = len(self.nodes)
                self.nodes.append(path)
            ids.append(self._index[path])
        self._op_nodes[op] = ids

    def add(self, op_spans: Spans) -> None:
        """Fold one execution's merged op spans into the node spans."""
        if not op_spans or self.overflow:
            return
        pieces = [self.spans] if self.spans else []
        for op_value in np.unique(op_spans["op"]).tolist():
            ids = self._op_nodes.get(int(op_value))
            if not ids:
                continue
            mask = op_spans["op"] == op_value
            for node in ids:
                piece = {k: v[mask] for k, v in op_spans.items()}
                piece["op"] = np.full(int(mask.sum()), node, np.int64)
                pieces.append(piece)
        self.spans = merge(concat(pieces))
        if self.spans and self.spans["op"].size > self.max_spans:
            self.overflow, self.spans = True, {}

    def rows(self, peak_flops_per_s: float | None = None, hbm_bytes_per_s: float | None = None) -> Columns:
        """FrameworkNode columns, nodes in order of their first activity. With the hardware's peak
        FLOP/s and HBM bandwidth, utilisation too: ``hfu``/``mfu`` over the node's busy time (the union
        of its spans) and ``hfu/mfu/mbu_per_interval`` per span, in percent (0-100)."""
        out: Columns = {}
        merged = self.spans
        if not merged:
            return out
        children: dict[str, list[str]] = {}
        for path in self.nodes:
            parent = path.rpartition("/")[0]
            if parent:
                children.setdefault(parent, []).append(path)
        for a, b in sorted(_groups(merged["op"]), key=lambda g: (int(merged["s"][g[0]]), g[0])):
            path = self.nodes[int(merged["op"][a])]
            starts, ends = merged["s"][a:b].tolist(), merged["e"][a:b].tolist()
            hbm = (merged["hbm_read"][a:b] + merged["hbm_write"][a:b]).tolist()
            values: dict[str, Any] = {
                "node_name": path, "children_names": format_list(children.get(path, [])),
                "parent_name": path.rpartition("/")[0],
                "children_ids": format_list(sorted(self._direct.get(path, []))),
                "start_ts": starts[0], "end_ts": max(ends), "time_intervals": format_intervals(starts, ends),
                "hbm_transfer_size_per_interval": format_list(hbm),
                "hbm_read_bytes": int(merged["hbm_read"][a:b].sum()),
                "hbm_write_bytes": int(merged["hbm_write"][a:b].sum()),
                "sbuf_read_bytes": int(merged["sbuf_read"][a:b].sum()),
                "sbuf_write_bytes": int(merged["sbuf_write"][a:b].sum()),
                "load_weight_bytes": int(merged["load_weight"][a:b].sum()),
            }
            for stem in ENGINE_STEMS:
                values[f"{stem}_engine_instruction_count"] = int(merged[f"n_{stem}"][a:b].sum())
            values.update(_totals(merged, a, b))
            length = (merged["e"][a:b] - merged["s"][a:b]).astype(np.float64)
            pe = merged["pe_flops"][a:b].astype(np.float64)
            model = pe - merged["flops_transpose"][a:b]
            if peak_flops_per_s:
                capacity = length * 1e-9 * peak_flops_per_s
                values["hfu_per_interval"] = format_list(_percent(pe, capacity))
                values["mfu_per_interval"] = format_list(_percent(model, capacity))
                values["hfu"] = _percent(np.array([pe.sum()]), np.array([capacity.sum()]))[0]
                values["mfu"] = _percent(np.array([model.sum()]), np.array([capacity.sum()]))[0]
            if hbm_bytes_per_s:
                hbm_capacity = length * 1e-9 * hbm_bytes_per_s
                values["mbu_per_interval"] = format_list(_percent(np.asarray(hbm, np.float64), hbm_capacity))
            for key, value in values.items():
                out.setdefault(key, []).append(value)
        return out
